package hoststall_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/bench/hoststall"
)

const us = time.Microsecond

// fakeClock reads 0 first, then advances step per read, except that a
// read at a time listed in gaps is followed by one that much later: the
// probe sees exactly those gaps.
type fakeClock struct {
	t, step time.Duration
	gaps    map[time.Duration]time.Duration
	reads   int
	onRead  func(n int) // called at every read, if set
}

func (c *fakeClock) now() time.Duration {
	c.reads++
	if c.onRead != nil {
		c.onRead(c.reads)
	}
	if c.reads == 1 {
		return c.t
	}
	if l, ok := c.gaps[c.t]; ok {
		c.t += l
	} else {
		c.t += c.step
	}
	return c.t
}

// sixGaps is a 1-ms probe read every 100 ns with gaps of 1 µs at 50 µs
// and 2 µs at 70 µs (not above the 2-µs threshold: not recorded), and of
// 3 µs at 60, 15 µs at 100, 25 µs at 300, 50 µs at 500, 40 µs at 650 and
// 150 µs at 800 µs.
func sixGaps() *fakeClock {
	return &fakeClock{step: 100, gaps: map[time.Duration]time.Duration{
		50 * us: 1 * us, 60 * us: 3 * us, 70 * us: 2 * us,
		100 * us: 15 * us, 300 * us: 25 * us, 500 * us: 50 * us, 650 * us: 40 * us, 800 * us: 150 * us,
	}}
}

func TestMeasureFakeClockRates(t *testing.T) {
	c := sixGaps()
	r, err := hoststall.Measure(context.Background(), time.Millisecond, hoststall.Options{Clock: c.now})
	require.NoError(t, err)
	require.Equal(t, time.Millisecond, r.Duration) // the last read is at exactly 1 ms
	// Without gaps, reads at 0, 100 ns, ..., 1 ms: 10,001. A gap of L
	// replaces L/100 ns steps by one read: 1 µs −9, 3 µs −29, 2 µs −19,
	// 15 µs −149, 25 µs −249, 50 µs −499, 40 µs −399, 150 µs −1499: −2852.
	require.Equal(t, int64(10001-2852), r.Reads)
	require.Equal(t, hoststall.DefaultThreshold, r.Threshold)
	require.False(t, r.Full)
	require.Equal(t, []hoststall.Gap{
		{60 * us, 3 * us}, {100 * us, 15 * us}, {300 * us, 25 * us},
		{500 * us, 50 * us}, {650 * us, 40 * us}, {800 * us, 150 * us},
	}, r.Gaps)
	require.Equal(t, 150*us, r.Max)
	// Per second of a 1-ms probe: ×1000. Strictly longer than the bound:
	// the 40-µs gap is not over 40 µs.
	for _, c := range []struct {
		over time.Duration
		want float64
	}{
		{2 * us, 6000},   // all six recorded
		{3 * us, 5000},   // not the 3-µs one
		{10 * us, 5000},  // 15, 25, 50, 40, 150
		{20 * us, 4000},  // 25, 50, 40, 150
		{40 * us, 2000},  // 50, 150
		{100 * us, 1000}, // 150
		{150 * us, 0},
	} {
		require.InDelta(t, c.want, r.Rate(c.over), 1e-9, "over %v", c.over)
	}
	// The default windows are all in the report.
	require.Len(t, r.Windows, 3)
	require.Equal(t, []time.Duration{20 * us, 50 * us, 100 * us},
		[]time.Duration{r.Windows[0].Window, r.Windows[1].Window, r.Windows[2].Window})
	require.Len(t, r.Work, 3)
	require.Equal(t, []time.Duration{20 * us, 50 * us, 100 * us}, []time.Duration{r.Work[0].Work, r.Work[1].Work, r.Work[2].Work})
}

// TestMeasureWindowsFromClock: the window statistics of a measured probe
// are those of its gaps (the same numbers as TestStallQuantileTwoGaps and
// TestDelayQuantileTwoGaps, through Measure).
func TestMeasureWindowsFromClock(t *testing.T) {
	c := &fakeClock{step: 100, gaps: map[time.Duration]time.Duration{50 * us: 10 * us, 70 * us: 10 * us}}
	r, err := hoststall.Measure(context.Background(), 200*us, hoststall.Options{Clock: c.now, Windows: []time.Duration{40 * us, 300 * us}})
	require.NoError(t, err)
	require.Equal(t, 200*us, r.Duration)
	require.Equal(t, []hoststall.WindowStall{{Window: 40 * us, P50: 0, P99: 20 * us, Over20: 0}}, r.Windows,
		"the 300-µs window is longer than the probe: left out")
	require.Equal(t, []hoststall.WorkDelay{{Work: 40 * us, P50: 0, P99: 20 * us, Over20: 0}}, r.Work)
}

