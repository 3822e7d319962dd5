package stag

import (
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Errors of the control path (registration, invalidation). The data path
// returns a Reason instead.
var (
	ErrNoEntry   = errors.New("stag: no such entry")
	ErrTableFull = errors.New("stag: table full")
	ErrState     = errors.New("stag: entry in the wrong state")
	ErrRange     = errors.New("stag: range wraps the address space")
)

// Entry is one registered object: a memory region or a memory window. Every
// field but the state and the in-flight count is fixed when the entry is
// allocated; a new registration of the same index gets a new Entry, so a
// reader that holds an old *Entry always sees a consistent old registration
// whose state is Free.
//
// The data path does not read an Entry's fields: it reads the copy that the
// table keeps in the index's slot (see Table), and touches the Entry only
// for its in-flight count.
type Entry[V any] struct {
	// refs counts placements in flight (see Table.Acquire). The
	// deregistration path invalidates the entry and then waits in Drain
	// until refs is zero. It is the only word of an Entry that the data
	// path writes, and it is first so that it shares no cache line with
	// the slot the lookups read.
	refs atomic.Int64

	STag   STag   // index and key; equal to the key a lookup must present
	PD     uint32 // protection domain that owns the entry (IBTA 10.2.3)
	IOVA   uint64 // I/O virtual address of the first byte
	Length uint64 // bytes covered, starting at IOVA
	Access Access // rights granted
	Value  V      // what the layer above hangs on the entry (placement: *MR)
	// Target is set when the entry is a memory window bound to a region:
	// the region's entry, whose slot every access through the window then
	// uses (its state, suspension, linear mapping and reference count; see
	// Table.Rekey). nil for a region and for an unbound window.
	Target *Entry[V]
	// QP is the QP a type 2 window is bound to (IBTA 10.6.7.2): only a
	// Span whose QP it is may open the window. 0: any QP of the PD.
	QP uint32

	state atomic.Uint32 // State
	// waiter is set by Drain; Release signals it when refs reaches zero.
	waiter atomic.Pointer[chan struct{}]
	// turn lets one Drain at a time use waiter: a one-slot channel,
	// made by the first Drain that has to wait.
	turn atomic.Pointer[chan struct{}]
}

// drainTurn returns the entry's one-slot channel of drainers.
func (e *Entry[V]) drainTurn() chan struct{} {
	if p := e.turn.Load(); p != nil {
		return *p
	}
	c := make(chan struct{}, 1)
	if e.turn.CompareAndSwap(nil, &c) {
		return c
	}
	return *e.turn.Load()
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

// Release drops a reference taken by Table.Acquire (a Span drops its own
// in Close).
func (e *Entry[V]) Release() {
	if e.refs.Add(-1) == 0 {
		e.wake()
	}
}

// wake signals a drainer, if there is one. It is kept out of Release so that
// Release inlines (and small, so that it inlines into Release, which then
// still inlines into Span.Close).
func (e *Entry[V]) wake() {
	if c := e.waiter.Load(); c != nil {
		select {
		case *c <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// Refs returns the number of placements in flight.
func (e *Entry[V]) Refs() int64 { return e.refs.Load() }

// Drain blocks until no placement holds a reference to the entry. Call it
// after Invalidate (or after any change of the entry's slot whose old
// contents must no longer be in use, such as ClearLinear before the memory
// behind the linear mapping moves): from then on every acquire fails or
// sees the new contents, so the count of the old users only falls. A
// reference may be held across the packets of a message (a placement
// cursor), so Drain lasts until the transport ends that message. Several
// goroutines may drain an entry at once (a deregistration, a suspension and
// the invalidation of a window on the region): they take turns.
func (e *Entry[V]) Drain() {
	if e.refs.Load() == 0 {
		return
	}
	turn := e.drainTurn()
	turn <- struct{}{} // a channel rather than a mutex: testing/synctest sees the wait
	defer func() { <-turn }()
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

// The control word of a slot (slot.ctl):
//
//	bits  0-31  the rights granted (Access)
//	bit  32     the entry is valid (state StateValid)
//	bit  33     linear mapping usable for accesses that read memory
//	bit  34     linear mapping usable for accesses that write memory
//	bit  35     placement suspended: accesses that write memory fail with
//	            Suspended (the linear-write bit is withdrawn meanwhile)
//	bit  36     the linear mapping is writable once the suspension ends
//	bits 37-63  sequence count: odd while a writer changes the slot
//
// Rights and flags sit in one word so that one AND and one compare check
// the access rights, the state and the linear mapping; the sequence count
// sits in the same word so that one load both checks them and versions the
// snapshot (a seqlock: Linux's seqcount_t, as mmu_interval_notifier's
// sequence count). While a writer works the word holds an odd count and no
// rights or flags, so a fast check read then fails by itself.
const (
	ctlValid       = 1 << 32
	ctlLinearRead  = 1 << 33
	ctlLinearWrite = 1 << 34
	ctlSuspended   = 1 << 35
	ctlResumeWrite = 1 << 36
	ctlSeqShift    = 37
	ctlSeqOne      = 1 << ctlSeqShift
	ctlFlagsMask   = ctlSeqOne - 1 // rights and flags
)

// slot is the hot part of one index: what a lookup, the bounds check and a
// linear translation read, in one 64-byte cache line, like the memory key
// context of a hardware NIC (mlx5's mkc: key, PD, access bits, start
// address, length, "free" bit and access mode; a linear mapping is its
// physical-address mode). Every word is an atomic; a reader takes a
// consistent snapshot by reading ctl before and after the other words
// (seqlock). Writers hold the table's mutex.
type slot[V any] struct {
	ctl    atomic.Uint64 // see the ctl layout above
	keyPD  atomic.Uint64 // PD<<32 | STag; 0 when free
	iova   atomic.Uint64 // Entry.IOVA
	length atomic.Uint64 // Entry.Length
	// linear is the NIC-side address of the byte at iova when
	// [iova, iova+length) maps linearly onto NIC-side memory (a pinned
	// region whose frames form one contiguous run): a range then
	// translates by an offset. Meaningful only with a linear ctl bit.
	linear atomic.Pointer[byte]
	entry  atomic.Pointer[Entry[V]] // nil when free
	_      [16]byte                 // pad to a cache line
}

// snapshot is a consistent copy of a slot.
type snapshot[V any] struct {
	ctl, keyPD, iova, length uint64
	linear                   *byte
	entry                    *Entry[V]
}

// read fills sn with a consistent snapshot, waiting out a writer in
// progress (writers hold the table's mutex for a few stores). It fills sn
// through a pointer, field by field: a snapshot returned by value is
// spilled with 8-byte stores and copied with 16-byte loads, which cannot be
// forwarded from them and stall (some 20 ns for the three).
func (s *slot[V]) read(sn *snapshot[V]) {
	for spins := 0; ; spins++ {
		c := s.ctl.Load()
		if c&ctlSeqOne == 0 {
			kp, base, length := s.keyPD.Load(), s.iova.Load(), s.length.Load()
			lin, ent := s.linear.Load(), s.entry.Load()
			if s.ctl.Load() == c {
				sn.ctl, sn.keyPD, sn.iova, sn.length = c, kp, base, length
				sn.linear, sn.entry = lin, ent
				return
			}
		}
		if spins > 100 {
			runtime.Gosched()
		}
	}
}

// check makes the four checks of rxe's lookup_mr on a snapshot, in its
// order, and then the bounds check; n is ignored when bounds is false.
func (sn *snapshot[V]) check(pd uint32, key STag, need Access, bounds bool, iova, n uint64) Reason {
	switch {
	case sn.entry == nil:
		return NoEntry
	case STag(sn.keyPD) != key:
		return KeyMismatch
	case uint32(sn.keyPD>>32) != pd:
		return PDMismatch
	case sn.entry.Target != nil && (need&AccessRemote == 0 || sn.entry.QP != 0):
		// A memory window grants remote access only (IBTA 10.6.7: it is
		// named by an R_Key, never an L_Key); a type 2 window only to its
		// QP, which only Open knows (openWindow checks it).
		if need&AccessRemote == 0 {
			return AccessDenied
		}
		return QPMismatch
	case Access(sn.ctl)&need != need:
		return AccessDenied
	case sn.ctl&ctlValid == 0:
		return Invalid
	case sn.ctl&ctlSuspended != 0 && need&writeRights != 0:
		return Suspended
	case bounds && (iova < sn.iova || n > sn.length || iova-sn.iova > sn.length-n):
		return OutOfBounds
	}
	return OK
}

// base returns the NIC-side address of iova, which with n the caller has
// checked to lie inside the slot, when the snapshot maps linearly for the
// access (write: the access writes memory); nil otherwise, and for n 0.
func (sn *snapshot[V]) base(iova, n uint64, write bool) *byte {
	lin := uint64(ctlLinearRead)
	if write {
		lin = ctlLinearWrite
	}
	if sn.ctl&lin == 0 || n == 0 {
		return nil
	}
	return (*byte)(unsafe.Add(unsafe.Pointer(sn.linear), iova-sn.iova))
}

// bytes is base as a slice of n bytes (nil when base is nil).
func (sn *snapshot[V]) bytes(iova, n uint64, write bool) []byte {
	if p := sn.base(iova, n, write); p != nil {
		return unsafe.Slice(p, n)
	}
	return nil
}

// beginWrite starts a change of the slot: the count becomes odd and the
// rights and flags are cleared, so that fast checks fail and snapshots wait.
// Called with the table's mutex held.
func (s *slot[V]) beginWrite() uint64 {
	seq := s.ctl.Load() &^ ctlFlagsMask
	s.ctl.Store(seq + ctlSeqOne)
	return seq
}

// endWrite publishes the change begun by beginWrite with new rights and
// flags.
func (s *slot[V]) endWrite(seq, flags uint64) {
	s.ctl.Store(seq + 2*ctlSeqOne | flags)
}

// setFlags changes the rights and flags alone (one store: no odd phase is
// needed) and bumps the count.
func (s *slot[V]) setFlags(flags uint64) {
	c := s.ctl.Load()
	s.ctl.Store(c&^ctlFlagsMask + 2*ctlSeqOne | flags)
}

// chunkBits sizes the second level of the table: 1024 slots (64 KiB) per
// chunk. The first level is a fixed array in the Table that covers the
// whole 24-bit index space, so a lookup is two dependent loads from the
// table (directory word, then the slot's cache line), with no bounds check
// and no directory pointer to chase. Chunks are allocated on first use and
// never move or go away.
const chunkBits = 10

type chunk[V any] [1 << chunkBits]slot[V]

// Table is one device's STag index space, shared by all its PDs like rxe's
// MR pool: the PD is recorded in each entry and checked by Lookup.
//
// Each index has a slot holding a copy of its entry's key, PD, rights,
// state, range and optional linear mapping (see SetLinear), versioned by a
// sequence count, so that the data path checks a key and translates a
// range by reading one cache line. Readers (Lookup, Acquire, LookupRange,
// Open, Span.Current) are lock-free and allocate nothing; they may
// run concurrently with everything else. Alloc, Validate, Invalidate,
// SetLinear, ClearLinear and Free take a mutex, and every change of a slot
// bumps its sequence count, which makes the holder of a Span check again.
//
// The zero Table is not usable; call NewTable, or Init.
type Table[V any] struct {
	dir [1 << (IndexBits - chunkBits)]atomic.Pointer[chunk[V]]

	rd readers // readers that use the table without counting (Reader)

	// none is a free slot that is never written: what the fast paths
	// (Lookup, Acquire, LookupRange, Open) read for a key whose chunk does
	// not exist yet, and fail on as on any free slot. It is there for the
	// code the compiler makes: a slot pointer that is either &c[i] or &none
	// is one register, and each atomic load of a field is then one
	// MOVQ off(reg). With &c[i] alone the compiler folds each field's
	// offset into an indexed address (chunk + index + offset), which an
	// atomic load cannot take, and computes every field's address with
	// LEAQs of its own: more registers live, spills, and about a dozen
	// instructions more on LookupRange's fast path (twenty on Open's).
	none slot[V]

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
	t := &Table[V]{}
	t.Init(max)
	return t
}

// Init prepares a zero Table, as NewTable does, for a table embedded in
// another struct (one dependent load less on every lookup).
func (t *Table[V]) Init(max uint32) {
	if max == 0 || max > MaxIndex {
		max = MaxIndex
	}
	t.mu.max = max
	t.mu.next = 1
}

// slot returns the slot of key's index, or nil if no chunk holds it yet.
// The shifts keep both indices in range, so there is no bounds check.
func (t *Table[V]) slot(key STag) *slot[V] {
	c := t.dir[uint32(key)>>(KeyBits+chunkBits)].Load()
	if c == nil {
		return nil
	}
	return &c[uint32(key)>>KeyBits&(1<<chunkBits-1)]
}

// Lookup validates key for an access by a QP of protection domain pd that
// needs the rights in need, making exactly the four checks of rxe's
// lookup_mr: the key matches, the PD matches, the rights are granted, the
// entry is valid. It does not check bounds (Entry.CheckRange) and takes no
// reference: use Acquire when bytes will be placed.
func (t *Table[V]) Lookup(pd uint32, key STag, need Access) (*Entry[V], Reason) {
	// Fast path: the slot's key, PD, rights and state in one test,
	// confirmed by a second load of ctl.
	s := &t.none // see none
	if c := t.dir[uint32(key)>>(KeyBits+chunkBits)].Load(); c != nil {
		s = &c[uint32(key)>>KeyBits&(1<<chunkBits-1)]
	}
	ctl, want := s.ctl.Load(), uint64(need)|rightRegion|ctlValid
	if (ctl&want^want)|ctl&suspendedFor(need)|(s.keyPD.Load()^(uint64(pd)<<32|uint64(key))) == 0 {
		if ent := s.entry.Load(); s.ctl.Load() == ctl {
			return ent, OK
		}
	}
	s = t.slot(key)
	if s == nil {
		return nil, NoEntry
	}
	var sn snapshot[V]
	s.read(&sn)
	if r := sn.check(pd, key, need, false, 0, 0); r != OK {
		return nil, r
	}
	return sn.entry, OK
}

// writeRights are the rights whose accesses write memory: an access that
// needs one of them may use only a linear mapping made for writing.
const writeRights = AccessLocalWrite | AccessRemoteWrite | AccessRemoteAtomic

// fastWant is what the fast paths require of a slot's ctl word: the rights,
// the valid bit and the linear mapping for the access. Written as an
// addition (ctlLinearRead becomes ctlLinearWrite), the choice compiles to
// a conditional move rather than a branch.
func fastWant(need Access) uint64 {
	want := uint64(need) | rightRegion | ctlValid | ctlLinearRead
	if need&writeRights != 0 {
		want += ctlLinearWrite - ctlLinearRead
	}
	return want
}

// suspendedFor is the ctl bit that refuses an access on the fast paths
// that require no linear mapping (Lookup, Acquire): the suspended bit for
// an access that writes memory, nothing otherwise. (The fast paths that
// require one need no such test: a suspension withdraws the linear-write
// bit.)
func suspendedFor(need Access) uint64 {
	if need&writeRights != 0 {
		return ctlSuspended
	}
	return 0
}

// rightRegion is an internal right in every region's slot (Alloc) and in no
// window's (Rekey with a target): the fast paths require it, so that a
// memory window, whose checks need the entry (remote only, its QP, its
// target), always takes the slow path. It costs nothing: it folds into the
// constant the fast paths compare with.
const rightRegion = 1 << 31

// The fast paths check bounds with two compares, n-1 < length and
// iova-base <= length-n. For n > 0 that is exact as long as the slot's
// range does not wrap the address space (Alloc refuses ranges that do):
// iova < base makes iova-base wrap to at least 2^64-base >= length. n == 0
// fails the first compare and takes the slow path.

// LookupRange is Lookup plus the bounds check of [iova, iova+n) and, when
// the entry maps linearly for the access (for writing if need has a right
// that writes memory), the translation of the range: b is its NIC-side
// bytes. b is nil when the range must be translated through the entry's
// own table instead (or n is 0). It takes no reference: the bytes may be
// used only while something else keeps the entry registered. It allocates
// nothing.
func (t *Table[V]) LookupRange(pd uint32, key STag, need Access, iova, n uint64) (b []byte, e *Entry[V], r Reason) {
	// Fast path: a valid entry that maps linearly for the access. One
	// read of the slot's cache line, one test for key, PD, rights, state
	// and mapping, two compares for the bounds, and a second load of ctl
	// to confirm that no writer ran meanwhile. Everything else takes the
	// slow path, which also says which check failed.
	s := &t.none // see none
	if c := t.dir[uint32(key)>>(KeyBits+chunkBits)].Load(); c != nil {
		s = &c[uint32(key)>>KeyBits&(1<<chunkBits-1)]
	}
	ctl, want := s.ctl.Load(), fastWant(need)
	if (ctl&want^want)|(s.keyPD.Load()^(uint64(pd)<<32|uint64(key))) == 0 {
		base, length := s.iova.Load(), s.length.Load()
		if off := iova - base; n-1 < length && off <= length-n {
			lin, ent := s.linear.Load(), s.entry.Load()
			if s.ctl.Load() == ctl {
				return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(lin), off)), n), ent, OK
			}
		}
	}
	return t.lookupRangeSlow(pd, key, need, iova, n)
}

func (t *Table[V]) lookupRangeSlow(pd uint32, key STag, need Access, iova, n uint64) ([]byte, *Entry[V], Reason) {
	s := t.slot(key)
	if s == nil {
		return nil, nil, NoEntry
	}
	var sn snapshot[V]
	s.read(&sn)
	if r := sn.check(pd, key, need, true, iova, n); r != OK {
		return nil, nil, r
	}
	return sn.bytes(iova, n, need&writeRights != 0), sn.entry, OK
}

// Span is a reference to a range of an entry, with a position in it: what
// a placement cursor holds for one RDMA message (rxe: the responder's MR
// reference with its va and resid; iWARP: the STag, tagged offset and
// length of a tagged placement). Open takes it, Close drops it. An unbound
// Span counts a reference, which deregistration drains (Entry.Drain); a
// Span bound to a Reader counts nothing, and deregistration waits for the
// reader's quiescent state instead (Table.Synchronize). The holder checks
// with one load (Current) before each use of the range's bytes that the
// slot has not changed since: the entry is still valid and the bytes are
// still its translation. When Current is false the holder calls Refresh.
//
// The holder advances Done. The zero Span holds nothing. A Span is used by
// one goroutine.
type Span[V any] struct {
	Entry *Entry[V] // the entry referenced; nil: the Span holds nothing
	IOVA  uint64    // address of the range's first byte
	Len   uint64    // bytes in the range
	Done  uint64    // bytes of the range used so far; advanced by the holder
	Write bool      // opened for an access that writes memory

	// rd is the Reader the Span is bound to (Bind); nil: the Span counts
	// a reference from Open to Close.
	rd *Reader
	// base is the NIC-side address of the range's first byte when the
	// entry maps the range linearly for the access; nil: translate through
	// the entry's own table (Entry.Value). A pointer rather than a slice:
	// one store fewer per message for Open and Close.
	base *byte
	slot *slot[V]
	ctl  uint64 // slot.ctl when the reference was taken or refreshed

	// QP is the number of the QP that presents keys through this Span
	// (set once by the holder, like Bind): a type 2 memory window opens
	// only for its own QP. 0: no QP (type 2 windows never open).
	QP uint32
	// via is the window's slot when the Span was opened through a memory
	// window (Entry and slot are then the target region's), with its ctl
	// at Open: Refresh refuses once the window has changed. Written by the
	// window path only and meaningful only while ctl lacks rightRegion,
	// which marks a window Span (see refreshWindow); a region's path
	// neither reads nor clears it, so it stores nothing more.
	via    *slot[V]
	viaCtl uint64
}

// Linear reports whether the range is mapped linearly (At may be used).
func (sp *Span[V]) Linear() bool { return sp.base != nil }

// At returns the NIC-side bytes [off, off+n) of the range, which must lie
// inside it; the range must be Linear.
func (sp *Span[V]) At(off, n uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(sp.base), off)), n)
}

