// Package layers provides gopacket layer types for the RoCEv2 transport
// headers (IBTA Vol. 1 chapter 9, Annex A17): BTH, DETH, RETH, AtomicETH,
// AETH, AtomicAckETH, ImmDt and IETH, decoded from UDP port 4791; and for
// the management datagrams a UD SEND to QP1 carries (package mad): MAD,
// CM (the communication manager's messages, IBTA chapter 12) and IPCM (the
// RDMA CM IP private data of a REQ, IBTA Annex A11).
//
// The layers are thin adapters over packages wire and mad: decoding goes
// through wire.Parse, mad.Parse and their views, the header chain comes
// from the wire opcode table, and serializing uses the views' Encode
// methods. There is no second codec here.
//
// Nothing is registered with gopacket at init time. Call Register once
// before decoding with gopacket.NewPacket or a DecodingLayerParser that
// starts below UDP; it names the layer types and maps UDP port 4791 to
// LayerTypeBTH. The DETH of a UD_SEND_ONLY to QP1 whose 256-byte payload
// starts with MAD base version 1 is followed by LayerTypeMAD.
package layers

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/gopacket/gopacket"
	golayers "github.com/gopacket/gopacket/layers"

	"github.com/softrdma/softrdma/transport/wire"
)

// Layer type numbers, in gopacket's range for external layers (1000-1999;
// gopacket itself uses 1010). 1791 is a reminder of UDP port 4791. They
// are constants, usable before Register, which only attaches names and
// decoders to them.
const (
	LayerTypeBTH          gopacket.LayerType = 1791
	LayerTypeDETH         gopacket.LayerType = 1792
	LayerTypeRETH         gopacket.LayerType = 1793
	LayerTypeAtomicETH    gopacket.LayerType = 1794
	LayerTypeAETH         gopacket.LayerType = 1795
	LayerTypeAtomicAckETH gopacket.LayerType = 1796
	LayerTypeImmDt        gopacket.LayerType = 1797
	LayerTypeIETH         gopacket.LayerType = 1798
	LayerTypeMAD          gopacket.LayerType = 1799
	LayerTypeCM           gopacket.LayerType = 1800
	LayerTypeIPCM         gopacket.LayerType = 1801
)

// layerTypeOf maps each extension header to its layer type.
var layerTypeOf = [...]gopacket.LayerType{
	wire.HdrBTH:          LayerTypeBTH,
	wire.HdrRDETH:        gopacket.LayerTypePayload, // RD is not supported
	wire.HdrDETH:         LayerTypeDETH,
	wire.HdrRETH:         LayerTypeRETH,
	wire.HdrAtomicETH:    LayerTypeAtomicETH,
	wire.HdrAETH:         LayerTypeAETH,
	wire.HdrAtomicAckETH: LayerTypeAtomicAckETH,
	wire.HdrImmDt:        LayerTypeImmDt,
	wire.HdrIETH:         LayerTypeIETH,
	wire.HdrPayload:      gopacket.LayerTypePayload,
}

// standaloneOpcode is the opcode an extension header is assumed to come
// with when it is decoded on its own (gopacket.NewPacket(data,
// LayerTypeRETH, ...)): the ONLY opcode carrying it, so that whatever
// follows it is decoded as payload.
var standaloneOpcode = [...]wire.Opcode{
	wire.HdrDETH:         wire.OpUDSendOnly,
	wire.HdrRETH:         wire.OpRDMAWriteOnly,
	wire.HdrAtomicETH:    wire.OpCompareSwap,
	wire.HdrAETH:         wire.OpRDMAReadResponseOnly,
	wire.HdrAtomicAckETH: wire.OpAtomicAcknowledge,
	wire.HdrImmDt:        wire.OpSendOnlyWithImmediate,
	wire.HdrIETH:         wire.OpSendOnlyWithInvalidate,
}

var registerOnce sync.Once

