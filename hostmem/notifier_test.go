package hostmem

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestReadRetrySeesInvalidation: a fault that resolved a page before a Free
// finds ReadRetry true and must not install what it resolved.
func TestReadRetrySeesInvalidation(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	sub, err := s.Subscribe(addr, PageSize, NotifierFunc(func(*Subscription, Invalidation) {}))
	require.NoError(t, err)
	defer sub.Unsubscribe()

	seq := sub.ReadBegin()
	pg, err := s.Resolve(addr, ResolveWrite)
	require.NoError(t, err)
	require.False(t, sub.ReadRetry(seq))
	require.NoError(t, s.Free(addr, PageSize))
	_, err = s.AllocAt(addr, PageSize)
	require.NoError(t, err)
	require.True(t, sub.ReadRetry(seq), "the frame resolved is stale")
	seq = sub.ReadBegin()
	pg2, err := s.Resolve(addr, ResolveWrite)
	require.NoError(t, err)
	require.NotEqual(t, pg.Frame, pg2.Frame)
	require.False(t, sub.ReadRetry(seq))
}

// TestReadBeginWaitsForInvalidation: ReadBegin does not return while an
// invalidation of the range runs, and a subscription made during one
// starts odd.
func TestReadBeginWaitsForInvalidation(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(2 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	var returned atomic.Bool
	var late *Subscription
	done := make(chan uint64)
	var sub *Subscription
	sub, err = s.Subscribe(addr, 2*PageSize, NotifierFunc(func(sub *Subscription, inv Invalidation) {
		go func() {
			seq := sub.ReadBegin()
			returned.Store(true)
			done <- seq
		}()
		var err error
		late, err = s.Subscribe(addr+PageSize, PageSize, NotifierFunc(func(*Subscription, Invalidation) {
			panic("a subscription made during an invalidation is not called")
		}))
		if err != nil {
			panic(err)
		}
		time.Sleep(20 * time.Millisecond)
		if returned.Load() {
			panic("ReadBegin returned during the invalidation")
		}
	}))
	require.NoError(t, err)
	require.NoError(t, s.Free(addr, 2*PageSize))
	require.EqualValues(t, 2, <-done)
	require.EqualValues(t, 2, late.ReadBegin(), "joined the invalidation: odd, then even")
	sub.Unsubscribe()
	late.Unsubscribe()
}

// TestUnsubscribeWaitsForCallbacks: no callback runs after Unsubscribe
// returns.
func TestUnsubscribeWaitsForCallbacks(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	entered := make(chan struct{})
	release := make(chan struct{})
	var finished atomic.Bool
	sub, err := s.Subscribe(addr, PageSize, NotifierFunc(func(*Subscription, Invalidation) {
		close(entered)
		<-release
		finished.Store(true)
	}))
	require.NoError(t, err)
	freed := make(chan error)
	go func() { freed <- s.Free(addr, PageSize) }()
	<-entered
	unsubscribed := make(chan struct{})
	go func() {
		sub.Unsubscribe()
		if !finished.Load() {
			panic("Unsubscribe returned while the callback ran")
		}
		close(unsubscribed)
	}()
	time.Sleep(10 * time.Millisecond)
	close(release)
	<-unsubscribed
	require.NoError(t, <-freed)
}

// odpTable models the ODP translation table of one MR over an
// AddressSpace: entries installed by faults (check, fault, re-check) and
// cleared by invalidations, copies in flight under a read lock that
// invalidation waits for.
type odpTable struct {
	as  *AddressSpace
	sub *Subscription
	mu  sync.RWMutex       // write: install, invalidate; read: a copy in flight
	ent map[uint64]Frame   // page address -> frame; guarded by mu
	gen map[Frame]struct{} // frames installed since the last check; guarded by mu

	faults, retries, invalidations atomic.Int64
}

func (t *odpTable) Invalidate(_ *Subscription, inv Invalidation) {
	t.mu.Lock() // waits for copies in flight
	for a := inv.Range.Start; a < inv.Range.End; a += PageSize {
		delete(t.ent, a)
	}
	t.mu.Unlock()
	t.invalidations.Add(1)
}

// fault is the fault handler: the read side of the protocol.
func (t *odpTable) fault(addr uint64) error {
	t.faults.Add(1)
	for {
		seq := t.sub.ReadBegin()
		pg, err := t.as.Resolve(addr, ResolveWrite)
		if err != nil {
			return err
		}
		runtime.Gosched() // widen the window an invalidation can hit
		t.mu.Lock()
		if t.sub.ReadRetry(seq) {
			t.mu.Unlock()
			t.retries.Add(1)
			continue
		}
		t.ent[addr] = pg.Frame
		t.mu.Unlock()
		return nil
	}
}

// write is a placement: the NIC writes a word into the page at addr,
// faulting it in first if needed. It returns false if the page is not
// mapped.
func (t *odpTable) write(addr uint64, off int, v uint64) bool {
	for {
		t.mu.RLock()
		f, ok := t.ent[addr]
		if ok {
			p := (*uint64)(unsafe.Add(t.as.FramePointer(f), off))
			atomic.StoreUint64(p, v)
			t.mu.RUnlock()
			return true
		}
		t.mu.RUnlock() // leave the in-flight section before faulting
		if err := t.fault(addr); err != nil {
			if errors.Is(err, ErrNotMapped) {
				return false
			}
			panic(err)
		}
	}
}

// TestFaultRacingInvalidationNeverInstallsStaleFrames runs NIC writers
// that fault pages in against a mutator that frees, reallocates and
// migrates the same pages. After every change, with no invalidation
// running, every entry the table holds must be the page's current frame,
// and an old frame of a migration must not have been written after the
// switch.
func TestFaultRacingInvalidationNeverInstallsStaleFrames(t *testing.T) {
	s := newSpace(t, testSpace)
	const pages = 8
	b, err := s.Alloc(pages * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	tab := &odpTable{as: s, ent: map[uint64]Frame{}}
	tab.sub, err = s.Subscribe(addr, pages*PageSize, tab)
	require.NoError(t, err)
	defer tab.sub.Unsubscribe()

	iters := 1500
	if testing.Short() || raceEnabled {
		iters = 500
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var writes atomic.Int64
	for w := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for n := uint64(1); !stop.Load(); n++ {
				pg := addr + uint64(rng.IntN(pages))<<PageShift
				if tab.write(pg, 8*w, n) {
					writes.Add(1)
				}
				if n%64 == 0 {
					runtime.Gosched() // let the mutator run on a small machine
				}
			}
		})
	}

	check := func(i int) {
		tab.mu.Lock()
		defer tab.mu.Unlock()
		for a, f := range tab.ent {
			cur, ok := s.FrameOf(a)
			require.True(t, ok, "iteration %d: page %#x in the table but not mapped", i, a)
			require.Equal(t, cur, f, "iteration %d: page %#x: stale frame in the table", i, a)
		}
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range iters {
		k := rng.IntN(pages)
		n := 1 + rng.IntN(pages-k)
		a := addr + uint64(k)<<PageShift
		switch i % 3 {
		case 0, 1:
			require.NoError(t, s.Free(a, n*PageSize))
			check(i)
			runtime.Gosched()
			_, err := s.AllocAt(a, n*PageSize)
			require.NoError(t, err)
		case 2:
			m, err := s.PrepareMigrate(a, n)
			require.NoError(t, err)
			snap := make([][]byte, n)
			require.NoError(t, m.Commit(func(m *Migration) error {
				// Invalidated: no write is in flight and none can start
				// on the range until the switch, so this is the old
				// frames' final content.
				for j, f := range m.Old {
					m.CopyPage(j)
					snap[j] = append([]byte(nil), s.FrameBytes(f)...)
				}
				return nil
			}))
			check(i)
			for range 3 {
				runtime.Gosched()
			}
			for j, f := range m.Old {
				require.True(t, bytes.Equal(snap[j], s.FrameBytes(f)), "iteration %d: a write landed in an old frame", i)
			}
			m.Release()
		}
		check(i)
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d writes, %d faults, %d retries, %d invalidations", writes.Load(), tab.faults.Load(),
		tab.retries.Load(), tab.invalidations.Load())
	require.Positive(t, writes.Load())
	require.Positive(t, tab.invalidations.Load())
}

// resources counts the mappings and file descriptors of the process.
func resources(t *testing.T) (maps, memfdMaps, fds int) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	for line := range strings.Lines(string(b)) {
		maps++
		if strings.Contains(line, "memfd:softrdma-as") {
			memfdMaps++
		}
	}
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return maps, memfdMaps, len(ents)
}

