package placement_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

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
	testRemapWritesDuringTheViewSwitch(t, false)
}

// TestRemapODPWritesDuringTheViewSwitch is the same for an explicit ODP
// MR, whose entries keep the old frames until the switch: the remap's
// invalidation leaves the table out, Commit starts its mirror, and the
// view switches in Finish. It fails if the mirror does not copy the
// WRITE or the atomic into the new frames.
func TestRemapODPWritesDuringTheViewSwitch(t *testing.T) {
	testRemapWritesDuringTheViewSwitch(t, true)
}

func testRemapWritesDuringTheViewSwitch(t *testing.T, odp bool) {
	as, err := hostmem.NewAddressSpace(hostmem.Config{Size: 16 << 20})
	require.NoError(t, err)
	e := placement.New(placement.Config{AddressSpace: as})
	buf, err := as.Alloc(3 * 4096)
	require.NoError(t, err)
	access := all
	if odp {
		access |= stag.AccessOnDemand
	}
	mr, err := e.RegMR(pd1, buf, access)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, e.DeregMR(mr))
		require.NoError(t, as.Free(hostmem.AddrOf(buf), len(buf)))
		require.NoError(t, as.Close())
	})
	// An ODP MR's pages fault in at their first use, as the transport
	// does it (FaultCursor, FaultRemote), and the operation runs again.
	write := func(off uint64, b []byte) {
		t.Helper()
		var c placement.Cursor
		require.Equal(t, placement.OK, e.Begin(&c, pd1, mr.RKey(), mr.Addr()+off, uint64(len(b)), stag.AccessRemoteWrite))
		st := e.Write(&c, b)
		if st == placement.WouldFault && odp {
			require.Equal(t, placement.OK, e.FaultCursor(&c, uint64(len(b))))
			st = e.Write(&c, b)
		}
		require.Equal(t, placement.OK, st)
		e.End(&c)
	}
	atomic := func(off, add uint64) uint64 {
		t.Helper()
		orig, st := e.Atomic(pd1, mr.RKey(), mr.Addr()+off, placement.FetchAdd, add, 0)
		if st == placement.WouldFault && odp {
			require.Equal(t, placement.OK, e.FaultRemote(pd1, mr.RKey(), mr.Addr()+off, 8, true))
			orig, st = e.Atomic(pd1, mr.RKey(), mr.Addr()+off, placement.FetchAdd, add, 0)
		}
		require.Equal(t, placement.OK, st)
		return orig
	}
	word := func(off uint64) uint64 { return atomic(off, 0) }
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
		require.Equal(t, n, atomic(2*4096, 5))

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

// TestRemapPinnedTracksAWriteThatStartedBeforeTracking: a WRITE whose
// packet reaches a pinned MR's table after PrepareRemap has withdrawn the
// linear mapping and waited for the copies in flight, but before dirty
// tracking starts, takes the table's direct path (CopyIn finds the table
// direct) and sets no Dirty bit; if its bytes land after the pre-copy
// copied the page, Commit does not copy the page again and the WRITE is
// lost when the view switches. Tracking must start before the wait, so
// that the wait covers every copy that may have missed it.
func TestRemapPinnedTracksAWriteThatStartedBeforeTracking(t *testing.T) {
	as, err := hostmem.NewAddressSpace(hostmem.Config{Size: 16 << 20})
	require.NoError(t, err)
	e := placement.New(placement.Config{AddressSpace: as})
	buf, err := as.Alloc(4 * 4096)
	require.NoError(t, err)
	mr, err := e.RegMR(pd1, buf, all)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, e.DeregMR(mr))
		require.NoError(t, as.Free(hostmem.AddrOf(buf), len(buf)))
		require.NoError(t, as.Close())
	})
	msg := []byte("placed across the start of the remap's tracking")
	const off = 2*4096 + 100
	var c placement.Cursor
	var held []byte // the NIC-side bytes of a copy past its direct check
	undo := placement.SetRemapDrainedHook(func(m *placement.MR) {
		// A packet arrives now: its WRITE begins (the linear mapping
		// is gone, so it goes through the table), and its copy gets
		// past the table's check.
		require.Equal(t, placement.OK, e.Begin(&c, pd1, mr.RKey(), mr.Addr()+off, uint64(len(msg)), stag.AccessRemoteWrite))
		held = m.DirectBytes()
	})
	r, err := e.PrepareRemap(mr)
	undo()
	require.NoError(t, err)
	// The copy lands after the pre-copy.
	if held != nil {
		copy(held[off:], msg)
	} else {
		require.Equal(t, placement.OK, e.Write(&c, msg))
	}
	e.End(&c)
	require.Equal(t, msg, buf[off:off+len(msg)], "the application's view (old frames) has it")
	require.NoError(t, e.SuspendMR(mr))
	require.NoError(t, r.Commit())
	require.NoError(t, e.ResumeMR(mr))
	require.NoError(t, r.Finish())
	r.Release()
	require.Equal(t, string(msg), string(buf[off:off+len(msg)]), "the WRITE is in the new frames")
}

