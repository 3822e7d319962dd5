package perf

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runPairPerftest runs test's server and client in this process with
// perftest's exchange: each device on a loopback address of its own at UDP
// port 4791 (perftest's keys carry no port), and --perftest on the sides
// the test sets it on (one is enough: the other side sees a plain perftest
// version and follows).
func runPairPerftest(t *testing.T, test Test, srv, cli Options) pairRun {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	net3 := fmt.Sprintf("127.%d.%d.", 100+rand.IntN(100), rand.IntN(250))
	srv.Test, cli.Test = test, test
	srv.Listener, srv.Bind = ln, net3+"2"
	cli.Server, cli.Port, cli.Bind = "127.0.0.1", ln.Addr().(*net.TCPAddr).Port, net3+"1"
	srv.Logf, cli.Logf = t.Logf, t.Logf
	var sout, cout bytes.Buffer
	srv.Stdout, cli.Stdout = &sout, &cout
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var r pairRun
	var wg sync.WaitGroup
	wg.Go(func() { r.srv, r.srvErr = Run(ctx, &srv) })
	r.cli, r.cliErr = Run(ctx, &cli)
	if r.cliErr != nil {
		ln.Close()
		cancel()
	}
	wg.Wait()
	r.srvOut, r.cliOut = sout.String(), cout.String()
	if t.Failed() || r.srvErr != nil || r.cliErr != nil {
		t.Logf("server output:\n%s\nclient output:\n%s", r.srvOut, r.cliOut)
	}
	return r
}

// TestPerftestExchange runs every tool with perftest's exchange on both
// sides, with --verify, and checks the rows, what each side verified and
// that both saw a perftest peer.
func TestPerftestExchange(t *testing.T) {
	for _, tc := range []struct {
		test           Test
		p              Params
		cliVer, srvVer string // what --verify must report ("": nothing checked)
		perftestOn     string // the side that has --perftest: "client", "server" or "both"
	}{
		{WriteBW, Params{Iters: 50, Size: 10000}, "", "", "client"},
		{WriteBW, Params{Iters: 40, Size: 100, QPs: 3}, "", "", "server"},
		{ReadBW, Params{Iters: 50, Size: 10000}, "50 READs of 10000 bytes equal the first READ", "", "both"},
		{ReadBW, Params{Iters: 100, Size: 300, QPs: 2}, "200 READs of 300 bytes equal the first READ of their remote slot (12 slots per QP)", "", "client"},
		{SendBW, Params{Iters: 50, Size: 5000}, "", "50 messages of 5000 bytes received", "client"},
		{SendBW, Params{Iters: 30, Size: 64, QPs: 2, RxDepth: 8}, "", "60 messages of 64 bytes received", "server"},
		{AtomicBW, Params{Iters: 100}, "went up by one per FETCH_AND_ADD", "64 slots per QP hold what 100 FETCH_AND_ADD left", "client"},
		{AtomicBW, Params{Iters: 70, QPs: 2, Atomic: CmpAndSwap}, "stayed put under CMP_AND_SWAP", "64 slots per QP hold what 70 CMP_AND_SWAP left", "both"},
		{WriteLat, Params{Iters: 300}, "", "", "client"}, // 300 > 255: the polled byte wraps
		{ReadLat, Params{Iters: 20, Size: 5000}, "20 READs of 5000 bytes equal the first", "", "server"},
		{SendLat, Params{Iters: 20, Size: 100}, "", "", "client"},
	} {
		t.Run(fmt.Sprintf("%v/q%d/%s", tc.test, max(tc.p.QPs, 1), tc.perftestOn), func(t *testing.T) {
			tc.p.Verify = true
			srv, cli := Options{Params: tc.p}, Options{Params: tc.p}
			srv.Params.Seed = 0
			srv.Perftest = tc.perftestOn != "client"
			cli.Perftest = tc.perftestOn != "server"
			r := runPairPerftest(t, tc.test, srv, cli)
			requireOK(t, r)
			qps := int64(max(tc.p.QPs, 1))
			for side, res := range map[string]*Result{"client": r.cli, "server": r.srv} {
				out := r.cliOut
				want := tc.cliVer
				if side == "server" {
					out, want = r.srvOut, tc.srvVer
				}
				assert.Contains(t, out, "peer perftest 6.24", side)
				if want != "" {
					assert.Regexp(t, `(?m)^ Verify          : .*`+regexp.QuoteMeta(want), out, side)
					assert.True(t, res.Report.Verified, side)
				} else {
					assert.Contains(t, out, "Verify          : nothing this side can check", side)
					assert.False(t, res.Report.Verified, side)
				}
				switch {
				case tc.test.IsLat() && (tc.test != ReadLat || side == "client"):
					require.Len(t, res.Report.Lat, 1, side)
					assert.Equal(t, tc.p.Iters, res.Report.Lat[0].Iterations, side)
				case !tc.test.IsLat():
					// The write, read and atomic server prints the
					// client's report, which crossed xchg_bw_reports.
					require.Len(t, res.Report.BW, 1, side)
					assert.Equal(t, tc.p.Iters*qps, res.Report.BW[0].Iterations, side)
					assert.Positive(t, res.Report.BW[0].BWAverage, side)
				}
				assert.NotZero(t, res.Report.Counters["sent_pkts"], side)
				assert.Zero(t, res.Report.Counters["rcvd_seq_err"], side)
			}
		})
	}
}

// TestPerftestAllSizes runs write-bw -a: the client loops over the sizes,
// the server only serves, and the last size's report crosses.
func TestPerftestAllSizes(t *testing.T) {
	p := Params{Iters: 5, All: true}
	r := runPairPerftest(t, WriteBW, Options{Params: p}, Options{Params: p, Perftest: true})
	requireOK(t, r)
	require.Len(t, r.cli.Report.BW, 23)
	require.Len(t, r.srv.Report.BW, 1)
	assert.Equal(t, int64(MaxSize), r.srv.Report.BW[0].Bytes)
}

// TestPerftestRejects checks what perftest's exchange cannot do.
func TestPerftestRejects(t *testing.T) {
	in, _ := writeTestFile(t, 10)
	for _, tc := range []struct {
		test Test
		o    Options
		want string
	}{
		{WriteBW, Options{File: in}, "--file and --out need a softrdma peer"},
		{WriteBW, Options{Params: Params{Duration: time.Second}}, "-D: with a perftest peer"},
		{SendBW, Options{Params: Params{All: true, Iters: 5}}, "-a is supported by write-bw and read-bw only"},
	} {
		tc.o.Perftest = true
		r := runPairPerftest(t, tc.test, Options{Perftest: true}, tc.o)
		assert.ErrorContains(t, r.cliErr, tc.want)
		assert.Error(t, r.srvErr, "the server sees the client go away")
	}
}

// TestPerftestOutOfStep checks that a peer whose hand shakes describe
// other QPs than expected (a different -q) is reported, not run.
func TestPerftestOutOfStep(t *testing.T) {
	r := runPairPerftest(t, WriteBW, Options{Params: Params{QPs: 2, Iters: 5}},
		Options{Params: Params{QPs: 1, Iters: 5}, Perftest: true})
	require.Error(t, r.srvErr)
	require.Error(t, r.cliErr)
	assert.ErrorContains(t, errorsJoin(r.srvErr, r.cliErr), "out of step")
}

func errorsJoin(a, b error) error { return fmt.Errorf("%w; %w", a, b) }
