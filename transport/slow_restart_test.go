package transport

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

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

// TestTimeoutRestartsWithOnePacket: after a local ACK timeout the requester
// goes back to the oldest unacknowledged PSN (go-back-N, IBTA 9.7.5.1.3)
// and resends one packet, which asks for an ACK, not the whole window: the
// loss window of RFC 5681 3.1 (one segment after the retransmission timer),
// as RoCE NICs' slow restart does. Each ACK then opens the window by the
// PSNs it acknowledges (slow start: 1, 2, 4, ... per round trip) until it
// is MaxUnackedPSNs again. A responder that fell behind (a loaded host
// draining its socket slowly) used to get a full window (256 packets)
// queued behind its backlog at every expiry.
func TestTimeoutRestartsWithOnePacket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		r.d.slowRestart = true // Config.SlowRestart
		r.postBigSend(t, 600)  // PSNs 5000..5599 at MTU 1024
		ps := r.drain()
		psns, _ := psnsOf(ps)
		require.Equal(t, psnRange(5000, MaxUnackedPSNs), psns, "the first pass sends the window")

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
		// MaxUnackedPSNs again.
		require.Equal(t, wire.PSN(5255), next)
		ps = r.drain()
		psns, _ = psnsOf(ps)
		require.Equal(t, psnRange(5255, MaxUnackedPSNs), psns)
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
			require.LessOrEqual(t, len(socket), 2*MaxUnackedPSNs+int(expiries),
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
		require.Len(t, r.drain(), MaxUnackedPSNs)
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
		require.Len(t, r.drain(), MaxUnackedPSNs)
		time.Sleep(r.qp.timeoutDuration() + time.Millisecond)
		psns, _ := psnsOf(r.drain())
		require.Equal(t, psnRange(5000, MaxUnackedPSNs), psns)
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
		window := psnRange(first, MaxUnackedPSNs) // 0xFFFF80..0xFFFFFF, 0..0x7F
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
