package pagetable

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/internal/memcopy"
)

// ChildShift is the log2 of the pages one child table of an on-demand
// table covers: 2^18 pages of 4 KiB, 1 GiB, the size of the children mlx5
// builds lazily for an implicit ODP MR (MLX5_IMR_MTT_SIZE).
const ChildShift = 18

const (
	childPages = 1 << ChildShift
	childMask  = childPages - 1
)

// inRing marks an entry that the budget's clock ring references, so that a
// page faulted in again is not queued twice. It is kept apart from the
// public flags.
const inRing Flags = 1 << 31

// Errors of the fault path. Fault wraps them with the address.
var (
	// ErrFault: the page cannot be faulted in: the address is not mapped
	// in the host address space (a peer named memory the application
	// freed), or the access writes a read-only page. The data path answers
	// a remote access error (IBTA 9.7.5.2.4), as an mlx5 ODP fault that
	// fails does.
	ErrFault = errors.New("pagetable: page fault cannot be resolved")
)

// FaultFlags say what Fault is asked to do.
type FaultFlags uint8

const (
	// FaultWrite: map the pages writable (the NIC will write them).
	FaultWrite FaultFlags = 1 << iota
	// FaultNoPopulate: map only pages the host already holds; skip the
	// others (ibv_advise_mr's PREFETCH_NO_FAULT).
	FaultNoPopulate
	// FaultPrefetch: counted as prefetch (page_prefetch), not as faults.
	FaultPrefetch
	// FaultPopulate: populate the pages the host is not known to hold now
	// (one MADV_POPULATE_WRITE per run of frames on the NIC's view), so that
	// the copies that follow take no page fault. For faults off the data
	// path (prefetch, the rnr policy's background fault); without it a
	// fault makes no system call and the first copy of a page nobody has
	// touched takes the kernel's page fault.
	FaultPopulate
)

// ODPStats are the counters of one on-demand table, with mlx5's names
// (rdma statistic show mr; drivers/infiniband/hw/mlx5/restrack.c), all in
// pages.
type ODPStats struct {
	PageFaults               int64 // pages the data path asked to fault in
	PageFaultsHandled        int64 // of those, pages made present
	PageInvalidations        int64 // present pages an invalidation or eviction asked to clear
	PageInvalidationsHandled int64 // of those, cleared with no copy left in flight on them
	PagePrefetch             int64 // pages made present by prefetch advice
	Evictions                int64 // pages cleared by the budget (included in PageInvalidations)
}

// child is the entries of up to 2^ChildShift consecutive pages.
type child struct{ e []odpEntry }

// odpEntry is one page of an on-demand table: its flags and the host frame
// the fault resolved, which the NIC writes through its own view of the
// host memory (hostmem.AddressSpace.FramePointer), as a real ODP NIC
// writes the physical page its MTT entry names. The notifier protocol
// keeps an entry present only while the application's mapping is the one
// the fault resolved; frame is stored before the entry turns present and
// is read only while it is.
type odpEntry struct {
	flags atomic.Uint32
	frame atomic.Uint32 // hostmem.Frame
}

