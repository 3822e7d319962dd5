package hoststall

import (
	"context"
	"testing"
	"time"
)

// TestSpinDoesNotAllocate: the loop allocates nothing, gaps recorded or
// not (the buffer is the caller's).
func TestSpinDoesNotAllocate(t *testing.T) {
	var now time.Duration
	clock := func() time.Duration {
		now += 100
		if now%(10*time.Microsecond) == 0 {
			now += 5 * time.Microsecond // a gap every 10 µs
		}
		return now
	}
	gaps := make([]Gap, 0, 1<<12)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(10, func() {
		r, err := spin(ctx, clock, 2*time.Millisecond, DefaultThreshold, gaps[:0])
		if err != nil || len(r.Gaps) == 0 {
			t.Fatalf("spin: %v, %d gaps", err, len(r.Gaps))
		}
	})
	if allocs != 0 {
		t.Fatalf("spin allocated %v times a run", allocs)
	}
}
