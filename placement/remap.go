package placement

import (
	"errors"
	"fmt"
	"time"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/internal/operr"
	"github.com/softrdma/softrdma/pagetable"
)

// Remapping is one remap of an MR's pages to new frames in progress (issue
// 4's remap protocol, the placement half): PrepareRemap starts dirty
// tracking and copies every page while traffic flows; the caller then
// pauses placement at some scope (SuspendMR at least, which also waits for
// the placements in flight) and calls Commit, which copies the pages
// written meanwhile and makes the NIC write both frames; then the caller
// resumes and calls Finish, which switches the application's mapping (and
// a pinned MR's table) to the new frames, and Release.
//
// The application must not write the MR's pages itself between
// PrepareRemap and Finish (see hostmem.Migration).
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
	// ViewSwitch is the time Finish took (pinned MRs: the application's
	// view switched while placement ran, the NIC writing both frames).
	ViewSwitch time.Duration

	mirror    *pagetable.Mirror    // a pinned MR's new frames, for Commit's StartMirror
	odpMirror *pagetable.ODPMirror // an ODP MR's
	mirrored  bool                 // Commit left the view switch to Finish
	// busy is the MR's life.remap, closed when the remap is over
	// (Release, Abort, a failed PrepareRemap); DeregMR refuses meanwhile.
	busy chan struct{}
}

// ErrRemapInProgress: the MR is being remapped already (PrepareRemap
// until the Remapping's Release or Abort).
var ErrRemapInProgress = fmt.Errorf("placement: remap: the MR is being remapped already: %w", ErrBusy)

// begin marks the MR as being remapped, so that DeregMR refuses until the
// remap is over (it would release the table and the pin that the remap
// moves, under Commit's lock).
func (r *Remapping) begin() error {
	e, mr := r.e, r.mr
	e.life.mu.Lock()
	defer e.life.mu.Unlock()
	if mr.dead.Load() {
		return fmt.Errorf("placement: remap: not a live MR of this device: %w", ErrInvalid)
	}
	if mr.life.remap != nil {
		return ErrRemapInProgress
	}
	r.busy = make(chan struct{})
	mr.life.remap = r.busy
	return nil
}

// end ends what begin started (once).
func (r *Remapping) end() {
	if r.busy == nil {
		return
	}
	r.e.life.mu.Lock()
	r.mr.life.remap = nil
	close(r.busy)
	r.busy = nil
	r.e.life.mu.Unlock()
}

// ErrNotRemappable: the MR's memory is not of the device's host address
// space (a Go slice, a memfd buffer), or it is an implicit ODP MR; only
// address-space memory can be remapped.
var ErrNotRemappable = fmt.Errorf("placement: remap needs an MR on the device's address space (pinned or explicit ODP): %w", ErrNotSupported)

// testHookRemapDrained, when set (tests only), runs in PrepareRemap of a
// pinned MR once the copies in flight have been waited for, before the
// pre-copy.
var testHookRemapDrained func(mr *MR)

// PrepareRemap starts the remap of mr: dirty tracking on (for a pinned
// MR its linear mapping is withdrawn first, and the copies in flight
// waited for, so that every write is seen), new frames reserved and
// populated, every page copied. Until the Remapping's Release or Abort,
// DeregMR and ReregMR of the MR are ErrBusy: the remap moves the pin
// and switches the table they would release. Errors: ErrNotRemappable; a
// deregistered MR (EINVAL); a remap of the MR in progress (ErrBusy); the
// host's (no free frames, pages not mapped, another pin
// on the pages: hostmem.ErrPinned).
func (e *Engine) PrepareRemap(mr *MR) (*Remapping, error) {
	if mr == nil || mr.eng != e || mr.dead.Load() {
		return nil, fmt.Errorf("placement: remap: not a live MR of this device: %w", ErrInvalid)
	}
	r := &Remapping{e: e, mr: mr}
	if err := r.begin(); err != nil {
		return nil, err
	}
	if _, err := e.prepareRemap(r); err != nil {
		r.end()
		return nil, err
	}
	return r, nil
}

