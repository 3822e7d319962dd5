package pagetable

import (
	"sync"
	"sync/atomic"
)

// MinBudgetPages is the smallest budget NewBudget accepts: a packet may
// need two pages and a message's SGL a few more, all present at once.
const MinBudgetPages = 16

// Budget limits the pages that the on-demand tables sharing it hold
// present: a device's pin budget for ODP (the pages a NIC may have mapped
// at once). When a fault would exceed it, pages are evicted through the
// invalidation path (clear, then wait for copies in flight), chosen by a
// clock (second chance) over the pages in the order they were faulted in:
// a page whose Accessed bit is set has it cleared and is passed over once,
// an approximation of least recently used, as the kernel's reclaim ages
// pages by their accessed bits.
//
// A Budget is safe for concurrent use.
type Budget struct {
	limit     int64 // pages; 0: unlimited (pages are still counted)
	present   atomic.Int64
	peak      atomic.Int64
	evictions atomic.Int64

	mu   sync.Mutex
	ring []pageRef // clock: pages in fault order; t nil: dropped
	hand int       // next reference the clock looks at
	dead int       // dropped references in ring
	// evictMu serializes reservations that may evict, so that two faults
	// over the budget do not both evict for the same shortfall and the
	// pages present never exceed the limit.
	evictMu sync.Mutex
}

type pageRef struct {
	t  *ODP
	pg uint64
}

// NewBudget returns a budget of limit bytes (rounded down to pages; 0:
// unlimited, only counting). A positive limit below MinBudgetPages pages
// is raised to it.
func NewBudget(limit int64) *Budget {
	pages := limit >> PageShift
	if limit > 0 && pages < MinBudgetPages {
		pages = MinBudgetPages
	}
	return &Budget{limit: pages}
}

// Limit returns the budget in pages (0: unlimited).
func (b *Budget) Limit() int64 { return b.limit }

// Present returns the pages present (or reserved by faults in progress).
func (b *Budget) Present() int64 { return b.present.Load() }

// Peak returns the most pages ever present at once.
func (b *Budget) Peak() int64 { return b.peak.Load() }

// Evictions returns the pages evicted so far.
func (b *Budget) Evictions() int64 { return b.evictions.Load() }

// reserve counts n pages about to be faulted in, evicting others first if
// the budget would be exceeded.
func (b *Budget) reserve(n int64) {
	if b.limit > 0 {
		b.evictMu.Lock()
		if over := b.present.Load() + n - b.limit; over > 0 {
			b.evictLocked(over)
		}
	}
	p := b.present.Add(n)
	if b.limit > 0 {
		b.evictMu.Unlock()
	}
	for {
		pk := b.peak.Load()
		if p <= pk || b.peak.CompareAndSwap(pk, p) {
			break
		}
	}
}

// unreserve returns pages reserved but not installed.
func (b *Budget) unreserve(n int64) { b.present.Add(-n) }

// release returns pages cleared from tables.
func (b *Budget) release(n int64) { b.present.Add(-n) }

// enqueue puts a page just made present on the clock. Called with t.mu.
func (b *Budget) enqueue(t *ODP, pg uint64) {
	b.mu.Lock()
	b.ring = append(b.ring, pageRef{t, pg})
	b.mu.Unlock()
}

// forget drops the pages of a released table from the clock.
func (b *Budget) forget(t *ODP) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.ring {
		if b.ring[i].t == t {
			b.ring[i].t = nil
			b.dead++
		}
	}
	b.compact()
}

// evictLocked clears at least want pages (fewer if not enough are
// present). Called with evictMu, which serializes evictions and
// reservations of a limited budget.
func (b *Budget) evictLocked(want int64) {
	victims := b.pick(want)
	// Clear per table, in runs of consecutive pages.
	for i := 0; i < len(victims); {
		j := i + 1
		for j < len(victims) && victims[j].t == victims[i].t && victims[j].pg == victims[j-1].pg+1 {
			j++
		}
		n := victims[i].t.clear(victims[i].pg, uint64(j-i), true)
		b.evictions.Add(int64(n))
		i = j
	}
}

// pick chooses want victims with the clock and takes them off the ring.
// The hand sweeps the pages in the order they were faulted in: a page
// whose Accessed bit is set loses the bit and is passed over; the first
// page without it is a victim. References to pages no longer present
// (invalidated since) are dropped as the hand passes them.
func (b *Budget) pick(want int64) []pageRef {
	b.mu.Lock()
	defer b.mu.Unlock()
	var victims []pageRef
	// Two full turns at most: the first may only clear Accessed bits.
	for turns := 2 * len(b.ring); turns > 0 && int64(len(victims)) < want; turns-- {
		if b.hand >= len(b.ring) {
			b.hand = 0
		}
		r := &b.ring[b.hand]
		b.hand++
		if r.t == nil {
			continue
		}
		e := r.t.entry(r.pg)
		f := Flags(e.flags.Load())
		switch {
		case f&Present == 0:
			e.flags.And(^uint32(inRing))
			r.t = nil
			b.dead++
		case f&Accessed != 0:
			e.flags.And(^uint32(Accessed))
		default:
			victims = append(victims, *r)
			e.flags.And(^uint32(inRing))
			r.t = nil
			b.dead++
		}
	}
	b.compact()
	return victims
}

// compact removes the dropped references once they are half the ring,
// keeping the order and the hand's place. Called with mu.
func (b *Budget) compact() {
	if b.dead == 0 || b.dead < len(b.ring)/2 {
		return
	}
	out, hand := b.ring[:0], 0
	for i, r := range b.ring {
		if i == b.hand {
			hand = len(out)
		}
		if r.t != nil {
			out = append(out, r)
		}
	}
	if b.hand >= len(b.ring) {
		hand = len(out)
	}
	clear(b.ring[len(out):])
	b.ring, b.hand, b.dead = out, hand, 0
}
