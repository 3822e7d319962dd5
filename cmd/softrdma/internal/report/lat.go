package report

import (
	"math"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// LatRecorder collects latency samples. The median and the percentiles come
// from an HDR histogram (3 significant digits, so a run of any length
// takes constant memory, unlike perftest which keeps every sample);
// minimum, maximum, mean and standard deviation are exact.
//
// perftest's lat tools drop the two largest samples before computing
// (LAT_MEASURE_TAIL); the recorder keeps them.
//
// Not safe for concurrent use.
type LatRecorder struct {
	h          *hdrhistogram.Histogram
	n          int64
	sum, sumSq float64 // nanoseconds
	min, max   int64   // nanoseconds
}

// maxLatency is the largest latency the histogram tracks; longer samples
// are clamped to it (they still count in min/max/mean exactly).
const maxLatency = int64(60 * time.Second)

// NewLatRecorder returns an empty recorder.
func NewLatRecorder() *LatRecorder {
	return &LatRecorder{h: hdrhistogram.New(1, maxLatency, 3), min: math.MaxInt64}
}

// Record adds one sample.
func (l *LatRecorder) Record(d time.Duration) {
	v := int64(d)
	if v < 1 {
		v = 1
	}
	l.n++
	l.sum += float64(v)
	l.sumSq += float64(v) * float64(v)
	l.min = min(l.min, v)
	l.max = max(l.max, v)
	_ = l.h.RecordValue(min(v, maxLatency))
}

// Count returns the number of samples.
func (l *LatRecorder) Count() int64 { return l.n }

// Result returns the statistics in microseconds for messages of size bytes
// over iterations iterations.
func (l *LatRecorder) Result(size, iterations int64) Lat {
	r := Lat{Bytes: size, Iterations: iterations}
	if l.n == 0 {
		return r
	}
	const us = 1e3
	r.Min = float64(l.min) / us
	r.Max = float64(l.max) / us
	r.Avg = l.sum / float64(l.n) / us
	r.Stdev = stdev(l.sum, l.sumSq, l.n) / us
	p := l.h.ValueAtPercentilesSlice([]float64{50, 99, 99.9})
	// The histogram reports the highest value equivalent to the bucket;
	// clamp into the exact range.
	clamp := func(v int64) float64 { return float64(min(max(v, l.min), l.max)) / us }
	r.Typical, r.P99, r.P999 = clamp(p[0]), clamp(p[1]), clamp(p[2])
	return r
}
