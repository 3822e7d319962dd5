package stag

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSTagLayout(t *testing.T) {
	s := Make(0x123456, 0x9a)
	require.Equal(t, STag(0x1234569a), s)
	require.Equal(t, uint32(0x123456), s.Index())
	require.Equal(t, uint8(0x9a), s.Key())
	require.Equal(t, "0x1234569a", s.String())
	// Only 24 bits of index survive.
	require.Equal(t, uint32(0xffffff), Make(0xffffffff, 0).Index())
	require.Equal(t, "0x00000000", STag(0).String())
}

func TestAccessValues(t *testing.T) {
	// libibverbs verbs.h enum ibv_access_flags.
	require.EqualValues(t, 1, AccessLocalWrite)
	require.EqualValues(t, 2, AccessRemoteWrite)
	require.EqualValues(t, 4, AccessRemoteRead)
	require.EqualValues(t, 8, AccessRemoteAtomic)
	require.EqualValues(t, 16, AccessMWBind)
	require.EqualValues(t, 32, AccessZeroBased)
	require.EqualValues(t, 64, AccessOnDemand)
}

func TestAccessString(t *testing.T) {
	for _, tc := range []struct {
		a    Access
		want string
	}{
		{0, "0"},
		{AccessLocalWrite, "LOCAL_WRITE"},
		{AccessLocalWrite | AccessRemoteRead, "LOCAL_WRITE|REMOTE_READ"},
		{AccessAll, "LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ|REMOTE_ATOMIC|MW_BIND|ZERO_BASED|ON_DEMAND"},
		{AccessRemoteAtomic | 0x300, "REMOTE_ATOMIC|0x300"},
	} {
		require.Equal(t, tc.want, tc.a.String(), "Access(%#x)", uint32(tc.a))
	}
	require.True(t, (AccessLocalWrite | AccessRemoteWrite).Has(AccessRemoteWrite))
	require.False(t, AccessRemoteRead.Has(AccessRemoteRead|AccessRemoteWrite))
	require.True(t, AccessRemoteRead.Has(0))
}

func TestReasonString(t *testing.T) {
	for r := OK; r <= OutOfBounds; r++ {
		require.NotContains(t, r.String(), "Reason(")
		require.Equal(t, r != OK, r.RemoteAccessError(), r.String())
	}
	require.Equal(t, "Reason(99)", Reason(99).String())
	require.Equal(t, "valid", StateValid.String())
}

// newValid allocates and validates an entry.
func newValid(t testing.TB, tab *Table[int], pd uint32, iova, length uint64, a Access, v int) *Entry[int] {
	e, err := tab.Alloc(pd, iova, length, a, v)
	require.NoError(t, err)
	require.NoError(t, tab.Validate(e.STag))
	return e
}

