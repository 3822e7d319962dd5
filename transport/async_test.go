package transport

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// takeEvents returns the queued events, oldest first, acknowledging each,
// as evString writes them.
func takeEvents(d *Device) []string {
	var out []string
	for {
		ev, ok := d.PollAsyncEvent()
		if !ok {
			return out
		}
		d.AckAsyncEvent(ev)
		out = append(out, evString(ev))
	}
}

// evString writes ev as "type QP n" or "type CQ 0x..." (a diff of two
// events with their QPs printed whole would be unreadable).
func evString(ev AsyncEvent) string {
	s := ev.Type.String()
	if ev.QP != nil {
		s += fmt.Sprintf(" QP %d", ev.QP.QPN())
	}
	if ev.CQ != nil {
		s += fmt.Sprintf(" CQ %p", ev.CQ)
	}
	return s
}

// qpEv and cqEv write an expected event as evString does.
func qpEv(t EventType, qp *QP) string { return evString(AsyncEvent{Type: t, QP: qp}) }
func cqEv(t EventType, cq *CQ) string { return evString(AsyncEvent{Type: t, CQ: cq}) }

// TestResponderErrorEvents: an RC responder error moves the QP to ERR.
// IBTA C9-222.1.1 (Class C responder errors): an error that can be related
// to the QP but not to a WQE of its receive queue (an RDMA WRITE without
// immediate, a READ, an atomic, a packet out of sequence) is reported to
// the responder's client as an affiliated asynchronous error, which IBTA
// 11.6.3.2 names by the NAK: invalid request -> "Invalid Request Local Work
// Queue Error" (IBV_EVENT_QP_REQ_ERR), R_Key/bounds violation -> "Local
// Access Violation Work Queue Error" (IBV_EVENT_QP_ACCESS_ERR). One related
// to a receive WQE completes that WQE in error and raises no event.
func TestResponderErrorEvents(t *testing.T) {
	mtu := make([]byte, rigMTU)
	recv := func(r *responderRig, n uint32) {
		_, err := r.qp.PostRecv(RecvWR{WRID: 7, SGL: []SGE{{Addr: r.mr.Addr(), Length: n, LKey: r.mr.LKey()}}})
		require.NoError(r.t, err)
	}
	rows := []struct {
		name   string
		pkt    func(r *responderRig) []byte
		nak    wire.Syndrome
		event  EventType // with noEvent false
		none   bool      // no event: the error completed a receive WQE
		recvWC WCStatus  // with none: the receive WQE's status
	}{
		// Not related to a receive WQE: an asynchronous error.
		{name: "WRITE with a bad rkey", pkt: func(r *responderRig) []byte {
			return r.build(wire.OpRDMAWriteOnly, 1000, mtu[:8], true, r.reth(r.mr.Addr(), r.mr.RKey()^0x01, 8))
		}, nak: wire.SyndromeNAKRemoteAccess, event: EventQPAccessErr},
		{name: "WRITE past the MR", pkt: func(r *responderRig) []byte {
			return r.build(wire.OpRDMAWriteOnly, 1000, mtu[:64], true, r.reth(r.mr.Addr()+rigMR-32, r.mr.RKey(), 64))
		}, nak: wire.SyndromeNAKRemoteAccess, event: EventQPAccessErr},
		{name: "READ with a bad rkey", pkt: func(r *responderRig) []byte {
			return r.build(wire.OpRDMAReadRequest, 1000, nil, true, r.reth(r.mr.Addr(), r.mr.RKey()^0x01, 8))
		}, nak: wire.SyndromeNAKRemoteAccess, event: EventQPAccessErr},
		{name: "MIDDLE without FIRST", pkt: func(r *responderRig) []byte {
			return r.build(wire.OpRDMAWriteMiddle, 1000, mtu, false, nil)
		}, nak: wire.SyndromeNAKInvalidRequest, event: EventQPReqErr},
		{name: "RETH length not matching the payload", pkt: func(r *responderRig) []byte {
			return r.build(wire.OpRDMAWriteOnly, 1000, mtu[:100], true, r.reth(r.mr.Addr(), r.mr.RKey(), 99))
		}, nak: wire.SyndromeNAKInvalidRequest, event: EventQPReqErr},
		{name: "misaligned atomic", pkt: func(r *responderRig) []byte {
			return r.build(wire.OpFetchAdd, 1000, nil, true, func(b []byte, info *wire.OpInfo) {
				wire.AtomicETH(b[info.Offset[wire.HdrAtomicETH]:]).Encode(&wire.AtomicETHFields{VA: r.mr.Addr() + 4, RKey: r.mr.RKey(), SwapAdd: 1})
			})
		}, nak: wire.SyndromeNAKInvalidRequest, event: EventQPReqErr},
		{name: "WRITE on a QP without remote write", pkt: func(r *responderRig) []byte {
			require.NoError(r.t, r.qp.Modify(&QPAttr{State: QPStateRTS, AccessFlags: stag.AccessRemoteRead}, QPAttrState|QPAttrAccessFlags))
			return r.build(wire.OpRDMAWriteOnly, 1000, mtu[:8], true, r.reth(r.mr.Addr(), r.mr.RKey(), 8))
		}, nak: wire.SyndromeNAKInvalidRequest, event: EventQPReqErr},
		// Related to a receive WQE: a completion error, no event.
		{name: "SEND longer than its receive buffer", pkt: func(r *responderRig) []byte {
			recv(r, 4)
			return r.build(wire.OpSendOnly, 1000, mtu[:8], true, nil)
		}, nak: wire.SyndromeNAKInvalidRequest, none: true, recvWC: WCLocLenErr},
		{name: "WRITE with immediate and a bad rkey", pkt: func(r *responderRig) []byte {
			recv(r, 64)
			return r.build(wire.OpRDMAWriteOnlyWithImmediate, 1000, mtu[:8], true, r.reth(r.mr.Addr(), r.mr.RKey()^0x01, 8))
		}, nak: wire.SyndromeNAKRemoteAccess, none: true, recvWC: WCRemAccessErr},
		{name: "SEND MIDDLE out of sequence after its FIRST", pkt: func(r *responderRig) []byte {
			recv(r, 4*rigMTU)
			r.deliver(r.build(wire.OpSendFirst, 1000, mtu, false, nil))
			return r.build(wire.OpRDMAWriteMiddle, 1001, mtu, false, nil)
		}, nak: wire.SyndromeNAKInvalidRequest, none: true, recvWC: WCRemInvReqErr},
	}
	for _, c := range rows {
		t.Run(c.name, func(t *testing.T) {
			r := newResponderRig(t)
			r.deliver(c.pkt(r))
			op, syn, _ := r.answer()
			require.Equal(t, wire.OpAcknowledge, op)
			require.Equal(t, c.nak, syn)
			require.Equal(t, QPStateErr, r.qp.State())
			evs := takeEvents(r.d)
			wcs := r.poll()
			if c.none {
				require.Empty(t, evs, "an error completing a receive WQE raises no event")
				require.NotEmpty(t, wcs)
				require.Equal(t, uint64(7), wcs[0].WRID)
				require.Equal(t, c.recvWC, wcs[0].Status)
				return
			}
			require.Equal(t, []string{qpEv(c.event, r.qp)}, evs)
			require.Empty(t, wcs, "no WQE was involved")
		})
	}
}

