package hostmem

import (
	"errors"
	"runtime"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// memfdPages returns the pages of memory the address space's memfd holds,
// as the kernel counts them (st_blocks).
func memfdPages(t *testing.T, s *AddressSpace) int {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(s.fd, &st))
	return int(st.Blocks * 512 / PageSize)
}

// holdsPage reports whether frame f holds memory (SEEK_DATA finds data at
// its offset) or is a hole.
func holdsPage(t *testing.T, s *AddressSpace, f Frame) bool {
	t.Helper()
	off := int64(f) << PageShift
	got, err := unix.Seek(s.fd, off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return false // no data from off to the end
	}
	require.NoError(t, err)
	return got == off
}

func fillByte(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// TestPoolReusedByNextMigration: a migration's old frames join the pool at
// Release, and the next migration takes its new frames from it (the oldest
// beyond the pool's quarantine, in order) without allocating memory; Alloc
// never gets them.
func TestPoolReusedByNextMigration(t *testing.T) {
	const q = poolQuarantine
	s := newSpace(t, testSpace)
	a, err := s.Alloc(2 * q * PageSize)
	require.NoError(t, err)
	fill(a, 1)
	ma, err := s.Migrate(AddrOf(a), 2*q)
	require.NoError(t, err)
	oldA := slices.Clone(ma.Old)
	ma.Release()
	require.Equal(t, 2*q, s.Stats().FramesPooled)

	b, err := s.Alloc(q * PageSize)
	require.NoError(t, err)
	fill(b, 2)
	bFrames := frames(t, s, AddrOf(b), q)
	for _, f := range bFrames {
		require.NotContains(t, oldA, f, "Alloc got a pooled frame")
	}
	pages0 := memfdPages(t, s)
	m, err := s.PrepareMigrate(AddrOf(b), q)
	require.NoError(t, err)
	require.Equal(t, oldA[:q], m.New, "the oldest pooled frames, in order")
	require.Equal(t, pages0, memfdPages(t, s), "pooled frames hold their memory: nothing allocated")
	require.Equal(t, q, s.Stats().FramesPooled)
	require.Equal(t, filled(len(a), 1)[:PageSize], s.FrameBytes(m.New[0]), "a pooled frame keeps its old bytes until the copy")
	for i := range m.Pages() {
		m.CopyPage(i)
	}
	require.NoError(t, m.Commit(func(*Migration) error { return nil }))
	require.Equal(t, filled(len(b), 2), b)
	m.Release()
	require.Equal(t, 2*q, s.Stats().FramesPooled)

	// The frames b just lost are within the quarantine: b's next
	// migration gets the rest of a's instead.
	m, err = s.Migrate(AddrOf(b), q)
	require.NoError(t, err)
	require.Equal(t, oldA[q:], m.New)
	require.Equal(t, filled(len(b), 2), b)
	m.Release()
}

// TestCommitCopiesPagesNeverCopied: a migration whose caller copies nothing
// before Commit (and nothing dirty inside it) still moves every byte, even
// onto pooled frames holding another page's bytes.
func TestCommitCopiesPagesNeverCopied(t *testing.T) {
	const q = poolQuarantine
	s := newSpace(t, testSpace)
	a, err := s.Alloc(2 * q * PageSize)
	require.NoError(t, err)
	fillByte(a, 0xa5)
	m, err := s.Migrate(AddrOf(a), 2*q)
	require.NoError(t, err)
	m.Release()

	b, err := s.Alloc(q * PageSize)
	require.NoError(t, err)
	fill(b, 9)
	m, err = s.PrepareMigrate(AddrOf(b), q)
	require.NoError(t, err)
	require.Equal(t, byte(0xa5), s.FrameBytes(m.New[0])[0], "a pooled frame")
	m.CopyPage(3) // one page pre-copied, the rest never
	require.NoError(t, m.Commit(func(*Migration) error { return nil }))
	require.Equal(t, filled(len(b), 9), b)
	m.Release()
}

// TestAllocNeverGetsPooledBytes: when the free frames run out, Alloc takes
// pooled frames, punched out first: they read zeros.
func TestAllocNeverGetsPooledBytes(t *testing.T) {
	s := newSpaceConfig(t, Config{Size: 16 << 20, FramePool: 4096}) // 4096 frames
	a, err := s.Alloc(2048 * PageSize)
	require.NoError(t, err)
	fillByte(a, 0xa5)
	m, err := s.Migrate(AddrOf(a), 2048) // the other 2048 frames
	require.NoError(t, err)
	old := slices.Clone(m.Old)
	m.Release()
	st := s.Stats()
	require.Equal(t, 2048, st.FramesPooled)
	require.Zero(t, st.FramesFree)
	require.Zero(t, st.FramesUnused)

	c, err := s.Alloc(1024 * PageSize)
	require.NoError(t, err)
	require.Subset(t, old, frames(t, s, AddrOf(c), 1024), "the pooled frames were used")
	require.Equal(t, make([]byte, len(c)), c, "and read zeros")
	for _, f := range frames(t, s, AddrOf(c), 1024) {
		require.Equal(t, make([]byte, PageSize), s.FrameBytes(f))
	}
	require.Equal(t, 1024, s.Stats().FramesPooled)

	// The rest of the pool too; then every frame is in use.
	_, err = s.Alloc(1024 * PageSize)
	require.NoError(t, err)
	st = s.Stats()
	require.Zero(t, st.FramesPooled)
	require.Equal(t, 4096, st.FramesInUse)
}

// TestPoolBound: the pool keeps at most Config.FramePool frames; the
// oldest beyond the bound are punched out (their memory returned), and
// without a pool every old frame is.
func TestPoolBound(t *testing.T) {
	const bound = 300
	for _, tc := range []struct {
		name string
		pool int
		kept int
	}{
		{"bounded", bound, bound},
		{"no pool", -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSpaceConfig(t, Config{Size: testSpace, FramePool: tc.pool})
			a, err := s.Alloc(512 * PageSize)
			require.NoError(t, err)
			fillByte(a, 0xa5)
			require.Equal(t, 512, memfdPages(t, s))
			m, err := s.Migrate(AddrOf(a), 512)
			require.NoError(t, err)
			require.Equal(t, 1024, memfdPages(t, s))
			m.Release()
			st := s.Stats()
			require.Equal(t, tc.kept, st.FramesPooled)
			require.Equal(t, 512-tc.kept, st.FramesFree)
			require.Equal(t, 512, st.FramesInUse)
			require.Equal(t, 512+tc.kept, memfdPages(t, s), "the frames beyond the bound are punched out")
			for i, f := range m.Old {
				require.Equal(t, i >= 512-tc.kept, holdsPage(t, s, f), "old frame %d: the oldest are punched", i)
			}
			require.Equal(t, bytesOf(512*PageSize, 0xa5), a)
		})
	}
}

