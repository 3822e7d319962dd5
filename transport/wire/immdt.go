package wire

import "encoding/binary"

// ImmDt is a view of the Immediate Data Extended Transport Header, IBTA
// 9.3.6: 4 bytes, carried to the receiver's work completion.
type ImmDt []byte

// Imm returns the immediate data in network byte order as a uint32, the
// form libibverbs gives in ibv_wc.imm_data (__be32).
func (i ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(i) }

// SetImm sets the immediate data.
func (i ImmDt) SetImm(v uint32) { binary.BigEndian.PutUint32(i, v) }