// TestDeregMRRefusedDuringARemap: a pinned MR deregistered between the
// remap's Commit and its Finish (traffic resumed, the view not yet
// switched) must not release the table and the pin that the remap is
// moving: DeregMR refuses (ErrRemapInProgress, EBUSY, as ReregMR) and
// leaves the MR registered; once the remap is over it deregisters and
// releases the new frames' pin. Before the remap's exclusion, DeregMR
// unpinned the old frames at once, Finish met a table without its pin (a
// nil dereference), and Release would have unpinned the old frames a
// second time while the new ones stayed pinned. (DeregMR waited for the
// remap to end, for ever if its Release or Abort never came:
// TestDeregMRDuringAbandonedRemap. Device.DeregMR waits for Device.Remap,
// which always ends its remap.)
func TestDeregMRRefusedDuringARemap(t *testing.T) {
	as, err := hostmem.NewAddressSpace(hostmem.Config{Size: 16 << 20})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, as.Close()) })
	e := placement.New(placement.Config{AddressSpace: as})
	buf, err := as.Alloc(4 * 4096)
	require.NoError(t, err)
	mr, err := e.RegMR(pd1, buf, all)
	require.NoError(t, err)
	r, err := e.PrepareRemap(mr)
	require.NoError(t, err)
	_, err = e.PrepareRemap(mr)
	require.ErrorIs(t, err, placement.ErrBusy, "one remap of an MR at a time")
	require.NoError(t, e.SuspendMR(mr))
	require.NoError(t, r.Commit())
	require.NoError(t, e.ResumeMR(mr))
	require.ErrorIs(t, e.DeregMR(mr), placement.ErrRemapInProgress)
	require.NotPanics(t, func() {
		assert.NoError(t, r.Finish())
		r.Release()
	})
	require.NoError(t, e.DeregMR(mr))
	require.Zero(t, e.PinnedBytes(), "the pin (on the new frames) is released")
	require.NoError(t, as.Free(hostmem.AddrOf(buf), len(buf)))
}

// TestRemapODPUnalignedMRRecopiesDirtyPages: an ODP MR that does not start
// on a page boundary; a WRITE placed after the pre-copy marks its page
// dirty, and Commit must copy that page again. Asking the table for the
// dirty pages from the MR's first page boundary (below the MR's address)
// found none, and the WRITE was lost at the view switch.
func TestRemapODPUnalignedMRRecopiesDirtyPages(t *testing.T) {
	as, err := hostmem.NewAddressSpace(hostmem.Config{Size: 16 << 20})
	require.NoError(t, err)
	e := placement.New(placement.Config{AddressSpace: as})
	all, err := as.Alloc(3 * 4096)
	require.NoError(t, err)
	buf := all[100:]
	mr, err := e.RegMR(pd1, buf, rw|stag.AccessOnDemand)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, e.DeregMR(mr))
		require.NoError(t, as.Free(hostmem.AddrOf(all), len(all)))
		require.NoError(t, as.Close())
	})
	msg := []byte("placed during the pre-copy")
	off := uint64(4096 + 50)
	write := func() { t.Helper(); placeFaulting(t, e, mr, off, msg) }
	r, err := e.PrepareRemap(mr)
	require.NoError(t, err)
	write() // after the pre-copy: its page is dirty
	require.NoError(t, e.SuspendMR(mr))
	require.NoError(t, r.Commit())
	require.NoError(t, e.ResumeMR(mr))
	require.NoError(t, r.Finish())
	r.Release()
	require.Equal(t, string(msg), string(buf[off:off+uint64(len(msg))]), "the new frames have the WRITE")
	require.Equal(t, 1, r.Recopied, "the written page is copied again")
}

