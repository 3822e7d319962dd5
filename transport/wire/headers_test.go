package wire_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

// Golden packets from rxe (shared/rxe-testbed/captures), UDP payload only.

// write_bw.pcap, first RC RDMA WRITE First (tshark -x, from offset 0x2a):
//
//	0020                                06 00 ff ff 00 00             ......
//	0030  00 11 00 1d 25 5a 00 00 55 bd 72 0e 20 00 00 00   ....%Z..U.r. ...
//	0040  02 26 00 00 20 00 67 69 a5 2a 97 70 08 1a 37 61   .&.. .gi.*.p..7a
var goldenWriteFirstHeaders = []byte{
	0x06, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x1d, 0x25, 0x5a, // BTH
	0x00, 0x00, 0x55, 0xbd, 0x72, 0x0e, 0x20, 0x00, 0x00, 0x00, 0x02, 0x26, 0x00, 0x00, 0x20, 0x00, // RETH
}

// atomic_cas.pcap, first RC CmpSwap, 192.168.77.11:49441 -> 192.168.77.10:4791,
// IPv4 ID 0x4a2e, DF:
//
//	0020                                13 00 ff ff 00 00             ......
//	0030  00 11 80 6e 7e 1e 00 00 55 e2 1e 0a a0 00 00 00   ...n~...U.......
//	0040  02 f4 00 00 00 00 00 00 00 00 00 00 00 00 00 00   ................
//	0050  00 00 8d b7 0b b9                                 ......
var goldenCompareSwap = []byte{
	0x13, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x6e, 0x7e, 0x1e, // BTH
	0x00, 0x00, 0x55, 0xe2, 0x1e, 0x0a, 0xa0, 0x00, 0x00, 0x00, 0x02, 0xf4, // AtomicETH VA, R_Key
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // swap
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // compare
	0x8d, 0xb7, 0x0b, 0xb9, // ICRC
}

// atomic_cas.pcap, first RC ATOMIC Acknowledge, 192.168.77.10:49441 ->
// 192.168.77.11:4791, IPv4 ID 0x5805, DF:
//
//	0020                                12 00 ff ff 00 00             ......
//	0030  00 11 00 6e 7e 1e 1f 00 00 01 c6 95 ef 88 cb c6   ...n~...........
//	0040  dc 4d 36 27 40 84                                 .M6'@.
var goldenAtomicAck = []byte{
	0x12, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x6e, 0x7e, 0x1e, // BTH
	0x1f, 0x00, 0x00, 0x01, // AETH
	0xc6, 0x95, 0xef, 0x88, 0xcb, 0xc6, 0xdc, 0x4d, // AtomicAckETH
	0x36, 0x27, 0x40, 0x84, // ICRC
}

func TestGoldenVectors(t *testing.T) {
	var p wire.Packet

	b := wire.BTH(goldenWriteFirstHeaders)
	require.Equal(t, wire.OpRDMAWriteFirst, b.Opcode())
	require.Equal(t, uint16(0xffff), b.PKey())
	require.Equal(t, wire.QPN(0x11), b.DestQP())
	require.Equal(t, wire.PSN(1910106), b.PSN())
	require.False(t, b.AckReq())
	r := wire.RETH(goldenWriteFirstHeaders[wire.BTHSize:])
	require.Equal(t, uint64(0x000055bd720e2000), r.VA())
	require.Equal(t, uint32(0x226), r.RKey())
	require.Equal(t, uint32(8192), r.DMALength())

	require.NoError(t, wire.Parse(goldenCompareSwap, &p))
	require.Equal(t, wire.OpCompareSwap, p.Opcode())
	require.True(t, p.BTH().AckReq())
	require.Equal(t, wire.PSN(0x6e7e1e), p.PSN())
	require.Equal(t, uint64(0x000055e21e0aa000), p.AtomicETH().VA())
	require.Equal(t, uint32(0x2f4), p.AtomicETH().RKey())
	require.Zero(t, p.AtomicETH().SwapAdd())
	require.Zero(t, p.AtomicETH().Compare())
	require.Empty(t, p.Payload)
	ok, id := wire.VerifyICRC(&wire.IPHeader{Src: vm1, Dst: vm0, DF: true}, 49441, wire.RoCEv2Port, goldenCompareSwap)
	require.True(t, ok)
	require.Equal(t, uint16(0x4a2e), id)

	require.NoError(t, wire.Parse(goldenAtomicAck, &p))
	require.Equal(t, wire.OpAtomicAcknowledge, p.Opcode())
	require.Equal(t, wire.SyndromeACK, p.AETH().Syndrome())
	require.Equal(t, wire.MSN(1), p.AETH().MSN())
	require.Equal(t, uint64(14309606761853017165), p.AtomicAckETH().OrigRemoteData())
	require.True(t, wire.VerifyICRCExact(&wire.IPHeader{Src: vm0, Dst: vm1, ID: 0x5805, DF: true}, 49441, wire.RoCEv2Port, goldenAtomicAck))
	ok, id = wire.VerifyICRC(&wire.IPHeader{Src: vm0, Dst: vm1, DF: true}, 49441, wire.RoCEv2Port, goldenAtomicAck)
	require.True(t, ok)
	require.Equal(t, uint16(0x5805), id)

	// Encoding the decoded fields gives the captured bytes back.
	buf := make([]byte, 28)
	wire.BTH(buf).Encode(&wire.BTHFields{Opcode: wire.OpRDMAWriteFirst, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: 1910106})
	wire.RETH(buf[wire.BTHSize:]).Encode(&wire.RETHFields{VA: 0x000055bd720e2000, RKey: 0x226, DMALength: 8192})
	require.Equal(t, goldenWriteFirstHeaders, buf)
}