// ODP is the translation table of an on-demand memory region (IBV_ACCESS_ON_
// DEMAND): every entry starts not present; a copy that meets a page that is
// not present (or not writable, for a write) stops with NotPresent or
// NoPermission before copying any byte of its range; Fault then fills the
// entries from the host address space under its notifier's sequence count
// (mmu_interval_read_begin / read_retry), and the copy is repeated.
//
// Copies go to the frames the faults resolved, through the NIC's view of
// the host memory (the mapping of every frame, which stays mapped until
// the address space closes), page by page, as a real ODP NIC writes the
// physical pages of its MTT entries: they never touch the application's
// page tables, so the NIC's traffic does not populate them and a remap's
// view switch does not have to unmap what the NIC populated (docs/
// scopes.md, "Session 13": it cost the untouched QPs 10-15 % of their
// throughput). A page nobody has touched is populated by the kernel's
// page fault in the NIC view at its first copy. This is safe because the
// host invalidates before it changes the mapping (Free before it unmaps,
// Migrate before it copies and remaps, Protect before mprotect): a copy
// runs only on present entries, and the invalidation waits for it, so no
// copy writes a frame that is being freed or replaced.
//
// The host address space invalidates ranges through the table's
// subscription: Invalidate clears the entries and then waits until every
// copy that may have used them has finished, so that after it returns no
// byte lands in an invalidated frame. Copies announce themselves in one of
// two counters selected by an epoch (sleepable RCU, reduced to what a
// per-packet copy needs): an invalidation clears the entries, flips the
// epoch and waits for the old epoch's counter to reach zero.
//
// An implicit table (NewImplicit) covers the whole I/O address space
// (ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND)); its children,
// 1 GiB each, are allocated at the first fault in their range, as mlx5
// builds its implicit MR's children. Addresses outside the host address
// space cannot be faulted in.
type ODP struct {
	iova, length uint64 // the region (an implicit table: 0, MaxUint64)
	base         uint64 // address of the first page the children cover
	npages       uint64 // pages the children cover
	implicit     bool
	writable     bool // the region has LOCAL_WRITE: pages may be mapped writable

	children []atomic.Pointer[child]

	// nic is the NIC's view of frame 0 (hostmem FramePointer(0)): frame f
	// is at nic + f<<PageShift.
	nic    unsafe.Pointer
	as     *hostmem.AddressSpace
	sub    *hostmem.Subscription
	budget *Budget

	// mu serializes installs (Fault) with clears (Invalidate, eviction,
	// Release); copies take no lock.
	mu sync.Mutex
	// faultMu serializes the table's faults (as the kernel's umem_mutex
	// does for an ODP MR), so that two faults of the same page (a retried
	// packet and a background fault) resolve it once and count it once.
	faultMu sync.Mutex
	// epoch selects the in-flight counter new copies use; active counts
	// the copies of each epoch. Invalidations hold flipMu while they flip
	// and wait.
	epoch  atomic.Uint32
	active [2]struct {
		n atomic.Int64
		_ [56]byte
	}
	flipMu sync.Mutex
	// clearing counts the clears running (clear), so that one that finds
	// nothing present knows whether another one may have cleared the
	// entries and still be waiting for their copies.
	clearing atomic.Int32

	released atomic.Bool
	// track: a remap tracks the pages the NIC writes (Dirty bits).
	track atomic.Bool
	// mirror: a remap's new frames, which every write also reaches while
	// the application's view switches (StartMirror); mirrorMu serializes
	// the mirrored atomics with the switch (SwitchMirrored).
	mirror   atomic.Pointer[ODPMirror]
	mirrorMu sync.Mutex

	// resolvedHook, set by tests only, runs in faultBatch between the
	// host's resolve and the install.
	resolvedHook func()

	stats struct {
		faults, faultsHandled, invals, invalsHandled, prefetch, evictions atomic.Int64
	}
}

// NewODP builds the on-demand table of the region [iova, iova+length) of
// the host address space as (the region's IOVA is its address), with every
// entry not present, and subscribes it to as's invalidations. writable
// says the region has LOCAL_WRITE. budget (nil: unlimited) limits the
// pages present in all the tables that share it. The range must lie inside
// as (Bounds); it need not be mapped yet.
func NewODP(as *hostmem.AddressSpace, iova, length uint64, writable bool, budget *Budget) (*ODP, error) {
	if as == nil {
		return nil, errors.New("pagetable: an on-demand table needs a host address space")
	}
	if length == 0 {
		return nil, errors.New("pagetable: empty region")
	}
	b := as.Bounds()
	if iova < b.Start || length > b.Len() || iova-b.Start > b.Len()-length {
		return nil, fmt.Errorf("pagetable: region [%#x, +%d) is outside the host address space %v: ODP memory must be allocated from it (AddressSpace.Alloc; a Go slice is not)", iova, length, b)
	}
	start := iova &^ pageMask
	end := (iova + length + pageMask) &^ pageMask
	t := &ODP{iova: iova, length: length, base: start, npages: (end - start) >> PageShift,
		writable: writable, nic: as.FramePointer(0), as: as, budget: budget}
	nc := (t.npages + childMask) >> ChildShift
	t.children = make([]atomic.Pointer[child], nc)
	for c := range t.children {
		n := min(t.npages-uint64(c)<<ChildShift, childPages)
		t.children[c].Store(&child{e: make([]odpEntry, n)})
	}
	if err := t.subscribe(start, end-start); err != nil {
		return nil, err
	}
	return t, nil
}