// Current reports whether the slot is unchanged since the Span was opened
// or refreshed (and, for a bound Span, that its reader is still online):
// the entry is still valid and the linear mapping (if any) still
// translates the range. It is one load and one compare; the Span must hold
// an entry.
func (sp *Span[V]) Current() bool {
	return (sp.rd == nil || sp.rd.online) && sp.slot.ctl.Load() == sp.ctl
}

// Refresh re-reads the slot after a change (Current false) and reports
// whether the entry is still valid (and, for a Span opened for writing,
// not suspended: then RefreshReason says Suspended, and the holder may keep the
// Span and call Refresh again after the suspension ends). If it is, the
// translation is recomputed for the new contents (the range may no longer
// be Linear) and Current is true again; if not, the holder must stop using
// the range and Close the Span (or, suspended, wait). Because the holder still counts as a reference (or its reader is
// online again before the slot is read), a writer that changes the mapping
// and then drains the entry (or waits for a grace period) waits for it, so
// the new contents are safe to use.
func (sp *Span[V]) Refresh() bool { return sp.RefreshReason() == OK }

// RefreshReason is Refresh, saying why it failed: Suspended (decided on
// one snapshot of the slot, so a suspension that ends meanwhile is not
// taken for an invalidation) or Invalid.
func (sp *Span[V]) RefreshReason() Reason {
	if sp.rd != nil {
		sp.rd.Enter() // before the slot is read again
	}
	if sp.ctl&rightRegion == 0 {
		return sp.refreshWindow() // opened through a memory window
	}
	var sn snapshot[V]
	sp.slot.read(&sn)
	if sn.entry != sp.Entry || sn.ctl&ctlValid == 0 || STag(sn.keyPD) != sp.Entry.STag {
		return Invalid
	}
	if sp.Write && sn.ctl&ctlSuspended != 0 {
		return Suspended
	}
	sp.ctl = sn.ctl
	sp.base = sn.base(sp.IOVA, sp.Len, sp.Write)
	return OK
}