// TestStallQuantileOneGap: a 10-µs gap at 500 µs of a 1-ms probe, windows
// of 20 µs: the starts run over [0, 980] µs. The stall in [s, s+20) is 0
// up to s = 480, rises to 10 µs at 490, stays 10 to 500, falls to 0 at
// 510, and is 0 after. So the share of starts with at most y < 10 µs of
// stall is (950 + 2y)/980 (each slope holds y of its 10 µs) and 1 at 10:
// p50 = 0 (950/980 = 0.969 see none); p98: 950+2y = 0.98×980 = 960.4
// gives y = 5.2 µs; p99: 950+2y = 970.2 would need y = 10.1, past the
// jump to 1 at 10: p99 = 10 µs. Over 5 µs: 1 − (950+10)/980.
func TestStallQuantileOneGap(t *testing.T) {
	r := hoststall.Report{Duration: 1000 * us, Gaps: []hoststall.Gap{{500 * us, 10 * us}}}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.5, 0}, {0.969, 0}, {0.97, 100}, {0.98, 5200}, {0.99, 10 * us}, {1, 10 * us},
	} {
		got, err := r.StallQuantile(20*us, c.q)
		require.NoError(t, err)
		// 0.97 × 980 = 950.6: 950 + 2y gives y = 0.3 µs.
		if c.q == 0.97 {
			c.want = 300
		}
		require.Equal(t, c.want, got, "q %v", c.q)
	}
	over, err := r.StallOver(20*us, 5*us)
	require.NoError(t, err)
	require.InDelta(t, 20.0/980, over, 1e-12)
	ws, err := r.Stall(20 * us)
	require.NoError(t, err)
	require.Equal(t, hoststall.WindowStall{Window: 20 * us, P50: 0, P99: 10 * us, Over20: 0}, ws)
}

// TestStallQuantileGapLongerThanWindow: a 30-µs gap at 400 µs of 1 ms,
// windows of 20 µs: the stall rises 0→20 over starts [380, 400], stays 20
// over [400, 410] (the window inside the gap), falls over [410, 430]. At
// most y < 20: (930 + 2y)/980. p95: 930+2y = 931 → y = 0.5 µs; p99: past
// 20 → 20 µs. Over 20 µs: none; over 19 µs: 1 − (930+38)/980 = 12/980.
func TestStallQuantileGapLongerThanWindow(t *testing.T) {
	r := hoststall.Report{Duration: 1000 * us, Gaps: []hoststall.Gap{{400 * us, 30 * us}}}
	q95, err := r.StallQuantile(20*us, 0.95)
	require.NoError(t, err)
	require.Equal(t, 500*time.Nanosecond, q95)
	q99, err := r.StallQuantile(20*us, 0.99)
	require.NoError(t, err)
	require.Equal(t, 20*us, q99)
	over, err := r.StallOver(20*us, 20*us)
	require.NoError(t, err)
	require.Zero(t, over)
	over, err = r.StallOver(20*us, 19*us)
	require.NoError(t, err)
	require.InDelta(t, 12.0/980, over, 1e-12)
}

// TestStallQuantileTwoGaps: gaps [50, 60) and [70, 80) µs of a 200-µs
// probe, windows of 40 µs, starts over [0, 160]. The stall by start:
//
//	[0, 10] 0; [10, 20] 0→10; [20, 30] 10; [30, 40] 10→20; [40, 50] 20;
//	[50, 60] 20→10; [60, 70] 10; [70, 80] 10→0; [80, 160] 0.
//
// Starts with at most y: y < 10: 90 + 2y; at 10: 130 (the two flats at
// 10); 10 ≤ y < 20: 130 + 2(y−10); at 20: 160. Of 160: p50 0 (90 ≥ 80);
// p60: 90+2y = 96 → 3 µs; p75: 120 is between 110 (y → 10⁻) and 130: 10
// µs; p90: 130+2(y−10) = 144 → 17 µs; p99: 158.4 would need 24.2: 20 µs.
// Over 15 µs: 1 − 140/160; over 19 µs: 1 − 148/160.
func TestStallQuantileTwoGaps(t *testing.T) {
	r := hoststall.Report{Duration: 200 * us, Gaps: []hoststall.Gap{{50 * us, 10 * us}, {70 * us, 10 * us}}}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.5, 0}, {0.6, 3 * us}, {0.75, 10 * us}, {0.9, 17 * us}, {0.99, 20 * us},
	} {
		got, err := r.StallQuantile(40*us, c.q)
		require.NoError(t, err)
		require.Equal(t, c.want, got, "q %v", c.q)
	}
	for _, c := range []struct {
		y    time.Duration
		want float64
	}{
		{0, 70.0 / 160}, {15 * us, 20.0 / 160}, {19 * us, 12.0 / 160}, {20 * us, 0},
	} {
		got, err := r.StallOver(40*us, c.y)
		require.NoError(t, err)
		require.InDelta(t, c.want, got, 1e-12, "over %v", c.y)
	}
}