// NewImplicit builds an implicit on-demand table: the region is the whole
// I/O address space, [0, 2^64-1), and the children covering the host
// address space as are allocated at their first fault.
func NewImplicit(as *hostmem.AddressSpace, writable bool, budget *Budget) (*ODP, error) {
	if as == nil {
		return nil, errors.New("pagetable: an on-demand table needs a host address space")
	}
	b := as.Bounds()
	t := &ODP{iova: 0, length: math.MaxUint64, base: b.Start, npages: b.Len() >> PageShift,
		implicit: true, writable: writable, nic: as.FramePointer(0), as: as, budget: budget}
	t.children = make([]atomic.Pointer[child], (t.npages+childMask)>>ChildShift)
	if err := t.subscribe(b.Start, b.Len()); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *ODP) subscribe(start, length uint64) error {
	sub, err := t.as.Subscribe(start, length, t)
	if err != nil {
		return fmt.Errorf("pagetable: %w", err)
	}
	t.sub = sub
	return nil
}

// IOVA returns the address of the region's first byte (0 for an implicit
// table).
func (t *ODP) IOVA() uint64 { return t.iova }

// Subscription returns the table's subscription to its address space's
// invalidations.
func (t *ODP) Subscription() *hostmem.Subscription { return t.sub }

// Len returns the region's length in bytes (MaxUint64 for an implicit
// table).
func (t *ODP) Len() uint64 { return t.length }

// Implicit reports whether the table is implicit.
func (t *ODP) Implicit() bool { return t.implicit }

// Children returns how many child tables (1 GiB each for an implicit
// table) exist now.
func (t *ODP) Children() int {
	n := 0
	for c := range t.children {
		if t.children[c].Load() != nil {
			n++
		}
	}
	return n
}

// Stats returns the table's counters.
func (t *ODP) Stats() ODPStats {
	return ODPStats{
		PageFaults:               t.stats.faults.Load(),
		PageFaultsHandled:        t.stats.faultsHandled.Load(),
		PageInvalidations:        t.stats.invals.Load(),
		PageInvalidationsHandled: t.stats.invalsHandled.Load(),
		PagePrefetch:             t.stats.prefetch.Load(),
		Evictions:                t.stats.evictions.Load(),
	}
}

// entry returns the entry of page pg (counted from base), nil when its
// child does not exist yet.
func (t *ODP) entry(pg uint64) *odpEntry {
	c := t.children[pg>>ChildShift].Load()
	if c == nil {
		return nil
	}
	return &c.e[pg&childMask]
}

// pages returns the first page and the page count of [iova, iova+n), and
// whether the range lies in the region and in the pages the table covers.
func (t *ODP) pages(iova, n uint64) (first, count uint64, ok bool) {
	if n == 0 || iova < t.iova || n > t.length || iova-t.iova > t.length-n {
		return 0, 0, false
	}
	if iova < t.base || iova-t.base >= t.npages<<PageShift || n > t.npages<<PageShift-(iova-t.base) {
		return 0, 0, false
	}
	first = (iova - t.base) >> PageShift
	last := (iova + n - 1 - t.base) >> PageShift
	return first, last - first + 1, true
}

