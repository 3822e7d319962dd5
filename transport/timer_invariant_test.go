package transport

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// drain returns everything the device sent, once the bubble is idle (sent
// stops at what the peer's reader buffered).
func (r *syncRig) drain() []wire.Packet {
	var all []wire.Packet
	for {
		ps := r.sent()
		if len(ps) == 0 {
			return all
		}
		all = append(all, ps...)
	}
}

func psnStr(p wire.PSN) string { return fmt.Sprint(uint32(p)) }

// TestLongSendUnderSimulatedImpairment runs the requester of a long SEND
// against a simulated go-back-N responder (IBTA 9.7.5: in-order accept, one
// sequence NAK per gap, duplicates acknowledged again, coalesced ACKs) over
// a link that loses, duplicates and reorders packets in both directions,
// with responses delivered between requester runs (so a NAK meets a
// requester in the middle of the message). After every step the bubble is
// idle: then an incomplete WR needs an armed retransmit timer; and the WR
// must complete.
func TestLongSendUnderSimulatedImpairment(t *testing.T) {
	for seed := uint64(1); seed <= seeds(200); seed++ {
		if !simRun(t, seed) {
			return
		}
	}
}

func simRun(t *testing.T, seed uint64) bool {
	ok := true
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		const npkts = 300
		r.postBigSend(t, npkts)
		rng := rand.New(rand.NewPCG(seed, 7))
		type resp struct {
			syn wire.Syndrome
			psn wire.PSN
		}
		ePSN, nakSent := wire.PSN(5000), false
		var toResp []wire.Packet
		var toReq []resp
		var history []string
		copies := func() int {
			switch x := rng.Float64(); {
			case x < 0.05:
				return 0
			case x < 0.08:
				return 2
			}
			return 1
		}
		check := func(step int) bool {
			s := r.qp.RequesterState()
			if s.State == QPStateRTS && s.Completed < s.Posted && !s.TimerArmed && !s.RNRWait {
				ok = false
				h := history
				if len(h) > 60 {
					h = h[len(h)-60:]
				}
				t.Errorf("seed %d step %d: WR incomplete, send worker idle, no timer armed: %+v\nlast events %v", seed, step, s, h)
				return false
			}
			return true
		}
		for step := 0; step < 5000; step++ {
			for _, p := range r.drain() {
				for range copies() {
					if len(toResp) > 0 && rng.Float64() < 0.05 {
						i := rng.IntN(len(toResp))
						toResp = append(toResp[:i], append([]wire.Packet{p}, toResp[i:]...)...)
					} else {
						toResp = append(toResp, p)
					}
				}
			}
			if !check(step) {
				return
			}
			if s := r.qp.RequesterState(); s.Completed == s.Posted {
				wcs := r.poll()
				require.Len(t, wcs, 1)
				require.Equal(t, WCSuccess, wcs[0].Status)
				if testing.Verbose() {
					c := &r.d.counters
					t.Logf("seed %d: done at step %d: seq NAKs %d, timeouts %d, retransmits %d", seed, step,
						c.RcvdSeqErr.Load(), c.RetransmitTimeouts.Load(), c.Retransmits.Load())
				}
				return
			}
			// The responder takes a random number of the requests in flight.
			k := len(toResp)
			if k > 0 && rng.IntN(3) == 0 {
				k = rng.IntN(k + 1)
			}
			var ackPend bool
			var ackPSN wire.PSN
			for _, p := range toResp[:k] {
				psn := p.PSN()
				switch d := ePSN.Distance(psn); {
				case d > 0:
					if !nakSent {
						nakSent = true
						ackPend = false // the NAK acknowledges as much
						toReq = append(toReq, resp{wire.SyndromeNAKPSNSeqErr, ePSN})
					}
				case d < 0:
					if p.BTH().AckReq() {
						ackPend, ackPSN = true, ePSN.Sub(1)
					}
				default:
					ePSN = ePSN.Add(1)
					nakSent = false
					if p.BTH().AckReq() {
						ackPend, ackPSN = true, psn
					}
				}
			}
			toResp = append(toResp[:0], toResp[k:]...)
			if ackPend {
				toReq = append(toReq, resp{wire.SyndromeACK, ackPSN})
			}
			// The link: responses lost, duplicated, reordered; some stay
			// in flight until a later step.
			var now []resp
			var later []resp
			for _, x := range toReq {
				for range copies() {
					if rng.Float64() < 0.1 {
						later = append(later, x)
					} else {
						now = append(now, x)
					}
				}
			}
			rng.Shuffle(len(now), func(i, j int) {
				if rng.Float64() < 0.2 {
					now[i], now[j] = now[j], now[i]
				}
			})
			toReq = later
			for _, x := range now {
				if x.syn == wire.SyndromeACK {
					history = append(history, "A"+psnStr(x.psn))
				} else {
					history = append(history, "N"+psnStr(x.psn))
				}
				r.ackPkt(x.syn, x.psn, 0)
				if rng.IntN(4) == 0 {
					// The requester runs between two responses.
					for _, p := range r.drain() {
						toResp = append(toResp, p)
					}
					if !check(step) {
						return
					}
				}
			}
			if len(now) == 0 && len(toResp) == 0 && len(toReq) == 0 {
				history = append(history, "T")
				time.Sleep(r.qp.timeoutDuration() + time.Millisecond)
			}
		}
		ok = false
		t.Errorf("seed %d: not complete after 5000 steps: %+v", seed, r.qp.RequesterState())
	})
	return ok
}

