package transport

import (
	"bytes"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/wire"
)

// psnsOf lists the PSNs of ps and whether each asks for an ACK.
func psnsOf(ps []wire.Packet) (psns []wire.PSN, ackReq []bool) {
	for i := range ps {
		psns = append(psns, ps[i].PSN())
		ackReq = append(ackReq, ps[i].BTH().AckReq())
	}
	return psns, ackReq
}

func psnRange(first wire.PSN, n int) []wire.PSN {
	out := make([]wire.PSN, n)
	for i := range out {
		out[i] = first.Add(uint32(i))
	}
	return out
}

// testWindow is the requester's window (the device's maxUnacked, at most
// MaxUnackedPSNs) on the rigs whose tests count a window's packets.
const testWindow = 256

// TestTimeoutRestartsWithOnePacket: after a local ACK timeout the requester
// goes back to the oldest unacknowledged PSN (go-back-N, IBTA 9.7.5.1.3)
// and resends one packet, which asks for an ACK, not the whole window: the
// loss window of RFC 5681 3.1 (one segment after the retransmission timer),
// as RoCE NICs' slow restart does. Each ACK then opens the window by the
// PSNs it acknowledges (slow start: 1, 2, 4, ... per round trip) until it
// is testWindow again. A responder that fell behind (a loaded host
// draining its socket slowly) used to get a full window (256 packets)
// queued behind its backlog at every expiry.
func TestTimeoutRestartsWithOnePacket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		r.d.slowRestart = true // Config.SlowRestart
		r.postBigSend(t, 600)  // PSNs 5000..5599 at MTU 1024
		ps := r.drain()
		psns, _ := psnsOf(ps)
		require.Equal(t, psnRange(5000, testWindow), psns, "the first pass sends the window")

		// The responder is silent: each expiry resends PSN 5000 alone,
		// with AckReq.
		for i := 1; i <= 3; i++ {
			time.Sleep(r.qp.timeoutDuration() + time.Millisecond)
			ps = r.drain()
			psns, ack := psnsOf(ps)
			require.Equal(t, []wire.PSN{5000}, psns, "expiry %d", i)
			require.Equal(t, []bool{true}, ack, "expiry %d", i)
			require.Equal(t, wire.OpSendFirst, ps[0].Opcode())
			require.Equal(t, uint64(i), r.d.counters.RetransmitTimeouts.Load())
		}

		// Each ACK of a round opens the window by what it acknowledges:
		// rounds of 1, 2, 4, ... 128 packets, the last of each asking
		// for the ACK, then the full window again.
		next, round := wire.PSN(5001), 2
		r.ackPkt(wire.SyndromeACK, 5000, 0)
		for round <= 128 {
			ps = r.drain()
			psns, ack := psnsOf(ps)
			require.Equal(t, psnRange(next, round), psns, "round of %d", round)
			// AckReq on the round's last packet, and every
			// AckEveryNPackets as always (the count restarts at each
			// AckReq).
			want := make([]bool, round)
			for i := range want {
				want[i] = i == round-1 || (i+1)%AckEveryNPackets == 0
			}
			require.Equal(t, want, ack, "round of %d", round)
			next = next.Add(uint32(round))
			r.ackPkt(wire.SyndromeACK, next.Sub(1), 0)
			round *= 2
		}
		// 5000..5254 acknowledged (1+2+...+128 packets): the window is
		// testWindow again.
		require.Equal(t, wire.PSN(5255), next)
		ps = r.drain()
		psns, _ = psnsOf(ps)
		require.Equal(t, psnRange(5255, testWindow), psns)
		require.Zero(t, r.qp.req.restartWnd)
		r.ackPkt(wire.SyndromeACK, 5510, 0)
		ps = r.drain()
		psns, _ = psnsOf(ps)
		require.Equal(t, psnRange(5511, 89), psns)
		r.ackPkt(wire.SyndromeACK, 5599, 0)
		synctest.Wait()
		wcs := r.poll()
		require.Len(t, wcs, 1)
		require.Equal(t, WCSuccess, wcs[0].Status)
		require.Equal(t, uint64(1), wcs[0].WRID)
		require.False(t, r.qp.RequesterState().TimerArmed)
	})
}