// enter announces a copy; the returned epoch goes to exit.
func (t *ODP) enter() uint32 {
	i := t.epoch.Load() & 1
	t.active[i].n.Add(1)
	return i
}

func (t *ODP) exit(i uint32) { t.active[i].n.Add(-1) }

// check reports whether every page of [first, first+count) allows the
// access, and sets their Accessed bits (for the budget's clock).
func (t *ODP) check(first, count uint64, need Flags) Result {
	for pg := first; pg < first+count; pg++ {
		e := t.entry(pg)
		if e == nil {
			return NotPresent
		}
		f := Flags(e.flags.Load())
		if f&need != need {
			return missing(f)
		}
		if f&Accessed == 0 {
			e.flags.Or(uint32(Accessed))
		}
	}
	return OK
}

// CopyIn copies src into the region at iova (the NIC writes memory). It
// first checks that every page of the range is present and writable; if
// one is not it copies nothing and returns 0 with NotPresent or
// NoPermission (fault the range in with Fault, then call again), or
// OutOfRange. It allocates nothing and takes no lock.
func (t *ODP) CopyIn(iova uint64, src []byte) (int, Result) { return t.copyPages(iova, src, true) }

// CopyOut copies from the region at iova into dst (the NIC reads memory),
// with the checks of CopyIn (present pages).
func (t *ODP) CopyOut(iova uint64, dst []byte) (int, Result) { return t.copyPages(iova, dst, false) }

// copyPages is CopyIn (write: b goes into the region) and CopyOut (b
// receives the region's bytes), inside the copy section: every page is
// checked, then the bytes move page by page to or from the entries'
// frames.
func (t *ODP) copyPages(iova uint64, b []byte, write bool) (int, Result) {
	first, count, ok := t.pages(iova, uint64(len(b)))
	if !ok {
		if len(b) == 0 {
			return 0, OK
		}
		return 0, OutOfRange
	}
	need := Present
	if write {
		need |= Writable
	}
	ep := t.enter()
	if r := t.check(first, count, need); r != OK {
		t.exit(ep)
		return 0, r
	}
	if write {
		t.write(first, count, iova-t.base, b, nil)
	} else {
		t.copyFrames(iova-t.base, b, false)
	}
	t.exit(ep)
	return len(b), OK
}

// write is CopyIn's work inside the copy section, once the pages from
// first are checked: b goes into the region at table offset off, into the
// entries' frames, and to the mirror's frames during a remap's switch.
// between, if not nil, runs after the first copy (a test holds the write
// there).
//
// The mirror is loaded before the entries' frames: SwitchMirrored points
// the entries at the new frames and then ends the mirror, so a write that
// finds no mirror reads the new frames, and one that finds it copies into
// them whichever frames it read. Loaded after the copy, an ended mirror
// would leave bytes copied into the old frames before the switch out of
// the new ones.
func (t *ODP) write(first, count, off uint64, b []byte, between func()) {
	m := t.mirror.Load()
	t.copyFrames(off, b, true)
	if between != nil {
		between()
	}
	if m != nil {
		m.copy(off, b)
	}
	if t.track.Load() {
		for pg := first; pg < first+count; pg++ {
			if e := t.entry(pg); Flags(e.flags.Load())&Dirty == 0 {
				e.flags.Or(uint32(Dirty))
			}
		}
	}
}

// copyFrames copies b to (write) or from the region at table offset off,
// page by page through the NIC's view of each present entry's frame.
func (t *ODP) copyFrames(off uint64, b []byte, write bool) {
	for len(b) > 0 {
		n := min(uint64(len(b)), PageSize-off&pageMask)
		p := unsafe.Slice((*byte)(t.at(off)), n)
		if write {
			memcopy.Copy(p, b[:n])
		} else {
			memcopy.Copy(b[:n], p)
		}
		b = b[n:]
		off += n
	}
}

