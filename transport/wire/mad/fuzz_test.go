package mad_test

import (
	"errors"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/layers"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// roundTrip decodes view v into a, encodes a into a fresh buffer of
// size n, decodes that into b and returns the fresh buffer: a and b must
// be equal, and encoding b again must give the same bytes.
func roundTrip[F any](t *testing.T, n int, decode func([]byte, *F), encode func([]byte, *F), v []byte) (a, b F) {
	t.Helper()
	decode(v, &a)
	out := make([]byte, n)
	encode(out, &a)
	decode(out, &b)
	require.Equal(t, a, b, "Decode(Encode(Decode(x))) == Decode(x)")
	again := make([]byte, n)
	encode(again, &b)
	require.Equal(t, out, again, "Encode is canonical")
	return a, b
}

// FuzzParse checks that Parse, the CM views and the gopacket MAD layers
// never panic on any input, that every field they decode stays in its bit
// width, and that whatever decodes survives Encode and a second Decode
// unchanged (reserved bits aside).
//
// Seeds: the five CM MADs of rping.pcap (REQ, REP, RTU, DREQ, DREP), a REJ
// and an MRA built with Encode, a subnet administration MAD, and short and
// wrong-version inputs.
func FuzzParse(f *testing.F) {
	for _, s := range []string{rpingREQ, rpingREP, rpingRTU, rpingDREQ, rpingDREP} {
		f.Add(madOf(f, s))
	}
	for _, attr := range []mad.AttributeID{mad.AttrREJ, mad.AttrMRA} {
		b := make([]byte, mad.Size)
		mad.Datagram(b).Encode(&mad.HeaderFields{Class: mad.ClassCM, ClassVersion: 2, Method: mad.MethodSend,
			TransactionID: 7, AttributeID: attr})
		if attr == mad.AttrREJ {
			mad.REJ(b[mad.HeaderSize:]).Encode(&mad.REJFields{LocalCommID: 1, RemoteCommID: 2, Reason: mad.RejConsumerDefined,
				ARI: []byte{1, 2, 3}, PrivateData: []byte("no")})
		} else {
			mad.MRA(b[mad.HeaderSize:]).Encode(&mad.MRAFields{LocalCommID: 1, RemoteCommID: 2, ServiceTimeout: 20})
		}
		f.Add(b)
	}
	f.Add(madOf(f, "01030281"))
	f.Add(madOf(f, rpingREQ)[:255])
	f.Add(append([]byte{0x80}, madOf(f, rpingREQ)[1:]...))
	layers.Register()

	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := mad.Parse(b)
		if err != nil {
			require.True(t, errors.Is(err, mad.ErrTooShort) || errors.Is(err, mad.ErrBadBaseVersion), err)
			return
		}
		require.Len(t, d, mad.Size)
		require.Same(t, &b[0], &d[0], "the view aliases the input")
		roundTrip(t, mad.Size, func(v []byte, h *mad.HeaderFields) { mad.Datagram(v).Decode(h) },
			func(v []byte, h *mad.HeaderFields) { mad.Datagram(v).Encode(h) }, d)

		// The gopacket layers agree with the views and never fail on a
		// MAD that Parse accepts.
		p := gopacket.NewPacket(b, layers.LayerTypeMAD, gopacket.NoCopy)
		require.Nil(t, p.ErrorLayer())
		ml := p.Layer(layers.LayerTypeMAD).(*layers.MAD)
		require.Equal(t, d.AttributeID(), ml.AttributeID)
		require.Equal(t, d.TransactionID(), ml.TransactionID)
		cml, _ := p.Layer(layers.LayerTypeCM).(*layers.CM)

		attr, data, err := d.CM()
		if err != nil {
			require.True(t, errors.Is(err, mad.ErrNotCM) || errors.Is(err, mad.ErrNotCMMessage), err)
			require.Nil(t, cml)
			return
		}
		require.Len(t, data, mad.DataSize)
		require.NotNil(t, cml)
		require.Equal(t, attr, cml.Attribute)
		l, r := mad.CommIDs(attr, data)
		gl, gr := cml.CommIDs()
		require.Equal(t, l, gl)
		require.Equal(t, r, gr)
		n := mad.DataSize
		switch attr {
		case mad.AttrREQ:
			a, _ := roundTrip(t, n, func(v []byte, f *mad.REQFields) { mad.REQ(v).Decode(f) },
				func(v []byte, f *mad.REQFields) { mad.REQ(v).Encode(f) }, data)
			require.LessOrEqual(t, uint32(a.LocalQPN), uint32(wire.QPNMask))
			require.LessOrEqual(t, uint32(a.StartingPSN), uint32(wire.PSNMask))
			require.Less(t, a.RetryCount, uint8(8))
			require.Less(t, a.RNRRetryCount, uint8(8))
			require.Less(t, a.RemoteCMResponseTimeout, uint8(32))
			require.Less(t, uint8(a.PathMTU), uint8(16))
			require.Less(t, a.Primary.FlowLabel, uint32(1<<20))
			require.Len(t, a.PrivateData, mad.REQPrivateDataSize)
			require.Equal(t, a, cml.REQ)
			ip := mad.IPPrivateData(a.PrivateData)
			if ip.Valid() {
				ipa, _ := roundTrip(t, mad.REQPrivateDataSize,
					func(v []byte, f *mad.IPPrivateDataFields) { mad.IPPrivateData(v).Decode(f) },
					func(v []byte, f *mad.IPPrivateDataFields) { mad.IPPrivateData(v).Encode(f) }, ip)
				require.Equal(t, ipa.IPVersion == 4, ipa.SrcIP.Is4())
				if a.ServiceID.IsIP() {
					ipl := p.Layer(layers.LayerTypeIPCM).(*layers.IPCM)
					require.Equal(t, ipa.SrcIP, ipl.SrcIP)
					require.Equal(t, ipa.DstIP, ipl.DstIP)
					require.Equal(t, ipa.SrcPort, ipl.SrcPort)
				}
			}
		case mad.AttrMRA:
			a, _ := roundTrip(t, n, func(v []byte, f *mad.MRAFields) { mad.MRA(v).Decode(f) },
				func(v []byte, f *mad.MRAFields) { mad.MRA(v).Encode(f) }, data)
			require.Less(t, a.ServiceTimeout, uint8(32))
			require.Equal(t, a, cml.MRA)
		case mad.AttrREJ:
			a, _ := roundTrip(t, n, func(v []byte, f *mad.REJFields) { mad.REJ(v).Decode(f) },
				func(v []byte, f *mad.REJFields) { mad.REJ(v).Encode(f) }, data)
			require.LessOrEqual(t, len(a.ARI), mad.ARISize)
			require.Equal(t, a, cml.REJ)
		case mad.AttrREP:
			a, _ := roundTrip(t, n, func(v []byte, f *mad.REPFields) { mad.REP(v).Decode(f) },
				func(v []byte, f *mad.REPFields) { mad.REP(v).Encode(f) }, data)
			require.LessOrEqual(t, uint32(a.LocalQPN), uint32(wire.QPNMask))
			require.Less(t, a.FailoverAccepted, uint8(4))
			require.Equal(t, a, cml.REP)
		case mad.AttrRTU:
			a, _ := roundTrip(t, n, func(v []byte, f *mad.RTUFields) { mad.RTU(v).Decode(f) },
				func(v []byte, f *mad.RTUFields) { mad.RTU(v).Encode(f) }, data)
			require.Equal(t, a, cml.RTU)
		case mad.AttrDREQ:
			a, _ := roundTrip(t, n, func(v []byte, f *mad.DREQFields) { mad.DREQ(v).Decode(f) },
				func(v []byte, f *mad.DREQFields) { mad.DREQ(v).Encode(f) }, data)
			require.Equal(t, a, cml.DREQ)
		case mad.AttrDREP:
			a, _ := roundTrip(t, n, func(v []byte, f *mad.RTUFields) { mad.DREP(v).Decode(f) },
				func(v []byte, f *mad.RTUFields) { mad.DREP(v).Encode(f) }, data)
			require.Equal(t, a, cml.DREP)
		default:
			t.Fatalf("CM returned %v without an error", attr)
		}
	})
}
