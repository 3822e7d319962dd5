package hostmem

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Errors of AddressSpace. Resolve returns them bare (it runs on the fault
// path and allocates nothing); the other methods wrap them with the
// operation and the range.
var (
	ErrNotMapped   = errors.New("hostmem: address not mapped")
	ErrMapped      = errors.New("hostmem: address already mapped")
	ErrReadOnly    = errors.New("hostmem: page is read-only")
	ErrNotResident = errors.New("hostmem: page not resident")
	ErrNoSpace     = errors.New("hostmem: address space exhausted")
	ErrNoFrames    = errors.New("hostmem: frame pool exhausted")
	ErrPinned      = errors.New("hostmem: page is pinned")
	ErrRaced       = errors.New("hostmem: the range changed during the migration")
	ErrClosed      = errors.New("hostmem: address space closed")
	ErrBusy        = errors.New("hostmem: address space in use")
)

// maxSize bounds Config.Size: 2^31 frames, so that a frame number plus one
// fits the page map entry's 32 bits.
const maxSize = 1 << 43

// DefaultSize is the application address space an AddressSpace reserves
// when Config.Size is 0, and the capacity of its frame pool.
const DefaultSize = 64 << 30

// Config configures an AddressSpace.
type Config struct {
	// Size is the bytes of application address space to reserve; it is
	// also the capacity of the frame pool (the memfd's size and the NIC
	// mapping's). Rounded up to 2 MiB. 0: DefaultSize. Nothing is committed
	// up front: the reservation is PROT_NONE and the memfd is sparse.
	Size int64
	// FramePool is the most frames the migration pool keeps (0:
	// DefaultFramePool; negative: no pool). A migration's old frames join
	// the pool at Release with their memory and bytes, and later
	// migrations take their new frames from it instead of populating
	// fresh ones; frames beyond the bound are punched out as without a
	// pool. Only migrations get pooled frames (they overwrite them), never
	// Alloc. A pooled frame is handed out only once 256 more have joined
	// the pool after it, so a bound of 256 frames or less pools nothing.
	// The pool holds memory: up to FramePool pages of the memfd stay
	// allocated while no page uses them.
	FramePool int
}

// Range is a range of application addresses [Start, End).
type Range struct{ Start, End uint64 }

// Len returns the bytes in r.
func (r Range) Len() uint64 { return r.End - r.Start }

// Overlaps reports whether r and o share a byte.
func (r Range) Overlaps(o Range) bool { return r.Start < o.End && o.Start < r.End }

// Intersect returns the bytes r and o share (empty if none).
func (r Range) Intersect(o Range) Range {
	s, e := max(r.Start, o.Start), min(r.End, o.End)
	if s >= e {
		return Range{}
	}
	return Range{s, e}
}

func (r Range) String() string { return fmt.Sprintf("[%#x, %#x)", r.Start, r.End) }

// Frame names a page of an AddressSpace's memfd: frame f is the page at
// file offset f<<PageShift, and the NIC reaches it at FramePointer(f). It is
// the physical page of this world.
type Frame uint32

// Page is what Resolve reports about one application page.
type Page struct {
	Frame Frame
	// NIC is the frame's address in the NIC's view (FramePointer), which
	// stays mapped until Close: where pinned tables, ODP tables and
	// migrations copy.
	NIC unsafe.Pointer
	// Writable: the application may write the page, so the NIC may too.
	Writable bool
}

// Access says what Resolve is asked for. Without ResolvePopulate or
// ResolveNoFault, Resolve makes no system call: a page whose memory does
// not exist yet is populated by the kernel's page fault at the caller's
// first access (through the NIC's view, Page.NIC, for an ODP table).
type Access uint8

const (
	// ResolveWrite: the NIC will write the page. Resolve fails with
	// ErrReadOnly if the application's mapping is read-only.
	ResolveWrite Access = 1 << iota
	// ResolveNoFault: populate nothing, and fail with ErrNotResident for
	// a page the host does not hold (ibv_advise_mr's PREFETCH_NO_FAULT).
	ResolveNoFault
	// ResolvePopulate: populate now the pages not known to be held, with
	// one MADV_POPULATE_WRITE (_READ for a read-only page) per run of
	// frames on the NIC's view, so that the caller's first access through
	// it takes no page fault. For work off the data path: prefetch,
	// background faults.
	ResolvePopulate
)

// AddressSpace is the address space of one application: the analogue of a
// process's mm. The application and the NIC both map its memory, which is
// made of frames, the pages of one memfd:
//
//   - the application's view is one large virtual range reserved once
//     (PROT_NONE); Alloc maps frames into it with MAP_FIXED, Free maps
//     PROT_NONE back (the munmap of this world), Migrate maps other frames
//     under the same addresses;
//   - the NIC's view is a second MAP_SHARED mapping of the whole memfd, so
//     frame f is at a fixed NIC address for the life of the AddressSpace
//     (the physical address of this world). Pinned tables (Pin) and
//     migrations use it.
//
// On-demand (ODP) tables use it too, through the frames their faults
// resolved, as an ODP NIC's DMA reaches the physical pages its MTT names:
// the NIC's traffic never populates the application's page tables. They
// may, because every change to the application's mapping (Free, Migrate,
// Protect to read-only) invalidates first and waits for the copies in
// flight, so no copy writes a frame being freed or replaced, or a page
// being write-protected.
//
// There is one AddressSpace per application process (per mm), not per
// device: any number of devices register memory regions on it and
// subscribe to its notifiers, as two RDMA NICs DMA into one process. (A
// daemon serving several client processes has one per client, the client
// mapping the same memfd.)
//
// Subscriptions (Subscribe) are the mmu_interval_notifier analogue: every
// change that takes frames away from application pages (Free, Migrate,
// Protect to read-only) calls the Invalidate callback of each subscription
// overlapping the range, before the change, and makes the subscription's
// sequence count odd for its duration, so that a fault racing it retries
// (ReadBegin / ReadRetry). docs/memory.md ("Host address space and
// notifiers") states the protocol.
//
// Locking. mu is the mmap lock of this world: Alloc, AllocAt, Free,
// Protect, PrepareMigrate, Migration.Commit, Pin and Close take it, and
// Free, Protect and Commit hold it across the Invalidate callbacks. Resolve,
// FrameOf, ReadBegin, ReadRetry and FramePin.Unpin do not take it. An
// AddressSpace is safe for concurrent use.
type AddressSpace struct {
	appBase unsafe.Pointer // reservation: the application's view
	nicBase unsafe.Pointer // NIC mapping of the whole memfd
	base    uint64         // uint64(uintptr(appBase))
	size    uintptr        // bytes in each view
	npages  uintptr        // pages in each view (= frames in the pool)
	fd      int            // the memfd

	// dir is the page map: application page -> pte (see pte). Chunks are
	// created under mu and never freed; entries are atomics, so Resolve
	// reads them without a lock.
	dir    []atomic.Pointer[ptChunk]
	closed atomic.Bool

	mu struct {
		sync.Mutex
		free   extents // free application pages
		mapped int     // application pages mapped
	}

	frames frameAllocator

	subs struct {
		sync.Mutex
		ended sync.Cond       // broadcast when sequence counts become even, and when an invalidation is over
		list  []*Subscription // guarded by Mutex
		// active is the invalidation in progress (at most one: they
		// all hold mu). Guarded by Mutex.
		active *invalidation
	}

	stats struct {
		populated     atomic.Int64
		syscalls      atomic.Int64
		invalidations atomic.Int64
		migrated      atomic.Int64
	}
}

// pte layout: the frame number plus one in the low 32 bits (0: page not
// mapped), then flags.
const (
	pteFrame    = 1<<32 - 1
	pteReadOnly = 1 << 32 // the application maps the page PROT_READ
	// ptePopulated: the frame is known to hold a page, so Resolve makes no
	// system call for it whatever the Access. Set when Resolve populates
	// it, when ResolveNoFault finds it resident, when a migration or a pin
	// populates it, and when a plain Resolve hands it to a fault handler
	// (whose copy, right after, touches it). A page only the application
	// touched is not known until one of those happens.
	ptePopulated = 1 << 33
)

const (
	chunkShift = 9 // 512 entries (2 MiB of address space) per chunk
	chunkPages = 1 << chunkShift
)

type ptChunk [chunkPages]atomic.Uint64

// NewAddressSpace reserves the application's address range, creates the
// memfd and maps the NIC's view. Close releases all three.
func NewAddressSpace(cfg Config) (*AddressSpace, error) {
	size := cfg.Size
	if size == 0 {
		size = DefaultSize
	}
	const align = chunkPages << PageShift
	if size < 0 || size > maxSize {
		return nil, fmt.Errorf("hostmem: address space of %d bytes: size must be between 0 and 8 TiB", size)
	}
	n := (uintptr(size) + align - 1) &^ (align - 1)
	fd, err := unix.MemfdCreate("softrdma-as", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("hostmem: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("hostmem: ftruncate memfd to %d bytes: %w", n, err)
	}
	app, err := unix.MmapPtr(-1, 0, nil, n, unix.PROT_NONE, reserveFlags)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("hostmem: reserve %d bytes of address space: %w", n, err)
	}
	nic, err := unix.MmapPtr(fd, 0, nil, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		_ = unix.MunmapPtr(app, n)
		unix.Close(fd)
		return nil, fmt.Errorf("hostmem: map the NIC view (%d bytes): %w", n, err)
	}
	s := &AddressSpace{
		appBase: app,
		nicBase: nic,
		base:    uint64(uintptr(app)),
		size:    n,
		npages:  n >> PageShift,
		fd:      fd,
		dir:     make([]atomic.Pointer[ptChunk], n>>(PageShift+chunkShift)),
	}
	s.mu.free = extents{{0, s.npages}}
	pool := cfg.FramePool
	switch {
	case pool == 0:
		pool = DefaultFramePool
	case pool < 0:
		pool = 0
	}
	s.frames.init(uint32(s.npages), pool)
	s.subs.ended.L = &s.subs.Mutex
	return s, nil
}

// reserveFlags map the PROT_NONE reservation, and map it back over freed
// pages: the same flags let the kernel merge the pieces into one VMA again.
const reserveFlags = unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_NORESERVE

// Close unmaps both views and closes the memfd. It fails with ErrBusy
// while subscriptions or pins remain (their page tables point into the NIC
// view). Migrations not yet released need no cleanup. The other methods
// fail with ErrClosed afterwards; none may still be running when Close is
// called.
func (s *AddressSpace) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return ErrClosed
	}
	s.subs.Lock()
	nsubs := len(s.subs.list)
	s.subs.Unlock()
	if nsubs > 0 {
		return fmt.Errorf("%w: close: %d subscriptions remain", ErrBusy, nsubs)
	}
	if npins := s.frames.pinnedFrames(); npins > 0 {
		return fmt.Errorf("%w: close: %d frames pinned", ErrBusy, npins)
	}
	s.frames.drainPool(s)
	s.closed.Store(true)
	err := errors.Join(unix.MunmapPtr(s.appBase, s.size), unix.MunmapPtr(s.nicBase, s.size),
		unix.Close(s.fd))
	if err != nil {
		return fmt.Errorf("hostmem: close address space: %w", err)
	}
	return nil
}

