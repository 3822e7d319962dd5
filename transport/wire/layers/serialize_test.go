package layers_test

import (
	"math/rand/v2"
	"net"
	"testing"

	"github.com/gopacket/gopacket"
	golayers "github.com/gopacket/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/layers"
)

// roceLayers returns, for op, the RoCE layers with fields drawn from r,
// and a payload of n bytes when the opcode carries one.
func roceLayers(op wire.Opcode, n int, r *rand.Rand) []gopacket.SerializableLayer {
	info := wire.Info(op)
	out := []gopacket.SerializableLayer{&layers.BTH{
		Opcode: op, SolicitedEvent: r.IntN(2) == 0, MigReq: r.IntN(2) == 0, PKey: uint16(r.Uint32()),
		FECN: r.IntN(2) == 0, BECN: r.IntN(2) == 0, DestQP: wire.QPN(r.Uint32() & wire.QPNMask),
		AckReq: r.IntN(2) == 0, PSN: wire.PSN(r.Uint32() & wire.PSNMask),
	}}
	if info.Has(wire.MaskDETH) {
		out = append(out, &layers.DETH{Opcode: op, QKey: r.Uint32(), SrcQP: wire.QPN(r.Uint32() & wire.QPNMask)})
	}
	if info.Has(wire.MaskRETH) {
		out = append(out, &layers.RETH{Opcode: op, VA: r.Uint64(), RKey: r.Uint32(), DMALength: r.Uint32()})
	}
	if info.Has(wire.MaskAtomicETH) {
		out = append(out, &layers.AtomicETH{Opcode: op, VA: r.Uint64(), RKey: r.Uint32(), SwapAdd: r.Uint64(), Compare: r.Uint64()})
	}
	if info.Has(wire.MaskAETH) {
		out = append(out, &layers.AETH{Opcode: op, Syndrome: wire.Syndrome(r.Uint32()), MSN: wire.MSN(r.Uint32() & wire.PSNMask)})
	}
	if info.Has(wire.MaskAtomicAckETH) {
		out = append(out, &layers.AtomicAckETH{Opcode: op, OrigRemoteData: r.Uint64()})
	}
	if info.Has(wire.MaskImmDt) {
		out = append(out, &layers.ImmDt{Opcode: op, Imm: r.Uint32()})
	}
	if info.Has(wire.MaskIETH) {
		out = append(out, &layers.IETH{Opcode: op, RKey: r.Uint32()})
	}
	if info.Has(wire.MaskPayload) && n > 0 {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		out = append(out, gopacket.Payload(p))
	}
	return out
}

// exported returns a copy of l with only its exported, non-BaseLayer
// fields, for comparing what was serialized with what was decoded.
func exported(l gopacket.Layer) any {
	switch l := l.(type) {
	case *layers.BTH:
		return layers.BTH{Opcode: l.Opcode, SolicitedEvent: l.SolicitedEvent, MigReq: l.MigReq, PadCount: l.PadCount,
			TVer: l.TVer, PKey: l.PKey, FECN: l.FECN, BECN: l.BECN, DestQP: l.DestQP, AckReq: l.AckReq, PSN: l.PSN, ICRC: l.ICRC}
	case *layers.DETH:
		return layers.DETH{Opcode: l.Opcode, QKey: l.QKey, SrcQP: l.SrcQP}
	case *layers.RETH:
		return layers.RETH{Opcode: l.Opcode, VA: l.VA, RKey: l.RKey, DMALength: l.DMALength}
	case *layers.AtomicETH:
		return layers.AtomicETH{Opcode: l.Opcode, VA: l.VA, RKey: l.RKey, SwapAdd: l.SwapAdd, Compare: l.Compare}
	case *layers.AETH:
		return layers.AETH{Opcode: l.Opcode, Syndrome: l.Syndrome, MSN: l.MSN}
	case *layers.AtomicAckETH:
		return layers.AtomicAckETH{Opcode: l.Opcode, OrigRemoteData: l.OrigRemoteData}
	case *layers.ImmDt:
		return layers.ImmDt{Opcode: l.Opcode, Imm: l.Imm}
	case *layers.IETH:
		return layers.IETH{Opcode: l.Opcode, RKey: l.RKey}
	case *gopacket.Payload:
		return []byte(*l)
	case gopacket.Payload:
		return []byte(l)
	}
	panic("unexpected layer")
}