// Hold takes a counted reference on the Span's entry for work its holder
// does with the entry's translation while its reader is quiescent (a page
// fault between two packets, which must not hold up a grace period): it
// reports false, taking nothing, when the entry is no longer the valid
// entry of its slot. Release the reference with Entry.Release. The count
// is raised before the slot is read, so an invalidation racing Hold either
// is seen here or waits (Drain) until the reference is released: the
// registration cannot change under the holder. A Span that is not bound to
// a Reader holds a reference already; Hold takes another.
func (sp *Span[V]) Hold() bool {
	e := sp.Entry
	e.refs.Add(1)
	var sn snapshot[V]
	sp.slot.read(&sn)
	if sn.entry == e && sn.ctl&ctlValid != 0 {
		return true
	}
	e.Release()
	return false
}

// Close drops the reference, if any, and makes the Span hold nothing (IOVA
// keeps its last value).
func (sp *Span[V]) Close() {
	if sp.Entry != nil {
		if sp.rd == nil {
			sp.Entry.Release()
		}
		sp.Entry = nil // slot and ctl mean nothing without an Entry
	}
	sp.base, sp.Len, sp.Done = nil, 0, 0
}

// Open makes the four checks of Lookup for key, presented by protection
// domain pd for an access that needs the rights in need, and the bounds
// check of [iova, iova+n); on success sp references the entry (counted as
// by Acquire, unless sp is bound to a Reader) and the range, with Done 0,
// Linear when the entry maps the range linearly. On failure sp holds
// nothing. sp must hold nothing.
//
// An empty range (n == 0) names no memory: Open succeeds without looking at
// key, and sp holds nothing (rxe's check_rkey: "A zero-byte op is not
// required to set an addr or rkey"; zero-length SGEs are not checked
// either).
//
// The reference is counted (or the reader put online) before the slot is
// read the second time, so an Open that races an Invalidate (or any change
// of the slot) either fails or is waited for by the Drain (or Synchronize)
// that follows the change. It allocates nothing.
func (t *Table[V]) Open(sp *Span[V], pd uint32, key STag, need Access, iova, n uint64) Reason {
	if sp.Entry != nil {
		panic("stag: Open on a Span that holds an entry (missing Close)")
	}
	rd := sp.rd
	if rd != nil && !rd.online {
		// Reader.enter, written out: the fast path makes no call, so
		// that nothing has to be saved on the stack around one.
		rd.state.Store(rd.state.Load() | 1) // before any slot is read
		rd.online = true
	}
	// Written first (the slow path rewrites them): on success they are
	// needed anyway, and the slow path then needs fewer registers kept.
	sp.IOVA, sp.Len, sp.Done, sp.Write = iova, n, 0, need&writeRights != 0
	// Fast path: that of LookupRange, plus the count (for a Span that is
	// not bound to a Reader). The second load of ctl, after the reference
	// is counted, both confirms the snapshot and closes the race with a
	// writer that changes the slot and then drains.
	s := &t.none // see none
	if c := t.dir[uint32(key)>>(KeyBits+chunkBits)].Load(); c != nil {
		s = &c[uint32(key)>>KeyBits&(1<<chunkBits-1)]
	}
	ctl, want := s.ctl.Load(), fastWant(need)
	if (ctl&want^want)|(s.keyPD.Load()^(uint64(pd)<<32|uint64(key))) == 0 {
		base, length := s.iova.Load(), s.length.Load()
		if off := iova - base; n-1 < length && off <= length-n {
			lin, ent := s.linear.Load(), s.entry.Load()
			// ent is nil or another entry if a writer ran between
			// the loads; a reference taken on the wrong entry is
			// dropped by the slow path.
			if ent != nil {
				if rd == nil {
					ent.refs.Add(1)
				}
				// Field by field: a composite literal is built on
				// the stack and copied with 16-byte loads, which
				// cannot be forwarded from 8-byte stores and so wait
				// until the store buffer drains (after a 4 KiB copy,
				// some 20 ns).
				sp.Entry, sp.slot, sp.ctl = ent, s, ctl
				if s.ctl.Load() == ctl {
					sp.base = (*byte)(unsafe.Add(unsafe.Pointer(lin), off))
					return OK
				}
			}
		}
	}
	return t.openSlow(sp, pd, key, need)
}

