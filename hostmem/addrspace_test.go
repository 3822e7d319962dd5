package hostmem

import (
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/internal/pagemap"
	"golang.org/x/sys/unix"
)

const testSpace = 256 << 20

func newSpace(t testing.TB, size int64) *AddressSpace {
	t.Helper()
	return newSpaceConfig(t, Config{Size: size})
}

func newSpaceConfig(t testing.TB, cfg Config) *AddressSpace {
	t.Helper()
	s, err := NewAddressSpace(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		if !s.closed.Load() {
			require.NoError(t, s.Close())
		}
	})
	return s
}

// recorder is a Notifier that records what it is told.
type recorder struct {
	mu   sync.Mutex
	invs []Invalidation
	ends []Invalidation
}

func (r *recorder) Invalidate(_ *Subscription, inv Invalidation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.invs = append(r.invs, inv)
}

func (r *recorder) InvalidateEnd(_ *Subscription, inv Invalidation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ends = append(r.ends, inv)
}

func (r *recorder) take() (invs, ends []Invalidation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	invs, ends, r.invs, r.ends = r.invs, r.ends, nil, nil
	return invs, ends
}

func frames(t *testing.T, s *AddressSpace, addr uint64, n int) []Frame {
	t.Helper()
	fs := make([]Frame, n)
	for i := range fs {
		f, ok := s.FrameOf(addr + uint64(i)<<PageShift)
		require.True(t, ok, "page %d mapped", i)
		fs[i] = f
	}
	return fs
}

func TestAllocFreeAllocGivesNewFrames(t *testing.T) {
	s := newSpace(t, testSpace)
	var rec recorder
	sub, err := s.Subscribe(0, math.MaxUint64, &rec) // implicit-ODP style: everything
	require.NoError(t, err)
	defer sub.Unsubscribe()

	other, err := s.Alloc(PageSize) // a neighbour that must not be touched
	require.NoError(t, err)
	b, err := s.Alloc(3*PageSize - 100)
	require.NoError(t, err)
	require.Len(t, b, 3*PageSize-100)
	addr := AddrOf(b)
	require.Equal(t, AddrOf(other)+PageSize, addr, "first fit")
	require.Zero(t, addr%PageSize)
	copy(b, "old contents")
	other[0] = 7
	old := frames(t, s, addr, 3)
	invs, _ := rec.take()
	require.Empty(t, invs, "Alloc invalidates nothing")
	seq := sub.ReadBegin()

	require.NoError(t, s.Free(addr, 3*PageSize-100))
	invs, ends := rec.take()
	want := Invalidation{Range: Range{addr, addr + 3*PageSize}, Event: EventUnmap, Seq: seq + 1}
	require.Equal(t, []Invalidation{want}, invs, "exactly one invalidation of exactly the range")
	want.Seq = seq + 2
	require.Equal(t, []Invalidation{want}, ends)
	require.True(t, sub.ReadRetry(seq))
	require.Equal(t, seq+2, sub.ReadBegin())
	_, ok := s.FrameOf(addr)
	require.False(t, ok)
	_, err = s.Resolve(addr, 0)
	require.ErrorIs(t, err, ErrNotMapped)

	// Alloc at the same address (first fit finds it again) maps new,
	// zeroed frames.
	b2, err := s.Alloc(3 * PageSize)
	require.NoError(t, err)
	require.Equal(t, addr, AddrOf(b2))
	nw := frames(t, s, addr, 3)
	for i := range nw {
		require.NotContains(t, old, nw[i], "page %d got an old frame", i)
	}
	require.Equal(t, make([]byte, 3*PageSize), b2)
	require.Equal(t, byte(7), other[0])
	invs, _ = rec.take()
	require.Empty(t, invs)

	// And AllocAt after a Free.
	require.NoError(t, s.Free(addr, 3*PageSize))
	_, err = s.AllocAt(addr+PageSize, PageSize)
	require.NoError(t, err)
	nw2, _ := s.FrameOf(addr + PageSize)
	require.NotContains(t, append(old, nw...), nw2)
	_, err = s.AllocAt(addr, 2*PageSize)
	require.ErrorIs(t, err, ErrMapped)
	rec.take()
}

