package stag

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestOpenReasons has one row per outcome of Open, which makes the checks
// of Lookup and then the bounds check, and one per outcome of LookupRange.
func TestOpenReasons(t *testing.T) {
	tab := NewTable[int](0)
	rw := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead
	mem := make([]byte, 0x2000)
	base := uint64(uintptr(unsafe.Pointer(&mem[0])))
	e := newValid(t, tab, 7, base, 0x2000, rw, 42)
	require.NoError(t, tab.SetLinear(e.STag, &mem[0], true))
	ro := newValid(t, tab, 7, base, 0x2000, AccessRemoteRead, 43)
	require.NoError(t, tab.SetLinear(ro.STag, &mem[0], false))
	walk := newValid(t, tab, 7, base, 0x2000, rw, 44) // no linear mapping
	inv, err := tab.Alloc(7, base, 0x2000, rw, 45)
	require.NoError(t, err)

	for _, tc := range []struct {
		name   string
		pd     uint32
		key    STag
		need   Access
		iova   uint64
		n      uint64
		want   Reason
		linear bool
	}{
		{"whole region, write", 7, e.STag, AccessRemoteWrite, base, 0x2000, OK, true},
		{"one byte at the end", 7, e.STag, AccessRemoteRead, base + 0x1fff, 1, OK, true},
		{"read-only region read", 7, ro.STag, AccessRemoteRead, base + 5, 10, OK, true},
		{"local read of a read-only region", 7, ro.STag, 0, base, 1, OK, true},
		{"no linear mapping: walk", 7, walk.STag, AccessRemoteWrite, base, 1, OK, false},
		// Failures, in the order of the checks.
		{"index 0", 7, Make(0, e.STag.Key()), 0, base, 1, NoEntry, false},
		{"index never allocated", 7, Make(MaxIndex, 1), 0, base, 1, NoEntry, false},
		{"stale key", 7, Make(e.STag.Index(), e.STag.Key()-1), 0, base, 1, KeyMismatch, false},
		{"other PD", 8, e.STag, 0, base, 1, PDMismatch, false},
		{"right not granted", 7, ro.STag, AccessRemoteWrite, base, 1, AccessDenied, false},
		{"not valid", 7, inv.STag, 0, base, 1, Invalid, false},
		{"one before", 7, e.STag, 0, base - 1, 1, OutOfBounds, false},
		{"one past", 7, e.STag, 0, base + 0x2000, 1, OutOfBounds, false},
		{"longer than the region", 7, e.STag, 0, base, 0x2001, OutOfBounds, false},
		{"length near 2^64", 7, e.STag, 0, base + 1, math.MaxUint64, OutOfBounds, false},
		{"iova near 2^64", 7, e.STag, 0, math.MaxUint64, 1, OutOfBounds, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, got, r := tab.LookupRange(tc.pd, tc.key, tc.need, tc.iova, tc.n)
			require.Equal(t, tc.want, r, "LookupRange")
			var sp Span[int]
			require.Equal(t, tc.want, tab.Open(&sp, tc.pd, tc.key, tc.need, tc.iova, tc.n), "Open")
			if tc.want != OK {
				require.Nil(t, b)
				require.Nil(t, got)
				require.Nil(t, sp.Entry, "a failed Open holds nothing")
				return
			}
			require.Equal(t, tc.linear, b != nil)
			require.Equal(t, tc.linear, sp.Linear())
			require.Same(t, got, sp.Entry)
			require.EqualValues(t, 1, sp.Entry.Refs(), "an unbound Span counts")
			if tc.linear {
				off := tc.iova - base
				require.Len(t, b, int(tc.n))
				require.Same(t, &mem[off], &b[0])
				require.Same(t, &mem[off], &sp.At(0, 1)[0])
			}
			require.Equal(t, tc.need&writeRights != 0, sp.Write)
			require.Equal(t, tc.n, sp.Len)
			require.True(t, sp.Current())
			sp.Close()
			require.Nil(t, sp.Entry)
			require.Zero(t, got.Refs())
		})
	}

	// A key whose chunk does not exist is read from the table's free slot
	// none, which nothing writes.
	require.Zero(t, tab.none.ctl.Load()|tab.none.keyPD.Load()|tab.none.length.Load())
	require.Nil(t, tab.none.entry.Load())

	// An empty range names no memory: no key is looked at.
	var sp Span[int]
	require.Equal(t, OK, tab.Open(&sp, 99, 0, AccessRemoteWrite, math.MaxUint64, 0))
	require.Nil(t, sp.Entry)
	require.PanicsWithValue(t, "stag: Open on a Span that holds an entry (missing Close)", func() {
		require.Equal(t, OK, tab.Open(&sp, 7, e.STag, 0, base, 1))
		tab.Open(&sp, 7, e.STag, 0, base, 1)
	})
	sp.Close()
	_, err = tab.Alloc(1, math.MaxUint64-10, 12, 0, 0)
	require.ErrorIs(t, err, ErrRange, "a range that wraps")
	_, err = tab.Alloc(1, math.MaxUint64-10, 11, 0, 0)
	require.NoError(t, err, "a range that ends at 2^64")
}