// Bounds returns the reserved application range.
func (s *AddressSpace) Bounds() Range { return Range{s.base, s.base + uint64(s.size)} }

// AddrOf returns the address of b's first byte (b must not be empty).
func AddrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// FramePointer returns the NIC address of frame f's first byte.
func (s *AddressSpace) FramePointer(f Frame) unsafe.Pointer {
	if uintptr(f) >= s.npages {
		panic("hostmem: frame out of range")
	}
	return unsafe.Add(s.nicBase, uintptr(f)<<PageShift)
}

// FrameBytes returns the NIC's view of frame f (PageSize bytes). Reading a
// frame that holds no page allocates nothing: it reads zeros.
func (s *AddressSpace) FrameBytes(f Frame) []byte {
	return unsafe.Slice((*byte)(s.FramePointer(f)), PageSize)
}

// AppPointer returns the application's view of addr, which must lie inside
// Bounds: addr itself, as a pointer. What it points at follows the page
// map (Alloc, Free, Migrate).
func (s *AddressSpace) AppPointer(addr uint64) unsafe.Pointer {
	if addr < s.base || addr-s.base >= uint64(s.size) {
		panic("hostmem: address outside the address space")
	}
	return unsafe.Add(s.appBase, uintptr(addr-s.base))
}

// frameRun returns the NIC's view of n frames from f.
func (s *AddressSpace) frameRun(f Frame, n int) []byte {
	return unsafe.Slice((*byte)(s.FramePointer(f)), n<<PageShift)
}

