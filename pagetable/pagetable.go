// Package pagetable is the NIC's translation table of one memory region:
// one entry per page of the region, holding the frame the NIC reaches the
// page through and the page's present and writable bits, plus a sequence
// count for the demand-paging protocol (the analogue of Linux's
// mmu_interval_notifier: read_begin / read_retry). The copy loops walk the
// table page by page and never assume that frames are contiguous.
//
// Two kinds of table share the flags: Table, a pinned region, whose
// entries (frame and flags) are present from registration to release and
// point into the NIC's view of the memory; and ODP, an on-demand region
// (explicit or implicit), whose entries (flags and the frame a fault
// resolved, reached through the NIC's view too) start not present, and are
// filled by Fault and cleared by invalidation and by the Budget's eviction
// (see odp.go and docs/odp.md). Remapping (dirty bits, switching frames)
// builds on the same flags and sequence count; see docs/memory.md.
package pagetable

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/internal/memcopy"
)

// Page geometry (the host's base page; see hostmem).
const (
	PageShift = hostmem.PageShift
	PageSize  = 1 << PageShift
	pageMask  = PageSize - 1
)

// Flags are the per-page bits of an entry.
type Flags uint32

// Entry flags. The layout leaves room for more bits (a large-page bit, an
// eviction candidate bit).
const (
	// Present: the frame may be used. Cleared by invalidation (ODP) or
	// release; a copy that meets a non-present page stops with NotPresent.
	Present Flags = 1 << iota
	// Writable: the NIC may write the page (the region has LOCAL_WRITE; for
	// ODP, the page was faulted in for writing).
	Writable
	// Dirty: the NIC wrote the page since the bit was last cleared. Set by
	// the copy loops of tables that track dirtiness (remap, issue 4).
	Dirty
	// Accessed: the NIC used the page since the bit was last cleared
	// (eviction, issue 3).
	Accessed
)

