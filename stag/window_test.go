package stag

import (
	"sync"
	"testing"
	"testing/synctest"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// windowFixture is a valid, linearly mapped region of PD 7 over mem, a
// type 1 window (any QP) on its middle half, writable, and a type 2 window
// bound to QP 33 on the same range, readable and writable.
type windowFixture struct {
	tab          *Table[int]
	mem          []byte
	base         uint64
	region       *Entry[int]
	type1, type2 *Entry[int]
}

func newWindowFixture(t *testing.T) *windowFixture {
	t.Helper()
	f := &windowFixture{tab: NewTable[int](0), mem: make([]byte, 0x4000)}
	f.base = uint64(uintptr(unsafe.Pointer(&f.mem[0])))
	f.region = newValid(t, f.tab, 7, f.base, 0x4000, AccessLocalWrite|AccessRemoteRead|AccessMWBind, 1)
	require.NoError(t, f.tab.SetLinear(f.region.STag, &f.mem[0], true))
	f.type1 = f.bind(t, AccessRemoteWrite, 0)
	f.type2 = f.bind(t, AccessRemoteRead|AccessRemoteWrite, 33)
	return f
}

// bind allocates a window entry and binds it to the region's middle half.
func (f *windowFixture) bind(t *testing.T, a Access, qp uint32) *Entry[int] {
	t.Helper()
	w, err := f.tab.Alloc(7, 0, 0, 0, 0)
	require.NoError(t, err)
	e, err := f.tab.Rekey(w.STag, Make(w.STag.Index(), w.STag.Key()+1), 7, f.base+0x1000, 0x2000, a, 1, f.region, qp)
	require.NoError(t, err)
	require.NoError(t, f.tab.Validate(e.STag))
	return e
}

// TestWindowReasons has one row per outcome of an access through a memory
// window: the window's checks (rxe_lookup_mw's: key, PD, QP, rights, state)
// and its bounds, which are the window's and not the region's.
func TestWindowReasons(t *testing.T) {
	f := newWindowFixture(t)
	w1, w2 := f.type1.STag, f.type2.STag
	in := f.base + 0x1800
	for _, tc := range []struct {
		name string
		pd   uint32
		qp   uint32
		key  STag
		need Access
		iova uint64
		n    uint64
		want Reason
	}{
		{"type 1, any QP, write inside", 7, 99, w1, AccessRemoteWrite, in, 64, OK},
		{"type 1, no QP at all", 7, 0, w1, AccessRemoteWrite, in, 64, OK},
		{"type 1, whole window", 7, 1, w1, AccessRemoteWrite, f.base + 0x1000, 0x2000, OK},
		{"type 2 through its QP", 7, 33, w2, AccessRemoteRead, in, 64, OK},
		// The window's checks.
		{"stale window key", 7, 1, Make(w1.Index(), w1.Key()-1), AccessRemoteWrite, in, 64, KeyMismatch},
		{"another PD", 8, 1, w1, AccessRemoteWrite, in, 64, PDMismatch},
		{"as an L_Key, reading", 7, 1, w1, 0, in, 64, AccessDenied},
		{"as an L_Key, writing", 7, 1, w1, AccessLocalWrite, in, 64, AccessDenied},
		{"type 2 through another QP", 7, 34, w2, AccessRemoteRead, in, 64, QPMismatch},
		{"type 2 without a QP", 7, 0, w2, AccessRemoteRead, in, 64, QPMismatch},
		{"right the window lacks (the region has it)", 7, 1, w1, AccessRemoteRead, in, 64, AccessDenied},
		{"right neither has", 7, 33, w2, AccessRemoteAtomic, in, 8, AccessDenied},
		// Bounds are the window's.
		{"one byte before the window, inside the region", 7, 1, w1, AccessRemoteWrite, f.base + 0xfff, 2, OutOfBounds},
		{"one byte past the window, inside the region", 7, 1, w1, AccessRemoteWrite, f.base + 0x2fff, 2, OutOfBounds},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sp Span[int]
			sp.QP = tc.qp
			require.Equal(t, tc.want, f.tab.Open(&sp, tc.pd, tc.key, tc.need, tc.iova, tc.n))
			if tc.want != OK {
				require.Nil(t, sp.Entry)
				return
			}
			require.True(t, sp.Window())
			require.Same(t, f.region, sp.Entry, "a window access holds the region")
			require.Equal(t, int64(1), f.region.Refs(), "counted on the region")
			require.True(t, sp.Linear(), "through the region's linear mapping")
			require.Equal(t, unsafe.Pointer(&f.mem[tc.iova-f.base]), unsafe.Pointer(&sp.At(0, 1)[0]))
			sp.Close()
			require.False(t, sp.Window())
			require.Zero(t, f.region.Refs())
		})
	}
	// The lookups without a QP: remote-only and type 2 rules hold too.
	_, r := f.tab.Lookup(7, w1, AccessRemoteWrite)
	require.Equal(t, OK, r)
	_, r = f.tab.Lookup(7, w1, 0)
	require.Equal(t, AccessDenied, r, "a window is no L_Key")
	_, _, r = f.tab.LookupRange(7, w1, AccessLocalWrite, f.base+0x1000, 1)
	require.Equal(t, AccessDenied, r)
	_, r = f.tab.Acquire(7, w2, AccessRemoteRead)
	require.Equal(t, QPMismatch, r)
}

