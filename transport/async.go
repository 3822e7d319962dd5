package transport

import (
	"context"
	"fmt"
	"sync"
)

// Asynchronous events (IBTA vol. 1, 11.6.3 "Asynchronous Events";
// libibverbs ibv_get_async_event(3)).
//
// The engine reports an event where it detects the condition, on the QP
// or CQ it concerns (the affiliated events and errors of IBTA 11.6.3.1
// and 11.6.3.2), into a bounded queue per device; the application takes
// them with Device.GetAsyncEvent (blocking) or Device.PollAsyncEvent and
// acknowledges each with Device.AckAsyncEvent. The events raised, and
// when:
//
//   - EventCQErr on a CQ (IBTA 11.6.3.2 "CQ Error", rxe rxe_cq_post):
//     when a completion finds the CQ full and the CQ enters its error
//     state (CQ.Poll then returns ErrCQOverrun). Once per CQ: the error
//     state is final.
//   - EventQPFatal on a QP ("Local Work Queue Catastrophic Error"): the
//     engine moved the QP to ERR and no completion reports why. Today
//     that is a completion that overran the QP's receive CQ (rxe's class
//     G error) or send CQ (IBTA C9-218, requester class F: "the affected
//     QP shall be moved to the error state and affiliated asynchronous
//     errors generated"): the completion is lost, so the QP cannot go
//     on; the CQ gets EventCQErr and the QP this event (rxe raises only
//     the CQ's). A responder's remote operational error on a request without
//     a receive WQE, or a requester error finding no WQE to complete,
//     would raise it too, but the engine produces neither: its only
//     remote operational error is a fault of a SEND's receive WQE, which
//     completes in error, and a requester error always has its WQE.
//   - EventQPReqErr ("Invalid Request Local Work Queue Error") and
//     EventQPAccessErr ("Local Access Violation Work Queue Error") on an
//     RC responder's QP, when it NAKs a request with invalid request, or
//     with remote access error (an R_Key, bounds or access violation),
//     and moves to ERR, and the error concerns no receive WQE: an RDMA
//     WRITE (without immediate data, or whose receive WQE is not yet
//     taken), an RDMA READ, an atomic, a packet out of sequence. IBTA
//     C9-222.1.1 (Class C responder errors): an error that can be related
//     to the QP but not to a WQE of its receive queue is reported to the
//     responder's client as an affiliated asynchronous error; one related
//     to a receive WQE (a SEND, a WRITE with immediate whose WQE was
//     taken, a SEND with Invalidate naming a bad key) as a completion
//     error of that WQE, with no event. The requester learns of the error
//     from the NAK, as a completion error (WCRemInvReqErr,
//     WCRemAccessErr, WCRemOpErr) and no event.
//   - EventCommEst on an RC or UC QP (IBTA 11.6.3.1 "Communication
//     Established"): the first request packet that reaches the QP while
//     it is in RTR (the demux's checks passed: QPN, service, state, path
//     MTU, peer address). Once per connection: the QP must pass through
//     RESET to raise it again. A QP moved to RTS before its first packet
//     raises none (qib's and hfi1's rule).
//   - EventSQDrained on a QP (IBTA 11.6.3.1 "Send Queue Drained", rxe
//     rxe_requester): once after a Modify to SQD that asked for it
//     (QPAttrEnSQDAsyncNotify with QPAttr.EnSQDAsyncNotify, as
//     ibv_modify_qp's en_sqd_async_notify: mlx4, mlx5 and mthca ask the
//     device for the event only then, while rxe raises it always), when
//     every message the send queue had begun is complete (acknowledged
//     for RC, sent for UC and UD); at once if none was in progress. Not
//     raised if the QP leaves SQD first, for ERR or RESET: until the
//     drain is over, Modify takes the QP out of SQD to no other state
//     (rxe), and QPAttr.SQDraining says the drain goes on, asked for the
//     event or not.
//
// Not raised: the requester's errors (retry or RNR retry exceeded, a
// fatal NAK, a local protection error) complete their WQE in error and
// raise no event, as IBTA 10.10.2.2 reports errors related to a WQE as
// completion errors (rxe and mlx5 likewise); EventQPLastWQEReached and the
// SRQ events (softrdma has no SRQ); EventPathMig and EventPathMigErr (no
// alternate path); the port and device events (the one port is always
// active and no device error is detected: a socket error is counted and
// logged, and Close ends the device).
//
// The queue holds MaxAsyncEvents events. An event raised while it is full
// is dropped and counted (Counters.AsyncEventsDropped,
// "async_events_dropped"): raising never blocks the receive loop or the
// send worker and allocates nothing.