// seeds is how many seeds a randomized test runs: n, a tenth of it under
// the race detector, or SOFTRDMA_SEEDS when set (for long hunts).
func seeds(n uint64) uint64 {
	if v, err := strconv.ParseUint(os.Getenv("SOFTRDMA_SEEDS"), 10, 64); err == nil {
		return v
	}
	if raceEnabled {
		return max(n/10, 5)
	}
	return n
}

// gateTap holds the send worker inside its flush (the tap sees each packet
// it sends) while hold is set, so that responses and timer expiries can be
// fed between the requester building a run and sending it, or while the
// QP waits on the run queue behind it.
type gateTap struct {
	hold    atomic.Bool
	waiting atomic.Bool
	release chan struct{}
}

func (g *gateTap) Packet(dir conn.Direction, _, _ netip.AddrPort, _ uint16, _ []byte) {
	if dir != conn.DirTx || !g.hold.Load() {
		return
	}
	g.waiting.Store(true)
	<-g.release
	g.waiting.Store(false)
}

// open lets the worker go and holds it no more (also before the rig
// closes: a worker held in the tap holds the conn's send lock). In the
// bubble only.
func (g *gateTap) open() {
	g.hold.Store(false)
	for synctest.Wait(); g.waiting.Load(); synctest.Wait() {
		g.release <- struct{}{}
	}
}

// TestNAKWhileSendWorkerBusyResumes is the state a stalled
// TestTransfersUnderImpairment run was caught in (a sequence NAK pending,
// NextPSN == OldestPSN in the middle of a long SEND, no retransmit timer
// armed), built step by step: the send worker is busy sending a run when a
// sequence NAK for an earlier PSN of the message arrives (go-back-N,
// IBTA 9.7.5.1.3: the requester is rewound and kicked, the QP waits behind
// the worker), and the retransmit timer expires before the worker gets to
// it: with nothing sent since the rewind there is nothing outstanding, and
// the timer is stopped. The state is transient: once the worker is free it
// resends from the NAKed PSN and arms the timer, and the WR completes.
func TestNAKWhileSendWorkerBusyResumes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		g := &gateTap{release: make(chan struct{})}
		r.d.conn.(*conn.PipeConn).SetTap(g)
		defer g.open()
		r.postBigSend(t, 600) // PSNs 5000..5599 at MTU 1024
		ps := r.drain()
		require.Len(t, ps, testWindow) // the window
		require.Equal(t, wire.PSN(5255), ps[len(ps)-1].PSN())

		// An ACK opens the window by 64; the worker builds 5256..5319
		// and is held while it sends them.
		g.hold.Store(true)
		r.ackPkt(wire.SyndromeACK, 5063, 0)
		synctest.Wait()
		require.True(t, g.waiting.Load())
		require.Equal(t, wire.PSN(5320), r.qp.RequesterState().NextPSN)

		// 5100 was lost: NAK. The requester goes back to it; the timer
		// then expires with nothing sent since.
		r.ackPkt(wire.SyndromeNAKPSNSeqErr, 5100, 0)
		time.Sleep(r.qp.timeoutDuration() + time.Millisecond)
		s := r.qp.RequesterState()
		require.True(t, s.NAKRetry)
		require.False(t, s.TimerArmed)
		require.Equal(t, wire.PSN(5100), s.NextPSN)
		require.Equal(t, wire.PSN(5100), s.OldestPSN)
		require.Equal(t, uint64(100*1024), s.Offset)
		require.True(t, r.qp.scheduled.Load(), "the NAK kicked the requester")

		// The worker is free: it finishes the run it was sending, then
		// resends from 5100 (a window's worth) and arms the timer.
		g.hold.Store(false)
		g.release <- struct{}{}
		ps = r.drain()
		require.Len(t, ps, 64+testWindow)
		require.Equal(t, wire.PSN(5256), ps[0].PSN())
		require.Equal(t, wire.PSN(5100), ps[64].PSN())
		require.Equal(t, wire.OpSendMiddle, ps[64].Opcode())
		require.Equal(t, wire.PSN(5355), ps[len(ps)-1].PSN())
		require.True(t, r.qp.RequesterState().TimerArmed)

		// The responder takes the rest in order.
		for i := 0; i < 10 && len(ps) > 0; i++ {
			r.ackPkt(wire.SyndromeACK, ps[len(ps)-1].PSN(), 0)
			ps = r.drain()
		}
		wcs := r.poll()
		require.Len(t, wcs, 1)
		require.Equal(t, WCSuccess, wcs[0].Status)
		require.Equal(t, uint64(1), wcs[0].WRID)
	})
}