// TestSlowResponderBacklogStaysBounded is TestTransfersUnderImpairment on a
// loaded host, simulated: a go-back-N responder (IBTA 9.7.5: in-order
// accept, one sequence NAK per gap, duplicates acknowledged again, ACKs
// coalesced per batch, only for AckReq packets) that drains its socket at
// 8 packets per half timeout, 16 times slower than a window per timeout,
// so the retransmit timer expires while the first copies still wait in
// its socket. What waits there must stay bounded: the window of originals,
// at most one window of go-back-N copies of them, and the one packet each
// expiry resends (RFC 5681 3.1's loss window); and the SEND completes
// within four times the time the responder takes to drain it once.
// Before slow restart every expiry queued a whole window behind the
// backlog, the responder spent its time on stale copies, and the socket
// grew without bound (13 s of backlog, then overflow, in the failed runs).
func TestSlowResponderBacklogStaysBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		r.d.slowRestart = true // Config.SlowRestart
		const npkts = 1000     // PSNs 5000..5999 at MTU 1024
		const perTick = 8
		r.postBigSend(t, npkts)
		start := time.Now()
		tick := r.qp.timeoutDuration() / 2
		ePSN, nakSent := wire.PSN(5000), false
		var socket []wire.Packet
		maxQueued := 0
		for step := 0; ; step++ {
			socket = append(socket, r.drain()...)
			expiries := r.d.counters.RetransmitTimeouts.Load()
			maxQueued = max(maxQueued, len(socket))
			require.LessOrEqual(t, len(socket), 2*testWindow+int(expiries),
				"step %d: %d packets wait at the responder, more than two windows plus %d expiries",
				step, len(socket), expiries)
			if s := r.qp.RequesterState(); s.Completed == s.Posted {
				break
			}
			require.Less(t, step, 4*npkts/perTick, "not complete: %+v", r.qp.RequesterState())
			k := min(perTick, len(socket))
			var ackPend bool
			var ackPSN wire.PSN
			for _, p := range socket[:k] {
				psn := p.PSN()
				switch d := ePSN.Distance(psn); {
				case d > 0:
					if !nakSent {
						nakSent, ackPend = true, false
						r.ackPkt(wire.SyndromeNAKPSNSeqErr, ePSN, 0)
					}
				case d < 0:
					if p.BTH().AckReq() {
						ackPend, ackPSN = true, ePSN.Sub(1)
					}
				default:
					ePSN, nakSent = ePSN.Add(1), false
					if p.BTH().AckReq() {
						ackPend, ackPSN = true, psn
					}
				}
			}
			socket = append(socket[:0], socket[k:]...)
			if ackPend {
				r.ackPkt(wire.SyndromeACK, ackPSN, 0)
			}
			time.Sleep(tick)
		}
		wcs := r.poll()
		require.Len(t, wcs, 1)
		require.Equal(t, WCSuccess, wcs[0].Status)
		t.Logf("most packets queued %d; %v; expiries %d, retransmits %d",
			maxQueued, time.Since(start), r.d.counters.RetransmitTimeouts.Load(), r.d.counters.Retransmits.Load())
	})
}