func bytesOf(n int, v byte) []byte {
	b := make([]byte, n)
	fillByte(b, v)
	return b
}

// TestPoolPinnedAccounting: pinned migrations through the pool keep the
// account's charge and the pins as they were; the process's lock counts
// and the kernel's VmLck grow by the pooled frames kept locked and by
// nothing else. With CAP_IPC_LOCK the pool keeps a pinned migration's old
// frames locked, and the next pinned migration takes them over without an
// mlock; without it (and with a finite RLIMIT_MEMLOCK) it unlocks them.
// Close unlocks what the pool kept.
func TestPoolPinnedAccounting(t *testing.T) {
	const n = 2 * poolQuarantine
	for _, privileged := range []bool{true, false} {
		t.Run(map[bool]string{true: "CAP_IPC_LOCK", false: "RLIMIT_MEMLOCK"}[privileged], func(t *testing.T) {
			if !HasCapIPCLock() {
				t.Skip("needs CAP_IPC_LOCK (to have it, and to be able to drop it)")
			}
			var rl unix.Rlimit
			require.NoError(t, unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl))
			if !privileged && (rl.Cur == unix.RLIM_INFINITY || rl.Cur < 3*n*PageSize) {
				t.Skipf("RLIMIT_MEMLOCK is %d: the test needs a finite one of at least %d", rl.Cur, 3*n*PageSize)
			}
			s := newSpace(t, testSpace)
			acct := NewPinAccount(1 << 30)
			b, err := s.Alloc(n * PageSize)
			require.NoError(t, err)
			fill(b, 4)
			want := filled(len(b), 4)
			addr := AddrOf(b)
			lck0, pages0 := vmLckKB(t), PinnedPages()
			fp, err := s.Pin(acct, addr, len(b), true)
			require.NoError(t, err)
			check := func(round int) {
				t.Helper()
				st := s.Stats()
				if privileged {
					require.Equal(t, st.FramesPooled, st.FramesPooledLocked, "round %d: pooled frames kept locked", round)
				} else {
					require.Zero(t, st.FramesPooledLocked, "round %d: pooled frames unlocked", round)
				}
				require.EqualValues(t, n*PageSize, acct.Pinned(), "round %d: the charge does not change", round)
				require.EqualValues(t, n*PageSize, acct.Peak(), "round %d", round)
				require.Equal(t, lck0+(n+st.FramesPooledLocked)*PageSize/1024, vmLckKB(t), "round %d: VmLck", round)
				require.Equal(t, pages0+n+st.FramesPooledLocked, PinnedPages(), "round %d: locked pages", round)
				require.Equal(t, n, s.frames.pinnedFrames(), "round %d: pinned frames", round)
				require.Equal(t, want, b, "round %d", round)
			}
			check(-1)
			// migrate runs the rounds, without CAP_IPC_LOCK in the second
			// case (on a thread that dies with the goroutine).
			migrate := func() error {
				var firstOld []Frame
				for round := range 3 {
					m, err := fp.PrepareMigrate()
					if err != nil {
						return err
					}
					for i := range m.Pages() {
						m.CopyPage(i)
					}
					if err := m.Commit(nil); err != nil {
						return err
					}
					if !slices.Equal(m.New, fp.Frames()) {
						return errors.New("the pin did not move")
					}
					m.Release()
					switch round {
					case 0:
						firstOld = slices.Clone(m.Old)
					case 2:
						// Round 1 took half of round 0's old frames (the
						// rest were in the quarantine); round 2 the
						// other half first.
						if !slices.Equal(firstOld[n/2:], m.New[:n/2]) {
							return errors.New("round 2 did not take pooled frames")
						}
					}
				}
				return nil
			}
			if privileged {
				require.NoError(t, migrate())
			} else {
				ch := make(chan error)
				go func() {
					runtime.LockOSThread()
					hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
					var data [2]unix.CapUserData
					if err := unix.Capget(&hdr, &data[0]); err != nil {
						ch <- err
						return
					}
					data[0].Effective &^= 1 << capIPCLock
					if err := unix.Capset(&hdr, &data[0]); err != nil {
						ch <- err
						return
					}
					ch <- migrate()
				}()
				require.NoError(t, <-ch)
			}
			check(3)
			if privileged {
				require.Positive(t, s.Stats().FramesPooledLocked)
			}
			require.NoError(t, fp.Unpin())
			require.Zero(t, acct.Pinned())
			require.Zero(t, s.frames.pinnedFrames())
			require.NoError(t, s.Close())
			require.Equal(t, lck0, vmLckKB(t), "Close unlocks the pool")
			require.Equal(t, pages0, PinnedPages())
		})
	}
}