// TestRequesterErrorsRaiseNoEvent: the requester's errors are reported as
// completion errors of the WQE they concern (IBTA 10.10.2.2): a NAK
// remote access error gives the WQE WCRemAccessErr, and the retry counter
// running out WCRetryExcErr; neither raises an asynchronous event (rxe and
// mlx5 raise none either).
func TestRequesterErrorsRaiseNoEvent(t *testing.T) {
	t.Run("NAK remote access error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newSyncRig(t)
			_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
				SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
			require.NoError(t, err)
			require.Len(t, r.sent(), 1)
			r.ackPkt(wire.SyndromeNAKRemoteAccess, 5000, 0)
			wcs := r.poll()
			require.Len(t, wcs, 1)
			require.Equal(t, WCRemAccessErr, wcs[0].Status)
			require.Equal(t, QPStateErr, r.qp.State())
			require.Empty(t, takeEvents(r.d))
		})
	})
	t.Run("retry exceeded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newSyncRig(t)
			// retry_cnt 0 (set at RTR -> RTS, Table 91): RETRY_EXC_ERR at
			// the first timeout.
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
			r.toRTR(t)
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS, SQPSN: 5000, Timeout: 14, RetryCnt: 0, RNRRetry: 7, MaxRdAtomic: 4},
				QPAttrState|QPAttrSQPSN|QPAttrTimeout|QPAttrRetryCnt|QPAttrRNRRetry|QPAttrMaxQPRdAtomic))
			_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
				SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
			require.NoError(t, err)
			require.Len(t, r.sent(), 1)
			time.Sleep(r.qp.timeoutDuration() + time.Microsecond)
			synctest.Wait()
			wcs := r.poll()
			require.Len(t, wcs, 1)
			require.Equal(t, WCRetryExcErr, wcs[0].Status)
			require.Equal(t, QPStateErr, r.qp.State())
			require.Empty(t, takeEvents(r.d))
		})
	})
}

