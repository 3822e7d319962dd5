package layers

import (
	"github.com/gopacket/gopacket"
	golayers "github.com/gopacket/gopacket/layers"

	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// The extension header layers. Each records the packet's BTH opcode in
// its Opcode field, because the opcode, not the header, says what comes
// next (a RETH is followed by an ImmDt in RDMA_WRITE_ONLY_WITH_IMMEDIATE,
// by payload in RDMA_WRITE_FIRST and by nothing in RDMA_READ_REQUEST).
// gopacket.NewPacket's decoders set it; for a DecodingLayerParser use
// NewDecodingLayers, whose layers copy it from their BTH.

// Datagram Extended Transport Header, IBTA 9.3.2 (UD):
//
//	+---------------------------------------------------------------+
//	|                          Q_Key (32)                           |
//	+---------------+-----------------------------------------------+
//	|   Reserved    |               Source QP (24)                  |
//	+---------------+-----------------------------------------------+

// DETH is the Datagram Extended Transport Header layer.
type DETH struct {
	golayers.BaseLayer
	Opcode wire.Opcode // the packet's BTH opcode: selects the next header
	// DestQP is the packet's BTH DestQP: the payload of a UD_SEND_ONLY to
	// QP1 (mad.GSIQPN) is a MAD. Set like Opcode.
	DestQP wire.QPN
	QKey   uint32
	SrcQP  wire.QPN
	bth    *BTH
}

// LayerType returns LayerTypeDETH.
func (d *DETH) LayerType() gopacket.LayerType { return LayerTypeDETH }

// CanDecode returns LayerTypeDETH.
func (d *DETH) CanDecode() gopacket.LayerClass { return LayerTypeDETH }

// NextLayerType returns ImmDt for UD_SEND_ONLY_WITH_IMMEDIATE, MAD for a
// UD_SEND_ONLY to QP1 carrying one (see carriesMAD), else payload.
func (d *DETH) NextLayerType() gopacket.LayerType {
	if d.carriesMAD() {
		return LayerTypeMAD
	}
	return nextLayerType(d.Opcode, wire.HdrDETH, d.Payload)
}

// carriesMAD reports whether the DETH's payload is a MAD: a UD_SEND_ONLY
// to the GSI (QP1) with exactly mad.Size bytes of payload that start with
// MAD base version 1. Q_Key checks are the receiver's business.
func (d *DETH) carriesMAD() bool {
	return d.Opcode == wire.OpUDSendOnly && d.DestQP == mad.GSIQPN &&
		len(d.Payload) == mad.Size && d.Payload[0] == mad.BaseVersion
}

func (d *DETH) setOpcode(op wire.Opcode) { d.Opcode = op }

// DecodeFromBytes decodes a DETH with the wire view.
func (d *DETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if len(data) < wire.DETHSize {
		return truncated(df, "DETH", wire.DETHSize, len(data))
	}
	v := wire.DETH(data)
	d.QKey, d.SrcQP = v.QKey(), v.SrcQP()
	d.BaseLayer = golayers.BaseLayer{Contents: data[:wire.DETHSize], Payload: data[wire.DETHSize:]}
	if d.bth != nil {
		d.Opcode, d.DestQP = d.bth.Opcode, d.bth.DestQP
	}
	return nil
}

// SerializeTo prepends the DETH (reserved bits zero).
func (d *DETH) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(wire.DETHSize)
	if err != nil {
		return err
	}
	wire.DETH(h).Encode(d.QKey, d.SrcQP)
	return nil
}

// RDMA Extended Transport Header, IBTA 9.3.3:
//
//	+---------------------------------------------------------------+
//	|                     Virtual Address (64)                      |
//	+---------------------------------------------------------------+
//	|                          R_Key (32)                           |
//	+---------------------------------------------------------------+
//	|                       DMA Length (32)                         |
//	+---------------------------------------------------------------+

// RETH is the RDMA Extended Transport Header layer.
type RETH struct {
	golayers.BaseLayer
	Opcode    wire.Opcode // the packet's BTH opcode: selects the next header
	VA        uint64
	RKey      uint32
	DMALength uint32
	bth       *BTH
}

// LayerType returns LayerTypeRETH.
func (r *RETH) LayerType() gopacket.LayerType { return LayerTypeRETH }

// CanDecode returns LayerTypeRETH.
func (r *RETH) CanDecode() gopacket.LayerClass { return LayerTypeRETH }

// NextLayerType returns ImmDt (WRITE_ONLY_WITH_IMMEDIATE), payload (WRITE
// FIRST/ONLY) or nothing (READ_REQUEST, zero-length WRITE).
func (r *RETH) NextLayerType() gopacket.LayerType {
	return nextLayerType(r.Opcode, wire.HdrRETH, r.Payload)
}

func (r *RETH) setOpcode(op wire.Opcode) { r.Opcode = op }