// TestPoolTakesAbortedFrames: the new frames of an aborted migration join
// the pool too.
func TestPoolTakesAbortedFrames(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(4 * PageSize)
	require.NoError(t, err)
	inUse := s.Stats().FramesInUse
	m, err := s.PrepareMigrate(AddrOf(b), 4)
	require.NoError(t, err)
	require.Equal(t, inUse+4, s.Stats().FramesInUse)
	m.Abort()
	require.Equal(t, inUse, s.Stats().FramesInUse)
	require.Equal(t, 4, s.Stats().FramesPooled)
}

// TestCommitSeesPinsTakenAfterPrepare: a Pin of the range between
// PrepareMigrate and Commit makes the Commit fail with ErrPinned (Commit
// skips the per-frame check only when no pin changed), for a plain and
// for a pinned migration, and the new frames go back.
func TestCommitSeesPinsTakenAfterPrepare(t *testing.T) {
	s := newSpace(t, testSpace)
	acct := NewPinAccount(1 << 30)
	b, err := s.Alloc(8 * PageSize)
	require.NoError(t, err)
	fill(b, 6)
	addr := AddrOf(b)
	before := frames(t, s, addr, 8)

	m, err := s.PrepareMigrate(addr, 8)
	require.NoError(t, err)
	for i := range m.Pages() {
		m.CopyPage(i)
	}
	fp, err := s.Pin(acct, addr, len(b), true)
	require.NoError(t, err)
	require.ErrorIs(t, m.Commit(nil), ErrPinned)
	require.Equal(t, before, frames(t, s, addr, 8))
	require.Equal(t, 8, s.Stats().FramesPooled, "the new frames went to the pool")

	// The pin's owner prepares; another pin arrives before the commit.
	pinned0 := PinnedPages()
	m, err = fp.PrepareMigrate()
	require.NoError(t, err)
	for i := range m.Pages() {
		m.CopyPage(i)
	}
	fp2, err := s.Pin(acct, addr, len(b), true)
	require.NoError(t, err)
	require.ErrorIs(t, m.Commit(nil), ErrPinned)
	require.Equal(t, before, fp.Frames())
	require.Equal(t, before, frames(t, s, addr, 8))
	require.Equal(t, 8, s.frames.pinnedFrames(), "the new frames were unpinned")
	st := s.Stats()
	require.Equal(t, pinned0+st.FramesPooledLocked, PinnedPages(), "only the pool holds the new frames' locks")
	require.NoError(t, fp2.Unpin())
	require.NoError(t, fp.Unpin())
	require.Equal(t, filled(len(b), 6), b)
}

