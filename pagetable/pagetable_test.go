package pagetable

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/stretchr/testify/require"
)

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// newHeap registers mem[lo:hi] of a fresh Go slice whose other bytes are
// guards, with IOVA = address (as placement registers).
func newHeap(t testing.TB, size, lo, hi int, writable bool) (*Table, []byte) {
	mem := make([]byte, size)
	for i := range mem {
		mem[i] = 0xee
	}
	tab, err := NewPinned(addrOf(mem[lo:hi]), mem[lo:hi], nil, hostmem.NewPinAccount(0), writable)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tab.Release() })
	return tab, mem
}

// TestCopyRoundTrip writes and reads back at many offsets and lengths, in a
// region that starts and ends mid-page, and checks that no byte outside the
// written range changed.
// Both paths run: the direct one of pinned contiguous tables, and the page
// walk that demand-paged and remapped tables use.
func TestCopyRoundTrip(t *testing.T) {
	t.Run("direct", func(t *testing.T) { testCopyRoundTrip(t, true) })
	t.Run("walk", func(t *testing.T) { testCopyRoundTrip(t, false) })
}

func testCopyRoundTrip(t *testing.T, direct bool) {
	const size, lo, hi = 6 * PageSize, 100, 5*PageSize + 77
	tab, mem := newHeap(t, size, lo, hi, true)
	require.True(t, tab.direct.Load())
	tab.direct.Store(direct)
	require.Equal(t, 6, tab.Pages())
	require.EqualValues(t, hi-lo, tab.Len())
	rng := rand.New(rand.NewPCG(1, 2))
	want := bytes.Clone(mem)
	for i := 0; i < 500; i++ {
		off := rng.IntN(hi - lo)
		n := rng.IntN(hi - lo - off + 1)
		src := make([]byte, n)
		for j := range src {
			src[j] = byte(rng.Uint32())
		}
		got, r := tab.CopyIn(tab.IOVA()+uint64(off), src)
		require.Equal(t, OK, r)
		require.Equal(t, n, got)
		copy(want[lo+off:], src)
		require.True(t, bytes.Equal(want, mem), "after CopyIn(off %d, n %d)", off, n)

		out := make([]byte, n)
		got, r = tab.CopyOut(tab.IOVA()+uint64(off), out)
		require.Equal(t, OK, r)
		require.Equal(t, n, got)
		require.Equal(t, src, out)

		if n > 0 {
			seg, r := tab.Translate(tab.IOVA()+uint64(off), n, true)
			require.Equal(t, OK, r)
			require.Equal(t, &mem[lo+off], &seg[0])
			require.LessOrEqual(t, len(seg), n)
			if direct {
				require.Len(t, seg, n)
			}
		}
		flat, _ := tab.Linear()
		require.Equal(t, direct, flat != nil)
		if flat != nil {
			require.Equal(t, &mem[lo], &flat[0])
			require.Len(t, flat, hi-lo)
		}
	}
	for i := 0; i < lo; i++ {
		require.Equal(t, byte(0xee), mem[i])
	}
	for i := hi; i < size; i++ {
		require.Equal(t, byte(0xee), mem[i])
	}
}