// pageOf returns the page index of application address addr.
func (s *AddressSpace) pageOf(addr uint64) (uintptr, bool) {
	if addr < s.base || addr-s.base >= uint64(s.size) {
		return 0, false
	}
	return uintptr(addr-s.base) >> PageShift, true
}

// pte returns the entry of page p, or nil if its chunk was never created
// (no page in it was ever mapped).
func (s *AddressSpace) pte(p uintptr) *atomic.Uint64 {
	c := s.dir[p>>chunkShift].Load()
	if c == nil {
		return nil
	}
	return &c[p&(chunkPages-1)]
}

// ptePtr returns the entry of page p, creating its chunk. Called with mu.
func (s *AddressSpace) ptePtr(p uintptr) *atomic.Uint64 {
	d := &s.dir[p>>chunkShift]
	c := d.Load()
	if c == nil {
		c = new(ptChunk)
		d.Store(c)
	}
	return &c[p&(chunkPages-1)]
}

func (s *AddressSpace) appPtr(p uintptr) unsafe.Pointer { return unsafe.Add(s.appBase, p<<PageShift) }

// checkRange converts [addr, addr+size) to pages; addr must be page aligned.
func (s *AddressSpace) checkRange(op string, addr uint64, size int) (p, n uintptr, err error) {
	if s.closed.Load() {
		return 0, 0, ErrClosed
	}
	if size <= 0 {
		return 0, 0, fmt.Errorf("hostmem: %s %#x+%d: size must be positive", op, addr, size)
	}
	if addr&pageMask != 0 {
		return 0, 0, fmt.Errorf("hostmem: %s %#x+%d: address not page aligned", op, addr, size)
	}
	n = (uintptr(size) + pageMask) >> PageShift
	p, ok := s.pageOf(addr)
	if !ok || n > s.npages-p {
		return 0, 0, fmt.Errorf("%w: %s %#x+%d: outside the address space %v", ErrNotMapped, op, addr, size, s.Bounds())
	}
	return p, n, nil
}