// at returns the NIC's address of the byte at table offset off, whose
// page's entry is present.
func (t *ODP) at(off uint64) unsafe.Pointer {
	f := uintptr(t.entry(off >> PageShift).frame.Load())
	return unsafe.Add(t.nic, f<<PageShift|uintptr(off&pageMask))
}

// StartTracking begins the dirty tracking of a remap: Dirty bits are
// cleared and every page the NIC writes from now on gets one.
func (t *ODP) StartTracking() {
	t.mu.Lock()
	for c := range t.children {
		if ch := t.children[c].Load(); ch != nil {
			for i := range ch.e {
				ch.e[i].flags.And(^uint32(Dirty))
			}
		}
	}
	t.track.Store(true)
	t.mu.Unlock()
	t.waitCopies() // copies that started before write no bit
}

// StopTracking ends dirty tracking.
func (t *ODP) StopTracking() { t.track.Store(false) }

// DirtyPages returns the pages among the npages pages from iova's page
// that were written since StartTracking, as indices from iova's page. iova
// may lie below the region's first byte in its first page (a remap asks
// from the page boundary): the pages are the table's, not the region's.
func (t *ODP) DirtyPages(iova uint64, npages int) []int {
	if iova < t.base || iova-t.base >= t.npages<<PageShift {
		return nil
	}
	first := (iova - t.base) >> PageShift
	var out []int
	for i := range npages {
		if first+uint64(i) >= t.npages {
			break
		}
		if e := t.entry(first + uint64(i)); e != nil && Flags(e.flags.Load())&Dirty != 0 {
			out = append(out, i)
		}
	}
	return out
}

// Atomic64 runs op on the 64-bit word at iova (8-byte aligned: Misaligned
// otherwise) while the page is present and writable, and returns op's
// result. op runs inside the copy section: an invalidation of the page
// waits for it. On NotPresent or NoPermission op is not run.
func (t *ODP) Atomic64(iova uint64, op func(p *uint64) uint64) (uint64, Result) {
	if iova&7 != 0 {
		return 0, Misaligned
	}
	first, _, ok := t.pages(iova, 8)
	if !ok {
		return 0, OutOfRange
	}
	ep := t.enter()
	if r := t.check(first, 1, Present|Writable); r != OK {
		t.exit(ep)
		return 0, r
	}
	var v uint64
	if m := t.mirror.Load(); m != nil {
		v = t.mirrorAtomic(m, iova-t.base, op)
	} else {
		v = op((*uint64)(t.at(iova - t.base)))
	}
	if t.track.Load() {
		t.entry(first).flags.Or(uint32(Dirty))
	}
	t.exit(ep)
	return v, OK
}

// faultBatch is how many pages Fault resolves under one sequence count.
const faultBatch = 64