// Register names the layer types, gives them decoders, and maps UDP port
// 4791 (wire.RoCEv2Port) to LayerTypeBTH, so that gopacket decodes RoCEv2
// packets from Ethernet or IP up. Safe to call more than once and from
// several goroutines; it panics if another package registered one of the
// layer type numbers first.
func Register() {
	registerOnce.Do(func() {
		for _, m := range []struct {
			t    gopacket.LayerType
			name string
			dec  gopacket.Decoder
		}{
			{LayerTypeBTH, "BTH", gopacket.DecodeFunc(decodeBTH)},
			{LayerTypeDETH, "DETH", extDecoder{wire.HdrDETH, standaloneOpcode[wire.HdrDETH], 0}},
			{LayerTypeRETH, "RETH", extDecoder{wire.HdrRETH, standaloneOpcode[wire.HdrRETH], 0}},
			{LayerTypeAtomicETH, "AtomicETH", extDecoder{wire.HdrAtomicETH, standaloneOpcode[wire.HdrAtomicETH], 0}},
			{LayerTypeAETH, "AETH", extDecoder{wire.HdrAETH, standaloneOpcode[wire.HdrAETH], 0}},
			{LayerTypeAtomicAckETH, "AtomicAckETH", extDecoder{wire.HdrAtomicAckETH, standaloneOpcode[wire.HdrAtomicAckETH], 0}},
			{LayerTypeImmDt, "ImmDt", extDecoder{wire.HdrImmDt, standaloneOpcode[wire.HdrImmDt], 0}},
			{LayerTypeIETH, "IETH", extDecoder{wire.HdrIETH, standaloneOpcode[wire.HdrIETH], 0}},
			{LayerTypeMAD, "MAD", gopacket.DecodeFunc(decodeMAD)},
			{LayerTypeCM, "CM", gopacket.DecodeFunc(decodeCMStandalone)},
			{LayerTypeIPCM, "IPCM", gopacket.DecodeFunc(decodeIPCM)},
		} {
			gopacket.RegisterLayerType(int(m.t), gopacket.LayerTypeMetadata{Name: m.name, Decoder: m.dec})
		}
		golayers.RegisterUDPPortLayerType(wire.RoCEv2Port, LayerTypeBTH)
	})
}

// nextHeader returns the header that follows header after in a packet
// with opcode op (IBTA header order, from the wire opcode table), or
// wire.HdrPayload when only payload follows.
func nextHeader(op wire.Opcode, after wire.Header) wire.Header {
	info := wire.Info(op)
	for h := after + 1; h < wire.HdrPayload; h++ {
		if info.Has(wire.Mask(1) << h) {
			return h
		}
	}
	return wire.HdrPayload
}

// nextLayerType is NextLayerType for the header after in a packet with
// opcode op whose remaining bytes are rest.
func nextLayerType(op wire.Opcode, after wire.Header, rest []byte) gopacket.LayerType {
	if h := nextHeader(op, after); h != wire.HdrPayload {
		return layerTypeOf[h]
	}
	if len(rest) == 0 {
		return gopacket.LayerTypeZero
	}
	return gopacket.LayerTypePayload
}

// nextDecoder is nextLayerType for gopacket.NewPacket: the extension
// header decoders need the opcode (and the DETH the destination QP), so
// they are handed them directly.
func nextDecoder(op wire.Opcode, after wire.Header, qp wire.QPN) gopacket.Decoder {
	if h := nextHeader(op, after); h != wire.HdrPayload {
		return extDecoder{h, op, qp}
	}
	return gopacket.LayerTypePayload
}

// extDecoder decodes extension header h of a packet with opcode op sent
// to QP qp.
type extDecoder struct {
	h  wire.Header
	op wire.Opcode
	qp wire.QPN
}

// Decode implements gopacket.Decoder.
func (d extDecoder) Decode(data []byte, p gopacket.PacketBuilder) error {
	var l extLayer
	switch d.h {
	case wire.HdrDETH:
		l = &DETH{}
	case wire.HdrRETH:
		l = &RETH{}
	case wire.HdrAtomicETH:
		l = &AtomicETH{}
	case wire.HdrAETH:
		l = &AETH{}
	case wire.HdrAtomicAckETH:
		l = &AtomicAckETH{}
	case wire.HdrImmDt:
		l = &ImmDt{}
	case wire.HdrIETH:
		l = &IETH{}
	default:
		return fmt.Errorf("layers: no decoder for header %d", d.h)
	}
	if err := l.DecodeFromBytes(data, p); err != nil {
		return err
	}
	l.setOpcode(d.op)
	p.AddLayer(l)
	if deth, ok := l.(*DETH); ok {
		deth.DestQP = d.qp
		if deth.carriesMAD() {
			return p.NextDecoder(LayerTypeMAD)
		}
	}
	return p.NextDecoder(nextDecoder(d.op, d.h, d.qp))
}