// TestSpanSeesChanges: a held Span stops being Current when its slot
// changes; Refresh says whether the entry is still valid and follows the
// linear mapping.
func TestSpanSeesChanges(t *testing.T) {
	tab := NewTable[int](0)
	mem := make([]byte, 4096)
	base := uint64(uintptr(unsafe.Pointer(&mem[0])))
	e := newValid(t, tab, 1, base, 4096, AccessLocalWrite|AccessRemoteWrite, 0)
	require.NoError(t, tab.SetLinear(e.STag, &mem[0], true))
	var sp Span[int]
	require.Equal(t, OK, tab.Open(&sp, 1, e.STag, AccessRemoteWrite, base+100, 200))
	require.True(t, sp.Linear())

	require.NoError(t, tab.ClearLinear(e.STag))
	require.False(t, sp.Current())
	require.True(t, sp.Refresh(), "still valid")
	require.False(t, sp.Linear(), "no longer mapped linearly: walk the table")
	require.True(t, sp.Current())
	require.NoError(t, tab.SetLinear(e.STag, &mem[0], true))
	require.False(t, sp.Current())
	require.True(t, sp.Refresh())
	require.Same(t, &mem[100], &sp.At(0, 1)[0])

	require.NoError(t, tab.Invalidate(e.STag))
	require.False(t, sp.Current())
	require.False(t, sp.Refresh(), "invalidated")
	sp.Close()
	e.Drain()
	require.NoError(t, tab.Free(e.STag))

	// A new registration of the same index is another entry.
	f := newValid(t, tab, 1, base, 4096, AccessRemoteWrite|AccessLocalWrite, 1)
	require.Equal(t, e.STag.Index(), f.STag.Index())
	require.Equal(t, OK, tab.Open(&sp, 1, f.STag, AccessRemoteWrite, base, 1))
	stale := sp
	sp.Close()
	require.NoError(t, tab.Invalidate(f.STag))
	require.NoError(t, tab.Free(f.STag))
	newValid(t, tab, 1, base, 4096, AccessRemoteWrite|AccessLocalWrite, 2)
	require.False(t, stale.Current())
	require.False(t, stale.Refresh(), "the slot holds another entry now")
}

// TestWritersBumpTheSequenceCount: every change of a slot leaves its count
// even and larger, so that a snapshot or a Span taken before it is
// recognised as stale by one compare.
func TestWritersBumpTheSequenceCount(t *testing.T) {
	tab := NewTable[int](0)
	mem := make([]byte, 64)
	e, err := tab.Alloc(1, 0, 64, AccessRemoteRead, 0)
	require.NoError(t, err)
	s := tab.slot(e.STag)
	last := s.ctl.Load()
	for _, op := range []struct {
		name string
		f    func() error
	}{
		{"SetLinear", func() error { return tab.SetLinear(e.STag, &mem[0], false) }},
		{"Validate", func() error { return tab.Validate(e.STag) }},
		{"ClearLinear", func() error { return tab.ClearLinear(e.STag) }},
		{"SetLinear again", func() error { return tab.SetLinear(e.STag, &mem[0], true) }},
		{"Invalidate", func() error { return tab.Invalidate(e.STag) }},
		{"Free", func() error { return tab.Free(e.STag) }},
	} {
		require.NoError(t, op.f(), op.name)
		c := s.ctl.Load()
		require.Zero(t, c&ctlSeqOne, "%s leaves the count even", op.name)
		require.Greater(t, c>>ctlSeqShift, last>>ctlSeqShift, "%s bumps the count", op.name)
		last = c
	}
	require.Zero(t, last&ctlFlagsMask, "a free slot grants nothing")
}

