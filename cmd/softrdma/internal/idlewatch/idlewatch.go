// Package idlewatch ends a run in which nothing progressed for a time
// limit (--idle-timeout of the perftest-style and pingpong tools): the
// QPs retry for ever (retry_cnt 7, as on rxe), so a dead peer or path
// would otherwise keep a run going with nothing to show. The run's loops
// note each completion (Progress or Done: one atomic store per batch, no
// timer); a goroutine checks a few times per limit.
package idlewatch

import (
	"context"
	"sync/atomic"
	"time"
)

// Watch is one run's watch. Its methods accept a nil *Watch (no limit).
type Watch struct {
	limit  time.Duration
	last   atomic.Int64 // Unix nanoseconds of the last progress
	count  atomic.Int64 // iterations done, as the loop last noted them
	notes  atomic.Int64 // Progress and Done calls
	fired  atomic.Bool
	source bool // StartWith was given a source
	cancel context.CancelFunc
	stopc  chan struct{}
}

// Start returns ctx, cancelled once limit passes without Progress or
// Done, and its watch; with limit ≤ 0, ctx itself and a nil watch.
func Start(ctx context.Context, limit time.Duration) (context.Context, *Watch) {
	return StartWith(ctx, limit, nil)
}

// StartWith is Start with a second source of progress: the watch reads
// source (a counter, such as the packets a device received) at each of
// its checks, and a value that changed since the last check is progress,
// noted before the limit is checked. nil means none.
func StartWith(ctx context.Context, limit time.Duration, source func() uint64) (context.Context, *Watch) {
	if limit <= 0 {
		return ctx, nil
	}
	w := &Watch{limit: limit, stopc: make(chan struct{}), source: source != nil}
	ctx, w.cancel = context.WithCancel(ctx)
	w.Progress()
	var seen uint64
	if source != nil {
		seen = source()
	}
	go func() {
		defer close(w.stopc)
		tick := time.NewTicker(max(limit/8, time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				if source != nil {
					if v := source(); v != seen {
						seen = v
						w.last.Store(now.UnixNano())
					}
				}
				if now.UnixNano()-w.last.Load() >= int64(limit) {
					w.fired.Store(true)
					w.cancel()
					return
				}
			}
		}
	}()
	return ctx, w
}

// Progress notes a completion (or, for write-lat, a message seen in
// memory): the idle timer restarts.
func (w *Watch) Progress() {
	if w != nil {
		w.last.Store(time.Now().UnixNano())
		w.notes.Add(1)
	}
}

// Notes returns how many times the run noted progress (Progress or Done)
// since Start, its own start not counted: each restarted the idle timer.
// For tests, which check that a run's loops note every batch of
// completions without timing them.
func (w *Watch) Notes() int64 {
	if w == nil {
		return 0
	}
	return w.notes.Load() - 1
}

// Done notes that n iterations are done, and restarts the idle timer.
func (w *Watch) Done(n int64) {
	if w != nil {
		w.count.Store(n)
		w.Progress()
	}
}

// Count returns the iterations last noted by Done.
func (w *Watch) Count() int64 {
	if w == nil {
		return 0
	}
	return w.count.Load()
}

// Limit returns the watch's limit (0 for a nil watch).
func (w *Watch) Limit() time.Duration {
	if w == nil {
		return 0
	}
	return w.limit
}

// Sourced reports whether the watch reads a second source of progress
// (StartWith).
func (w *Watch) Sourced() bool { return w != nil && w.source }

// Expired reports whether the watch cancelled the run.
func (w *Watch) Expired() bool { return w != nil && w.fired.Load() }

// Stop ends the watch (and cancels its context).
func (w *Watch) Stop() {
	if w != nil {
		w.cancel()
		<-w.stopc
	}
}