// TestStallQuantileEdges: a window as long as the probe is one window
// (the total stall, 20 µs of the two gaps); longer, or not positive, is
// an error; a probe without gaps has no stall; q must be in (0, 1].
func TestStallQuantileEdges(t *testing.T) {
	r := hoststall.Report{Duration: 200 * us, Gaps: []hoststall.Gap{{50 * us, 10 * us}, {70 * us, 10 * us}}}
	for _, q := range []float64{0.01, 0.5, 1} {
		got, err := r.StallQuantile(200*us, q)
		require.NoError(t, err)
		require.Equal(t, 20*us, got)
	}
	over, err := r.StallOver(200*us, 19*us)
	require.NoError(t, err)
	require.Equal(t, 1.0, over)
	for _, w := range []time.Duration{200*us + 1, 0, -us} {
		_, err := r.StallQuantile(w, 0.5)
		require.ErrorIs(t, err, hoststall.ErrWindow, "window %v", w)
		_, err = r.Stall(w)
		require.ErrorIs(t, err, hoststall.ErrWindow, "window %v", w)
	}
	for _, q := range []float64{0, -0.5, 1.5} {
		_, err := r.StallQuantile(20*us, q)
		require.Error(t, err, "q %v", q)
	}

	quiet := hoststall.Report{Duration: time.Millisecond}
	ws, err := quiet.Stall(50 * us)
	require.NoError(t, err)
	require.Equal(t, hoststall.WindowStall{Window: 50 * us}, ws)
	require.Zero(t, quiet.Rate(0))
	var empty hoststall.Report
	require.Zero(t, empty.Rate(0))
	_, err = empty.Stall(us)
	require.ErrorIs(t, err, hoststall.ErrWindow)
}

// TestDelayQuantileOneGap: a 10-µs gap at 500 µs of a 1-ms probe; the
// thread ran 990 µs, the gap at 500 µs of its running time. Work of 20
// µs starting at u in [0, 970] is delayed 10 µs if 480 < u < 500 (the gap
// inside (u, u+20)), else not: 950/970 = 0.979 of the starts see none.
// p50 and p97 (940.9 ≤ 950) 0; p98 (950.6 > 950) and p99 10 µs. Compare
// TestStallQuantileOneGap's wall windows, where p98 is 5.2 µs.
func TestDelayQuantileOneGap(t *testing.T) {
	r := hoststall.Report{Duration: 1000 * us, Gaps: []hoststall.Gap{{500 * us, 10 * us}}}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.5, 0}, {0.97, 0}, {0.979, 0}, {0.98, 10 * us}, {0.99, 10 * us}, {1, 10 * us},
	} {
		got, err := r.DelayQuantile(20*us, c.q)
		require.NoError(t, err)
		require.Equal(t, c.want, got, "q %v", c.q)
	}
	over, err := r.DelayOver(20*us, 5*us)
	require.NoError(t, err)
	require.InDelta(t, 20.0/970, over, 1e-12)
	wd, err := r.Delay(20 * us)
	require.NoError(t, err)
	require.Equal(t, hoststall.WorkDelay{Work: 20 * us, P50: 0, P99: 10 * us, Over20: 0}, wd)
}

