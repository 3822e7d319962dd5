package wire

import "encoding/binary"

// ACK Extended Transport Header, IBTA 9.3.5 (Figure 112):
//
//	+---------------+-----------------------------------------------+
//	|  Syndrome (8) |             MSN (24)                          |
//	+---------------+-----------------------------------------------+
//
// Syndrome, IBTA Table 41:
//
//	0 00 ccccc   ACK, credit count c (31: credits not valid)
//	0 01 ttttt   RNR NAK, timer t (IBTA Table 45)
//	0 11 nnnnn   NAK, code n (0 PSN sequence error, 1 invalid request,
//	             2 remote access error, 3 remote operational error,
//	             4 invalid RD request)

// AETH is a view of an ACK Extended Transport Header (AETHSize bytes).
type AETH []byte

// Syndrome returns the "Syndrome" field.
func (a AETH) Syndrome() Syndrome { return Syndrome(a[0]) }

// MSN returns the 24-bit "MSN" field.
func (a AETH) MSN() MSN { return MSN(binary.BigEndian.Uint32(a) & PSNMask) }

// Encode writes the syndrome and MSN into a.
func (a AETH) Encode(s Syndrome, m MSN) {
	binary.BigEndian.PutUint32(a, uint32(s)<<24|uint32(m)&PSNMask)
}

// Syndrome is the AETH syndrome byte (IBTA 9.7.5.1, Table 41).
type Syndrome uint8

// Syndromes used by RC.
const (
	SyndromeACK               Syndrome = 0x1f // ACK, credits not valid (what rxe sends)
	SyndromeRNRNAK            Syndrome = 0x20 // OR the 5-bit RNR timer in
	SyndromeNAKPSNSeqErr      Syndrome = 0x60
	SyndromeNAKInvalidRequest Syndrome = 0x61
	SyndromeNAKRemoteAccess   Syndrome = 0x62
	SyndromeNAKRemoteOp       Syndrome = 0x63
	SyndromeNAKInvalidRDReq   Syndrome = 0x64

	syndromeTypeMask = 0x60
	syndromeValMask  = 0x1f
)

// SyndromeType classifies a syndrome.
type SyndromeType uint8

const (
	TypeACK    SyndromeType = 0
	TypeRNRNAK SyndromeType = 1
	TypeResvd  SyndromeType = 2
	TypeNAK    SyndromeType = 3
)

// Type returns ACK, RNR NAK, reserved or NAK.
func (s Syndrome) Type() SyndromeType { return SyndromeType(s&syndromeTypeMask) >> 5 }

// Value returns the low five bits: the credit count, RNR timer or NAK code.
func (s Syndrome) Value() uint8 { return uint8(s) & syndromeValMask }

// RNRNAK returns the RNR NAK syndrome carrying the encoded timer (0-31).
func RNRNAK(timer uint8) Syndrome { return SyndromeRNRNAK | Syndrome(timer&syndromeValMask) }

// rnrTimerNs is IBTA Table 45: the minimum RNR NAK timer field value
// (0-31) to nanoseconds. Code 0 is 655.36 ms.
var rnrTimerNs = [32]int64{
	655360000, 10000, 20000, 30000, 40000, 60000, 80000, 120000,
	160000, 240000, 320000, 480000, 640000, 960000, 1280000, 1920000,
	2560000, 3840000, 5120000, 7680000, 10240000, 15360000, 20480000, 30720000,
	40960000, 61440000, 81920000, 122880000, 163840000, 245760000, 327680000, 491520000,
}

// RNRTimerNanoseconds returns the delay in ns that the encoded RNR timer
// value t (0-31) stands for, IBTA Table 45.
func RNRTimerNanoseconds(t uint8) int64 { return rnrTimerNs[t&syndromeValMask] }