// TestReaderWaitsOutAWriter: while a writer changes a slot (odd count,
// rights and flags cleared) the fast paths fail by themselves, and the slow
// path waits until the writer is done and then sees its result.
func TestReaderWaitsOutAWriter(t *testing.T) {
	tab := NewTable[int](0)
	mem := make([]byte, 0x2000)
	e := newValid(t, tab, 1, 0x1000, 0x1000, AccessRemoteRead, 0)
	require.NoError(t, tab.SetLinear(e.STag, &mem[0], false))
	s := tab.slot(e.STag)

	tab.mu.Lock() // as a writer does
	seq := s.beginWrite()
	got := make(chan []byte)
	go func() {
		b, _, r := tab.LookupRange(1, e.STag, AccessRemoteRead, 0x1800, 1)
		if r != OK {
			b = nil
		}
		got <- b
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("a lookup returned while a writer was changing the slot")
	default:
	}
	// Move the range and the mapping, as a remap would.
	s.iova.Store(0x1800)
	s.linear.Store(&mem[0x1000])
	s.endWrite(seq, uint64(AccessRemoteRead)|ctlValid|ctlLinearRead)
	tab.mu.Unlock()
	b := <-got
	require.NotNil(t, b)
	require.Same(t, &mem[0x1000], &b[0], "the lookup saw the new contents, not a mix")
}

// TestSnapshotsAreNeverTorn re-registers one index over and over,
// alternating between two registrations that differ in every field (PD,
// rights, range, linear mapping), while readers look it up with the key and
// PD of the registration they last saw published. Every lookup that passes
// must describe one registration: a reader that mixed the key of one with
// the bounds or the mapping of the other would place bytes where no
// registration allows. Run it with -race, which also checks that every
// word is accessed atomically. (The window in which a writer could tear a
// fast-path snapshot is a few instructions wide, so a stress test rarely
// hits it; TestReaderWaitsOutAWriter and TestWritersBumpTheSequenceCount
// check the protocol's two halves deterministically.)
func TestSnapshotsAreNeverTorn(t *testing.T) {
	tab := NewTable[int](1) // one index, reused by every registration
	var bufs [2][]byte
	bufs[0], bufs[1] = make([]byte, 0x3000), make([]byte, 0x1000)
	type reg struct {
		pd     uint32
		access Access
		iova   uint64
		length uint64
		lin    *byte
	}
	regs := [2]reg{
		{1, AccessLocalWrite | AccessRemoteWrite, 0x10000, 0x3000, &bufs[0][0]},
		{2, AccessRemoteRead, 0x7f000, 0x1000, &bufs[1][0]},
	}
	var cur atomic.Uint64 // STag<<32 | generation
	var stop atomic.Bool
	var hits, bad atomic.Int64
	check := func(key STag, g int, e *Entry[int], b []byte, iova, n uint64) {
		rg := regs[e.Value%2]
		lin := unsafe.Pointer(rg.lin)
		switch {
		case e.STag != key, e.PD != rg.pd, e.IOVA != rg.iova, e.Length != rg.length,
			iova < e.IOVA, iova+n > e.IOVA+e.Length,
			b != nil && unsafe.Pointer(&b[0]) != unsafe.Add(lin, iova-e.IOVA),
			e.Value%2 != g%2:
			bad.Add(1)
		}
		hits.Add(1)
	}
	var wg sync.WaitGroup
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func(bound bool) {
			defer wg.Done()
			var sp Span[int]
			var rd *Reader
			if bound {
				rd = tab.NewReader()
				defer rd.Close()
				sp.Bind(rd)
			}
			for i := 0; !stop.Load(); i++ {
				c := cur.Load()
				key, g := STag(c>>32), int(uint32(c))
				rg := regs[g%2]
				need := AccessRemoteRead
				if rg.access&AccessRemoteWrite != 0 {
					need = AccessRemoteWrite
				}
				iova, n := rg.iova+uint64(i%int(rg.length)), uint64(1)
				if rd != nil {
					rd.Enter()
				}
				if b, e, r := tab.LookupRange(rg.pd, key, need, iova, n); r == OK {
					check(key, g, e, b, iova, n)
				}
				if tab.Open(&sp, rg.pd, key, need, iova, n) == OK {
					var b []byte
					if sp.Linear() {
						b = sp.At(0, n)
					}
					check(key, g, sp.Entry, b, iova, n)
					sp.Close()
				}
				if i%16 == 0 {
					if rd != nil {
						rd.Quiesce()
					}
					// Spinning readers would keep the writer (and the
					// grace periods it waits for) off the CPUs.
					runtime.Gosched()
				}
			}
		}(r == 2)
	}
	rounds := 3000
	if raceEnabled {
		rounds = 1000
	}
	var last *Entry[int]
	for g := 0; g < rounds; g++ {
		if last != nil {
			require.NoError(t, tab.Invalidate(last.STag))
			tab.Synchronize()
			last.Drain()
			require.NoError(t, tab.Free(last.STag))
		}
		rg := regs[g%2]
		e, err := tab.Alloc(rg.pd, rg.iova, rg.length, rg.access, g)
		require.NoError(t, err)
		require.NoError(t, tab.SetLinear(e.STag, rg.lin, rg.access&AccessLocalWrite != 0))
		require.NoError(t, tab.Validate(e.STag))
		cur.Store(uint64(e.STag)<<32 | uint64(g))
		last = e
		// Let the readers find this registration before it is replaced
		// (they keep looking while the next one is written).
		for h, spins := hits.Load(), 0; hits.Load() < h+2 && spins < 1000; spins++ {
			runtime.Gosched()
		}
	}
	stop.Store(true)
	wg.Wait()
	require.Zero(t, bad.Load(), "lookups that mixed two registrations")
	t.Logf("%d lookups passed", hits.Load())
}

