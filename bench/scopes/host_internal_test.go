package scopes

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/bench/hoststall"
)

// TestHostFields: a 1-ms probe with one 30-µs gap at 400 µs: 1000 gaps
// per second over 10 and over 20 µs, none over 40. A row whose critical
// section p50 is 20 µs gets W = 20 µs. Work of 20 µs: the thread ran 970
// µs, the gap at 400 of it; starts u in [0, 950], delayed 30 µs for 380 <
// u < 400: 20/950 = 2.1% over 20 µs, p50 0, p99 30 µs. A wall window of
// 20 µs: stalled on starts [380, 430] of [0, 980]: p50 0, p99 20 µs
// (hoststall's TestStallQuantileGapLongerThanWindow). The table prints
// them; JSON and CSV carry them.
func TestHostFields(t *testing.T) {
	const us = time.Microsecond
	h := &hoststall.Report{Duration: time.Millisecond, Reads: 12345, Gaps: []hoststall.Gap{{At: 400 * us, Len: 30 * us}}, Max: 30 * us}
	r := Result{Scope: "mr", Policy: "hold", CriticalP50Us: 20}
	hostFields(&r, h)
	require.Equal(t, Ratio(1), r.HostProbeMs)
	require.Equal(t, int64(12345), r.HostReads)
	require.Equal(t, []Ratio{1000, 1000, 0, 0}, []Ratio{r.HostOver10PerS, r.HostOver20PerS, r.HostOver40PerS, r.HostOver100PerS})
	require.Equal(t, Ratio(30), r.HostMaxGapUs)
	require.Equal(t, Ratio(20), r.HostWindowUs)
	require.Equal(t, []Ratio{0, 30}, []Ratio{r.HostDelayP50Us, r.HostDelayP99Us})
	require.InDelta(t, 20.0/950, float64(r.HostDelayOver20), 1e-12)
	require.Equal(t, []Ratio{0, 20}, []Ratio{r.HostStallP50Us, r.HostStallP99Us})

	// A row without remaps (p50 0) has no window: its figures are NaN,
	// the probe's are not.
	noRemap := Result{Scope: MigrateOnly, Policy: "-"}
	hostFields(&noRemap, h)
	require.Equal(t, Ratio(1000), noRemap.HostOver20PerS)
	require.True(t, math.IsNaN(float64(noRemap.HostDelayP99Us)))
	require.True(t, math.IsNaN(float64(noRemap.HostStallP99Us)))

	var tab bytes.Buffer
	require.NoError(t, WriteTable(&tab, Config{}, []Result{r, noRemap}))
	require.Contains(t, tab.String(), "host (probed 1 ms before the rows, one thread spinning on the clock, 12345 reads): "+
		"a busy thread lost >10 µs 1000×/s, >20 µs 1000×/s, >40 µs 0×/s, >100 µs 0×/s; longest 30 µs\n")
	require.Contains(t, tab.String(), "host delay to W µs of work (W = the row's crit p50) started at a random moment, p50/p99 µs (share delayed >20 µs): "+
		"mr/hold 20.0 µs: 0.0/30.0 (2.1%), migrate-only/- -\n")
	require.Contains(t, tab.String(), "; the host alone delays 20.0 µs of work by p99 30.0 µs, 2.1% of it by >20 µs (above 1% the p99 target is out of reach on this host; the probe leaves out the experiment's own threads)\n")

	var js bytes.Buffer
	require.NoError(t, WriteJSON(&js, []Result{r}))
	var back []map[string]any
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	require.Equal(t, 30.0, back[0]["host_delay_p99_us"])
	require.Equal(t, 20.0, back[0]["host_stall_p99_us"])
	require.Equal(t, 1000.0, back[0]["host_gaps_over_20us"])
}

// TestHostFieldsNoProbe: without a probe every host figure is NaN (JSON
// null, an empty CSV field), the reads 0, and the table says so.
func TestHostFieldsNoProbe(t *testing.T) {
	r := Result{Scope: "mr", Policy: "hold", CriticalP50Us: 20}
	hostFields(&r, nil)
	require.Zero(t, r.HostReads)
	for _, x := range []Ratio{r.HostProbeMs, r.HostOver10PerS, r.HostOver20PerS, r.HostOver40PerS, r.HostOver100PerS,
		r.HostMaxGapUs, r.HostWindowUs, r.HostDelayP50Us, r.HostDelayP99Us, r.HostDelayOver20, r.HostStallP50Us, r.HostStallP99Us} {
		require.True(t, math.IsNaN(float64(x)))
	}
	var tab bytes.Buffer
	require.NoError(t, WriteTable(&tab, Config{}, []Result{r}))
	require.Contains(t, tab.String(), "\nhost: not probed\n")
	require.NotContains(t, tab.String(), "host alone")
	require.NotContains(t, tab.String(), "NaN")
	var js bytes.Buffer
	require.NoError(t, WriteJSON(&js, []Result{r}))
	var back []map[string]any
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	require.Contains(t, back[0], "host_delay_p99_us")
	require.Nil(t, back[0]["host_delay_p99_us"])
}
