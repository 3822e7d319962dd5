package perf

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDrainErrorSaysSlowPath: a -D run whose drain limit expires while
// completions were still arriving after the run (a lossy or delayed path,
// 128 MiB outstanding) says the path is slow, not dead, and what drains
// sooner; it used to ask whether the peer was alive. A drain during which
// nothing completed still asks.
func TestDrainErrorSaysSlowPath(t *testing.T) {
	start := time.Unix(1000, 0)
	e := &drainError{d: 2 * time.Second, drain: 10 * time.Second, peer: "10.0.0.1:18515", start: start,
		lastWC: start.Add(11500 * time.Millisecond)}
	assert.Equal(t, "-D 2s: the work requests still outstanding did not all complete within 10s after the run "+
		"(2s + 10s allowed), though completions were still arriving (the last 9.5s after the run ended): "+
		"the path to the peer at 10.0.0.1:18515 is slow, not dead (loss, --impair, a -u close to the round trip); "+
		"fewer outstanding (-t) or smaller messages (-s) drain sooner (the wait is max(10s, -D))", e.Error())

	for name, last := range map[string]time.Time{
		"no completion at all":          {},
		"the last one during the run":   start.Add(time.Second),
		"the last one before the round": start.Add(-time.Second),
	} {
		e := &drainError{d: 2 * time.Second, drain: 10 * time.Second, peer: "10.0.0.1:18515", start: start, lastWC: last}
		assert.Contains(t, e.Error(), "is the peer at 10.0.0.1:18515 alive?", name)
	}
}

// TestPollerNotesLastCompletion: the session's pollers record when they
// last found a completion (what TestDrainErrorSaysSlowPath's message is
// built from).
func TestPollerNotesLastCompletion(t *testing.T) {
	s := &session{}
	p := &poller{last: &s.lastWC}
	require.Zero(t, s.lastWC.Load())
	before := time.Now()
	p.progress()
	got := time.Unix(0, s.lastWC.Load())
	assert.False(t, got.Before(before))
	assert.False(t, got.After(time.Now()))
}
