package main

import (
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/perf"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
)

func TestODPFlags(t *testing.T) {
	code, out, _ := runCLI(t, "write-bw", "--help")
	require.Equal(t, exitOK, code)
	for _, flag := range []string{"-o, --odp", "-O, --iodp", "-P, --prefetch", "--odp-budget", "--fault-policy"} {
		assert.Contains(t, out, flag)
	}

	c, _, err := parse(t, "read-bw", "-o", "-P", "--odp-budget", "1M", "--fault-policy", "rnr")
	require.NoError(t, err)
	o, err := c.tool(perf.ReadBW).options(perf.ReadBW)
	require.NoError(t, err)
	assert.Equal(t, perf.ODPOptions{Explicit: true, Prefetch: true, Budget: 1 << 20, FaultPolicy: "rnr"}, o.ODP)

	// -O is implicit ODP, with or without -o (ibv_rc_pingpong: -O implies -o).
	for _, args := range [][]string{{"write-lat", "-O"}, {"write-lat", "-o", "-O"}, {"write-lat", "--iodp"}} {
		c, _, err = parse(t, args...)
		require.NoError(t, err)
		o, err = c.tool(perf.WriteLat).options(perf.WriteLat)
		require.NoError(t, err)
		assert.Equal(t, perf.ODPOptions{Implicit: true}, o.ODP, args)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"write-bw", "-P"}, "--prefetch advises ODP MRs"},
		{[]string{"write-bw", "--odp-budget", "1M"}, "--odp-budget bounds ODP MRs"},
		{[]string{"write-bw", "--fault-policy", "rnr"}, "--fault-policy applies to faults on ODP MRs"},
		{[]string{"write-bw", "-o", "--fault-policy", "later"}, `--fault-policy "later"`},
		{[]string{"write-bw", "-o", "--odp-budget", "lots"}, "not a size"},
		// Below pagetable.MinBudgetPages the device would raise the
		// budget silently: refused instead, naming the floor.
		{[]string{"write-bw", "-o", "--odp-budget", "8K"}, "--odp-budget 8K: must be at least 64K (16 pages), or 0 for no limit"},
		{[]string{"read-bw", "-o", "--odp-budget", "65535", "h"}, "--odp-budget 65535: must be at least 64K (16 pages)"},
		{[]string{"write-lat", "-O", "--odp-budget", "1"}, "--odp-budget 1: must be at least 64K"},
	} {
		code, _, stderr := runCLI(t, tc.args...)
		assert.Equal(t, exitUsage, code, tc.args)
		assert.Contains(t, stderr, tc.want, tc.args)
	}
}

// cliPair runs a server and a client of the same tool through run(), over
// loopback, and returns their exit codes and outputs. The client retries
// while the server's listener is not up yet.
type cliPair struct {
	srvCode, cliCode int
	srvOut, cliOut   string
	srvErr, cliErr   string
}

