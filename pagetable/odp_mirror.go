package pagetable

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/internal/memcopy"
)

// ODPMirror is the new frames of a remap of an on-demand table's pages, as
// the NIC writes them while the application's view switches (NewMirror,
// StartMirror, SwitchMirrored): the counterpart of Table's Mirror for a
// table whose entries a remap leaves present (it keeps the table out of
// its invalidation, so that the table's faults do not wait for the
// switch).
type ODPMirror struct {
	t      *ODP
	off    uint64          // byte offset from the table's base of the first mirrored page
	pages  []*byte         // NIC-side address of each mirrored page's new frame
	frames []hostmem.Frame // the new frames
}

// NewMirror prepares the mirror of the pages of [addr, addr+len(frames)
// pages) (addr page-aligned, inside the table) onto frames, one per page,
// through the NIC's view of the host address space: built outside the
// critical section, so that StartMirror only installs it. Errors: an
// implicit table, a range outside the table.
func (t *ODP) NewMirror(addr uint64, frames []hostmem.Frame) (*ODPMirror, error) {
	if t.implicit {
		return nil, errors.New("pagetable: mirror of an implicit ODP table")
	}
	n := uint64(len(frames))
	if addr&pageMask != 0 || addr < t.base || n == 0 || (addr-t.base)>>PageShift+n > t.npages {
		return nil, fmt.Errorf("pagetable: mirror of %#x+%d pages outside the table %#x+%d pages", addr, n, t.base, t.npages)
	}
	m := &ODPMirror{t: t, off: addr - t.base, pages: make([]*byte, n), frames: frames}
	for k, f := range frames {
		m.pages[k] = (*byte)(t.as.FramePointer(f))
	}
	return m, nil
}

// StartMirror makes every write of the table (CopyIn, Atomic64) reach m's
// frames as well as the entries' (old) frames, until SwitchMirrored. It
// lets a remap resume placement before the view has switched (an mmap,
// tens of µs): the old frames hold every write until the switch, and the
// new frames hold every write from now on. The caller has stopped the writes and
// waited for them, and copied the pages written since the pre-copy, so
// that both hold the same bytes. Concurrent writes of overlapping bytes
// by different QPs may leave the two different, as IBTA leaves their
// order open. Errors: a mirror of another table, a mirror already
// started.
func (t *ODP) StartMirror(m *ODPMirror) error {
	if m == nil || m.t != t {
		return errors.New("pagetable: mirror of another table")
	}
	if !t.mirror.CompareAndSwap(nil, m) {
		return errors.New("pagetable: a mirror is already started")
	}
	return nil
}

// SwitchMirrored runs switchView (the application's view and the host's
// page map switched to the mirror's frames), then points the mirrored
// pages' entries at the new frames (under mu, so that a fault that
// resolved an old frame before the host's switch either installed it
// before, and is overwritten, or finds the page map changed and resolves
// again; only the pages the page map still gives the new frames: the
// host's lock is free once switchView returns, and a Free or a migration
// may have given them back since and a fault installed the next ones),
// then ends the mirror and waits for the copies that may still be
// writing the old frames, so that they may be given back when it returns.
// Mirrored atomics wait meanwhile: an atomic and its copy to the new word
// see the same frame. If switchView fails, the mirror ends all the same
// (the view and the table keep the old frames) and its error is returned.
func (t *ODP) SwitchMirrored(switchView func() error) error {
	t.mirrorMu.Lock()
	err := switchView()
	if m := t.mirror.Load(); m != nil && err == nil {
		t.mu.Lock()
		first := m.off >> PageShift
		for k, f := range m.frames {
			// switchView released the host's lock: a Free or a
			// migration of the page may have run since (invalidating
			// the table, this time) and a fault installed the page's
			// next frame, while f went back to the host. Only a page
			// the host still maps to f gets it; any later change
			// invalidates under mu, after this store.
			addr := t.base + m.off + uint64(k)<<PageShift
			if cur, ok := t.as.FrameOf(addr); !ok || cur != f {
				continue
			}
			if e := t.entry(first + uint64(k)); e != nil {
				e.frame.Store(uint32(f))
			}
		}
		t.mu.Unlock()
	}
	t.mirror.Store(nil)
	t.mirrorMu.Unlock()
	t.waitCopies()
	return err
}

// copy copies src, just written at table offset off, to the mirror's
// frames, page by page; bytes outside the mirrored pages are not copied.
func (m *ODPMirror) copy(off uint64, src []byte) {
	for len(src) > 0 {
		n := min(uint64(len(src)), PageSize-off&pageMask)
		if off >= m.off {
			if k := (off - m.off) >> PageShift; k < uint64(len(m.pages)) {
				memcopy.Copy(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(m.pages[k]), off&pageMask)), n), src[:n])
			}
		}
		src = src[n:]
		off += n
	}
}

// word returns the mirror's address of the word at table offset off (nil
// outside the mirrored pages).
func (m *ODPMirror) word(off uint64) *uint64 {
	if off < m.off {
		return nil
	}
	k := (off - m.off) >> PageShift
	if k >= uint64(len(m.pages)) {
		return nil
	}
	return (*uint64)(unsafe.Add(unsafe.Pointer(m.pages[k]), off&pageMask))
}

// mirrorAtomic runs op on the word at table offset off in its entry's
// frame and stores the word's new value in the mirror's frame, under
// mirrorMu so that the entries cannot switch in between and mirrored
// atomics are serialized (the new word ends with the last result). If the
// mirror ended meanwhile, the entry has switched: op runs on the new frame
// alone.
func (t *ODP) mirrorAtomic(m *ODPMirror, off uint64, op func(*uint64) uint64) uint64 {
	t.mirrorMu.Lock()
	defer t.mirrorMu.Unlock()
	w := (*uint64)(t.at(off))
	r := op(w)
	if t.mirror.Load() == m {
		if nw := m.word(off); nw != nil {
			atomic.StoreUint64(nw, atomic.LoadUint64(w))
		}
	}
	return r
}
