package wire

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
	"sync/atomic"
)

// Invariant CRC, IBTA Vol. 1 7.8.1 and Annex A17.4 (RoCEv2):
//
// CRC-32 (the IEEE 802.3 polynomial, as zlib and hash/crc32 compute it) over
//
//	8 bytes 0xFF                     the LRH RoCEv2 does not have, masked
//	IPv4 header                      TOS, TTL, header checksum = all ones
//	  (or IPv6 header                traffic class, flow label, hop limit = all ones)
//	UDP header                       checksum = all ones
//	BTH                              byte 4 (FECN, BECN, Resv6) = all ones
//	extension headers, payload, pad
//
// appended little-endian. The IPv4 Identification field and the flags (DF)
// are covered, not masked: a receiver must know the sender's IPv4 ID. See
// VerifyICRC and docs/wire.md for how an ID a UDP socket cannot see is
// recovered from the CRC itself.

// IPHeader holds the fields of the IP header that the ICRC covers and that
// a UDP socket can know (IBTA Annex A17.4, "RoCEv2 ICRC"): the addresses,
// and for IPv4 the Identification and the DF bit. IPv4 is used when Src is
// an IPv4 or IPv4-mapped address. The IPv4 header is assumed to have no
// options (IHL 5), as every RoCEv2 sender produces.
type IPHeader struct {
	Src, Dst netip.Addr
	ID       uint16 // IPv4 Identification
	DF       bool   // IPv4 don't-fragment flag
}

// crcPoly is the CRC-32 (IEEE 802.3) polynomial, bit-reflected.
const crcPoly = 0xedb88320

// idSuffix is the number of bytes of the ICRC input that follow the IPv4
// Identification field, less the packet: the rest of the IPv4 header (14)
// and the UDP header (8). The ICRC trailer itself is not covered, so for a
// UDP payload of n bytes (ICRC included) n-ICRCSize+idSuffix bytes follow.
const idSuffix = 14 + 8

// idCacheLen bounds the per-length cache of the ID shift factors: UDP
// payloads up to a 9000-byte jumbo frame are cached, longer ones are
// computed on each call (still without allocating).
const idCacheLen = 9216

var (
	// crcTab is the slicing-by-8 table set: crcTab[0][b] is the CRC register
	// after one byte b from a zero register, crcTab[k] advances k more zero
	// bytes. Built by init; used for the fixed-size masked header words and
	// for short payloads and tails, while crc32Update (crc32_amd64.go:
	// VPCLMULQDQ, or hash/crc32) does longer payloads.
	crcTab [8][256]uint32

	// crcTopInv inverts the top byte of crcTab[0]: for CRC-32 the 256 top
	// bytes are all different, so the byte that produced a register can be
	// read off the register. This is what makes the ID solvable in O(1).
	crcTopInv [256]uint8

	// icrcSeed is the CRC register (before the final inversion) after the 8
	// bytes of 0xFF that stand for the masked LRH: the constant prefix is
	// hashed once.
	icrcSeed uint32

	// xPow8[j] is x^(8*2^j) mod P and xInvPow8[j] is x^(-8*2^j) mod P, in
	// the reflected representation (bit 31 is x^0). Multiplying a register
	// by x^(8k) is the effect of k zero bytes on it.
	xPow8, xInvPow8 [17]uint32

	// idShift caches, per UDP payload length, x^(8k) and x^(-8k) for the k
	// bytes after the IPv4 ID field. Zero means not yet computed (neither
	// value can be zero: x is invertible modulo P). Racing writers store
	// the same value, so plain atomics suffice and no entry is ever locked.
	idShift [idCacheLen]struct{ fwd, inv atomic.Uint32 }
)

