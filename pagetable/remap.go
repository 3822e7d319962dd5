package pagetable

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/internal/memcopy"
)

// NewPinnedFrames builds the table of a pinned region of a host address
// space: mem must lie in as. The region's pages are pinned as frames
// (AddressSpace.Pin: referenced, charged to acct, locked), and the entries
// point at the frames through the NIC's view, so that the region can later
// be remapped to other frames (FramePin.PrepareMigrate, SwitchFrames)
// while the application's view moves with it. writable sets the Writable
// bit. Errors: those of Pin (ErrPinLimit, ErrNotMapped, ErrReadOnly).
func NewPinnedFrames(as *hostmem.AddressSpace, acct *hostmem.PinAccount, mem []byte, writable bool) (*Table, error) {
	if len(mem) == 0 {
		return nil, errors.New("pagetable: empty region")
	}
	addr := hostmem.AddrOf(mem)
	head := addr & pageMask
	n := (head + uint64(len(mem)) + pageMask) >> PageShift
	fp, err := as.Pin(acct, addr-head, int(n<<PageShift), writable)
	if err != nil {
		return nil, fmt.Errorf("pagetable: %w", err)
	}
	t := &Table{iova: addr, length: uint64(len(mem)), head: head, pages: make([]entry, n), mem: mem, fp: fp, writable: writable}
	flags := Present
	if writable {
		flags |= Writable
	}
	t.setFrames(as, fp.Frames())
	for k := range t.pages {
		t.pages[k].flags.Store(uint32(flags))
	}
	return t, nil
}

// setFrames points the entries at frames (one per page) and makes the
// table direct when they are contiguous.
func (t *Table) setFrames(as *hostmem.AddressSpace, frames []hostmem.Frame) {
	for k, f := range frames {
		p := as.FramePointer(f)
		if k == 0 {
			p = unsafe.Add(p, t.head)
		}
		t.pages[k].frame.Store((*byte)(p))
	}
	contiguous := true
	for k := 1; k < len(frames); k++ {
		if frames[k] != frames[k-1]+1 {
			contiguous = false
			break
		}
	}
	if contiguous {
		t.flatp.Store(t.pages[0].frame.Load())
		t.direct.Store(true)
	}
}

// FramePin returns the pin of a table made by NewPinnedFrames (nil
// otherwise): the frames a remap moves.
func (t *Table) FramePin() *hostmem.FramePin { return t.fp }

// StartTracking begins the dirty tracking of a remap: direct access is
// turned off, so that every copy walks the entries, the Dirty bits are
// cleared, and every copy that starts from now on sets the Dirty bit of
// the pages it writes. A copy already past its check (direct, or tracking
// off) sets none: the caller withdraws the key's linear mapping first
// (stag ClearLinear) and, after StartTracking, waits for the copies in
// flight (Synchronize, Drain) before it reads the pages.
func (t *Table) StartTracking() {
	t.direct.Store(false)
	t.seq.Add(1)
	for k := range t.pages {
		t.pages[k].flags.And(^uint32(Dirty))
	}
	t.track.Store(true)
	t.seq.Add(1)
}

// DirtyPages returns the indices of the pages written since StartTracking.
func (t *Table) DirtyPages() []int {
	var out []int
	for k := range t.pages {
		if Flags(t.pages[k].flags.Load())&Dirty != 0 {
			out = append(out, k)
		}
	}
	return out
}

// SwitchFrames points a table made by NewPinnedFrames at frames (one per
// page: the pin's frames after the remap committed), ends dirty tracking
// and makes the table direct again if the frames are contiguous. The
// caller has stopped every write (a suspension) and waited for the copies
// in flight; copies that only read may run meanwhile (old and new frames
// hold the same bytes).
func (t *Table) SwitchFrames(frames []hostmem.Frame) error { return t.switchFrames(frames, nil) }

// switchFrames is SwitchFrames; between, if not nil, runs once the entries
// point at the new frames, before the mirror ends (a test runs atomics
// there).
func (t *Table) switchFrames(frames []hostmem.Frame, between func()) error {
	if t.fp == nil {
		return errors.New("pagetable: switch frames of a table not made by NewPinnedFrames")
	}
	if len(frames) != len(t.pages) {
		return fmt.Errorf("pagetable: switch frames: %d frames for %d pages", len(frames), len(t.pages))
	}
	t.seq.Add(1)
	t.setFrames(t.fpAS(), frames)
	if between != nil {
		between()
	}
	// After the frames (see CopyIn): from here on a copy that finds no
	// mirror finds the new frames. Under mirrorMu: see mirrorWord64.
	t.clearMirror()
	t.track.Store(false)
	for k := range t.pages {
		t.pages[k].flags.And(^uint32(Dirty))
	}
	t.seq.Add(1)
	return nil
}

// Mirror is the new frames of a remap as the NIC writes them while the
// view switches (NewMirror, StartMirror).
type Mirror struct {
	t     *Table
	pages []*byte // NIC-side address of each page's new frame (page 0: of the region's first byte)
}

