package perf

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/transport/conn"
)

// TestDrainErrorSaysSlowPath: a -D run whose drain limit expires while the
// peer was still sending (a lossy or delayed path with 128 MiB
// outstanding: --impair loss=0.1,delay=1ms, 2727 packets received in the
// 10 s drain) says the path is slow, not dead, and what drains sooner; it
// used to ask whether the peer was alive. A drain during which nothing
// arrived still asks. The other side is named by its role, since the
// peer prints the message too ("peer: ..."), where "the peer" would name
// itself.
func TestDrainErrorSaysSlowPath(t *testing.T) {
	e := &drainError{d: 2 * time.Second, drain: 10 * time.Second, role: "server", peer: "10.0.0.1:18515", rcvdDuring: 2727}
	assert.Equal(t, "-D 2s: the work requests still outstanding did not all complete within 10s after the run "+
		"(2s + 10s allowed), though the server at 10.0.0.1:18515 was still sending (2727 packets received during the wait): "+
		"the path is slow, not dead (loss, --impair, a -u close to the round trip); "+
		"fewer outstanding (-t) or smaller messages (-s) drain sooner (the wait is max(10s, -D))", e.Error())
	e.rcvdDuring = 0
	assert.Contains(t, e.Error(), "is the server at 10.0.0.1:18515 alive?")
	s := &session{server: true, p: Params{Duration: time.Second}}
	assert.Equal(t, "client", s.drainError().role, "the server drains (-b): its peer is the client")
	s.server = false
	assert.Equal(t, "server", s.drainError().role)
}

// TestDrainCountsPacketsFromItsStart: bounded notes the device's
// rcvd_pkts when the duration ends, so that drainError counts only the
// packets received while draining.
func TestDrainCountsPacketsFromItsStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := conn.NewPipe()
		defer b.Close()
		d, err := softrdma.Open(softrdma.Config{Conn: a})
		require.NoError(t, err)
		defer d.Close()
		s := &session{dev: d, p: Params{Duration: time.Second}}
		_, cancel := s.bounded(context.Background())
		defer cancel()
		d.Counters().RcvdPkts.Add(7) // during the run
		require.Equal(t, int64(-1), s.rcvdAtDrain.Load(), "the drain has not begun")
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		require.Equal(t, int64(7), s.rcvdAtDrain.Load())
		d.Counters().RcvdPkts.Add(5) // while draining
		require.Equal(t, int64(5), s.drainError().rcvdDuring)
	})
}

// TestBoundErrWhenBothBoundsPassed: the run of a -D side that posts the
// work is bounded by the duration and drainLimit (session.bounded), inside
// resultBound's later limit. A loaded machine can keep the run from the
// CPU until both have passed: its error is still this side's drain
// limit, which expired first, not a bare "context deadline exceeded"
// (TestDurationBoundsADeadPath/write-bw once failed so under load, 1 of 30
// runs of the package). A resultBound that expired before the bound (the
// bound started over a drainLimit late) is left to round, which says so.
func TestBoundErrWhenBothBoundsPassed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		old := drainMin
		drainMin = 300 * time.Millisecond
		defer func() { drainMin = old }()
		s := &session{p: Params{Duration: 200 * time.Millisecond}}
		rctx, rcancel := s.resultBound(context.Background()) // 800 ms
		defer rcancel()
		bctx, cancel := s.bounded(rctx) // 500 ms
		time.Sleep(time.Second)         // the run returns after both
		cancel()
		err := s.boundErr(rctx, bctx, bctx.Err())
		var de *drainError
		require.ErrorAs(t, err, &de)
		assert.ErrorContains(t, err, "-D 200ms: the work requests still outstanding did not complete within 300ms")

		rctx, rcancel = s.resultBound(context.Background())
		defer rcancel()
		time.Sleep(400 * time.Millisecond) // the bound starts late
		bctx, cancel = s.bounded(rctx)
		time.Sleep(time.Second)
		cancel()
		err = s.boundErr(rctx, bctx, bctx.Err())
		assert.Equal(t, context.DeadlineExceeded, err, "resultBound's, for round to explain")
	})
}