// TestPinnedCommitRacedGivesBackNewFrames: of two migrations of one pin,
// the second to commit fails (ErrRaced) and gives its new frames back,
// unpinned.
func TestPinnedCommitRacedGivesBackNewFrames(t *testing.T) {
	s := newSpace(t, testSpace)
	acct := NewPinAccount(1 << 30)
	b, err := s.Alloc(8 * PageSize)
	require.NoError(t, err)
	fill(b, 7)
	fp, err := s.Pin(acct, AddrOf(b), len(b), true)
	require.NoError(t, err)
	pages0 := PinnedPages()
	m1, err := fp.PrepareMigrate()
	require.NoError(t, err)
	m2, err := fp.PrepareMigrate()
	require.NoError(t, err)
	require.Equal(t, 24, s.frames.pinnedFrames())
	require.NoError(t, m1.Commit(nil))
	require.ErrorIs(t, m2.Commit(nil), ErrRaced)
	require.Equal(t, 16, s.frames.pinnedFrames(), "m2's new frames unpinned; m1's old ones until Release")
	m1.Release()
	m2.Release()
	require.Equal(t, 8, s.frames.pinnedFrames())
	require.Equal(t, m1.New, fp.Frames())
	require.Equal(t, pages0+s.Stats().FramesPooledLocked, PinnedPages())
	require.Equal(t, filled(len(b), 7), b)
	require.NoError(t, fp.Unpin())
}

// TestPlainMigrationUnlocksPooledFrames: a plain migration that gets
// pooled frames kept locked for pinned migrations unlocks them.
func TestPlainMigrationUnlocksPooledFrames(t *testing.T) {
	if !lockUnlimited() {
		t.Skip("the pool keeps frames locked only with CAP_IPC_LOCK or no RLIMIT_MEMLOCK")
	}
	const n = 2 * poolQuarantine
	s := newSpace(t, testSpace)
	acct := NewPinAccount(1 << 30)
	a, err := s.Alloc(n * PageSize)
	require.NoError(t, err)
	fp, err := s.Pin(acct, AddrOf(a), len(a), true)
	require.NoError(t, err)
	m, err := fp.PrepareMigrate()
	require.NoError(t, err)
	require.NoError(t, m.Commit(nil))
	m.Release()
	require.NoError(t, fp.Unpin())
	require.Equal(t, n, s.Stats().FramesPooledLocked)
	lck, pages := vmLckKB(t), PinnedPages()

	b, err := s.Alloc(poolQuarantine * PageSize)
	require.NoError(t, err)
	fill(b, 8)
	m, err = s.Migrate(AddrOf(b), poolQuarantine)
	require.NoError(t, err)
	require.Equal(t, poolQuarantine, s.Stats().FramesPooledLocked)
	require.Equal(t, lck-poolQuarantine*PageSize/1024, vmLckKB(t))
	require.Equal(t, pages-poolQuarantine, PinnedPages())
	require.Equal(t, filled(len(b), 8), b)
	m.Release()
}