func init() {
	for i := range 256 {
		c := uint32(i)
		for range 8 {
			c = c>>1 ^ crcPoly&-(c&1)
		}
		crcTab[0][i] = c
	}
	for i := range 256 {
		c := crcTab[0][i]
		for k := 1; k < 8; k++ {
			c = c>>8 ^ crcTab[0][c&0xff]
			crcTab[k][i] = c
		}
	}
	var seen [256]bool
	for i, c := range crcTab[0] {
		t := c >> 24
		if seen[t] {
			panic("wire: CRC-32 table top bytes are not distinct")
		}
		seen[t] = true
		crcTopInv[t] = uint8(i)
	}
	s := ^uint32(0)
	for range 8 {
		s = crcByte(s, 0xff)
	}
	icrcSeed = s

	xPow8[0] = 1 << (31 - 8)              // x^8
	xInvPow8[0] = crcUnshiftZero(1 << 31) // x^-8: undo one zero byte on "1"
	for j := 1; j < len(xPow8); j++ {
		xPow8[j] = gfMul(xPow8[j-1], xPow8[j-1])
		xInvPow8[j] = gfMul(xInvPow8[j-1], xInvPow8[j-1])
	}
}

// crcByte advances the register s (before the final inversion) over one byte.
func crcByte(s uint32, b byte) uint32 { return s>>8 ^ crcTab[0][byte(s)^b] }

// crcWord advances the register s over 8 bytes; v holds them in stream
// order from its least significant byte (binary.LittleEndian.Uint64 of the
// bytes).
func crcWord(s uint32, v uint64) uint32 {
	x := s ^ uint32(v)
	h := uint32(v >> 32)
	return crcTab[7][x&0xff] ^ crcTab[6][x>>8&0xff] ^ crcTab[5][x>>16&0xff] ^ crcTab[4][x>>24] ^
		crcTab[3][h&0xff] ^ crcTab[2][h>>8&0xff] ^ crcTab[1][h>>16&0xff] ^ crcTab[0][h>>24]
}

// crcUpdate advances the register s over p with the slicing-by-8 tables.
// hash/crc32 is faster from 64 bytes on (CLMUL), and crc32Update's
// VPCLMULQDQ fold from 32; below that this loop, which inlines the table
// walk, beats their per-call dispatch.
func crcUpdate(s uint32, p []byte) uint32 {
	for len(p) >= 8 {
		s = crcWord(s, binary.LittleEndian.Uint64(p))
		p = p[8:]
	}
	for _, b := range p {
		s = crcByte(s, b)
	}
	return s
}

// crcFinish advances the register s over the rest of the packet and
// returns the final CRC.
func crcFinish(s uint32, p []byte) uint32 {
	if hasVPCLMUL || len(p) >= crcCLMULMin {
		// crc32Update picks its own short-input path when it has the
		// 256-bit CLMUL fold (crc32_amd64.go).
		return crc32Update(^s, p)
	}
	return ^crcUpdate(s, p)
}

// crcCLMULMin is the length from which hash/crc32 is used for the payload
// where crc32Update is hash/crc32 (no VPCLMULQDQ).
const crcCLMULMin = 64

// crcUnshiftZero undoes crcByte(s, 0): it returns the register that one zero
// byte turns into s.
func crcUnshiftZero(s uint32) uint32 {
	b := crcTopInv[s>>24]
	return (s^crcTab[0][b])<<8 | uint32(b)
}

// gfMul returns a*b modulo the CRC polynomial, both in the reflected
// representation.
func gfMul(a, b uint32) uint32 {
	var p uint32
	for i := 31; i >= 0; i-- {
		p ^= b & -(a >> uint(i) & 1)
		b = b>>1 ^ crcPoly&-(b&1)
	}
	return p
}

// xPowBytes returns x^(±8k) from the table of powers tab (xPow8 or xInvPow8).
func xPowBytes(k int, tab *[17]uint32) uint32 {
	p := uint32(1 << 31)
	for j := 0; k != 0; j, k = j+1, k>>1 {
		if k&1 != 0 {
			p = gfMul(p, tab[j])
		}
	}
	return p
}