// openSlow is Open for what the fast path does not handle: an empty range,
// a failed check (to say which), a slot without a linear mapping, a race
// with a writer. The fast path has stored IOVA, Len and Write, and Entry
// if it counted a reference it must drop.
func (t *Table[V]) openSlow(sp *Span[V], pd uint32, key STag, need Access) Reason {
	if sp.Entry != nil {
		if sp.rd == nil {
			sp.Entry.Release()
		}
		sp.Entry = nil
	}
	iova, n := sp.IOVA, sp.Len
	sp.base, sp.IOVA, sp.Len, sp.Done = nil, 0, 0, 0
	if n == 0 {
		return OK
	}
	s := t.slot(key)
	if s == nil {
		return NoEntry
	}
	if e := s.entry.Load(); e != nil && e.Target != nil {
		return t.openWindow(sp, s, pd, key, need, iova, n)
	}
	var sn snapshot[V]
	if sp.rd != nil {
		// The reader is online since Open began: what the snapshot
		// shows stays usable until it quiesces.
		s.read(&sn)
		if r := sn.check(pd, key, need, true, iova, n); r != OK {
			return r
		}
	} else if r := t.acquire(&sn, s, pd, key, need, true, iova, n); r != OK {
		return r
	}
	if sn.entry.Target != nil {
		// The index became a window meanwhile (freed and reused).
		if sp.rd == nil {
			sn.entry.Release()
		}
		return t.openWindow(sp, s, pd, key, need, iova, n)
	}
	sp.Entry, sp.slot, sp.ctl = sn.entry, s, sn.ctl
	sp.base = sn.base(iova, n, sp.Write)
	sp.IOVA, sp.Len = iova, n
	return OK
}