// TestLateACKAfterTimeoutSkipsAcknowledged: the retransmit timer expires
// while the responder is still working through the first copy of the
// window; the requester goes back to the oldest unacknowledged PSN and
// resends it. Then the ACK for the first 64 packets of the first copy
// arrives. An ACK acknowledges every PSN up to its own (IBTA 9.7.5.1), so
// go-back-N resumes after it, at 5064, and sends nothing already
// acknowledged (it used to resend 5001..5063 from where it had been
// rewound to).
func TestLateACKAfterTimeoutSkipsAcknowledged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		r.d.slowRestart = true // Config.SlowRestart
		r.postBigSend(t, 600)  // PSNs 5000..5599 at MTU 1024
		require.Len(t, r.drain(), testWindow)
		time.Sleep(r.qp.timeoutDuration() + time.Millisecond)
		psns, _ := psnsOf(r.drain())
		require.Equal(t, []wire.PSN{5000}, psns)

		r.ackPkt(wire.SyndromeACK, 5063, 0)
		psns, _ = psnsOf(r.drain())
		require.Equal(t, psnRange(5064, 65), psns, "the window is 1+64, from the first unacknowledged PSN")
		s := r.qp.RequesterState()
		require.Equal(t, wire.PSN(5064), s.OldestPSN)
		require.Equal(t, wire.PSN(5129), s.NextPSN)
		require.Equal(t, uint64(129*1024), s.Offset)
	})
}

// TestTimeoutResendsWindowByDefault: without Config.SlowRestart a local ACK
// timeout resends the whole go-back-N window from the oldest
// unacknowledged PSN, as rxe's req_retry does.
func TestTimeoutResendsWindowByDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		r.postBigSend(t, 600) // PSNs 5000..5599 at MTU 1024
		require.Len(t, r.drain(), testWindow)
		time.Sleep(r.qp.timeoutDuration() + time.Millisecond)
		psns, _ := psnsOf(r.drain())
		require.Equal(t, psnRange(5000, testWindow), psns)
		require.Zero(t, r.qp.req.restartWnd)
	})
}

// TestTimeoutResendsWindowAcrossPSNWrap: without Config.SlowRestart a local
// ACK timeout resends the whole go-back-N window from the oldest
// unacknowledged PSN also when the window crosses the 24-bit wrap (IBTA
// 9.7.1: PSNs are modulo 2^24); an ACK of a PSN past the wrap then
// retires the packets before it and opens the window beyond.
func TestTimeoutResendsWindowAcrossPSNWrap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		const first = wire.PSN(0xffff80) // 128 PSNs before the wrap
		r.qp.sq.Lock()                   // sq_psn, as Modify sets it
		r.qp.attr.SQPSN = first
		r.qp.req.psn, r.qp.comp.psn = first, first
		r.qp.sq.Unlock()
		r.postBigSend(t, 600)
		window := psnRange(first, testWindow) // 0xFFFF80..0xFFFFFF, 0..0x7F
		psns, _ := psnsOf(r.drain())
		require.Equal(t, window, psns, "the first pass sends the window")
		time.Sleep(r.qp.timeoutDuration() + time.Millisecond)
		psns, _ = psnsOf(r.drain())
		require.Equal(t, window, psns, "the expiry resends the window")
		require.Equal(t, uint64(1), r.d.counters.RetransmitTimeouts.Load())

		r.ackPkt(wire.SyndromeACK, 0x3f, 0) // 192 PSNs, past the wrap
		psns, _ = psnsOf(r.drain())
		require.Equal(t, psnRange(0x80, 192), psns, "the window opens past the ACK")
		s := r.qp.RequesterState()
		require.Equal(t, wire.PSN(0x40), s.OldestPSN)
		require.Equal(t, wire.PSN(0x140), s.NextPSN)
	})
}

// readRig is a syncRig with one signaled RDMA READ of npkts response
// packets at the rig's MTU posted (WRID 2, PSNs from 5000) into an MR of
// its own, from remote VA readVA under rkey 0x1234; src is what the
// simulated responder holds there.
type readRig struct {
	*syncRig
	dst, src []byte
}

const readVA = 0x100000

func newReadRig(t *testing.T, npkts int, slowRestart bool) *readRig {
	r := &readRig{syncRig: newSyncRig(t)}
	r.d.slowRestart = slowRestart // Config.SlowRestart
	r.dst = make([]byte, npkts*rigMTU)
	r.src = make([]byte, len(r.dst))
	for i := range r.src {
		r.src[i] = byte(i*7 + i>>10)
	}
	mr, err := r.place.RegMR(1, r.dst, stag.AccessLocalWrite)
	require.NoError(t, err)
	_, err = r.qp.PostSend(SendWR{WRID: 2, Opcode: WRRDMARead, Flags: SendSignaled,
		SGL: []SGE{{Addr: mr.Addr(), Length: uint32(len(r.dst)), LKey: mr.LKey()}}, RemoteAddr: readVA, RKey: 0x1234})
	require.NoError(t, err)
	return r
}