// TestSynchronizeWaitsForOnlineReaders: a grace period ends when every
// reader that was online has quiesced; offline readers do not hold it up.
func TestSynchronizeWaitsForOnlineReaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := NewTable[int](0)
		e := newValid(t, tab, 1, 0, 100, AccessRemoteRead, 0)
		idle := tab.NewReader() // never used: offline
		defer idle.Close()
		busy := tab.NewReader()
		var sp Span[int]
		sp.Bind(busy)
		require.Equal(t, OK, tab.Open(&sp, 1, e.STag, AccessRemoteRead, 0, 10))
		require.Zero(t, e.Refs(), "a bound Span counts nothing")

		require.NoError(t, tab.Invalidate(e.STag))
		done := make(chan struct{})
		go func() {
			tab.Synchronize()
			close(done)
		}()
		synctest.Wait()
		requireOpen(t, done)
		// The reader is still online: what it found is still usable,
		// but it sees the change at its next check.
		require.False(t, sp.Current())
		sp.Close()
		synctest.Wait()
		requireOpen(t, done)
		busy.Quiesce()
		<-done

		// Quiescing an offline reader, and closing, do nothing more.
		busy.Quiesce()
		tab.Synchronize()
		busy.Close()
		tab.Synchronize()
	})
}

// TestQuiesceIfWaited: QuiesceIfWaited leaves an online reader online
// while no writer waits (what it found stays usable), and quiesces it
// when Synchronize waits for it, which ends the grace period; the Span it
// holds then refreshes (goes online again) before its next use.
func TestQuiesceIfWaited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := NewTable[int](0)
		e := newValid(t, tab, 1, 0, 100, AccessRemoteWrite|AccessLocalWrite, 0)
		rd := tab.NewReader()
		defer rd.Close()
		var sp Span[int]
		sp.Bind(rd)
		require.Equal(t, OK, tab.Open(&sp, 1, e.STag, AccessRemoteWrite, 0, 10))
		rd.QuiesceIfWaited()
		require.True(t, sp.Current(), "nobody waits: the reader stays online")

		done := make(chan struct{})
		go func() {
			tab.Synchronize()
			close(done)
		}()
		synctest.Wait()
		requireOpen(t, done)
		require.True(t, sp.Current(), "the slot did not change")
		rd.QuiesceIfWaited()
		<-done
		require.False(t, sp.Current(), "offline: the Span must refresh before its next use")
		require.True(t, sp.Refresh())
		require.True(t, sp.Current())
		sp.Close()
		rd.Quiesce()
	})
}

