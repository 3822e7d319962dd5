package hostmem

import (
	"errors"
	"fmt"
	"slices"
)

// Migration moves application pages to new frames: the page migration of
// this world. Migrate does it in one call; PrepareMigrate and Commit split
// it so that a caller (the remap protocol of issue 4) can copy the pages
// while traffic still flows and copy again only the pages written meanwhile
// inside the critical section:
//
//	m, _ := as.PrepareMigrate(addr, n) // new frames; nothing changes yet
//	for i := range n { m.CopyPage(i) } // pre-copy, traffic flowing
//	err := m.Commit(func(m *Migration) error {
//		// invalidated: no copy in flight, no fault resolves the range
//		for _, i := range dirty { m.CopyPage(i) }
//		return nil
//	})                                 // app view switched, counts even
//	... check m.Old frames if wanted ...
//	m.Release()                        // old frames to the migration pool
//
// The application must not write the range while a migration copies it:
// the kernel stops CPU access with migration entries, and a user-space
// emulation cannot without userfaultfd, so a store that lands in an old
// frame after its last copy is lost. The NIC's writes are stopped by the
// invalidation, and the application's reads are never disturbed.
//
// A Migration belongs to one goroutine.
type Migration struct {
	// Addr is the application address of the first page.
	Addr uint64
	// Old are the frames the pages had at PrepareMigrate; New the frames
	// they move to. Old[i] and New[i] are the frames of page i.
	Old, New []Frame

	as    *AddressSpace
	p     uintptr // first page
	state migrationState
	// pin is set for FramePin.PrepareMigrate: the frames may be pinned by
	// it alone, and the pin moves with the pages. newLocked are the new
	// frames' runs, pinned and locked at PrepareMigrate, until Commit
	// hands them to the pin; after Commit the old frames hold the pin's
	// former pin and lock references, dropped (or, for the locks, handed
	// to the pool) at Release.
	pin       *FramePin
	newLocked []frameRun
	// pinGen is the frame allocator's pin generation when PrepareMigrate
	// checked the pins.
	pinGen uint64
	// vals, ro and oldPopulated are filled by Commit (allocated at
	// PrepareMigrate, so that the critical section allocates nothing):
	// each page's map entry, whether it is read-only, and whether its old
	// frame is known to hold a page (for the migration pool).
	vals         []uint64
	ro           []bool
	oldPopulated []bool
	// copied has bit i set once page i was copied (CopyPage): Commit
	// copies the pages never copied, since a new frame from the pool holds
	// another page's old bytes.
	copied []uint64
	// viewDone: the application's view of the new frames was populated.
	viewDone bool
	// inv is the invalidation CommitCopy left open for SwitchView.
	inv *invalidation
}

type migrationState uint8

const (
	migrationPrepared   migrationState = iota
	migrationCopied                    // CommitCopy done: mu held, invalidation open
	migrationUnswitched                // SwitchView failed: the view has Old; Abort gives New back
	migrationCommitted
	migrationAborted  // before commit: New given back
	migrationReleased // after commit: Old given back
)

// PrepareMigrate reserves new frames for npages pages from addr (page
// aligned, all mapped), allocates their memory, and returns the migration.
// The new frames come from the migration pool when it has some (frames
// earlier migrations gave back, still holding memory and their old bytes:
// the migration must copy every page, CopyPage, before Commit), else
// fresh frames are populated. Nothing changes until Commit; Abort gives the
// new frames back. Pinned pages cannot move (ErrPinned), as the kernel
// does not migrate pinned pages.
func (s *AddressSpace) PrepareMigrate(addr uint64, npages int) (*Migration, error) {
	if npages <= 0 {
		return nil, fmt.Errorf("hostmem: migrate %#x: %d pages", addr, npages)
	}
	p, n, err := s.checkRange("migrate", addr, npages<<PageShift)
	if err != nil {
		return nil, err
	}
	m := newMigration(s, addr, p, int(n))
	if err := s.prepareMigrate(m); err != nil {
		return nil, err
	}
	return m, nil
}