// garbage returns n bytes of 0xA5, so that Encode is seen to write every bit.
func garbage(n int) []byte { return bytes.Repeat([]byte{0xa5}, n) }

func TestBTHRoundTrip(t *testing.T) {
	for _, f := range []wire.BTHFields{
		{},
		{Opcode: wire.OpRDMAWriteFirst, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: 1910106},
		{Opcode: wire.OpAcknowledge, SolicitedEvent: true, MigReq: true, PadCount: 3, PKey: 0x8001,
			FECN: true, BECN: true, DestQP: wire.QPNMask, AckReq: true, PSN: wire.PSNMask},
		{Opcode: wire.OpUDSendOnly, PadCount: 1, PKey: 0x7fff, BECN: true, DestQP: 1, PSN: 0x800000},
		{Opcode: 0xff, PadCount: 2, FECN: true, DestQP: 0xabcdef, PSN: 1},
	} {
		b := wire.BTH(garbage(wire.BTHSize))
		b.Encode(&f)
		require.Equal(t, f.Opcode, b.Opcode())
		require.Equal(t, f.SolicitedEvent, b.SolicitedEvent())
		require.Equal(t, f.MigReq, b.MigReq())
		require.Equal(t, f.PadCount, b.PadCount())
		require.Zero(t, b.TVer())
		require.Equal(t, f.PKey, b.PKey())
		require.Equal(t, f.FECN, b.FECN())
		require.Equal(t, f.BECN, b.BECN())
		require.Equal(t, f.DestQP, b.DestQP())
		require.Equal(t, f.AckReq, b.AckReq())
		require.Equal(t, f.PSN, b.PSN())
		require.Zero(t, b[4]&0x3f, "Resv6")
		require.Zero(t, b[8]&0x7f, "Resv7")
	}

	// Out-of-range values are masked, not spilled into neighbours.
	b := wire.BTH(garbage(wire.BTHSize))
	b.Encode(&wire.BTHFields{PadCount: 7, DestQP: 0xff123456, PSN: 0xff654321})
	require.Equal(t, 3, b.PadCount())
	require.Zero(t, b.TVer())
	require.Equal(t, wire.QPN(0x123456), b.DestQP())
	require.Equal(t, wire.PSN(0x654321), b.PSN())
	require.False(t, b.FECN() || b.BECN() || b.AckReq())

	// Setters keep the neighbouring bits.
	b.Encode(&wire.BTHFields{FECN: true, BECN: true, AckReq: true, DestQP: 5, PSN: 9})
	b.SetPSN(wire.PSNMask)
	require.True(t, b.AckReq())
	require.Equal(t, wire.PSN(wire.PSNMask), b.PSN())
	b.SetPSN(0x1000000 | 42)
	require.Equal(t, wire.PSN(42), b.PSN())
	b.SetAckReq(false)
	require.False(t, b.AckReq())
	require.Equal(t, wire.PSN(42), b.PSN())
	b.SetAckReq(true)
	require.True(t, b.AckReq())
	b.SetDestQP(0x1abcdef)
	require.Equal(t, wire.QPN(0xabcdef), b.DestQP())
	require.True(t, b.FECN() && b.BECN())
}

func TestRETHRoundTrip(t *testing.T) {
	for _, f := range []wire.RETHFields{
		{},
		{VA: 0x000055bd720e2000, RKey: 0x226, DMALength: 8192},
		{VA: ^uint64(0), RKey: ^uint32(0), DMALength: 1<<31 - 1},
	} {
		r := wire.RETH(garbage(wire.RETHSize))
		r.Encode(&f)
		require.Equal(t, f, wire.RETHFields{VA: r.VA(), RKey: r.RKey(), DMALength: r.DMALength()})
	}
}

