// Package hoststall measures how long a busy thread loses its CPU on this
// host, the way hwlatdetect and cyclictest do: one thread spins reading a
// monotonic clock and every interval between two consecutive reads longer
// than a threshold is a stall the thread did not cause (the hypervisor
// descheduled the vCPU, an interrupt, another thread ran). It estimates
// the floor under any latency the host can deliver: a critical section
// cannot finish faster than the host lets its thread run. It is a sample
// (one unpinned thread, for the probe's duration), not a bound.
//
// Two figures follow from the gaps, both computed exactly rather than
// sampled:
//
//   - Report.Delay: the delay the host adds to a piece of work that needs
//     W µs of CPU and starts at a moment uniform over the time the thread
//     ran. In the thread's running time (wall time minus the gaps before)
//     every gap is a point; the work covers the running-time interval
//     (u, u+W) and is delayed by the gaps whose points fall in it, so the
//     delay is a step function of u with steps where u or u+W meets a
//     gap. This is what the host adds to a critical section of W µs of
//     work, and it is not bounded by W: one 1-ms gap delays a 5-µs section
//     by 1 ms.
//   - Report.Stall: the stall inside a wall-clock window [s, s+W) with s
//     uniform over [0, D−W] (cyclictest's view of a fixed period). It is
//     piecewise linear in s, with pieces bounded by the gaps' ends shifted
//     by 0 and −W, and at most W.
//
// In both the share of starts with at most y is a sum over the pieces,
// inverted by bisection to the nanosecond for the quantiles.
package hoststall

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"time"
)

// Defaults of Options.
const (
	// DefaultThreshold is the shortest interval between two clock reads
	// that counts as a stall. The loop itself takes 20-60 ns a read.
	DefaultThreshold = 2 * time.Microsecond
	// DefaultMaxGaps bounds the gap buffer (16 bytes a gap: 4 MiB). At
	// the thousands of gaps over 2 µs a second seen on a busy 2-vCPU
	// guest it holds a minute of probe; when it fills the probe ends
	// early (Report.Full).
	DefaultMaxGaps = 1 << 18
)

// DefaultWindows are the lengths Report.Windows and Report.Work hold when
// Options.Windows is empty.
var DefaultWindows = []time.Duration{20 * time.Microsecond, 50 * time.Microsecond, 100 * time.Microsecond}

// Options configures Measure. A zero field takes the default named on it.
type Options struct {
	// Threshold: an interval between consecutive reads longer than this
	// is recorded as a gap. Default DefaultThreshold (2 µs).
	Threshold time.Duration
	// MaxGaps is the capacity of the gap buffer, allocated before the
	// spin. Default DefaultMaxGaps.
	MaxGaps int
	// Clock returns a monotonic time (any origin). Default: Go's
	// monotonic clock (time.Since, CLOCK_MONOTONIC through the vDSO).
	// Tests inject a fake one; it must not go backwards.
	Clock func() time.Duration
	// Windows are the lengths W whose delay and stall distributions the
	// report holds (Report.Work, Report.Windows). Default DefaultWindows
	// (20, 50, 100 µs).
	Windows []time.Duration
}

// Gap is one interval between two consecutive clock reads longer than the
// threshold: the thread did not run for about Len from At.
type Gap struct {
	At  time.Duration // the read before the gap, from the probe's first read
	Len time.Duration // to the read after it
}

// WorkDelay is the distribution of the delay the host adds to a piece of
// work needing Work of CPU that starts at a moment uniform over the time
// the thread ran (Report.Delay).
type WorkDelay struct {
	Work time.Duration
	P50  time.Duration
	P99  time.Duration
	// Over20 is the share (0-1) of the starts delayed more than 20 µs:
	// above 0.01, the p99 of such work's wall time here exceeds the work
	// by more than 20 µs, whatever the code.
	Over20 float64
}

// WindowStall is the distribution of the stall time inside a wall-clock
// window of length Window placed uniformly over the probe (Report.Stall).
type WindowStall struct {
	Window time.Duration
	P50    time.Duration
	P99    time.Duration
	// Over20 is the share (0-1) of the windows that hold more than 20 µs
	// of stall: above 0.01, the p99 of any work of length Window here
	// exceeds its own time by more than 20 µs.
	Over20 float64
}

