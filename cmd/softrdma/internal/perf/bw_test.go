package perf

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
)

// recvBacklog feeds tr what sendBWServer records when the receiver falls
// behind: 1 KiB messages arrive every 3.4 µs (about 300 MB/s) but the
// receiver only polls every 1.7 ms, then drains the backlog in polls of
// 64 completions (the poller's array) 1 µs apart, each timestamped when
// it returns. It returns the run's true average rate in bytes per second.
func recvBacklog(tr *report.PeakTracker, rounds int) float64 {
	const (
		size    = 1024
		arrival = 3400 * time.Nanosecond
		backlog = 512 // rx-depth: the most completions that can queue
		batch   = 64
	)
	t0 := time.Unix(0, 0)
	now := t0
	var total int64
	for range rounds {
		now = now.Add(backlog * arrival) // the backlog builds up
		for n := 0; n < backlog; n += batch {
			total += batch
			tr.Add(now, total)
			now = now.Add(time.Microsecond)
		}
	}
	return float64(total*size) / now.Sub(t0).Seconds()
}

// TestSendBWServerPeakDuration: in a -D run the send-bw receiver reports
// no BW peak (0.00), as perftest does (its -D forces -N, noPeak). The
// receiver's completion times are those of its polls, so a backlog
// drained in a burst of polls looked like a rate of tens of GB/s.
func TestSendBWServerPeakDuration(t *testing.T) {
	p := Params{Test: "send-bw", Size: 1024, Duration: time.Second, TxDepth: 128, CQMod: 100, QPs: 1, RxDepth: 512}
	tr := report.NewPeakTracker(1024, peakWindow(max(int64(p.CQMod), int64(p.TxDepth)*int64(p.QPs)), p.Iters, p.Duration))
	avg := recvBacklog(tr, 100)
	// What the tracker makes of the bursts: far above the true rate.
	assert.Greater(t, tr.Peak(avg), 20*avg)
	// What the receiver reports in a -D run: no peak, as perftest.
	assert.Zero(t, durationPeak(&p, tr, avg))

	// An -n run still reports the tracker's peak.
	p.Duration, p.Iters = 0, 5000
	tr = report.NewPeakTracker(1024, peakWindow(max(int64(p.CQMod), int64(p.TxDepth)*int64(p.QPs)), p.Iters, p.Duration))
	avg = recvBacklog(tr, 10)
	assert.Equal(t, tr.Peak(avg), durationPeak(&p, tr, avg))
}

// TestSendBWServerPeakWindow: in an -n run the send-bw receiver's window
// holds 4 backlogs of rx-depth completions, so a backlog drained in a
// burst of polls no longer reads as a rate of tens of GB/s: the peak stays
// within a third of the true rate. (With the sender's window, max(cq-mod,
// tx-depth, a sixteenth of the run), it read as more than 20 times it.)
func TestSendBWServerPeakWindow(t *testing.T) {
	p := Params{Test: "send-bw", Size: 1024, Iters: 5000, TxDepth: 128, CQMod: 100, QPs: 1, RxDepth: 512}
	old := report.NewPeakTracker(1024, peakWindow(max(int64(p.CQMod), int64(p.TxDepth)*int64(p.QPs)), p.Iters, p.Duration))
	avg := recvBacklog(old, 10)
	assert.Greater(t, old.Peak(avg), 20*avg, "the sender's window on the receiver's times")
	tr := report.NewPeakTracker(1024, recvPeakWindow(&p))
	avg = recvBacklog(tr, 10)
	assert.LessOrEqual(t, tr.Peak(avg), 4.0/3*avg)
}
