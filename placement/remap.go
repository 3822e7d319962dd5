package placement

import (
	"errors"
	"fmt"
	"time"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/pagetable"
)

// Remapping is one remap of an MR's pages to new frames in progress (issue
// 4's remap protocol, the placement half): PrepareRemap starts dirty
// tracking and copies every page while traffic flows; the caller then
// pauses placement at some scope (SuspendMR at least, which also waits for
// the placements in flight) and calls Commit, which copies the pages
// written meanwhile, switches the application's mapping and the NIC's
// table to the new frames; then the caller resumes and calls Release.
//
// The application must not write the MR's pages itself between
// PrepareRemap and Commit (see hostmem.Migration).
type Remapping struct {
	e  *Engine
	mr *MR
	m  *hostmem.Migration

	// Pages is the number of pages moved; Recopied, after Commit, the
	// number copied again in the critical section (written during the
	// pre-copy); Precopy the time the pre-copy took.
	Pages    int
	Recopied int
	Precopy  time.Duration
}

// ErrNotRemappable: the MR's memory is not of the device's host address
// space (a Go slice, a memfd buffer), or it is an implicit ODP MR; only
// address-space memory can be remapped.
var ErrNotRemappable = fmt.Errorf("placement: remap needs an MR on the device's address space (pinned or explicit ODP): %w", ErrNotSupported)

// PrepareRemap starts the remap of mr: dirty tracking on (for a pinned
// MR its linear mapping is withdrawn first, and the copies in flight
// waited for, so that every write is seen), new frames reserved and
// populated, every page copied. Errors: ErrNotRemappable; a deregistered
// MR (EINVAL); the host's (no free frames, pages not mapped, another pin
// on the pages: hostmem.ErrPinned).
func (e *Engine) PrepareRemap(mr *MR) (*Remapping, error) {
	if mr == nil || mr.eng != e || mr.dead.Load() {
		return nil, fmt.Errorf("placement: remap: not a live MR of this device: %w", ErrInvalid)
	}
	r := &Remapping{e: e, mr: mr}
	var err error
	switch {
	case mr.odp != nil && !mr.odp.t.Implicit():
		t := mr.odp.t
		first := mr.entry.IOVA &^ (pagetable.PageSize - 1)
		n := int((mr.entry.IOVA + mr.entry.Length - first + pagetable.PageSize - 1) >> pagetable.PageShift)
		t.StartTracking()
		if r.m, err = e.asSet.Load().PrepareMigrate(first, n); err != nil {
			t.StopTracking()
			return nil, fmt.Errorf("placement: remap: %w", err)
		}
	case mr.table != nil && mr.table.FramePin() != nil:
		if err := e.mrs.ClearLinear(mr.key); err != nil {
			return nil, fmt.Errorf("placement: remap: %w: %w", err, ErrInvalid)
		}
		e.mrs.Synchronize()
		mr.entry.Drain()
		mr.table.StartTracking()
		if r.m, err = mr.table.FramePin().PrepareMigrate(); err != nil {
			r.restoreLinear()
			return nil, fmt.Errorf("placement: remap: %w", err)
		}
	default:
		return nil, ErrNotRemappable
	}
	r.Pages = r.m.Pages()
	start := time.Now()
	for i := range r.Pages {
		r.m.CopyPage(i)
	}
	r.Precopy = time.Since(start)
	// The view switch is the critical section's largest part; run its
	// system calls once now, so that Commit's run in warm caches.
	r.m.WarmView()
	return r, nil
}

// restoreLinear ends a pinned MR's tracking and gives its key the linear
// mapping of its current frames back.
func (r *Remapping) restoreLinear() {
	t := r.mr.table
	t.StopTracking()
	if flat, writable := t.Linear(); flat != nil {
		_ = r.e.mrs.SetLinear(r.mr.key, &flat[0], writable)
	}
}

// Commit is the remap's critical section; the caller has paused placement
// into the MR (SuspendMR, which waited for the placements in flight). It
// copies the pages written since the pre-copy began, switches the
// application's view (mmap MAP_FIXED onto the new frames) and the NIC's
// translation to the new frames, and ends tracking. The new mapping takes
// effect for the accesses after the caller resumes. On error the MR keeps
// its old frames (and its data).
func (r *Remapping) Commit() error {
	if r.m == nil {
		return errors.New("placement: remap: commit after release")
	}
	mr := r.mr
	err := r.m.Commit(func(m *hostmem.Migration) error {
		// The writes are paused (and, for ODP, the invalidation has
		// cleared the table and waited for its copies): the dirty set
		// is final.
		var dirty []int
		if mr.odp != nil {
			dirty = mr.odp.t.DirtyPages(m.Addr, m.Pages())
		} else {
			dirty = mr.table.DirtyPages()
		}
		for _, i := range dirty {
			m.CopyPage(i)
		}
		r.Recopied = len(dirty)
		return nil
	})
	if mr.odp != nil {
		mr.odp.t.StopTracking()
		if err != nil {
			return fmt.Errorf("placement: remap: %w", err)
		}
		return nil
	}
	if err != nil {
		r.restoreLinear()
		return fmt.Errorf("placement: remap: %w", err)
	}
	if err := mr.table.SwitchFrames(mr.table.FramePin().Frames()); err != nil {
		return fmt.Errorf("placement: remap: %w", err)
	}
	if flat, writable := mr.table.Linear(); flat != nil {
		if err := r.e.mrs.SetLinear(mr.key, &flat[0], writable); err != nil {
			return fmt.Errorf("placement: remap: %w", err)
		}
	}
	return nil
}

// Release gives the old frames back after Commit, or abandons a remap that
// was not committed (the MR keeps its frames; tracking ends).
func (r *Remapping) Release() {
	if r.m == nil {
		return
	}
	r.m.Release()
	r.m = nil
}

// Abort abandons a remap before Commit: the new frames go back and the MR
// keeps its old ones (and its linear mapping, for a pinned MR).
func (r *Remapping) Abort() {
	if r.m == nil {
		return
	}
	r.m.Abort()
	r.m = nil
	if r.mr.odp != nil {
		r.mr.odp.t.StopTracking()
	} else {
		r.restoreLinear()
	}
}