// TestCQOverrunEvents: a receive completion that finds the receive CQ
// full puts the CQ in its error state and raises EventCQErr on it (IBTA
// 11.6.3.2 "CQ Error"; rxe rxe_cq_post), once; the QP that lost its
// completion goes to ERR (rxe's class G) with EventQPFatal, since no
// completion can report it.
func TestCQOverrunEvents(t *testing.T) {
	r := newResponderRig(t)
	cq := NewCQ(1)
	r.qp.recvCQ = cq
	for i := range 2 {
		_, err := r.qp.PostRecv(RecvWR{WRID: uint64(i), SGL: []SGE{{Addr: r.mr.Addr(), Length: 64, LKey: r.mr.LKey()}}})
		require.NoError(t, err)
	}
	r.deliver(r.build(wire.OpSendOnly, 1000, make([]byte, 8), true, nil))
	require.Empty(t, takeEvents(r.d), "the first completion fits")
	r.deliver(r.build(wire.OpSendOnly, 1001, make([]byte, 8), true, nil))
	require.Equal(t, QPStateErr, r.qp.State())
	require.Equal(t, []string{cqEv(EventCQErr, cq), qpEv(EventQPFatal, r.qp)}, takeEvents(r.d))
	// Another completion lost to the CQ in error: counted, no second event.
	before := r.d.counters.CQOverruns.Load()
	r.qp.pushWC(cq, &WC{WRID: 9})
	require.Equal(t, before+1, r.d.counters.CQOverruns.Load())
	require.Empty(t, takeEvents(r.d))
}

// toRTR takes the rig's QP through RESET, INIT and RTR, and leaves it in
// RTR.
func (r *responderRig) toRTR(t *testing.T) {
	qp := r.qp
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateInit, Port: 1, AccessFlags: stag.AccessRemoteWrite},
		QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags))
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTR, Dest: r.from, PathMTU: MTU1024, DestQPN: r.peerQP,
		RQPSN: 1000, MaxDestRdAtomic: 4, MinRNRTimer: 1},
		QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN|QPAttrMaxDestRdAtomic|QPAttrMinRNRTimer))
}

