package wire

import "encoding/binary"

// RDMA Extended Transport Header, IBTA 9.3.3 (Figure 110):
//
//	+---------------------------------------------------------------+
//	|                     Virtual Address (64)                      |
//	+---------------------------------------------------------------+
//	|                          R_Key (32)                           |
//	+---------------------------------------------------------------+
//	|                       DMA Length (32)                         |
//	+---------------------------------------------------------------+

// RETH is a view of an RDMA Extended Transport Header (RETHSize bytes).
type RETH []byte

// VA returns the "Virtual Address" field.
func (r RETH) VA() uint64 { return binary.BigEndian.Uint64(r[0:]) }

// RKey returns the "R_Key" field.
func (r RETH) RKey() uint32 { return binary.BigEndian.Uint32(r[8:]) }

// DMALength returns the "DMA Length" field in bytes: the length of the whole
// RDMA WRITE or READ message.
func (r RETH) DMALength() uint32 { return binary.BigEndian.Uint32(r[12:]) }

// RETHFields holds the fields of a RETH for Encode.
type RETHFields struct {
	VA        uint64
	RKey      uint32
	DMALength uint32
}

// Encode writes f into r.
func (r RETH) Encode(f *RETHFields) {
	binary.BigEndian.PutUint64(r[0:], f.VA)
	binary.BigEndian.PutUint32(r[8:], f.RKey)
	binary.BigEndian.PutUint32(r[12:], f.DMALength)
}