// TestRetransmitTimerWithSlowSendWorker explores, for random seeds, the
// orders in which a long SEND's responses (ACKs, sequence NAKs, repeats of
// them), retransmit timer expiries and the send worker's runs interleave:
// the worker is held inside a flush at random points, with the QP kicked
// behind it. Whenever the worker is idle and the WR incomplete, the
// retransmit timer must be armed; at the end a clean responder
// acknowledges everything and the WR completes.
func TestRetransmitTimerWithSlowSendWorker(t *testing.T) {
	for seed := uint64(1); seed <= seeds(200); seed++ {
		if !slowWorkerRun(t, seed) {
			return
		}
	}
}

func slowWorkerRun(t *testing.T, seed uint64) bool {
	ok := true
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		g := &gateTap{release: make(chan struct{})}
		r.d.conn.(*conn.PipeConn).SetTap(g)
		defer g.open()
		const npkts = 300
		big := make([]byte, npkts*1024)
		mr, err := r.place.RegMR(1, big, stag.AccessLocalWrite)
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(seed, 3))
		g.hold.Store(rng.IntN(2) == 0)
		_, err = r.qp.PostSend(SendWR{WRID: 1, Opcode: WRSendWithImm, Flags: SendSignaled, ImmData: 7,
			SGL: []SGE{{Addr: mr.Addr(), Length: uint32(len(big)), LKey: mr.LKey()}}})
		require.NoError(t, err)
		var history []string
		var old []wire.PSN
		disarmedBehindWorker := 0
		for step := 0; step < 300; step++ {
			r.drain()
			s := r.qp.RequesterState()
			if s.Completed == s.Posted || s.State != QPStateRTS {
				break
			}
			if !g.waiting.Load() && !s.TimerArmed && !s.RNRWait {
				ok = false
				t.Errorf("seed %d: WR incomplete, send worker idle, no timer armed: %+v\nafter %v", seed, s, history)
				return
			}
			lo, hi := s.OldestPSN, s.HighPSN
			pick := func() wire.PSN {
				if len(old) > 0 && rng.IntN(3) == 0 {
					return old[rng.IntN(len(old))]
				}
				return lo.Add(uint32(rng.IntN(int(lo.Distance(hi)) + 1))).Sub(1)
			}
			switch k := rng.IntN(10); {
			case k < 3:
				if g.waiting.Load() {
					history = append(history, "run")
					g.hold.Store(rng.IntN(2) == 0)
					g.release <- struct{}{}
				}
			case k < 5:
				psn := pick()
				old = append(old, psn)
				history = append(history, "A"+psnStr(psn))
				r.ackPkt(wire.SyndromeACK, psn, 0)
			case k < 8:
				psn := pick()
				old = append(old, psn)
				history = append(history, "N"+psnStr(psn))
				r.ackPkt(wire.SyndromeNAKPSNSeqErr, psn, 0)
			default:
				history = append(history, "T")
				before := r.qp.RequesterState()
				time.Sleep(r.qp.timeoutDuration() + time.Millisecond)
				if after := r.qp.RequesterState(); g.waiting.Load() && before.TimerArmed && !after.TimerArmed {
					disarmedBehindWorker++
				}
			}
		}
		if testing.Verbose() {
			t.Logf("seed %d: timer disarmed while the worker was held: %d times; seq NAKs %d, timeouts %d",
				seed, disarmedBehindWorker, r.d.counters.RcvdSeqErr.Load(), r.d.counters.RetransmitTimeouts.Load())
		}
		// A clean responder from here: let the worker go, acknowledge
		// what arrives in order.
		g.open()
		for i := 0; i < 100; i++ {
			s := r.qp.RequesterState()
			if s.Completed == s.Posted || s.State != QPStateRTS {
				break
			}
			ps := r.drain()
			if len(ps) == 0 {
				if !s.TimerArmed {
					ok = false
					t.Errorf("seed %d: stalled: %+v\nafter %v", seed, s, history)
					return
				}
				time.Sleep(r.qp.timeoutDuration() + time.Millisecond)
				continue
			}
			r.ackPkt(wire.SyndromeACK, ps[len(ps)-1].PSN(), 0)
		}
		s := r.qp.RequesterState()
		if s.State == QPStateRTS && s.Completed != s.Posted {
			ok = false
			t.Errorf("seed %d: not complete: %+v\nafter %v", seed, s, history)
		}
	})
	return ok
}

// postBigSend posts one signaled SEND with immediate of npkts packets at
// the rig's MTU (1024), WRID 1, from an MR of its own.
func (r *syncRig) postBigSend(t *testing.T, npkts int) {
	t.Helper()
	big := make([]byte, npkts*rigMTU)
	mr, err := r.place.RegMR(1, big, stag.AccessLocalWrite)
	require.NoError(t, err)
	_, err = r.qp.PostSend(SendWR{WRID: 1, Opcode: WRSendWithImm, Flags: SendSignaled, ImmData: 7,
		SGL: []SGE{{Addr: mr.Addr(), Length: uint32(len(big)), LKey: mr.LKey()}}})
	require.NoError(t, err)
}