func runCLIPair(t *testing.T, srvArgs, cliArgs []string) cliPair {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	require.NoError(t, ln.Close())
	common := []string{"-p", port, "--bind", "127.0.0.1:0"}
	var r cliPair
	var wg sync.WaitGroup
	wg.Go(func() {
		r.srvCode, r.srvOut, r.srvErr = runCLI(t, append(srvArgs, common...)...)
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		r.cliCode, r.cliOut, r.cliErr = runCLI(t, append(append(cliArgs, "127.0.0.1"), common...)...)
		if r.cliCode != exitFail || !strings.Contains(r.cliErr, "connect to the server") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r.cliCode != exitOK {
		// The server may still wait for a client that never came.
		go func() {
			c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second)
			if err == nil {
				c.Close()
			}
		}()
	}
	wg.Wait()
	if t.Failed() || r.srvCode != exitOK || r.cliCode != exitOK {
		t.Logf("server (exit %d):\n%s%s\nclient (exit %d):\n%s%s", r.srvCode, r.srvOut, r.srvErr, r.cliCode, r.cliOut, r.cliErr)
	}
	return r
}

func decodeReport(t *testing.T, out string) report.JSON {
	t.Helper()
	var j report.JSON
	require.NoError(t, json.Unmarshal([]byte(out), &j), out)
	return j
}

// TestODPCounters runs write-bw and read-bw with both buffers on demand
// over loopback and checks the counters both sides print: without
// prefetch the first message faults each page of the 64 KiB buffer exactly
// once on each side (the responder's target or source, the requester's
// source or READ destination) and no later one faults again; with
// --iodp --prefetch the buffers are present before the run and nothing
// faults.
func TestODPCounters(t *testing.T) {
	const size, pages = 64 << 10, 16
	for _, tc := range []struct {
		tool     string
		flags    []string
		implicit bool
		prefetch bool
	}{
		{"write-bw", []string{"--odp"}, false, false},
		{"read-bw", []string{"--odp"}, false, false},
		{"write-bw", []string{"--iodp", "--prefetch"}, true, true},
		{"read-bw", []string{"-O", "-P"}, true, true},
	} {
		t.Run(tc.tool+strings.Join(tc.flags, ""), func(t *testing.T) {
			srv := append([]string{tc.tool}, tc.flags...)
			cli := append([]string{tc.tool, "-s", "64K", "-n", "20", "--json"}, tc.flags...)
			r := runCLIPair(t, srv, cli)
			require.Equal(t, exitOK, r.srvCode)
			require.Equal(t, exitOK, r.cliCode)

			j := decodeReport(t, r.cliOut)
			require.Len(t, j.BW, 1)
			require.NotNil(t, j.ODP, "the client's own buffer")
			require.NotNil(t, j.PeerODP, "the server's buffer")
			for _, o := range []*report.ODPJSON{j.ODP, j.PeerODP} {
				assert.Equal(t, tc.implicit, o.Implicit)
				assert.Equal(t, tc.prefetch, o.Prefetch)
				assert.Equal(t, "sync", o.FaultPolicy)
				assert.EqualValues(t, size, o.Bytes)
				assert.EqualValues(t, pages, o.Pages)
				assert.Zero(t, o.PageInvalidations)
				assert.Zero(t, o.Evictions)
				if tc.prefetch {
					assert.Zero(t, o.PageFaults, "a prefetched buffer does not fault")
					assert.Zero(t, o.PageFaultsHandled)
					assert.EqualValues(t, pages, o.PagePrefetch)
					assert.Zero(t, o.Faults)
				} else {
					assert.EqualValues(t, pages, o.PageFaults, "each page faults once, on first touch")
					assert.EqualValues(t, pages, o.PageFaultsHandled)
					assert.Zero(t, o.PagePrefetch)
					assert.Positive(t, o.Faults)
					assert.LessOrEqual(t, o.Faults, int64(pages))
					assert.Positive(t, o.FaultP50us)
					assert.LessOrEqual(t, o.FaultP50us, o.FaultP99us)
					assert.LessOrEqual(t, o.FaultP99us, o.FaultMaxus)
				}
			}

			// The server's text report: both buffers, mlx5's names.
			kind := "explicit"
			if tc.implicit {
				kind = "implicit, prefetched"
			}
			out := r.srvOut
			assert.Contains(t, out, " ODP local MR    : "+kind+", 16 pages (65536 bytes), fault policy sync, no budget")
			assert.Contains(t, out, " ODP remote MR   : "+kind+", 16 pages (65536 bytes), fault policy sync, no budget")
			counters := "page_faults 16  page_faults_handled 16  page_invalidations 0  page_invalidations_handled 0  page_prefetch 0  evictions 0"
			if tc.prefetch {
				counters = "page_faults 0  page_faults_handled 0  page_invalidations 0  page_invalidations_handled 0  page_prefetch 16  evictions 0"
				assert.Equal(t, 2, strings.Count(out, "fault latency: no faults"), out)
			} else {
				assert.Equal(t, 2, strings.Count(out, " faults, p50 "), out)
			}
			assert.Equal(t, 2, strings.Count(out, counters), out)
			// After the results table.
			assert.Greater(t, strings.Index(out, " ODP local MR"), strings.Index(out, " #bytes"))
		})
	}
}

// TestODPFaultPolicyRNR: with --fault-policy rnr on the server, write-bw's
// first WRITE into its never-touched buffer is answered with an RNR NAK,
// the page faults run in the background, the client backs off and
// retries, and every page still faults exactly once.
func TestODPFaultPolicyRNR(t *testing.T) {
	r := runCLIPair(t, []string{"write-bw", "--json", "--odp", "--fault-policy", "rnr"},
		[]string{"write-bw", "-s", "64K", "-n", "10", "--json"})
	require.Equal(t, exitOK, r.srvCode)
	require.Equal(t, exitOK, r.cliCode)
	srv, cli := decodeReport(t, r.srvOut), decodeReport(t, r.cliOut)
	require.NotNil(t, srv.ODP)
	assert.Nil(t, srv.PeerODP, "the client's buffer is pinned")
	assert.Nil(t, cli.ODP)
	require.NotNil(t, cli.PeerODP)
	assert.Equal(t, *srv.ODP, *cli.PeerODP, "both sides report the server's buffer alike")

	o := srv.ODP
	assert.Equal(t, "rnr", o.FaultPolicy)
	assert.EqualValues(t, 16, o.PageFaults)
	assert.EqualValues(t, 16, o.PageFaultsHandled)
	assert.Positive(t, o.Faults)
	assert.Positive(t, srv.Counters["odp_rnr_naks"])
	assert.Zero(t, srv.Counters["odp_sync_faults"])
	assert.Positive(t, cli.Counters["rcvd_rnr_err"], "the client backed off on the RNR NAKs")
}

// TestODPBudget: with an ODP budget of half the server's buffer, write-bw
// still completes; pages are evicted and fault in again, and never more
// are present than the budget.
func TestODPBudget(t *testing.T) {
	r := runCLIPair(t, []string{"write-bw", "--json", "--odp", "--odp-budget", "128K"},
		[]string{"write-bw", "-s", "256K", "-n", "10", "--json"})
	require.Equal(t, exitOK, r.srvCode)
	require.Equal(t, exitOK, r.cliCode)
	o := decodeReport(t, r.srvOut).ODP
	require.NotNil(t, o)
	assert.EqualValues(t, 64, o.Pages)
	assert.EqualValues(t, 32, o.BudgetPages)
	assert.Positive(t, o.PeakPresent)
	assert.LessOrEqual(t, o.PeakPresent, int64(32), "never more present than the budget")
	assert.Positive(t, o.Evictions, "a 256 KiB buffer cycles through a 128 KiB budget")
	assert.Equal(t, o.Evictions, o.PageInvalidations)
	assert.Equal(t, o.PageInvalidations, o.PageInvalidationsHandled)
	assert.Equal(t, o.PageFaults, o.PageFaultsHandled)
	// Every fault made a page present and every eviction took one away:
	// what is left is present, within the budget.
	left := o.PageFaults - o.Evictions
	assert.Positive(t, left)
	assert.LessOrEqual(t, left, int64(32))
}

func TestODPPrefetchNeedsODP(t *testing.T) {
	// Checked again by the runner for callers of perf.Run.
	_, err := perf.Run(context.Background(), &perf.Options{Test: perf.WriteBW, ODP: perf.ODPOptions{Prefetch: true}})
	require.ErrorContains(t, err, "--prefetch")
}
