package hoststall_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/bench/hoststall"
)

// TestDelayAndStallAgainstCounting checks DelayOver, StallOver and
// DelayQuantile against the definitions evaluated start by start, on
// random probes of 0.5-3.5 µs with gaps of 1-150 ns (some touching, some
// at 0 or ending at the probe's end) and random W up to the probe: the
// stall in [s, s+W) summed gap by gap for s = 0.5, 1.5, … ns, and the
// delay of work over (u, u+W) of running time with each gap at its
// running-time point. Sampling at the midpoints of 1-ns cells, a count
// can differ from the exact share by one cell per cut (at most 4 a gap
// for the stall, 2 for the delay, plus the ends); a single start (W the
// whole probe) is exact.
func TestDelayAndStallAgainstCounting(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		d := time.Duration(500 + r.IntN(3000))
		var gaps []hoststall.Gap
		at := time.Duration(0)
		if r.IntN(3) > 0 {
			at = time.Duration(r.IntN(200))
		}
		for {
			l := time.Duration(1 + r.IntN(150))
			if at+l > d {
				break
			}
			gaps = append(gaps, hoststall.Gap{At: at, Len: l})
			at += l
			if r.IntN(4) > 0 {
				at += time.Duration(r.IntN(300))
			}
		}
		rep := hoststall.Report{Duration: d, Gaps: gaps}
		ran := d
		pos := make([]float64, len(gaps)) // running-time points
		for i, g := range gaps {
			pos[i] = float64(g.At - (d - ran))
			ran -= g.Len
		}
		// starts: the midpoints of the 1-ns cells of [0, end], or 0 alone.
		starts := func(end time.Duration) []float64 {
			if end == 0 {
				return []float64{0}
			}
			xs := make([]float64, end)
			for i := range xs {
				xs[i] = float64(i) + 0.5
			}
			return xs
		}
		share := func(vals []float64, y time.Duration) float64 {
			n := 0
			for _, v := range vals {
				if v > float64(y) {
					n++
				}
			}
			return float64(n) / float64(len(vals))
		}
		for range 5 {
			w := time.Duration(1 + r.IntN(int(d)))
			ys := []time.Duration{0, 10, 50, 200, w / 3, w / 2, w - 1}

			var stall []float64
			for _, s := range starts(d - w) {
				v := 0.0
				for _, g := range gaps {
					v += max(0, min(s+float64(w), float64(g.At+g.Len))-max(s, float64(g.At)))
				}
				stall = append(stall, v)
			}
			tol := float64(4*len(gaps)+2) / float64(len(stall))
			if d == w {
				tol = 0
			}
			for _, y := range ys {
				got, err := rep.StallOver(w, y)
				require.NoError(t, err)
				require.InDelta(t, share(stall, y), got, tol+1e-9, "stall: probe %v gaps %v W %v y %v", d, gaps, w, y)
			}

			if w > ran {
				_, err := rep.Delay(w)
				require.ErrorIs(t, err, hoststall.ErrWindow)
				continue
			}
			var delay []float64
			for _, u := range starts(ran - w) {
				v := 0.0
				for i, g := range gaps {
					if u < pos[i] && pos[i] < u+float64(w) {
						v += float64(g.Len)
					}
				}
				delay = append(delay, v)
			}
			tol = float64(2*len(gaps)+2) / float64(len(delay))
			if ran == w {
				tol = 0
			}
			for _, y := range ys {
				got, err := rep.DelayOver(w, y)
				require.NoError(t, err)
				require.InDelta(t, share(delay, y), got, tol+1e-9, "delay: probe %v gaps %v W %v y %v", d, gaps, w, y)
			}
			// The q-quantile is the smallest y with a share of at most
			// 1−q over it (the delay takes whole-ns values: y−1 is not).
			for _, q := range []float64{0.5, 0.9, 0.99} {
				y, err := rep.DelayQuantile(w, q)
				require.NoError(t, err)
				o, err := rep.DelayOver(w, y)
				require.NoError(t, err)
				require.LessOrEqual(t, o, 1-q+1e-9, "q %v = %v", q, y)
				if y > 0 {
					o, err := rep.DelayOver(w, y-1)
					require.NoError(t, err)
					require.Greater(t, o, 1-q-1e-9, "q %v = %v is not the smallest", q, y)
				}
			}
		}
	}
}
