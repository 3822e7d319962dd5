package report

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBWFormatsLikePerftest(t *testing.T) {
	// 5000 messages of 64 KiB in 0.25 s: 1250 MiB/s, 0.02 Mpps.
	r := BW{Bytes: 65536, Iterations: 5000, Elapsed: 250 * time.Millisecond, PeakBps: 1400 * 0x100000}
	assert.Equal(t, " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]", BWHeader(MBps))
	assert.Equal(t, " 65536      5000             1400.00            1250.00\t\t   0.020000", FormatBW(r, MBps))

	assert.Equal(t, " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]", BWHeader(Gbps))
	// 1250 MiB/s = 10.49 Gb/s.
	assert.Equal(t, " 65536      5000             11.74              10.49  \t\t   0.020000", FormatBW(r, Gbps))

	// Below 0.1 Gb/sec perftest prints six decimals (REPORT_FMT_EXT).
	slow := BW{Bytes: 2, Iterations: 1000, Elapsed: time.Second, PeakBps: 4000}
	assert.Equal(t, " 2          1000           0.000032            0.000016            0.001000", FormatBW(slow, Gbps))
}

func TestBWZeroElapsedIsZeroNotNaN(t *testing.T) {
	r := BW{Bytes: 8, Iterations: 0}
	assert.Zero(t, r.AvgBps())
	assert.Zero(t, r.MsgRate())
	assert.NotContains(t, FormatBW(r, MBps), "NaN")
}

func TestLatFormatsLikePerftest(t *testing.T) {
	r := Lat{Bytes: 2, Iterations: 1000, Min: 10.5, Max: 99.25, Typical: 12, Avg: 13.125, Stdev: 2.5, P99: 40, P999: 90}
	assert.Equal(t, " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ", LatHeader)
	assert.Equal(t, " 2       1000          10.50          99.25        12.00    \t       13.12       \t2.50   \t\t40.00   \t\t90.00  ", FormatLat(r))
}

func TestLatRecorder(t *testing.T) {
	l := NewLatRecorder()
	for i := 1; i <= 1000; i++ {
		l.Record(time.Duration(i) * time.Microsecond)
	}
	r := l.Result(2, 1000)
	assert.Equal(t, int64(1000), l.Count())
	assert.InDelta(t, 1.0, r.Min, 1e-9)
	assert.InDelta(t, 1000.0, r.Max, 1e-9)
	assert.InDelta(t, 500.5, r.Avg, 1e-9)
	assert.InDelta(t, 288.675, r.Stdev, 0.01)
	// Histogram values are within 0.1% (3 significant digits).
	assert.InDelta(t, 500, r.Typical, 1)
	assert.InDelta(t, 990, r.P99, 1)
	assert.InDelta(t, 999, r.P999, 1)
	assert.LessOrEqual(t, r.P999, r.Max)
}

func TestLatRecorderEmpty(t *testing.T) {
	r := NewLatRecorder().Result(2, 0)
	assert.Equal(t, Lat{Bytes: 2}, r)
}

func TestPeakTracker(t *testing.T) {
	t0 := time.Unix(0, 0)
	p := NewPeakTracker(1000, 10)
	// 10 messages per ms for 5 ms, then a burst of 10 in 0.5 ms, then slow.
	for i := int64(1); i <= 5; i++ {
		p.Add(t0.Add(time.Duration(i)*time.Millisecond), i*10)
	}
	p.Add(t0.Add(5500*time.Microsecond), 60)
	p.Add(t0.Add(20*time.Millisecond), 70)
	// Best window of ≥10 messages: 10 in 0.5 ms = 20 MB/s.
	assert.InDelta(t, 20e6, p.Peak(0), 1)
	// Never below the average.
	assert.InDelta(t, 50e6, p.Peak(50e6), 1)
}

func TestPeakTrackerShortRunFallsBackToAverage(t *testing.T) {
	p := NewPeakTracker(1000, 100)
	p.Add(time.Unix(0, 0), 0)
	p.Add(time.Unix(1, 0), 5)
	assert.Equal(t, 123.0, p.Peak(123))
}

func TestBannerAndAddress(t *testing.T) {
	var b bytes.Buffer
	(&Banner{Title: "RDMA_Write BW Test", Device: "softrdma 127.0.0.1:4791", QPs: 1, TxDepth: 128, CQMod: 100,
		MTU: 4096, Exchange: "TCP (softrdma)"}).Print(&b)
	out := b.String()
	assert.True(t, strings.HasPrefix(out, Line+"\n"))
	assert.Contains(t, out, "                    RDMA_Write BW Test\n")
	assert.Contains(t, out, " TX depth        : 128\n")
	assert.Contains(t, out, " CQ Moderation   : 100\n")
	assert.Contains(t, out, " Mtu             : 4096[B]\n")
	assert.Contains(t, out, " Max inline data : 0[B]\n")
	assert.NotContains(t, out, "RX depth")
	assert.NotContains(t, out, "Outstand reads")

	a := Address{Addr: netip.MustParseAddrPort("127.0.0.1:4791"), QPN: 0x11, PSN: 0xabcdef, RKey: 0x201, VAddr: 0x7f0000001000}
	assert.Equal(t, " local address: IP 127.0.0.1 UDP 4791 QPN 0x0011 PSN 0xabcdef RKey 0x000201 VAddr 0x007f0000001000",
		FormatAddress("local", a))
}

func TestJSONRows(t *testing.T) {
	j := &JSON{Tool: "write-bw", Side: "client", Unit: MBps.String(), MTU: 4096, QPs: 1,
		BW:       []BWJSON{BWRow(BW{Bytes: 65536, Iterations: 5000, Elapsed: 250 * time.Millisecond, PeakBps: 1400 * 0x100000}, MBps)},
		Counters: map[string]uint64{"sent_pkts": 3}}
	var b bytes.Buffer
	require.NoError(t, WriteJSON(&b, j))
	var back map[string]any
	require.NoError(t, json.Unmarshal(b.Bytes(), &back))
	row := back["bw"].([]any)[0].(map[string]any)
	assert.Equal(t, 1250.0, row["bw_average"])
	assert.Equal(t, 1400.0, row["bw_peak"])
	assert.Equal(t, 0.02, row["msg_rate_mpps"])
	assert.Equal(t, "MB/sec", back["unit"])
	assert.NotContains(t, back, "lat")
}

// TestJSONUnit: a latency report's unit is its rows' (usec), not a
// bandwidth unit, with or without --report_gbits.
func TestJSONUnit(t *testing.T) {
	assert.Equal(t, "MB/sec", MBps.JSONUnit(false))
	assert.Equal(t, "Gb/sec", Gbps.JSONUnit(false))
	assert.Equal(t, "usec", MBps.JSONUnit(true))
	assert.Equal(t, "usec", Gbps.JSONUnit(true))
}