// lockOpen takes mu, failing with ErrClosed (and mu not held) once the
// address space is closed: nothing may be mapped into a reservation that
// no longer exists.
func (s *AddressSpace) lockOpen() error {
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// checkMapped returns an error unless pages [p, p+n) are all mapped.
// Called with mu.
func (s *AddressSpace) checkMapped(op string, p, n uintptr) error {
	for i := p; i < p+n; i++ {
		if e := s.pte(i); e == nil || e.Load()&pteFrame == 0 {
			return fmt.Errorf("%w: %s: page %#x", ErrNotMapped, op, s.base+uint64(i)<<PageShift)
		}
	}
	return nil
}

// Alloc maps size bytes (rounded up to whole pages) of fresh frames at the
// lowest free application address and returns the application's view,
// zero-filled (len = size). The frames hold no memory until touched.
func (s *AddressSpace) Alloc(size int) ([]byte, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if size <= 0 {
		return nil, fmt.Errorf("hostmem: alloc %d bytes: size must be positive", size)
	}
	n := (uintptr(size) + pageMask) >> PageShift
	if err := s.lockOpen(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	p, ok := s.mu.free.take(n)
	if !ok {
		return nil, fmt.Errorf("%w: alloc %d bytes", ErrNoSpace, size)
	}
	if err := s.mapFresh(p, n); err != nil {
		s.mu.free.put(p, n)
		return nil, fmt.Errorf("hostmem: alloc %d bytes: %w", size, err)
	}
	return unsafe.Slice((*byte)(s.appPtr(p)), size), nil
}

// AllocAt is Alloc at a chosen address (page aligned, inside Bounds), like
// mmap with MAP_FIXED_NOREPLACE: it fails with ErrMapped if any page of the
// range is mapped.
func (s *AddressSpace) AllocAt(addr uint64, size int) ([]byte, error) {
	p, n, err := s.checkRange("alloc", addr, size)
	if err != nil {
		return nil, err
	}
	if err := s.lockOpen(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if !s.mu.free.takeAt(p, n) {
		return nil, fmt.Errorf("%w: alloc %#x+%d", ErrMapped, addr, size)
	}
	if err := s.mapFresh(p, n); err != nil {
		s.mu.free.put(p, n)
		return nil, fmt.Errorf("hostmem: alloc %#x+%d: %w", addr, size, err)
	}
	return unsafe.Slice((*byte)(s.appPtr(p)), size), nil
}

// mapFresh maps n fresh frames at pages [p, p+n). Called with mu.
func (s *AddressSpace) mapFresh(p, n uintptr) error {
	frames := make([]Frame, n)
	if err := s.frames.alloc(s, frames); err != nil {
		return err
	}
	if err := s.mapFrames(p, frames, nil); err != nil {
		s.frames.release(s, frames)
		return err
	}
	for i, f := range frames {
		s.ptePtr(p + uintptr(i)).Store(uint64(f) + 1)
	}
	s.mu.mapped += int(n)
	return nil
}

// mapFrames maps frames at pages [p, p+len(frames)) of the application's
// view with MAP_FIXED, one mmap per run of contiguous frames of equal
// protection (ro[i] set: PROT_READ; ro nil: all read-write). On failure
// the pages mapped so far are mapped PROT_NONE again.
func (s *AddressSpace) mapFrames(p uintptr, frames []Frame, ro []bool) error {
	for i := 0; i < len(frames); {
		j := i + 1
		for j < len(frames) && frames[j] == frames[j-1]+1 && (ro == nil || ro[j] == ro[i]) {
			j++
		}
		prot := unix.PROT_READ | unix.PROT_WRITE
		if ro != nil && ro[i] {
			prot = unix.PROT_READ
		}
		_, err := unix.MmapPtr(s.fd, int64(frames[i])<<PageShift, s.appPtr(p+uintptr(i)),
			uintptr(j-i)<<PageShift, prot, unix.MAP_SHARED|unix.MAP_FIXED)
		if err != nil {
			if i > 0 {
				_ = s.unmapApp(p, uintptr(i))
			}
			return fmt.Errorf("mmap %d frames at %#x: %w", j-i, s.base+uint64(p+uintptr(i))<<PageShift, err)
		}
		i = j
	}
	return nil
}

// unmapApp maps the reservation's PROT_NONE back over pages [p, p+n).
func (s *AddressSpace) unmapApp(p, n uintptr) error {
	_, err := unix.MmapPtr(-1, 0, s.appPtr(p), n<<PageShift, unix.PROT_NONE, reserveFlags|unix.MAP_FIXED)
	return err
}

// Free is the munmap of this world: it unmaps [addr, addr+size) (size
// rounded up to whole pages; every page must be mapped, by one Alloc or
// several). First every subscription overlapping the range gets its
// Invalidate callback (EventUnmap) and its sequence count stays odd until
// Free returns, so page tables drop their entries and wait for their
// copies in flight before anything changes; then the application's view
// of the range becomes PROT_NONE and the frames are released (their memory
// returned with a hole punch), except frames held by a Pin, which are
// released at their last Unpin (a pinned MR keeps its pages after munmap,
// as in the kernel). A later Alloc at the same address gets other frames.
func (s *AddressSpace) Free(addr uint64, size int) error {
	p, n, err := s.checkRange("free", addr, size)
	if err != nil {
		return err
	}
	if err := s.lockOpen(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := s.checkMapped("free", p, n); err != nil {
		return err
	}
	r := Range{addr, addr + uint64(n)<<PageShift}
	inv := s.invalidateStart(r, EventUnmap)
	defer s.invalidateEnd(inv)
	if err := s.unmapApp(p, n); err != nil {
		// The view is unchanged: the page tables fault the old frames in
		// again.
		return fmt.Errorf("hostmem: free %v: %w", r, err)
	}
	frames := make([]Frame, n)
	for i := range frames {
		frames[i] = Frame(s.pte(p+uintptr(i)).Swap(0)&pteFrame - 1)
	}
	s.frames.release(s, frames)
	s.mu.free.put(p, n)
	s.mu.mapped -= int(n)
	return nil
}

// Protect changes the application's access to [addr, addr+size): writable
// or read-only, with mprotect. Taking write access away is an invalidation
// (EventProtect), as mprotect is in the kernel: page tables drop their
// writable entries and fault again (read-only, or failing with
// ErrReadOnly). Giving it back needs none.
func (s *AddressSpace) Protect(addr uint64, size int, writable bool) error {
	p, n, err := s.checkRange("protect", addr, size)
	if err != nil {
		return err
	}
	if err := s.lockOpen(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := s.checkMapped("protect", p, n); err != nil {
		return err
	}
	prot := unix.PROT_READ | unix.PROT_WRITE
	if !writable {
		prot = unix.PROT_READ
		inv := s.invalidateStart(Range{addr, addr + uint64(n)<<PageShift}, EventProtect)
		defer s.invalidateEnd(inv)
	}
	if err := unix.Mprotect(unsafe.Slice((*byte)(s.appPtr(p)), n<<PageShift), prot); err != nil {
		return fmt.Errorf("hostmem: protect %#x+%d: %w", addr, size, err)
	}
	for i := p; i < p+n; i++ {
		e := s.pte(i)
		if writable {
			e.And(^uint64(pteReadOnly))
		} else {
			e.Or(pteReadOnly)
		}
	}
	return nil
}

// FrameOf returns the frame currently mapped at addr, without populating
// it.
func (s *AddressSpace) FrameOf(addr uint64) (Frame, bool) {
	p, ok := s.pageOf(addr)
	if !ok {
		return 0, false
	}
	e := s.pte(p)
	if e == nil {
		return 0, false
	}
	v := e.Load()
	if v&pteFrame == 0 {
		return 0, false
	}
	return Frame(v&pteFrame - 1), true
}

// Mapped reports whether the page holding addr is mapped (and writable, if
// write): whether a fault on it can succeed. It takes no lock, makes no
// system call and allocates nothing; the answer may be stale at once.
func (s *AddressSpace) Mapped(addr uint64, write bool) bool {
	if s.closed.Load() {
		return false
	}
	p, ok := s.pageOf(addr)
	if !ok {
		return false
	}
	e := s.pte(p)
	if e == nil {
		return false
	}
	v := e.Load()
	return v&pteFrame != 0 && (!write || v&pteReadOnly == 0)
}

// Resolve is the fault handler's look-up: the frame that currently backs
// the application page holding addr, its NIC address and whether it is
// writable. By default it makes no system call: the caller copies through
// the NIC's view (Page.NIC), where the kernel's page fault populates a
// page nobody has touched yet. With ResolvePopulate it populates a page
// not known to be held (MADV_POPULATE_WRITE on the NIC's view); with
// ResolveNoFault a page the host does not hold is ErrNotResident (known
// held, else checked with mincore). ResolveWrite on a read-only page is
// ErrReadOnly (the Page is filled in). An address not mapped is
// ErrNotMapped.
//
// Resolve takes no lock and allocates nothing. Its answer may be stale by
// the time it returns: a fault handler calls it between a subscription's
// ReadBegin and ReadRetry and installs the page only if ReadRetry says no
// invalidation ran (see Subscription). A population that races a Free or a
// migration of the page may fail or populate the new frame; ReadRetry
// tells the caller to resolve again.
func (s *AddressSpace) Resolve(addr uint64, acc Access) (Page, error) {
	if acc&(ResolvePopulate|ResolveNoFault) != 0 {
		var out [1]Page
		_, err := s.ResolveRange(addr, out[:], acc)
		return out[0], err
	}
	// The plain case without ResolveRange's loop (resolvePlain for one
	// page).
	if s.closed.Load() {
		return Page{}, ErrClosed
	}
	p, ok := s.pageOf(addr)
	if !ok {
		return Page{}, ErrNotMapped
	}
	e := s.pte(p)
	if e == nil {
		return Page{}, ErrNotMapped
	}
	v := e.Load()
	if v&pteFrame == 0 {
		return Page{}, ErrNotMapped
	}
	f := Frame(v&pteFrame - 1)
	pg := Page{Frame: f, NIC: unsafe.Add(s.nicBase, uintptr(f)<<PageShift), Writable: v&pteReadOnly == 0}
	if acc&ResolveWrite != 0 && !pg.Writable {
		return pg, ErrReadOnly
	}
	if v&ptePopulated == 0 {
		e.CompareAndSwap(v, v|ptePopulated) // as in resolvePlain
	}
	return pg, nil
}

// ResolveRange is Resolve for len(out) consecutive pages from addr's page,
// with one system call per run of pages that need one (ResolvePopulate,
// ResolveNoFault). It returns how many pages it resolved: all of them, or
// the index of the page that failed, with the error (out is filled in up
// to that page, and that page too for ErrReadOnly and ErrNotResident).
func (s *AddressSpace) ResolveRange(addr uint64, out []Page, acc Access) (int, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	p, ok := s.pageOf(addr)
	if !ok {
		return 0, ErrNotMapped
	}
	if uintptr(len(out)) > s.npages-p {
		return 0, ErrNotMapped
	}
	if acc&(ResolvePopulate|ResolveNoFault) == 0 {
		return s.resolvePlain(p, out, acc)
	}
	var vals [64]uint64 // entry values of the pages being settled
	for i := 0; i < len(out); {
		// Gather up to len(vals) mapped pages, stopping at one that
		// fails.
		run := 0
		var ferr error
		for i+run < len(out) && run < len(vals) {
			e := s.pte(p + uintptr(i+run))
			if e == nil {
				ferr = ErrNotMapped
				break
			}
			v := e.Load()
			if v&pteFrame == 0 {
				ferr = ErrNotMapped
				break
			}
			f := Frame(v&pteFrame - 1)
			out[i+run] = Page{Frame: f, NIC: unsafe.Add(s.nicBase, uintptr(f)<<PageShift), Writable: v&pteReadOnly == 0}
			if acc&ResolveWrite != 0 && v&pteReadOnly != 0 {
				ferr = ErrReadOnly
				break
			}
			vals[run] = v
			run++
		}
		if run > 0 {
			if k, err := s.settle(p+uintptr(i), vals[:run], acc); err != nil {
				return i + k, err
			}
		}
		i += run
		if ferr != nil {
			return i, ferr
		}
	}
	return len(out), nil
}

// resolvePlain is ResolveRange without ResolvePopulate and ResolveNoFault,
// the fault handler's path: no system call, and no scratch array to clear.
func (s *AddressSpace) resolvePlain(p uintptr, out []Page, acc Access) (int, error) {
	for i := range out {
		e := s.pte(p + uintptr(i))
		if e == nil {
			return i, ErrNotMapped
		}
		v := e.Load()
		if v&pteFrame == 0 {
			return i, ErrNotMapped
		}
		f := Frame(v&pteFrame - 1)
		out[i] = Page{Frame: f, NIC: unsafe.Add(s.nicBase, uintptr(f)<<PageShift), Writable: v&pteReadOnly == 0}
		if acc&ResolveWrite != 0 && v&pteReadOnly != 0 {
			return i, ErrReadOnly
		}
		if v&ptePopulated == 0 {
			// Held from now on: the caller's copy touches it. Lose
			// the race with a Free or Migrate quietly: the entry is
			// theirs then, and the caller's ReadRetry will say so.
			e.CompareAndSwap(v, v|ptePopulated)
		}
	}
	return len(out), nil
}

// settle does what acc (ResolvePopulate or ResolveNoFault) asks for the
// pages from page p whose entries had the values vals, for those not known
// to be held: populate them, or check that they are resident; then mark
// them held. It returns how many pages are settled before an error.
func (s *AddressSpace) settle(p uintptr, vals []uint64, acc Access) (int, error) {
	mark := func(i, j int) {
		for k := i; k < j; k++ {
			if vals[k]&ptePopulated == 0 {
				// Lose the race with a Free or Migrate quietly: the
				// entry is theirs then, and the caller's ReadRetry will
				// say so.
				s.pte(p+uintptr(k)).CompareAndSwap(vals[k], vals[k]|ptePopulated)
			}
		}
	}
	for i := 0; i < len(vals); {
		if vals[i]&ptePopulated != 0 {
			i++
			continue
		}
		// A run of pages not known to be held, of one protection.
		j := i + 1
		for j < len(vals) && vals[j]&ptePopulated == 0 && vals[j]&pteReadOnly == vals[i]&pteReadOnly {
			j++
		}
		var err error
		n := j - i
		if acc&ResolveNoFault != 0 {
			n, err = s.resident(p+uintptr(i), vals[i:j])
		} else {
			err = s.populateFrames(vals[i:j])
		}
		mark(i, i+n)
		if err != nil {
			return i + n, err
		}
		i = j
	}
	return len(vals), nil
}

// populateFrames populates the frames of the page-map entries vals (one
// protection) through the NIC's view, where ODP tables copy, so that their
// copies take no page fault: MADV_POPULATE_WRITE, or _READ for read-only
// pages (a read fault of a shared memfd page allocates it too), one call
// per run of consecutive frames. On a kernel without them the frames are
// touched. The NIC view stays mapped until Close; a population that races
// a Free of the page may give memory back to a freed frame, which keeps it
// until the frame is used again or the pool punches it.
func (s *AddressSpace) populateFrames(vals []uint64) error {
	write := vals[0]&pteReadOnly == 0
	for i := 0; i < len(vals); {
		j := i + 1
		for j < len(vals) && vals[j]&pteFrame == vals[j-1]&pteFrame+1 {
			j++
		}
		s.stats.syscalls.Add(1)
		f := Frame(vals[i]&pteFrame - 1)
		ok, err := madvisePopulate(uintptr(s.FramePointer(f)), uintptr(j-i), write)
		if err != nil {
			return err
		}
		if !ok {
			for _, v := range vals[i:j] {
				touch(s.FrameBytes(Frame(v&pteFrame-1)), true)
			}
		}
		i = j
	}
	s.stats.populated.Add(int64(len(vals)))
	return nil
}

// resident reports how many of the len(vals) pages from page p are
// resident in the memfd, counting from the first, with ErrNotResident if
// not all: mincore on the application's view (residency in the page cache
// of the file, so a page the application or the NIC touched through
// either view counts).
func (s *AddressSpace) resident(p uintptr, vals []uint64) (int, error) {
	var vec [64]byte
	n := len(vals)
	s.stats.syscalls.Add(1)
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(s.appPtr(p)), uintptr(n)<<PageShift,
		uintptr(unsafe.Pointer(&vec[0])))
	if e != 0 {
		return 0, fmt.Errorf("hostmem: mincore: %w", e)
	}
	for k, v := range vec[:n] {
		if v&1 == 0 {
			return k, ErrNotResident
		}
	}
	return n, nil
}

// Stats are counters of an AddressSpace.
type Stats struct {
	MappedPages  int // application pages mapped
	FramesInUse  int // frames mapped, held by pins after a Free, or held by migrations
	FramesFree   int // released frames waiting to be reused (punched out: they read zeros)
	FramesPooled int // frames in the migration pool (memory and old bytes kept, for migrations only)
	// FramesPooledLocked are the pooled frames kept locked for pinned
	// migrations (only when the process may lock without limit).
	FramesPooledLocked int
	FramesUnused       int   // frames never handed out
	Populated          int64 // pages Resolve populated (ResolvePopulate)
	Syscalls           int64 // system calls Resolve made (madvise, mincore)
	Invalidations      int64 // Invalidate callbacks made
	MigratedPages      int64 // pages moved by committed migrations
}

// Stats returns the current counters.
func (s *AddressSpace) Stats() Stats {
	s.mu.Lock()
	mapped := s.mu.mapped
	s.mu.Unlock()
	inUse, free, pooled, pooledLocked, unused := s.frames.counts()
	return Stats{
		MappedPages:        mapped,
		FramesInUse:        inUse,
		FramesFree:         free,
		FramesPooled:       pooled,
		FramesPooledLocked: pooledLocked,
		FramesUnused:       unused,
		Populated:          s.stats.populated.Load(),
		Syscalls:           s.stats.syscalls.Load(),
		Invalidations:      s.stats.invalidations.Load(),
		MigratedPages:      s.stats.migrated.Load(),
	}
}