func TestAtomicETHRoundTrip(t *testing.T) {
	for _, f := range []wire.AtomicETHFields{
		{},
		{VA: 0x000055e21e0aa000, RKey: 0x2f4, SwapAdd: 1, Compare: 2},
		{VA: ^uint64(7), RKey: ^uint32(0), SwapAdd: ^uint64(0), Compare: 0x0123456789abcdef},
	} {
		a := wire.AtomicETH(garbage(wire.AtomicETHSize))
		a.Encode(&f)
		require.Equal(t, f, wire.AtomicETHFields{VA: a.VA(), RKey: a.RKey(), SwapAdd: a.SwapAdd(), Compare: a.Compare()})
	}
	ack := wire.AtomicAckETH(garbage(wire.AtomicAckETHSize))
	ack.SetOrigRemoteData(0xfedcba9876543210)
	require.Equal(t, uint64(0xfedcba9876543210), ack.OrigRemoteData())
}

func TestAETHRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		s     wire.Syndrome
		msn   wire.MSN
		typ   wire.SyndromeType
		value uint8
	}{
		{wire.SyndromeACK, 1, wire.TypeACK, 31},
		{0x00, 0, wire.TypeACK, 0},
		{wire.RNRNAK(14), wire.PSNMask, wire.TypeRNRNAK, 14},
		{wire.RNRNAK(0), 7, wire.TypeRNRNAK, 0},
		{wire.RNRNAK(31 | 0x20), 7, wire.TypeRNRNAK, 31}, // extra bits masked
		{0x40, 3, wire.TypeResvd, 0},
		{wire.SyndromeNAKPSNSeqErr, 100, wire.TypeNAK, 0},
		{wire.SyndromeNAKInvalidRequest, 100, wire.TypeNAK, 1},
		{wire.SyndromeNAKRemoteAccess, 100, wire.TypeNAK, 2},
		{wire.SyndromeNAKRemoteOp, 100, wire.TypeNAK, 3},
		{wire.SyndromeNAKInvalidRDReq, 100, wire.TypeNAK, 4},
	} {
		a := wire.AETH(garbage(wire.AETHSize))
		a.Encode(tc.s, tc.msn|0x5000000)
		require.Equal(t, tc.s, a.Syndrome())
		require.Equal(t, tc.msn, a.MSN())
		require.Equalf(t, tc.typ, a.Syndrome().Type(), "syndrome %#02x", uint8(tc.s))
		require.Equal(t, tc.value, a.Syndrome().Value())
	}
}

func TestRNRTimer(t *testing.T) {
	// IBTA Table 45, spot checks.
	for _, tc := range []struct {
		code uint8
		ns   int64
	}{
		{0, 655_360_000},
		{1, 10_000},
		{7, 120_000},
		{14, 1_280_000}, // what rxe sends by default (rnr_nak.pcap)
		{18, 5_120_000},
		{31, 491_520_000},
		{32 + 1, 10_000}, // masked to 5 bits
	} {
		require.Equalf(t, tc.ns, wire.RNRTimerNanoseconds(tc.code), "code %d", tc.code)
	}
	// Increasing after code 0.
	for c := uint8(2); c < 32; c++ {
		require.Greater(t, wire.RNRTimerNanoseconds(c), wire.RNRTimerNanoseconds(c-1))
	}
}

func TestSmallHeadersRoundTrip(t *testing.T) {
	i := wire.ImmDt(garbage(wire.ImmDtSize))
	i.SetImm(0x01020304)
	require.Equal(t, uint32(0x01020304), i.Imm())
	require.Equal(t, []byte{1, 2, 3, 4}, []byte(i), "network byte order")

	e := wire.IETH(garbage(wire.IETHSize))
	e.SetRKey(0xcafe0001)
	require.Equal(t, uint32(0xcafe0001), e.RKey())

	d := wire.DETH(garbage(wire.DETHSize))
	d.Encode(0x80010000, 0xff000001)
	require.Equal(t, uint32(0x80010000), d.QKey())
	require.Equal(t, wire.QPN(1), d.SrcQP())
	require.Zero(t, d[4], "reserved byte")
}

func TestPadFor(t *testing.T) {
	for n, want := range []int{0, 3, 2, 1, 0, 3, 2, 1, 0} {
		require.Equal(t, want, wire.PadFor(n))
		require.Zero(t, (n+wire.PadFor(n))%4)
	}
	require.Equal(t, 0, wire.PadFor(4096))
	require.Equal(t, 1, wire.PadFor(4095))
}

func TestEncodeAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful with -race")
	}
	buf := make([]byte, 64)
	bf := wire.BTHFields{Opcode: wire.OpRDMAWriteFirst, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: 1}
	rf := wire.RETHFields{VA: 1, RKey: 2, DMALength: 3}
	require.Zero(t, testing.AllocsPerRun(100, func() {
		wire.BTH(buf).Encode(&bf)
		wire.RETH(buf[wire.BTHSize:]).Encode(&rf)
		wire.AETH(buf[40:]).Encode(wire.SyndromeACK, 1)
	}))
}
