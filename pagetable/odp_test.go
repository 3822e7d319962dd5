package pagetable_test

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/pagetable"
)

const ps = pagetable.PageSize

func newAS(t testing.TB, size int64) *hostmem.AddressSpace {
	t.Helper()
	as, err := hostmem.NewAddressSpace(hostmem.Config{Size: size})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, as.Close()) })
	return as
}

func newODP(t testing.TB, as *hostmem.AddressSpace, pages int, b *pagetable.Budget) ([]byte, *pagetable.ODP) {
	t.Helper()
	mem, err := as.Alloc(pages * ps)
	require.NoError(t, err)
	// Cleanups run last first: the table goes, then the memory (if the
	// test has not freed it), so that benchmarks run many times over one
	// address space.
	t.Cleanup(func() { _ = as.Free(hostmem.AddrOf(mem), len(mem)) })
	tab, err := pagetable.NewODP(as, hostmem.AddrOf(mem), uint64(len(mem)), true, b)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tab.Release() })
	return mem, tab
}

func TestODPStartsNotPresentAndFaultsOnce(t *testing.T) {
	as := newAS(t, 16<<20)
	mem, tab := newODP(t, as, 4, nil)
	base := hostmem.AddrOf(mem)
	src := bytes.Repeat([]byte{0xab}, 2*ps)
	// Not present: nothing is copied, not even the bytes of the first
	// page.
	n, r := tab.CopyIn(base+100, src)
	require.Equal(t, pagetable.NotPresent, r)
	require.Zero(t, n)
	require.Equal(t, make([]byte, 4*ps), mem)
	require.Equal(t, 0, tab.Present())

	made, err := tab.Fault(base+100, uint64(len(src)), pagetable.FaultWrite)
	require.NoError(t, err)
	require.Equal(t, 3, made, "bytes 100..8291 span pages 0-2")
	n, r = tab.CopyIn(base+100, src)
	require.Equal(t, pagetable.OK, r)
	require.Equal(t, len(src), n)
	require.Equal(t, src, mem[100:100+len(src)])
	made, err = tab.Fault(base, 4*ps, pagetable.FaultWrite)
	require.NoError(t, err)
	require.Equal(t, 1, made, "only page 3 was missing")
	st := tab.Stats()
	require.EqualValues(t, 4, st.PageFaults)
	require.EqualValues(t, 4, st.PageFaultsHandled)

	// Read-faulted pages are not writable until a write fault.
	mem2, tab2 := newODP(t, as, 1, nil)
	_, err = tab2.Fault(hostmem.AddrOf(mem2), 8, 0)
	require.NoError(t, err)
	_, r = tab2.CopyIn(hostmem.AddrOf(mem2), []byte{1})
	require.Equal(t, pagetable.OK, r, "a writable host page is mapped writable even on a read fault")

	// Out of range.
	_, r = tab.CopyIn(base+4*ps-1, []byte{1, 2})
	require.Equal(t, pagetable.OutOfRange, r)
	_, err = tab.Fault(base+4*ps, 1, 0)
	require.ErrorIs(t, err, pagetable.ErrFault)
}

func TestODPFaultErrors(t *testing.T) {
	as := newAS(t, 16<<20)
	mem, tab := newODP(t, as, 2, nil)
	base := hostmem.AddrOf(mem)
	require.NoError(t, as.Protect(base, ps, false))
	_, err := tab.Fault(base, 8, pagetable.FaultWrite)
	require.ErrorIs(t, err, pagetable.ErrFault)
	require.ErrorIs(t, err, hostmem.ErrReadOnly)
	require.NoError(t, as.Free(base+ps, ps))
	_, err = tab.Fault(base+ps, 8, 0)
	require.ErrorIs(t, err, hostmem.ErrNotMapped)
	require.False(t, tab.Resolvable(base+ps, 8, false))
	require.True(t, tab.Resolvable(base, 8, false))
	require.False(t, tab.Resolvable(base, 8, true))

	// A region without LOCAL_WRITE refuses write faults.
	mem3, err := as.Alloc(ps)
	require.NoError(t, err)
	ro, err := pagetable.NewODP(as, hostmem.AddrOf(mem3), ps, false, nil)
	require.NoError(t, err)
	defer ro.Release()
	_, err = ro.Fault(hostmem.AddrOf(mem3), 8, pagetable.FaultWrite)
	require.ErrorIs(t, err, pagetable.ErrFault)
	_, err = ro.Fault(hostmem.AddrOf(mem3), 8, 0)
	require.NoError(t, err)
	_, r := ro.CopyIn(hostmem.AddrOf(mem3), []byte{1})
	require.Equal(t, pagetable.NoPermission, r)

	// Outside the address space.
	_, err = pagetable.NewODP(as, 4096, 4096, true, nil)
	require.Error(t, err)
}