func (e *Engine) prepareRemap(r *Remapping) (*Remapping, error) {
	mr := r.mr
	var err error
	switch {
	case mr.odp != nil && !mr.odp.t.Implicit():
		t := mr.odp.t
		first := mr.ent().IOVA &^ (pagetable.PageSize - 1)
		n := int((mr.ent().IOVA + mr.ent().Length - first + pagetable.PageSize - 1) >> pagetable.PageShift)
		t.StartTracking()
		if r.m, err = e.asSet.Load().PrepareMigrate(first, n); err != nil {
			t.StopTracking()
			return nil, operr.Wrap("placement", "remap", err)
		}
	case mr.table != nil && mr.table.FramePin() != nil:
		if err := e.mrs.ClearLinear(mr.stag()); err != nil {
			return nil, fmt.Errorf("placement: remap: %w: %w", err, ErrInvalid)
		}
		// Tracking starts before the wait, not after it: a copy that
		// found the table direct (Table.CopyIn's direct path) or
		// tracking off sets no Dirty bit, and the wait is what makes
		// sure none is still running when the pre-copy reads the pages.
		// A copy that starts after the wait sets its bits.
		mr.table.StartTracking()
		e.mrs.Synchronize()
		mr.ent().Drain()
		if testHookRemapDrained != nil {
			testHookRemapDrained(mr)
		}
		if r.m, err = mr.table.FramePin().PrepareMigrate(); err != nil {
			r.restoreLinear()
			return nil, operr.Wrap("placement", "remap", err)
		}
	default:
		return nil, ErrNotRemappable
	}
	// Another ODP table over these pages (a second MR on the same buffer,
	// an implicit MR) writes them through its own entries, where this
	// remap's dirty tracking does not see it: its writes during the
	// pre-copy would be lost. Refused here, and again atomically at
	// Commit (a table registered meanwhile).
	var keep *hostmem.Subscription
	if mr.odp != nil {
		keep = mr.odp.t.Subscription()
	}
	if r.m.AddressSpace().SubscribedBesides(hostmem.Range{Start: r.m.Addr, End: r.m.Addr + uint64(r.m.Pages())<<hostmem.PageShift}, keep) {
		r.m.Abort()
		if mr.odp != nil {
			mr.odp.t.StopTracking()
		} else {
			r.restoreLinear()
		}
		return nil, fmt.Errorf("placement: remap: another ODP MR covers these pages: %w", hostmem.ErrShared)
	}
	r.Pages = r.m.Pages()
	start := time.Now()
	for i := range r.Pages {
		r.m.CopyPage(i)
	}
	r.Precopy = time.Since(start)
	if mr.odp == nil {
		if r.mirror, err = mr.table.NewMirror(r.m.New); err != nil {
			r.m.Abort()
			r.restoreLinear()
			return nil, operr.Wrap("placement", "remap", err)
		}
	} else {
		if r.odpMirror, err = mr.odp.t.NewMirror(r.m.Addr, r.m.New); err != nil {
			r.m.Abort()
			mr.odp.t.StopTracking()
			return nil, operr.Wrap("placement", "remap", err)
		}
	}
	return r, nil
}

// restoreLinear ends a pinned MR's tracking and gives its key the linear
// mapping of its current frames back.
func (r *Remapping) restoreLinear() {
	t := r.mr.table
	t.StopTracking()
	if flat, writable := t.Linear(); flat != nil {
		_ = r.e.mrs.SetLinear(r.mr.stag(), &flat[0], writable)
	}
}