// acquire is the slow path of taking a reference: a consistent snapshot
// (into sn), the checks, the count, and a second look at the slot; a writer
// that ran in between makes it start again.
func (t *Table[V]) acquire(sn *snapshot[V], s *slot[V], pd uint32, key STag, need Access, bounds bool, iova, n uint64) Reason {
	for {
		s.read(sn)
		if r := sn.check(pd, key, need, bounds, iova, n); r != OK {
			return r
		}
		sn.entry.refs.Add(1)
		if s.ctl.Load() == sn.ctl {
			return OK
		}
		sn.entry.Release()
	}
}

// Acquire is Lookup plus a reference that keeps the entry's memory in place
// until Release: deregistration invalidates the entry, then drains the
// references. The count is raised before the slot is read again, so an
// Acquire that races an Invalidate either fails or is waited for.
func (t *Table[V]) Acquire(pd uint32, key STag, need Access) (*Entry[V], Reason) {
	s := &t.none // see none
	if c := t.dir[uint32(key)>>(KeyBits+chunkBits)].Load(); c != nil {
		s = &c[uint32(key)>>KeyBits&(1<<chunkBits-1)]
	}
	ctl, want := s.ctl.Load(), uint64(need)|rightRegion|ctlValid
	if (ctl&want^want)|ctl&suspendedFor(need)|(s.keyPD.Load()^(uint64(pd)<<32|uint64(key))) == 0 {
		if ent := s.entry.Load(); ent != nil {
			ent.refs.Add(1)
			if s.ctl.Load() == ctl {
				return ent, OK
			}
			ent.Release()
		}
	}
	s = t.slot(key)
	if s == nil {
		return nil, NoEntry
	}
	var sn snapshot[V]
	if r := t.acquire(&sn, s, pd, key, need, false, 0, 0); r != OK {
		return nil, r
	}
	return sn.entry, OK
}

