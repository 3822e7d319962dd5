package pagetable

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/softrdma/softrdma/hostmem"
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
// cleared, and from now on every page the NIC writes gets its Dirty bit.
// The caller must first have withdrawn the key's linear mapping and waited
// for the copies that used it (stag ClearLinear, Synchronize, Drain).
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
func (t *Table) SwitchFrames(frames []hostmem.Frame) error {
	if t.fp == nil {
		return errors.New("pagetable: switch frames of a table not made by NewPinnedFrames")
	}
	if len(frames) != len(t.pages) {
		return fmt.Errorf("pagetable: switch frames: %d frames for %d pages", len(frames), len(t.pages))
	}
	t.seq.Add(1)
	t.setFrames(t.fpAS(), frames)
	t.track.Store(false)
	for k := range t.pages {
		t.pages[k].flags.And(^uint32(Dirty))
	}
	t.seq.Add(1)
	return nil
}

// StopTracking ends dirty tracking without a switch (a remap that failed);
// the table becomes direct again if its frames are contiguous.
func (t *Table) StopTracking() {
	t.track.Store(false)
	if t.fp != nil {
		t.setFrames(t.fpAS(), t.fp.Frames())
	}
}

func (t *Table) fpAS() *hostmem.AddressSpace { return t.fp.AddressSpace() }
