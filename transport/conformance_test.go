package transport

// Behaviour the transport review checked against IBTA Vol 1 chapter 9 and
// rxe and found conforming; kept as regression tests.

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// A duplicate READ re-requesting from its second response PSN (the rest
// of the READ, IBTA 9.7.5.1.4) is answered from that PSN, and the expected
// PSN stays after the READ.
func TestDuplicateReadFromTheMiddleRestartsThere(t *testing.T) {
	r := newResponderRig(t)
	for i := range 3000 {
		r.mem[rigGuard+i] = byte(i * 7)
	}
	r.deliver(r.build(wire.OpRDMAReadRequest, 1000, nil, true, r.reth(r.mr.Addr(), r.mr.RKey(), 3000)))
	for i := range 3 {
		_, _, psn := r.answer()
		require.Equal(t, wire.PSN(1000+i), psn)
	}
	r.deliver(r.build(wire.OpRDMAReadRequest, 1001, nil, true, r.reth(r.mr.Addr()+1024, r.mr.RKey(), 3000-1024)))
	op, _, psn := r.answer()
	require.Equal(t, wire.OpRDMAReadResponseFirst, op)
	require.Equal(t, wire.PSN(1001), psn)
	op, _, psn = r.answer()
	require.Equal(t, wire.OpRDMAReadResponseLast, op)
	require.Equal(t, wire.PSN(1002), psn)
	// Next new request still at 1003.
	r.deliver(r.build(wire.OpRDMAWriteOnly, 1003, []byte{1}, true, r.reth(r.mr.Addr(), r.mr.RKey(), 1)))
	op, syn, psn := r.answer()
	require.Equal(t, wire.OpAcknowledge, op)
	require.Equal(t, wire.SyndromeACK, syn)
	require.Equal(t, wire.PSN(1003), psn)
}

// An ACK past a READ whose response was lost is an implied NAK (IBTA
// 9.7.5.1.2; rxe): the READ is requested again and nothing completes.
func TestACKPastAReadIsAnImpliedNAK(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		_, err := r.qp.PostSend(
			SendWR{WRID: 1, Opcode: WRRDMARead, Flags: SendSignaled, SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234},
			SendWR{WRID: 2, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		ps := r.sent()
		require.Len(t, ps, 2)
		r.ackPkt(wire.SyndromeACK, 5001, 2) // the READ response was lost
		ps = r.sent()
		require.NotEmpty(t, ps)
		require.Equal(t, wire.OpRDMAReadRequest, ps[0].Opcode())
		require.Equal(t, wire.PSN(5000), ps[0].PSN())
		require.Empty(t, r.poll(), "no completion: the READ has no data")
	})
}

// The RNR NAK's timer field is honoured to the nanosecond (IBTA Table
// 45, code 14 = 1.28 ms).
func TestRNRNAKTimerCode14(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		require.Len(t, r.sent(), 1)
		r.ackPkt(wire.RNRNAK(14), 5000, 0)
		time.Sleep(1280*time.Microsecond - time.Nanosecond)
		require.Empty(t, r.sent())
		time.Sleep(time.Nanosecond)
		ps := r.sent()
		require.Len(t, ps, 1)
		require.Equal(t, wire.PSN(5000), ps[0].PSN())
	})
}

// A multi-packet WRITE across the 24-bit PSN wrap: a sequence NAK for
// 0xFFFFFF goes back to the MIDDLE packet, an ACK of PSN 0 completes it.
func TestGoBackNAcrossPSNWrap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		r.qp.sq.Lock() // sq_psn 0xFFFFFE, as Modify sets it
		r.qp.attr.SQPSN = 0xfffffe
		r.qp.req.psn, r.qp.comp.psn = 0xfffffe, 0xfffffe
		r.qp.sq.Unlock()
		_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 3 * 1024, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		ps := r.sent()
		require.Len(t, ps, 3)
		require.Equal(t, wire.PSN(0), ps[2].PSN())
		r.ackPkt(wire.SyndromeNAKPSNSeqErr, 0xffffff, 0)
		ps = r.sent()
		require.Len(t, ps, 2)
		require.Equal(t, wire.PSN(0xffffff), ps[0].PSN())
		require.Equal(t, wire.OpRDMAWriteMiddle, ps[0].Opcode())
		r.ackPkt(wire.SyndromeACK, 0, 1)
		wcs := r.poll()
		require.Len(t, wcs, 1)
		require.Equal(t, WCSuccess, wcs[0].Status)
	})
}

