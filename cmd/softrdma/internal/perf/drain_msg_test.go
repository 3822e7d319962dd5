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