// TestDeregMRDuringAbandonedRemap: DeregMR of an MR whose remap was
// prepared and never released nor aborted returns ErrBusy (EBUSY, as
// ReregMR does) naming the remap, instead of waiting for ever; after the
// Abort it deregisters.
func TestDeregMRDuringAbandonedRemap(t *testing.T) {
	as, err := hostmem.NewAddressSpace(hostmem.Config{Size: 16 << 20})
	require.NoError(t, err)
	e := placement.New(placement.Config{AddressSpace: as})
	buf, err := as.Alloc(2 * 4096)
	require.NoError(t, err)
	mr, err := e.RegMR(pd1, buf, rw)
	require.NoError(t, err)
	r, err := e.PrepareRemap(mr)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.DeregMR(mr) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, placement.ErrBusy)
		require.ErrorIs(t, err, unix.EBUSY)
		require.ErrorIs(t, err, placement.ErrRemapInProgress)
	case <-ctx.Done():
		t.Fatal("DeregMR blocked on a remap that is never finished")
	}
	require.Equal(t, placement.OK, write(e, pd1, 0, mr.RKey(), mr.Addr(), []byte{7}), "the MR is still registered")
	r.Abort()
	require.NoError(t, e.DeregMR(mr))
	require.NoError(t, as.Free(hostmem.AddrOf(buf), len(buf)))
	require.NoError(t, as.Close())
}

// TestRemapODPCommitWhoseMirrorCannotStart: Commit of an ODP MR whose
// table refuses the remap's mirror (one is started already, which cannot
// happen with one remap of an MR at a time) switches the view inside the
// pause instead. The table, which the invalidation left out, must not go
// on writing the old frames its entries name once Release has given them
// back: a WRITE after the remap reaches the application's memory.
func TestRemapODPCommitWhoseMirrorCannotStart(t *testing.T) {
	as, e, buf, mr := newODPEngine(t, 2)
	other, err := as.Alloc(2 * 4096)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, as.Free(hostmem.AddrOf(other), len(other))) })
	write := func(off uint64, msg []byte) { t.Helper(); placeFaulting(t, e, mr, off, msg) }
	write(0, make([]byte, len(buf))) // both pages present
	old, ok := as.FrameOf(hostmem.AddrOf(buf))
	require.True(t, ok)

	r, err := e.PrepareRemap(mr)
	require.NoError(t, err)
	// A mirror the remap did not start, onto other's frames.
	tab := mr.ODPTable()
	var frames []hostmem.Frame
	for i := range 2 {
		f, ok := as.FrameOf(hostmem.AddrOf(other) + uint64(i)*4096)
		require.True(t, ok)
		frames = append(frames, f)
	}
	foreign, err := tab.NewMirror(hostmem.AddrOf(buf), frames)
	require.NoError(t, err)
	require.NoError(t, tab.StartMirror(foreign))
	require.NoError(t, e.SuspendMR(mr))
	require.NoError(t, r.Commit())
	require.NoError(t, e.ResumeMR(mr))
	require.NoError(t, r.Finish())
	r.Release()
	// End the foreign mirror without touching the entries.
	require.Error(t, tab.SwitchMirrored(func() error { return errors.New("no switch") }))
	now, ok := as.FrameOf(hostmem.AddrOf(buf))
	require.True(t, ok)
	require.NotEqual(t, old, now, "the pages moved")

	msg := []byte("after the remap")
	for i := range 2 {
		write(uint64(i)*4096+9, msg)
		require.Equal(t, msg, buf[i*4096+9:i*4096+9+len(msg)], "page %d: the application's memory has the WRITE", i)
	}
}