// TestCommEstOnFirstPacketInRTR: IBTA 11.6.3.1 "Communication
// Established": the first packet that reaches a QP in RTR raises
// EventCommEst, once (qib and hfi1 keep a flag until the QP is reset); a
// QP that reached RTS before its first packet raises none.
func TestCommEstOnFirstPacketInRTR(t *testing.T) {
	r := newResponderRig(t)
	write := func(psn wire.PSN) {
		r.deliver(r.build(wire.OpRDMAWriteOnly, psn, make([]byte, 8), true, r.reth(r.mr.Addr(), r.mr.RKey(), 8)))
		op, syn, _ := r.answer()
		require.Equal(t, wire.OpAcknowledge, op)
		require.Equal(t, wire.SyndromeACK, syn)
	}

	// In RTS (the rig's QP): no event.
	write(1000)
	require.Empty(t, takeEvents(r.d), "a QP in RTS raises no EventCommEst")

	r.toRTR(t)
	require.Empty(t, takeEvents(r.d), "RTR alone raises nothing")
	write(1000)
	require.Equal(t, []string{qpEv(EventCommEst, r.qp)}, takeEvents(r.d))
	write(1001)
	require.Empty(t, takeEvents(r.d), "once per connection")

	// Through RESET: the next connection raises it again.
	r.toRTR(t)
	write(1000)
	require.Equal(t, []string{qpEv(EventCommEst, r.qp)}, takeEvents(r.d), "again after RESET")

	// A packet the demux drops (another peer's address) does not count.
	r.toRTR(t)
	b := r.build(wire.OpRDMAWriteOnly, 1000, make([]byte, 8), true, r.reth(r.mr.Addr(), r.mr.RKey(), 8))
	r.d.handle(&conn.Packet{Buf: b, Addr: netip.MustParseAddrPort("192.0.2.1:4791")}, &r.pkt)
	require.Empty(t, takeEvents(r.d))
}

// TestSQDrainedWhenDrainCompletes: after Modify to SQD asking for it
// (en_sqd_async_notify; TestSQDrainedOnlyWhenAsked), EventSQDrained is
// raised once every message the send queue began is complete (IBTA
// 11.6.3.1 "Send Queue Drained"; rxe's requester raises it when nothing
// is in flight): for RC, when the last outstanding message is
// acknowledged; at once when nothing is in flight; not again on SQD ->
// SQD; not at all if the QP leaves SQD first (for RESET or ERR, the only
// states it may go to while draining).
func TestSQDrainedWhenDrainCompletes(t *testing.T) {
	write := func(r *syncRig, wrid uint64) {
		_, err := r.qp.PostSend(SendWR{WRID: wrid, Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
	}
	sqd := func(r *syncRig) { // the event is asked for on RTS -> SQD, the one transition that takes it
		mask := QPAttrState
		if r.qp.State() == QPStateRTS {
			mask |= QPAttrEnSQDAsyncNotify
		}
		require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, EnSQDAsyncNotify: true}, mask))
	}
	t.Run("in flight", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newSyncRig(t)
			write(r, 1)
			require.Len(t, r.sent(), 1)
			sqd(r)
			write(r, 2) // posted in SQD: not started, not waited for
			require.Empty(t, r.sent(), "SQD starts no new message")
			require.Empty(t, takeEvents(r.d), "the WRITE is not acknowledged yet")
			r.ackPkt(wire.SyndromeACK, 5000, 1)
			synctest.Wait()
			require.Equal(t, []string{qpEv(EventSQDrained, r.qp)}, takeEvents(r.d))
			sqd(r) // SQD -> SQD
			require.Empty(t, takeEvents(r.d), "one event per drain")
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState))
			require.Len(t, r.sent(), 1, "back in RTS, the second WRITE goes")
		})
	})
	t.Run("idle", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newSyncRig(t)
			sqd(r)
			require.Equal(t, []string{qpEv(EventSQDrained, r.qp)}, takeEvents(r.d))
		})
	})
	t.Run("error while draining", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newSyncRig(t)
			write(r, 1)
			require.Len(t, r.sent(), 1)
			sqd(r)
			r.ackPkt(wire.SyndromeNAKRemoteAccess, 5000, 0)
			synctest.Wait()
			require.Equal(t, QPStateErr, r.qp.State())
			require.Equal(t, WCRemAccessErr, r.poll()[0].Status)
			require.Empty(t, takeEvents(r.d), "ERR ends the drain without an event")
		})
	})
	t.Run("reset while draining", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newSyncRig(t)
			write(r, 1)
			require.Len(t, r.sent(), 1)
			sqd(r)
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
			r.ackPkt(wire.SyndromeACK, 5000, 1)
			synctest.Wait()
			require.Empty(t, takeEvents(r.d))
		})
	})
}