// A duplicate atomic is answered from its saved result and not executed
// again (IBTA 9.4.5, o9-31); once the resource ring has reused its slot the
// duplicate is dropped (rxe: class D, dropped).
func TestDuplicateAtomicReplayedThenDroppedAfterRingWrap(t *testing.T) {
	r := newResponderRig(t)
	fa := func(b []byte, info *wire.OpInfo) {
		wire.AtomicETH(b[info.Offset[wire.HdrAtomicETH]:]).Encode(&wire.AtomicETHFields{VA: r.mr.Addr(), RKey: r.mr.RKey(), SwapAdd: 1})
	}
	atomic := r.build(wire.OpFetchAdd, 1000, nil, true, fa)
	r.deliver(atomic)
	op, _, psn := r.answer()
	require.Equal(t, wire.OpAtomicAcknowledge, op)
	require.Equal(t, wire.PSN(1000), psn)
	v := append([]byte(nil), r.mem[rigGuard:rigGuard+8]...)
	for p := wire.PSN(1001); p < 1004; p++ {
		r.deliver(r.build(wire.OpRDMAReadRequest, p, nil, true, r.reth(r.mr.Addr()+64, r.mr.RKey(), 8)))
		r.answer()
	}
	r.deliver(atomic)
	op, _, psn = r.answer()
	require.Equal(t, wire.OpAtomicAcknowledge, op)
	require.Equal(t, wire.PSN(1000), psn)
	require.Equal(t, v, r.mem[rigGuard:rigGuard+8])
	r.deliver(r.build(wire.OpRDMAReadRequest, 1004, nil, true, r.reth(r.mr.Addr()+64, r.mr.RKey(), 8)))
	r.answer()
	stale := r.drops(DropStaleDuplicate)
	r.deliver(atomic)
	require.Equal(t, stale+1, r.drops(DropStaleDuplicate))
	require.Equal(t, v, r.mem[rigGuard:rigGuard+8])
}

// A duplicate READ may re-request any sub-range of the saved READ under
// the same rkey, not only its rest (IBTA 9.7.5.1.4; rxe duplicate_request
// accepts the same): it is answered from its own PSN with the bytes it
// names. One outside the saved range, under another rkey, or whose
// responses would run past the saved READ's last PSN is dropped and
// counted, and nothing is sent.
func TestDuplicateReadSubRange(t *testing.T) {
	r := newResponderRig(t)
	for i := range 3000 {
		r.mem[rigGuard+i] = byte(i * 7)
	}
	base := r.mr.Addr()
	r.deliver(r.build(wire.OpRDMAReadRequest, 1000, nil, true, r.reth(base+100, r.mr.RKey(), 2800)))
	for i := range 3 { // MTU 1024: 1024 + 1024 + 752
		_, _, psn := r.answer()
		require.Equal(t, wire.PSN(1000+i), psn)
	}
	// A WRITE after the READ; delivered again after each duplicate READ,
	// its duplicate's ACK marks the end of what the device answered.
	marker := r.build(wire.OpRDMAWriteOnly, 1003, []byte{1}, true, r.reth(base, r.mr.RKey(), 1))
	r.deliver(marker)
	op, syn, psn := r.answer()
	require.Equal(t, wire.OpAcknowledge, op)
	require.Equal(t, wire.SyndromeACK, syn)
	require.Equal(t, wire.PSN(1003), psn)
	dupRead := func(psn wire.PSN, va uint64, rkey, n uint32) (ops []wire.Opcode, psns []wire.PSN, data []byte) {
		r.deliver(r.build(wire.OpRDMAReadRequest, psn, nil, true, r.reth(va, rkey, n)))
		r.deliver(marker)
		for {
			pkts := make([]conn.Packet, 1)
			n, err := r.peer.Receive(pkts)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			var p wire.Packet
			require.NoError(t, wire.Parse(pkts[0].Buf, &p))
			if p.Opcode() == wire.OpAcknowledge {
				require.Equal(t, wire.SyndromeACK, p.AETH().Syndrome())
				require.Equal(t, wire.PSN(1003), p.PSN())
				return
			}
			ops, psns = append(ops, p.Opcode()), append(psns, p.PSN())
			data = append(data, p.Payload...)
		}
	}
	// The first 1024 bytes only: one ONLY response at 1000.
	ops, psns, data := dupRead(1000, base+100, r.mr.RKey(), 1024)
	require.Equal(t, []wire.Opcode{wire.OpRDMAReadResponseOnly}, ops)
	require.Equal(t, []wire.PSN{1000}, psns)
	require.Equal(t, r.mem[rigGuard+100:rigGuard+1124], data)
	// The middle packet's bytes, from its PSN.
	ops, psns, data = dupRead(1001, base+1124, r.mr.RKey(), 1024)
	require.Equal(t, []wire.Opcode{wire.OpRDMAReadResponseOnly}, ops)
	require.Equal(t, []wire.PSN{1001}, psns)
	require.Equal(t, r.mem[rigGuard+1124:rigGuard+2148], data)

	stale := r.drops(DropStaleDuplicate)
	for _, c := range []struct {
		psn  wire.PSN
		va   uint64
		rkey uint32
		n    uint32
	}{
		{1001, base + 99, r.mr.RKey(), 8},          // starts before the saved READ
		{1001, base + 2000, r.mr.RKey(), 901},      // ends one byte after it
		{1001, base + 100, r.mr.RKey() ^ 0xff, 8},  // another key
		{1001, base + 100, r.mr.RKey(), 1<<31 - 1}, // longer than it
		// Two packets from the last PSN would answer at 1003, a PSN the
		// saved READ does not own.
		{1002, base + 100, r.mr.RKey(), 2048},
	} {
		ops, _, _ := dupRead(c.psn, c.va, c.rkey, c.n)
		require.Empty(t, ops, "%+v", c)
	}
	require.Equal(t, stale+5, r.drops(DropStaleDuplicate))
}