// TestLookupReasons has one row per failure reason of Lookup.
func TestLookupReasons(t *testing.T) {
	tab := NewTable[int](0)
	rw := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	e := newValid(t, tab, 7, 0x1000, 0x2000, rw, 42)
	inv, err := tab.Alloc(7, 0, 4096, rw, 43) // never validated
	require.NoError(t, err)
	freed := newValid(t, tab, 7, 0, 4096, rw, 44)
	require.NoError(t, tab.Free(freed.STag))

	for _, tc := range []struct {
		name string
		pd   uint32
		key  STag
		need Access
		want Reason
	}{
		{"ok remote write", 7, e.STag, AccessRemoteWrite, OK},
		{"ok no rights needed (local read)", 7, e.STag, 0, OK},
		{"ok several rights", 7, e.STag, AccessRemoteRead | AccessRemoteWrite, OK},
		// The index does not name an entry.
		{"index 0 is reserved", 7, Make(0, e.STag.Key()), 0, NoEntry},
		{"index beyond the table", 7, Make(MaxIndex, 1), 0, NoEntry},
		{"index never allocated in a grown chunk", 7, Make(e.STag.Index()+10, 1), 0, NoEntry},
		{"freed entry", 7, freed.STag, 0, NoEntry},
		// The key byte differs.
		{"stale key", 7, Make(e.STag.Index(), e.STag.Key()-1), 0, KeyMismatch},
		{"forged key", 7, Make(e.STag.Index(), e.STag.Key()^0xff), AccessRemoteWrite, KeyMismatch},
		// Another PD's QP presents a right key.
		{"other PD", 8, e.STag, AccessRemoteWrite, PDMismatch},
		// A right that was not granted.
		{"no remote atomic", 7, e.STag, AccessRemoteAtomic, AccessDenied},
		{"one of two rights missing", 7, e.STag, AccessRemoteWrite | AccessRemoteAtomic, AccessDenied},
		// Allocated but not valid.
		{"not yet validated", 7, inv.STag, AccessRemoteWrite, Invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, r := tab.Lookup(tc.pd, tc.key, tc.need)
			require.Equal(t, tc.want, r)
			if tc.want == OK {
				require.Same(t, e, got)
				require.Equal(t, 42, got.Value)
			} else {
				require.Nil(t, got)
			}
		})
	}

	// Invalidate turns a valid entry into Invalid, Validate back.
	require.NoError(t, tab.Invalidate(e.STag))
	_, r := tab.Lookup(7, e.STag, 0)
	require.Equal(t, Invalid, r)
	_, r = tab.Acquire(7, e.STag, 0)
	require.Equal(t, Invalid, r)
	require.NoError(t, tab.Validate(e.STag))
	_, r = tab.Lookup(7, e.STag, 0)
	require.Equal(t, OK, r)
	require.ErrorIs(t, tab.Validate(e.STag), ErrState)
}

func TestCheckRange(t *testing.T) {
	e := &Entry[int]{IOVA: 0x1000, Length: 0x100}
	top := &Entry[int]{IOVA: math.MaxUint64 - 0xff, Length: 0x100} // ends exactly at 2^64
	for _, tc := range []struct {
		name    string
		e       *Entry[int]
		iova, n uint64
		want    Reason
	}{
		{"whole", e, 0x1000, 0x100, OK},
		{"first byte", e, 0x1000, 1, OK},
		{"last byte", e, 0x10ff, 1, OK},
		{"empty at start", e, 0x1000, 0, OK},
		{"empty at end", e, 0x1100, 0, OK},
		{"one before", e, 0xfff, 1, OutOfBounds},
		{"starts before, ends inside", e, 0xfff, 2, OutOfBounds},
		{"one past the end", e, 0x1100, 1, OutOfBounds},
		{"last byte plus one", e, 0x10ff, 2, OutOfBounds},
		{"empty past the end", e, 0x1101, 0, OutOfBounds},
		{"longer than the entry", e, 0x1000, 0x101, OutOfBounds},
		// iova+n would wrap to a small number that looks in range.
		{"length overflow", e, 0x1080, math.MaxUint64 - 0x7f, OutOfBounds},
		{"length max", e, 0x1000, math.MaxUint64, OutOfBounds},
		{"iova max", e, math.MaxUint64, 1, OutOfBounds},
		{"entry at the top, whole", top, math.MaxUint64 - 0xff, 0x100, OK},
		{"entry at the top, last byte", top, math.MaxUint64, 1, OK},
		{"entry at the top, wraps", top, math.MaxUint64, 2, OutOfBounds},
	} {
		require.Equal(t, tc.want, tc.e.CheckRange(tc.iova, tc.n), tc.name)
	}
}

