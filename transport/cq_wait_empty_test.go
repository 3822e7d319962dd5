package transport

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWaitEmptySliceRefused: Wait with no room for a completion (a nil
// slice, or make([]WC, 0, 16), an easy slip in Go) can never return one,
// so it used to block until its context ended (for ever with
// context.Background) even with completions queued. It is refused at once
// with EINVAL, and the completions stay queued for the next Poll.
// (ibv_poll_cq with num_entries 0 returns 0: Poll keeps that.)
func TestWaitEmptySliceRefused(t *testing.T) {
	cq := NewCQ(4)
	require.True(t, cq.push(&WC{WRID: 7}))
	// A context already done: the old Wait returned its error instead.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, wcs := range [][]WC{nil, make([]WC, 0, 16)} {
		n, err := cq.Wait(ctx, wcs)
		assert.Equal(t, 0, n)
		assert.True(t, errors.Is(err, syscall.EINVAL), "want EINVAL, got %v", err)
		assert.False(t, errors.Is(err, context.Canceled), "got %v", err)
	}
	n, err := cq.Poll(nil)
	assert.NoError(t, err)
	assert.Equal(t, 0, n)
	wcs := make([]WC, 4)
	n, err = cq.Poll(wcs)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Equal(t, uint64(7), wcs[0].WRID)
}

// TestWaitCompletionBeatsContextEndedMeanwhile: a completion that arrives
// as the caller's context ends, both while Wait goes from finding the CQ
// empty to blocking, is returned, not the context's error. (cmchan's
// Write waits for its SEND's completion with a deadline, --idle-timeout
// under -R: on a loaded machine the deadline and the peer's ACK became
// ready together, and the run failed with "the peer did not acknowledge a
// message of the exchange".) Both select cases are then ready; without
// the fix each iteration fails with probability 1/2.
func TestWaitCompletionBeatsContextEndedMeanwhile(t *testing.T) {
	defer func() { testHookWaitBlock = nil }()
	cq := NewCQ(4)
	wcs := make([]WC, 4)
	for i := range 32 {
		ctx, cancel := context.WithCancel(context.Background())
		testHookWaitBlock = func() {
			require.True(t, cq.push(&WC{WRID: uint64(i)}))
			cancel()
		}
		n, err := cq.Wait(ctx, wcs)
		require.NoError(t, err, "iteration %d", i)
		require.Equal(t, 1, n)
		assert.Equal(t, uint64(i), wcs[0].WRID)
		testHookWaitBlock = nil
		n, err = cq.Wait(ctx, wcs) // then the end of the context
		assert.Zero(t, n)
		assert.ErrorIs(t, err, context.Canceled)
		select { // (the push's wake-up, if no select took it)
		case <-cq.notify:
		default:
		}
	}
}