// TestWindowInvalidationEndsSpans: a Span opened through a window is never
// Current, so every packet refreshes it, which checks the window: once the
// window is invalidated (and its region touched) the Span fails (Refresh
// Invalid), while a Span on the region itself refreshes and goes on.
func TestWindowInvalidationEndsSpans(t *testing.T) {
	f := newWindowFixture(t)
	var win, reg Span[int]
	require.Equal(t, OK, f.tab.Open(&win, 7, f.type1.STag, AccessRemoteWrite, f.base+0x1000, 64))
	require.Equal(t, OK, f.tab.Open(&reg, 7, f.region.STag, AccessLocalWrite, f.base, 64))
	require.True(t, win.Window())
	require.False(t, reg.Window())
	require.False(t, win.Current(), "a window Span refreshes at every packet")
	require.Equal(t, OK, win.RefreshReason())
	require.True(t, win.Linear())
	require.True(t, reg.Current())
	require.NoError(t, f.tab.Invalidate(f.type1.STag))
	require.Equal(t, Invalid, win.RefreshReason(), "the window's slot changed")
	require.NoError(t, f.tab.Touch(f.region.STag))
	require.Equal(t, Invalid, win.RefreshReason())
	require.False(t, reg.Current())
	require.True(t, reg.Refresh(), "a Span on the region survives a touch")
	win.Close()
	reg.Close()
	var again Span[int]
	require.Equal(t, Invalid, f.tab.Open(&again, 7, f.type1.STag, AccessRemoteWrite, f.base+0x1000, 64))
}

// TestWindowFollowsRegion: a window access is governed by its region's
// state: suspended for writes while the region is, refused once the region
// is invalid.
func TestWindowFollowsRegion(t *testing.T) {
	f := newWindowFixture(t)
	var sp Span[int]
	sp.QP = 33
	require.NoError(t, f.tab.Suspend(f.region.STag))
	require.Equal(t, Suspended, f.tab.Open(&sp, 7, f.type2.STag, AccessRemoteWrite, f.base+0x1000, 8))
	require.Equal(t, OK, f.tab.Open(&sp, 7, f.type2.STag, AccessRemoteRead, f.base+0x1000, 8), "reads go on")
	sp.Close()
	require.NoError(t, f.tab.Resume(f.region.STag))
	require.Equal(t, OK, f.tab.Open(&sp, 7, f.type2.STag, AccessRemoteWrite, f.base+0x1000, 8))
	sp.Close()
	require.NoError(t, f.tab.Invalidate(f.region.STag))
	require.Equal(t, Invalid, f.tab.Open(&sp, 7, f.type2.STag, AccessRemoteWrite, f.base+0x1000, 8))
}