// TestAsyncEventOverflowCountedAllocFree: the queue holds MaxAsyncEvents
// events; the ones raised while it is full are dropped and counted in
// async_events_dropped, and raising allocates nothing, full or not.
func TestAsyncEventOverflowCountedAllocFree(t *testing.T) {
	r := newResponderRig(t)
	for range MaxAsyncEvents + 5 {
		r.d.raise(EventCommEst, r.qp, nil)
	}
	require.Equal(t, uint64(5), r.d.counters.AsyncEventsDropped.Load())
	var dropped uint64
	for _, c := range r.d.Snapshot() {
		if c.Name == "async_events_dropped" {
			dropped = c.Value
		}
	}
	require.Equal(t, uint64(5), dropped)
	require.Len(t, takeEvents(r.d), MaxAsyncEvents)
	if raceEnabled {
		return // the race detector allocates
	}
	raise := func() { r.d.raise(EventQPFatal, r.qp, nil) }
	require.Zero(t, testing.AllocsPerRun(100, raise), "raise into a queue with room")
	require.Equal(t, uint64(5), r.d.counters.AsyncEventsDropped.Load())
	for range MaxAsyncEvents - 101 {
		raise()
	}
	require.Equal(t, uint64(5), r.d.counters.AsyncEventsDropped.Load(), "full, nothing dropped yet")
	require.Zero(t, testing.AllocsPerRun(100, raise), "raise into a full queue")
	require.Equal(t, uint64(5+101), r.d.counters.AsyncEventsDropped.Load())
}

// TestGetAsyncEventHonoursContext: GetAsyncEvent blocks until an event is
// raised, returns ctx's error when ctx ends first, and ErrClosed once the
// device is closed and its queue empty.
func TestGetAsyncEventHonoursContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newResponderRig(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := r.d.GetAsyncEvent(ctx)
		require.ErrorIs(t, err, context.Canceled)

		ctx, cancel = context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		_, err = r.d.GetAsyncEvent(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, time.Second, time.Since(start))

		got := make(chan AsyncEvent)
		go func() {
			ev, err := r.d.GetAsyncEvent(t.Context())
			require.NoError(t, err)
			got <- ev
		}()
		synctest.Wait() // blocked
		r.d.raise(EventQPFatal, r.qp, nil)
		ev := <-got
		require.Equal(t, qpEv(EventQPFatal, r.qp), evString(ev))
		r.d.AckAsyncEvent(ev)

		// Two waiters, two events queued before either wakes (the second
		// raise found the notification already pending, so one wake for
		// two events): both waiters return.
		for range 2 {
			go func() {
				ev, err := r.d.GetAsyncEvent(t.Context())
				require.NoError(t, err)
				got <- ev
			}()
		}
		synctest.Wait()
		q := &r.d.events
		q.mu.Lock()
		q.pushLocked(AsyncEvent{Type: EventQPFatal, QP: r.qp})
		q.pushLocked(AsyncEvent{Type: EventCQErr, CQ: r.cq})
		q.mu.Unlock()
		q.wake()
		<-got
		<-got

		r.d.raise(EventQPFatal, r.qp, nil)
		require.NoError(t, r.d.Close())
		ev, err = r.d.GetAsyncEvent(t.Context())
		require.NoError(t, err, "queued before Close: still returned")
		require.Equal(t, EventQPFatal, ev.Type)
		_, err = r.d.GetAsyncEvent(t.Context())
		require.ErrorIs(t, err, ErrClosed)
	})
}

