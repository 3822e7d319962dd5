package hoststall_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/bench/hoststall"
)

// TestMeasureClockStopped: a clock that stops advancing ends the probe
// with ErrClockStopped instead of spinning for ever, even with a context
// that is never done: 64 checks of 65,536 reads each (every check sees
// the clock where the one before did) after the clock stops at 1 ms,
// itself 10,001 reads (a read every 100 ns) into the probe.
func TestMeasureClockStopped(t *testing.T) {
	c := &fakeClock{step: 100}
	stopAt := time.Millisecond
	clock := func() time.Duration {
		if c.t >= stopAt {
			c.reads++
			return c.t
		}
		return c.now()
	}
	_, err := hoststall.Measure(context.Background(), time.Second, hoststall.Options{Clock: clock})
	require.ErrorIs(t, err, hoststall.ErrClockStopped)
	require.Less(t, c.reads, 66<<16, "stopped within 65 checks")
	require.GreaterOrEqual(t, c.reads, 64<<16)
}

// TestMeasureInSynctestBubble: in a testing/synctest bubble the default
// clock (time.Since) does not move while the probe's goroutine spins,
// since fake time only advances when every goroutine of the bubble is
// blocked: the probe reports ErrClockStopped rather than hanging the
// test (before ErrClockStopped it spun until the test binary's timeout).
func TestMeasureInSynctestBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second) // fake time: never fires while spinning
		defer cancel()
		_, err := hoststall.Measure(ctx, time.Millisecond, hoststall.Options{})
		require.ErrorIs(t, err, hoststall.ErrClockStopped)
	})
}