// Commit is the remap's critical section; the caller has paused placement
// into the MR (SuspendMR, which waited for the placements in flight). It
// copies the pages written since the pre-copy began. The view switch, an
// mmap of tens of µs, is left to Finish, after the caller has resumed:
// Commit only makes the NIC's writes go to the new frames as well as the
// old ones (pagetable.Table.StartMirror for a pinned MR; for an ODP MR,
// whose entries keep the old frames until the switch,
// pagetable.ODP.StartMirror, with the table left out of the invalidation
// so that its faults do not wait: hostmem.Migration.CommitCopyKeeping), so
// that both hold every byte until the view has switched. Commit holds the
// host address space's lock until Finish. On error the MR keeps its old
// frames (and its data).
func (r *Remapping) Commit() error {
	if r.m == nil {
		return errors.New("placement: remap: commit after release")
	}
	mr := r.mr
	copyDirty := func(m *hostmem.Migration) error {
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
	}
	if mr.odp != nil {
		// The ODP table goes on copying into its entries' (old) frames
		// after the resume, and into the new frames too, until Finish
		// has switched the view and the entries: the invalidation leaves the table out,
		// so that its faults do not wait for the switch.
		t := mr.odp.t
		err := r.m.CommitCopyExclusive(copyDirty, t.Subscription())
		t.StopTracking()
		if err != nil {
			return operr.Wrap("placement", "remap", err)
		}
		if err := t.StartMirror(r.odpMirror); err != nil {
			// Cannot happen (one remap of an MR at a time): switch
			// inside the pause. The invalidation left the table out,
			// so its entries still name the old frames, which Release
			// gives back: clear them (placement is paused, no copy is
			// in flight), and the pages fault the new frames in.
			err := r.m.SwitchView()
			ent := mr.ent()
			t.InvalidateRange(ent.IOVA, ent.Length)
			return err
		}
		r.mirrored = true
		return nil
	}
	if err := r.m.CommitCopyExclusive(copyDirty, nil); err != nil {
		r.restoreLinear()
		return operr.Wrap("placement", "remap", err)
	}
	if err := mr.table.StartMirror(r.mirror); err != nil {
		// Cannot happen (a pinned table with tracking on): the view
		// switch runs inside the pause.
		return r.switchView()
	}
	r.mirrored = true
	return nil
}

// Finish completes a remap after Commit, once the caller has resumed
// placement (the NIC writes both frames meanwhile): the application's view
// switches to the new frames (mmap MAP_FIXED), then a pinned MR's table
// (which ends the mirror and the tracking; an ODP MR's mirror ends with
// the view's switch, mirrored atomics held off meanwhile), the writes
// that may still be using the old frames are waited for, and a pinned
// MR's linear mapping comes back. ViewSwitch is set to the time it took.
// After a Commit that switched everything it does nothing. On error (the
// mmap failed) the MR keeps its old frames and its data; the new ones go
// back at Release.
func (r *Remapping) Finish() error {
	if !r.mirrored {
		return nil
	}
	r.mirrored = false
	start := time.Now()
	defer func() { r.ViewSwitch = time.Since(start) }()
	return r.switchView()
}

// switchView switches the MR's view (and a pinned MR's table) after
// CommitCopy and the mirror's start.
func (r *Remapping) switchView() error {
	mr := r.mr
	if mr.odp != nil {
		// On error the view kept the old frames, which the table goes on
		// writing; the mirror has ended and its copies are done, so
		// Release may give the new frames back.
		if err := mr.odp.t.SwitchMirrored(r.m.SwitchView); err != nil {
			return operr.Wrap("placement", "remap", err)
		}
		return nil
	}
	if err := r.m.SwitchView(); err != nil {
		// The view kept the old frames; the table still writes them
		// (and, mirrored, the new ones: wait for those writes before
		// Release gives the new frames back).
		mr.table.StopTracking()
		r.e.mrs.Synchronize()
		mr.ent().Drain()
		r.restoreLinear()
		return operr.Wrap("placement", "remap", err)
	}
	if err := mr.table.SwitchFrames(mr.table.FramePin().Frames()); err != nil {
		return operr.Wrap("placement", "remap", err)
	}
	// Copies that loaded the mirror before the switch may still write the
	// old frames: wait for them before Release gives those back.
	r.e.mrs.Synchronize()
	mr.ent().Drain()
	if flat, writable := mr.table.Linear(); flat != nil {
		if err := r.e.mrs.SetLinear(mr.stag(), &flat[0], writable); err != nil {
			return operr.Wrap("placement", "remap", err)
		}
	}
	return nil
}

// Release gives the old frames back after Commit (and Finish, which it
// runs if the caller did not), or abandons a remap that was not committed
// (the MR keeps its frames; tracking ends).
func (r *Remapping) Release() {
	if r.m == nil {
		return
	}
	_ = r.Finish()
	r.m.Release()
	r.m = nil
	r.end()
}

// Abort abandons a remap before Commit: the new frames go back and the MR
// keeps its old ones (and its linear mapping, for a pinned MR).
func (r *Remapping) Abort() {
	if r.m == nil {
		return
	}
	if r.mirrored {
		// Committed already (the address space's lock is held until
		// the view switches): finish it, as Release does.
		r.Release()
		return
	}
	r.m.Abort()
	r.m = nil
	if r.mr.odp != nil {
		r.mr.odp.t.StopTracking()
	} else {
		r.restoreLinear()
	}
	r.end()
}
