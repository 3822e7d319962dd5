package stag

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
)

type obj struct {
	id    int
	freed atomic.Bool // set after Drain, before Free
}

// TestConcurrentLookupWhileRegistering runs lock-free lookups and acquires
// against registrations, invalidations and frees (run it with -race). A
// reader that holds a reference must never see its object torn down.
func TestConcurrentLookupWhileRegistering(t *testing.T) {
	tab := NewTable[*obj](0)
	const slots = 64
	var keys [slots]atomic.Uint32 // latest STag per slot, readers pick from here
	var stop atomic.Bool
	var bad atomic.Int64
	var hits atomic.Int64

	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func(seed int) {
			defer wg.Done()
			for i := seed; !stop.Load(); i++ {
				key := STag(keys[i%slots].Load())
				e, reason := tab.Acquire(1, key, AccessRemoteWrite)
				if reason != OK {
					continue
				}
				if e.STag != key || e.Value.freed.Load() || e.Value.id != int(key) {
					bad.Add(1)
				}
				hits.Add(1)
				e.Release()
			}
		}(r)
	}

	rounds := 300
	if raceEnabled {
		rounds = 50
	}
	for round := 0; round < rounds; round++ {
		for s := 0; s < slots; s++ {
			if old := STag(keys[s].Load()); old != 0 {
				e := tab.Get(old)
				require.NotNil(t, e)
				require.NoError(t, tab.Invalidate(old))
				e.Drain()
				e.Value.freed.Store(true)
				require.NoError(t, tab.Free(old))
			}
			o := &obj{}
			e, err := tab.Alloc(1, 0, 1, AccessRemoteWrite, o)
			require.NoError(t, err)
			o.id = int(e.STag)
			require.NoError(t, tab.Validate(e.STag))
			keys[s].Store(uint32(e.STag))
		}
	}
	stop.Store(true)
	wg.Wait()
	require.Zero(t, bad.Load())
	t.Logf("%d successful acquires", hits.Load())
}

// TestDrainWaitsForReferences: Drain returns only after the last Release.
func TestDrainWaitsForReferences(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := NewTable[int](0)
		e := newValid(t, tab, 1, 0, 8, AccessRemoteRead, 0)
		a, r := tab.Acquire(1, e.STag, AccessRemoteRead)
		require.Equal(t, OK, r)
		b, r := tab.Acquire(1, e.STag, AccessRemoteRead)
		require.Equal(t, OK, r)
		require.EqualValues(t, 2, e.Refs())

		require.NoError(t, tab.Invalidate(e.STag))
		done := make(chan struct{})
		go func() { e.Drain(); close(done) }()

		synctest.Wait()
		requireOpen(t, done)
		a.Release()
		synctest.Wait()
		requireOpen(t, done)
		// A late acquirer fails and does not complete the drain early.
		_, r = tab.Acquire(1, e.STag, AccessRemoteRead)
		require.Equal(t, Invalid, r)
		synctest.Wait()
		requireOpen(t, done)
		b.Release()
		<-done
		require.Zero(t, e.Refs())
	})
}

func requireOpen(t *testing.T, c chan struct{}) {
	t.Helper()
	select {
	case <-c:
		t.Fatal("Drain returned while references were held")
	default:
	}
}

func BenchmarkLookup(b *testing.B) {
	tab := NewTable[int](0)
	var keys []STag
	for i := 0; i < 4096; i++ {
		e, _ := tab.Alloc(1, 0, 4096, AccessRemoteWrite, i)
		_ = tab.Validate(e.STag)
		keys = append(keys, e.STag)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, r := tab.Lookup(1, keys[i&4095], AccessRemoteWrite); r != OK {
			b.Fatal(r)
		}
		i += 17
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	tab := NewTable[int](0)
	e, _ := tab.Alloc(1, 0, 4096, AccessRemoteWrite, 0)
	_ = tab.Validate(e.STag)
	b.ReportAllocs()
	for b.Loop() {
		x, _ := tab.Acquire(1, e.STag, AccessRemoteWrite)
		x.Release()
	}
}

// TestSuspendRefusesWritesOnEveryPath: a suspended entry refuses every new
// access that writes memory, on the fast paths as on the slow ones (Open,
// Acquire, Lookup, LookupRange; linear or not), and serves those that only
// read.
func TestSuspendRefusesWritesOnEveryPath(t *testing.T) {
	for _, linear := range []bool{false, true} {
		tab := NewTable[*obj](0)
		mem := make([]byte, 4096)
		e, err := tab.Alloc(1, 0x10000, 4096, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead, &obj{})
		require.NoError(t, err)
		require.NoError(t, tab.Validate(e.STag))
		if linear {
			require.NoError(t, tab.SetLinear(e.STag, &mem[0], true))
		}
		require.NoError(t, tab.Suspend(e.STag))
		for _, need := range []Access{AccessRemoteWrite, AccessLocalWrite} {
			var sp Span[*obj]
			require.Equal(t, Suspended, tab.Open(&sp, 1, e.STag, need, 0x10000, 8), "Open, linear %v", linear)
			_, r := tab.Acquire(1, e.STag, need)
			require.Equal(t, Suspended, r, "Acquire %v, linear %v", need, linear)
			_, r = tab.Lookup(1, e.STag, need)
			require.Equal(t, Suspended, r, "Lookup %v, linear %v", need, linear)
			_, _, r = tab.LookupRange(1, e.STag, need, 0x10000, 8)
			require.Equal(t, Suspended, r, "LookupRange %v, linear %v", need, linear)
		}
		ent, r := tab.Acquire(1, e.STag, AccessRemoteRead)
		require.Equal(t, OK, r)
		ent.Release()
		_, r = tab.Lookup(1, e.STag, 0)
		require.Equal(t, OK, r)
		require.NoError(t, tab.Resume(e.STag))
		ent, r = tab.Acquire(1, e.STag, AccessRemoteWrite)
		require.Equal(t, OK, r)
		ent.Release()
	}
}
