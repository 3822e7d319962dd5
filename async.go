package softrdma

import (
	"context"

	"github.com/softrdma/softrdma/transport"
)

// AsyncEvent is an asynchronous event (struct ibv_async_event): Type, and
// of the element union QP (the QP events) or CQ (EventCQErr). See
// GetAsyncEvent.
type AsyncEvent = transport.AsyncEvent

// EventType is an asynchronous event's type (enum ibv_event_type, same
// numbering; String gives ibv_event_type_str's text).
type EventType = transport.EventType

// Event types softrdma raises (IBTA vol. 1, 11.6.3; ibv_get_async_event(3)).
// Package transport (async.go) has the rest of enum ibv_event_type, which
// softrdma never raises: no SRQ (so no QP_LAST_WQE_REACHED), no alternate
// path, no port or device event.
const (
	// EventCQErr: a completion found the CQ full; the CQ is in error
	// (CQ.Poll returns ErrCQOverrun). AsyncEvent.CQ is the CQ. Once per CQ.
	EventCQErr = transport.EventCQErr
	// EventQPFatal: the engine moved the QP to ERR and no completion
	// reports why: one of its completions overran its receive or send
	// CQ (which gets EventCQErr; IBTA C9-218), so the completion is lost.
	EventQPFatal = transport.EventQPFatal
	// EventQPReqErr: the RC responder NAKed a request as an invalid
	// request (opcode out of sequence, bad length, an operation the QP's
	// access flags refuse, a misaligned atomic) and moved to ERR, and no
	// receive WQE took the error (IBTA C9-222.1.1).
	EventQPReqErr = transport.EventQPReqErr
	// EventQPAccessErr: as EventQPReqErr for an R_Key, bounds or access
	// violation (NAK remote access error): an RDMA WRITE without
	// immediate data, a READ or an atomic with a bad rkey.
	EventQPAccessErr = transport.EventQPAccessErr
	// EventCommEst: the first request packet reached the RC or UC QP while
	// it was in RTR (once until the QP is reset).
	EventCommEst = transport.EventCommEst
	// EventSQDrained: after a Modify to SQD that asked for it
	// (QPAttrEnSQDAsyncNotify, QPAttr.EnSQDAsyncNotify), every message
	// the send queue had begun is complete (at once if none was in
	// progress).
	EventSQDrained = transport.EventSQDrained
)

// MaxAsyncEvents is how many unread events a device queues; an event
// raised while the queue is full is dropped and counted in the
// "async_events_dropped" counter (Snapshot).
const MaxAsyncEvents = transport.MaxAsyncEvents

// GetAsyncEvent waits for the device's next asynchronous event until ctx
// is done, and returns it (ibv_get_async_event). Events are affiliated
// with a QP or a CQ (AsyncEvent.QP, AsyncEvent.CQ) and come in the order
// they were raised. Errors: ctx's error (context.Canceled,
// context.DeadlineExceeded); ErrClosed after Close, once the events queued
// before it are returned. Acknowledge every event returned with
// AckAsyncEvent: DestroyQP and DestroyCQ wait for the acknowledgements of
// their object's events, as in libibverbs.
//
// Which events are raised, and when, follows IBTA 11.6.3 (docs/api.md,
// "Asynchronous events"). A requester's errors are not among them: they
// complete the WR in error (WCRemAccessErr, WCRetryExcErr, ...), and a
// responder error that concerns a receive WR completes that WR in error.
func (d *Device) GetAsyncEvent(ctx context.Context) (AsyncEvent, error) {
	return d.t.GetAsyncEvent(ctx)
}

// PollAsyncEvent returns the device's next asynchronous event and true, or
// false at once when none is queued: GetAsyncEvent without waiting (as
// ibv_get_async_event on a context whose async_fd is non-blocking).
func (d *Device) PollAsyncEvent() (AsyncEvent, bool) { return d.t.PollAsyncEvent() }

// AckAsyncEvent acknowledges an event that GetAsyncEvent or PollAsyncEvent
// returned (ibv_ack_async_event). DestroyQP and DestroyCQ wait until each
// event of their QP or CQ so returned is acknowledged; acknowledging an
// event twice has no further effect.
func (d *Device) AckAsyncEvent(ev AsyncEvent) { d.t.AckAsyncEvent(ev) }
