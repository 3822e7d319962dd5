package pagetable_test

import (
	"bytes"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/pagetable"
)

// pinnedFrames registers 3 pages of a fresh address space, 100 bytes into
// the first page (so page 0's frame pointer carries the head offset), as a
// remappable pinned table, and prepares the migration of its pages with
// every page pre-copied and tracking on: the state a remap's critical
// section starts from.
func pinnedFrames(t *testing.T) (*hostmem.AddressSpace, []byte, *pagetable.Table, *hostmem.Migration) {
	t.Helper()
	as := newAS(t, 16<<20)
	buf, err := as.Alloc(3 * ps)
	require.NoError(t, err)
	mem := buf[100:]
	tab, err := pagetable.NewPinnedFrames(as, hostmem.NewPinAccount(1<<30), mem, true)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tab.Release()) })
	tab.StartTracking()
	m, err := tab.FramePin().PrepareMigrate()
	require.NoError(t, err)
	t.Cleanup(m.Abort) // the new frames go back (the tests switch no view)
	for i := range m.Pages() {
		m.CopyPage(i)
	}
	return as, mem, tab, m
}

// From StartMirror to SwitchFrames every write lands in the old frame (what
// the application's view still maps) and the new one; after SwitchFrames
// in the new one only. The bytes span the page boundaries, so the mirror's
// page split and page 0's head offset are both exercised.
func TestMirrorWritesBothFramesUntilSwitch(t *testing.T) {
	as, mem, tab, m := pinnedFrames(t)
	iova := hostmem.AddrOf(mem)
	mir, err := tab.NewMirror(m.New)
	require.NoError(t, err)
	require.NoError(t, tab.StartMirror(mir))

	src := bytes.Repeat([]byte("mirror"), 1000) // 6000 bytes: pages 0, 1 and 2
	off := uint64(ps - 100 - 50)                // 50 bytes before page 1
	n, r := tab.CopyIn(iova+off, src)
	require.Equal(t, pagetable.OK, r)
	require.Equal(t, len(src), n)
	require.Equal(t, src, mem[off:off+uint64(len(src))], "the application's view (old frames)")
	oldB := frameBytes(as, m.Old)
	newB := frameBytes(as, m.New)
	require.Equal(t, oldB, newB, "old and new frames hold the same bytes")
	require.Equal(t, src, newB[100+off:100+off+uint64(len(src))])

	// An atomic adds on both words; the result is the original value.
	word := (iova + off + 7) &^ 7 // 8-byte aligned, as IBTA requires
	orig, r := tab.AtomicWord(word, func(w *uint64) uint64 { return atomic.AddUint64(w, 5) - 5 })
	require.Equal(t, pagetable.OK, r)
	require.Equal(t, frameBytes(as, m.Old), frameBytes(as, m.New), "the atomic's result is in both frames")
	require.NotEqual(t, orig, *wordAt(frameBytes(as, m.New), 100+word-iova))
	require.Equal(t, orig+5, *wordAt(frameBytes(as, m.New), 100+word-iova))

	require.NoError(t, tab.SwitchFrames(m.New))
	before := frameBytes(as, m.Old)
	n, r = tab.CopyIn(iova, []byte("after the switch"))
	require.Equal(t, pagetable.OK, r)
	require.Equal(t, 16, n)
	require.Equal(t, before, frameBytes(as, m.Old), "no write reaches the old frames after the switch")
	require.Equal(t, "after the switch", string(frameBytes(as, m.New)[100:116]))
}

func TestMirrorErrors(t *testing.T) {
	_, _, tab, m := pinnedFrames(t)
	_, err := tab.NewMirror(m.New[:1])
	require.ErrorContains(t, err, "1 frames for 3 pages")
	mir, err := tab.NewMirror(m.New)
	require.NoError(t, err)
	_, _, other, m2 := pinnedFrames(t)
	require.ErrorContains(t, other.StartMirror(mir), "another table")
	other.StopTracking()
	mir2, err := other.NewMirror(m2.New)
	require.NoError(t, err)
	require.ErrorContains(t, other.StartMirror(mir2), "without dirty tracking")

	// StopTracking abandons the mirror: writes reach the old frames only.
	require.NoError(t, tab.StartMirror(mir))
	tab.StopTracking()
	as := tab.FramePin().AddressSpace()
	before := frameBytes(as, m.New)
	_, r := tab.CopyIn(tab.IOVA(), []byte("old only"))
	require.Equal(t, pagetable.OK, r)
	require.Equal(t, before, frameBytes(as, m.New))
	require.Equal(t, "old only", string(frameBytes(as, m.Old)[100:108]))
}

