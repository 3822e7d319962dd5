package pagetable_test

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/internal/pagemap"
	"github.com/softrdma/softrdma/pagetable"
)

// odpCommitted is an ODP remap's state at the end of its critical section:
// 3 pages faulted in, migrated with every page copied, the invalidation
// open for every subscription but the table's, the mirror built (not
// started).
func odpCommitted(t *testing.T) (*hostmem.AddressSpace, []byte, *pagetable.ODP, *hostmem.Migration, *pagetable.ODPMirror) {
	t.Helper()
	as := newAS(t, 16<<20)
	mem, tab := newODP(t, as, 3, nil)
	base := hostmem.AddrOf(mem)
	_, err := tab.Fault(base, uint64(len(mem)), pagetable.FaultWrite)
	require.NoError(t, err)
	m, err := as.PrepareMigrate(base, 3)
	require.NoError(t, err)
	mir, err := tab.NewMirror(base, m.New)
	require.NoError(t, err)
	require.NoError(t, m.CommitCopyKeeping(nil, tab.Subscription()))
	return as, mem, tab, m, mir
}

// Between StartMirror and the view switch every write lands in the
// application's view (the old frames) and in the new frames; the table's
// entries stay present (the invalidation left them out), so no write
// faults. After SwitchMirrored the view maps the new frames, which hold
// everything, and the mirror has ended.
func TestODPMirrorWritesBothUntilSwitch(t *testing.T) {
	as, mem, tab, m, mir := odpCommitted(t)
	base := hostmem.AddrOf(mem)
	require.NoError(t, tab.StartMirror(mir))
	require.ErrorContains(t, tab.StartMirror(mir), "already")

	msg := []byte("across the boundary of pages 0 and 1, and 1 and 2: " + string(make([]byte, ps)))
	off := uint64(ps - 20)
	n, r := tab.CopyIn(base+off, msg)
	require.Equal(t, pagetable.OK, r, "present: the invalidation did not clear the table")
	require.Equal(t, len(msg), n)
	require.Equal(t, msg, mem[off:off+uint64(len(msg))], "the view (old frames)")
	newBytes := func() []byte {
		var b []byte
		for _, f := range m.New {
			b = append(b, as.FrameBytes(f)...)
		}
		return b
	}
	require.Equal(t, msg, newBytes()[off:off+uint64(len(msg))], "the new frames")
	orig, r := tab.Atomic64(base+2*ps+64, func(p *uint64) uint64 { return atomic.AddUint64(p, 9) - 9 })
	require.Equal(t, pagetable.OK, r)
	require.Zero(t, orig)
	require.EqualValues(t, 9, *(*uint64)(unsafePointer(as.FrameBytes(m.New[2])[64:])), "the atomic's result in the new word")

	require.NoError(t, tab.SwitchMirrored(m.SwitchView))
	f, ok := as.FrameOf(base)
	require.True(t, ok)
	require.Equal(t, m.New[0], f, "the view maps the new frames")
	require.Equal(t, msg, mem[off:off+uint64(len(msg))])
	m.Release()
	// No mirror any more: a write reaches the view alone, and a new
	// mirror may start.
	_, r = tab.CopyIn(base, []byte("after"))
	require.Equal(t, pagetable.OK, r)
	require.Equal(t, "after", string(mem[:5]))
}

// A view switch that fails ends the mirror all the same and returns its
// error; the writes after it reach the view (old frames) only.
func TestODPMirrorSwitchFails(t *testing.T) {
	as, mem, tab, m, mir := odpCommitted(t)
	base := hostmem.AddrOf(mem)
	require.NoError(t, tab.StartMirror(mir))
	errSwitch := errors.New("mmap failed")
	require.ErrorIs(t, tab.SwitchMirrored(func() error { return errSwitch }), errSwitch)
	_, r := tab.CopyIn(base, []byte("kept"))
	require.Equal(t, pagetable.OK, r)
	require.NotEqual(t, "kept", string(as.FrameBytes(m.New[0])[:4]), "the ended mirror wrote the new frame")
	require.NoError(t, m.SwitchView()) // release the address space's lock
	m.Release()
}

// Mirrored atomics that race the view switch are all counted, in the view
// after it: SwitchMirrored holds them off while the view switches, so no
// atomic's result is copied from the old word over a newer one.
func TestODPMirrorAtomicsRaceTheSwitch(t *testing.T) {
	_, mem, tab, m, mir := odpCommitted(t)
	base := hostmem.AddrOf(mem)
	require.NoError(t, tab.StartMirror(mir))
	const workers, each = 4, 2000
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range each {
				_, r := tab.Atomic64(base+ps, func(p *uint64) uint64 { return atomic.AddUint64(p, 1) - 1 })
				if r != pagetable.OK {
					panic(r)
				}
			}
		}()
	}
	close(start)
	require.NoError(t, tab.SwitchMirrored(m.SwitchView))
	wg.Wait()
	m.Release()
	require.EqualValues(t, workers*each, atomic.LoadUint64((*uint64)(unsafePointer(mem[ps:]))))
}