func TestRegistrationRollsKey(t *testing.T) {
	tab := NewTable[int](4)
	a := newValid(t, tab, 1, 0, 10, 0, 1)
	require.EqualValues(t, 1, a.STag.Index())
	require.NoError(t, tab.Invalidate(a.STag))
	require.NoError(t, tab.Free(a.STag))
	require.Equal(t, StateFree, a.State())

	// Only freed index: reused, with another key; the old key misses.
	b := newValid(t, tab, 1, 0, 10, 0, 2)
	require.Equal(t, a.STag.Index(), b.STag.Index())
	require.NotEqual(t, a.STag.Key(), b.STag.Key())
	_, r := tab.Lookup(1, a.STag, 0)
	require.Equal(t, KeyMismatch, r)
	got, r := tab.Lookup(1, b.STag, 0)
	require.Equal(t, OK, r)
	require.Equal(t, 2, got.Value)
	require.Nil(t, tab.Get(a.STag))
	require.Same(t, b, tab.Get(b.STag))

	// Control operations on the stale key fail.
	require.ErrorIs(t, tab.Invalidate(a.STag), ErrNoEntry)
	require.ErrorIs(t, tab.Free(a.STag), ErrNoEntry)
	require.ErrorIs(t, tab.Validate(Make(3000, 1)), ErrNoEntry)

	// 256 registrations of one index cycle through every key.
	seen := map[uint8]bool{}
	for i := 0; i < 256; i++ {
		require.NoError(t, tab.Free(b.STag))
		b = newValid(t, tab, 1, 0, 10, 0, i)
		require.EqualValues(t, 1, b.STag.Index())
		seen[b.STag.Key()] = true
	}
	require.Len(t, seen, 256)
}

func TestFreeIndicesReusedFIFO(t *testing.T) {
	tab := NewTable[int](3)
	var es []*Entry[int]
	for i := 0; i < 3; i++ {
		es = append(es, newValid(t, tab, 1, 0, 1, 0, i))
	}
	_, err := tab.Alloc(1, 0, 1, 0, 0)
	require.ErrorIs(t, err, ErrTableFull)
	require.Equal(t, 3, tab.Len())
	require.NoError(t, tab.Free(es[1].STag))
	require.NoError(t, tab.Free(es[0].STag))
	x := newValid(t, tab, 1, 0, 1, 0, 0)
	y := newValid(t, tab, 1, 0, 1, 0, 0)
	require.Equal(t, es[1].STag.Index(), x.STag.Index())
	require.Equal(t, es[0].STag.Index(), y.STag.Index())
}

func TestFreeQueueCompacts(t *testing.T) {
	tab := NewTable[int](0)
	var es []*Entry[int]
	for i := 0; i < 4000; i++ {
		es = append(es, newValid(t, tab, 1, 0, 1, 0, i))
	}
	// Free and reallocate so that the queue never empties.
	for round := 0; round < 5; round++ {
		for i := range es {
			require.NoError(t, tab.Free(es[i].STag))
			es[i] = newValid(t, tab, 1, 0, 1, 0, i)
		}
	}
	tab.mu.Lock()
	defer tab.mu.Unlock()
	require.LessOrEqual(t, cap(tab.mu.free), 8192)
	require.Equal(t, 4000, tab.mu.live)
}

func TestGrowAcrossChunks(t *testing.T) {
	tab := NewTable[int](0)
	n := 3<<chunkBits + 5
	es := make([]*Entry[int], n)
	for i := range es {
		es[i] = newValid(t, tab, uint32(i%3), uint64(i), 1, AccessRemoteRead, i)
	}
	for i, e := range es {
		got, r := tab.Lookup(uint32(i%3), e.STag, AccessRemoteRead)
		require.Equal(t, OK, r)
		require.Equal(t, i, got.Value)
	}
}

func TestLookupAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	tab := NewTable[int](0)
	e := newValid(t, tab, 1, 0, 4096, AccessRemoteWrite, 0)
	bad := Make(e.STag.Index(), e.STag.Key()+1)
	require.Zero(t, testing.AllocsPerRun(100, func() {
		_, _ = tab.Lookup(1, e.STag, AccessRemoteWrite)
		_, _ = tab.Lookup(1, bad, AccessRemoteWrite)
		if x, r := tab.Acquire(1, e.STag, AccessRemoteWrite); r == OK {
			_ = x.CheckRange(0, 4096)
			x.Release()
		}
	}))
}