// TestNoEventAfterDestroyQP: DestroyQP discards the QP's events not yet
// returned, and none is raised for it afterwards; and, as ibv_destroy_qp,
// it returns only once the events of the QP that were returned have been
// acknowledged (ibv_get_async_event(3)).
func TestNoEventAfterDestroyQP(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newResponderRig(t)
		r.d.raise(EventCommEst, r.qp, nil)
		r.d.raise(EventCQErr, nil, r.cq)
		r.d.raise(EventQPFatal, r.qp, nil)
		ev, ok := r.d.PollAsyncEvent()
		require.True(t, ok)
		require.Equal(t, qpEv(EventCommEst, r.qp), evString(ev))

		done := make(chan error)
		go func() { done <- r.d.DestroyQP(r.qp) }()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("DestroyQP returned (%v) before the event was acknowledged", err)
		default:
		}
		r.d.events.mu.Lock()
		waiters := r.d.events.waiters
		r.d.events.mu.Unlock()
		require.Equal(t, 1, waiters)
		r.d.AckAsyncEvent(ev)
		require.NoError(t, <-done)

		r.d.raise(EventQPFatal, r.qp, nil) // as the engine would, late
		require.Equal(t, []string{cqEv(EventCQErr, r.cq)}, takeEvents(r.d),
			"the QP's queued EventQPFatal is gone, the late one not raised; the CQ's stays")
	})
}

// TestDestroyCQDiscardsItsEvents: as DestroyQP, for a CQ's EventCQErr.
func TestDestroyCQDiscardsItsEvents(t *testing.T) {
	r := newResponderRig(t)
	cq := NewDeviceCQ(r.d, 4)
	r.d.raise(EventCQErr, nil, cq)
	require.NoError(t, r.d.DestroyCQ(cq))
	r.d.raise(EventCQErr, nil, cq)
	require.Empty(t, takeEvents(r.d))
}

// TestCommEstUCNotUD: a UC QP in RTR raises EventCommEst on its first
// packet as RC does; a UD QP, which has no connection, raises none.
func TestCommEstUCNotUD(t *testing.T) {
	r := newDGRig(t, QPTypeUC, conn.PipeConfig{})
	qp := r.qp
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateInit, Port: 1, AccessFlags: stag.AccessRemoteWrite},
		QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags))
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTR, Dest: r.from, PathMTU: MTU1024, DestQPN: r.peerQP, RQPSN: 1000},
		QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN))
	r.postRecv(1, 0, 64)
	r.deliver(r.uc(wire.OpSendOnly, 1000, []byte("hi"), nil))
	require.Len(t, r.poll(), 1)
	require.Equal(t, []string{qpEv(EventCommEst, qp)}, takeEvents(r.d))
	r.postRecv(2, 0, 64)
	r.deliver(r.uc(wire.OpSendOnly, 1001, []byte("hi"), nil))
	require.Empty(t, takeEvents(r.d))

	u := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	require.NoError(t, u.qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
	require.NoError(t, u.qp.Modify(&QPAttr{State: QPStateInit, Port: 1, QKey: dgQKey},
		QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrQKey))
	require.NoError(t, u.qp.Modify(&QPAttr{State: QPStateRTR}, QPAttrState))
	u.postRecv(1, 0, 1024)
	u.deliver(u.ud(dgQKey, 0x42, []byte("hi"), false))
	require.Len(t, u.poll(), 1, "UD receives in RTR")
	require.Empty(t, takeEvents(u.d))
}

