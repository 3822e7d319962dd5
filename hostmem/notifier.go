package hostmem

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
)

// Event says why a range is invalidated (the kernel's enum
// mmu_notifier_event).
type Event uint8

const (
	// EventUnmap: Free unmaps the range (MMU_NOTIFY_UNMAP). Its pages
	// are gone; a fault on them fails with ErrNotMapped.
	EventUnmap Event = iota
	// EventMigrate: Migrate moves the range to new frames
	// (MMU_NOTIFY_MIGRATE). A fault after the invalidation resolves the new
	// frames.
	EventMigrate
	// EventProtect: Protect takes write access away
	// (MMU_NOTIFY_PROTECTION_VMA). A fault after it resolves read-only
	// pages.
	EventProtect
)

func (e Event) String() string {
	switch e {
	case EventUnmap:
		return "unmap"
	case EventMigrate:
		return "migrate"
	case EventProtect:
		return "protect"
	}
	return fmt.Sprintf("Event(%d)", uint8(e))
}

// Invalidation describes one invalidation to a Notifier.
type Invalidation struct {
	// Range is the part of the subscription's range that is invalidated
	// (already clamped to it), page aligned.
	Range Range
	Event Event
	// Seq is the subscription's sequence count for the duration of the
	// invalidation (odd). A fault that read an earlier value with
	// ReadBegin will find ReadRetry true.
	Seq uint64
}

// Notifier is told when pages of a subscribed range lose their frames,
// like a struct mmu_interval_notifier_ops.
//
// Invalidate runs before the change (Free, Migrate, Protect) and with the
// AddressSpace's mu held, the subscription's sequence count already odd.
// When it returns, the subscriber must no longer use the frames of
// inv.Range: it takes its own lock (the lock its fault path holds around
// ReadRetry and the install), clears its entries for the range, releases
// that lock, and waits until no copy that may have used a cleared entry is
// still running (copies are per packet; it must not wait for anything
// longer, such as a message to end). It may unpin (FramePin.Unpin,
// Pin.Unpin) and call Resolve, FrameOf and Subscribe. It must not call the
// AddressSpace methods that take mu (Alloc, AllocAt, Free, Protect,
// PrepareMigrate, Commit, Pin, Close), Unsubscribe, or ReadBegin on an
// invalidated subscription: each would deadlock.
type Notifier interface {
	Invalidate(sub *Subscription, inv Invalidation)
}

// EndNotifier is implemented by a Notifier that also wants to know when
// the change is done (the new frames are mapped, or the pages are gone).
// InvalidateEnd runs after it, still under mu and with the same
// restrictions as Invalidate; ReadBegin has already stopped waiting, so a
// subscriber may fault the new frames in from here.
type EndNotifier interface {
	Notifier
	InvalidateEnd(sub *Subscription, inv Invalidation)
}

// NotifierFunc adapts a function to Notifier.
type NotifierFunc func(sub *Subscription, inv Invalidation)

// Invalidate calls f.
func (f NotifierFunc) Invalidate(sub *Subscription, inv Invalidation) { f(sub, inv) }

// Subscription is one subscriber's interest in a range of an
// AddressSpace, the analogue of struct mmu_interval_notifier. Its sequence
// count is even while no invalidation of the range runs, odd while one
// does.
//
// The fault path of a page table (the read side) is, for each page or run:
//
//	again:
//		seq := sub.ReadBegin()          // no lock held that Invalidate takes
//		pg, err := as.Resolve(addr, acc) // may populate, with ResolvePopulate
//		if err != nil {
//			if sub.ReadRetry(seq) { goto again } // raced a change
//			... the access fails ...
//		}
//		t.mu.Lock()                      // the lock Invalidate takes
//		if sub.ReadRetry(seq) {
//			t.mu.Unlock()
//			goto again
//		}
//		... install: present, writable if pg.Writable ...
//		t.mu.Unlock()
//
// Because the sequence count turns odd before Invalidate is called, and
// Invalidate clears entries under t.mu, an install either happens before
// the clear (and is cleared) or sees ReadRetry true: no stale frame
// survives an invalidation. ReadBegin waits while the count is odd, so a
// fault never resolves the old frame of a range being changed. A copy in
// flight must never wait for a fault: leave the in-flight section (the
// copy returns NotPresent) before calling ReadBegin, or an Invalidate that
// waits for copies in flight deadlocks with it.
type Subscription struct {
	as *AddressSpace
	r  Range
	n  Notifier
	// seq is the sequence count: incremented once when an invalidation
	// of the range starts (odd) and once when it ends (even).
	seq atomic.Uint64
	// listed is false once Unsubscribe has run. Guarded by as.subs.
	listed bool
}

// Subscribe registers n for invalidations of [start, start+length) (the
// end saturates at 2^64-1: Subscribe(0, math.MaxUint64, n) covers the whole
// address space, for implicit ODP). It takes only the subscription lock,
// not mu, so it may be called from a fault path; a subscription made while
// an invalidation of its range is running starts odd and becomes even when
// that invalidation ends (its Notifier is not called: it had no entries).
func (s *AddressSpace) Subscribe(start, length uint64, n Notifier) (*Subscription, error) {
	if n == nil {
		return nil, errors.New("hostmem: subscribe: nil notifier")
	}
	if length == 0 {
		return nil, errors.New("hostmem: subscribe: empty range")
	}
	if s.closed.Load() {
		return nil, ErrClosed
	}
	end := start + length
	if end < start {
		end = math.MaxUint64
	}
	sub := &Subscription{as: s, r: Range{start, end}, n: n, listed: true}
	s.subs.Lock()
	defer s.subs.Unlock()
	if inv := s.subs.active; inv != nil && !inv.ending && inv.r.Overlaps(sub.r) {
		sub.seq.Store(1)
		inv.subs = append(inv.subs, sub)
	}
	s.subs.list = append(s.subs.list, sub)
	return sub, nil
}