// Get returns the entry that key names, in any state but free, or nil. It is
// for the control path; it checks neither PD nor access.
func (t *Table[V]) Get(key STag) *Entry[V] {
	s := t.slot(key)
	if s == nil {
		return nil
	}
	e := s.entry.Load()
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
// possible. A range that wraps the 64-bit address space is ErrRange.
func (t *Table[V]) Alloc(pd uint32, iova, length uint64, access Access, value V) (*Entry[V], error) {
	if length > 0 && length-1 > math.MaxUint64-iova {
		return nil, ErrRange
	}
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
	t.publish(e)
	t.mu.live++
	return e, nil
}

// publish installs e, in state Invalid, in the slot of its index, with no
// linear mapping. A region's slot gets rightRegion (the fast paths may
// serve it); a window's does not. Called with mu held.
func (t *Table[V]) publish(e *Entry[V]) {
	e.state.Store(uint32(StateInvalid))
	rights := uint64(e.Access)
	if e.Target == nil {
		rights |= rightRegion
	}
	s := t.slot(e.STag)
	seq := s.beginWrite()
	s.keyPD.Store(uint64(e.PD)<<32 | uint64(e.STag))
	s.iova.Store(e.IOVA)
	s.length.Store(e.Length)
	s.linear.Store(nil)
	s.entry.Store(e)
	s.endWrite(seq, rights)
}

// grow makes sure index i has a slot and a key byte. Called with mu held.
func (t *Table[V]) grow(i uint32) {
	for uint32(len(t.mu.keys)) <= i {
		t.mu.keys = append(t.mu.keys, 0)
	}
	if d := &t.dir[i>>chunkBits]; d.Load() == nil {
		d.Store(new(chunk[V]))
	}
}

// entry returns the live entry for key and its slot. Called with mu held.
func (t *Table[V]) entry(key STag) (*Entry[V], *slot[V], error) {
	s := t.slot(key)
	if s == nil {
		return nil, nil, ErrNoEntry
	}
	e := s.entry.Load()
	if e == nil || e.STag != key {
		return nil, nil, ErrNoEntry
	}
	return e, s, nil
}

// Validate moves an entry from Invalid to Valid.
func (t *Table[V]) Validate(key STag) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, s, err := t.entry(key)
	if err != nil {
		return err
	}
	if !e.state.CompareAndSwap(uint32(StateInvalid), uint32(StateValid)) {
		return ErrState
	}
	s.setFlags(s.ctl.Load()&ctlFlagsMask | ctlValid)
	return nil
}