// idShiftFwd returns x^(8k), k the bytes after the ID field in a packet
// whose UDP payload is pktLen bytes.
func idShiftFwd(pktLen int) uint32 {
	k := pktLen - ICRCSize + idSuffix
	if uint(pktLen) < idCacheLen {
		e := &idShift[pktLen].fwd
		if v := e.Load(); v != 0 {
			return v
		}
		v := xPowBytes(k, &xPow8)
		e.Store(v)
		return v
	}
	return xPowBytes(k, &xPow8)
}

// idShiftInv returns x^(-8k), the inverse of idShiftFwd(pktLen).
func idShiftInv(pktLen int) uint32 {
	k := pktLen - ICRCSize + idSuffix
	if uint(pktLen) < idCacheLen {
		e := &idShift[pktLen].inv
		if v := e.Load(); v != 0 {
			return v
		}
		v := xPowBytes(k, &xInvPow8)
		e.Store(v)
		return v
	}
	return xPowBytes(k, &xInvPow8)
}

// idReg returns the register two bytes (big-endian d) leave in a zero
// register: the contribution of an ID change d before any byte follows.
func idReg(d uint16) uint32 {
	s := crcTab[0][d>>8]
	return s>>8 ^ crcTab[0][byte(s)^byte(d)]
}

// idFromReg inverts idReg: it returns the d with idReg(d) == r, or false
// when no 16-bit value gives r (r outside the 16-dimensional image).
func idFromReg(r uint32) (uint16, bool) {
	j := crcTopInv[r>>24]       // the table index of the second byte's step
	t := r ^ crcTab[0][j]       // = crcTab[0][hi] >> 8
	hi := crcTopInv[t>>16&0xff] // crcTab[0][hi]'s top byte is t's byte 2
	if crcTab[0][hi]>>8 != t {
		return 0, false
	}
	lo := byte(crcTab[0][hi]) ^ j
	return uint16(hi)<<8 | uint16(lo), true
}

// be16 returns v's two bytes in stream (big-endian) order as a little-endian
// word fragment, for crcWord.
func be16(v uint16) uint64 { return uint64(bits.ReverseBytes16(v)) }

// ComputeICRC returns the RoCEv2 ICRC of a packet whose UDP payload,
// without the 4-byte ICRC trailer, is roce. The value is what goes on the
// wire little-endian (binary.LittleEndian.PutUint32), as Linux rxe puts it.
// roce must hold at least a BTH (BTHSize bytes).
//
// Covered, in order (IBTA Annex A17.4.1): 8 bytes of 0xFF for the masked
// LRH; the IPv4 header with TOS, TTL and header checksum set to all ones
// (or the IPv6 header with traffic class, flow label and hop limit all
// ones); the UDP header with checksum all ones; the BTH with its byte 4
// (FECN, BECN, Resv6) all ones; the rest of the packet.
//
// The constant prefix is pre-hashed and the 40 (IPv4) or 60 (IPv6) bytes of
// masked headers are fed as 64-bit words, so nothing is copied; the rest
// goes through crc32Update (512- or 256-bit VPCLMULQDQ folding on amd64
// CPUs that have it, hash/crc32 otherwise). It does not allocate.
func ComputeICRC(h *IPHeader, srcPort, dstPort uint16, roce []byte) uint32 {
	_ = roce[BTHSize-1]
	udpLen := uint16(8 + len(roce) + ICRCSize)
	s := icrcSeed
	if src := h.Src.Unmap(); src.Is4() {
		var flags uint64
		if h.DF {
			flags = 0x40
		}
		sa, da := src.As4(), h.Dst.Unmap().As4()
		// Version/IHL, TOS=ff, total length, ID, flags + fragment offset.
		s = crcWord(s, 0x45|0xff<<8|be16(20+udpLen)<<16|be16(h.ID)<<32|flags<<48)
		// TTL=ff, protocol 17, checksum=ffff, source address.
		s = crcWord(s, 0xff|17<<8|0xffff<<16|uint64(binary.LittleEndian.Uint32(sa[:]))<<32)
		// Destination address, UDP ports.
		s = crcWord(s, uint64(binary.LittleEndian.Uint32(da[:]))|be16(srcPort)<<32|be16(dstPort)<<48)
		// UDP length, checksum=ffff, BTH bytes 0-3.
		s = crcWord(s, be16(udpLen)|0xffff<<16|uint64(binary.LittleEndian.Uint32(roce))<<32)
		// BTH bytes 4-11 with byte 4 (FECN, BECN, Resv6) all ones.
		s = crcWord(s, binary.LittleEndian.Uint64(roce[4:])|0xff)
		return crcFinish(s, roce[BTHSize:])
	}
	sa, da := h.Src.As16(), h.Dst.As16()
	// Version 6, traffic class and flow label all ones, payload length,
	// next header 17, hop limit ff.
	s = crcWord(s, 0x6f|0xffffff<<8|be16(udpLen)<<32|17<<48|0xff<<56)
	s = crcWord(s, binary.LittleEndian.Uint64(sa[0:]))
	s = crcWord(s, binary.LittleEndian.Uint64(sa[8:]))
	s = crcWord(s, binary.LittleEndian.Uint64(da[0:]))
	s = crcWord(s, binary.LittleEndian.Uint64(da[8:]))
	s = crcWord(s, be16(srcPort)|be16(dstPort)<<16|be16(udpLen)<<32|0xffff<<48)
	s = crcWord(s, binary.LittleEndian.Uint64(roce)|0xff<<32)
	return crcFinish(s, roce[8:])
}

