// Package report computes and prints the results of the perftest-style
// tools in perftest's formats (linux-rdma/perftest, perftest_parameters.h:
// RESULT_FMT, REPORT_FMT, RESULT_FMT_LAT, REPORT_FMT_LAT) and as JSON.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"time"
)

// Unit is the bandwidth unit of a report.
type Unit uint8

// Bandwidth units. perftest's MB/sec is MiB/s (it divides by 0x100000);
// its Gb/sec is 10^9 bits/s (it divides by 125000000 bytes).
const (
	MBps Unit = iota // MB/sec (2^20 bytes per second), perftest's default
	Gbps             // Gb/sec (10^9 bits per second), perftest's --report_gbits
)

// Factor returns the bytes per second in one unit.
func (u Unit) Factor() float64 {
	if u == Gbps {
		return 125000000
	}
	return 0x100000
}

func (u Unit) String() string {
	if u == Gbps {
		return "Gb/sec"
	}
	return "MB/sec"
}

// LatUnit is the unit of a latency tool's JSON report: its rows' times
// are in microseconds (perftest's usec), whatever --report_gbits says.
const LatUnit = "usec"

// JSONUnit is JSON.Unit for a tool's report: u for a bandwidth tool,
// LatUnit for a latency tool (lat).
func (u Unit) JSONUnit(lat bool) string {
	if lat {
		return LatUnit
	}
	return u.String()
}

// Line is perftest's RESULT_LINE.
const Line = "---------------------------------------------------------------------------------------"

// BW is the result of one bandwidth run (one message size).
type BW struct {
	Bytes      int64         // message size
	Iterations int64         // messages completed, all QPs together
	Elapsed    time.Duration // first post to last completion
	// PeakBps is the best rate seen over a window of the run, in bytes per
	// second (see PeakTracker); 0 if not measured.
	PeakBps float64
}

// AvgBps is the average rate in bytes per second.
func (r BW) AvgBps() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) * float64(r.Iterations) / r.Elapsed.Seconds()
}

// MsgRate is the average message rate in millions of messages per second
// (perftest's MsgRate[Mpps]).
func (r BW) MsgRate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Iterations) / r.Elapsed.Seconds() / 1e6
}

// BWHeader is perftest's RESULT_FMT (RESULT_FMT_G with Gbps).
func BWHeader(u Unit) string {
	return fmt.Sprintf(" #bytes     #iterations    BW peak[%s]    BW average[%s]   MsgRate[Mpps]", u, u)
}

// FormatBW formats r as perftest's REPORT_FMT; like perftest, it switches
// to six decimals (REPORT_FMT_EXT) when the average is below 0.1 Gb/sec.
func FormatBW(r BW, u Unit) string {
	peak, avg := r.PeakBps/u.Factor(), r.AvgBps()/u.Factor()
	if avg < 0.1 && u == Gbps {
		return fmt.Sprintf(" %-7d    %d           %-7.6f            %-7.6f            %-7.6f",
			r.Bytes, r.Iterations, peak, avg, r.MsgRate())
	}
	return fmt.Sprintf(" %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f",
		r.Bytes, r.Iterations, peak, avg, r.MsgRate())
}

// Lat is the result of one latency run, in microseconds.
type Lat struct {
	Bytes      int64
	Iterations int64
	Min        float64 // t_min
	Max        float64 // t_max
	Typical    float64 // t_typical: the median
	Avg        float64 // t_avg
	Stdev      float64 // t_stdev
	P99        float64 // 99% percentile
	P999       float64 // 99.9% percentile
}

// LatHeader is perftest's RESULT_FMT_LAT.
const LatHeader = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "

// FormatLat formats r as perftest's REPORT_FMT_LAT.
func FormatLat(r Lat) string {
	return fmt.Sprintf(" %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f",
		r.Bytes, r.Iterations, r.Min, r.Max, r.Typical, r.Avg, r.Stdev, r.P99, r.P999)
}

// PeakTracker finds the peak bandwidth of a run from the times at which
// completions were seen. perftest takes the best rate over every span from
// a post to a later completion, which is O(n²) and favours the first burst;
// here the peak is the best rate over a sliding window of at least Window
// messages, measured between two completion times.
//
// The zero value is not ready: use NewPeakTracker. Not safe for concurrent
// use.
type PeakTracker struct {
	window int64
	bytes  int64 // message size
	times  []time.Time
	counts []int64 // messages completed at times[i]
	best   float64 // bytes per second
}

// NewPeakTracker returns a tracker for messages of size bytes measured over
// windows of at least window messages (at least 1).
func NewPeakTracker(size int64, window int64) *PeakTracker {
	if window < 1 {
		window = 1
	}
	return &PeakTracker{window: window, bytes: size}
}

