package wire

import "encoding/binary"

// Atomic Extended Transport Header, IBTA 9.3.4 (Figure 111):
//
//	+---------------------------------------------------------------+
//	|                     Virtual Address (64)                      |
//	+---------------------------------------------------------------+
//	|                          R_Key (32)                           |
//	+---------------------------------------------------------------+
//	|                   Swap (or Add) Data (64)                     |
//	+---------------------------------------------------------------+
//	|                      Compare Data (64)                        |
//	+---------------------------------------------------------------+

// AtomicETH is a view of an Atomic Extended Transport Header.
type AtomicETH []byte

// VA returns the "Virtual Address" field; it must be 8-byte aligned.
func (a AtomicETH) VA() uint64 { return binary.BigEndian.Uint64(a[0:]) }

// RKey returns the "R_Key" field.
func (a AtomicETH) RKey() uint32 { return binary.BigEndian.Uint32(a[8:]) }

// SwapAdd returns the "Swap (or Add) Data" field.
func (a AtomicETH) SwapAdd() uint64 { return binary.BigEndian.Uint64(a[12:]) }

// Compare returns the "Compare Data" field (ignored by FETCH_ADD).
func (a AtomicETH) Compare() uint64 { return binary.BigEndian.Uint64(a[20:]) }

// AtomicETHFields holds the fields of an AtomicETH for Encode.
type AtomicETHFields struct {
	VA      uint64
	RKey    uint32
	SwapAdd uint64
	Compare uint64
}

// Encode writes f into a.
func (a AtomicETH) Encode(f *AtomicETHFields) {
	binary.BigEndian.PutUint64(a[0:], f.VA)
	binary.BigEndian.PutUint32(a[8:], f.RKey)
	binary.BigEndian.PutUint64(a[12:], f.SwapAdd)
	binary.BigEndian.PutUint64(a[20:], f.Compare)
}

// AtomicAckETH is a view of the Atomic Acknowledge Extended Transport
// Header, IBTA 9.5.3: the 64-bit original remote data.
type AtomicAckETH []byte

// OrigRemoteData returns the value the target held before the atomic.
func (a AtomicAckETH) OrigRemoteData() uint64 { return binary.BigEndian.Uint64(a) }

// SetOrigRemoteData sets the field.
func (a AtomicAckETH) SetOrigRemoteData(v uint64) { binary.BigEndian.PutUint64(a, v) }

// DETH is a view of the Datagram Extended Transport Header, IBTA 9.3.2:
// Q_Key (32) then 8 reserved bits and the 24-bit source QP.
type DETH []byte

// QKey returns the "Q_Key" field.
func (d DETH) QKey() uint32 { return binary.BigEndian.Uint32(d[0:]) }

// SrcQP returns the 24-bit "SrcQP" field.
func (d DETH) SrcQP() QPN { return QPN(binary.BigEndian.Uint32(d[4:]) & QPNMask) }

// Encode writes the Q_Key and source QP into d.
func (d DETH) Encode(qkey uint32, src QPN) {
	binary.BigEndian.PutUint32(d[0:], qkey)
	binary.BigEndian.PutUint32(d[4:], uint32(src)&QPNMask)
}