// ICRCPrefix is the ICRC's state over the part of the covered bytes that
// depends only on the IP and UDP headers (addresses, ports, IPv4 ID and
// DF, and the length), not on the packet: a sender that builds many
// packets of one length to one destination computes it once and begins
// each packet's ICRC from it (Begin).
type ICRCPrefix struct {
	s      uint32 // the register after the header words that do not cover the BTH
	udpLen uint16 // IPv4: the UDP length, hashed with the first BTH bytes
	v6     bool
	// BeginCached's cache: head is the register after the BTH's first 8
	// bytes when they are key (valid when cached).
	cached bool
	key    uint64
	head   uint32
}

// NewICRCPrefix returns the prefix of the ICRC of packets whose UDP
// payload, ICRC included, is pktLen bytes, sent with the IP header fields
// h from srcPort to dstPort. The header words are ComputeICRC's, which
// keeps its own straight-line copy for the receive path;
// TestICRCStateMatchesComputeICRC checks that the two agree.
func NewICRCPrefix(h *IPHeader, srcPort, dstPort uint16, pktLen int) ICRCPrefix {
	udpLen := uint16(8 + pktLen)
	s := icrcSeed
	if src := h.Src.Unmap(); src.Is4() {
		var flags uint64
		if h.DF {
			flags = 0x40
		}
		sa, da := src.As4(), h.Dst.Unmap().As4()
		// Version/IHL, TOS=ff, total length, ID, flags + fragment offset.
		s = crcWord(s, 0x45|0xff<<8|be16(20+udpLen)<<16|be16(h.ID)<<32|flags<<48)
		// TTL=ff, protocol 17, checksum=ffff, source address.
		s = crcWord(s, 0xff|17<<8|0xffff<<16|uint64(binary.LittleEndian.Uint32(sa[:]))<<32)
		// Destination address, UDP ports.
		s = crcWord(s, uint64(binary.LittleEndian.Uint32(da[:]))|be16(srcPort)<<32|be16(dstPort)<<48)
		return ICRCPrefix{s: s, udpLen: udpLen}
	}
	sa, da := h.Src.As16(), h.Dst.As16()
	// Version 6, traffic class and flow label all ones, payload length,
	// next header 17, hop limit ff.
	s = crcWord(s, 0x6f|0xffffff<<8|be16(udpLen)<<32|17<<48|0xff<<56)
	s = crcWord(s, binary.LittleEndian.Uint64(sa[0:]))
	s = crcWord(s, binary.LittleEndian.Uint64(sa[8:]))
	s = crcWord(s, binary.LittleEndian.Uint64(da[0:]))
	s = crcWord(s, binary.LittleEndian.Uint64(da[8:]))
	s = crcWord(s, be16(srcPort)|be16(dstPort)<<16|be16(udpLen)<<32|0xffff<<48)
	return ICRCPrefix{s: s, v6: true}
}