// Add records that count messages (cumulative) had completed at t.
func (p *PeakTracker) Add(t time.Time, count int64) {
	p.times = append(p.times, t)
	p.counts = append(p.counts, count)
	// Drop samples from the front while the window from the next one is
	// still wide enough, so the window stays the shortest that qualifies.
	for len(p.counts) > 2 && count-p.counts[1] >= p.window {
		p.times, p.counts = p.times[1:], p.counts[1:]
	}
	n := count - p.counts[0]
	if n >= p.window {
		if d := t.Sub(p.times[0]); d > 0 {
			if r := float64(n*p.bytes) / d.Seconds(); r > p.best {
				p.best = r
			}
		}
	}
}

// Peak returns the best rate in bytes per second, or avg if no window
// was complete (a run shorter than one window).
func (p *PeakTracker) Peak(avg float64) float64 {
	if p.best == 0 || p.best < avg {
		return avg
	}
	return p.best
}

// Stats of a sample set, for tests and for LatRecorder.
func stdev(sum, sumSq float64, n int64) float64 {
	if n < 2 {
		return 0
	}
	mean := sum / float64(n)
	v := sumSq/float64(n) - mean*mean
	if v < 0 {
		return 0
	}
	return math.Sqrt(v)
}

// JSON is the machine-readable report of one tool run (--json).
type JSON struct {
	Tool     string            `json:"tool"`               // e.g. "write-bw"
	Side     string            `json:"side"`               // "server" or "client"
	Unit     string            `json:"unit,omitempty"`     // of the rows: "MB/sec" or "Gb/sec" (BW), "usec" (latency)
	MTU      int               `json:"mtu"`                // path MTU in bytes
	QPs      int               `json:"qps"`                // number of QPs
	BW       []BWJSON          `json:"bw,omitempty"`       // one row per size
	Lat      []LatJSON         `json:"lat,omitempty"`      // one row per size
	Verified bool              `json:"verified"`           // --verify was on and every byte matched
	File     *FileJSON         `json:"file,omitempty"`     // --file transfers
	Counters map[string]uint64 `json:"counters"`           // non-zero hw_counters of the local device
	ODP      *ODPJSON          `json:"odp,omitempty"`      // this side's buffer, if registered on demand
	PeerODP  *ODPJSON          `json:"peer_odp,omitempty"` // the peer's buffer, if registered on demand
	Error    string            `json:"error,omitempty"`    // why the run failed
}

// BWJSON is one bandwidth row; BW values are in the report's unit.
type BWJSON struct {
	Bytes      int64   `json:"bytes"`
	Iterations int64   `json:"iterations"`
	BWPeak     float64 `json:"bw_peak"`
	BWAverage  float64 `json:"bw_average"`
	MsgRate    float64 `json:"msg_rate_mpps"`
	ElapsedSec float64 `json:"elapsed_sec"`
}

// LatJSON is one latency row, in microseconds.
type LatJSON struct {
	Bytes      int64   `json:"bytes"`
	Iterations int64   `json:"iterations"`
	Min        float64 `json:"t_min_usec"`
	Max        float64 `json:"t_max_usec"`
	Typical    float64 `json:"t_typical_usec"`
	Avg        float64 `json:"t_avg_usec"`
	Stdev      float64 `json:"t_stdev_usec"`
	P99        float64 `json:"p99_usec"`
	P999       float64 `json:"p99_9_usec"`
}

// FileJSON describes a file moved with --file.
type FileJSON struct {
	Path   string `json:"path,omitempty"` // the source file or the --out file
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`      // of the bytes this side sent or received
	Peer   string `json:"peer_sha256"` // what the other side computed
	Match  bool   `json:"match"`
}

// BWRow converts r to its JSON row in unit u.
func BWRow(r BW, u Unit) BWJSON {
	return BWJSON{Bytes: r.Bytes, Iterations: r.Iterations, BWPeak: r.PeakBps / u.Factor(),
		BWAverage: r.AvgBps() / u.Factor(), MsgRate: r.MsgRate(), ElapsedSec: r.Elapsed.Seconds()}
}

// LatRow converts r to its JSON row.
func LatRow(r Lat) LatJSON {
	return LatJSON{Bytes: r.Bytes, Iterations: r.Iterations, Min: r.Min, Max: r.Max, Typical: r.Typical,
		Avg: r.Avg, Stdev: r.Stdev, P99: r.P99, P999: r.P999}
}

// WriteJSON writes j indented, with a final newline.
func WriteJSON(w io.Writer, j *JSON) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(j)
}