// TestODPInvalidationWaitsForCopies: copies keep running while the pages
// are migrated over and over; once a migration's invalidation returned,
// the old frames never change again, and every copy lands in the frames
// the application sees.
func TestODPInvalidationWaitsForCopies(t *testing.T) {
	as := newAS(t, 16<<20)
	const pages = 4
	mem, tab := newODP(t, as, pages, nil)
	base := hostmem.AddrOf(mem)
	var stop atomic.Bool
	var copies atomic.Int64
	var wg sync.WaitGroup
	var last atomic.Uint32
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, pages*ps)
			for i := uint32(1); !stop.Load(); i++ {
				v := byte(i*2 + uint32(w))
				for k := range buf {
					buf[k] = v
				}
				for {
					_, r := tab.CopyIn(base, buf)
					if r == pagetable.OK {
						break
					}
					if _, err := tab.Fault(base, uint64(len(buf)), pagetable.FaultWrite); err != nil {
						t.Error(err)
						return
					}
				}
				last.Store(uint32(v))
				copies.Add(1)
			}
		}()
	}
	for range 200 {
		m, err := as.Migrate(base, pages)
		require.NoError(t, err)
		old := make([][]byte, pages)
		for i, f := range m.Old {
			old[i] = bytes.Clone(as.FrameBytes(f))
		}
		c0 := copies.Load()
		for copies.Load() < c0+2 {
		}
		for i, f := range m.Old {
			require.Equal(t, old[i], as.FrameBytes(f), "a byte landed in an invalidated frame")
		}
		m.Release()
	}
	stop.Store(true)
	wg.Wait()
	st := tab.Stats()
	require.Equal(t, st.PageInvalidations, st.PageInvalidationsHandled)
	require.Positive(t, st.PageInvalidations)
	// With both writers stopped, the application sees whole pages from
	// copies (each page holds one writer's value).
	for p := range pages {
		pg := mem[p*ps : (p+1)*ps]
		require.Equal(t, bytes.Repeat(pg[:1], ps), pg)
	}
}

// TestBudgetClock: the budget never lets more pages be present than its
// limit, and the clock spares a page used since the last sweep.
func TestBudgetClock(t *testing.T) {
	as := newAS(t, 16<<20)
	b := pagetable.NewBudget(pagetable.MinBudgetPages * ps)
	require.EqualValues(t, pagetable.MinBudgetPages, b.Limit())
	mem, tab := newODP(t, as, 64, b)
	base := hostmem.AddrOf(mem)
	fault := func(p int) {
		t.Helper()
		_, err := tab.Fault(base+uint64(p)*ps, 1, pagetable.FaultWrite)
		require.NoError(t, err)
	}
	present := func(p int) bool {
		_, r := tab.CopyOut(base+uint64(p)*ps, make([]byte, 1))
		return r == pagetable.OK
	}
	for p := range pagetable.MinBudgetPages {
		fault(p)
	}
	require.EqualValues(t, pagetable.MinBudgetPages, b.Present())
	// One more: the first sweep clears every Accessed bit, the second
	// takes the oldest page.
	fault(16)
	require.False(t, tab.PresentAt(base+0*ps), "page 0 was the oldest")
	require.EqualValues(t, 1, b.Evictions())
	// Use page 1 (CopyOut sets its Accessed bit); the next eviction
	// passes it over and takes page 2.
	require.True(t, present(1))
	fault(17)
	require.True(t, tab.PresentAt(base+1*ps), "a page used since the last sweep is spared")
	require.False(t, tab.PresentAt(base+2*ps))
	for p := 18; p < 64; p++ {
		fault(p)
		require.LessOrEqual(t, b.Present(), b.Limit())
	}
	require.EqualValues(t, 64-pagetable.MinBudgetPages, b.Evictions())
	require.EqualValues(t, pagetable.MinBudgetPages, b.Peak())
	require.Equal(t, pagetable.MinBudgetPages, tab.Present())
	require.EqualValues(t, 64-pagetable.MinBudgetPages, tab.Stats().Evictions)
	require.NoError(t, tab.Release())
	require.Zero(t, b.Present())
	require.Error(t, tab.Release())
}

func TestImplicitODPGrowsLazily(t *testing.T) {
	as := newAS(t, 4<<30) // 4 children of 1 GiB
	tab, err := pagetable.NewImplicit(as, true, nil)
	require.NoError(t, err)
	defer tab.Release()
	require.Equal(t, 0, tab.Children())
	bnd := as.Bounds()
	mem, err := as.AllocAt(bnd.Start+(2<<30)+5*ps, ps)
	require.NoError(t, err)
	addr := hostmem.AddrOf(mem)
	_, r := tab.CopyIn(addr, []byte{7})
	require.Equal(t, pagetable.NotPresent, r)
	_, err = tab.Fault(addr, 1, pagetable.FaultWrite)
	require.NoError(t, err)
	require.Equal(t, 1, tab.Children(), "only the child holding the page is built")
	_, r = tab.CopyIn(addr, []byte{7})
	require.Equal(t, pagetable.OK, r)
	require.Equal(t, byte(7), mem[0])
	// Outside the address space: no child, no fault.
	_, err = tab.Fault(bnd.End, 1, 0)
	require.True(t, errors.Is(err, pagetable.ErrFault))
	_, r = tab.CopyIn(bnd.Start-ps, []byte{1})
	require.Equal(t, pagetable.OutOfRange, r)
}

func TestODPCopyAllocatesNothing(t *testing.T) {
	if pagetable.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	as := newAS(t, 16<<20)
	mem, tab := newODP(t, as, 4, nil)
	base := hostmem.AddrOf(mem)
	_, err := tab.Fault(base, 4*ps, pagetable.FaultWrite)
	require.NoError(t, err)
	buf := make([]byte, 2*ps)
	require.Zero(t, testing.AllocsPerRun(100, func() {
		tab.CopyIn(base+10, buf)
		tab.CopyOut(base+10, buf)
	}))
}