// Begin starts the ICRC of one packet of the prefix's headers and length,
// whose BTH (final: the ICRC covers it) is the first BTHSize bytes of bth.
// The rest of the packet, from the end of the BTH to the trailer, must
// follow through Update and Copy.
func (p ICRCPrefix) Begin(bth []byte) ICRCState {
	_ = bth[BTHSize-1]
	if !p.v6 {
		// UDP length, checksum=ffff, BTH bytes 0-3.
		s := crcWord(p.s, be16(p.udpLen)|0xffff<<16|uint64(binary.LittleEndian.Uint32(bth))<<32)
		// BTH bytes 4-11 with byte 4 (FECN, BECN, Resv6) all ones.
		return ICRCState(crcWord(s, binary.LittleEndian.Uint64(bth[4:])|0xff))
	}
	s := crcWord(p.s, binary.LittleEndian.Uint64(bth)|0xff<<32)
	return ICRCState(crcUpdate(s, bth[8:BTHSize]))
}

// BeginCached is Begin for a sender that begins many packets from one
// prefix: it keeps the register after the BTH's first 8 bytes (opcode,
// flags, P_Key, the masked byte and the destination QP, the same for
// every MIDDLE packet of a QP's messages) and hashes only the last 4
// (AckReq and PSN) when they repeat: 4 table loads a packet instead of 16.
// It changes p, so a prefix it is called on must not be shared between
// goroutines.
func (p *ICRCPrefix) BeginCached(bth []byte) ICRCState {
	_ = bth[BTHSize-1]
	k := binary.LittleEndian.Uint64(bth)
	if !p.cached || p.key != k {
		if !p.v6 {
			// UDP length, checksum=ffff, BTH bytes 0-3, then bytes 4-7
			// with byte 4 (FECN, BECN, Resv6) all ones.
			s := crcWord(p.s, be16(p.udpLen)|0xffff<<16|(k&0xffffffff)<<32)
			p.head = crcWord4(s, uint32(k>>32)|0xff)
		} else {
			p.head = crcWord(p.s, k|0xff<<32)
		}
		p.key, p.cached = k, true
	}
	return ICRCState(crcWord4(p.head, binary.LittleEndian.Uint32(bth[8:])))
}

// crcWord4 advances the register s over the 4 bytes of v (little-endian:
// the first byte is v's low byte) with the slicing tables.
func crcWord4(s, v uint32) uint32 {
	x := s ^ v
	return crcTab[3][x&0xff] ^ crcTab[2][x>>8&0xff] ^ crcTab[1][x>>16&0xff] ^ crcTab[0][x>>24]
}

// ICRCState is the ICRC of a packet that is being built: begun over the
// headers by BeginICRC, advanced over the rest of the packet in order by
// Update and Copy, and read by Sum. A requester uses it to hash the
// payload while it copies it into the packet (Copy), so the payload is
// read once for both; the result is ComputeICRC's for the same packet.
type ICRCState uint32 // the CRC register, before the final inversion

// BeginICRC starts the ICRC of a packet whose UDP payload, ICRC trailer
// included, is pktLen bytes, sent with the IP header fields h between
// srcPort and dstPort, and whose BTH (final: the ICRC covers it) is the
// first BTHSize bytes of bth. The rest of the packet, from the end of the
// BTH to the trailer, must follow through Update and Copy.
func BeginICRC(h *IPHeader, srcPort, dstPort uint16, pktLen int, bth []byte) ICRCState {
	return NewICRCPrefix(h, srcPort, dstPort, pktLen).Begin(bth)
}