// TestNoLeaks checks that an address space put through everything it
// does gives back every mapping and file descriptor.
func TestNoLeaks(t *testing.T) {
	type span struct{ lo, hi uintptr }
	var views []span // every address space's views, unmapped by Close
	workout := func() {
		s, err := NewAddressSpace(Config{Size: 64 << 20})
		require.NoError(t, err)
		views = append(views, span{uintptr(s.appBase), uintptr(s.appBase) + s.size},
			span{uintptr(s.nicBase), uintptr(s.nicBase) + s.size})
		var rec recorder
		sub, err := s.Subscribe(0, 1<<63, &rec)
		require.NoError(t, err)
		acct := NewPinAccount(0)
		var kept [][]byte
		for i := range 20 {
			b, err := s.Alloc((i%5 + 1) * PageSize)
			require.NoError(t, err)
			fill(b, byte(i))
			kept = append(kept, b)
		}
		for i, b := range kept {
			addr := AddrOf(b)
			switch i % 4 {
			case 0:
				m, err := s.Migrate(addr, len(b)/PageSize)
				require.NoError(t, err)
				m.Release()
			case 1:
				fp, err := s.Pin(acct, addr, len(b), true)
				require.NoError(t, err)
				require.NoError(t, s.Free(addr, len(b)))
				require.NoError(t, fp.Unpin())
				continue
			case 2:
				require.NoError(t, s.Protect(addr, len(b), false))
			}
			out := make([]Page, len(b)/PageSize)
			_, err = s.ResolveRange(addr, out, 0)
			require.NoError(t, err)
			require.NoError(t, s.Free(addr, len(b)))
		}
		_, memfdMaps, _ := resources(t)
		require.NotZero(t, memfdMaps)
		require.Zero(t, s.Stats().MappedPages)
		require.Zero(t, s.Stats().FramesInUse)
		sub.Unsubscribe()
		require.NoError(t, s.Close())
	}
	workout() // warm up the runtime's own file descriptors
	runtime.GC()
	_, _, fds0 := resources(t)
	workout()
	runtime.GC()
	_, memfdMaps1, fds1 := resources(t)
	require.Equal(t, fds0, fds1, "file descriptors")
	require.Zero(t, memfdMaps1, "memfd mappings")
	// No mapping is left in any view of the closed address spaces. (The
	// process's mapping count is no measure: the Go runtime and the race
	// detector map memory of their own at any time; CI once saw 76
	// mappings become 80.)
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	for line := range strings.Lines(string(b)) {
		var lo, hi uintptr
		_, err := fmt.Sscanf(line, "%x-%x", &lo, &hi)
		require.NoError(t, err, line)
		for _, v := range views {
			require.False(t, lo < v.hi && v.lo < hi, "a mapping left in a closed address space's view [%#x, %#x): %s", v.lo, v.hi, line)
		}
	}
}

