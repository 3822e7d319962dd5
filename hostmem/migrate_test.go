package hostmem

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMigrateSwitchesFramesAndKeepsContent(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(4 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	fill(b, 1)
	want := filled(4*PageSize, 1)
	before := frames(t, s, addr, 4)
	var rec recorder
	sub, err := s.Subscribe(addr, 4*PageSize, &rec)
	require.NoError(t, err)
	defer sub.Unsubscribe()

	m, err := s.Migrate(addr+PageSize, 2) // pages 1 and 2
	require.NoError(t, err)
	invs, ends := rec.take()
	r := Range{addr + PageSize, addr + 3*PageSize}
	require.Equal(t, []Invalidation{{Range: r, Event: EventMigrate, Seq: 1}}, invs)
	require.Equal(t, []Invalidation{{Range: r, Event: EventMigrate, Seq: 2}}, ends)
	require.Equal(t, addr+PageSize, m.Addr)
	require.Equal(t, before[1:3], m.Old)
	after := frames(t, s, addr, 4)
	require.Equal(t, m.New, after[1:3])
	require.Equal(t, before[0], after[0], "page 0 did not move")
	require.Equal(t, before[3], after[3], "page 3 did not move")
	require.NotContains(t, before, after[1])
	require.NotContains(t, before, after[2])
	require.Equal(t, want, b, "the application sees the same bytes")
	require.EqualValues(t, 2, s.Stats().MigratedPages)

	// Writes through the application's view land in the new frames; the
	// old frames keep the content they had at the switch.
	copy(b[PageSize+10:], "after the migration")
	copy(b[3*PageSize-4:], "spans")
	require.Equal(t, "after the migration", string(s.FrameBytes(m.New[0])[10:29]))
	require.Equal(t, "span", string(s.FrameBytes(m.New[1])[PageSize-4:]))
	require.Equal(t, "s", string(s.FrameBytes(after[3])[:1]))
	require.Equal(t, want[PageSize:2*PageSize], s.FrameBytes(m.Old[0]), "old frame untouched")
	require.Equal(t, want[2*PageSize:3*PageSize], s.FrameBytes(m.Old[1]), "old frame untouched")
	// And the NIC's writes to the new frames are seen by the application.
	copy(s.FrameBytes(m.New[1])[5:], "from the NIC")
	require.Equal(t, "from the NIC", string(b[2*PageSize+5:2*PageSize+17]))
	pg, err := s.Resolve(addr+2*PageSize, ResolveWrite)
	require.NoError(t, err)
	require.Equal(t, m.New[1], pg.Frame)

	inUse := s.Stats().FramesInUse
	m.Release()
	require.Equal(t, inUse-2, s.Stats().FramesInUse)
	require.Equal(t, 2, s.Stats().FramesPooled, "released frames join the migration pool")
	m.Release() // twice: nothing
	m.Abort()
	require.Equal(t, 2, s.Stats().FramesPooled)

	// Without a pool, released frames are punched out.
	s = newSpaceConfig(t, Config{Size: testSpace, FramePool: -1})
	b, err = s.Alloc(4 * PageSize)
	require.NoError(t, err)
	fill(b, 1)
	m, err = s.Migrate(AddrOf(b), 4)
	require.NoError(t, err)
	m.Release()
	require.Zero(t, s.Stats().FramesPooled)
	require.Equal(t, 4, s.Stats().FramesFree)
	require.Equal(t, make([]byte, PageSize), s.FrameBytes(m.Old[0]), "released frames are punched out")
}

func TestMigrateKeepsReadOnly(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(3 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	fill(b, 3)
	require.NoError(t, s.Protect(addr+PageSize, PageSize, false))
	m, err := s.Migrate(addr, 3)
	require.NoError(t, err)
	defer m.Release()
	require.Equal(t, "rw-s", perms(t, addr))
	require.Equal(t, "r--s", perms(t, addr+PageSize))
	require.Equal(t, "rw-s", perms(t, addr+2*PageSize))
	pg, err := s.Resolve(addr+PageSize, 0)
	require.NoError(t, err)
	require.False(t, pg.Writable)
	require.Equal(t, filled(3*PageSize, 3), b)
}

// TestPrepareCommitCopiesDirtyPages is the shape issue 4's remap takes:
// pre-copy while the NIC keeps writing, then copy only the pages it wrote
// inside the critical section.
func TestPrepareCommitCopiesDirtyPages(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(4 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	fill(b, 5)
	var rec recorder
	sub, err := s.Subscribe(addr, 4*PageSize, &rec)
	require.NoError(t, err)
	defer sub.Unsubscribe()

	m, err := s.PrepareMigrate(addr, 4)
	require.NoError(t, err)
	require.Equal(t, 4, m.Pages())
	for i := range 4 {
		m.CopyPage(i)
	}
	invs, _ := rec.take()
	require.Empty(t, invs, "nothing is invalidated before Commit")
	// The NIC writes page 2 after the pre-copy (through the old frame).
	copy(s.FrameBytes(m.Old[2])[100:], "dirty")
	var inside []Invalidation
	err = m.Commit(func(m *Migration) error {
		inside, _ = rec.take()
		require.True(t, sub.ReadRetry(0), "the count is odd inside the critical section")
		m.CopyPage(2)
		return nil
	})
	require.NoError(t, err)
	require.Len(t, inside, 1, "invalidated before the dirty copy")
	want := filled(4*PageSize, 5)
	copy(want[2*PageSize+100:], "dirty")
	require.Equal(t, want, b)
	require.Error(t, m.Commit(nil), "committed once")
	m.Release()
	rec.take()

	// A failing copy leaves everything as it was.
	before := frames(t, s, addr, 4)
	m, err = s.PrepareMigrate(addr, 4)
	require.NoError(t, err)
	boom := errors.New("boom")
	require.ErrorIs(t, m.Commit(func(*Migration) error { return boom }), boom)
	require.Equal(t, before, frames(t, s, addr, 4))
	require.Equal(t, want, b)
	invs, _ = rec.take()
	require.Len(t, invs, 1, "the invalidation still happened")
	require.EqualValues(t, 4, sub.ReadBegin())

	// A Free between Prepare and Commit wins: the commit fails, and the
	// new frames go back.
	inUse := s.Stats().FramesInUse
	m, err = s.PrepareMigrate(addr+2*PageSize, 2)
	require.NoError(t, err)
	require.Equal(t, inUse+2, s.Stats().FramesInUse)
	require.NoError(t, s.Free(addr+3*PageSize, PageSize))
	require.ErrorIs(t, m.Commit(nil), ErrRaced)
	require.Equal(t, inUse-1, s.Stats().FramesInUse)
	m.Release() // nothing: aborted

	// Abort gives back the new frames.
	m, err = s.PrepareMigrate(addr, 1)
	require.NoError(t, err)
	m.Abort()
	require.Equal(t, inUse-1, s.Stats().FramesInUse)

	_, err = s.PrepareMigrate(addr+3*PageSize, 1)
	require.ErrorIs(t, err, ErrNotMapped)
	_, err = s.PrepareMigrate(addr, 0)
	require.Error(t, err)
}

// CommitCopy and SwitchView are Commit in two halves: the view keeps the
// old frames until SwitchView, and the page map switches with it.
func TestCommitCopyThenSwitchView(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(2 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	fill(b, 9)
	m, err := s.PrepareMigrate(addr, 2)
	require.NoError(t, err)
	require.ErrorContains(t, m.SwitchView(), "not copied")
	require.NoError(t, m.CommitCopy(nil))
	require.Error(t, m.Commit(nil), "copied once")
	require.Equal(t, filled(2*PageSize, 9)[:PageSize], s.FrameBytes(m.New[0]), "copied")
	// Between the halves the writers go on, writing both frames (the
	// mirror); the application still reads the old ones.
	copy(s.FrameBytes(m.Old[1])[7:], "both")
	copy(s.FrameBytes(m.New[1])[7:], "both")
	copy(s.FrameBytes(m.Old[0])[3:], "old only")
	require.Equal(t, "old only", string(b[3:11]))
	require.NoError(t, m.SwitchView())
	require.Equal(t, m.New, frames(t, s, addr, 2))
	require.Equal(t, "both", string(b[PageSize+7:PageSize+11]), "the view maps the new frames")
	require.NotEqual(t, "old only", string(b[3:11]))
	require.EqualValues(t, 2, s.Stats().MigratedPages)
	m.Release()
}
