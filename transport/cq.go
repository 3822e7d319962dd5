package transport

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
)

// CQ is a completion queue (ibv_cq): a ring of at most depth WCs. When a
// completion arrives at a full CQ, the CQ enters the error state and every
// later Poll returns ErrCQOverrun, as IBTA 11.4.2.1 requires (a CQ overrun
// is an affiliated asynchronous error; no completion is overwritten). A
// QP whose receive completion overran its CQ moves to ERR, and an RC
// responder does not acknowledge the request (rxe's class G error).
//
// CQ is safe for concurrent use.
type CQ struct {
	mu struct {
		sync.Mutex
		ring    []WC // guarded by mu
		head    int  // index of the oldest WC; guarded by mu
		n       int  // number of WCs queued; guarded by mu
		overrun bool // guarded by mu
	}
	notify chan struct{} // capacity 1: a completion arrived
	// destroyed is set by Device.DestroyCQ (under the device's QP lock,
	// which CreateQP holds while it checks it), which then closes gone,
	// so that every waiter wakes.
	destroyed atomic.Bool
	gone      chan struct{}
	// devDone is closed when the CQ's device closes (NewDeviceCQ); nil
	// (NewCQ): never.
	devDone <-chan struct{}
	// errRaised is set when the engine raised EventCQErr for the CQ's
	// overrun (once: the error state is final).
	errRaised atomic.Bool
	ev        eventCount // guarded by the device's events.mu (async.go)
}

// NewCQ returns a CQ holding up to depth completions (ibv_create_cq's cqe).
func NewCQ(depth int) *CQ {
	if depth < 1 {
		depth = 1
	}
	cq := &CQ{notify: make(chan struct{}, 1), gone: make(chan struct{})}
	cq.mu.ring = make([]WC, depth)
	return cq
}

// NewDeviceCQ returns a CQ of device d (NewCQ otherwise): once d is closed
// and the completions queued (those of the WRs its Close flushed among
// them) are polled, Poll and Wait return ErrClosed instead of nothing, so
// that a waiter does not wait for completions that cannot come.
func NewDeviceCQ(d *Device, depth int) *CQ {
	cq := NewCQ(depth)
	cq.devDone = d.done
	return cq
}

// Depth returns the capacity in completions.
func (cq *CQ) Depth() int { return len(cq.mu.ring) }

// push appends a completion. It reports false, and puts the CQ in the
// overrun error state, when the CQ is full.
func (cq *CQ) push(wc *WC) bool {
	cq.mu.Lock()
	if cq.mu.overrun || cq.mu.n == len(cq.mu.ring) {
		cq.mu.overrun = true
		cq.mu.Unlock()
		cq.wake()
		return false
	}
	i := cq.mu.head + cq.mu.n
	if i >= len(cq.mu.ring) {
		i -= len(cq.mu.ring)
	}
	cq.mu.ring[i] = *wc
	cq.mu.n++
	cq.mu.Unlock()
	cq.wake()
	return true
}

func (cq *CQ) wake() {
	select {
	case cq.notify <- struct{}{}:
	default:
	}
}

// Poll moves up to len(wcs) completions, oldest first, into wcs and returns
// how many (ibv_poll_cq). It never blocks and never allocates. After an
// overrun it returns ErrCQOverrun; a device CQ that is empty after its
// device's Close returns ErrClosed; a destroyed CQ, ErrBadCQ.
func (cq *CQ) Poll(wcs []WC) (int, error) {
	if cq.destroyed.Load() {
		return 0, ErrBadCQ
	}
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.mu.overrun {
		return 0, ErrCQOverrun
	}
	n := 0
	for n < len(wcs) && cq.mu.n > 0 {
		wcs[n] = cq.mu.ring[cq.mu.head]
		cq.mu.head++
		if cq.mu.head == len(cq.mu.ring) {
			cq.mu.head = 0
		}
		cq.mu.n--
		n++
	}
	if n == 0 && cq.devDone != nil {
		select {
		case <-cq.devDone:
			return 0, ErrClosed
		default:
		}
	}
	return n, nil
}

// Wait blocks until at least one completion is queued (or the CQ is in
// error), or ctx is done; then it polls like Poll. It is the blocking
// counterpart of ibv_req_notify_cq + ibv_get_cq_event + ibv_poll_cq.
// A completion that is queued when ctx ends is returned, not ctx's error.
// An empty wcs (len 0, whatever its capacity) could never receive a
// completion, so Wait refuses it at once with an error wrapping
// syscall.EINVAL instead of blocking until ctx ends; the completions
// queued stay for the next Poll.
func (cq *CQ) Wait(ctx context.Context, wcs []WC) (int, error) {
	if len(wcs) == 0 {
		return 0, fmt.Errorf("transport: wait on CQ: no room for a completion (len(wcs) is 0): %w", syscall.EINVAL)
	}
	for {
		n, err := cq.Poll(wcs)
		if n > 0 || err != nil {
			return n, err
		}
		if testHookWaitBlock != nil {
			testHookWaitBlock()
		}
		select {
		case <-cq.notify:
		case <-cq.devDone: // the next Poll says ErrClosed, after what is queued
		case <-cq.gone: // the next Poll says ErrBadCQ
		case <-ctx.Done():
			// A completion can arrive as ctx ends (a write deadline
			// that expires as the peer's ACK is processed, after a
			// loaded machine delayed both): select picks either ready
			// case at random, and the completion wins.
			if n, err := cq.Poll(wcs); n > 0 {
				return n, err
			}
			return 0, ctx.Err()
		}
	}
}

// testHookWaitBlock, when set (by tests), runs in Wait after its Poll
// found nothing and before it blocks.
var testHookWaitBlock func()