func newMigration(s *AddressSpace, addr uint64, p uintptr, n int) *Migration {
	return &Migration{Addr: addr, Old: make([]Frame, n), New: make([]Frame, n), as: s, p: p,
		copied: make([]uint64, (n+63)/64), vals: make([]uint64, n), ro: make([]bool, n), oldPopulated: make([]bool, n)}
}

// prepareMigrate reads the old frames and allocates the new ones (under
// mu), then, without mu, allocates the memory of the new frames that may
// have none and, for a pinned migration, pins and locks them.
func (s *AddressSpace) prepareMigrate(m *Migration) error {
	unpopulated, locked, err := s.allocMigration(m)
	if err != nil {
		return err
	}
	var prelocked []Frame // pooled frames that come locked
	for i, l := range locked {
		if l {
			prelocked = append(prelocked, m.New[i])
		}
	}
	if m.pin == nil {
		// A plain migration keeps nothing locked.
		s.unlockFrames(prelocked)
		prelocked = nil
	}
	// One system call per run, so that the copies (and the critical
	// section) take no page faults.
	var perr error
	forFrameRuns(unpopulated, func(f Frame, k int) {
		if perr == nil {
			perr = populate(s.frameRun(f, k), uintptr(s.FramePointer(f)), uintptr(k), true)
		}
	})
	if perr == nil && m.pin != nil {
		// Lock the new frames now, outside the caller's critical section
		// (mlock of 1 MiB costs some 200 µs here); pooled frames may
		// come locked already.
		perr = m.pin.lockNew(m, locked)
	}
	if perr != nil {
		s.unlockFrames(prelocked)
		s.frames.release(s, m.New)
		return fmt.Errorf("hostmem: migrate %#x+%d pages: %w", m.Addr, len(m.New), perr)
	}
	return nil
}

func (s *AddressSpace) allocMigration(m *Migration) (unpopulated []Frame, locked []bool, err error) {
	if err := s.lockOpen(); err != nil {
		return nil, nil, err
	}
	defer s.mu.Unlock()
	n := uintptr(len(m.Old))
	if err := s.checkMapped("migrate", m.p, n); err != nil {
		return nil, nil, err
	}
	for i := range m.Old {
		m.Old[i] = Frame(s.pte(m.p+uintptr(i)).Load()&pteFrame - 1)
	}
	// The pins as checked here: a Commit that finds no change since
	// need not check again.
	m.pinGen = s.frames.pinGeneration()
	if err := m.checkPins(); err != nil {
		return nil, nil, err
	}
	unpopulated, locked, err = s.frames.allocMigration(s, m.New)
	if err != nil {
		return nil, nil, fmt.Errorf("hostmem: migrate %#x+%d pages: %w", m.Addr, n, err)
	}
	return unpopulated, locked, nil
}

// AddressSpace returns the address space of the migration.
func (m *Migration) AddressSpace() *AddressSpace { return m.as }

// Pages returns the number of pages migrated.
func (m *Migration) Pages() int { return len(m.Old) }

// CopyPage copies page i from its old frame to its new one, through the
// NIC view.
func (m *Migration) CopyPage(i int) {
	copy(m.as.FrameBytes(m.New[i]), m.as.FrameBytes(m.Old[i]))
	m.copied[i/64] |= 1 << (i % 64)
}