// TestFreedFramesReadZero: a frame handed out again reads zeros (its
// memory was punched out when it was released).
func TestFreedFramesReadZero(t *testing.T) {
	s := newSpace(t, 16<<20) // 4096 frames: fewer than the quarantine
	b, err := s.Alloc(16 << 20)
	require.NoError(t, err)
	for i := 0; i < len(b); i += PageSize {
		binary.LittleEndian.PutUint64(b[i:], 0xdeadbeef)
	}
	addr := AddrOf(b)
	old := frames(t, s, addr, 4)
	require.NoError(t, s.Free(addr, 4*PageSize))
	b2, err := s.AllocAt(addr, 4*PageSize) // all frames in use: reuses the freed ones
	require.NoError(t, err)
	require.ElementsMatch(t, old, frames(t, s, addr, 4))
	require.Equal(t, make([]byte, 4*PageSize), b2)
}

// TestInvalidateRunsBeforeTheChange: ODP tables copy through the
// application's view, so every change to it must come after the
// invalidation (which waits for the copies in flight). The callback here
// writes through the application's view, as a copy still in flight when
// the invalidation starts does: the write must find the view still mapped
// and writable (else the test crashes with SIGSEGV), and a migration must
// carry it to the new frame (else it was lost in the old one).
func TestInvalidateRunsBeforeTheChange(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(2 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	fill(b, 1)
	var seen []string
	sub, err := s.Subscribe(addr, 2*PageSize, NotifierFunc(func(_ *Subscription, inv Invalidation) {
		f, ok := s.FrameOf(inv.Range.Start)
		require.True(t, ok, "the page map still has the page")
		atomic.StoreUint64((*uint64)(s.AppPointer(inv.Range.Start+8)), 0xc0ffee+uint64(inv.Event))
		require.Equal(t, 0xc0ffee+uint64(inv.Event), binary.LittleEndian.Uint64(s.FrameBytes(f)[8:]),
			"the application's view still maps the old frame")
		seen = append(seen, inv.Event.String()+" "+perms(t, inv.Range.Start))
	}))
	require.NoError(t, err)
	defer sub.Unsubscribe()

	m, err := s.Migrate(addr, 1)
	require.NoError(t, err)
	want := 0xc0ffee + uint64(EventMigrate)
	require.Equal(t, want, binary.LittleEndian.Uint64(s.FrameBytes(m.New[0])[8:]),
		"a write made when the invalidation started was copied to the new frame")
	require.Equal(t, want, binary.LittleEndian.Uint64(b[8:]))
	m.Release()

	require.NoError(t, s.Protect(addr, PageSize, false))
	require.Equal(t, 0xc0ffee+uint64(EventProtect), binary.LittleEndian.Uint64(b[8:]))
	require.NoError(t, s.Protect(addr, PageSize, true)) // gives access back: no invalidation
	require.NoError(t, s.Free(addr, 2*PageSize))
	require.Equal(t, []string{"migrate rw-s", "protect rw-s", "unmap rw-s"}, seen)
	require.Equal(t, "---p", perms(t, addr), "unmapped after the invalidation")
}

// TestCommitCopyKeepingLeavesOneSubscriptionOut: the invalidation of
// CommitCopyKeeping reaches every subscription of the range but the one
// kept: the kept one's count stays even (a fault resolves at once) and its
// Invalidate is not called; the other turns odd until SwitchView, and is
// told. CommitCopy (nothing kept) reaches both.
func TestCommitCopyKeepingLeavesOneSubscriptionOut(t *testing.T) {
	s := newSpace(t, testSpace)
	b, err := s.Alloc(2 * PageSize)
	require.NoError(t, err)
	addr := AddrOf(b)
	var kept, other recorder
	subKept, err := s.Subscribe(addr, 2*PageSize, &kept)
	require.NoError(t, err)
	defer subKept.Unsubscribe()
	subOther, err := s.Subscribe(addr+PageSize, PageSize, &other)
	require.NoError(t, err)
	defer subOther.Unsubscribe()

	for _, keep := range []*Subscription{subKept, nil} {
		m, err := s.PrepareMigrate(addr, 2)
		require.NoError(t, err)
		seqKept, seqOther := subKept.seq.Load(), subOther.seq.Load()
		require.NoError(t, m.CommitCopyKeeping(nil, keep))
		if keep != nil {
			require.Equal(t, seqKept, subKept.seq.Load(), "the kept subscription stays even")
			require.Equal(t, seqKept, subKept.ReadBegin(), "a fault of the kept range does not wait")
			invs, _ := kept.take()
			require.Empty(t, invs, "the kept subscription is not told")
		} else {
			require.Equal(t, seqKept+1, subKept.seq.Load())
			invs, _ := kept.take()
			require.Len(t, invs, 1)
		}
		require.Equal(t, seqOther+1, subOther.seq.Load(), "the other subscription is invalidated")
		invs, _ := other.take()
		require.Len(t, invs, 1)
		require.Equal(t, EventMigrate, invs[0].Event)
		require.NoError(t, m.SwitchView())
		require.Zero(t, subOther.seq.Load()&1, "even again after the switch")
		m.Release()
	}
}
