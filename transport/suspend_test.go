package transport

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/transport/wire"
)

// TestQPsPausedCountsEachQPOnce: a QP that the receive loop marked paused
// just after a Resume emptied the list (it read the old suspension's
// number first) is listed again when the next suspension pauses it; that
// suspension's report counted it twice (bench scopes once saw 3 QPs
// paused at mr scope, where 2 write the MR).
func TestQPsPausedCountsEachQPOnce(t *testing.T) {
	r := newResponderRig(t)
	s1, err := r.d.Suspend(placement.ScopeDevice, nil, PolicyHold)
	require.NoError(t, err)
	_, err = r.d.Resume(s1)
	require.NoError(t, err)
	r.d.markPaused(r.qp) // late: the receive loop read s1's number before the Resume
	s2, err := r.d.Suspend(placement.ScopeDevice, nil, PolicyHold)
	require.NoError(t, err)
	r.d.markPaused(r.qp)
	rep, err := r.d.Resume(s2)
	require.NoError(t, err)
	require.Equal(t, 1, rep.QPsPaused)
}

// TestDelayedBytesCountedBeforeThePacket: the payload of a paused packet
// is counted in BytesDelayed before the packet in Held or NAKed, so that a
// reader that sees the packet (a test waiting for it, then Resume's report)
// sees its bytes too: TestFailedSuspendKeepsPolicy, under load, got a
// report of 1 packet held and 0 bytes delayed. The hook reads the
// counters right after the packet is counted.
func TestDelayedBytesCountedBeforeThePacket(t *testing.T) {
	defer func() { testHookDelayedCounted = nil }()
	for _, pol := range []PausePolicy{PolicyHold, PolicyNAK} {
		r := newResponderRig(t)
		seen := make(chan SuspendCounters, 1)
		testHookDelayedCounted = func() { seen <- r.d.susp.counters() }
		s, err := r.d.Suspend(placement.ScopeDevice, nil, pol)
		require.NoError(t, err)
		r.deliver(r.build(wire.OpRDMAWriteOnly, 1000, make([]byte, 100), true, r.reth(r.mr.Addr(), r.mr.RKey(), 100)))
		c := <-seen
		require.EqualValues(t, 1, c.Held+c.NAKed, "%v", pol)
		require.EqualValues(t, 100, c.BytesDelayed, "%v: the packet's bytes are counted when it is", pol)
		testHookDelayedCounted = nil
		_, err = r.d.Resume(s)
		require.NoError(t, err)
	}
}