// Fault makes the pages of [iova, iova+n) present (and writable with
// FaultWrite), resolving them in the host address space, installing each
// batch only if no invalidation of the range ran meanwhile, and charging
// the budget, which may evict other pages first. It returns the pages it
// made present. Pages already present with the access are skipped. It
// must not be called from inside a copy (it may wait for an invalidation,
// which waits for copies).
//
// By default a fault makes no system call: a page the host holds (the
// application or the NIC touched it) is installed as it is, and a page
// nobody has touched is populated by the kernel's page fault in the first
// copy. FaultPopulate populates such pages now; FaultNoPopulate skips
// them.
//
// Errors: OutOfRange-style misuse (a range outside the region) and pages
// that cannot be resolved wrap ErrFault; with FaultNoPopulate a page the
// host does not hold is skipped, not an error. A write fault on a region
// without LOCAL_WRITE wraps ErrFault.
func (t *ODP) Fault(iova, n uint64, fl FaultFlags) (int, error) {
	first, count, ok := t.pages(iova, n)
	if !ok {
		return 0, fmt.Errorf("%w: [%#x, +%d) is outside the region", ErrFault, iova, n)
	}
	if fl&FaultWrite != 0 && !t.writable {
		return 0, fmt.Errorf("%w: write fault on a region without LOCAL_WRITE", ErrFault)
	}
	if t.released.Load() {
		return 0, fmt.Errorf("%w: region deregistered", ErrFault)
	}
	need := Present
	acc := hostmem.Access(0)
	if fl&FaultWrite != 0 {
		need |= Writable
		acc |= hostmem.ResolveWrite
	}
	switch {
	case fl&FaultNoPopulate != 0:
		acc |= hostmem.ResolveNoFault
	case fl&FaultPopulate != 0:
		acc |= hostmem.ResolvePopulate
	}
	var pgs [faultBatch]hostmem.Page
	batch := uint64(faultBatch)
	if t.budget != nil && t.budget.limit > 0 {
		// A batch may evict, and must not need more than a fraction of
		// the budget.
		batch = min(batch, uint64(t.budget.limit/4))
	}
	t.faultMu.Lock()
	defer t.faultMu.Unlock()
	made := 0
	for pg := first; pg < first+count; {
		// Skip what is present already.
		if e := t.entry(pg); e != nil && Flags(e.flags.Load())&need == need {
			pg++
			continue
		}
		k := min(first+count-pg, batch)
		// Stop the batch at the first page already present.
		for j := uint64(1); j < k; j++ {
			if e := t.entry(pg + j); e != nil && Flags(e.flags.Load())&need == need {
				k = j
				break
			}
		}
		got, done, err := t.faultBatch(pg, pgs[:k], need, acc, fl)
		made += got
		if err != nil {
			return made, err
		}
		pg += uint64(done)
	}
	return made, nil
}

// Resolvable reports whether a fault of [iova, iova+n) can succeed now:
// the range is in the region, and every page not yet present with the
// access is mapped in the host (writable, for a write on a region with
// LOCAL_WRITE). It makes no system call; the answer may be stale at once.
// The rnr fault policy asks it before it answers an RNR NAK, so that a
// fault that can only fail is a remote access error at once, not an RNR
// NAK retried forever.
func (t *ODP) Resolvable(iova, n uint64, write bool) bool {
	first, count, ok := t.pages(iova, n)
	if !ok || write && !t.writable {
		return false
	}
	need := Present
	if write {
		need |= Writable
	}
	for pg := first; pg < first+count; pg++ {
		if e := t.entry(pg); e != nil && Flags(e.flags.Load())&need == need {
			continue
		}
		if !t.as.Mapped(t.base+pg<<PageShift, write) {
			return false
		}
	}
	return true
}