// TestResults has one row per Result of Translate and the copies.
func TestResults(t *testing.T) {
	rw, _ := newHeap(t, 3*PageSize, 8, 2*PageSize+8, true)
	ro, _ := newHeap(t, 3*PageSize, 8, 2*PageSize+8, false)
	absent, _ := newHeap(t, 3*PageSize, 8, 2*PageSize+8, true)
	absent.direct.Store(false)
	absent.pages[1].flags.Store(uint32(Writable)) // as an ODP page not yet faulted in
	base, n := rw.IOVA(), rw.Len()

	for _, tc := range []struct {
		name  string
		tab   *Table
		iova  uint64
		n     int
		write bool
		want  Result
	}{
		{"whole, write", rw, base, int(n), true, OK},
		{"whole, read", ro, ro.IOVA(), int(n), false, OK},
		{"last byte", rw, base + n - 1, 1, true, OK},
		// Out of range.
		{"one byte before", rw, base - 1, 1, false, OutOfRange},
		{"straddles the start", rw, base - 1, 2, false, OutOfRange},
		{"one byte past the end", rw, base + n, 1, false, OutOfRange},
		{"straddles the end", rw, base + n - 1, 2, false, OutOfRange},
		{"longer than the region", rw, base, int(n) + 1, false, OutOfRange},
		{"length wraps", rw, base + 16, math.MaxInt, false, OutOfRange},
		{"iova max", rw, math.MaxUint64, 1, false, OutOfRange},
		{"empty", rw, base, 0, false, OutOfRange},
		{"negative", rw, base, -1, false, OutOfRange},
		// Permission.
		{"write to read-only", ro, ro.IOVA(), 1, true, NoPermission},
		// Not present.
		{"page not present", absent, absent.IOVA() + PageSize, 1, false, NotPresent},
		{"write to page not present", absent, absent.IOVA() + PageSize, 1, true, NotPresent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, r := tc.tab.Translate(tc.iova, tc.n, tc.write)
			require.Equal(t, tc.want, r)
		})
	}

	// A copy that meets a non-present page stops there.
	src := make([]byte, 2*PageSize)
	done, r := absent.CopyIn(absent.IOVA(), src)
	require.Equal(t, NotPresent, r)
	require.Equal(t, PageSize-8, done)
	done, r = absent.CopyOut(absent.IOVA(), src)
	require.Equal(t, NotPresent, r)
	require.Equal(t, PageSize-8, done)
	done, r = ro.CopyIn(ro.IOVA(), src[:10])
	require.Equal(t, NoPermission, r)
	require.Zero(t, done)
	done, r = ro.CopyIn(ro.IOVA()+1, src[:n])
	require.Equal(t, OutOfRange, r)
	require.Zero(t, done)
	_, r = ro.CopyOut(ro.IOVA()+1, src[:n])
	require.Equal(t, OutOfRange, r)

	// Atomic words.
	w := (base + 7) &^ 7
	p, r := rw.Word64(w, true)
	require.Equal(t, OK, r)
	require.Equal(t, w, uint64(uintptr(unsafe.Pointer(p))))
	_, r = rw.Word64(w+4, true)
	require.Equal(t, Misaligned, r)
	_, r = ro.Word64((ro.IOVA()+7)&^7, true)
	require.Equal(t, NoPermission, r)
	_, r = rw.Word64((base+n)&^7, true) // runs past the end
	require.Equal(t, OutOfRange, r)

	for r := OK; r <= Misaligned; r++ {
		require.NotContains(t, r.String(), "Result(")
	}
	require.Equal(t, "present|writable|dirty|accessed", (Present | Writable | Dirty | Accessed).String())
}

// TestTranslateSplitsAtDiscontiguousFrames permutes the frames of a buffer
// (as a remap would) and checks that the walk follows the table, not the
// addresses.
func TestTranslateSplitsAtDiscontiguousFrames(t *testing.T) {
	buf, err := hostmem.Alloc(4 * PageSize)
	require.NoError(t, err)
	defer func() { require.NoError(t, buf.Free()) }()
	var space hostmem.Space
	require.NoError(t, space.Register(buf))
	app := buf.Bytes()
	tab, err := NewPinned(addrOf(app), app, &space, hostmem.NewPinAccount(0), true)
	require.NoError(t, err)
	defer func() { require.NoError(t, tab.Release()) }()
	require.ErrorIs(t, buf.Free(), hostmem.ErrBufferBusy)

	nic := buf.NIC()
	for k := 0; k < 4; k++ {
		f, flags := tab.Frame(k)
		require.Equal(t, unsafe.Pointer(&nic[k*PageSize]), f, "frames are the NIC mapping")
		require.Equal(t, Present|Writable, flags)
	}
	seg, r := tab.Translate(tab.IOVA(), 4*PageSize, true)
	require.Equal(t, OK, r)
	require.Len(t, seg, 4*PageSize, "contiguous frames make one run")

	// Swap the frames of pages 1 and 2 (a remap leaves direct access first).
	tab.direct.Store(false)
	f1, f2 := tab.pages[1].frame.Load(), tab.pages[2].frame.Load()
	tab.pages[1].frame.Store(f2)
	tab.pages[2].frame.Store(f1)
	seg, r = tab.Translate(tab.IOVA()+10, 4*PageSize-10, true)
	require.Equal(t, OK, r)
	require.Len(t, seg, PageSize-10)

	src := make([]byte, 4*PageSize)
	for i := range src {
		src[i] = byte(i / PageSize)
	}
	done, r := tab.CopyIn(tab.IOVA(), src)
	require.Equal(t, OK, r)
	require.Equal(t, len(src), done)
	require.Equal(t, byte(0), app[0])
	require.Equal(t, byte(2), app[PageSize], "page 2's bytes went to page 1's frame")
	require.Equal(t, byte(1), app[2*PageSize], "page 1's bytes went to page 2's frame")
	require.Equal(t, byte(3), app[3*PageSize])
	out := make([]byte, len(src))
	_, r = tab.CopyOut(tab.IOVA(), out)
	require.Equal(t, OK, r)
	require.Equal(t, src, out, "reading through the same table gives the bytes back")
	tab.pages[1].frame.Store(f1)
	tab.pages[2].frame.Store(f2)
}