// A mirrored atomic that comes while the view switches waits for the
// switch to end (then runs on the new word alone): it can neither run on
// the old word after its last copy nor have its copy read the new word
// before its own result is there. (The wait is checked for 20 ms: the
// test cannot fail when the atomic waits, and fails when it does not,
// unless its goroutine is not scheduled for 20 ms.)
func TestODPMirrorAtomicWaitsForTheSwitch(t *testing.T) {
	_, mem, tab, m, mir := odpCommitted(t)
	base := hostmem.AddrOf(mem)
	require.NoError(t, tab.StartMirror(mir))
	done := make(chan struct{})
	ranDuring := false
	require.NoError(t, tab.SwitchMirrored(func() error {
		go func() {
			defer close(done)
			_, r := tab.Atomic64(base+ps, func(p *uint64) uint64 { return atomic.AddUint64(p, 1) - 1 })
			if r != pagetable.OK {
				panic(r)
			}
		}()
		select {
		case <-done:
			ranDuring = true
		case <-time.After(20 * time.Millisecond):
		}
		return m.SwitchView()
	}))
	<-done
	m.Release()
	require.False(t, ranDuring, "a mirrored atomic ran while the view switched")
	require.EqualValues(t, 1, atomic.LoadUint64((*uint64)(unsafePointer(mem[ps:]))))
}

