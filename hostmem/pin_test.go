package hostmem

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// vmLckKB returns VmLck from /proc/self/status: the process's locked memory
// in kB, as the kernel counts it.
func vmLckKB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmLck:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no VmLck in /proc/self/status")
	return 0
}

func TestPinLimitConfigured(t *testing.T) {
	a := NewPinAccount(8 << 20)
	buf, err := Alloc(16 << 20)
	require.NoError(t, err)
	defer func() { require.NoError(t, buf.Free()) }()

	_, err = a.Pin(buf.Bytes(), true)
	require.ErrorIs(t, err, ErrPinLimit)
	require.EqualError(t, err, "hostmem: pin 16777216 bytes: would exceed the configured pin limit (8388608 bytes, 0 already pinned)")
	var le *PinLimitError
	require.True(t, errors.As(err, &le))
	require.Equal(t, PinLimitError{Request: 16 << 20, Limit: 8 << 20}, *le)
	require.Zero(t, a.Pinned())

	// Exactly the limit fits; one more page does not.
	p, err := a.Pin(buf.Bytes()[:8<<20], true)
	require.NoError(t, err)
	require.EqualValues(t, 8<<20, a.Pinned())
	_, err = a.Pin(buf.Bytes()[8<<20:8<<20+1], true)
	require.EqualError(t, err, "hostmem: pin 4096 bytes: would exceed the configured pin limit (8388608 bytes, 8388608 already pinned)")
	require.NoError(t, p.Unpin())
	require.Zero(t, a.Pinned())
	require.EqualValues(t, 8<<20, a.Peak())
	require.EqualValues(t, 8<<20, a.Limit())
	require.Error(t, p.Unpin(), "second unpin")
}

// TestPinLimitRlimit drops CAP_IPC_LOCK from one OS thread's effective set
// (capabilities are per thread on Linux) and checks that the RLIMIT_MEMLOCK
// rule then applies, with the message naming the limit.
func TestPinLimitRlimit(t *testing.T) {
	if !HasCapIPCLock() {
		t.Skip("needs CAP_IPC_LOCK to be able to drop it")
	}
	var rl unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl))
	if rl.Cur == unix.RLIM_INFINITY || rl.Cur > 64<<20 {
		t.Skipf("RLIMIT_MEMLOCK is %d: too large to exceed in a test", rl.Cur)
	}
	buf, err := Alloc(int(rl.Cur) + 2*PageSize)
	require.NoError(t, err)
	defer func() { require.NoError(t, buf.Free()) }()
	a := NewPinAccount(0)
	require.EqualValues(t, -1, a.Limit(), "with CAP_IPC_LOCK nothing bounds the account")

	type result struct {
		err   error
		limit int64
		small error
	}
	ch := make(chan result)
	go func() {
		// The thread dies with this goroutine: it stays locked and is
		// never handed back to the scheduler without its capability.
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			ch <- result{err: err}
			return
		}
		data[0].Effective &^= 1 << capIPCLock
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			ch <- result{err: err}
			return
		}
		var r result
		r.limit = a.Limit()
		_, r.err = a.Pin(buf.Bytes(), true)
		p, err := a.Pin(buf.Bytes()[:PageSize], true)
		r.small = err
		if err == nil {
			r.small = p.Unpin()
		}
		ch <- r
	}()
	r := <-ch
	require.EqualValues(t, rl.Cur, r.limit)
	require.ErrorIs(t, r.err, ErrPinLimit)
	want := "hostmem: pin " + strconv.Itoa(int(rl.Cur)+2*PageSize) + " bytes: would exceed RLIMIT_MEMLOCK (" +
		strconv.Itoa(int(rl.Cur)) + " bytes, "
	require.True(t, strings.HasPrefix(r.err.Error(), want), r.err.Error())
	require.True(t, strings.HasSuffix(r.err.Error(), "already pinned); raise it with ulimit -l or run with CAP_IPC_LOCK"), r.err.Error())
	require.NoError(t, r.small, "a pin under the limit still works without the capability")
	require.Zero(t, a.Pinned())
}