// Report is what a probe saw. The zero Report (no probe) has no reads.
type Report struct {
	Duration  time.Duration // from the first read to the last
	Reads     int64         // clock reads, the first included
	Threshold time.Duration // the shortest gap recorded
	// Full is set when the gap buffer filled and the probe ended early,
	// at the start of the gap that did not fit (Duration is then shorter
	// than asked).
	Full bool
	// Gaps are the gaps in time order, every one above Threshold in
	// [0, Duration).
	Gaps []Gap
	// Max is the longest gap (0 without gaps).
	Max time.Duration
	// Work and Windows are the delay and stall distributions for
	// Options.Windows (lengths longer than the probe are left out).
	Work    []WorkDelay
	Windows []WindowStall
}

// Errors of Measure and Report's methods.
var (
	ErrDuration = errors.New("hoststall: probe duration must be positive")
	ErrWindow   = errors.New("hoststall: window must be positive and at most the probe's duration")
	// ErrClockStopped: the clock read the same value at 64 checks in a
	// row, 65,536 reads apart (4.2 million reads, over 80 ms of spinning
	// at 20 ns a read, where the coarsest Linux clock, jiffies at 100 Hz,
	// ticks every 10 ms): a fake clock that stopped, or the default clock
	// inside a testing/synctest bubble, whose time does not advance while
	// the probe's goroutine spins.
	ErrClockStopped = errors.New("hoststall: the clock stopped advancing")
)

// Measure spins on one goroutine locked to its OS thread for d, reading
// the clock back to back, and returns every interval between consecutive
// reads longer than opts.Threshold. It keeps the thread (and a CPU) busy
// for d. No allocation happens in the spin: the gap buffer is allocated
// before it. Errors: ErrDuration for d ≤ 0; ctx's error if ctx is done
// (checked before the spin and every 65,536 reads, a few ms);
// ErrClockStopped if the clock stops advancing.
func Measure(ctx context.Context, d time.Duration, opts Options) (Report, error) {
	if d <= 0 {
		return Report{}, ErrDuration
	}
	if err := ctx.Err(); err != nil {
		return Report{}, err
	}
	if opts.Threshold <= 0 {
		opts.Threshold = DefaultThreshold
	}
	if opts.MaxGaps <= 0 {
		opts.MaxGaps = DefaultMaxGaps
	}
	if opts.Clock == nil {
		base := time.Now()
		opts.Clock = func() time.Duration { return time.Since(base) }
	}
	if len(opts.Windows) == 0 {
		opts.Windows = DefaultWindows
	}
	gaps := make([]Gap, 0, opts.MaxGaps)

	runtime.LockOSThread()
	r, err := spin(ctx, opts.Clock, d, opts.Threshold, gaps)
	runtime.UnlockOSThread()
	if err != nil {
		return Report{}, err
	}
	for _, g := range r.Gaps {
		r.Max = max(r.Max, g.Len)
	}
	for _, w := range opts.Windows {
		if wd, err := r.Delay(w); err == nil { // else longer than the probe
			r.Work = append(r.Work, wd)
		}
		if ws, err := r.Stall(w); err == nil {
			r.Windows = append(r.Windows, ws)
		}
	}
	return r, nil
}

// stoppedChecks is how many checks in a row, 65,536 reads apart, must see
// the clock unchanged for spin to give up with ErrClockStopped.
const stoppedChecks = 64

// spin is the probe's loop: it reads clock until d has passed since the
// first read, appending to gaps (within its capacity) every interval
// longer than thr. It does not allocate. Every 65,536 reads it checks
// ctx and that the clock moved.
func spin(ctx context.Context, clock func() time.Duration, d, thr time.Duration, gaps []Gap) (Report, error) {
	start := clock()
	prev := start
	reads := int64(1)
	full := false
	checked, stuck := start, 0 // the clock at the last check, and how many checks in a row saw it
	for {
		now := clock()
		if g := now - prev; g > thr {
			if len(gaps) == cap(gaps) {
				full = true
				break
			}
			gaps = append(gaps, Gap{At: prev - start, Len: g})
		}
		prev = now
		reads++
		if now-start >= d {
			break
		}
		if reads&0xffff == 0 {
			if err := ctx.Err(); err != nil {
				return Report{}, err
			}
			if now != checked {
				checked, stuck = now, 0
			} else if stuck++; stuck == stoppedChecks {
				return Report{}, ErrClockStopped
			}
		}
	}
	return Report{Duration: prev - start, Reads: reads, Threshold: thr, Full: full, Gaps: gaps}, nil
}

// Rate is the number of gaps longer than over per second of probe (0 for
// an empty report).
func (r *Report) Rate(over time.Duration) float64 {
	if r.Duration <= 0 {
		return 0
	}
	n := 0
	for _, g := range r.Gaps {
		if g.Len > over {
			n++
		}
	}
	return float64(n) / r.Duration.Seconds()
}

