package idlewatch_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/idlewatch"
)

// TestWatch runs on synctest's clock: progress restarts the limit, and
// the context ends once a whole limit passes without any.
func TestWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, w := idlewatch.Start(context.Background(), time.Second)
		defer w.Stop()
		for i := range 5 { // 5 × 0.9 s: longer than the limit, never idle for it
			time.Sleep(900 * time.Millisecond)
			require.NoError(t, ctx.Err(), "cancelled after %d progress notes 0.9 s apart", i)
			w.Done(int64(i + 1))
		}
		require.False(t, w.Expired())
		require.EqualValues(t, 5, w.Notes(), "Start's own note not counted")
		time.Sleep(1200 * time.Millisecond) // a limit and a check interval
		synctest.Wait()
		require.ErrorIs(t, ctx.Err(), context.Canceled)
		require.True(t, w.Expired())
		require.EqualValues(t, 5, w.Count())
		require.Equal(t, time.Second, w.Limit())
	})
}

// TestWatchStopIsNotExpiry: Stop cancels the context without counting as
// an expiry.
func TestWatchStopIsNotExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, w := idlewatch.Start(context.Background(), time.Second)
		w.Stop()
		require.ErrorIs(t, ctx.Err(), context.Canceled)
		require.False(t, w.Expired())
	})
}

// TestNoLimit: a limit of 0 gives the context itself and a nil watch
// whose methods do nothing.
func TestNoLimit(t *testing.T) {
	parent := context.Background()
	ctx, w := idlewatch.Start(parent, 0)
	require.Nil(t, w)
	require.Equal(t, parent, ctx)
	w.Progress()
	w.Done(3)
	w.Stop()
	require.False(t, w.Expired())
	require.Zero(t, w.Count())
	require.Zero(t, w.Limit())
	require.Zero(t, w.Notes())
}

// TestWatchSource: a source whose value changes between the watch's
// checks is progress (no Progress call in the run): a run longer than
// the limit is not ended while it changes, and is once it stops.
func TestWatchSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var pkts atomic.Uint64
		ctx, w := idlewatch.StartWith(context.Background(), time.Second, pkts.Load)
		defer w.Stop()
		require.True(t, w.Sourced())
		for i := range 5 { // 5 × 0.9 s
			time.Sleep(900 * time.Millisecond)
			require.NoError(t, ctx.Err(), "cancelled after %d changes 0.9 s apart", i)
			pkts.Add(3)
		}
		time.Sleep(1300 * time.Millisecond) // a limit and more than a check interval
		synctest.Wait()
		require.ErrorIs(t, ctx.Err(), context.Canceled)
		require.True(t, w.Expired())
	})
}