// Invalidate moves an entry from Valid to Invalid: every later Lookup and
// Acquire fails, and so does the Current check of every Span on it.
// Placements already holding a reference continue; see Entry.Drain.
// Invalidating an invalid entry is not an error.
func (t *Table[V]) Invalidate(key STag) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, s, err := t.entry(key)
	if err != nil {
		return err
	}
	e.state.Store(uint32(StateInvalid))
	s.setFlags(s.ctl.Load() & ctlFlagsMask &^ ctlValid)
	return nil
}

// SetLinear declares that the entry's range maps linearly onto NIC-side
// memory starting at base (the NIC-side address of the byte at the entry's
// IOVA), for accesses that read memory and, if write, for accesses that
// write it. Lookups then translate a range by an offset instead of through
// the entry's own table. The caller keeps the mapping in place until it
// calls ClearLinear and drains the entry (or frees it).
func (t *Table[V]) SetLinear(key STag, base *byte, write bool) error {
	if base == nil {
		return errors.New("stag: nil linear mapping")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	_, s, err := t.entry(key)
	if err != nil {
		return err
	}
	flags := s.ctl.Load()&ctlFlagsMask&^(ctlLinearRead|ctlLinearWrite|ctlResumeWrite) | ctlLinearRead
	if write {
		if flags&ctlSuspended != 0 {
			flags |= ctlResumeWrite // granted when the suspension ends
		} else {
			flags |= ctlLinearWrite
		}
	}
	seq := s.beginWrite()
	s.linear.Store(base)
	s.endWrite(seq, flags)
	return nil
}

// ClearLinear withdraws the linear mapping: lookups that start afterwards
// translate through the entry's own table, and every Span on the entry
// stops being Current. Holders that still copy through bytes obtained before are
// waited for by Drain. Anything that moves the memory behind the mapping
// (a remap) or needs every access to go through the table (dirty tracking,
// demand paging) calls it first.
func (t *Table[V]) ClearLinear(key STag) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, s, err := t.entry(key)
	if err != nil {
		return err
	}
	flags := s.ctl.Load() & ctlFlagsMask &^ (ctlLinearRead | ctlLinearWrite | ctlResumeWrite)
	seq := s.beginWrite()
	s.linear.Store(nil)
	s.endWrite(seq, flags)
	return nil
}