// Delay is the p50 and p99 of the delay the host adds to a piece of work
// needing w of CPU (DelayQuantile), and the share of such work delayed
// more than 20 µs (DelayOver). Errors: ErrWindow for w ≤ 0 or longer than
// the time the thread ran.
func (r *Report) Delay(w time.Duration) (WorkDelay, error) {
	ps, total, err := r.workPieces(w)
	if err != nil {
		return WorkDelay{}, err
	}
	return WorkDelay{Work: w, P50: quantile(ps, total, 0.5), P99: quantile(ps, total, 0.99), Over20: over(ps, total, 20*time.Microsecond)}, nil
}

// DelayQuantile is the q-quantile (0 < q ≤ 1) of the delay the host adds
// to a piece of work needing w of CPU that starts at a moment u uniform
// over the thread's running time (u in [0, R−w], R the probe's duration
// minus its gaps): the total length of the gaps that fall strictly inside
// the work's running-time interval (u, u+w). The smallest y such that a
// share q of the starts are delayed at most y, exact to the nanosecond.
// Errors: ErrWindow for w ≤ 0 or longer than R; q outside (0, 1].
func (r *Report) DelayQuantile(w time.Duration, q float64) (time.Duration, error) {
	if !(q > 0 && q <= 1) {
		return 0, fmt.Errorf("hoststall: quantile %v: in (0, 1]", q)
	}
	ps, total, err := r.workPieces(w)
	if err != nil {
		return 0, err
	}
	return quantile(ps, total, q), nil
}

// DelayOver is the share (0-1) of the pieces of work of w, started as in
// DelayQuantile, delayed more than y. Errors: as DelayQuantile's.
func (r *Report) DelayOver(w, y time.Duration) (float64, error) {
	ps, total, err := r.workPieces(w)
	if err != nil {
		return 0, err
	}
	return over(ps, total, y), nil
}

// Stall is the p50 and p99 of the stall in a wall-clock window of length
// w placed uniformly over the probe, and the share of such windows
// stalled more than 20 µs (StallQuantile, StallOver). Errors: ErrWindow
// for w ≤ 0 or longer than the probe.
func (r *Report) Stall(w time.Duration) (WindowStall, error) {
	ps, total, err := r.pieces(w)
	if err != nil {
		return WindowStall{}, err
	}
	return WindowStall{Window: w, P50: quantile(ps, total, 0.5), P99: quantile(ps, total, 0.99), Over20: over(ps, total, 20*time.Microsecond)}, nil
}

// StallQuantile is the q-quantile (0 < q ≤ 1) of the stall time inside a
// window [s, s+w) whose start s is uniform over [0, Duration−w]: the
// smallest y such that a share q of the starts see a stall of at most y
// (the continuous distribution, computed exactly and rounded to the
// nanosecond). A gap counts as stall for its whole Len, the time between
// reads below the threshold as running. Errors: ErrWindow for w ≤ 0 or
// longer than the probe; q outside (0, 1].
func (r *Report) StallQuantile(w time.Duration, q float64) (time.Duration, error) {
	if !(q > 0 && q <= 1) {
		return 0, fmt.Errorf("hoststall: quantile %v: in (0, 1]", q)
	}
	ps, total, err := r.pieces(w)
	if err != nil {
		return 0, err
	}
	return quantile(ps, total, q), nil
}

// StallOver is the share (0-1) of the windows of length w, placed
// uniformly over the probe, that hold more than y of stall. Errors: as
// StallQuantile's.
func (r *Report) StallOver(w, y time.Duration) (float64, error) {
	ps, total, err := r.pieces(w)
	if err != nil {
		return 0, err
	}
	return over(ps, total, y), nil
}