// TestDelayQuantileTwoGaps: gaps [50, 60) and [70, 80) µs of a 200-µs
// probe: the thread ran 180 µs, the gaps at 50 and 60 µs of it. Work of
// 40 µs from u in [0, 140] holds the first gap for 10 < u < 50 and the
// second for 20 < u < 60: delay 0 on [0, 10], 10 on (10, 20], 20 on (20,
// 50), 10 on [50, 60), 0 on [60, 140]. At most 0: 90 of 140 (0.643); at
// most 10: 110 (0.786); 20: all. p50 0; p70 and p75 10 µs; p80, p99 20 µs.
// Over 10 µs: 30/140; over 0: 50/140.
func TestDelayQuantileTwoGaps(t *testing.T) {
	r := hoststall.Report{Duration: 200 * us, Gaps: []hoststall.Gap{{50 * us, 10 * us}, {70 * us, 10 * us}}}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{0.5, 0}, {0.64, 0}, {0.65, 10 * us}, {0.75, 10 * us}, {0.8, 20 * us}, {0.99, 20 * us},
	} {
		got, err := r.DelayQuantile(40*us, c.q)
		require.NoError(t, err)
		require.Equal(t, c.want, got, "q %v", c.q)
	}
	for _, c := range []struct {
		y    time.Duration
		want float64
	}{
		{0, 50.0 / 140}, {10 * us, 30.0 / 140}, {19 * us, 30.0 / 140}, {20 * us, 0},
	} {
		got, err := r.DelayOver(40*us, c.y)
		require.NoError(t, err)
		require.InDelta(t, c.want, got, 1e-12, "over %v", c.y)
	}
	// Work as long as the running time: one start, both gaps inside.
	got, err := r.DelayQuantile(180*us, 0.5)
	require.NoError(t, err)
	require.Equal(t, 20*us, got)
	over, err := r.DelayOver(180*us, 19*us)
	require.NoError(t, err)
	require.Equal(t, 1.0, over)
	for _, w := range []time.Duration{180*us + 1, 0} {
		_, err := r.DelayQuantile(w, 0.5)
		require.ErrorIs(t, err, hoststall.ErrWindow, "work %v", w)
	}
	_, err = r.DelayQuantile(40*us, 0)
	require.Error(t, err)
}

// TestDelayLongerThanWork: the delay is not bounded by the work, as the
// wall-window stall is: a 25-µs gap at 100 µs of 1 ms (975 µs run) delays
// work of 5 µs from u in (95, 100), 5 of the 970 µs of starts, by 25 µs;
// p99 0 (965/970 = 0.9948 see none), p99.6 25 µs; a share 5/970 over 20
// µs. The 5-µs wall window holds at most 5 µs.
func TestDelayLongerThanWork(t *testing.T) {
	r := hoststall.Report{Duration: 1000 * us, Gaps: []hoststall.Gap{{100 * us, 25 * us}}}
	wd, err := r.Delay(5 * us)
	require.NoError(t, err)
	require.Equal(t, hoststall.WorkDelay{Work: 5 * us, P50: 0, P99: 0, Over20: wd.Over20}, wd)
	require.InDelta(t, 5.0/970, wd.Over20, 1e-12)
	q, err := r.DelayQuantile(5*us, 0.996)
	require.NoError(t, err)
	require.Equal(t, 25*us, q)
	q, err = r.StallQuantile(5*us, 1)
	require.NoError(t, err)
	require.Equal(t, 5*us, q)
}

// TestDelayEnds: a gap that ends as the work starts, or starts as it
// ends, does not delay it. A 200-µs probe with 10-µs gaps at 0 and at 190
// µs ran 180 µs, the gaps at 0 and 180 of it: work of 180 µs has one
// start, u = 0, and runs over (0, 180) between them: no delay. Work of
// 90 µs from u in [0, 90] holds neither either.
func TestDelayEnds(t *testing.T) {
	r := hoststall.Report{Duration: 200 * us, Gaps: []hoststall.Gap{{0, 10 * us}, {190 * us, 10 * us}}}
	for _, w := range []time.Duration{180 * us, 90 * us} {
		wd, err := r.Delay(w)
		require.NoError(t, err)
		require.Equal(t, hoststall.WorkDelay{Work: w}, wd)
		over, err := r.DelayOver(w, 0)
		require.NoError(t, err)
		require.Zero(t, over)
	}
}

// TestMeasureNoGaps: a clock read every 100 ns for 1 ms: 10,001 reads, no
// gap, nothing stalled.
func TestMeasureNoGaps(t *testing.T) {
	c := &fakeClock{step: 100}
	r, err := hoststall.Measure(context.Background(), time.Millisecond, hoststall.Options{Clock: c.now})
	require.NoError(t, err)
	require.Equal(t, int64(10001), r.Reads)
	require.Empty(t, r.Gaps)
	require.Zero(t, r.Max)
	require.Zero(t, r.Rate(0))
	for _, w := range r.Windows {
		require.Equal(t, hoststall.WindowStall{Window: w.Window}, w)
	}
	require.Len(t, r.Work, 3)
	for _, w := range r.Work {
		require.Equal(t, hoststall.WorkDelay{Work: w.Work}, w)
	}
}

