package wire_test

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"net/netip"

	"github.com/softrdma/softrdma/transport/wire"
)

// validOpcodes returns every opcode in the table, in numeric order.
func validOpcodes() []wire.Opcode {
	var ops []wire.Opcode
	for op := range 256 {
		if wire.Info(wire.Opcode(op)).Valid() {
			ops = append(ops, wire.Opcode(op))
		}
	}
	return ops
}

// buildPacket returns a UDP payload for op carrying n payload bytes (0 for
// opcodes without payload), every header field and the payload drawn from
// r, the pad zero and the ICRC trailer zero. Everything is written with the
// package's Encode methods.
func buildPacket(op wire.Opcode, n int, r *rand.Rand) []byte {
	info := wire.Info(op)
	if !info.Has(wire.MaskPayload) {
		n = 0
	}
	pad := wire.PadFor(n)
	b := make([]byte, info.Length+n+pad+wire.ICRCSize)
	wire.BTH(b).Encode(&wire.BTHFields{
		Opcode:         op,
		SolicitedEvent: r.IntN(2) == 0,
		MigReq:         r.IntN(2) == 0,
		PadCount:       pad,
		PKey:           uint16(r.Uint32()),
		FECN:           r.IntN(2) == 0,
		BECN:           r.IntN(2) == 0,
		DestQP:         wire.QPN(r.Uint32()),
		AckReq:         r.IntN(2) == 0,
		PSN:            wire.PSN(r.Uint32()),
	})
	hdr := func(h wire.Header) []byte { return b[info.Offset[h]:] }
	if info.Has(wire.MaskDETH) {
		wire.DETH(hdr(wire.HdrDETH)).Encode(r.Uint32(), wire.QPN(r.Uint32()))
	}
	if info.Has(wire.MaskRETH) {
		wire.RETH(hdr(wire.HdrRETH)).Encode(&wire.RETHFields{VA: r.Uint64(), RKey: r.Uint32(), DMALength: r.Uint32()})
	}
	if info.Has(wire.MaskAtomicETH) {
		wire.AtomicETH(hdr(wire.HdrAtomicETH)).Encode(&wire.AtomicETHFields{
			VA: r.Uint64() &^ 7, RKey: r.Uint32(), SwapAdd: r.Uint64(), Compare: r.Uint64(),
		})
	}
	if info.Has(wire.MaskAETH) {
		wire.AETH(hdr(wire.HdrAETH)).Encode(wire.Syndrome(r.Uint32()), wire.MSN(r.Uint32()))
	}
	if info.Has(wire.MaskAtomicAckETH) {
		wire.AtomicAckETH(hdr(wire.HdrAtomicAckETH)).SetOrigRemoteData(r.Uint64())
	}
	if info.Has(wire.MaskImmDt) {
		wire.ImmDt(hdr(wire.HdrImmDt)).SetImm(r.Uint32())
	}
	if info.Has(wire.MaskIETH) {
		wire.IETH(hdr(wire.HdrIETH)).SetRKey(r.Uint32())
	}
	for i := range n {
		b[info.Length+i] = byte(r.Uint32())
	}
	return b
}

// refICRC is the ICRC recipe written out byte by byte, the way
// rxe-testbed/roce_pcap.py's roce_icrc does it on a captured frame: build
// the masked IP, UDP and BTH headers, then CRC-32 everything after 8 bytes
// of 0xFF. roce excludes the ICRC trailer.
func refICRC(h *wire.IPHeader, srcPort, dstPort uint16, roce []byte) uint32 {
	udpLen := 8 + len(roce) + wire.ICRCSize
	var buf []byte
	buf = append(buf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	if h.Src.Unmap().Is4() {
		ip := make([]byte, 20)
		ip[0] = 0x45
		ip[1] = 0xff // TOS
		binary.BigEndian.PutUint16(ip[2:], uint16(20+udpLen))
		binary.BigEndian.PutUint16(ip[4:], h.ID)
		if h.DF {
			ip[6] = 0x40
		}
		ip[8] = 0xff // TTL
		ip[9] = 17
		ip[10], ip[11] = 0xff, 0xff // header checksum
		s, d := h.Src.Unmap().As4(), h.Dst.Unmap().As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		buf = append(buf, ip...)
	} else {
		ip := make([]byte, 40)
		ip[0], ip[1], ip[2], ip[3] = 0x6f, 0xff, 0xff, 0xff // TC, flow label
		binary.BigEndian.PutUint16(ip[4:], uint16(udpLen))
		ip[6] = 17
		ip[7] = 0xff // hop limit
		s, d := h.Src.As16(), h.Dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		buf = append(buf, ip...)
	}
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], srcPort)
	binary.BigEndian.PutUint16(udp[2:], dstPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	udp[6], udp[7] = 0xff, 0xff
	buf = append(buf, udp...)
	bth := append([]byte(nil), roce[:wire.BTHSize]...)
	bth[4] = 0xff
	buf = append(buf, bth...)
	buf = append(buf, roce[wire.BTHSize:]...)
	return crc32.ChecksumIEEE(buf)
}

// l3ICRC is roce_pcap.py's roce_icrc: the ICRC of a captured IP packet
// (IP header through the ICRC trailer), masking the captured headers in
// place rather than rebuilding them.
func l3ICRC(l3 []byte, ipv6 bool) uint32 {
	var ihl int
	var ip []byte
	if ipv6 {
		ihl = 40
		ip = append([]byte(nil), l3[:40]...)
		ip[0] |= 0x0f
		ip[1], ip[2], ip[3] = 0xff, 0xff, 0xff
		ip[7] = 0xff
	} else {
		ihl = int(l3[0]&0x0f) * 4
		ip = append([]byte(nil), l3[:ihl]...)
		ip[1] = 0xff
		ip[8] = 0xff
		ip[10], ip[11] = 0xff, 0xff
	}
	udp := append([]byte(nil), l3[ihl:ihl+8]...)
	udp[6], udp[7] = 0xff, 0xff
	bth := append([]byte(nil), l3[ihl+8:ihl+20]...)
	bth[4] = 0xff
	buf := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, ip...)
	buf = append(buf, udp...)
	buf = append(buf, bth...)
	buf = append(buf, l3[ihl+20:len(l3)-4]...)
	return crc32.ChecksumIEEE(buf)
}

// Addresses of the rxe test bed (rxe-testbed/README.md).
var (
	vm0   = netip.MustParseAddr("192.168.77.10")
	vm1   = netip.MustParseAddr("192.168.77.11")
	vm0v6 = netip.MustParseAddr("fd00:77::a")
	vm1v6 = netip.MustParseAddr("fd00:77::b")
)