// faultBatch resolves and installs len(pgs) pages from page pg. It
// returns the pages it made present and the pages it is done with: all of
// them, or, with FaultNoPopulate, up to and including the first page the
// host does not hold (skipped; the caller goes on after it).
func (t *ODP) faultBatch(pg uint64, pgs []hostmem.Page, need Flags, acc hostmem.Access, fl FaultFlags) (made, done int, err error) {
	addr := t.base + pg<<PageShift
	k := uint64(len(pgs))
	if fl&FaultPrefetch == 0 {
		t.stats.faults.Add(int64(k))
	}
	// Reserve the budget first: eviction invalidates other pages, and
	// must not run under mu.
	if t.budget != nil {
		t.budget.reserve(int64(k))
	}
	reserved := int64(k)
	defer func() {
		if t.budget != nil && reserved > 0 {
			t.budget.unreserve(reserved)
		}
	}()
	if t.implicit {
		t.growChildren(pg, k)
	}
	for {
		seq := t.sub.ReadBegin()
		got, err := t.as.ResolveRange(addr, pgs, acc)
		skip := err != nil && fl&FaultNoPopulate != 0 && errors.Is(err, hostmem.ErrNotResident)
		if err != nil && got == 0 && !skip {
			if t.sub.ReadRetry(seq) {
				// An invalidation ran while the host resolved (a
				// population that met the range being unmapped or
				// remapped fails): resolve again after it.
				continue
			}
			return 0, 0, fmt.Errorf("%w: %#x: %w", ErrFault, addr, err)
		}
		if t.resolvedHook != nil {
			t.resolvedHook()
		}
		t.mu.Lock()
		if t.sub.ReadRetry(seq) {
			t.mu.Unlock()
			continue
		}
		if t.released.Load() {
			t.mu.Unlock()
			return 0, 0, fmt.Errorf("%w: region deregistered", ErrFault)
		}
		if !t.resolvedCurrent(addr, pgs[:got]) {
			// The host's page map moved on (a remap's switch, which
			// leaves this table out of its invalidation and points the
			// present entries at the new frames under mu): resolve again.
			t.mu.Unlock()
			continue
		}
		made := 0
		for i := range got {
			e := t.entry(pg + uint64(i))
			e.frame.Store(uint32(pgs[i].Frame))
			// A CAS, not a store: the budget's clock changes the Accessed
			// and ring bits without mu.
			for {
				f := Flags(e.flags.Load())
				if f&need == need {
					break
				}
				nf := Present | Accessed | f&(inRing|Dirty)
				if pgs[i].Writable && t.writable {
					nf |= Writable
				}
				enq := t.budget != nil && f&inRing == 0
				if enq {
					nf |= inRing
				}
				if !e.flags.CompareAndSwap(uint32(f), uint32(nf)) {
					continue
				}
				if f&Present == 0 {
					made++
					reserved--
				}
				if enq {
					t.budget.enqueue(t, pg+uint64(i))
				}
				break
			}
		}
		t.mu.Unlock()
		if fl&FaultPrefetch != 0 {
			t.stats.prefetch.Add(int64(made))
		} else {
			t.stats.faultsHandled.Add(int64(made))
		}
		switch {
		case got == len(pgs):
			return made, got, nil
		case skip:
			// A page the host does not hold: skipped. The pages after it
			// are the next batch's, which counts them.
			if fl&FaultPrefetch == 0 {
				t.stats.faults.Add(-int64(len(pgs) - got - 1))
			}
			return made, got + 1, nil
		}
		return made, got, fmt.Errorf("%w: %#x: %w", ErrFault, addr+uint64(got)<<PageShift, err)
	}
}

// resolvedCurrent reports whether every page resolved from addr still has
// the frame the host's page map gives it now. Called with mu.
func (t *ODP) resolvedCurrent(addr uint64, pgs []hostmem.Page) bool {
	for i := range pgs {
		if f, ok := t.as.FrameOf(addr + uint64(i)<<PageShift); !ok || f != pgs[i].Frame {
			return false
		}
	}
	return true
}

// growChildren allocates the children of an implicit table that
// [pg, pg+k) needs.
func (t *ODP) growChildren(pg, k uint64) {
	for c := pg >> ChildShift; c <= (pg+k-1)>>ChildShift; c++ {
		if t.children[c].Load() != nil {
			continue
		}
		n := min(t.npages-c<<ChildShift, childPages)
		t.children[c].CompareAndSwap(nil, &child{e: make([]odpEntry, n)})
	}
}

// Invalidate is the table's notifier callback (hostmem.Notifier): it clears
// the entries of inv.Range and waits for the copies that may have used
// them.
func (t *ODP) Invalidate(_ *hostmem.Subscription, inv hostmem.Invalidation) {
	r := inv.Range.Intersect(hostmem.Range{Start: t.base, End: t.base + t.npages<<PageShift})
	if r.Len() == 0 {
		return
	}
	t.clear((r.Start-t.base)>>PageShift, r.Len()>>PageShift, false)
}

// InvalidateRange clears the entries of [iova, iova+n) as an invalidation
// does (the pages fault in again at their next use) and waits for the
// copies in flight on them. It returns the pages cleared.
func (t *ODP) InvalidateRange(iova, n uint64) int {
	first, count, ok := t.pages(iova, n)
	if !ok {
		return 0
	}
	return t.clear(first, count, false)
}