func TestFreeRangeErrors(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(2 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	require.ErrorIs(t, s.Free(addr, 3*PageSize), ErrNotMapped, "third page not mapped")
	require.Error(t, s.Free(addr+1, PageSize), "unaligned")
	require.Error(t, s.Free(addr, 0))
	require.ErrorIs(t, s.Free(s.Bounds().End, PageSize), ErrNotMapped)
	require.ErrorIs(t, s.Free(s.Bounds().End-PageSize, 2*PageSize), ErrNotMapped)
	_, err = s.AllocAt(addr+1, PageSize)
	require.Error(t, err)
	_, err = s.Alloc(0)
	require.Error(t, err)
	// Part of an allocation can be freed, like munmap.
	require.NoError(t, s.Free(addr+PageSize, PageSize))
	b[0] = 1
	require.NoError(t, s.Free(addr, PageSize))
	require.Zero(t, s.Stats().MappedPages)
}

func TestViewsShareFrames(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(2 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	copy(b[PageSize-5:], "across a page")
	pg0, err := s.Resolve(addr, ResolveWrite)
	require.NoError(t, err)
	pg1, err := s.Resolve(addr+PageSize+7, ResolveWrite)
	require.NoError(t, err)
	require.True(t, pg0.Writable)
	require.Equal(t, s.FramePointer(pg0.Frame), pg0.NIC)
	require.NotEqual(t, unsafe.Pointer(&b[0]), pg0.NIC, "two mappings")
	nic0, nic1 := s.FrameBytes(pg0.Frame), s.FrameBytes(pg1.Frame)
	require.Equal(t, "acros", string(nic0[PageSize-5:]))
	require.Equal(t, "s a page", string(nic1[:8]))

	copy(nic1[100:], "written by the NIC")
	require.Equal(t, "written by the NIC", string(b[PageSize+100:PageSize+118]))
}

func TestResolve(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(8 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	syscalls := func() int64 { return s.Stats().Syscalls }

	// Never touched: NoFault finds nothing resident (one mincore).
	sc := syscalls()
	_, err = s.Resolve(addr, ResolveNoFault)
	require.ErrorIs(t, err, ErrNotResident)
	require.Equal(t, sc+1, syscalls())

	// ResolvePopulate populates it through the NIC's view (where ODP
	// tables copy), once; the application's page tables stay untouched.
	before := s.Stats().Populated
	pg, err := s.Resolve(addr+5, ResolvePopulate|ResolveWrite)
	require.NoError(t, err)
	require.Equal(t, before+1, s.Stats().Populated)
	require.Equal(t, []byte{1}, mincore(t, s.FrameBytes(pg.Frame)))
	require.True(t, appMapped(t, uint64(uintptr(pg.NIC))), "populated through the NIC's view")
	require.False(t, appMapped(t, addr), "the application's view is left alone")
	sc = syscalls()
	_, err = s.Resolve(addr, ResolvePopulate|ResolveWrite)
	require.NoError(t, err)
	require.Equal(t, before+1, s.Stats().Populated, "a populated page is not populated again")
	_, err = s.Resolve(addr, ResolveNoFault)
	require.NoError(t, err)
	require.Equal(t, sc, syscalls(), "a page known to be held needs no system call")

	// A plain Resolve makes no system call, even for a page nobody has
	// touched: the caller's first access populates it.
	pg, err = s.Resolve(addr+3*PageSize, ResolveWrite)
	require.NoError(t, err)
	require.Equal(t, sc, syscalls())
	require.Equal(t, []byte{0}, mincore(t, s.FrameBytes(pg.Frame)), "nothing populated")
	*(*byte)(s.AppPointer(addr + 3*PageSize + 9)) = 9 // the caller's copy
	require.Equal(t, []byte{1}, mincore(t, s.FrameBytes(pg.Frame)))
	require.Equal(t, byte(9), s.FrameBytes(pg.Frame)[9])

	// Touched by the application only: a plain Resolve makes no system
	// call; NoFault finds it resident with one mincore, then knows it.
	b[PageSize] = 1
	pg, err = s.Resolve(addr+PageSize, ResolveWrite)
	require.NoError(t, err)
	require.Equal(t, sc, syscalls())
	require.Equal(t, byte(1), s.FrameBytes(pg.Frame)[0])
	b[4*PageSize] = 1
	_, err = s.Resolve(addr+4*PageSize, ResolveNoFault|ResolveWrite)
	require.NoError(t, err)
	require.Equal(t, sc+1, syscalls())
	_, err = s.Resolve(addr+4*PageSize, ResolveNoFault|ResolvePopulate)
	require.NoError(t, err)
	require.Equal(t, sc+1, syscalls())

	// Read-only pages.
	require.NoError(t, s.Protect(addr+2*PageSize, PageSize, false))
	pg, err = s.Resolve(addr+2*PageSize, ResolveWrite)
	require.ErrorIs(t, err, ErrReadOnly)
	require.False(t, pg.Writable)
	pg, err = s.Resolve(addr+2*PageSize, ResolvePopulate)
	require.NoError(t, err, "a read-only page is populated for reading")
	require.False(t, pg.Writable)
	require.Equal(t, []byte{1}, mincore(t, s.FrameBytes(pg.Frame)))
	require.Equal(t, "r--s", perms(t, addr+2*PageSize))
	require.NoError(t, s.Protect(addr+2*PageSize, PageSize, true))
	require.Equal(t, "rw-s", perms(t, addr+2*PageSize))
	pg, err = s.Resolve(addr+2*PageSize, ResolveWrite)
	require.NoError(t, err)
	require.True(t, pg.Writable)

	// Unmapped and outside.
	_, err = s.Resolve(addr+8*PageSize, 0)
	require.ErrorIs(t, err, ErrNotMapped)
	_, err = s.Resolve(s.Bounds().End, 0)
	require.ErrorIs(t, err, ErrNotMapped)
	_, err = s.Resolve(s.Bounds().Start-1, 0)
	require.ErrorIs(t, err, ErrNotMapped)

	// A range: pages 3..7 resolved, 5..7 (not known) populated with one
	// call; page 8 is not mapped.
	out := make([]Page, 6)
	sc, before = syscalls(), s.Stats().Populated
	n, err := s.ResolveRange(addr+3*PageSize, out, ResolveWrite|ResolvePopulate)
	require.ErrorIs(t, err, ErrNotMapped)
	require.Equal(t, 5, n)
	require.Equal(t, sc+1, syscalls())
	require.Equal(t, before+3, s.Stats().Populated)
	for i := range 5 {
		f, _ := s.FrameOf(addr + uint64(3+i)<<PageShift)
		require.Equal(t, f, out[i].Frame)
		require.Equal(t, []byte{1}, mincore(t, s.FrameBytes(f)))
	}
	n, err = s.ResolveRange(addr, out[:5], ResolveNoFault)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.Equal(t, sc+1, syscalls(), "all five are known")
	require.NoError(t, s.Protect(addr+PageSize, PageSize, false))
	n, err = s.ResolveRange(addr, out[:3], ResolveWrite)
	require.ErrorIs(t, err, ErrReadOnly)
	require.Equal(t, 1, n)

	// NoFault over a run stops at the first page not resident, having
	// resolved those before it.
	c, err := s.Alloc(4 * PageSize)
	require.NoError(t, err)
	c[0], c[PageSize], c[3*PageSize] = 1, 1, 1
	n, err = s.ResolveRange(AddrOf(c), out[:4], ResolveNoFault)
	require.ErrorIs(t, err, ErrNotResident)
	require.Equal(t, 2, n)
}

func TestResolveAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	s := newSpace(t, testSpace)
	b, err := s.Alloc(PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	require.Zero(t, testing.AllocsPerRun(100, func() {
		if _, err := s.Resolve(addr, ResolveWrite); err != nil {
			panic(err)
		}
	}))
	require.Zero(t, testing.AllocsPerRun(100, func() {
		if _, err := s.Resolve(addr+PageSize, 0); err != ErrNotMapped {
			panic(err)
		}
	}))
}

func TestProtectInvalidatesOnlyWhenTakingWriteAway(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(4 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	var rec recorder
	sub, err := s.Subscribe(addr+PageSize, PageSize, &rec)
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, s.Protect(addr, 4*PageSize, false))
	invs, _ := rec.take()
	require.Len(t, invs, 1)
	require.Equal(t, Range{addr + PageSize, addr + 2*PageSize}, invs[0].Range, "clamped to the subscription")
	require.Equal(t, EventProtect, invs[0].Event)
	require.NoError(t, s.Protect(addr, 4*PageSize, true))
	invs, _ = rec.take()
	require.Empty(t, invs)
	b[3*PageSize] = 1 // writable again
}

func TestSubscriptionsSeeOnlyTheirRange(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(10 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	var in, out recorder
	subIn, err := s.Subscribe(addr+2*PageSize+10, 3*PageSize, &in) // pages 2..5
	require.NoError(t, err)
	subOut, err := s.Subscribe(addr+7*PageSize, PageSize, &out)
	require.NoError(t, err)
	require.Equal(t, Range{addr + 2*PageSize + 10, addr + 5*PageSize + 10}, subIn.Range())
	require.NoError(t, s.Free(addr+4*PageSize, 2*PageSize))
	invs, _ := in.take()
	require.Equal(t, []Invalidation{{Range: Range{addr + 4*PageSize, addr + 5*PageSize + 10}, Event: EventUnmap, Seq: 1}}, invs)
	invs, _ = out.take()
	require.Empty(t, invs)
	require.Zero(t, subOut.ReadBegin())
	require.EqualValues(t, 2, subIn.ReadBegin())

	// After Unsubscribe nothing is called.
	subIn.Unsubscribe()
	subIn.Unsubscribe()
	require.NoError(t, s.Free(addr+2*PageSize, 2*PageSize))
	invs, _ = in.take()
	require.Empty(t, invs)
	subOut.Unsubscribe()

	_, err = s.Subscribe(addr, 0, &in)
	require.Error(t, err)
	_, err = s.Subscribe(addr, 1, nil)
	require.Error(t, err)
}

func TestCloseRefusesWhileInUse(t *testing.T) {
	s, err := NewAddressSpace(Config{Size: 4 << 20})
	require.NoError(t, err)
	require.Equal(t, uint64(4<<20), s.Bounds().Len())
	b, err := s.Alloc(PageSize)
	require.NoError(t, err)
	sub, err := s.Subscribe(AddrOf(b), PageSize, NotifierFunc(func(*Subscription, Invalidation) {}))
	require.NoError(t, err)
	require.ErrorIs(t, s.Close(), ErrBusy)
	sub.Unsubscribe()
	fp, err := s.Pin(NewPinAccount(0), AddrOf(b), PageSize, true)
	require.NoError(t, err)
	require.ErrorIs(t, s.Close(), ErrBusy)
	require.NoError(t, fp.Unpin())
	require.NoError(t, s.Close())
	require.ErrorIs(t, s.Close(), ErrClosed)
	_, err = s.Alloc(PageSize)
	require.ErrorIs(t, err, ErrClosed)
	_, err = s.Resolve(AddrOf(b), 0)
	require.ErrorIs(t, err, ErrClosed)
}

func TestExhaustion(t *testing.T) {
	s := newSpace(t, 2<<20) // 512 pages, 512 frames
	b, err := s.Alloc(2 << 20)
	require.NoError(t, err)
	_, err = s.Alloc(PageSize)
	require.ErrorIs(t, err, ErrNoSpace)
	_, err = s.Migrate(AddrOf(b), 1)
	require.ErrorIs(t, err, ErrNoFrames, "no frame to migrate to")
	require.NoError(t, s.Free(AddrOf(b), PageSize))
	// The freed frame is in quarantine, but it is the only one: reused.
	m, err := s.Migrate(AddrOf(b)+PageSize, 1)
	require.NoError(t, err)
	m.Release()
}

func TestExtents(t *testing.T) {
	e := extents{{0, 100}}
	p, ok := e.take(10)
	require.True(t, ok)
	require.Zero(t, p)
	require.True(t, e.takeAt(50, 10))
	require.Equal(t, extents{{10, 50}, {60, 100}}, e)
	require.False(t, e.takeAt(45, 10), "overlaps the taken run")
	require.False(t, e.takeAt(0, 1))
	require.True(t, e.takeAt(10, 5))
	require.True(t, e.takeAt(95, 5))
	require.Equal(t, extents{{15, 50}, {60, 95}}, e)
	p, ok = e.take(35) // first fit: the first run, exactly
	require.True(t, ok)
	require.EqualValues(t, 15, p)
	require.Equal(t, extents{{60, 95}}, e)
	_, ok = e.take(36)
	require.False(t, ok)
	e.put(15, 35)
	e.put(50, 10)
	require.Equal(t, extents{{15, 95}}, e)
	e.put(0, 15)
	e.put(95, 1)
	require.Equal(t, extents{{0, 96}}, e)
	e.put(97, 3)
	require.Equal(t, extents{{0, 96}, {97, 100}}, e)
	e.put(96, 1)
	require.Equal(t, extents{{0, 100}}, e)
}

// mincore returns the residency of b's pages.
func mincore(t *testing.T, b []byte) []byte {
	t.Helper()
	vec := make([]byte, (len(b)+PageSize-1)/PageSize)
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
	require.Zero(t, e)
	for i := range vec {
		vec[i] &= 1
	}
	return vec
}

// appMapped reports whether the page of addr has a present page-table
// entry in this process (/proc/self/pagemap): for the application's view,
// whether it maps the page now, as opposed to the page being resident in
// the memfd only.
func appMapped(t *testing.T, addr uint64) bool {
	t.Helper()
	p, err := pagemap.Present(addr)
	require.NoError(t, err)
	return p
}

// perms returns the permission column of /proc/self/maps for addr.
func perms(t *testing.T, addr uint64) string {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	for line := range strings.Lines(string(maps)) {
		f := strings.Fields(line)
		lo, hi, _ := strings.Cut(f[0], "-")
		if parseHex(lo) <= addr && addr < parseHex(hi) {
			return f[1]
		}
	}
	t.Fatalf("%#x not in /proc/self/maps", addr)
	return ""
}

func parseHex(s string) uint64 {
	var v uint64
	for _, c := range []byte(s) {
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= uint64(c - '0')
		case c >= 'a' && c <= 'f':
			v |= uint64(c-'a') + 10
		}
	}
	return v
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*131>>8)
	}
}

func filled(n int, seed byte) []byte {
	b := make([]byte, n)
	fill(b, seed)
	return b
}

// TestFrameReuseIsFIFOAfterQuarantine: released frames come back oldest
// first, and only beyond the quarantine; until then fresh frames are used.
func TestFrameReuseIsFIFOAfterQuarantine(t *testing.T) {
	s := newSpace(t, 64<<20) // 16384 frames
	seq := func(from, n int) []Frame {
		fs := make([]Frame, n)
		for i := range fs {
			fs[i] = Frame(from + i)
		}
		return fs
	}
	a, err := s.Alloc(6000 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(a)
	require.Equal(t, seq(0, 6000), frames(t, s, addr, 6000), "fresh frames in order")
	require.NoError(t, s.Free(addr, 6000*PageSize))
	st := s.Stats()
	require.Equal(t, 6000, st.FramesFree)
	require.Equal(t, 16384-6000, st.FramesUnused)

	// 1904 released frames exceed the quarantine: those first, then fresh.
	_, err = s.AllocAt(addr, 2000*PageSize)
	require.NoError(t, err)
	require.Equal(t, append(seq(0, 1904), seq(6000, 96)...), frames(t, s, addr, 2000))
	require.Equal(t, frameQuarantine, s.Stats().FramesFree)

	// Release those 2000 behind the 4096 waiting; the next 2000 are the
	// oldest waiting ones.
	require.NoError(t, s.Free(addr, 2000*PageSize))
	_, err = s.AllocAt(addr, 2000*PageSize)
	require.NoError(t, err)
	require.Equal(t, seq(1904, 2000), frames(t, s, addr, 2000))
	require.Equal(t, 2000, s.Stats().MappedPages)
	require.Equal(t, 2000, s.Stats().FramesInUse)
}

func TestNames(t *testing.T) {
	require.Equal(t, "unmap", EventUnmap.String())
	require.Equal(t, "migrate", EventMigrate.String())
	require.Equal(t, "protect", EventProtect.String())
	require.Equal(t, "Event(9)", Event(9).String())
	require.Equal(t, "[0x1000, 0x3000)", Range{0x1000, 0x3000}.String())
	require.Equal(t, Range{}, Range{0, 10}.Intersect(Range{10, 20}))
	require.Equal(t, Range{5, 10}, Range{0, 10}.Intersect(Range{5, 20}))
	require.EqualValues(t, 10, Range{0, 10}.Len())
}