// NewMirror prepares the mirror of frames (one per page: the new frames of
// a remap), outside the critical section: StartMirror then only installs
// it. Errors: a table not made by NewPinnedFrames, a wrong number of
// frames.
func (t *Table) NewMirror(frames []hostmem.Frame) (*Mirror, error) {
	if t.fp == nil {
		return nil, errors.New("pagetable: mirror of a table not made by NewPinnedFrames")
	}
	if len(frames) != len(t.pages) {
		return nil, fmt.Errorf("pagetable: mirror: %d frames for %d pages", len(frames), len(t.pages))
	}
	as := t.fpAS()
	m := &Mirror{t: t, pages: make([]*byte, len(frames))}
	for k, f := range frames {
		p := as.FramePointer(f)
		if k == 0 {
			p = unsafe.Add(p, t.head)
		}
		m.pages[k] = (*byte)(p)
	}
	return m, nil
}

// StartMirror makes the NIC's writes go to m's frames as well as to the
// current ones, until SwitchFrames makes them the only ones (or
// StopTracking abandons them). It lets a remap resume placement before the
// application's view has switched (an mmap, tens of µs): the application
// reads the old frames until then, the new ones after, and both receive
// every write. Needs dirty tracking on (direct access off), and the
// caller must have stopped every write and waited for those in flight, so
// that old and new frames hold the same bytes. Concurrent writes of
// overlapping bytes by different QPs may leave the two frames different,
// as they may leave the bytes in any order (IBTA orders operations within
// a QP only). Errors: a mirror of another table, tracking off.
func (t *Table) StartMirror(m *Mirror) error {
	if m == nil || m.t != t {
		return errors.New("pagetable: mirror of another table")
	}
	if !t.track.Load() {
		return errors.New("pagetable: mirror without dirty tracking")
	}
	t.mirror.Store(&m.pages)
	return nil
}

// clearMirror ends the mirror, under mirrorMu so that no mirrored atomic
// is between its operation and its copy (mirrorWord64).
func (t *Table) clearMirror() {
	t.mirrorMu.Lock()
	t.mirror.Store(nil)
	t.mirrorMu.Unlock()
}

// copyMirror copies src, the bytes just written at region offset off, to
// the mirror frames, page by page.
func (t *Table) copyMirror(m []*byte, off uint64, src []byte) {
	for len(src) > 0 {
		n := min(uint64(len(src)), PageSize-(off+t.head)&pageMask)
		memcopy.Copy(unsafe.Slice((*byte)(t.mirrorAt(m, off)), n), src[:n])
		src = src[n:]
		off += n
	}
}

// mirrorAt returns the mirror's address of region offset off (page 0's
// entry is the region's first byte, as in run).
func (t *Table) mirrorAt(m []*byte, off uint64) unsafe.Pointer {
	v := off + t.head
	k := int(v >> PageShift)
	in := v & pageMask
	if k == 0 {
		in -= t.head
	}
	return unsafe.Add(unsafe.Pointer(m[k]), in)
}

// mirrorWord64 runs op on the word at iova (an atomic that found the
// mirror m) and copies the result to the word's new frame, the mirror's
// atomics serialized so that the new word ends with the last result. If
// SwitchFrames ended the mirror meanwhile (it clears it under mirrorMu),
// the word is looked up and op runs on the new frame alone: an atomic
// that found no mirror may be running on it, and the old word's value must
// not be copied over its result. While the mirror lasts the word is also
// looked up under mirrorMu, not before: SwitchFrames points the entries at
// the new frames before it ends the mirror, so another mirrored atomic may
// have run on the new word since this one found the old word, and op on
// the old word would not see its result (and copying the old word over the
// new one would lose it).
func (t *Table) mirrorWord64(m []*byte, iova uint64, op func(*uint64) uint64) (uint64, Result) {
	t.mirrorMu.Lock()
	if t.mirror.Load() == nil {
		t.mirrorMu.Unlock()
		w, r := t.Word64(iova, true)
		if r != OK {
			return 0, r
		}
		return op(w), OK
	}
	defer t.mirrorMu.Unlock()
	w, res := t.Word64(iova, true)
	if res != OK {
		return 0, res
	}
	r := op(w)
	if nw := (*uint64)(t.mirrorAt(m, iova-t.iova)); nw != w {
		atomic.StoreUint64(nw, atomic.LoadUint64(w))
	}
	return r, OK
}

// AtomicWord runs op (an atomic read-modify-write returning the original
// value) on the 64-bit word at iova, which the NIC writes: Word64's checks
// and results (OutOfRange, Misaligned, NotPresent, NoPermission), then op
// on the word; during a remap's mirror (StartMirror) the word's new frame
// gets the result too. It allocates nothing.
func (t *Table) AtomicWord(iova uint64, op func(*uint64) uint64) (uint64, Result) {
	mirror := t.mirror.Load() // before the frame: see CopyIn
	w, r := t.Word64(iova, true)
	if r != OK {
		return 0, r
	}
	if mirror != nil {
		return t.mirrorWord64(*mirror, iova, op)
	}
	return op(w), OK
}

// StopTracking ends dirty tracking without a switch (a remap that failed);
// the table becomes direct again if its frames are contiguous.
func (t *Table) StopTracking() {
	t.clearMirror()
	t.track.Store(false)
	if t.fp != nil {
		t.setFrames(t.fpAS(), t.fp.Frames())
	}
}

func (t *Table) fpAS() *hostmem.AddressSpace { return t.fp.AddressSpace() }
