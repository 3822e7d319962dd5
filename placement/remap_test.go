package placement_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
)

// A pinned MR's remap, step by step as Device.Remap runs it: between the
// resume and Finish the NIC writes old and new frames, so the application,
// whose view still maps the old frames, sees a WRITE and an atomic placed
// then, and still sees them once Finish has switched its view. An Abort
// after Commit finishes the remap instead of leaving the address space
// locked: a third remap runs.
func TestRemapPinnedWritesDuringTheViewSwitch(t *testing.T) {
	as, err := hostmem.NewAddressSpace(hostmem.Config{Size: 16 << 20})
	require.NoError(t, err)
	e := placement.New(placement.Config{AddressSpace: as})
	buf, err := as.Alloc(3 * 4096)
	require.NoError(t, err)
	mr, err := e.RegMR(pd1, buf, all)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, e.DeregMR(mr))
		require.NoError(t, as.Free(hostmem.AddrOf(buf), len(buf)))
		require.NoError(t, as.Close())
	})
	write := func(off uint64, b []byte) {
		t.Helper()
		var c placement.Cursor
		require.Equal(t, placement.OK, e.Begin(&c, pd1, mr.RKey(), mr.Addr()+off, uint64(len(b)), stag.AccessRemoteWrite))
		require.Equal(t, placement.OK, e.Write(&c, b))
		e.End(&c)
	}
	word := func(off uint64) uint64 {
		orig, st := e.Atomic(pd1, mr.RKey(), mr.Addr()+off, placement.FetchAdd, 0, 0)
		require.Equal(t, placement.OK, st)
		return orig
	}
	before, ok := as.FrameOf(hostmem.AddrOf(buf))
	require.True(t, ok)

	for round, abort := range []bool{false, true, false} {
		r, err := e.PrepareRemap(mr)
		require.NoError(t, err)
		require.NoError(t, e.SuspendMR(mr))
		require.NoError(t, r.Commit())
		require.NoError(t, e.ResumeMR(mr))

		// Placed after the resume, before the view switch: across the
		// boundary of pages 0 and 1, and an atomic in page 2.
		msg := []byte("written while the view switches, round " + string(rune('0'+round)))
		write(4096-10, msg)
		require.Equal(t, msg, buf[4096-10:4096-10+len(msg)], "the application's view (old frames) has it")
		n := word(2 * 4096)
		orig, st := e.Atomic(pd1, mr.RKey(), mr.Addr()+2*4096, placement.FetchAdd, 5, 0)
		require.Equal(t, placement.OK, st)
		require.Equal(t, n, orig)

		if abort {
			r.Abort()
		} else {
			require.NoError(t, r.Finish())
			r.Release()
		}
		now, ok := as.FrameOf(hostmem.AddrOf(buf))
		require.True(t, ok)
		require.NotEqual(t, before, now, "round %d: the pages moved", round)
		before = now
		require.Equal(t, msg, buf[4096-10:4096-10+len(msg)], "round %d: the new frames have it", round)
		require.Equal(t, n+5, word(2*4096), "round %d: the atomic's result is in the new frame", round)
		// After the switch the writes go to the new frames only, and
		// the application sees them.
		write(100, []byte("after"))
		require.Equal(t, "after", string(buf[100:105]))
	}
}
