package hostmem

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestFramePinBudget(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(8 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	acct := NewPinAccount(4 * PageSize)
	base := vmLckKB(t)

	_, err = s.Pin(acct, addr, 5*PageSize, true)
	require.ErrorIs(t, err, ErrPinLimit)
	require.EqualError(t, err, "hostmem: pin 20480 bytes: would exceed the configured pin limit (16384 bytes, 0 already pinned)")
	require.Zero(t, acct.Pinned())
	require.Equal(t, base, vmLckKB(t))

	fp, err := s.Pin(acct, addr, 4*PageSize, true)
	require.NoError(t, err)
	require.Equal(t, frames(t, s, addr, 4), fp.Frames())
	require.EqualValues(t, 4*PageSize, fp.Bytes())
	require.Equal(t, addr, fp.Addr())
	require.EqualValues(t, 4*PageSize, acct.Pinned())
	require.Equal(t, base+16, vmLckKB(t), "really locked")
	for _, f := range fp.Frames() {
		require.Equal(t, []byte{1}, mincore(t, s.FrameBytes(f)), "resident")
	}
	_, err = s.Pin(acct, addr+4*PageSize, PageSize, true)
	require.EqualError(t, err, "hostmem: pin 4096 bytes: would exceed the configured pin limit (16384 bytes, 16384 already pinned)")
	require.NoError(t, fp.Unpin())
	require.Error(t, fp.Unpin())
	require.Zero(t, acct.Pinned())
	require.Equal(t, base, vmLckKB(t))

	// Read-only pages pin for reading only.
	require.NoError(t, s.Protect(addr+7*PageSize, PageSize, false))
	_, err = s.Pin(acct, addr+6*PageSize, 2*PageSize, true)
	require.ErrorIs(t, err, ErrReadOnly)
	fp, err = s.Pin(acct, addr+6*PageSize, 2*PageSize, false)
	require.NoError(t, err)
	require.NoError(t, fp.Unpin())
	_, err = s.Pin(acct, addr+8*PageSize, PageSize, false)
	require.ErrorIs(t, err, ErrNotMapped)
	_, err = s.Pin(nil, addr, PageSize, false)
	require.Error(t, err)
}

// TestFramePinOutlivesFree: a pinned range keeps its frames and bytes when
// the application frees it (as a pinned MR keeps its pages after munmap);
// they are released at the last unpin. Pinned pages do not migrate.
func TestFramePinOutlivesFree(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(2 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	fill(b, 9)
	acct := NewPinAccount(0)
	fp, err := s.Pin(acct, addr, 2*PageSize, true)
	require.NoError(t, err)
	fp2, err := s.Pin(acct, addr+PageSize, PageSize, true) // nested on page 1
	require.NoError(t, err)
	_, err = s.Migrate(addr, 2)
	require.ErrorIs(t, err, ErrPinned)
	m, err := s.PrepareMigrate(addr+PageSize, 1)
	require.ErrorIs(t, err, ErrPinned)
	require.Nil(t, m)

	inUse := s.Stats().FramesInUse
	require.NoError(t, s.Free(addr, 2*PageSize))
	require.Equal(t, inUse, s.Stats().FramesInUse, "pinned frames are kept")
	want := filled(2*PageSize, 9)
	require.Equal(t, want[:PageSize], s.FrameBytes(fp.Frames()[0]))
	b2, err := s.AllocAt(addr, 2*PageSize)
	require.NoError(t, err)
	require.NotContains(t, fp.Frames(), frames(t, s, addr, 2)[0])
	require.Equal(t, make([]byte, 2*PageSize), b2)

	require.NoError(t, fp.Unpin())
	require.Equal(t, inUse+1, s.Stats().FramesInUse, "page 1's frame is still pinned by fp2")
	require.Equal(t, want[PageSize:], s.FrameBytes(fp2.Frames()[0]))
	require.NoError(t, fp2.Unpin())
	require.Equal(t, inUse, s.Stats().FramesInUse)
	require.Zero(t, acct.Pinned())
}

// TestFramePinRlimit: without CAP_IPC_LOCK (dropped on one thread) the pin
// is bounded by RLIMIT_MEMLOCK, with the message naming it.
func TestFramePinRlimit(t *testing.T) {
	if !HasCapIPCLock() {
		t.Skip("needs CAP_IPC_LOCK to be able to drop it")
	}
	var rl unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl))
	if rl.Cur == unix.RLIM_INFINITY || rl.Cur > 64<<20 {
		t.Skipf("RLIMIT_MEMLOCK is %d: too large to exceed in a test", rl.Cur)
	}
	s := newSpace(t, testSpace)
	size := int(rl.Cur) + PageSize
	b, err := s.Alloc(size)
	require.NoError(t, err)
	acct := NewPinAccount(0)
	ch := make(chan error)
	go func() {
		runtime.LockOSThread() // dies with the goroutine, capability dropped
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
		_, err := s.Pin(acct, AddrOf(b), size, true)
		ch <- err
	}()
	err = <-ch
	require.ErrorIs(t, err, ErrPinLimit)
	require.True(t, strings.HasPrefix(err.Error(), "hostmem: pin "+strconv.Itoa(size)+" bytes: would exceed RLIMIT_MEMLOCK ("+
		strconv.Itoa(int(rl.Cur))+" bytes, "), err.Error())
	require.Zero(t, acct.Pinned())
}

// TestFramePinMigrate: a pin's owner migrates its pinned range; the pin
// moves to the new frames, the application sees its bytes, the old frames
// are unpinned; a second pin on the range forbids it.
func TestFramePinMigrate(t *testing.T) {
	s := newSpace(t, 64<<20)
	acct := NewPinAccount(1 << 30)
	b, err := s.Alloc(4 * PageSize)
	require.NoError(t, err)
	for i := range b {
		b[i] = byte(i * 7)
	}
	want := append([]byte(nil), b...)
	addr := AddrOf(b)
	fp, err := s.Pin(acct, addr, len(b), true)
	require.NoError(t, err)
	old := append([]Frame(nil), fp.Frames()...)

	m, err := fp.PrepareMigrate()
	require.NoError(t, err)
	for i := range m.Pages() {
		m.CopyPage(i)
	}
	require.NoError(t, m.Commit(nil))
	require.Equal(t, m.New, fp.Frames(), "the pin moved to the new frames")
	require.NotEqual(t, old, fp.Frames())
	require.Equal(t, want, b, "the application sees its bytes through the new frames")
	for i, f := range fp.Frames() {
		got, ok := s.FrameOf(addr + uint64(i)*PageSize)
		require.True(t, ok)
		require.Equal(t, f, got)
	}
	require.Equal(t, 8, s.frames.pinnedFrames(), "the old frames stay pinned (and locked) until Release, outside the critical section")
	require.EqualValues(t, 4*PageSize, acct.Pinned(), "the charge does not change")
	m.Release()
	require.Equal(t, 4, s.frames.pinnedFrames(), "after Release only the new frames are pinned")

	// A second pin on the same range: the owner may not move it.
	fp2, err := s.Pin(acct, addr, len(b), true)
	require.NoError(t, err)
	_, err = fp.PrepareMigrate()
	require.ErrorIs(t, err, ErrPinned)
	require.NoError(t, fp2.Unpin())
	require.NoError(t, fp.Unpin())
	require.Zero(t, s.frames.pinnedFrames())
	require.NoError(t, s.Free(addr, len(b)))
}