// TestMeasureBadDuration: d ≤ 0 is ErrDuration, and nothing is read.
func TestMeasureBadDuration(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		c := &fakeClock{step: 100}
		_, err := hoststall.Measure(context.Background(), d, hoststall.Options{Clock: c.now})
		require.ErrorIs(t, err, hoststall.ErrDuration)
		require.Zero(t, c.reads)
	}
}

// TestMeasureFull: with room for two gaps the probe of sixGaps ends at
// the start of the third recorded one (25 µs at 300 µs). Reads up to 300
// µs: 3001 without gaps, minus 9 + 29 + 19 + 149 for the gaps at 50, 60,
// 70 and 100 µs: 2795.
func TestMeasureFull(t *testing.T) {
	c := sixGaps()
	r, err := hoststall.Measure(context.Background(), time.Millisecond, hoststall.Options{Clock: c.now, MaxGaps: 2})
	require.NoError(t, err)
	require.True(t, r.Full)
	require.Equal(t, 300*us, r.Duration)
	require.Equal(t, int64(2795), r.Reads)
	require.Equal(t, []hoststall.Gap{{60 * us, 3 * us}, {100 * us, 15 * us}}, r.Gaps)
	require.Equal(t, 15*us, r.Max)
}

// TestMeasureThreshold: a threshold of 20 µs keeps only the gaps longer.
func TestMeasureThreshold(t *testing.T) {
	c := sixGaps()
	r, err := hoststall.Measure(context.Background(), time.Millisecond, hoststall.Options{Clock: c.now, Threshold: 20 * us})
	require.NoError(t, err)
	require.Equal(t, []hoststall.Gap{{300 * us, 25 * us}, {500 * us, 50 * us}, {650 * us, 40 * us}, {800 * us, 150 * us}}, r.Gaps)
}

// TestMeasureCancelled: a context done before the probe, or during it
// (seen within 65,536 reads), ends it with the context's error.
func TestMeasureCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := hoststall.Measure(ctx, time.Second, hoststall.Options{Clock: (&fakeClock{step: 100}).now})
	require.ErrorIs(t, err, context.Canceled)

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	c := &fakeClock{step: 100, onRead: func(n int) {
		if n == 1000 {
			cancel()
		}
	}}
	_, err = hoststall.Measure(ctx, time.Second, hoststall.Options{Clock: c.now}) // 10⁷ reads if not cancelled
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1<<16, c.reads)
}

// TestMeasureReal runs the probe on the real clock for 50 ms and checks
// that the report is sane (the numbers are the host's).
func TestMeasureReal(t *testing.T) {
	r, err := hoststall.Measure(t.Context(), 50*time.Millisecond, hoststall.Options{})
	require.NoError(t, err)
	t.Logf("%d reads in %v, %d gaps, >20 µs %.0f/s, max %v, windows %+v", r.Reads, r.Duration, len(r.Gaps), r.Rate(20*us), r.Max, r.Windows)
	require.GreaterOrEqual(t, r.Duration, 50*time.Millisecond)
	require.Greater(t, r.Reads, int64(1000))
	require.Len(t, r.Windows, 3)
	var total time.Duration
	for i, g := range r.Gaps {
		require.Greater(t, g.Len, hoststall.DefaultThreshold)
		require.LessOrEqual(t, g.Len, r.Max)
		if i > 0 {
			require.GreaterOrEqual(t, g.At, r.Gaps[i-1].At+r.Gaps[i-1].Len, "gaps in order, apart")
		}
		total += g.Len
	}
	require.LessOrEqual(t, total, r.Duration)
	require.GreaterOrEqual(t, r.Rate(10*us), r.Rate(20*us))
	require.GreaterOrEqual(t, r.Rate(20*us), 0.0)
	for _, w := range r.Windows {
		require.LessOrEqual(t, w.P50, w.P99)
		require.LessOrEqual(t, w.P99, w.Window)
		require.GreaterOrEqual(t, w.Over20, 0.0)
		require.LessOrEqual(t, w.Over20, 1.0)
	}
	require.Len(t, r.Work, 3)
	for _, w := range r.Work {
		require.LessOrEqual(t, w.P50, w.P99)
		require.LessOrEqual(t, w.P99, r.Max*time.Duration(len(r.Gaps))) // bounded by the gaps, not by the work
		require.GreaterOrEqual(t, w.Over20, 0.0)
		require.LessOrEqual(t, w.Over20, 1.0)
	}
}