// Update advances the ICRC over the next bytes of the packet, p.
func (st ICRCState) Update(p []byte) ICRCState {
	if len(p) < crcTableMax {
		// Headers and pad: the table walk, which crcFinish would reach
		// through two calls.
		return ICRCState(crcUpdate(uint32(st), p))
	}
	return ICRCState(^crcFinish(uint32(st), p))
}

// crcTableMax is the length below which every path of crcFinish hashes with
// the slicing tables (crcUpdate): below crc32VPCLMULMin on CPUs with the
// carry-less fold, below crcCLMULMin elsewhere.
const crcTableMax = 32

// Copy copies src into dst (which must be at least as long) and advances
// the ICRC over it, as the next bytes of the packet. Where the CPU has the
// 256- or 512-bit carry-less multiply it loads each byte once for both.
func (st ICRCState) Copy(dst, src []byte) ICRCState {
	return ICRCState(^crc32UpdateCopy(^uint32(st), dst, src))
}

// Sum returns the ICRC of the bytes seen, the value that goes into the
// trailer (binary.LittleEndian.PutUint32, as PutICRC stores it).
func (st ICRCState) Sum() uint32 { return ^uint32(st) }

// PacketICRC returns the ICRC stored in the last 4 bytes of pkt.
func PacketICRC(pkt []byte) uint32 {
	return binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCSize:])
}

// PutICRC computes the ICRC of pkt (whose last 4 bytes are the trailer) and
// stores it there. pkt must be at least BTHSize+ICRCSize bytes. For a UDP
// GSO batch, call it once per segment with h.ID set to the segment's IPv4
// ID (see docs/wire.md).
func PutICRC(h *IPHeader, srcPort, dstPort uint16, pkt []byte) {
	c := ComputeICRC(h, srcPort, dstPort, pkt[:len(pkt)-ICRCSize])
	binary.LittleEndian.PutUint32(pkt[len(pkt)-ICRCSize:], c)
}

// VerifyICRCExact reports whether the ICRC stored in the last 4 bytes of
// pkt matches the packet with exactly the IP header fields in h. Use it
// when the sender's IPv4 ID is known (a raw or AF_PACKET socket, or a peer
// known to send ID 0): the check then has its full 32-bit strength.
func VerifyICRCExact(h *IPHeader, srcPort, dstPort uint16, pkt []byte) bool {
	if len(pkt) < BTHSize+ICRCSize {
		return false
	}
	return ComputeICRC(h, srcPort, dstPort, pkt[:len(pkt)-ICRCSize]) == PacketICRC(pkt)
}

// VerifyICRC reports whether the ICRC stored in the last 4 bytes of pkt
// matches the packet. For IPv4, h.ID is tried first; a peer such as Linux
// rxe sends IPv4 IDs that a UDP socket cannot see, so when h.ID does not
// match, VerifyICRC solves for the ID that makes the CRC match and returns
// it (see docs/wire.md for what that does to the strength of the check:
// a random corruption then passes with probability about 2^-16 instead of
// 2^-32). h.DF is used as given. For IPv6 there is no ID and the check is
// exact. It does not allocate; the first packet of each length computes
// and caches two 32-bit shift factors.
func VerifyICRC(h *IPHeader, srcPort, dstPort uint16, pkt []byte) (ok bool, id uint16) {
	if len(pkt) < BTHSize+ICRCSize {
		return false, 0
	}
	return CheckICRC(h, ComputeICRC(h, srcPort, dstPort, pkt[:len(pkt)-ICRCSize]), pkt)
}