func (f Flags) String() string {
	if f == 0 {
		return "0"
	}
	s := ""
	for i, n := range []string{"present", "writable", "dirty", "accessed"} {
		if f&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	if rest := f &^ (Present | Writable | Dirty | Accessed); rest != 0 {
		if s != "" {
			s += "|"
		}
		s += fmt.Sprintf("%#x", uint32(rest))
	}
	return s
}

// Result is the outcome of a translation or copy, a value rather than an
// error because it is produced per packet.
type Result uint8

// Translation outcomes.
const (
	OK Result = iota
	// NotPresent: a page in the range is not present. For a demand-paged
	// table the caller faults it in and retries ("would fault"); a pinned
	// table returns it only after Release.
	NotPresent
	// NoPermission: a page is present but not writable and the access
	// writes.
	NoPermission
	// OutOfRange: the range is not inside the table.
	OutOfRange
	// Misaligned: an atomic word's address is not 8-byte aligned.
	Misaligned
)

func (r Result) String() string {
	switch r {
	case OK:
		return "ok"
	case NotPresent:
		return "not present"
	case NoPermission:
		return "no permission"
	case OutOfRange:
		return "out of range"
	case Misaligned:
		return "misaligned"
	}
	return fmt.Sprintf("Result(%d)", uint8(r))
}

// entry is one page. The frame points at the first byte of the region in
// that page: the page's start, except for the first page of a region that
// does not begin on a page boundary, where it is the region's first byte
// (a pointer to the page start could point into another Go object). Both
// words are atomics so that demand paging can change them while readers
// run, under the table's sequence count.
type entry struct {
	frame atomic.Pointer[byte]
	flags atomic.Uint32
}

// Table translates the I/O virtual addresses of one region to frames.
//
// A pinned table is immutable between NewPinned and Release, so its
// readers need no lock and no sequence check; its methods are safe for
// concurrent use. The region must not be released while a copy runs:
// placement guarantees that by invalidating the region's key and draining
// its in-flight references first.
type Table struct {
	iova   uint64 // IOVA of the region's first byte
	length uint64 // bytes in the region
	head   uint64 // offset of the first byte within its page
	pages  []entry

	// seq is the sequence count of the mmu_interval_notifier protocol: odd
	// while an invalidation updates entries. A fault handler reads it with
	// ReadBegin before it resolves a page and installs the entry only if
	// ReadRetry says that no invalidation ran meanwhile. Pinned tables
	// never change it.
	seq atomic.Uint64

	// direct is set while the whole region may be accessed through flat:
	// a pinned table whose frames are one contiguous run. It is cleared by
	// Release (and, later, by anything that changes frames or needs the
	// per-page bits maintained: remap, dirty tracking), after which the
	// copies walk the entries.
	direct   atomic.Bool
	flatp    atomic.Pointer[byte] // first NIC-side byte of the whole region when direct
	writable bool                 // pinned tables: every page has the Writable bit

	// Owned resources, released by Release.
	mem      []byte            // the registered bytes, kept alive
	pins     []*hostmem.Pin    // one per run of contiguous frames
	held     []*hostmem.Buffer // memfd buffers whose NIC mapping we use
	fp       *hostmem.FramePin // frames of a host address space (NewPinnedFrames)
	released atomic.Bool

	// track is set while a remap tracks the pages the NIC writes: the
	// copies walk the entries (direct is off) and set Dirty.
	track atomic.Bool

	// mirror, while a remap's view switch is under way (StartMirror to
	// SwitchFrames), holds the NIC-side address of each page's new frame
	// (page 0's at the region's first byte, as frame): CopyIn writes
	// both frames, and atomics write the new word after the old one
	// (AtomicWord, under mirrorMu).
	mirror   atomic.Pointer[[]*byte]
	mirrorMu sync.Mutex
}

// NewPinned builds the table of a pinned region: the region is mem, its
// first byte has I/O virtual address iova. Each page is resolved through
// space (nil: every page is its own frame), prefaulted and mlocked through
// acct (which enforces the pin limit), and entered present; writable sets
// the Writable bit (and prefaults for writing). The table keeps mem
// referenced until Release.
func NewPinned(iova uint64, mem []byte, space *hostmem.Space, acct *hostmem.PinAccount, writable bool) (*Table, error) {
	if len(mem) == 0 {
		return nil, errors.New("pagetable: empty region")
	}
	if acct == nil {
		return nil, errors.New("pagetable: a pinned table needs a pin account")
	}
	if uint64(len(mem))-1 > math.MaxUint64-iova {
		return nil, errors.New("pagetable: region wraps the I/O address space")
	}
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	head := uint64(addr & pageMask)
	n := (head + uint64(len(mem)) + pageMask) >> PageShift
	t := &Table{
		iova:   iova,
		length: uint64(len(mem)),
		head:   head,
		pages:  make([]entry, n),
		mem:    mem,
	}
	flags := Present
	if writable {
		flags |= Writable
	}
	// Resolve each page, noting the buffers the frames live in.
	for k := range t.pages {
		app := unsafe.Pointer(&mem[t.pageStart(k)])
		frame, buf := space.Resolve(app)
		if buf != nil && !t.holds(buf) {
			if err := buf.Hold(); err != nil {
				t.unwind()
				return nil, fmt.Errorf("pagetable: %w", err)
			}
			t.held = append(t.held, buf)
		}
		t.pages[k].frame.Store((*byte)(frame))
	}
	// Pin each run of contiguous frames (normally one run: the region
	// itself, or its part of a buffer's NIC mapping).
	for k := 0; k < len(t.pages); {
		j := k + 1
		for j < len(t.pages) && t.contiguous(j) {
			j++
		}
		run := unsafe.Slice(t.pages[k].frame.Load(), t.pageEnd(j-1)-t.pageStart(k))
		p, err := acct.Pin(run, writable)
		if err != nil {
			t.unwind()
			return nil, err
		}
		t.pins = append(t.pins, p)
		k = j
	}
	for k := range t.pages {
		t.pages[k].flags.Store(uint32(flags))
	}
	t.writable = writable
	if len(t.pins) == 1 {
		t.flatp.Store(t.pages[0].frame.Load())
		t.direct.Store(true)
	}
	return t, nil
}

// flat returns the NIC-side bytes of the whole region (direct tables).
func (t *Table) flat() []byte { return unsafe.Slice(t.flatp.Load(), t.length) }

func (t *Table) holds(b *hostmem.Buffer) bool {
	for _, h := range t.held {
		if h == b {
			return true
		}
	}
	return false
}

// unwind releases what a failed NewPinned acquired.
func (t *Table) unwind() {
	for _, p := range t.pins {
		_ = p.Unpin()
	}
	for _, b := range t.held {
		b.Unhold()
	}
	t.pins, t.held = nil, nil
}

// pageStart returns the region offset of the first region byte in page k.
func (t *Table) pageStart(k int) uint64 {
	if k == 0 {
		return 0
	}
	return uint64(k)<<PageShift - t.head
}

// pageEnd returns the region offset just past the last region byte in page k.
func (t *Table) pageEnd(k int) uint64 {
	return min(uint64(k+1)<<PageShift-t.head, t.length)
}

// contiguous reports whether page k's frame directly follows page k-1's.
// Addresses are compared as integers; no pointer is formed.
func (t *Table) contiguous(k int) bool {
	prev := uintptr(unsafe.Pointer(t.pages[k-1].frame.Load()))
	cur := uintptr(unsafe.Pointer(t.pages[k].frame.Load()))
	return cur == prev+uintptr(t.pageEnd(k-1)-t.pageStart(k-1))
}

// Release unpins the region and marks every entry not present. The caller
// must make sure that no copy is running or will start (placement drains
// the region's key first).
func (t *Table) Release() error {
	if !t.released.CompareAndSwap(false, true) {
		return errors.New("pagetable: table released twice")
	}
	t.direct.Store(false)
	t.seq.Add(1)
	for k := range t.pages {
		t.pages[k].flags.Store(0)
		t.pages[k].frame.Store(nil)
	}
	t.seq.Add(1)
	var errs []error
	for _, p := range t.pins {
		errs = append(errs, p.Unpin())
	}
	for _, b := range t.held {
		b.Unhold()
	}
	if t.fp != nil {
		errs = append(errs, t.fp.Unpin())
	}
	t.pins, t.held, t.mem, t.fp = nil, nil, nil, nil
	return errors.Join(errs...)
}

// IOVA returns the I/O virtual address of the region's first byte.
func (t *Table) IOVA() uint64 { return t.iova }

// Len returns the region's length in bytes.
func (t *Table) Len() uint64 { return t.length }

// Pages returns the number of entries (pages the region touches).
func (t *Table) Pages() int { return len(t.pages) }

// Frame returns page k's frame (the NIC-side address of the region's first
// byte in that page) and flags. A non-present page has a nil frame.
func (t *Table) Frame(k int) (unsafe.Pointer, Flags) {
	e := &t.pages[k]
	f := Flags(e.flags.Load())
	return unsafe.Pointer(e.frame.Load()), f
}

// ReadBegin starts a read section of the sequence-count protocol: it
// returns the current count, waiting out an update in progress.
func (t *Table) ReadBegin() uint64 {
	for {
		s := t.seq.Load()
		if s&1 == 0 {
			return s
		}
	}
}

// ReadRetry reports whether the table changed since ReadBegin returned
// seq, in which case what was read must be discarded.
func (t *Table) ReadRetry(seq uint64) bool { return t.seq.Load() != seq }

// offset checks that [iova, iova+n) lies in the region, without overflow,
// and returns the region offset of iova.
func (t *Table) offset(iova, n uint64) (uint64, bool) {
	if iova < t.iova || n > t.length || iova-t.iova > t.length-n {
		return 0, false
	}
	return iova - t.iova, true
}

// run returns the longest run of NIC-side bytes, at most n, that starts at
// region offset off and whose pages are present (and writable if write),
// with contiguous frames. n is positive and off+n is inside the region.
func (t *Table) run(off, n uint64, write bool) ([]byte, Result) {
	need := Present
	if write {
		need |= Writable
	}
	v := off + t.head // offset from the first page's start
	k := int(v >> PageShift)
	e := &t.pages[k]
	if Flags(e.flags.Load())&need != need {
		return nil, missing(Flags(e.flags.Load()))
	}
	in := v & pageMask
	if k == 0 {
		in -= t.head // page 0's frame is the region's first byte
	}
	p := unsafe.Add(unsafe.Pointer(e.frame.Load()), in)
	got := min(n, PageSize-v&pageMask)
	k0 := k
	for got < n {
		k++
		e := &t.pages[k]
		if Flags(e.flags.Load())&need != need ||
			uintptr(unsafe.Pointer(e.frame.Load())) != uintptr(p)+uintptr(got) {
			k--
			break
		}
		got += min(n-got, PageSize)
	}
	if write && t.track.Load() {
		for j := k0; j <= k; j++ {
			if f := &t.pages[j].flags; Flags(f.Load())&Dirty == 0 {
				f.Or(uint32(Dirty))
			}
		}
	}
	return unsafe.Slice((*byte)(p), got), OK
}

func missing(f Flags) Result {
	if f&Present == 0 {
		return NotPresent
	}
	return NoPermission
}

// Translate returns the NIC-side bytes for the first part of
// [iova, iova+n): the longest prefix whose frames are contiguous and whose
// pages allow the access (write: the NIC writes). A caller walks a range
// by calling Translate again at iova+len(result) until n bytes are done.
// n must be positive. It allocates nothing.
func (t *Table) Translate(iova uint64, n int, write bool) ([]byte, Result) {
	off, ok := t.offset(iova, uint64(n))
	if !ok || n <= 0 {
		return nil, OutOfRange
	}
	if t.direct.Load() && (t.writable || !write) {
		return t.flat()[off : off+uint64(n)], OK
	}
	return t.run(off, uint64(n), write)
}

// Linear returns the NIC-side bytes of the whole region, and whether the
// NIC may write them, when the table allows direct access (a pinned table
// whose frames form one contiguous run); nil otherwise. Placement installs
// them as the linear mapping of the region's key (stag.Table.SetLinear), so
// that the data path translates a range by an offset without reading the
// table. Anything that later changes frames or needs the per-page bits
// maintained (remap, dirty tracking) must first have that mapping withdrawn
// (stag.Table.ClearLinear), then clear direct and bump the sequence count
// (StartTracking), and only then wait for the copies in flight
// (Synchronize and Drain), which may have used the mapping or found the
// table direct.
func (t *Table) Linear() (flat []byte, writable bool) {
	if !t.direct.Load() {
		return nil, false
	}
	return t.flat(), t.writable
}

// CopyIn copies src into the region at iova (the NIC writes memory). It
// checks the whole range first: when it returns OutOfRange nothing was
// copied. A page that is not present or not writable stops the copy; the
// bytes before it have been copied and their number is returned.
func (t *Table) CopyIn(iova uint64, src []byte) (int, Result) {
	off, ok := t.offset(iova, uint64(len(src)))
	if !ok {
		return 0, OutOfRange
	}
	if t.direct.Load() && t.writable {
		memcopy.Copy(t.flat()[off:off+uint64(len(src))], src) // the range was checked
		return len(src), OK
	}
	// The mirror is loaded before the frames (run): SwitchFrames stores
	// the new frames before it clears the mirror, so a copy that finds no
	// mirror writes the new frames.
	mirror := t.mirror.Load()
	done := 0
	for done < len(src) {
		dst, r := t.run(off+uint64(done), uint64(len(src)-done), true)
		if r != OK {
			return done, r
		}
		n := min(len(dst), len(src)-done)
		memcopy.Copy(dst[:n], src[done:])
		if mirror != nil {
			t.copyMirror(*mirror, off+uint64(done), src[done:done+n])
		}
		done += n
	}
	return done, OK
}

// CopyOut copies from the region at iova into dst (the NIC reads memory),
// with the checks of CopyIn.
func (t *Table) CopyOut(iova uint64, dst []byte) (int, Result) {
	off, ok := t.offset(iova, uint64(len(dst)))
	if !ok {
		return 0, OutOfRange
	}
	if t.direct.Load() {
		memcopy.Copy(dst, t.flat()[off:off+uint64(len(dst))]) // the range was checked
		return len(dst), OK
	}
	done := 0
	for done < len(dst) {
		src, r := t.run(off+uint64(done), uint64(len(dst)-done), false)
		if r != OK {
			return done, r
		}
		n := min(len(dst)-done, len(src))
		memcopy.Copy(dst[done:done+n], src)
		done += n
	}
	return done, OK
}

// Word64 returns the 64-bit word at iova for an atomic operation. iova must
// be 8-byte aligned (IBTA requires naturally aligned atomics); an aligned
// word never straddles pages. The frame is aligned like iova for regions
// whose IOVA is their address (and for buffers' NIC mappings, which keep
// page offsets); a frame that is not is reported Misaligned too.
func (t *Table) Word64(iova uint64, write bool) (*uint64, Result) {
	if iova&7 != 0 {
		return nil, Misaligned
	}
	b, r := t.Translate(iova, 8, write)
	if r != OK {
		return nil, r
	}
	if len(b) != 8 || uintptr(unsafe.Pointer(&b[0]))&7 != 0 {
		return nil, Misaligned
	}
	return (*uint64)(unsafe.Pointer(&b[0])), OK
}