// TestReaderGoesOnlineBeforeItReads: a bound Span used after Quiesce puts
// its reader online again (Open, Refresh) before it reads a slot, so a
// writer that changed the slot meanwhile is either seen or waits.
func TestReaderGoesOnlineBeforeItReads(t *testing.T) {
	tab := NewTable[int](0)
	e := newValid(t, tab, 1, 0, 100, AccessRemoteRead, 0)
	rd := tab.NewReader()
	defer rd.Close()
	var sp Span[int]
	sp.Bind(rd)
	require.Equal(t, OK, tab.Open(&sp, 1, e.STag, AccessRemoteRead, 0, 10))
	require.True(t, rd.online)
	rd.Quiesce()
	require.False(t, rd.online)
	require.False(t, sp.Current(), "an offline reader is not current")
	require.True(t, sp.Refresh())
	require.True(t, rd.online)
	require.True(t, sp.Current())
	sp.Close()
	require.Panics(t, func() {
		require.Equal(t, OK, tab.Open(&sp, 1, e.STag, AccessRemoteRead, 0, 10))
		sp.Bind(nil)
	})
}

func TestSpanAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	tab := NewTable[int](0)
	mem := make([]byte, 4096)
	base := uint64(uintptr(unsafe.Pointer(&mem[0])))
	e := newValid(t, tab, 1, base, 4096, AccessLocalWrite|AccessRemoteWrite, 0)
	require.NoError(t, tab.SetLinear(e.STag, &mem[0], true))
	rd := tab.NewReader()
	defer rd.Close()
	var sp, bound Span[int]
	bound.Bind(rd)
	require.Zero(t, testing.AllocsPerRun(100, func() {
		_, _, _ = tab.LookupRange(1, e.STag, AccessRemoteWrite, base, 64)
		for _, s := range []*Span[int]{&sp, &bound} {
			if tab.Open(s, 1, e.STag, AccessRemoteWrite, base, 64) == OK {
				_ = s.Current()
				s.Close()
			}
		}
		rd.Quiesce()
	}))
}

func BenchmarkLookupRange(b *testing.B) {
	tab := NewTable[int](0)
	mem := make([]byte, 4096)
	base := uint64(uintptr(unsafe.Pointer(&mem[0])))
	e := newValid(b, tab, 1, base, 4096, AccessLocalWrite|AccessRemoteWrite, 0)
	_ = tab.SetLinear(e.STag, &mem[0], true)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, r := tab.LookupRange(1, e.STag, AccessRemoteWrite, base+100, 64); r != OK {
			b.Fatal(r)
		}
	}
}

// BenchmarkOpenClose is a message's reference: counted (unbound), or under
// a Reader that quiesces every 64 messages (bound).
func BenchmarkOpenClose(b *testing.B) {
	for _, bound := range []bool{false, true} {
		b.Run(map[bool]string{false: "unbound", true: "bound"}[bound], func(b *testing.B) {
			tab := NewTable[int](0)
			mem := make([]byte, 4096)
			base := uint64(uintptr(unsafe.Pointer(&mem[0])))
			e := newValid(b, tab, 1, base, 4096, AccessLocalWrite|AccessRemoteWrite, 0)
			_ = tab.SetLinear(e.STag, &mem[0], true)
			var sp Span[int]
			rd := tab.NewReader()
			defer rd.Close()
			if bound {
				sp.Bind(rd)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if tab.Open(&sp, 1, e.STag, AccessRemoteWrite, base+100, 64) != OK {
					b.Fatal()
				}
				sp.Close()
				if i++; i == 64 {
					rd.Quiesce()
					i = 0
				}
			}
		})
	}
}