// clear clears the present entries among count pages from first and waits
// for copies in flight; evict counts them as evictions. When it returns, no
// copy that used an entry of the range is running, even if another clear
// (an eviction and an invalidation of the same pages) cleared it first.
func (t *ODP) clear(first, count uint64, evict bool) int {
	t.clearing.Add(1)
	defer t.clearing.Add(-1)
	t.mu.Lock()
	n := 0
	for c := first >> ChildShift; c <= (first+count-1)>>ChildShift; c++ {
		ch := t.children[c].Load()
		if ch == nil {
			continue
		}
		lo := max(first, c<<ChildShift) - c<<ChildShift
		hi := min(first+count, c<<ChildShift+uint64(len(ch.e))) - c<<ChildShift
		for i := lo; i < hi; i++ {
			e := &ch.e[i]
			for {
				f := Flags(e.flags.Load())
				if f&Present == 0 {
					break
				}
				if e.flags.CompareAndSwap(uint32(f), uint32(f&(inRing|Dirty))) { // Dirty survives for a remap
					n++
					break
				}
			}
		}
	}
	t.mu.Unlock()
	if n == 0 {
		// Nothing present: no copy can use the range from now on. One
		// may still be running on entries another clear took away (it
		// counted itself before taking mu, and stops counting only after
		// its wait): wait as it does, or the host may change the mapping
		// under that copy.
		if t.clearing.Load() > 1 {
			t.waitCopies()
		}
		return 0
	}
	t.stats.invals.Add(int64(n))
	if evict {
		t.stats.evictions.Add(int64(n))
	}
	t.waitCopies()
	if t.budget != nil {
		t.budget.release(int64(n))
	}
	t.stats.invalsHandled.Add(int64(n))
	return n
}

// waitCopies waits until every copy that started before it was called has
// finished. It flips the epoch and waits for the old epoch's counter, twice
// (as SRCU's grace period does): a copy that read the epoch just before a
// flip may count itself in the old epoch's counter after the first wait
// found it zero, but it is then counted in the counter the second wait
// drains. Copies are per packet (at most a few KiB), so it spins.
func (t *ODP) waitCopies() {
	t.flipMu.Lock()
	for range 2 {
		old := t.epoch.Add(1) - 1
		for spins := 0; t.active[old&1].n.Load() != 0; spins++ {
			if spins > 64 {
				runtime.Gosched()
			}
		}
	}
	t.flipMu.Unlock()
}

// PresentAt reports whether the page holding iova is present.
func (t *ODP) PresentAt(iova uint64) bool {
	first, _, ok := t.pages(iova, 1)
	if !ok {
		return false
	}
	e := t.entry(first)
	return e != nil && Flags(e.flags.Load())&Present != 0
}

// Present returns the pages present now.
func (t *ODP) Present() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for c := range t.children {
		ch := t.children[c].Load()
		if ch == nil {
			continue
		}
		for i := range ch.e {
			if Flags(ch.e[i].flags.Load())&Present != 0 {
				n++
			}
		}
	}
	return n
}

// Release unsubscribes the table and clears every entry, returning its
// pages to the budget. The caller must make sure no copy will start
// (placement invalidates the region's key and waits first). Errors: a
// second Release.
func (t *ODP) Release() error {
	if !t.released.CompareAndSwap(false, true) {
		return errors.New("pagetable: table released twice")
	}
	t.sub.Unsubscribe()
	t.mu.Lock()
	n := 0
	for c := range t.children {
		ch := t.children[c].Load()
		if ch == nil {
			continue
		}
		for i := range ch.e {
			if Flags(ch.e[i].flags.Load())&Present != 0 {
				n++
			}
			ch.e[i].flags.Store(0)
		}
	}
	t.mu.Unlock()
	t.waitCopies()
	if t.budget != nil {
		t.budget.release(int64(n))
		t.budget.forget(t)
	}
	return nil
}
