package stag

import (
	"sync"
	"sync/atomic"
)

// Reader is a goroutine that uses the table without counting references,
// the quiescent-state-based flavour of RCU (liburcu's urcu-qsbr). A Span
// bound to a Reader (Span.Bind) takes no reference when it is opened and
// drops none when it is closed; the reader is online from its first use
// after a quiescent state until it calls Quiesce, and everything it found
// in the table while online (entries, linear mappings, the memory behind
// them) stays usable until then. A writer that must know that nobody still
// uses what a slot held before it changed waits for a grace period
// (Table.Synchronize): until every reader that was online has quiesced.
//
// The owner must call Quiesce regularly, and always before it blocks: a
// receive loop calls it after each batch of packets. A reader that stays
// online holds up every deregistration. Going online and quiescing are one
// atomic store each, so a batch of messages costs two atomic operations
// instead of two per message; the point is that the store after a copy (a
// locked instruction on amd64) waits until the copy's stores have drained.
//
// A Reader is used by one goroutine; NewReader and Close are the only
// calls that may come from elsewhere (Close must still not race with the
// owner's use).
type Reader struct {
	// state is written by the owner only: bit 0 is set while online, and
	// the rest counts quiescent states, so a writer that saw the reader
	// online at state s knows it has quiesced once state != s.
	state atomic.Uint64
	// online is the owner's copy of bit 0 of state (no atomic needed to
	// read it).
	online bool
	// waiting is set by Synchronize while it waits for this reader;
	// Quiesce then signals wake.
	waiting atomic.Bool
	wake    chan struct{}
	reg     *readers
}

// readers is a table's registry of readers.
type readers struct {
	// mu guards list and is held by Synchronize for a whole grace period,
	// so one grace period runs at a time (and waiting has one waiter).
	mu   sync.Mutex
	list []*Reader
}

// NewReader registers a reader of the table. It starts offline.
func (t *Table[V]) NewReader() *Reader {
	r := &Reader{wake: make(chan struct{}, 1), reg: &t.rd}
	t.rd.mu.Lock()
	t.rd.list = append(t.rd.list, r)
	t.rd.mu.Unlock()
	return r
}

// Close quiesces the reader and unregisters it. Spans bound to it must not
// be used afterwards.
func (r *Reader) Close() {
	r.Quiesce()
	r.reg.mu.Lock()
	defer r.reg.mu.Unlock()
	for i, x := range r.reg.list {
		if x == r {
			r.reg.list = append(r.reg.list[:i], r.reg.list[i+1:]...)
			return
		}
	}
}

// Enter puts the reader online if it is not already. The data path does it
// by itself (Table.Open, Span.Refresh); a reader that reads slots by other
// means (Table.LookupRange) calls it first.
func (r *Reader) Enter() {
	if !r.online {
		r.enter()
	}
}

// enter is the atomic half of Enter. The store is sequentially consistent:
// it comes before every later load of a slot, so a writer that changes a
// slot either sees the reader online (and waits for it) or is seen.
func (r *Reader) enter() {
	r.state.Store(r.state.Load() | 1)
	r.online = true
}

// Quiesce declares a quiescent state: the reader no longer uses anything it
// found in the table, and goes offline until its next use. Quiescing an
// offline reader does nothing.
func (r *Reader) Quiesce() {
	if !r.online {
		return
	}
	r.online = false
	r.state.Store(r.state.Load()&^1 + 2)
	if r.waiting.Load() {
		select {
		case r.wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// QuiesceIfWaited is Quiesce when a writer waits in Synchronize for this
// reader, and nothing (one load) otherwise. A receive loop calls it
// between the packets of a batch, so that a grace period lasts until the
// packet in progress is done rather than until the batch is (a batch of
// GRO buffers can hold a megabyte of payload: some 100 µs of copying).
// The reader goes online again at its next use, as after any Quiesce, and
// a Span bound to it refreshes (Span.Current is false while the reader is
// offline).
func (r *Reader) QuiesceIfWaited() {
	if r.online && r.waiting.Load() {
		r.Quiesce()
	}
}

// Synchronize waits for a grace period: every reader that is online when it
// is called has quiesced (or closed) when it returns. A writer calls it
// after changing slots (Invalidate, ClearLinear, Free) and before it
// reclaims what the old contents referred to: afterwards no reader still
// uses them, and every reader sees the new contents.
func (t *Table[V]) Synchronize() {
	t.rd.mu.Lock()
	defer t.rd.mu.Unlock()
	for _, r := range t.rd.list {
		s := r.state.Load()
		if s&1 == 0 {
			continue // offline: its next use will see the change
		}
		// Quiesce stores state and then loads waiting; we store waiting
		// and then load state. Go's atomics are sequentially consistent,
		// so no wake-up is lost.
		r.waiting.Store(true)
		spinUntilChanged(&r.state, s, syncSpins)
		for r.state.Load() == s {
			<-r.wake
		}
		r.waiting.Store(false)
	}
}

// Bind makes the Span use reader r instead of counted references (nil:
// counted references again). The Span must hold nothing, and be used only
// by r's goroutine from then on.
func (sp *Span[V]) Bind(r *Reader) {
	if sp.Entry != nil {
		panic("stag: Bind on a Span that holds an entry")
	}
	sp.rd = r
}

// syncSpins bounds how long Synchronize polls a reader before it sleeps on
// the reader's wake-up: 16384 polls, about 25-30 µs here. A receive loop asked
// for a quiescent state answers after the packet in progress
// (QuiesceIfWaited), a few µs; waking a parked goroutine costs as much
// again, and more on a busy machine. The bound is a count, not a clock, so
// that the poll also ends in a testing/synctest bubble, whose clock stands
// still while a goroutine runs.
const syncSpins = 1 << 14

// spinUntilChanged polls v until it differs from old, at most n times.
func spinUntilChanged(v *atomic.Uint64, old uint64, n int) {
	for i := 0; i < n && v.Load() == old; i++ {
	}
}