// TestRekey: a new registration of an index under the consumer's key byte;
// the old key misses, the old entry is free, and the rules of Rekey hold.
func TestRekey(t *testing.T) {
	tab := NewTable[int](0)
	old := newValid(t, tab, 7, 0x1000, 0x1000, AccessRemoteRead, 1)
	next := Make(old.STag.Index(), old.STag.Key()+5)
	_, err := tab.Rekey(old.STag, next, 7, 0x2000, 0x100, AccessRemoteRead, 2, nil, 0)
	require.ErrorIs(t, err, ErrState, "a valid entry is invalidated first")
	require.NoError(t, tab.Invalidate(old.STag))
	_, err = tab.Rekey(old.STag, Make(old.STag.Index()+1, 9), 7, 0x2000, 0x100, AccessRemoteRead, 2, nil, 0)
	require.ErrorIs(t, err, ErrNoEntry, "only the key byte may change")
	_, err = tab.Rekey(old.STag, next, 7, 0x2000, 0x1000, AccessRemoteRead, 2, old, 0)
	require.ErrorIs(t, err, ErrRange, "a window outside its region")
	e, err := tab.Rekey(old.STag, next, 8, 0x2000, 0x100, AccessRemoteRead, 2, nil, 0)
	require.NoError(t, err)
	require.Equal(t, StateFree, old.State())
	require.Equal(t, StateInvalid, e.State())
	require.NoError(t, tab.Validate(next))
	_, r := tab.Lookup(7, old.STag, AccessRemoteRead)
	require.Equal(t, KeyMismatch, r, "the old key misses")
	got, r := tab.Lookup(8, next, AccessRemoteRead)
	require.Equal(t, OK, r)
	require.Equal(t, 2, got.Value)
	_, err = tab.Rekey(old.STag, next, 7, 0, 1, 0, 0, nil, 0)
	require.ErrorIs(t, err, ErrNoEntry, "old no longer names the live entry")
	// The index keeps counting from the consumer's key byte.
	require.NoError(t, tab.Invalidate(next))
	require.NoError(t, tab.Free(next))
	for {
		a, err := tab.Alloc(7, 0, 1, 0, 0)
		require.NoError(t, err)
		if a.STag.Index() == next.Index() {
			require.Equal(t, next.Key()+1, a.STag.Key())
			break
		}
	}
}

// TestDrainConcurrently: several goroutines may drain an entry at once
// (a deregistration, a suspension, a window invalidation); all return when
// the last reference goes.
func TestDrainConcurrently(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := NewTable[int](0)
		e := newValid(t, tab, 7, 0x1000, 0x1000, AccessRemoteRead, 1)
		got, r := tab.Acquire(7, e.STag, AccessRemoteRead)
		require.Equal(t, OK, r)
		var wg sync.WaitGroup
		done := make(chan struct{}, 3)
		for range 3 {
			wg.Go(func() {
				e.Drain()
				done <- struct{}{}
			})
		}
		synctest.Wait()
		require.Empty(t, done, "no drainer returns while a reference is held")
		got.Release()
		wg.Wait()
		require.Len(t, done, 3)
	})
}

// TestWindowOpenAllocatesNothing: the window path is a slow path, but no
// heavier on memory than the region's.
func TestWindowOpenAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	f := newWindowFixture(t)
	var sp Span[int]
	sp.QP = 33
	require.Zero(t, testing.AllocsPerRun(100, func() {
		if f.tab.Open(&sp, 7, f.type2.STag, AccessRemoteWrite, f.base+0x1000, 64) != OK {
			panic("open")
		}
		sp.Close()
	}))
}