// readReq is what a READ request asks for.
type readReq struct {
	psn    wire.PSN
	va     uint64
	length uint32
}

// readReqs returns the READ requests among ps.
func readReqs(t *testing.T, ps []wire.Packet) []readReq {
	t.Helper()
	var out []readReq
	for i := range ps {
		require.Equal(t, wire.OpRDMAReadRequest, ps[i].Opcode())
		reth := ps[i].RETH()
		require.Equal(t, uint32(0x1234), reth.RKey())
		out = append(out, readReq{ps[i].PSN(), reth.VA(), reth.DMALength()})
	}
	return out
}

// respond answers q as rxe's responder answers a READ or a duplicate one
// (read_reply): from the READ's first PSN FIRST ... LAST or ONLY, from a
// later PSN (a replay) MIDDLE ... LAST; lose drops the responses whose
// PSN it names.
func (r *readRig) respond(q readReq, lose func(wire.PSN) bool) {
	off := q.va - readVA
	npkts := int(packetsFor(uint64(q.length), rigMTU))
	for i := range npkts {
		psn := q.psn.Add(uint32(i))
		n := min(rigMTU, int(q.length)-i*rigMTU)
		var op wire.Opcode
		switch {
		case i == 0 && q.psn == 5000 && npkts == 1:
			op = wire.OpRDMAReadResponseOnly
		case i == 0 && q.psn == 5000:
			op = wire.OpRDMAReadResponseFirst
		case i == npkts-1:
			op = wire.OpRDMAReadResponseLast
		default:
			op = wire.OpRDMAReadResponseMiddle
		}
		if lose != nil && lose(psn) {
			continue
		}
		b := off + uint64(i*rigMTU)
		r.deliver(r.build(op, psn, r.src[b:b+uint64(n)], false, func(b []byte, info *wire.OpInfo) {
			if info.Mask&wire.MaskAETH != 0 {
				wire.AETH(b[info.Offset[wire.HdrAETH]:]).Encode(wire.SyndromeACK, 1)
			}
		}))
		synctest.Wait() // the requester runs between responses
	}
}

// TestTimeoutRereadsInPieces: a READ of 600 packets whose responses after
// the tenth are lost. At the local ACK timeout the requester re-requests
// it from the first missing response (IBTA 9.7.5.1.3: the PSN of that
// response, the VA past the bytes received). With slow restart
// (Config.SlowRestart) the re-request asks for no more responses than the
// restart window, one packet at first, then 2, 4, ... 128 as each piece
// comes in (its LAST, an rxe replay's, ends the piece, not the READ), and
// the rest in one request once the window is testWindow again. It
// used to ask for all 590 missing packets at once: on a loaded host the
// responder streamed the whole remainder again at a requester already
// behind, every timeout (TestTransfersUnderImpairment's 1 MiB READ).
// Every request stays inside the READ's PSNs, and the WR completes
// SUCCESS with every byte in place.
func TestTimeoutRereadsInPieces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const npkts = 600
		r := newReadRig(t, npkts, true)
		qs := readReqs(t, r.drain())
		require.Equal(t, []readReq{{5000, readVA, npkts * rigMTU}}, qs)
		r.respond(qs[0], func(psn wire.PSN) bool { return psn >= 5010 })
		require.Empty(t, r.drain())

		time.Sleep(r.qp.timeoutDuration() + time.Millisecond)
		next, piece := wire.PSN(5010), 1
		for ; piece <= 128; piece *= 2 {
			qs = readReqs(t, r.drain())
			off := uint32(next - 5000)
			require.Equal(t, []readReq{{next, readVA + uint64(off)*rigMTU, uint32(piece * rigMTU)}}, qs, "piece of %d", piece)
			require.Empty(t, r.poll(), "a piece's LAST does not complete the READ")
			r.respond(qs[0], nil)
			next = next.Add(uint32(piece))
		}
		// 10 + 255 packets in: the window is testWindow, the
		// restart over; the rest goes in one request.
		require.Equal(t, wire.PSN(5265), next)
		qs = readReqs(t, r.drain())
		require.Equal(t, []readReq{{5265, readVA + 265*rigMTU, (npkts - 265) * rigMTU}}, qs)
		require.Zero(t, r.qp.req.restartWnd)
		r.respond(qs[0], nil)
		synctest.Wait()
		wcs := r.poll()
		require.Len(t, wcs, 1)
		require.Equal(t, WCSuccess, wcs[0].Status)
		require.Equal(t, WCRDMARead, wcs[0].Opcode)
		require.Equal(t, uint32(npkts*rigMTU), wcs[0].ByteLen)
		require.True(t, bytes.Equal(r.src, r.dst), "the READ is not byte-exact")
		require.Equal(t, uint64(1), r.d.counters.RetransmitTimeouts.Load())
		require.False(t, r.qp.RequesterState().TimerArmed)
	})
}