// Serialize every opcode with gopacket (lengths and ICRC computed), decode
// it back: the same fields, a valid ICRC for wire, and wire.Parse agrees.
func TestSerializeDecodeIsomorphic(t *testing.T) {
	layers.Register()
	r := rand.New(rand.NewPCG(4791, 7))
	var wp wire.Packet
	for op := range 256 {
		op := wire.Opcode(op)
		if !wire.Info(op).Valid() {
			continue
		}
		for _, n := range []int{0, 1, 2, 3, 4, 1021, 4096} {
			for _, v6 := range []bool{false, true} {
				eth := &golayers.Ethernet{SrcMAC: net.HardwareAddr{0x52, 0x54, 0, 0x77, 0, 0x0b}, DstMAC: net.HardwareAddr{0x52, 0x54, 0, 0x77, 0, 0x0a}}
				udp := &golayers.UDP{SrcPort: golayers.UDPPort(49152 + r.IntN(16384)), DstPort: wire.RoCEv2Port}
				var ip gopacket.SerializableLayer
				var netl gopacket.NetworkLayer
				if v6 {
					eth.EthernetType = golayers.EthernetTypeIPv6
					ip6 := &golayers.IPv6{Version: 6, NextHeader: golayers.IPProtocolUDP, HopLimit: 64,
						SrcIP: net.ParseIP("fd00:77::b"), DstIP: net.ParseIP("fd00:77::a")}
					ip, netl = ip6, ip6
				} else {
					eth.EthernetType = golayers.EthernetTypeIPv4
					ip4 := &golayers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: golayers.IPProtocolUDP,
						Flags: golayers.IPv4DontFragment, Id: uint16(r.Uint32()), SrcIP: vm1, DstIP: vm0}
					ip, netl = ip4, ip4
				}
				require.NoError(t, udp.SetNetworkLayerForChecksum(netl))
				rl := roceLayers(op, n, r)
				bth := rl[0].(*layers.BTH)
				require.NoError(t, bth.SetNetworkLayerForICRC(netl, udp))

				buf := gopacket.NewSerializeBuffer()
				all := append([]gopacket.SerializableLayer{eth, ip, udp}, rl...)
				require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, all...))

				p := gopacket.NewPacket(buf.Bytes(), golayers.LayerTypeEthernet, gopacket.Default)
				require.Nil(t, p.ErrorLayer(), "%s n=%d: %v", op, n, p.ErrorLayer())
				got := p.Layers()[3:]
				require.Len(t, got, len(rl), "%s n=%d", op, n)
				for i := range rl {
					require.Equal(t, exported(rl[i].(gopacket.Layer)), exported(got[i]), "%s n=%d layer %d", op, n, i)
				}

				// The wire codec agrees, and the ICRC verifies.
				dudp := p.Layer(golayers.LayerTypeUDP).(*golayers.UDP)
				require.NoError(t, wire.Parse(dudp.Payload, &wp))
				require.Equal(t, wire.PadFor(len(wp.Payload)), wp.PadCount())
				h, err := layers.IPHeader(p.NetworkLayer())
				require.NoError(t, err)
				require.True(t, wire.VerifyICRCExact(&h, uint16(dudp.SrcPort), uint16(dudp.DstPort), dudp.Payload))
				valid, err := p.Layer(layers.LayerTypeBTH).(*layers.BTH).ICRCValid(p.NetworkLayer(), dudp)
				require.NoError(t, err)
				require.True(t, valid)
				if !v6 {
					h.ID = 0
					ok, id := wire.VerifyICRC(&h, uint16(dudp.SrcPort), uint16(dudp.DstPort), dudp.Payload)
					require.True(t, ok)
					require.Equal(t, p.NetworkLayer().(*golayers.IPv4).Id, id)
				}
			}
		}
	}
}

// Decoding a golden rxe frame and serializing its layers again, as they
// are, gives back the frame byte for byte.
func TestReserializeGoldenCaptures(t *testing.T) {
	layers.Register()
	n := 0
	for _, f := range captureFrames(t) {
		p := gopacket.NewPacket(f.data, golayers.LayerTypeEthernet, gopacket.Default)
		if p.Layer(layers.LayerTypeBTH) == nil {
			continue
		}
		var sl []gopacket.SerializableLayer
		for _, l := range p.Layers() {
			s, ok := l.(gopacket.SerializableLayer)
			require.Truef(t, ok, "%v is not serializable", l.LayerType())
			sl = append(sl, s)
		}
		buf := gopacket.NewSerializeBuffer()
		require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, sl...))
		require.Equalf(t, f.data, buf.Bytes(), "%s frame %d", f.capture, f.n)

		// With FixLengths and the ICRC recomputed, still the same (except
		// where the ICRC was wrong on purpose).
		bth := p.Layer(layers.LayerTypeBTH).(*layers.BTH)
		require.NoError(t, bth.SetNetworkLayerForICRC(p.NetworkLayer(), p.Layer(golayers.LayerTypeUDP).(*golayers.UDP)))
		stored := bth.ICRC
		buf = gopacket.NewSerializeBuffer()
		require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: false, FixLengths: true}, sl...))
		require.Equal(t, f.data, buf.Bytes())
		// ComputeChecksums would also recompute the IPv4 and UDP checksums,
		// so recompute only the BTH's ICRC here.
		out := gopacket.NewSerializeBuffer()
		payload := bth.LayerPayload()
		copy(must(out.PrependBytes(len(payload))), payload)
		require.NoError(t, bth.SerializeTo(out, gopacket.SerializeOptions{ComputeChecksums: true}))
		if bad := knownBadICRC[f.name]; len(bad) == 2 && (f.n == bad[0] || f.n == bad[1]) {
			require.NotEqual(t, stored, bth.ICRC)
		} else {
			require.Equalf(t, stored, bth.ICRC, "%s frame %d", f.capture, f.n)
		}
		n++
	}
	require.Greater(t, n, 5000)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestSerializeErrors(t *testing.T) {
	buf := gopacket.NewSerializeBuffer()
	// WRITE_FIRST needs a RETH in the buffer.
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, &layers.BTH{Opcode: wire.OpRDMAWriteFirst})
	require.Error(t, err)
	var b layers.BTH
	require.Error(t, b.SetNetworkLayerForICRC(nil, &golayers.UDP{}))
	require.Error(t, b.SetNetworkLayerForICRC(&golayers.IPv4{SrcIP: vm0, DstIP: vm1}, nil))
	require.Error(t, b.SetNetworkLayerForICRC(&golayers.IPv4{SrcIP: vm0, DstIP: vm1, Options: []golayers.IPv4Option{{OptionType: 1}}}, &golayers.UDP{}))
	_, err = b.ICRCValid(&golayers.IPv4{SrcIP: vm0, DstIP: vm1}, &golayers.UDP{})
	require.Error(t, err, "not decoded")
}
