package wire

import "encoding/binary"

// IETH is a view of the Invalidate Extended Transport Header, IBTA 9.3.7:
// the 32-bit R_Key that SEND with Invalidate asks the responder to
// invalidate.
type IETH []byte

// RKey returns the "R_Key" field.
func (i IETH) RKey() uint32 { return binary.BigEndian.Uint32(i) }

// SetRKey sets the "R_Key" field.
func (i IETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(i, v) }
