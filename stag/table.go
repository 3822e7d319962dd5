package stag

import (
	"errors"
	"sync"
	"sync/atomic"
)

// Errors of the control path (registration, invalidation). The data path
// returns a Reason instead.
var (
	ErrNoEntry   = errors.New("stag: no such entry")
	ErrTableFull = errors.New("stag: table full")
	ErrState     = errors.New("stag: entry in the wrong state")
)

// Entry is one registered object: an MR today, a memory window later. Every
// field but the state and the in-flight count is fixed when the entry is
// allocated; a new registration of the same index gets a new Entry, so a
// reader that holds an old *Entry always sees a consistent old registration
// whose state is Free.
type Entry[V any] struct {
	STag   STag   // index and key; equal to the key a lookup must present
	PD     uint32 // protection domain that owns the entry (IBTA 10.2.3)
	IOVA   uint64 // I/O virtual address of the first byte
	Length uint64 // bytes covered, starting at IOVA
	Access Access // rights granted
	Value  V      // what the layer above hangs on the entry (placement: *MR)

	state atomic.Uint32 // State

	// refs counts placements in flight (see Table.Acquire). The
	// deregistration path invalidates the entry and then waits in Drain
	// until refs is zero.
	refs atomic.Int64
	// waiter is set by Drain; Release signals it when refs reaches zero.
	waiter atomic.Pointer[chan struct{}]
}

// State returns the entry's current state.
func (e *Entry[V]) State() State { return State(e.state.Load()) }

// CheckRange reports OutOfBounds unless [iova, iova+n) lies inside the
// entry. It is written so that no sum can overflow (rxe mr_check_range):
// iova < base, n > length, or iova-base > length-n. A zero-length range is
// inside if iova is in [base, base+length].
func (e *Entry[V]) CheckRange(iova, n uint64) Reason {
	if iova < e.IOVA || n > e.Length || iova-e.IOVA > e.Length-n {
		return OutOfBounds
	}
	return OK
}

// Release drops a reference taken by Table.Acquire.
func (e *Entry[V]) Release() {
	if e.refs.Add(-1) == 0 {
		if c := e.waiter.Load(); c != nil {
			select {
			case *c <- struct{}{}:
			default: // a wake-up is already pending
			}
		}
	}
}

// Refs returns the number of placements in flight.
func (e *Entry[V]) Refs() int64 { return e.refs.Load() }

// Drain blocks until no placement holds a reference to the entry. Call it
// after Invalidate: from then on every Acquire fails, so the count only
// falls. A reference may be held across the packets of a message (a
// placement cursor), so Drain lasts until the transport ends that message.
// One goroutine at a time may drain an entry.
func (e *Entry[V]) Drain() {
	if e.refs.Load() == 0 {
		return
	}
	c := make(chan struct{}, 1)
	e.waiter.Store(&c)
	// Release decrements and then loads waiter; we store waiter and then
	// load refs. Go's atomics are sequentially consistent, so at least one
	// side sees the other: no wake-up is lost.
	for e.refs.Load() != 0 {
		<-c
	}
	e.waiter.Store(nil)
}

// chunkBits sizes the second level of the table: 1024 entry pointers per
// chunk. Growing the table copies only the first level, and a chunk never
// moves, so the lock-free lookup needs no retry.
const chunkBits = 10

type chunk[V any] [1 << chunkBits]atomic.Pointer[Entry[V]]

type directory[V any] struct {
	chunks []*chunk[V]
}

// Table is one device's STag index space, shared by all its PDs like rxe's
// MR pool: the PD is recorded in each entry and checked by Lookup.
//
// Lookup and Acquire are lock-free and allocate nothing; they may run
// concurrently with everything else. Alloc, Validate, Invalidate and Free
// take a mutex. The zero Table is not usable; call NewTable.
type Table[V any] struct {
	dir atomic.Pointer[directory[V]]

	mu struct {
		sync.Mutex
		max      uint32   // highest index that may be handed out
		next     uint32   // lowest index never handed out
		free     []uint32 // freed indices, reused first-in first-out
		freeHead int      // free[freeHead:] is the queue
		keys     []uint8  // keys[i]: key of the last registration of index i
		live     int      // allocated entries
	}
}

// NewTable returns an empty table whose indices run from 1 to max (max 0 or
// above MaxIndex means MaxIndex). Index 0 is never handed out, so the
// all-zero key never resolves.
func NewTable[V any](max uint32) *Table[V] {
	if max == 0 || max > MaxIndex {
		max = MaxIndex
	}
	t := &Table[V]{}
	t.mu.max = max
	t.mu.next = 1
	t.dir.Store(&directory[V]{})
	return t
}

// slot returns the slot of index i, or nil if the table has not grown that
// far.
func (t *Table[V]) slot(i uint32) *atomic.Pointer[Entry[V]] {
	d := t.dir.Load()
	c := i >> chunkBits
	if c >= uint32(len(d.chunks)) {
		return nil
	}
	return &d.chunks[c][i&(1<<chunkBits-1)]
}