// Commit switches the pages to the new frames. Under mu, it checks that
// every page still has its old frame (else ErrRaced: a Free, another
// migration or a Pin got there first) and then runs the critical section:
//
//  1. invalidate start (EventMigrate): the subscriptions turn odd and
//     their Invalidate callbacks drop the range and drain its copies;
//  2. copy: copyDirty(m) if given, else CopyPage for every page; then
//     CopyPage of every page never copied since PrepareMigrate (a new
//     frame from the migration pool holds another page's bytes);
//  3. remap: the application's view of the range is mapped onto the new
//     frames with mmap MAP_FIXED (read-only pages stay read-only) and the
//     page map points at them;
//  4. invalidate end: the counts turn even; faults resolve the new frames.
//
// The application's view of the new frames is left without page-table
// entries (PopulateView fills them, outside the critical section).
//
// If copyDirty fails the view is not switched and its error is returned.
// On any failure the new frames go back (to the migration pool) and the
// migration is over.
// After a successful Commit the old frames stay allocated, untouched by
// anything, until Release.
func (m *Migration) Commit(copyDirty func(m *Migration) error) error {
	if err := m.CommitCopy(copyDirty); err != nil {
		return err
	}
	if err := m.SwitchView(); err != nil {
		m.Abort()
		return err
	}
	return nil
}

// CommitCopy is the first half of Commit, for a caller that lets its
// writers go on between the copy and the view switch (a pinned remap,
// which mirrors the NIC's writes to the new frames meanwhile,
// pagetable.Table.StartMirror): steps 1 and 2, the checks, the
// invalidation's start and the copies. It returns with the address
// space's lock held and the invalidation open; SwitchView (steps 3 and
// 4) ends both, and no method that takes the lock (Alloc, Free, Protect,
// Pin, PrepareMigrate, Commit, Close) may be called in between. On error
// it is as Commit's: the migration is over, the new frames given back.
func (m *Migration) CommitCopy(copyDirty func(m *Migration) error) error {
	return m.CommitCopyKeeping(copyDirty, nil)
}

// CommitCopyKeeping is CommitCopy for a remap whose range an ODP table
// (keep's notifier; nil: none) goes on writing between CommitCopy and
// SwitchView, into the old frames its entries name and, as well, into the
// new frames (pagetable.ODP.StartMirror), until it points its entries at
// the new frames after SwitchView (pagetable.ODP.SwitchMirrored): the
// invalidation leaves keep out (its count stays even, its Invalidate is
// not called), so that its faults and copies do not wait for the view
// switch. The caller must have
// stopped keep's writes and waited for them before the call, since the
// dirty copy needs them finished, and must keep the mirror until the view
// has switched. Every other subscription of the range is invalidated as by
// CommitCopy; their faults wait until SwitchView.
func (m *Migration) CommitCopyKeeping(copyDirty func(m *Migration) error, keep *Subscription) error {
	return m.commitCopyLocked(copyDirty, keep, false)
}

// CommitCopyExclusive is CommitCopyKeeping for a remap that tracked the
// writes of keep alone (nil: of no ODP table) since before its pre-copy:
// if any other subscription overlaps the range, it refuses with ErrShared
// (the migration is over, the new frames given back, the lock released),
// since that table's writes during the pre-copy were not tracked.
func (m *Migration) CommitCopyExclusive(copyDirty func(m *Migration) error, keep *Subscription) error {
	return m.commitCopyLocked(copyDirty, keep, true)
}

func (m *Migration) commitCopyLocked(copyDirty func(m *Migration) error, keep *Subscription, exclusive bool) error {
	s := m.as
	if m.state != migrationPrepared {
		return errors.New("hostmem: commit of a migration that is not prepared")
	}
	s.mu.Lock()
	inv, err := m.commitCopy(copyDirty, keep, exclusive)
	if err != nil {
		if inv != nil {
			s.invalidateEnd(inv)
		}
		m.state = migrationAborted
		m.giveBackNew()
		s.mu.Unlock()
		return err
	}
	m.inv = inv
	m.state = migrationCopied
	return nil
}