// TestCQOverrunEventsUCUD: as TestCQOverrunEvents on the unreliable
// services, whose receive CQ overrun is rxe's class G error too.
func TestCQOverrunEventsUCUD(t *testing.T) {
	for _, typ := range []QPType{QPTypeUC, QPTypeUD} {
		t.Run(typ.String(), func(t *testing.T) {
			r := newDGRig(t, typ, conn.PipeConfig{})
			cq := NewCQ(1)
			r.qp.recvCQ = cq
			r.postRecv(1, 0, 1024)
			r.postRecv(2, 1024, 1024)
			for psn := wire.PSN(1000); psn < 1002; psn++ {
				if typ == QPTypeUD {
					r.deliver(r.ud(dgQKey, 0x42, []byte("hi"), false))
				} else {
					r.deliver(r.uc(wire.OpSendOnly, psn, []byte("hi"), nil))
				}
			}
			require.Equal(t, QPStateErr, r.qp.State())
			require.Equal(t, []string{cqEv(EventCQErr, cq), qpEv(EventQPFatal, r.qp)}, takeEvents(r.d))
		})
	}
}

// TestSendCQOverrunMovesQPToErr: IBTA C9-218, a requester class F error:
// a WQE that cannot complete because its CQ is full moves the QP to ERR,
// with an affiliated asynchronous error (QP_FATAL; NVIDIA's verbs manual:
// "All of the QPs associated with this CQ ... will also get the
// IBV_EVENT_QP_FATAL event"), besides the CQ's CQ_ERR. The send queue
// stops: a WR posted after the lost completion is not sent.
func TestSendCQOverrunMovesQPToErr(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		cq := NewCQ(1)
		r.qp.sendCQ = cq
		write := func(wrid uint64) {
			_, err := r.qp.PostSend(SendWR{WRID: wrid, Opcode: WRRDMAWrite, Flags: SendSignaled,
				SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
			require.NoError(t, err)
		}
		write(1)
		write(2)
		require.Len(t, r.sent(), 2)
		r.ackPkt(wire.SyndromeACK, 5001, 2) // both complete: the second overruns
		require.Equal(t, QPStateErr, r.qp.State())
		require.Equal(t, []string{cqEv(EventCQErr, cq), qpEv(EventQPFatal, r.qp)}, takeEvents(r.d))
		// A post in ERR is taken and flushed (into the CQ in error), not sent.
		_, err := r.qp.PostSend(SendWR{WRID: 3, Opcode: WRRDMAWrite, SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		require.Empty(t, r.sent())
	})
}

// TestSendCQOverrunUCUD: as TestSendCQOverrunMovesQPToErr on UC and UD,
// whose sends complete once sent: the QP goes to ERR with CQ_ERR and
// QP_FATAL, and its posted receive is flushed into its receive CQ.
func TestSendCQOverrunUCUD(t *testing.T) {
	for _, typ := range []QPType{QPTypeUC, QPTypeUD} {
		t.Run(typ.String(), func(t *testing.T) {
			r := newDGRig(t, typ, conn.PipeConfig{})
			scq := NewCQ(1)
			r.qp.sendCQ = scq
			r.postRecv(7, 0, 64)
			wr := SendWR{Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}}
			if typ == QPTypeUD {
				ah, err := r.d.CreateAH(1, &AHAttr{Dest: r.from})
				require.NoError(t, err)
				wr.AH, wr.RemoteQPN, wr.RemoteQKey = ah, r.peerQP, dgQKey
			}
			for i := range 2 {
				wr.WRID = uint64(i + 1)
				_, err := r.qp.PostSend(wr)
				require.NoError(t, err)
			}
			wcs := waitCQ(t, r.cq, 1) // the receive CQ: the flushed receive
			require.Equal(t, uint64(7), wcs[0].WRID)
			require.Equal(t, WCWRFlushErr, wcs[0].Status)
			require.Equal(t, QPStateErr, r.qp.State())
			require.Equal(t, []string{cqEv(EventCQErr, scq), qpEv(EventQPFatal, r.qp)}, takeEvents(r.d))
		})
	}
}