// extLayer is implemented by the extension header layers.
type extLayer interface {
	gopacket.Layer
	gopacket.DecodingLayer
	setOpcode(wire.Opcode)
}

// DecodingLayers holds one layer of each RoCEv2 type for a
// gopacket.DecodingLayerParser. The extension header layers are linked to
// the BTH so that they learn the packet's opcode, which decides the header
// that follows each of them; layers not created this way must have their
// Opcode field set by hand before NextLayerType is asked.
//
//	layers.Register() // UDP port 4791 -> BTH
//	roce := layers.NewDecodingLayers()
//	parser := gopacket.NewDecodingLayerParser(golayers.LayerTypeEthernet, &eth, &ip4, &ip6, &udp)
//	for _, l := range roce.Layers() {
//		parser.AddDecodingLayer(l)
//	}
//	err := parser.DecodeLayers(frame, &decoded)
//	// roce.BTH.Packet() is the wire.Packet the engine would see.
//
// The CM layer is linked to the MAD layer, which gives it the attribute.
// Not safe for concurrent use; keep one per goroutine.
type DecodingLayers struct {
	BTH          BTH
	DETH         DETH
	RETH         RETH
	AtomicETH    AtomicETH
	AETH         AETH
	AtomicAckETH AtomicAckETH
	ImmDt        ImmDt
	IETH         IETH
	MAD          MAD
	CM           CM
	IPCM         IPCM
	Payload      gopacket.Payload
}

// NewDecodingLayers returns linked layers; see DecodingLayers.
func NewDecodingLayers() *DecodingLayers {
	d := &DecodingLayers{}
	d.DETH.bth = &d.BTH
	d.RETH.bth = &d.BTH
	d.AtomicETH.bth = &d.BTH
	d.AETH.bth = &d.BTH
	d.AtomicAckETH.bth = &d.BTH
	d.ImmDt.bth = &d.BTH
	d.IETH.bth = &d.BTH
	d.CM.mad = &d.MAD
	return d
}

// Layers returns the layers to add to a gopacket.DecodingLayerParser.
func (d *DecodingLayers) Layers() []gopacket.DecodingLayer {
	return []gopacket.DecodingLayer{
		&d.BTH, &d.DETH, &d.RETH, &d.AtomicETH, &d.AETH, &d.AtomicAckETH, &d.ImmDt, &d.IETH,
		&d.MAD, &d.CM, &d.IPCM, &d.Payload,
	}
}

// IPHeader returns the fields of an IPv4 or IPv6 layer that the ICRC
// covers. IPv4 options are not supported (RoCEv2 senders use none).
func IPHeader(ip gopacket.NetworkLayer) (wire.IPHeader, error) {
	switch ip := ip.(type) {
	case *golayers.IPv4:
		if len(ip.Options) > 0 || ip.IHL > 5 {
			return wire.IPHeader{}, errIPv4Options
		}
		src, ok1 := netip.AddrFromSlice(ip.SrcIP.To4())
		dst, ok2 := netip.AddrFromSlice(ip.DstIP.To4())
		if !ok1 || !ok2 {
			return wire.IPHeader{}, errBadAddress
		}
		return wire.IPHeader{Src: src, Dst: dst, ID: ip.Id, DF: ip.Flags&golayers.IPv4DontFragment != 0}, nil
	case *golayers.IPv6:
		src, ok1 := netip.AddrFromSlice(ip.SrcIP.To16())
		dst, ok2 := netip.AddrFromSlice(ip.DstIP.To16())
		if !ok1 || !ok2 {
			return wire.IPHeader{}, errBadAddress
		}
		return wire.IPHeader{Src: src, Dst: dst}, nil
	case nil:
		return wire.IPHeader{}, errNoNetwork
	default:
		return wire.IPHeader{}, fmt.Errorf("layers: ICRC over network layer %v is not defined", ip.LayerType())
	}
}

var (
	errIPv4Options = errors.New("layers: ICRC with IPv4 options is not supported")
	errBadAddress  = errors.New("layers: bad IP address for the ICRC")
	errNoNetwork   = errors.New("layers: no IP and UDP layers set for the ICRC")
)

// truncated reports a header shorter than its fixed size.
func truncated(df gopacket.DecodeFeedback, name string, need, have int) error {
	df.SetTruncated()
	return fmt.Errorf("layers: %s truncated: %d bytes, need %d", name, have, need)
}
