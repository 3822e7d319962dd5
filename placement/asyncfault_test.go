package placement_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
)

// TestAsyncFaultBusyIsReported: with every background fault slot taken,
// the rnr policy's fault of a WRITE's pages (FaultCursorAsync) and of an
// atomic's word (FaultAsync) start nothing and say so, for the transport
// to count (odp_async_faults_busy), and the cursor's reference to the MR
// is given back (DeregMR does not wait for it). With a slot free, the
// fault starts and makes the page present.
func TestAsyncFaultBusyIsReported(t *testing.T) {
	as, err := hostmem.NewAddressSpace(hostmem.Config{Size: 16 << 20})
	require.NoError(t, err)
	defer as.Close()
	e := placement.New(placement.Config{AddressSpace: as})
	buf, err := as.Alloc(2 * 4096)
	require.NoError(t, err)
	defer as.Free(hostmem.AddrOf(buf), len(buf))
	mr, err := e.RegMR(pd1, buf, all|stag.AccessOnDemand)
	require.NoError(t, err)

	payload := []byte("written after the fault")
	begin := func() *placement.Cursor {
		var c placement.Cursor
		require.Equal(t, placement.OK, e.Begin(&c, pd1, mr.RKey(), mr.Addr()+4096, uint64(len(payload)), stag.AccessRemoteWrite))
		require.Equal(t, placement.WouldFault, e.Write(&c, payload), "the page is not present yet")
		return &c
	}

	release := e.OccupyAsyncFaults()
	c := begin()
	st, busy := e.FaultCursorAsync(c, uint64(len(payload)), 4096, pd1)
	require.Equal(t, placement.WouldFault, st)
	require.True(t, busy, "no slot: no fault started")
	e.End(c)
	require.False(t, e.FaultAsync(pd1, mr.RKey(), mr.Addr(), 8, true), "no slot for the atomic's fault")
	require.Zero(t, mr.ODPTable().Present(), "nothing faulted a page in")
	release()

	c = begin()
	st, busy = e.FaultCursorAsync(c, uint64(len(payload)), 4096, pd1)
	require.Equal(t, placement.WouldFault, st)
	require.False(t, busy, "a slot was free: the fault started")
	e.End(c)
	e.OccupyAsyncFaults()() // waits for the fault to end
	require.True(t, mr.ODPTable().PresentAt(mr.Addr()+4096), "the background fault made the page present")
	var c2 placement.Cursor
	require.Equal(t, placement.OK, e.Begin(&c2, pd1, mr.RKey(), mr.Addr()+4096, uint64(len(payload)), stag.AccessRemoteWrite))
	require.Equal(t, placement.OK, e.Write(&c2, payload), "the retry places")
	e.End(&c2)
	require.Equal(t, payload, buf[4096:4096+len(payload)])
	require.NoError(t, e.DeregMR(mr), "every reference the faults took was given back")
}