// quantile is the smallest y such that the starts with at most y cover a
// share q of total (ns; total 0: the one start's value).
func quantile(ps []piece, total, q float64) time.Duration {
	if total == 0 {
		return time.Duration(ps[0].f0)
	}
	want := q * total
	if measureAtMost(ps, 0) >= want {
		return 0
	}
	hi := 0.0
	for _, p := range ps {
		hi = max(hi, p.f0, p.f1)
	}
	// measureAtMost is nondecreasing in y and right-continuous; bisect for
	// the smallest y with measureAtMost(y) ≥ want.
	lo := 0.0
	for hi-lo > 1e-3 {
		mid := (lo + hi) / 2
		if measureAtMost(ps, mid) >= want*(1-1e-12) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return time.Duration(math.Round(hi))
}

// over is the share of the starts whose value is above y (total 0: 1 or
// 0 for the one start).
func over(ps []piece, total float64, y time.Duration) float64 {
	if total == 0 {
		if ps[0].f0 > float64(y) {
			return 1
		}
		return 0
	}
	return 1 - measureAtMost(ps, float64(y))/total
}

// workPieces cuts the starts [0, R−w] of the running time at every start
// where u or u+w meets a gap; between two cuts the delay is constant. It
// returns the pieces and R−w.
func (r *Report) workPieces(w time.Duration) ([]piece, float64, error) {
	var stalled time.Duration
	for _, g := range r.Gaps {
		stalled += g.Len
	}
	ran := r.Duration - stalled
	if w <= 0 || w > ran {
		return nil, 0, fmt.Errorf("%w: work %v, probe %v of which the thread ran %v", ErrWindow, w, r.Duration, ran)
	}
	end := float64(ran - w)
	// pos[i] is gap i's point in running time; cum[i] the gaps before it.
	pos := make([]float64, len(r.Gaps))
	cum := make([]float64, len(r.Gaps)+1)
	for i, g := range r.Gaps {
		pos[i] = float64(g.At) - cum[i]
		cum[i+1] = cum[i] + float64(g.Len)
	}
	fw := float64(w)
	delay := func(u float64) float64 { // the gaps in (u, u+w)
		lo := sort.SearchFloat64s(pos, math.Nextafter(u, math.Inf(1))) // first pos > u
		hi := sort.SearchFloat64s(pos, u+fw)                           // first pos ≥ u+w
		return cum[hi] - cum[lo]
	}
	if end == 0 {
		d := delay(0)
		return []piece{{0, 0, d, d}}, 0, nil
	}
	cuts := []float64{0, end}
	for _, p := range pos {
		for _, c := range [...]float64{p, p - fw} {
			if c > 0 && c < end {
				cuts = append(cuts, c)
			}
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	ps := make([]piece, 0, len(cuts)-1)
	for i := 1; i < len(cuts); i++ {
		d := delay((cuts[i-1] + cuts[i]) / 2)
		ps = append(ps, piece{cuts[i-1], cuts[i], d, d})
	}
	return ps, end, nil
}

// piece is a stretch [s0, s1] of window starts over which the stall in
// the window goes linearly from f0 to f1 (ns).
type piece struct{ s0, s1, f0, f1 float64 }

// pieces cuts [0, Duration−w] at every start where a window edge meets a
// gap's edge; between two cuts the stall is linear in the start. It
// returns the pieces and Duration−w.
func (r *Report) pieces(w time.Duration) ([]piece, float64, error) {
	if w <= 0 || w > r.Duration {
		return nil, 0, fmt.Errorf("%w: window %v, probe %v", ErrWindow, w, r.Duration)
	}
	end := r.Duration - w
	cuts := []time.Duration{0, end}
	for _, g := range r.Gaps {
		for _, c := range [...]time.Duration{g.At, g.At + g.Len, g.At - w, g.At + g.Len - w} {
			if c > 0 && c < end {
				cuts = append(cuts, c)
			}
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	// cum[i] is the stall before gap i.
	cum := make([]time.Duration, len(r.Gaps)+1)
	for i, g := range r.Gaps {
		cum[i+1] = cum[i] + g.Len
	}
	stallBefore := func(x time.Duration) time.Duration { // stall in [0, x)
		i := sort.Search(len(r.Gaps), func(i int) bool { return r.Gaps[i].At >= x })
		s := cum[i]
		if i > 0 {
			g := r.Gaps[i-1]
			if over := g.At + g.Len - x; over > 0 {
				s -= over
			}
		}
		return s
	}
	f := func(s time.Duration) float64 { return float64(stallBefore(s+w) - stallBefore(s)) }
	if len(cuts) == 1 { // end == 0: one window
		return []piece{{0, 0, f(0), f(0)}}, 0, nil
	}
	ps := make([]piece, 0, len(cuts)-1)
	prev := f(cuts[0])
	for i := 1; i < len(cuts); i++ {
		next := f(cuts[i])
		ps = append(ps, piece{float64(cuts[i-1]), float64(cuts[i]), prev, next})
		prev = next
	}
	return ps, float64(end), nil
}

// measureAtMost is the length of the starts whose window holds at most y
// of stall.
func measureAtMost(ps []piece, y float64) float64 {
	m := 0.0
	for _, p := range ps {
		l := p.s1 - p.s0
		lo, hi := min(p.f0, p.f1), max(p.f0, p.f1)
		switch {
		case y >= hi:
			m += l
		case y < lo:
		default: // lo ≤ y < hi: a sloped piece
			m += l * (y - lo) / (hi - lo)
		}
	}
	return m
}