// TestOverlappingPinsNest: two pins sharing pages do not unlock each other's
// pages (mlock does not nest), checked against the kernel's VmLck.
func TestOverlappingPinsNest(t *testing.T) {
	buf, err := Alloc(8 * PageSize)
	require.NoError(t, err)
	defer func() { require.NoError(t, buf.Free()) }()
	b := buf.NIC()
	a := NewPinAccount(0)
	base := vmLckKB(t)
	pages0 := PinnedPages()

	p1, err := a.Pin(b[0:4*PageSize], true) // pages 0-3
	require.NoError(t, err)
	require.Equal(t, base+16, vmLckKB(t))
	// Pages 2-5, starting and ending mid-page: still whole pages.
	p2, err := a.Pin(b[2*PageSize+100:6*PageSize-100], true)
	require.NoError(t, err)
	require.Equal(t, base+24, vmLckKB(t))
	require.Equal(t, pages0+6, PinnedPages())
	require.EqualValues(t, 8*PageSize, a.Pinned(), "overlap is charged twice, as pinned_vm is")

	require.NoError(t, p1.Unpin())
	require.Equal(t, base+16, vmLckKB(t), "pages 2-3 stay locked for the second pin")
	require.Equal(t, pages0+4, PinnedPages())
	require.NoError(t, p2.Unpin())
	require.Equal(t, base, vmLckKB(t))
	require.Equal(t, pages0, PinnedPages())
	require.Zero(t, a.Pinned())
}

// TestPinGoHeap pins ordinary Go memory, including two slices that share a
// page.
func TestPinGoHeap(t *testing.T) {
	mem := make([]byte, 3*PageSize)
	a := NewPinAccount(0)
	base := vmLckKB(t)
	p1, err := a.Pin(mem[10:20], true)
	require.NoError(t, err)
	p2, err := a.Pin(mem[30:40], false)
	require.NoError(t, err)
	require.EqualValues(t, 2*PageSize, a.Pinned())
	require.Equal(t, base+4, vmLckKB(t))
	require.NoError(t, p1.Unpin())
	require.Equal(t, base+4, vmLckKB(t))
	require.NoError(t, p2.Unpin())
	require.Equal(t, base, vmLckKB(t))

	_, err = a.Pin(nil, true)
	require.Error(t, err)
}

// TestTouchKeepsBytes exercises the fallback prefault for kernels without
// MADV_POPULATE_*: nothing changes and nothing outside b is touched.
func TestTouchKeepsBytes(t *testing.T) {
	buf, err := Alloc(4 * PageSize)
	require.NoError(t, err)
	defer func() { require.NoError(t, buf.Free()) }()
	b := buf.Bytes()
	for i := range b {
		b[i] = byte(i * 7)
	}
	for _, r := range [][2]int{{0, len(b)}, {1, 3}, {4093, 4101}, {5, 3 * PageSize}, {PageSize - 2, PageSize + 1}} {
		touch(b[r[0]:r[1]], true)
		touch(b[r[0]:r[1]], false)
	}
	for i := range b {
		require.Equal(t, byte(i*7), b[i])
	}
}

func TestPopulateFresh(t *testing.T) {
	buf, err := Alloc(64 * PageSize)
	require.NoError(t, err)
	defer func() { require.NoError(t, buf.Free()) }()
	b := buf.NIC()
	first := uintptr(unsafe.Pointer(&b[0]))
	require.NoError(t, populate(b, first, 64, true))
	vec := make([]byte, 64)
	_, _, e := unix.Syscall(unix.SYS_MINCORE, first, uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
	require.Zero(t, e)
	for i, v := range vec {
		require.Equal(t, byte(1), v&1, "page %d not resident", i)
	}
}
