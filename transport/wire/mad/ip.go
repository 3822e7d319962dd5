package mad

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// ServiceID is the 64-bit ServiceID of a REQ. RDMA CM uses the IP service
// IDs of IBTA Annex A11 ("RDMA IP CM Service"):
//
//	bits 63-24  0x00_0000_0001 (the IP CM prefix)
//	bits 23-16  port space: the protocol (PortSpaceTCP, PortSpaceUDP, ...)
//	bits 15-0   the destination (listening) port
type ServiceID uint64

const ipServicePrefix = 0x0000000001

// IPServiceID returns the IP CM service ID of port in port space ps.
func IPServiceID(ps PortSpace, port uint16) ServiceID {
	return ServiceID(ipServicePrefix<<24 | uint64(ps)<<16 | uint64(port))
}

// IsIP reports whether s has the IP CM prefix of Annex A11.
func (s ServiceID) IsIP() bool { return s>>24 == ipServicePrefix }

// PortSpace returns the port space (protocol) byte of an IP service ID.
func (s ServiceID) PortSpace() PortSpace { return PortSpace(s >> 16) }

// Port returns the port of an IP service ID.
func (s ServiceID) Port() uint16 { return uint16(s) }

// String returns "tcp:7174" style for IP service IDs, else the hex value.
func (s ServiceID) String() string {
	if s.IsIP() {
		return fmt.Sprintf("%s:%d", s.PortSpace(), s.Port())
	}
	return fmt.Sprintf("0x%016x", uint64(s))
}

// PortSpace is the RDMA CM port space of an IP service ID: the IP
// protocol number whose ports it shares (Annex A11; librdmacm's
// RDMA_PS_* without the 0x0100 prefix).
type PortSpace uint8

// Port spaces.
const (
	PortSpaceIPoIB PortSpace = 0x02
	PortSpaceTCP   PortSpace = 0x06 // RDMA_PS_TCP: RC connections (rping, perftest -R)
	PortSpaceUDP   PortSpace = 0x11 // RDMA_PS_UDP: UD
	PortSpaceIB    PortSpace = 0x3f // RDMA_PS_IB: any QP type
)

// String returns "tcp", "udp", "ipoib", "ib" or the number.
func (p PortSpace) String() string {
	switch p {
	case PortSpaceTCP:
		return "tcp"
	case PortSpaceUDP:
		return "udp"
	case PortSpaceIPoIB:
		return "ipoib"
	case PortSpaceIB:
		return "ib"
	}
	return fmt.Sprintf("ps 0x%02x", uint8(p))
}

// IP CM private data header, IBTA Annex A11 (36 bytes at the start of a
// REQ's private data when the ServiceID is an IP service ID; the
// consumer's private data follows):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	| MajV  | MinV  |  IPV  | Rsvd  |          Source Port          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|             Source IP address (128; IPv4: last 32)            |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|          Destination IP address (128; IPv4: last 32)          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// The version is 0.0. An IPv4 address fills the last 4 bytes of its field
// and the first 12 are zero (not ::ffff:-mapped).

// IPPrivateDataHeaderSize is the size of the IP CM header in a REQ's
// private data; IPConsumerDataSize bytes of the consumer's follow.
const (
	IPPrivateDataHeaderSize = 36
	IPConsumerDataSize      = REQPrivateDataSize - IPPrivateDataHeaderSize // 56
)

const (
	ipVersions = 0
	ipIPV      = 1
	ipSrcPort  = 2
	ipSrcIP    = 4
	ipDstIP    = 20
)

// IPPrivateData is a view of a REQ's private data in the IP CM format. It
// must be at least IPPrivateDataHeaderSize bytes.
type IPPrivateData []byte

// MajorVersion returns the 4-bit "MajV" (0).
func (p IPPrivateData) MajorVersion() uint8 { return p[ipVersions] >> 4 }

// MinorVersion returns the 4-bit "MinV" (0).
func (p IPPrivateData) MinorVersion() uint8 { return p[ipVersions] & 0x0f }

