package wire

import (
	"encoding/binary"
	"hash/crc32"
	"net/netip"
)

// IPHeader holds the fields of the IP header that the ICRC covers and that
// a UDP socket can know (IBTA Annex A17.4, "RoCEv2 ICRC"): the addresses,
// and for IPv4 the Identification and the DF bit. IPv4 is used when Src is
// an IPv4 or IPv4-mapped address.
type IPHeader struct {
	Src, Dst netip.Addr
	ID       uint16 // IPv4 Identification
	DF       bool   // IPv4 don't-fragment flag
}

var ones8 = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// ComputeICRC returns the RoCEv2 ICRC of a packet whose UDP payload,
// without the 4-byte ICRC trailer, is roce. The value is what goes on the
// wire little-endian (binary.LittleEndian.PutUint32), as Linux rxe puts it.
//
// Covered, in order (IBTA Annex A17.4.1): 8 bytes of 0xFF for the masked
// LRH; the IPv4 header with TOS, TTL and header checksum set to all ones
// (or the IPv6 header with traffic class, flow label and hop limit all
// ones); the UDP header with checksum all ones; the BTH with its byte 4
// (FECN, BECN, Resv6) all ones; the rest of the packet.
func ComputeICRC(h *IPHeader, srcPort, dstPort uint16, roce []byte) uint32 {
	var pseudo [40 + 8 + BTHSize]byte
	n := 0
	udpLen := 8 + len(roce) + ICRCSize
	if h.Src.Unmap().Is4() {
		ip := pseudo[:20]
		ip[0] = 0x45
		ip[1] = 0xff
		binary.BigEndian.PutUint16(ip[2:], uint16(20+udpLen))
		binary.BigEndian.PutUint16(ip[4:], h.ID)
		if h.DF {
			ip[6] = 0x40
		}
		ip[8] = 0xff
		ip[9] = 17
		ip[10], ip[11] = 0xff, 0xff
		s, d := h.Src.Unmap().As4(), h.Dst.Unmap().As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		n = 20
	} else {
		ip := pseudo[:40]
		ip[0], ip[1], ip[2], ip[3] = 0x6f, 0xff, 0xff, 0xff
		binary.BigEndian.PutUint16(ip[4:], uint16(udpLen))
		ip[6] = 17
		ip[7] = 0xff
		s, d := h.Src.As16(), h.Dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		n = 40
	}
	udp := pseudo[n : n+8]
	binary.BigEndian.PutUint16(udp[0:], srcPort)
	binary.BigEndian.PutUint16(udp[2:], dstPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	udp[6], udp[7] = 0xff, 0xff
	n += 8
	bth := pseudo[n : n+BTHSize]
	copy(bth, roce[:BTHSize])
	bth[bthFB] = 0xff
	n += BTHSize
	c := crc32.Update(0, crc32.IEEETable, ones8[:])
	c = crc32.Update(c, crc32.IEEETable, pseudo[:n])
	return crc32.Update(c, crc32.IEEETable, roce[BTHSize:])
}

// PacketICRC returns the ICRC stored in the last 4 bytes of pkt.
func PacketICRC(pkt []byte) uint32 {
	return binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCSize:])
}

// PutICRC computes the ICRC of pkt (whose last 4 bytes are the trailer) and
// stores it there.
func PutICRC(h *IPHeader, srcPort, dstPort uint16, pkt []byte) {
	c := ComputeICRC(h, srcPort, dstPort, pkt[:len(pkt)-ICRCSize])
	binary.LittleEndian.PutUint32(pkt[len(pkt)-ICRCSize:], c)
}

// VerifyICRC reports whether the ICRC stored in the last 4 bytes of pkt
// matches the packet. For IPv4, h.ID is tried first; a peer such as Linux
// rxe sends IPv4 IDs that a UDP socket cannot see, so when h.ID does not
// match, VerifyICRC looks for the ID that makes the CRC match and returns
// it (see docs/wire.md for what that does to the strength of the check).
func VerifyICRC(h *IPHeader, srcPort, dstPort uint16, pkt []byte) (ok bool, id uint16) {
	if len(pkt) < BTHSize+ICRCSize {
		return false, 0
	}
	want := PacketICRC(pkt)
	if ComputeICRC(h, srcPort, dstPort, pkt[:len(pkt)-ICRCSize]) == want {
		return true, h.ID
	}
	// TODO(icrc): recover the IPv4 ID from the CRC's affinity in the ID bits.
	return false, 0
}
