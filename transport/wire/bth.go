package wire

import "encoding/binary"

// Base Transport Header, IBTA 9.2 (Figure 104):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|    OpCode     |S|M|Pad| TVer  |            P_Key              |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|F|B|   Resv6   |                 DestQP                        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|A|   Resv7     |                   PSN                         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

// Header sizes in bytes (IBTA 9.2 - 9.5; ICRC: IBTA 7.8.1, Annex A17.4).
const (
	BTHSize          = 12
	RDETHSize        = 4
	DETHSize         = 8
	RETHSize         = 16
	AtomicETHSize    = 28
	AETHSize         = 4
	AtomicAckETHSize = 8
	ImmDtSize        = 4
	IETHSize         = 4
	ICRCSize         = 4

	// RoCEv2Port is the IANA UDP destination port of RoCEv2 (Annex A17.2.1).
	RoCEv2Port = 4791
	// DefaultPKey is the default partition key (IBTA 10.9.1.1), full member.
	DefaultPKey = 0xffff
)

const (
	bthOpcode  = 0
	bthFlags   = 1 // SE, M, PadCnt, TVer
	bthPKey    = 2
	bthFB      = 4 // FECN, BECN, Resv6
	bthDestQP  = 5
	bthAckReq  = 8 // A, Resv7
	bthPSN     = 9
	bthSEBit   = 0x80
	bthMigBit  = 0x40
	bthPadMask = 0x30
	bthTVer    = 0x0f
	bthAckBit  = 0x80
	bthFECN    = 0x80
	bthBECN    = 0x40
)

// BTH is a view of a Base Transport Header. It must be at least BTHSize bytes.
type BTH []byte

// Opcode returns the "OpCode" field.
func (b BTH) Opcode() Opcode { return Opcode(b[bthOpcode]) }

// SolicitedEvent returns the "SE" bit.
func (b BTH) SolicitedEvent() bool { return b[bthFlags]&bthSEBit != 0 }

// MigReq returns the "M" (MigReq) bit.
func (b BTH) MigReq() bool { return b[bthFlags]&bthMigBit != 0 }

// PadCount returns the "PadCnt" field: bytes of pad (0-3) after the payload.
func (b BTH) PadCount() int { return int(b[bthFlags]&bthPadMask) >> 4 }

// TVer returns the "TVer" (transport header version) field; it is 0.
func (b BTH) TVer() uint8 { return b[bthFlags] & bthTVer }

// PKey returns the "P_Key" field.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[bthPKey:]) }

// FECN returns the "F" (forward explicit congestion notification) bit.
func (b BTH) FECN() bool { return b[bthFB]&bthFECN != 0 }

// BECN returns the "B" (backward explicit congestion notification) bit.
func (b BTH) BECN() bool { return b[bthFB]&bthBECN != 0 }

// DestQP returns the 24-bit "DestQP" field.
func (b BTH) DestQP() QPN { return QPN(binary.BigEndian.Uint32(b[bthFB:]) & QPNMask) }

// AckReq returns the "A" (acknowledge request) bit.
func (b BTH) AckReq() bool { return b[bthAckReq]&bthAckBit != 0 }

// PSN returns the 24-bit "PSN" field.
func (b BTH) PSN() PSN { return PSN(binary.BigEndian.Uint32(b[bthAckReq:]) & PSNMask) }

// SetPSN sets the "PSN" field, keeping the A bit.
func (b BTH) SetPSN(p PSN) {
	binary.BigEndian.PutUint32(b[bthAckReq:], uint32(b[bthAckReq])<<24|uint32(p)&PSNMask)
}

// SetAckReq sets or clears the "A" bit.
func (b BTH) SetAckReq(v bool) {
	if v {
		b[bthAckReq] |= bthAckBit
	} else {
		b[bthAckReq] &^= bthAckBit
	}
}

// SetDestQP sets the "DestQP" field, keeping F, B and Resv6.
func (b BTH) SetDestQP(q QPN) {
	binary.BigEndian.PutUint32(b[bthFB:], uint32(b[bthFB])<<24|uint32(q)&QPNMask)
}

// BTHFields holds the fields of a BTH for Encode.
type BTHFields struct {
	Opcode         Opcode
	SolicitedEvent bool
	MigReq         bool
	PadCount       int // 0-3
	PKey           uint16
	FECN, BECN     bool
	DestQP         QPN
	AckReq         bool
	PSN            PSN
}

// Encode writes f into b (TVer 0, reserved bits zero).
func (b BTH) Encode(f *BTHFields) {
	b[bthOpcode] = byte(f.Opcode)
	fl := byte(f.PadCount&3) << 4
	if f.SolicitedEvent {
		fl |= bthSEBit
	}
	if f.MigReq {
		fl |= bthMigBit
	}
	b[bthFlags] = fl
	binary.BigEndian.PutUint16(b[bthPKey:], f.PKey)
	var fb uint32
	if f.FECN {
		fb |= bthFECN << 24
	}
	if f.BECN {
		fb |= bthBECN << 24
	}
	binary.BigEndian.PutUint32(b[bthFB:], fb|uint32(f.DestQP)&QPNMask)
	var a uint32
	if f.AckReq {
		a = bthAckBit << 24
	}
	binary.BigEndian.PutUint32(b[bthAckReq:], a|uint32(f.PSN)&PSNMask)
}