// Lookup validates key for an access by a QP of protection domain pd that
// needs the rights in need, making exactly the four checks of rxe's
// lookup_mr: the key matches, the PD matches, the rights are granted, the
// entry is valid. It does not check bounds (Entry.CheckRange) and takes no
// reference: use Acquire when bytes will be placed.
func (t *Table[V]) Lookup(pd uint32, key STag, need Access) (*Entry[V], Reason) {
	s := t.slot(key.Index())
	if s == nil {
		return nil, NoEntry
	}
	e := s.Load()
	if e == nil {
		return nil, NoEntry
	}
	if e.STag != key {
		return nil, KeyMismatch
	}
	if e.PD != pd {
		return nil, PDMismatch
	}
	if e.Access&need != need {
		return nil, AccessDenied
	}
	switch State(e.state.Load()) {
	case StateValid:
		return e, OK
	case StateFree:
		return nil, NoEntry
	}
	return nil, Invalid
}

// Acquire is Lookup plus a reference that keeps the entry's memory in place
// until Release: deregistration invalidates the entry, then drains the
// references. The count is raised before the state is checked again, so an
// Acquire that races an Invalidate either fails or is waited for.
func (t *Table[V]) Acquire(pd uint32, key STag, need Access) (*Entry[V], Reason) {
	e, r := t.Lookup(pd, key, need)
	if r != OK {
		return nil, r
	}
	e.refs.Add(1)
	if State(e.state.Load()) != StateValid {
		e.Release()
		return nil, Invalid
	}
	return e, OK
}

// Get returns the entry that key names, in any state but free, or nil. It is
// for the control path; it checks neither PD nor access.
func (t *Table[V]) Get(key STag) *Entry[V] {
	s := t.slot(key.Index())
	if s == nil {
		return nil
	}
	e := s.Load()
	if e == nil || e.STag != key || e.State() == StateFree {
		return nil
	}
	return e
}

// Alloc takes an index, rolls its key and publishes a new entry in state
// Invalid, so that the caller can finish building value (which may need the
// STag) before Validate makes the entry usable, as a fast-registration MR
// sits invalid until its REG_MR work request. Indices are reused first-in
// first-out, so a freed index (and its previous key) comes back as late as
// possible.
func (t *Table[V]) Alloc(pd uint32, iova, length uint64, access Access, value V) (*Entry[V], error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var idx uint32
	switch {
	case t.mu.freeHead < len(t.mu.free):
		idx = t.mu.free[t.mu.freeHead]
		t.mu.freeHead++
		if h := t.mu.freeHead; h == len(t.mu.free) {
			t.mu.free, t.mu.freeHead = t.mu.free[:0], 0
		} else if h >= 1024 && h > len(t.mu.free)/2 {
			// Keep the queue's array from growing without bound
			// when it never empties.
			n := copy(t.mu.free, t.mu.free[h:])
			t.mu.free, t.mu.freeHead = t.mu.free[:n], 0
		}
	case t.mu.next <= t.mu.max:
		idx = t.mu.next
		t.mu.next++
		t.grow(idx)
	default:
		return nil, ErrTableFull
	}
	// The key of an index steps by one on every registration (mod 256);
	// the first registration of an index gets key 1. rxe draws a random key
	// different from the last one; both make a stale key miss until the
	// index has been registered 256 more times.
	t.mu.keys[idx]++
	e := &Entry[V]{
		STag:   Make(idx, t.mu.keys[idx]),
		PD:     pd,
		IOVA:   iova,
		Length: length,
		Access: access,
		Value:  value,
	}
	e.state.Store(uint32(StateInvalid))
	t.slot(idx).Store(e)
	t.mu.live++
	return e, nil
}

// grow makes sure index i has a slot and a key byte. Called with mu held.
func (t *Table[V]) grow(i uint32) {
	for uint32(len(t.mu.keys)) <= i {
		t.mu.keys = append(t.mu.keys, 0)
	}
	d := t.dir.Load()
	c := int(i >> chunkBits)
	if c < len(d.chunks) {
		return
	}
	chunks := make([]*chunk[V], c+1)
	copy(chunks, d.chunks)
	for j := len(d.chunks); j <= c; j++ {
		chunks[j] = new(chunk[V])
	}
	t.dir.Store(&directory[V]{chunks: chunks})
}

// entry returns the live entry for key. Called with mu held.
func (t *Table[V]) entry(key STag) (*Entry[V], error) {
	s := t.slot(key.Index())
	if s == nil {
		return nil, ErrNoEntry
	}
	e := s.Load()
	if e == nil || e.STag != key {
		return nil, ErrNoEntry
	}
	return e, nil
}

// Validate moves an entry from Invalid to Valid.
func (t *Table[V]) Validate(key STag) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, err := t.entry(key)
	if err != nil {
		return err
	}
	if !e.state.CompareAndSwap(uint32(StateInvalid), uint32(StateValid)) {
		return ErrState
	}
	return nil
}

// Invalidate moves an entry from Valid to Invalid: every later Lookup and
// Acquire fails. Placements already holding a reference continue; see
// Entry.Drain. Invalidating an invalid entry is not an error.
func (t *Table[V]) Invalidate(key STag) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, err := t.entry(key)
	if err != nil {
		return err
	}
	e.state.Store(uint32(StateInvalid))
	return nil
}

// Free releases the entry's index for reuse under a new key. The entry's
// state becomes Free, so a reader that still holds the *Entry fails its
// state check. Callers that place bytes through the entry Invalidate and
// Drain it first.
func (t *Table[V]) Free(key STag) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, err := t.entry(key)
	if err != nil {
		return err
	}
	e.state.Store(uint32(StateFree))
	t.slot(key.Index()).Store(nil)
	t.mu.free = append(t.mu.free, key.Index())
	t.mu.live--
	return nil
}

// Len returns the number of allocated (not freed) entries.
func (t *Table[V]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mu.live
}