// The mirror costs no allocation per copy.
func TestMirrorCopyAllocatesNothing(t *testing.T) {
	if pagetable.RaceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	_, mem, tab, m := pinnedFrames(t)
	mir, err := tab.NewMirror(m.New)
	require.NoError(t, err)
	require.NoError(t, tab.StartMirror(mir))
	src := make([]byte, 6000)
	iova := hostmem.AddrOf(mem)
	_, r := tab.AtomicWord((iova+800)&^7, func(w *uint64) uint64 { return *w })
	require.Equal(t, pagetable.OK, r)
	allocs := testing.AllocsPerRun(100, func() {
		tab.CopyIn(iova+10, src)
		tab.AtomicWord((iova+800)&^7, func(w *uint64) uint64 { return atomic.AddUint64(w, 1) - 1 })
	})
	require.Zero(t, allocs)
}

func frameBytes(as *hostmem.AddressSpace, frames []hostmem.Frame) []byte {
	var out []byte
	for _, f := range frames {
		out = append(out, as.FrameBytes(f)...)
	}
	return out
}

func wordAt(b []byte, off uint64) *uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[off+uint64(i)])
	}
	return &v
}

// An atomic that loaded the mirror and its (old) word before SwitchFrames,
// and runs after it, must not copy the old word over the new one, which an
// atomic that found no mirror may have changed: it runs on the new word.
func TestMirroredAtomicAfterSwitchRunsOnTheNewWord(t *testing.T) {
	_, mem, tab, m := pinnedFrames(t)
	mir, err := tab.NewMirror(m.New)
	require.NoError(t, err)
	require.NoError(t, tab.StartMirror(mir))
	iova := (hostmem.AddrOf(mem) + 7) &^ 7
	old, r := tab.Word64(iova, true)
	require.Equal(t, pagetable.OK, r)
	require.NoError(t, tab.SwitchFrames(m.New))
	neu, r := tab.Word64(iova, true)
	require.Equal(t, pagetable.OK, r)
	require.NotSame(t, old, neu)
	*old, *neu = 7, 100 // another atomic already ran on the new word
	add := func(w *uint64) uint64 { return atomic.AddUint64(w, 1) - 1 }
	orig, r := tab.MirrorWord64(mir, iova, add)
	require.Equal(t, pagetable.OK, r)
	require.EqualValues(t, 100, orig)
	require.EqualValues(t, 101, *neu)
	require.EqualValues(t, 7, *old, "the old word is not touched")
}

// Two atomics on one word meet SwitchFrames between its two steps (the
// entries point at the new frames, the mirror has not ended): one finds
// the new word, the other had found the old word before the switch. Both
// are mirrored, so they are serialized; each must see the other's result,
// and the new word must end with both. Running the second on the old word
// it found and copying that over the new word loses the first.
func TestMirroredAtomicsAcrossTheFrameSwitchSeeEachOther(t *testing.T) {
	as, mem, tab, m := pinnedFrames(t)
	mir, err := tab.NewMirror(m.New)
	require.NoError(t, err)
	require.NoError(t, tab.StartMirror(mir))
	iova := (hostmem.AddrOf(mem) + 7) &^ 7
	add := func(w *uint64) uint64 { return atomic.AddUint64(w, 1) - 1 }
	orig0, r := tab.AtomicWord(iova, add) // mirrored: both words
	require.Equal(t, pagetable.OK, r)
	var a, b uint64
	require.NoError(t, tab.SwitchFramesHeld(m.New, func() {
		var r pagetable.Result
		a, r = tab.AtomicWord(iova, add) // finds the new word
		require.Equal(t, pagetable.OK, r)
		// The one in flight: it found the mirror (and the old word)
		// before the switch.
		b, r = tab.MirrorWord64(mir, iova, add)
		require.Equal(t, pagetable.OK, r)
	}))
	require.Equal(t, []uint64{orig0 + 1, orig0 + 2}, []uint64{min(a, b), max(a, b)}, "each atomic saw the other's result")
	require.Equal(t, orig0+3, *wordAt(frameBytes(as, m.New), 100+iova-hostmem.AddrOf(mem)), "the new word has all three")
}