// TestTimeoutRereadsRestByDefault: without Config.SlowRestart a local ACK
// timeout re-requests the whole rest of the READ from the first missing
// response, as rxe's requester does (req_retry: the READ's VA and length
// advanced past the bytes received).
func TestTimeoutRereadsRestByDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const npkts = 600
		r := newReadRig(t, npkts, false)
		qs := readReqs(t, r.drain())
		r.respond(qs[0], func(psn wire.PSN) bool { return psn >= 5010 })
		time.Sleep(r.qp.timeoutDuration() + time.Millisecond)
		qs = readReqs(t, r.drain())
		require.Equal(t, []readReq{{5010, readVA + 10*rigMTU, (npkts - 10) * rigMTU}}, qs)
		r.respond(qs[0], nil)
		synctest.Wait()
		wcs := r.poll()
		require.Len(t, wcs, 1)
		require.Equal(t, WCSuccess, wcs[0].Status)
		require.True(t, bytes.Equal(r.src, r.dst))
	})
}

// TestReadPieceLossAndLateResponses: in slow restart, a response inside a
// piece is lost (the piece's LAST then arrives out of order: a gap, which
// re-requests from the first missing response, IBTA 9.7.5.1.3), and the
// responses of the READ's first stream, late behind a backlog, arrive in
// the middle of the pieces: they are the same bytes at the same PSNs and
// are placed, the pieces they overtake are dropped as duplicates, and the
// READ still completes SUCCESS, byte-exact, and a SEND posted behind it
// keeps the PSN after the READ's last (a READ of N packets takes N PSNs,
// however it was requested).
func TestReadPieceLossAndLateResponses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const npkts = 40
		r := newReadRig(t, npkts, true)
		_, err := r.qp.PostSend(SendWR{WRID: 3, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}})
		require.NoError(t, err)
		ps := r.drain()
		require.Len(t, ps, 2)
		first := readReqs(t, ps[:1])[0]
		require.Equal(t, wire.OpSendOnly, ps[1].Opcode())
		require.Equal(t, wire.PSN(5040), ps[1].PSN(), "the SEND's PSN follows the READ's 40")
		r.respond(first, func(psn wire.PSN) bool { return psn >= 5002 })
		time.Sleep(r.qp.timeoutDuration() + time.Millisecond)
		ps = r.drain()
		require.Equal(t, []readReq{{5002, readVA + 2*rigMTU, rigMTU}}, readReqs(t, ps))
		r.respond(readReqs(t, ps)[0], nil)
		qs := readReqs(t, r.drain())
		require.Equal(t, []readReq{{5003, readVA + 3*rigMTU, 2 * rigMTU}}, qs)
		r.respond(qs[0], nil)
		qs = readReqs(t, r.drain())
		require.Equal(t, []readReq{{5005, readVA + 5*rigMTU, 4 * rigMTU}}, qs)
		// The piece's second response is lost: its third is a gap,
		// which asks again from 5006, for what the window has room for.
		r.respond(qs[0], func(psn wire.PSN) bool { return psn == 5006 })
		qs = readReqs(t, r.drain())
		require.Len(t, qs, 1)
		require.Equal(t, wire.PSN(5006), qs[0].psn)
		require.Equal(t, uint64(readVA+6*rigMTU), qs[0].va)
		require.Less(t, qs[0].length, uint32((npkts-6)*rigMTU), "a piece, not the rest")
		// Before it is answered, the first stream's responses 5006..5019
		// come, late: placed in order, they overtake the piece, whose
		// responses are then duplicates.
		dup := r.drops(DropDuplicateResponse)
		r.respond(first, func(psn wire.PSN) bool { return psn < 5006 || psn >= 5020 })
		require.Equal(t, uint64(20*rigMTU), r.qp.RequesterState().OldestReadDone)
		r.respond(qs[0], nil)
		require.Equal(t, dup+uint64(packetsFor(uint64(qs[0].length), rigMTU)), r.drops(DropDuplicateResponse))
		// Then pieces until the READ is in, each answered in turn: each
		// stays inside the READ's PSNs, with the VA its PSN names, and
		// asks for at most the window. Once
		// the last piece is asked for, the SEND (rewound with the READ)
		// goes again at its own PSN.
		var sends []wire.Packet
		var wcs []WC
		for i := 0; len(wcs) == 0; i++ {
			require.Less(t, i, 100, "not complete: %+v", r.qp.RequesterState())
			for _, p := range r.drain() {
				if p.Opcode() == wire.OpSendOnly {
					sends = append(sends, p)
					continue
				}
				q := readReqs(t, []wire.Packet{p})[0]
				// Sent while the late responses came in, some are
				// for what is in now; none from before the gap.
				require.False(t, q.psn.Before(5006), "%+v", q)
				require.Equal(t, readVA+uint64(q.psn-5000)*rigMTU, q.va)
				require.False(t, wire.PSN(5040).Before(q.psn.Add(packetsFor(uint64(q.length), rigMTU))), "%+v", q)
				require.LessOrEqual(t, packetsFor(uint64(q.length), rigMTU), uint32(testWindow))
				r.respond(q, nil)
			}
			wcs = r.poll()
		}
		require.Len(t, wcs, 1)
		require.Equal(t, WCSuccess, wcs[0].Status)
		require.Equal(t, uint64(2), wcs[0].WRID)
		require.True(t, bytes.Equal(r.src, r.dst), "the READ is not byte-exact")
		sends = append(sends, r.drain()...)
		require.Len(t, sends, 1)
		require.Equal(t, wire.OpSendOnly, sends[0].Opcode())
		require.Equal(t, wire.PSN(5040), sends[0].PSN())
		r.ackPkt(wire.SyndromeACK, 5040, 2)
		wcs = r.poll()
		require.Len(t, wcs, 1)
		require.Equal(t, WCSuccess, wcs[0].Status)
		require.Equal(t, uint64(3), wcs[0].WRID)
	})
}

// TestDefaultWindowIsMaxUnackedPSNs: a device's requesters keep at most
// MaxUnackedPSNs (1024) PSNs outstanding; the next packet goes out only
// when an ACK opens the window, by as many PSNs as it acknowledges.
func TestDefaultWindowIsMaxUnackedPSNs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		r.d.maxUnacked = newResponderRig(t).d.maxUnacked // NewDevice's default
		require.Equal(t, int32(1024), r.d.maxUnacked)
		r.postBigSend(t, 1100) // PSNs 5000..6099 at MTU 1024
		psns, _ := psnsOf(r.drain())
		require.Equal(t, psnRange(5000, 1024), psns, "the first pass sends the window")
		r.ackPkt(wire.SyndromeACK, 5009, 0) // 10 PSNs acknowledged
		psns, _ = psnsOf(r.drain())
		require.Equal(t, psnRange(6024, 10), psns)
	})
}