// readResponses reads the n packets the device sent to the peer and
// returns their opcodes, PSNs and payloads joined.
func (r *responderRig) readResponses(n int) (ops []wire.Opcode, psns []wire.PSN, data []byte) {
	r.t.Helper()
	for range n {
		pkts := make([]conn.Packet, 1)
		k, err := r.peer.Receive(pkts)
		require.NoError(r.t, err)
		require.Equal(r.t, 1, k)
		var p wire.Packet
		require.NoError(r.t, wire.Parse(pkts[0].Buf, &p))
		ops, psns = append(ops, p.Opcode()), append(psns, p.PSN())
		data = append(data, p.Payload...)
	}
	return ops, psns, data
}

// A requester in slow restart asks for the rest of a READ in pieces, each
// a READ request for a sub-range (whole MTUs from the first missing byte;
// VA, length and PSN advanced alike). Whether the responder executed the
// READ (each piece is then a duplicate, answered from the saved resource
// for the bytes it names: IBTA 9.7.5.1.4, rxe duplicate_request) or the
// READ request itself was lost (each piece is then a new, shorter READ,
// executed in PSN order), the pieces return the READ's bytes at the READ's
// PSNs, and the request after the READ is expected at the PSN after the
// READ's last.
func TestReadRequestedInPieces(t *testing.T) {
	const npkts = 8 // 8192 bytes: the rig's MR
	type piece struct {
		psn  wire.PSN
		pkts int
		ops  []wire.Opcode
	}
	only := []wire.Opcode{wire.OpRDMAReadResponseOnly}
	firstLast := []wire.Opcode{wire.OpRDMAReadResponseFirst, wire.OpRDMAReadResponseLast}
	firstMidLast := []wire.Opcode{wire.OpRDMAReadResponseFirst, wire.OpRDMAReadResponseMiddle, wire.OpRDMAReadResponseLast}
	for _, c := range []struct {
		name     string
		executed bool // the READ request reached the responder
		pieces   []piece
	}{
		{"duplicates", true, []piece{{1002, 1, only}, {1003, 2, firstLast}, {1005, 3, firstMidLast}}},
		{"request lost", false, []piece{{1000, 1, only}, {1001, 2, firstLast}, {1003, 5, nil}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newResponderRig(t)
			for i := range rigMR {
				r.mem[rigGuard+i] = byte(i*7 + i>>10)
			}
			base := r.mr.Addr()
			if c.executed {
				r.deliver(r.build(wire.OpRDMAReadRequest, 1000, nil, true, r.reth(base, r.mr.RKey(), npkts*rigMTU)))
				_, psns, data := r.readResponses(npkts)
				require.Equal(t, psnRange(1000, npkts), psns)
				require.Equal(t, r.mem[rigGuard:rigGuard+rigMR], data)
			}
			got := make([]byte, 0, rigMR)
			if c.executed {
				got = append(got, r.mem[rigGuard:rigGuard+2*rigMTU]...) // 1000, 1001 came
			}
			for _, pc := range c.pieces {
				off := uint64(pc.psn-1000) * rigMTU
				r.deliver(r.build(wire.OpRDMAReadRequest, pc.psn, nil, true, r.reth(base+off, r.mr.RKey(), uint32(pc.pkts*rigMTU))))
				ops, psns, data := r.readResponses(pc.pkts)
				require.Equal(t, psnRange(pc.psn, pc.pkts), psns, "piece at %d", pc.psn)
				if pc.ops != nil {
					require.Equal(t, pc.ops, ops, "piece at %d", pc.psn)
				}
				require.Equal(t, r.mem[rigGuard+int(off):rigGuard+int(off)+pc.pkts*rigMTU], data, "piece at %d", pc.psn)
				got = append(got, data...)
			}
			require.Equal(t, r.mem[rigGuard:rigGuard+rigMR], got, "the pieces are the READ")
			// The next request is expected after the READ's 8 PSNs.
			r.deliver(r.build(wire.OpRDMAWriteOnly, 1008, []byte{1}, true, r.reth(base, r.mr.RKey(), 1)))
			op, syn, psn := r.answer()
			require.Equal(t, wire.OpAcknowledge, op)
			require.Equal(t, wire.SyndromeACK, syn)
			require.Equal(t, wire.PSN(1008), psn)
			require.Equal(t, wire.PSN(1009), r.qp.ResponderState().ExpectedPSN)
		})
	}
}