// DecodeFromBytes decodes a RETH with the wire view.
func (r *RETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if len(data) < wire.RETHSize {
		return truncated(df, "RETH", wire.RETHSize, len(data))
	}
	v := wire.RETH(data)
	r.VA, r.RKey, r.DMALength = v.VA(), v.RKey(), v.DMALength()
	r.BaseLayer = golayers.BaseLayer{Contents: data[:wire.RETHSize], Payload: data[wire.RETHSize:]}
	if r.bth != nil {
		r.Opcode = r.bth.Opcode
	}
	return nil
}

// SerializeTo prepends the RETH.
func (r *RETH) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(wire.RETHSize)
	if err != nil {
		return err
	}
	wire.RETH(h).Encode(&wire.RETHFields{VA: r.VA, RKey: r.RKey, DMALength: r.DMALength})
	return nil
}

// Atomic Extended Transport Header, IBTA 9.3.4:
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

// AtomicETH is the Atomic Extended Transport Header layer.
type AtomicETH struct {
	golayers.BaseLayer
	Opcode  wire.Opcode // the packet's BTH opcode
	VA      uint64
	RKey    uint32
	SwapAdd uint64
	Compare uint64
	bth     *BTH
}

// LayerType returns LayerTypeAtomicETH.
func (a *AtomicETH) LayerType() gopacket.LayerType { return LayerTypeAtomicETH }

// CanDecode returns LayerTypeAtomicETH.
func (a *AtomicETH) CanDecode() gopacket.LayerClass { return LayerTypeAtomicETH }

// NextLayerType returns LayerTypeZero: atomics carry no payload.
func (a *AtomicETH) NextLayerType() gopacket.LayerType {
	return nextLayerType(a.Opcode, wire.HdrAtomicETH, a.Payload)
}

func (a *AtomicETH) setOpcode(op wire.Opcode) { a.Opcode = op }

// DecodeFromBytes decodes an AtomicETH with the wire view.
func (a *AtomicETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if len(data) < wire.AtomicETHSize {
		return truncated(df, "AtomicETH", wire.AtomicETHSize, len(data))
	}
	v := wire.AtomicETH(data)
	a.VA, a.RKey, a.SwapAdd, a.Compare = v.VA(), v.RKey(), v.SwapAdd(), v.Compare()
	a.BaseLayer = golayers.BaseLayer{Contents: data[:wire.AtomicETHSize], Payload: data[wire.AtomicETHSize:]}
	if a.bth != nil {
		a.Opcode = a.bth.Opcode
	}
	return nil
}

// SerializeTo prepends the AtomicETH.
func (a *AtomicETH) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(wire.AtomicETHSize)
	if err != nil {
		return err
	}
	wire.AtomicETH(h).Encode(&wire.AtomicETHFields{VA: a.VA, RKey: a.RKey, SwapAdd: a.SwapAdd, Compare: a.Compare})
	return nil
}

// ACK Extended Transport Header, IBTA 9.3.5:
//
//	+---------------+-----------------------------------------------+
//	|  Syndrome (8) |             MSN (24)                          |
//	+---------------+-----------------------------------------------+

// AETH is the ACK Extended Transport Header layer.
type AETH struct {
	golayers.BaseLayer
	Opcode   wire.Opcode // the packet's BTH opcode: selects the next header
	Syndrome wire.Syndrome
	MSN      wire.MSN
	bth      *BTH
}

// LayerType returns LayerTypeAETH.
func (a *AETH) LayerType() gopacket.LayerType { return LayerTypeAETH }

// CanDecode returns LayerTypeAETH.
func (a *AETH) CanDecode() gopacket.LayerClass { return LayerTypeAETH }

// NextLayerType returns AtomicAckETH (ATOMIC_ACKNOWLEDGE), payload (READ
// responses) or nothing (ACKNOWLEDGE).
func (a *AETH) NextLayerType() gopacket.LayerType {
	return nextLayerType(a.Opcode, wire.HdrAETH, a.Payload)
}

func (a *AETH) setOpcode(op wire.Opcode) { a.Opcode = op }

// DecodeFromBytes decodes an AETH with the wire view.
func (a *AETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if len(data) < wire.AETHSize {
		return truncated(df, "AETH", wire.AETHSize, len(data))
	}
	v := wire.AETH(data)
	a.Syndrome, a.MSN = v.Syndrome(), v.MSN()
	a.BaseLayer = golayers.BaseLayer{Contents: data[:wire.AETHSize], Payload: data[wire.AETHSize:]}
	if a.bth != nil {
		a.Opcode = a.bth.Opcode
	}
	return nil
}

// SerializeTo prepends the AETH.
func (a *AETH) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(wire.AETHSize)
	if err != nil {
		return err
	}
	wire.AETH(h).Encode(a.Syndrome, a.MSN)
	return nil
}

// AtomicAckETH is the Atomic Acknowledge Extended Transport Header layer,
// IBTA 9.5.3: the 64-bit value the target held before the atomic.
type AtomicAckETH struct {
	golayers.BaseLayer
	Opcode         wire.Opcode // the packet's BTH opcode
	OrigRemoteData uint64
	bth            *BTH
}