func TestODPMirrorErrors(t *testing.T) {
	as := newAS(t, 16<<20)
	mem, tab := newODP(t, as, 2, nil)
	base := hostmem.AddrOf(mem)
	_, other := newODP(t, as, 2, nil)
	m, err := as.PrepareMigrate(base, 2)
	require.NoError(t, err)
	defer m.Abort()
	_, err = tab.NewMirror(base+1, m.New)
	require.Error(t, err, "unaligned")
	_, err = tab.NewMirror(base+ps, m.New)
	require.Error(t, err, "past the table's end")
	_, err = tab.NewMirror(base, nil)
	require.Error(t, err, "no frames")
	mir, err := tab.NewMirror(base, m.New)
	require.NoError(t, err)
	require.Error(t, other.StartMirror(mir), "another table's mirror")
	require.Error(t, other.StartMirror(nil))
	imp, err := pagetable.NewImplicit(as, true, nil)
	require.NoError(t, err)
	defer func() { _ = imp.Release() }()
	_, err = imp.NewMirror(base, m.New)
	require.Error(t, err, "implicit table")
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

// TestODPMirrorCatchesAWriteTheViewSwitchOvertook: a write has put its
// bytes in the application's view (the old frames) when SwitchMirrored
// switches the view and ends the mirror; the rest of the write must still
// copy them into the new frames, which the view now maps. A write that
// looks at the mirror only after its view copy finds it ended and leaves
// its bytes in the old frames alone: lost when they are given back.
func TestODPMirrorCatchesAWriteTheViewSwitchOvertook(t *testing.T) {
	_, mem, tab, m, mir := odpCommitted(t)
	base := hostmem.AddrOf(mem)
	require.NoError(t, tab.StartMirror(mir))
	msg := []byte("in the old frames when the view switched")
	off := uint64(ps + 100)
	inView, release := make(chan struct{}), make(chan struct{})
	wrote := make(chan bool, 1)
	go func() {
		wrote <- tab.CopyInHeld(base+off, msg, func() {
			close(inView)
			<-release
		})
	}()
	<-inView
	switched := make(chan error, 1)
	go func() { switched <- tab.SwitchMirrored(m.SwitchView) }()
	for tab.Mirroring() {
		runtime.Gosched() // until the view has switched and the mirror ended
	}
	close(release)
	require.True(t, <-wrote)
	require.NoError(t, <-switched)
	m.Release()
	require.Equal(t, string(msg), string(mem[off:off+uint64(len(msg))]), "the new frames (the view) have the write")
}

// A fault that resolved a page's old frame before a remap's switch and
// installs it after (the remap leaves the table out of its invalidation,
// so the sequence count does not tell) sees that the host's page map moved
// on and resolves again: the entry gets the new frame, and a write after
// the old frames went back lands in the new one, which the application's
// view maps.
func TestODPFaultRacingTheSwitchResolvesAgain(t *testing.T) {
	as := newAS(t, 16<<20)
	mem, tab := newODP(t, as, 2, nil)
	base := hostmem.AddrOf(mem)
	copy(mem, "old bytes")
	m, err := as.PrepareMigrate(base, 2)
	require.NoError(t, err)
	for i := range 2 {
		m.CopyPage(i)
	}
	mir, err := tab.NewMirror(base, m.New)
	require.NoError(t, err)
	require.NoError(t, m.CommitCopyKeeping(nil, tab.Subscription()))
	require.NoError(t, tab.StartMirror(mir))
	switched := 0
	tab.SetResolvedHook(func() {
		if switched++; switched == 1 {
			require.NoError(t, tab.SwitchMirrored(m.SwitchView))
		}
	})
	_, err = tab.Fault(base, 2*ps, pagetable.FaultWrite)
	require.NoError(t, err)
	tab.SetResolvedHook(nil)
	require.Equal(t, 2, switched, "the fault resolved again after the switch")
	m.Release()

	msg := []byte("written after the switch")
	n, r := tab.CopyIn(base+ps+10, msg)
	require.Equal(t, pagetable.OK, r)
	require.Equal(t, len(msg), n)
	require.Equal(t, msg, as.FrameBytes(m.New[1])[10:10+len(msg)], "the new frame")
	require.Equal(t, msg, mem[ps+10:ps+10+len(msg)], "the application's view")
	require.Equal(t, "old bytes", string(mem[:9]))
}

// The table's copies go through the NIC's view of the frames, as a NIC
// writes physical pages: a page the application never touched gets the
// bytes without the application's view gaining a page-table entry
// (/proc/self/pagemap), and the application reads them afterwards.
func TestODPCopiesLeaveTheApplicationsPageTablesAlone(t *testing.T) {
	as := newAS(t, 16<<20)
	mem, tab := newODP(t, as, 2, nil)
	base := hostmem.AddrOf(mem)
	_, err := tab.Fault(base, 2*ps, pagetable.FaultWrite)
	require.NoError(t, err)
	msg := []byte("from the wire")
	_, r := tab.CopyIn(base+ps+5, msg)
	require.Equal(t, pagetable.OK, r)
	out := make([]byte, len(msg))
	_, r = tab.CopyOut(base+ps+5, out)
	require.Equal(t, pagetable.OK, r)
	require.Equal(t, msg, out)
	require.False(t, appMapped(t, base+ps), "the NIC's copy did not map the application's page")
	require.Equal(t, msg, mem[ps+5:ps+5+len(msg)], "the application reads the bytes")
	require.True(t, appMapped(t, base+ps), "its own read did")
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

// The host's lock is free again when the view switch returns, before
// SwitchMirrored points the entries at the new frames: a change of the
// range by the host (the application's Free or Migrate, waiting for the
// lock since Commit) and a fault of the pages it maps may run in between.
// The switch then must not point the entries the fault made present at
// the remap's new frames, which the change gave back (to the free frames,
// or to the migration pool, which hands them to the next migration): a
// write after it reaches the application's memory, not a frame it no
// longer has.
func TestODPSwitchMirroredAfterTheHostMovedOn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, as *hostmem.AddressSpace, base uint64, n int)
	}{
		{"free and map again", func(t *testing.T, as *hostmem.AddressSpace, base uint64, n int) {
			require.NoError(t, as.Free(base, n*ps))
			_, err := as.AllocAt(base, n*ps)
			require.NoError(t, err)
		}},
		{"migrate", func(t *testing.T, as *hostmem.AddressSpace, base uint64, n int) {
			m2, err := as.Migrate(base, n)
			require.NoError(t, err)
			m2.Release()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			as, mem, tab, m, mir := odpCommitted(t)
			base := hostmem.AddrOf(mem)
			require.NoError(t, tab.StartMirror(mir))
			require.NoError(t, tab.SwitchMirrored(func() error {
				if err := m.SwitchView(); err != nil {
					return err
				}
				tc.change(t, as, base, 3)
				_, err := tab.Fault(base, 3*ps, pagetable.FaultWrite)
				require.NoError(t, err)
				return nil
			}))
			m.Release()
			for i := range 3 {
				f, ok := as.FrameOf(base + uint64(i)*ps)
				require.True(t, ok)
				require.NotContains(t, m.New, f, "precondition: the address has other frames now")
			}
			mem2 := unsafe.Slice((*byte)(as.AppPointer(base)), 3*ps)
			msg := []byte("after the host's change")
			for i := range 3 {
				_, r := tab.CopyIn(base+uint64(i)*ps+7, msg)
				require.Equal(t, pagetable.OK, r)
				require.Equal(t, msg, mem2[i*ps+7:i*ps+7+len(msg)], "page %d: the application's memory has the write", i)
			}
		})
	}
}
