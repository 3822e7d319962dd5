package hostmem

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// FramePin is a pinned range of an AddressSpace, returned by
// AddressSpace.Pin: the frames that backed the range when it was pinned,
// locked and charged to a PinAccount. A pinned frame keeps its memory and
// its bytes after its page is freed (the pin holds it, as a pinned MR holds
// its pages after munmap in the kernel) and cannot be migrated.
type FramePin struct {
	as     *AddressSpace
	addr   uint64
	frames []Frame // one per page
	acct   *PinAccount
	locked []frameRun // runs of contiguous frames locked so far
	done   atomic.Bool
}

type frameRun struct {
	f Frame
	n int
}

// Pin pins [addr, addr+size) (page aligned; every page mapped): it takes a
// pin reference on each page's current frame, charges the whole range to
// acct, and locks the frames' NIC view run by run as PinAccount.Pin does
// (prefault, then mlock nested with any other pin of the same frames).
// When the budget or RLIMIT_MEMLOCK would be exceeded, the error is a
// *PinLimitError for the whole range (errors.Is(err, ErrPinLimit)) and
// nothing stays pinned. write asks for a writable range: a read-only page
// is ErrReadOnly.
//
// Pin takes mu (to read the frames consistently with Free and Migrate):
// do not call it from an Invalidate callback. Unpin may be.
func (s *AddressSpace) Pin(acct *PinAccount, addr uint64, size int, write bool) (*FramePin, error) {
	if acct == nil {
		return nil, errors.New("hostmem: pin: nil pin account")
	}
	p, n, err := s.checkRange("pin", addr, size)
	if err != nil {
		return nil, err
	}
	fp := &FramePin{as: s, addr: addr, frames: make([]Frame, n), acct: acct}
	vals := make([]uint64, n)
	if err := s.lockOpen(); err != nil {
		return nil, err
	}
	if err := s.checkMapped("pin", p, n); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	for i := range fp.frames {
		vals[i] = s.pte(p + uintptr(i)).Load()
		if write && vals[i]&pteReadOnly != 0 {
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: pin %#x+%d for writing: page %#x", ErrReadOnly, addr, size, addr+uint64(i)<<PageShift)
		}
		fp.frames[i] = Frame(vals[i]&pteFrame - 1)
	}
	// With the references taken, a Free no longer releases the frames:
	// the rest needs no mu.
	s.frames.pin(fp.frames)
	s.mu.Unlock()

	if err := acct.charge(fp.Bytes()); err != nil {
		s.frames.unpin(s, fp.frames)
		return nil, err
	}
	var ferr error
	forFrameRuns(fp.frames, func(f Frame, k int) {
		if ferr != nil {
			return
		}
		b := s.frameRun(f, k)
		first := uintptr(s.FramePointer(f))
		if ferr = populate(b, first, uintptr(k), write); ferr != nil {
			return
		}
		if ferr = lockPages(first, uintptr(k)); ferr != nil {
			return
		}
		fp.locked = append(fp.locked, frameRun{f, k})
	})
	if ferr != nil {
		_ = fp.release()
		return nil, ferr
	}
	for i := range vals {
		s.pte(p+uintptr(i)).CompareAndSwap(vals[i], vals[i]|ptePopulated)
	}
	return fp, nil
}

// Frames returns the pinned frames, one per page from the pin's address.
func (fp *FramePin) Frames() []Frame { return fp.frames }

// Addr returns the application address the pin was made at.
func (fp *FramePin) Addr() uint64 { return fp.addr }

// Bytes returns the bytes charged to the account.
func (fp *FramePin) Bytes() int64 { return int64(len(fp.frames)) << PageShift }

// Unpin unlocks and uncharges the frames and drops their references; a
// frame whose page was freed meanwhile is released at its last unpin.
// A second Unpin is an error. Unpin does not take mu: an Invalidate
// callback may call it.
func (fp *FramePin) Unpin() error {
	if !fp.done.CompareAndSwap(false, true) {
		return errors.New("hostmem: unpin of a released pin")
	}
	return fp.release()
}

func (fp *FramePin) release() error {
	var errs []error
	for _, r := range fp.locked {
		errs = append(errs, unlockPages(uintptr(fp.as.FramePointer(r.f)), uintptr(r.n)))
	}
	fp.locked = nil
	fp.acct.uncharge(fp.Bytes())
	fp.as.frames.unpin(fp.as, fp.frames)
	return errors.Join(errs...)
}

// PrepareMigrate prepares the migration of the pinned range itself, for
// the pin's owner (the remap of a pinned memory region): as
// AddressSpace.PrepareMigrate, except that the frames may be pinned, by
// this pin only (ErrPinned if another pin holds one, or if a page no
// longer has the pinned frame). When the migration commits, the pin moves
// with the pages: the new frames are locked and referenced, the old ones
// dropped at Release (and unlocked, unless the migration pool keeps them
// locked for the next pinned migration), and Frames returns the new
// frames; the bytes charged do not change. The caller must keep its own
// users of the old frames away until Commit returns (the remap's critical
// section).
func (fp *FramePin) PrepareMigrate() (*Migration, error) {
	if fp.done.Load() {
		return nil, errors.New("hostmem: migrate of a released pin")
	}
	s := fp.as
	p, _, err := s.checkRange("migrate", fp.addr, len(fp.frames)<<PageShift)
	if err != nil {
		return nil, err
	}
	m := newMigration(s, fp.addr, p, len(fp.frames))
	m.pin = fp
	if err := s.prepareMigrate(m); err != nil {
		return nil, err
	}
	return m, nil
}

// lockNew references and locks the new frames of a pinned migration,
// before the switch (PrepareMigrate); prelocked[i] says that m.New[i]
// came from the pool locked, with its lock reference. On failure the new
// frames are unpinned and only the prelocked ones are still locked.
func (fp *FramePin) lockNew(m *Migration, prelocked []bool) error {
	s := fp.as
	if g := s.frames.pin(m.New); g != m.pinGen+1 {
		m.pinGen = 0 // another pin changed meanwhile: Commit checks them all
	} else {
		m.pinGen = g
	}
	var toLock []Frame
	for i, f := range m.New {
		if !prelocked[i] {
			toLock = append(toLock, f)
		}
	}
	var locked []frameRun
	var lerr error
	forFrameRuns(toLock, func(f Frame, k int) {
		if lerr != nil {
			return
		}
		if lerr = lockPages(uintptr(s.FramePointer(f)), uintptr(k)); lerr == nil {
			locked = append(locked, frameRun{f, k})
		}
	})
	if lerr != nil {
		_ = fp.unlockRuns(locked)
		s.frames.unpin(s, m.New)
		return lerr
	}
	m.newLocked = m.newLocked[:0]
	forFrameRuns(m.New, func(f Frame, k int) { m.newLocked = append(m.newLocked, frameRun{f, k}) })
	return nil
}

func (fp *FramePin) unlockRuns(runs []frameRun) error {
	var errs []error
	for _, r := range runs {
		errs = append(errs, unlockPages(uintptr(fp.as.FramePointer(r.f)), uintptr(r.n)))
	}
	return errors.Join(errs...)
}

// moveTo makes the pin hold the new frames (pinned and locked by
// lockNew), after the switch. The old frames keep the pin's former pin
// and lock references until the migration's Release.
func (fp *FramePin) moveTo(new []Frame, locked []frameRun) {
	fp.locked = locked
	fp.frames = append(fp.frames[:0], new...)
}

// AddressSpace returns the address space the pin belongs to.
func (fp *FramePin) AddressSpace() *AddressSpace { return fp.as }