// SwitchView is the second half of Commit, after CommitCopy: the
// application's view of the range is mapped onto the new frames (mmap
// MAP_FIXED), the page map points at them, a pinned migration's pin moves
// to them, and the invalidation ends; then the lock is released. If the
// mmap fails the view keeps the old frames, the error is returned, and the
// caller, once its writers no longer use the new frames, calls Abort,
// which gives them back.
func (m *Migration) SwitchView() error {
	if m.state != migrationCopied {
		return errors.New("hostmem: view switch of a migration that is not copied")
	}
	s := m.as
	err := m.switchView()
	s.invalidateEnd(m.inv)
	m.inv = nil
	if err != nil {
		m.state = migrationUnswitched
		s.mu.Unlock()
		return err
	}
	m.state = migrationCommitted
	s.stats.migrated.Add(int64(len(m.Old)))
	s.mu.Unlock()
	return nil
}

// PopulateView populates the application's view of the migrated range
// (MADV_POPULATE_WRITE, _READ for read-only pages; best effort, once) after
// Commit: the switch leaves the view without page-table entries, where
// the kernel's migration leaves a mapped page mapped. Migrate does it after
// Commit. A remap (placement) does not: no table copies through the view
// (ODP tables copy through the NIC's view since session 13), the
// application takes a minor fault only on the pages it touches, and the
// population costs 0.6-2 µs per page on this VM, kernel time that the data
// path would lose.
func (m *Migration) PopulateView() {
	if m.state != migrationCommitted || m.viewDone {
		return
	}
	m.viewDone = true
	m.as.populateView(m.p, m.ro)
}

// populateView populates the application's view of len(ro) pages from page
// p, one system call per run of equal protection (ro[i]: read-only). Best
// effort: a Free or migration racing it makes the call fail or populate
// other frames, both harmless; on a kernel without MADV_POPULATE_* it does
// nothing (touching the view could meet a concurrent Free).
func (s *AddressSpace) populateView(p uintptr, ro []bool) {
	for i := 0; i < len(ro); {
		j := i + 1
		for j < len(ro) && ro[j] == ro[i] {
			j++
		}
		_, _ = madvisePopulate(uintptr(s.appPtr(p+uintptr(i))), uintptr(j-i), !ro[i])
		i = j
	}
}

// commitCopy runs Commit's checks and copies, under mu; the invalidation
// it started (nil if it failed before) stays open.
func (m *Migration) commitCopy(copyDirty func(m *Migration) error, keep *Subscription, exclusive bool) (*invalidation, error) {
	s := m.as
	if s.closed.Load() {
		return nil, ErrClosed
	}
	n := uintptr(len(m.Old))
	vals, ro, populated := m.vals, m.ro, m.oldPopulated
	for i := range vals {
		vals[i] = s.pte(m.p + uintptr(i)).Load()
		if vals[i]&pteFrame != uint64(m.Old[i])+1 {
			return nil, fmt.Errorf("%w: migrate %#x+%d pages: page %d", ErrRaced, m.Addr, n, i)
		}
		ro[i] = vals[i]&pteReadOnly != 0
		// A pinned frame was populated by its pin.
		populated[i] = vals[i]&ptePopulated != 0 || m.pin != nil
	}
	// The pins are checked again only if some changed since
	// PrepareMigrate (a look-up per page under the frame lock; with the
	// map the counts used to be, 10-12 µs per MiB under traffic).
	if s.frames.pinGeneration() != m.pinGen || m.pin != nil && m.pin.done.Load() {
		if err := m.checkPins(); err != nil {
			return nil, err
		}
	}
	inv, err := s.invalidateStartKeeping(Range{m.Addr, m.Addr + uint64(n)<<PageShift}, EventMigrate, keep, exclusive)
	if err != nil {
		return nil, fmt.Errorf("hostmem: migrate %#x+%d pages: %w", m.Addr, n, err)
	}
	if copyDirty == nil {
		for i := range m.Old {
			m.CopyPage(i)
		}
	} else if err := copyDirty(m); err != nil {
		return inv, fmt.Errorf("hostmem: migrate %#x+%d pages: %w", m.Addr, n, err)
	}
	// A page never copied (no pre-copy) is copied now: its new frame may
	// come from the pool, holding another page's bytes.
	for w, bits := range m.copied {
		if bits == ^uint64(0) {
			continue
		}
		for i := w * 64; i < min(w*64+64, len(m.Old)); i++ {
			if bits&(1<<(i%64)) == 0 {
				m.CopyPage(i)
			}
		}
	}
	return inv, nil
}