// CheckICRC is VerifyICRC for a packet whose ICRC with the IP header
// fields h (h.ID included) has already been computed, got: from a cached
// ICRCPrefix (ICRCPrefix.Begin, ICRCState.Update and Sum over the packet
// without its trailer), say. It compares got with the ICRC stored in the
// last 4 bytes of pkt and, for IPv4, solves for the ID that makes them
// match, as VerifyICRC does, returning it. pkt must be at least
// BTHSize+ICRCSize bytes (shorter: false).
func CheckICRC(h *IPHeader, got uint32, pkt []byte) (ok bool, id uint16) {
	if len(pkt) < BTHSize+ICRCSize {
		return false, 0
	}
	want := PacketICRC(pkt)
	if got == want {
		return true, h.ID
	}
	if !h.Src.Unmap().Is4() {
		return false, 0
	}
	// crc(ID x) = crc(ID h.ID) ^ idReg(x^h.ID) * x^(8k): undo the shift by
	// the k bytes after the ID, then read the ID change off the register.
	d, ok := idFromReg(gfMul(want^got, idShiftInv(len(pkt))))
	if !ok {
		return false, 0
	}
	return true, h.ID ^ d
}

// ICRCWithID returns the ICRC that a packet whose UDP payload is pktLen
// bytes (ICRC included) and whose ICRC is icrc for IPv4 ID oldID has when
// sent with IPv4 ID newID, without hashing the packet again. The transport
// uses it to place an already built packet (e.g. a retransmission built for
// ID 0) at segment position i of a UDP GSO batch, whose kernel-assigned ID
// is i. IPv4 only.
func ICRCWithID(icrc uint32, pktLen int, oldID, newID uint16) uint32 {
	if oldID == newID {
		return icrc
	}
	return icrc ^ gfMul(idReg(oldID^newID), idShiftFwd(pktLen))
}

// ICRCIDTable holds, for one packet length, the ICRC changes of the IPv4
// ID changes 0..63: ICRCWithID's product for the segment positions of a UDP
// GSO batch (at most 64 segments), so that a sender moving a packet to
// segment i pays a load and an XOR instead of a 32-step GF(2) product. The
// zero value is empty; Fill makes it the table of a length.
type ICRCIDTable struct {
	pktLen int // the UDP payload length, ICRC included; 0: empty
	t      [64]uint32
}

// Fill makes t the table of packets whose UDP payload, ICRC included, is
// pktLen bytes. The product is linear in the ID change, so six products
// (changes 1, 2, 4, ... 32) give the 64 entries.
func (t *ICRCIDTable) Fill(pktLen int) {
	t.pktLen = pktLen
	sh := idShiftFwd(pktLen)
	t.t[0] = 0
	for b := 1; b < 64; b <<= 1 {
		t.t[b] = gfMul(idReg(uint16(b)), sh)
		for i := b + 1; i < 2*b; i++ {
			t.t[i] = t.t[b] ^ t.t[i-b]
		}
	}
}

// Len returns the packet length t was filled for (0: empty).
func (t *ICRCIDTable) Len() int { return t.pktLen }

// Delta returns the change (XOR) of the ICRC of a t.Len()-byte packet
// when its IPv4 ID changes by d (XOR), for d < 64: the ICRC for ID x^d is
// the ICRC for ID x ^ t.Delta(d) (ICRCWithID). Only the low 6 bits of d
// are used.
func (t *ICRCIDTable) Delta(d uint16) uint32 { return t.t[d&63] }

// SetID rewrites the ICRC trailer of pkt, computed for IPv4 ID oldID, for
// IPv4 ID newID, as SetICRCID does; pkt must be t.Len() bytes and oldID ^
// newID less than 64, else it falls back to SetICRCID.
func (t *ICRCIDTable) SetID(pkt []byte, oldID, newID uint16) {
	d := oldID ^ newID
	if len(pkt) != t.pktLen || d >= 64 {
		SetICRCID(pkt, oldID, newID)
		return
	}
	tr := pkt[len(pkt)-ICRCSize:]
	binary.LittleEndian.PutUint32(tr, binary.LittleEndian.Uint32(tr)^t.t[d])
}

// SetICRCID rewrites the ICRC trailer of pkt, computed for IPv4 ID oldID,
// for IPv4 ID newID (see ICRCWithID).
func SetICRCID(pkt []byte, oldID, newID uint16) {
	c := ICRCWithID(PacketICRC(pkt), len(pkt), oldID, newID)
	binary.LittleEndian.PutUint32(pkt[len(pkt)-ICRCSize:], c)
}