func TestLinear(t *testing.T) {
	rw, mem := newHeap(t, 3*PageSize, 8, 2*PageSize+8, true)
	ro, _ := newHeap(t, 3*PageSize, 8, 2*PageSize+8, false)
	b, w := rw.Linear()
	require.True(t, w)
	require.Len(t, b, 2*PageSize)
	require.Same(t, &mem[8], &b[0], "a Go slice is its own frame")
	b, w = ro.Linear()
	require.False(t, w, "read-only")
	require.Len(t, b, 2*PageSize)
	require.NoError(t, rw.Release())
	b, _ = rw.Linear()
	require.Nil(t, b, "no direct access after release")
}

func TestReleaseUnpins(t *testing.T) {
	acct := hostmem.NewPinAccount(0)
	mem := make([]byte, 3*PageSize)
	pages := hostmem.PinnedPages()
	tab, err := NewPinned(addrOf(mem), mem, nil, acct, true)
	require.NoError(t, err)
	require.Equal(t, pages+tab.Pages(), hostmem.PinnedPages())
	require.EqualValues(t, tab.Pages()*PageSize, acct.Pinned())
	s := tab.ReadBegin()
	require.False(t, tab.ReadRetry(s))
	require.NoError(t, tab.Release())
	require.True(t, tab.ReadRetry(s), "release bumps the sequence count")
	require.Equal(t, pages, hostmem.PinnedPages())
	require.Zero(t, acct.Pinned())
	f, flags := tab.Frame(0)
	require.Nil(t, f)
	require.Zero(t, flags)
	_, r := tab.CopyIn(tab.IOVA(), mem[:1])
	require.Equal(t, NotPresent, r)
	require.Error(t, tab.Release())
}

func TestNewPinnedErrors(t *testing.T) {
	acct := hostmem.NewPinAccount(PageSize)
	_, err := NewPinned(0, nil, nil, acct, true)
	require.Error(t, err)
	mem := make([]byte, 3*PageSize)
	_, err = NewPinned(addrOf(mem), mem, nil, nil, true)
	require.Error(t, err)
	_, err = NewPinned(math.MaxUint64-10, mem, nil, acct, true)
	require.Error(t, err)
	_, err = NewPinned(addrOf(mem), mem, nil, acct, true)
	require.ErrorIs(t, err, hostmem.ErrPinLimit)
	require.Zero(t, acct.Pinned())

	// A region that ends exactly at 2^64 is fine.
	small := make([]byte, 16)
	tab, err := NewPinned(math.MaxUint64-15, small, nil, hostmem.NewPinAccount(0), true)
	require.NoError(t, err)
	_, r := tab.CopyIn(math.MaxUint64, []byte{1})
	require.Equal(t, OK, r)
	require.Equal(t, byte(1), small[15])
	require.NoError(t, tab.Release())
}

func TestCopyAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	tab, _ := newHeap(t, 4*PageSize, 1, 4*PageSize-1, true)
	src := make([]byte, 3*PageSize)
	require.Zero(t, testing.AllocsPerRun(100, func() {
		_, _ = tab.CopyIn(tab.IOVA()+5, src)
		_, _ = tab.CopyOut(tab.IOVA()+5, src)
		_, _ = tab.Translate(tab.IOVA(), 100, true)
		_, _ = tab.Word64((tab.IOVA()+7)&^7, true)
	}))
}

// BenchmarkTranslate translates 64 bytes, directly (pinned, contiguous)
// and by walking the entries (the path of demand-paged tables).
func BenchmarkTranslate(b *testing.B) {
	for _, direct := range []bool{true, false} {
		name := map[bool]string{true: "direct", false: "walk"}[direct]
		b.Run(name, func(b *testing.B) {
			tab, _ := newHeap(b, 64*PageSize, 0, 64*PageSize, true)
			tab.direct.Store(direct)
			b.ReportAllocs()
			iova := tab.IOVA() + 3*PageSize + 100
			for b.Loop() {
				_, _ = tab.Translate(iova, 64, true)
			}
		})
	}
}

// BenchmarkCopyInWalk copies 4 KiB across a page boundary by walking.
func BenchmarkCopyInWalk(b *testing.B) {
	tab, _ := newHeap(b, 64*PageSize, 0, 64*PageSize, true)
	tab.direct.Store(false)
	src := make([]byte, 4096)
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = tab.CopyIn(tab.IOVA()+100, src)
	}
}