// switchView is SwitchView's work, under mu.
func (m *Migration) switchView() error {
	s, n, vals, ro := m.as, len(m.Old), m.vals, m.ro
	if err := s.mapFrames(m.p, m.New, ro); err != nil {
		// mapFrames left part of the range PROT_NONE: map the old frames
		// back, so that the application keeps its memory.
		if err2 := s.mapFrames(m.p, m.Old, ro); err2 != nil {
			panic(fmt.Sprintf("hostmem: migrate: cannot restore the application's view: %v (after %v)", err2, err))
		}
		return fmt.Errorf("hostmem: migrate %#x+%d pages: %w", m.Addr, n, err)
	}
	for i, f := range m.New {
		s.pte(m.p + uintptr(i)).Store(uint64(f) + 1 | vals[i]&pteReadOnly | ptePopulated)
	}
	if m.pin != nil {
		m.pin.moveTo(m.New, m.newLocked)
		m.newLocked = nil
	}
	return nil
}

// checkPins refuses pinned frames, except a pinned migration's own pin
// (each old frame held by it alone). Called under mu.
func (m *Migration) checkPins() error {
	if m.pin == nil {
		if m.as.frames.pinned(m.Old) {
			return fmt.Errorf("%w: migrate %#x+%d pages", ErrPinned, m.Addr, len(m.Old))
		}
		return nil
	}
	if !slices.Equal(m.pin.frames, m.Old) || !m.as.frames.pinnedOnce(m.Old) {
		return fmt.Errorf("%w: migrate pinned %#x+%d pages: another pin holds them, or they moved", ErrPinned, m.Addr, len(m.Old))
	}
	return nil
}

// Abort gives back the new frames of a migration that was not committed.
// After Commit it does nothing (use Release).
func (m *Migration) Abort() {
	if m.state != migrationPrepared && m.state != migrationUnswitched {
		return
	}
	m.state = migrationAborted
	m.giveBackNew()
}

// giveBackNew gives the new frames of a migration that did not commit to
// the pool; a pinned migration's are unpinned, and their lock references
// go with them.
func (m *Migration) giveBackNew() {
	s := m.as
	locked := false
	if m.pin != nil && m.newLocked != nil {
		s.frames.unpin(s, m.New)
		m.newLocked = nil
		locked = true
	}
	if !s.closed.Load() {
		s.frames.recycle(s, m.New, nil, locked)
	} else if locked {
		s.unlockFrames(m.New)
	}
}

// Release gives back the old frames of a committed migration, to the
// migration pool. Before Commit it is Abort.
func (m *Migration) Release() {
	switch m.state {
	case migrationPrepared, migrationUnswitched:
		m.Abort()
	case migrationCommitted:
		m.state = migrationReleased
		s := m.as
		if m.pin != nil {
			// The pin's old frames: unpinned here, outside the critical
			// section; their lock references go to the pool (which
			// unlocks them if it may not keep them locked).
			s.frames.unpin(s, m.Old)
		}
		if !s.closed.Load() {
			s.frames.recycle(s, m.Old, m.oldPopulated, m.pin != nil)
		} else if m.pin != nil {
			s.unlockFrames(m.Old)
		}
		m.oldPopulated = nil
	}
}

// Migrate moves npages application pages from addr to new frames:
// PrepareMigrate, then Commit copying every page inside the critical
// section. The old frames stay allocated until the Migration's Release.
func (s *AddressSpace) Migrate(addr uint64, npages int) (*Migration, error) {
	m, err := s.PrepareMigrate(addr, npages)
	if err != nil {
		return nil, err
	}
	if err := m.Commit(nil); err != nil {
		return nil, err
	}
	m.PopulateView()
	return m, nil
}