// EventType is an asynchronous event's type (enum ibv_event_type).
type EventType uint8

// Event types, libibverbs numbering (enum ibv_event_type). softrdma
// raises EventCQErr, EventQPFatal, EventQPReqErr, EventQPAccessErr,
// EventCommEst and EventSQDrained (see above); the others exist for the
// numbering and are never raised.
const (
	EventCQErr            EventType = iota // IBV_EVENT_CQ_ERR
	EventQPFatal                           // IBV_EVENT_QP_FATAL
	EventQPReqErr                          // IBV_EVENT_QP_REQ_ERR
	EventQPAccessErr                       // IBV_EVENT_QP_ACCESS_ERR
	EventCommEst                           // IBV_EVENT_COMM_EST
	EventSQDrained                         // IBV_EVENT_SQ_DRAINED
	EventPathMig                           // IBV_EVENT_PATH_MIG (never raised)
	EventPathMigErr                        // IBV_EVENT_PATH_MIG_ERR (never raised)
	EventDeviceFatal                       // IBV_EVENT_DEVICE_FATAL (never raised)
	EventPortActive                        // IBV_EVENT_PORT_ACTIVE (never raised)
	EventPortErr                           // IBV_EVENT_PORT_ERR (never raised)
	EventLIDChange                         // IBV_EVENT_LID_CHANGE (never raised)
	EventPKeyChange                        // IBV_EVENT_PKEY_CHANGE (never raised)
	EventSMChange                          // IBV_EVENT_SM_CHANGE (never raised)
	EventSRQErr                            // IBV_EVENT_SRQ_ERR (never raised: no SRQ)
	EventSRQLimitReached                   // IBV_EVENT_SRQ_LIMIT_REACHED (never raised: no SRQ)
	EventQPLastWQEReached                  // IBV_EVENT_QP_LAST_WQE_REACHED (never raised: no SRQ)
	EventClientReregister                  // IBV_EVENT_CLIENT_REREGISTER (never raised)
	EventGIDChange                         // IBV_EVENT_GID_CHANGE (never raised)
	EventWQFatal                           // IBV_EVENT_WQ_FATAL (never raised)
)

var eventNames = [...]string{
	"CQ error", "local work queue catastrophic error", "invalid request local work queue error",
	"local access violation work queue error", "communication established", "send queue drained",
	"path migrated", "path migration request error", "local catastrophic error", "port active",
	"port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
	"SRQ limit reached", "last WQE reached", "client reregistration", "GID table change", "WQ fatal",
}