// LayerType returns LayerTypeAtomicAckETH.
func (a *AtomicAckETH) LayerType() gopacket.LayerType { return LayerTypeAtomicAckETH }

// CanDecode returns LayerTypeAtomicAckETH.
func (a *AtomicAckETH) CanDecode() gopacket.LayerClass { return LayerTypeAtomicAckETH }

// NextLayerType returns LayerTypeZero: nothing follows.
func (a *AtomicAckETH) NextLayerType() gopacket.LayerType {
	return nextLayerType(a.Opcode, wire.HdrAtomicAckETH, a.Payload)
}

func (a *AtomicAckETH) setOpcode(op wire.Opcode) { a.Opcode = op }

// DecodeFromBytes decodes an AtomicAckETH with the wire view.
func (a *AtomicAckETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if len(data) < wire.AtomicAckETHSize {
		return truncated(df, "AtomicAckETH", wire.AtomicAckETHSize, len(data))
	}
	a.OrigRemoteData = wire.AtomicAckETH(data).OrigRemoteData()
	a.BaseLayer = golayers.BaseLayer{Contents: data[:wire.AtomicAckETHSize], Payload: data[wire.AtomicAckETHSize:]}
	if a.bth != nil {
		a.Opcode = a.bth.Opcode
	}
	return nil
}

// SerializeTo prepends the AtomicAckETH.
func (a *AtomicAckETH) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(wire.AtomicAckETHSize)
	if err != nil {
		return err
	}
	wire.AtomicAckETH(h).SetOrigRemoteData(a.OrigRemoteData)
	return nil
}

// ImmDt is the Immediate Data Extended Transport Header layer, IBTA 9.3.6.
type ImmDt struct {
	golayers.BaseLayer
	Opcode wire.Opcode // the packet's BTH opcode
	Imm    uint32      // immediate data, in network byte order as ibv_wc.imm_data
	bth    *BTH
}

// LayerType returns LayerTypeImmDt.
func (i *ImmDt) LayerType() gopacket.LayerType { return LayerTypeImmDt }

// CanDecode returns LayerTypeImmDt.
func (i *ImmDt) CanDecode() gopacket.LayerClass { return LayerTypeImmDt }

// NextLayerType returns the payload, or LayerTypeZero when there is none.
func (i *ImmDt) NextLayerType() gopacket.LayerType {
	return nextLayerType(i.Opcode, wire.HdrImmDt, i.Payload)
}

func (i *ImmDt) setOpcode(op wire.Opcode) { i.Opcode = op }

// DecodeFromBytes decodes an ImmDt with the wire view.
func (i *ImmDt) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if len(data) < wire.ImmDtSize {
		return truncated(df, "ImmDt", wire.ImmDtSize, len(data))
	}
	i.Imm = wire.ImmDt(data).Imm()
	i.BaseLayer = golayers.BaseLayer{Contents: data[:wire.ImmDtSize], Payload: data[wire.ImmDtSize:]}
	if i.bth != nil {
		i.Opcode = i.bth.Opcode
	}
	return nil
}

// SerializeTo prepends the ImmDt.
func (i *ImmDt) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(wire.ImmDtSize)
	if err != nil {
		return err
	}
	wire.ImmDt(h).SetImm(i.Imm)
	return nil
}

// IETH is the Invalidate Extended Transport Header layer, IBTA 9.3.7.
type IETH struct {
	golayers.BaseLayer
	Opcode wire.Opcode // the packet's BTH opcode
	RKey   uint32      // the R_Key to invalidate
	bth    *BTH
}

// LayerType returns LayerTypeIETH.
func (i *IETH) LayerType() gopacket.LayerType { return LayerTypeIETH }

// CanDecode returns LayerTypeIETH.
func (i *IETH) CanDecode() gopacket.LayerClass { return LayerTypeIETH }

// NextLayerType returns the payload, or LayerTypeZero when there is none.
func (i *IETH) NextLayerType() gopacket.LayerType {
	return nextLayerType(i.Opcode, wire.HdrIETH, i.Payload)
}

func (i *IETH) setOpcode(op wire.Opcode) { i.Opcode = op }

// DecodeFromBytes decodes an IETH with the wire view.
func (i *IETH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if len(data) < wire.IETHSize {
		return truncated(df, "IETH", wire.IETHSize, len(data))
	}
	i.RKey = wire.IETH(data).RKey()
	i.BaseLayer = golayers.BaseLayer{Contents: data[:wire.IETHSize], Payload: data[wire.IETHSize:]}
	if i.bth != nil {
		i.Opcode = i.bth.Opcode
	}
	return nil
}

// SerializeTo prepends the IETH.
func (i *IETH) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	h, err := b.PrependBytes(wire.IETHSize)
	if err != nil {
		return err
	}
	wire.IETH(h).SetRKey(i.RKey)
	return nil
}