// IPVersion returns the 4-bit "IPV": 4 or 6.
func (p IPPrivateData) IPVersion() uint8 { return p[ipIPV] >> 4 }

// SrcPort returns the "Source Port": the active side's port.
func (p IPPrivateData) SrcPort() uint16 { return binary.BigEndian.Uint16(p[ipSrcPort:]) }

// SrcIP returns the "Source IP address": a 4-byte address when IPVersion
// is 4, else 16 bytes.
func (p IPPrivateData) SrcIP() netip.Addr { return p.addr(ipSrcIP) }

// DstIP returns the "Destination IP address", as SrcIP.
func (p IPPrivateData) DstIP() netip.Addr { return p.addr(ipDstIP) }

func (p IPPrivateData) addr(off int) netip.Addr {
	if p.IPVersion() == 4 {
		return netip.AddrFrom4([4]byte(p[off+12 : off+16]))
	}
	return netip.AddrFrom16([16]byte(p[off : off+16]))
}

// ConsumerData returns the consumer's private data after the header (what
// rdma_connect's conn_param.private_data was).
func (p IPPrivateData) ConsumerData() []byte { return p[IPPrivateDataHeaderSize:] }

// Valid reports whether p looks like IP CM private data: at least the
// header, version 0.x, IP version 4 or 6.
func (p IPPrivateData) Valid() bool {
	return len(p) >= IPPrivateDataHeaderSize && p.MajorVersion() == 0 && (p.IPVersion() == 4 || p.IPVersion() == 6)
}

// IPPrivateDataFields holds the fields of an IP CM private data header.
type IPPrivateDataFields struct {
	MajorVersion, MinorVersion uint8 // 4 bits each; 0.0
	// IPVersion is 4 or 6; 0 means 4 when both addresses are IPv4 (or
	// IPv4-mapped), else 6.
	IPVersion    uint8
	SrcPort      uint16
	SrcIP, DstIP netip.Addr
	ConsumerData []byte // aliases in Decode; Encode copies what fits and zeroes the rest
}

// Decode fills f from p.
func (p IPPrivateData) Decode(f *IPPrivateDataFields) {
	*f = IPPrivateDataFields{MajorVersion: p.MajorVersion(), MinorVersion: p.MinorVersion(),
		IPVersion: p.IPVersion(), SrcPort: p.SrcPort(), SrcIP: p.SrcIP(), DstIP: p.DstIP(),
		ConsumerData: p.ConsumerData()}
}

// Encode writes f into p (at least IPPrivateDataHeaderSize bytes),
// reserved bits zero, then the consumer data into the rest of p.
func (p IPPrivateData) Encode(f *IPPrivateDataFields) {
	_ = p[IPPrivateDataHeaderSize-1]
	v := f.IPVersion
	if v == 0 {
		v = 6
		if f.SrcIP.Unmap().Is4() && f.DstIP.Unmap().Is4() {
			v = 4
		}
	}
	p[ipVersions] = f.MajorVersion<<4 | f.MinorVersion&0x0f
	p[ipIPV] = v << 4
	binary.BigEndian.PutUint16(p[ipSrcPort:], f.SrcPort)
	putIP(p[ipSrcIP:ipSrcIP+16], f.SrcIP, v)
	putIP(p[ipDstIP:ipDstIP+16], f.DstIP, v)
	putPrivate(p[IPPrivateDataHeaderSize:], f.ConsumerData)
}

// putIP writes a into the 16-byte field b: IPv4 in the last 4 bytes for
// version 4 (zeros when a is not IPv4), else the 16-byte form.
func putIP(b []byte, a netip.Addr, version uint8) {
	if version == 4 {
		clear(b)
		if a = a.Unmap(); a.Is4() {
			a4 := a.As4()
			copy(b[12:], a4[:])
		}
		return
	}
	a16 := a.As16()
	copy(b, a16[:])
}