// String returns the text ibv_event_type_str(3) gives.
func (t EventType) String() string {
	if int(t) < len(eventNames) {
		return eventNames[t]
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// AsyncEvent is one asynchronous event (struct ibv_async_event). Of the
// element union, QP is set for the QP events, CQ for EventCQErr, and Port
// (1) would be for the port events, which softrdma does not raise.
type AsyncEvent struct {
	Type EventType
	QP   *QP
	CQ   *CQ
	Port uint8
}

// MaxAsyncEvents is how many unread events a device queues; more are
// dropped and counted (async_events_dropped).
const MaxAsyncEvents = 256

// eventCount is an object's (a QP's or a CQ's) share of the event
// queue's bookkeeping. Guarded by the device's events.mu.
type eventCount struct {
	delivered uint64 // events of the object returned by Get/Poll
	acked     uint64 // of those, acknowledged
	gone      bool   // destroyed: its events are dropped, none is raised
}

// eventQueue is a device's asynchronous event queue: a ring of
// MaxAsyncEvents events. mu is a leaf lock: it is taken under sq, rq and
// respMu, and nothing is locked while it is held.
type eventQueue struct {
	mu      sync.Mutex
	ring    [MaxAsyncEvents]AsyncEvent // guarded by mu
	head    int                        // index of the oldest event; guarded by mu
	n       int                        // events queued; guarded by mu
	acked   *sync.Cond                 // on mu: an acknowledgement arrived (destroyers wait)
	waiters int                        // destroyers waiting for acknowledgements; guarded by mu
	notify  chan struct{}              // capacity 1: an event was queued
}

func (q *eventQueue) init() {
	q.acked = sync.NewCond(&q.mu)
	q.notify = make(chan struct{}, 1)
}

func (q *eventQueue) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// raise queues an event of type t on qp or cq (one of them non-nil).
// Events of a destroyed object, or after the device's Close, are not
// raised; one that finds the queue full is counted and dropped. It never
// blocks (but for mu, held only to copy an event) and never allocates.
func (d *Device) raise(t EventType, qp *QP, cq *CQ) {
	q := &d.events
	q.mu.Lock()
	if d.closed.Load() || qp != nil && qp.ev.gone || cq != nil && cq.ev.gone {
		q.mu.Unlock()
		return
	}
	ok := q.pushLocked(AsyncEvent{Type: t, QP: qp, CQ: cq})
	q.mu.Unlock()
	if !ok {
		d.counters.AsyncEventsDropped.Add(1)
		return
	}
	q.wake()
}

// pushLocked appends ev to the ring, or reports false when it is full.
// Caller holds mu.
func (q *eventQueue) pushLocked(ev AsyncEvent) bool {
	if q.n == len(q.ring) {
		return false
	}
	i := q.head + q.n
	if i >= len(q.ring) {
		i -= len(q.ring)
	}
	q.ring[i] = ev
	q.n++
	return true
}

// PollAsyncEvent returns the oldest queued event without blocking, and
// false when none is queued. Each event it returns must be acknowledged
// with AckAsyncEvent (see DestroyQP).
func (d *Device) PollAsyncEvent() (AsyncEvent, bool) {
	q := &d.events
	q.mu.Lock()
	if q.n == 0 {
		q.mu.Unlock()
		return AsyncEvent{}, false
	}
	ev := q.ring[q.head]
	q.ring[q.head] = AsyncEvent{} // drop the references
	q.head++
	if q.head == len(q.ring) {
		q.head = 0
	}
	q.n--
	if ev.QP != nil {
		ev.QP.ev.delivered++
	}
	if ev.CQ != nil {
		ev.CQ.ev.delivered++
	}
	more := q.n > 0
	q.mu.Unlock()
	if more {
		q.wake() // another waiter may take the next one
	}
	return ev, true
}

// GetAsyncEvent returns the oldest queued event, waiting for one until ctx
// is done (ibv_get_async_event). Errors: ctx's error; ErrClosed once the
// device is closed and the queue is empty. Each event it returns must be
// acknowledged with AckAsyncEvent.
func (d *Device) GetAsyncEvent(ctx context.Context) (AsyncEvent, error) {
	for {
		if ev, ok := d.PollAsyncEvent(); ok {
			return ev, nil
		}
		select {
		case <-d.done:
			if ev, ok := d.PollAsyncEvent(); ok {
				return ev, nil
			}
			return AsyncEvent{}, ErrClosed
		default:
		}
		select {
		case <-d.events.notify:
		case <-d.done:
		case <-ctx.Done():
			return AsyncEvent{}, ctx.Err()
		}
	}
}

// AckAsyncEvent acknowledges an event that GetAsyncEvent or PollAsyncEvent
// returned (ibv_ack_async_event). DestroyQP and DestroyCQ wait until every
// event of their object so returned is acknowledged, as libibverbs does;
// acknowledging more events than were returned has no effect.
func (d *Device) AckAsyncEvent(ev AsyncEvent) {
	q := &d.events
	q.mu.Lock()
	for _, c := range []*eventCount{qpCount(ev.QP), cqCount(ev.CQ)} {
		if c != nil && c.acked < c.delivered {
			c.acked++
		}
	}
	q.mu.Unlock()
	q.acked.Broadcast()
}

func qpCount(qp *QP) *eventCount {
	if qp == nil {
		return nil
	}
	return &qp.ev
}

func cqCount(cq *CQ) *eventCount {
	if cq == nil {
		return nil
	}
	return &cq.ev
}

// forget marks the object of c destroyed and removes its queued events
// (those not yet returned): after its Destroy returns, no event of it is
// returned (ibv_get_async_event(3)). match reports whether an event is of
// the object.
func (d *Device) forget(c *eventCount, match func(*AsyncEvent) bool) {
	q := &d.events
	q.mu.Lock()
	defer q.mu.Unlock()
	c.gone = true
	kept := 0
	for k := range q.n {
		i := (q.head + k) % len(q.ring)
		if match(&q.ring[i]) {
			continue
		}
		q.ring[(q.head+kept)%len(q.ring)] = q.ring[i]
		kept++
	}
	for k := kept; k < q.n; k++ {
		q.ring[(q.head+k)%len(q.ring)] = AsyncEvent{}
	}
	q.n = kept
}

// waitAcked waits until every event of c that was returned is
// acknowledged (libibverbs' destroy waits for events_completed to reach
// events_reported).
func (d *Device) waitAcked(c *eventCount) {
	q := &d.events
	q.mu.Lock()
	for c.acked < c.delivered {
		q.waiters++
		q.acked.Wait()
		q.waiters--
	}
	q.mu.Unlock()
}

// commEstablished raises EventCommEst for the first request packet that
// reaches the QP in RTR (IBTA 11.6.3.1; qib and hfi1 raise it on the first
// valid request in RTR, once until the QP is reset). Receive loop only.
func (qp *QP) commEstablished() {
	if !qp.commEst.Load() && qp.commEst.CompareAndSwap(false, true) {
		qp.dev.raise(EventCommEst, qp, nil)
	}
}

// sqDrainedLocked ends a drain asked for by Modify to SQD once it has
// completed: no message the send queue began is incomplete (the
// requester has caught up with the completer, and the oldest WQE, if any,
// was never started). It raises EventSQDrained if the Modify asked for it
// (en_sqd_async_notify). sqDraining is false outside SQD (Modify clears it),
// and an engine error, which moves the QP to ERR without Modify, stops
// every caller: its requester no longer runs. Caller holds sq.
func (qp *QP) sqDrainedLocked() {
	if !qp.sqDraining {
		return
	}
	if qp.req.idx != qp.comp.idx || qp.req.offset != 0 {
		return
	}
	if w := qp.oldest(); w != nil && (w.psnSet || w.local != localNone) {
		return // begun: rewound for a retry, or a local operation waiting
	}
	qp.sqDraining = false
	if qp.sqdNotify {
		qp.sqdNotify = false
		qp.dev.raise(EventSQDrained, qp, nil)
	}
}

// draining reports whether a drain asked for by Modify to SQD is still
// going on (ibv_qp_attr sq_draining).
func (qp *QP) draining() bool {
	qp.sq.Lock()
	defer qp.sq.Unlock()
	return qp.sqDraining
}