// Free releases the entry's index for reuse under a new key. The entry's
// state becomes Free, so a reader that still holds the *Entry fails its
// state check, and the slot is emptied. Callers that place bytes through
// the entry Invalidate and Drain it first.
func (t *Table[V]) Free(key STag) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, s, err := t.entry(key)
	if err != nil {
		return err
	}
	e.state.Store(uint32(StateFree))
	seq := s.beginWrite()
	s.keyPD.Store(0)
	s.iova.Store(0)
	s.length.Store(0)
	s.linear.Store(nil)
	s.entry.Store(nil)
	s.endWrite(seq, 0)
	t.mu.free = append(t.mu.free, key.Index())
	t.mu.live--
	return nil
}

// InPD reports whether an allocated (not freed) entry of protection domain
// pd exists: a region or a window, valid or not (ibv_dealloc_pd's EBUSY
// check). It scans the allocated chunks under the table's lock.
func (t *Table[V]) InPD(pd uint32) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.dir {
		c := t.dir[i].Load()
		if c == nil {
			continue
		}
		for j := range c {
			if s := &c[j]; s.entry.Load() != nil && uint32(s.keyPD.Load()>>32) == pd {
				return true
			}
		}
	}
	return false
}

// Len returns the number of allocated (not freed) entries.
func (t *Table[V]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mu.live
}