// Range returns the subscribed range.
func (sub *Subscription) Range() Range { return sub.r }

// ReadBegin starts a read-side critical section (mmu_interval_read_begin):
// it returns the sequence count to pass to ReadRetry, waiting first while
// an invalidation of the range is running.
func (sub *Subscription) ReadBegin() uint64 {
	if seq := sub.seq.Load(); seq&1 == 0 {
		return seq
	}
	s := sub.as
	s.subs.Lock()
	defer s.subs.Unlock()
	for {
		if seq := sub.seq.Load(); seq&1 == 0 {
			return seq
		}
		s.subs.ended.Wait()
	}
}

// ReadRetry reports whether an invalidation of the range has started since
// the ReadBegin that returned seq (mmu_interval_read_retry): the caller
// must then drop what it resolved and begin again. Call it under the lock
// the Invalidate callback takes.
func (sub *Subscription) ReadRetry(seq uint64) bool { return sub.seq.Load() != seq }

// Unsubscribe removes the subscription (mmu_interval_notifier_remove). If an
// invalidation of the range is running, it waits for it to finish, so no
// callback runs after Unsubscribe returns. It must not be called from a
// callback or with a lock held that a callback takes. A second call does
// nothing.
func (sub *Subscription) Unsubscribe() {
	s := sub.as
	s.subs.Lock()
	defer s.subs.Unlock()
	if !sub.listed {
		return
	}
	sub.listed = false
	if i := slices.Index(s.subs.list, sub); i >= 0 {
		s.subs.list = slices.Delete(s.subs.list, i, i+1)
	}
	for s.subs.active != nil && slices.Contains(s.subs.active.subs, sub) {
		s.subs.ended.Wait()
	}
}

// invalidation is one invalidation in progress.
type invalidation struct {
	r    Range
	ev   Event
	subs []*Subscription // made odd by this invalidation (guarded by as.subs)
	// ending is set once the counts are even again: a subscription made
	// after that need not wait.
	ending bool
}

// invalidateStart begins an invalidation of r: every subscription that
// overlaps r turns odd, then gets its Invalidate callback. Called with mu;
// the caller changes the range and then calls invalidateEnd.
func (s *AddressSpace) invalidateStart(r Range, ev Event) *invalidation {
	inv, _ := s.invalidateStartKeeping(r, ev, nil, false)
	return inv
}

// invalidateStartKeeping is invalidateStart that leaves keep (nil: none)
// out: its count stays even and its callback is not called. exclusive
// refuses, with ErrShared and nothing started, a range that a
// subscription other than keep overlaps (checked under the subscription
// lock, so that none is added between the check and the start).
func (s *AddressSpace) invalidateStartKeeping(r Range, ev Event, keep *Subscription, exclusive bool) (*invalidation, error) {
	inv := &invalidation{r: r, ev: ev}
	s.subs.Lock()
	if exclusive && s.subscribedBesidesLocked(r, keep) {
		s.subs.Unlock()
		return nil, ErrShared
	}
	for _, sub := range s.subs.list {
		if sub != keep && sub.r.Overlaps(r) {
			sub.seq.Add(1)
			inv.subs = append(inv.subs, sub)
		}
	}
	s.subs.active = inv
	calls := slices.Clone(inv.subs)
	s.subs.Unlock()
	for _, sub := range calls {
		sub.n.Invalidate(sub, Invalidation{Range: sub.r.Intersect(r), Event: ev, Seq: sub.seq.Load()})
	}
	s.stats.invalidations.Add(int64(len(calls)))
	return inv, nil
}

// invalidateEnd ends inv: the counts become even (ReadBegin stops
// waiting), the EndNotifiers are told, and then Unsubscribe stops waiting.
func (s *AddressSpace) invalidateEnd(inv *invalidation) {
	s.subs.Lock()
	inv.ending = true
	var ends []*Subscription
	for _, sub := range inv.subs {
		sub.seq.Add(1)
		if _, ok := sub.n.(EndNotifier); ok && sub.listed {
			ends = append(ends, sub)
		}
	}
	s.subs.ended.Broadcast()
	s.subs.Unlock()
	for _, sub := range ends {
		sub.n.(EndNotifier).InvalidateEnd(sub, Invalidation{Range: sub.r.Intersect(inv.r), Event: inv.ev, Seq: sub.seq.Load()})
	}
	s.subs.Lock()
	s.subs.active = nil
	s.subs.ended.Broadcast()
	s.subs.Unlock()
}

// ErrShared: a remap's range is also reached through another subscription
// (another ODP MR over the same pages, or an implicit ODP MR), whose
// writes the remap's dirty tracking does not see: they would be lost.
var ErrShared = errors.New("hostmem: the range is also subscribed by another ODP table")

// SubscribedBesides reports whether a subscription other than keep (nil:
// any) overlaps r.
func (s *AddressSpace) SubscribedBesides(r Range, keep *Subscription) bool {
	s.subs.Lock()
	defer s.subs.Unlock()
	return s.subscribedBesidesLocked(r, keep)
}

func (s *AddressSpace) subscribedBesidesLocked(r Range, keep *Subscription) bool {
	for _, sub := range s.subs.list {
		if sub != keep && sub.r.Overlaps(r) {
			return true
		}
	}
	return false
}
