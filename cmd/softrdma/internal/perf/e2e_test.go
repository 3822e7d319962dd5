package perf

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/exchange"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
)

// pairRun is the outcome of one server and one client run in-process.
type pairRun struct {
	srv, cli       *Result
	srvErr, cliErr error
	srvOut, cliOut string
}

// runPair runs test's server and client in this process over loopback:
// the server listens on a port of the test's choosing (its listener being
// up is its readiness), both devices bind 127.0.0.1 on ephemeral ports.
func runPair(t *testing.T, test Test, srv, cli Options) pairRun {
	t.Helper()
	return runPairWith(t, test, srv, cli, pairOpts{})
}

// pairOpts changes runPair's defaults.
type pairOpts struct {
	timeout time.Duration // of the whole run; 2 minutes if 0
	// via, if set, returns the loopback port the client dials instead of
	// the server's (a proxy to addr).
	via func(addr string) int
	// cliCtx, if set, is the client's context (within the pair's).
	cliCtx func(context.Context) context.Context
}

// runPairWith is runPair with options.
func runPairWith(t *testing.T, test Test, srv, cli Options, po pairOpts) pairRun {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv.Test, cli.Test = test, test
	srv.Listener = ln
	cli.Server, cli.Port = "127.0.0.1", ln.Addr().(*net.TCPAddr).Port
	if po.via != nil {
		cli.Port = po.via(ln.Addr().String())
	}
	if po.timeout == 0 {
		po.timeout = 2 * time.Minute
	}
	for _, o := range []*Options{&srv, &cli} {
		if o.Bind == "" {
			o.Bind = "127.0.0.1:0"
		}
		if o.Logf == nil {
			o.Logf = t.Logf
		}
	}
	var sout, cout bytes.Buffer
	srv.Stdout, cli.Stdout = &sout, &cout
	ctx, cancel := context.WithTimeout(context.Background(), po.timeout)
	defer cancel()
	var r pairRun
	var wg sync.WaitGroup
	wg.Go(func() { r.srv, r.srvErr = Run(ctx, &srv) })
	cctx := ctx
	if po.cliCtx != nil {
		cctx = po.cliCtx(ctx)
	}
	r.cli, r.cliErr = Run(cctx, &cli)
	if r.cliErr != nil {
		ln.Close() // the client may have failed before connecting
	}
	wg.Wait()
	r.srvOut, r.cliOut = sout.String(), cout.String()
	if t.Failed() || r.srvErr != nil || r.cliErr != nil {
		t.Logf("server output:\n%s\nclient output:\n%s", r.srvOut, r.cliOut)
	}
	return r
}

func requireOK(t *testing.T, r pairRun) {
	t.Helper()
	require.NoError(t, r.cliErr, "client")
	require.NoError(t, r.srvErr, "server")
}

func TestToolsVerify(t *testing.T) {
	for _, tc := range []struct {
		test Test
		p    Params
	}{
		{WriteBW, Params{Iters: 50, Size: 10000}},
		{ReadBW, Params{Iters: 50, Size: 10000, TxDepth: 16, QPs: 2}},
		{SendBW, Params{Iters: 50, Size: 10000}},
		{AtomicBW, Params{Iters: 50, QPs: 2}},
		{AtomicBW, Params{Iters: 50, Atomic: CmpAndSwap}},
		{WriteLat, Params{Iters: 20, Size: 5000}},
		{ReadLat, Params{Iters: 20, Size: 5000}},
		{SendLat, Params{Iters: 20, Size: 5000}},
	} {
		t.Run(tc.test.String()+"/"+tc.p.Atomic, func(t *testing.T) {
			tc.p.Verify = true
			r := runPair(t, tc.test, Options{}, Options{Params: tc.p})
			requireOK(t, r)
			for _, res := range []*Result{r.cli, r.srv} {
				j := res.Report
				assert.True(t, j.Verified)
				assert.Equal(t, tc.test.String(), j.Tool)
				if tc.test.IsLat() {
					require.Len(t, j.Lat, 1)
					assert.Equal(t, tc.p.Iters, j.Lat[0].Iterations)
					assert.Positive(t, j.Lat[0].Typical)
				} else {
					require.Len(t, j.BW, 1)
					qps := int64(max(tc.p.QPs, 1))
					assert.Equal(t, tc.p.Iters*qps, j.BW[0].Iterations)
					assert.Positive(t, j.BW[0].BWAverage)
				}
				assert.NotZero(t, j.Counters["sent_pkts"])
			}
			atomic := tc.p.Atomic
			if atomic == "" {
				atomic = FetchAndAdd
			}
			for _, out := range []string{r.cliOut, r.srvOut} {
				assert.Contains(t, out, tc.test.title(atomic))
				if tc.test == AtomicBW {
					// No byte pattern: the counters' chain is what was checked.
					assert.Contains(t, out, "Verify          : every counter chain held (the n-th ")
					assert.NotContains(t, out, "every byte matched")
				} else {
					assert.Contains(t, out, "Verify          : every byte matched")
				}
			}
		})
	}
}

func TestToolsWithoutVerify(t *testing.T) {
	for _, tc := range []struct {
		test Test
		p    Params
	}{
		{WriteBW, Params{Iters: 200, QPs: 3, CQMod: 7, TxDepth: 20}},
		{ReadBW, Params{Iters: 100}},
		{SendBW, Params{Iters: 300, Size: 1000, QPs: 2, RxDepth: 64}},
		{AtomicBW, Params{Iters: 100}},
		{WriteLat, Params{Iters: 300}}, // 300 > 255: the polled byte wraps
		{SendLat, Params{Iters: 50, Size: 64}},
	} {
		t.Run(tc.test.String(), func(t *testing.T) {
			tc.p.Inline = -1
			r := runPair(t, tc.test, Options{}, Options{Params: tc.p})
			requireOK(t, r)
			assert.False(t, r.cli.Report.Verified)
			header := report.BWHeader(report.MBps)
			if tc.test.IsLat() {
				header = report.LatHeader
			}
			assert.Contains(t, r.cliOut, header)
			assert.Contains(t, r.srvOut, header)
		})
	}
}

func TestAllSizesWithVerify(t *testing.T) {
	r := runPair(t, SendBW, Options{}, Options{Params: Params{Iters: 5, All: true, Verify: true}})
	requireOK(t, r)
	require.Len(t, r.cli.Report.BW, 23)
	for i, row := range r.cli.Report.BW {
		assert.Equal(t, int64(2)<<i, row.Bytes)
		assert.Equal(t, int64(5), row.Iterations)
	}
	// Every row is printed on both sides.
	for _, out := range []string{r.cliOut, r.srvOut} {
		assert.Len(t, regexp.MustCompile(`(?m)^ \d+ +5 +`).FindAllString(out, -1), 23)
	}
}

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		test Test
		p    Params
	}{
		{WriteBW, Params{Size: 4096}},
		{SendBW, Params{Size: 4096}},                // the server learns the count at the end
		{WriteBW, Params{Size: 4096, Verify: true}}, // a stream ended by the client
		{WriteLat, Params{}},                        // the server stops when told
		{SendLat, Params{Verify: true}},
		{ReadLat, Params{}},
	} {
		t.Run(tc.test.String(), func(t *testing.T) {
			tc.p.Duration = 200 * time.Millisecond
			r := runPair(t, tc.test, Options{}, Options{Params: tc.p})
			requireOK(t, r)
			if tc.test.IsLat() {
				require.Len(t, r.cli.Report.Lat, 1)
				assert.Positive(t, r.cli.Report.Lat[0].Iterations)
				assert.Equal(t, r.cli.Report.Lat[0].Iterations, r.srv.Report.Lat[0].Iterations)
			} else {
				require.Len(t, r.cli.Report.BW, 1)
				assert.Positive(t, r.cli.Report.BW[0].Iterations)
				assert.Equal(t, r.cli.Report.BW[0].Iterations, r.srv.Report.BW[0].Iterations)
			}
		})
	}
}

// TestDurationBoundsADeadPath: with -D, a client whose packets are all
// lost (--impair loss=1: the peer never answers) fails once the duration
// and the drain limit have passed, naming -D, instead of retrying for
// ever (retry_cnt 7 is infinite, as on rxe); the server ends too. The
// client reports its own failure, not the server's, which may arrive
// first.
func TestDurationBoundsADeadPath(t *testing.T) {
	old := drainMin
	drainMin = 300 * time.Millisecond
	t.Cleanup(func() { drainMin = old })
	for _, test := range []Test{WriteBW, WriteLat, ReadLat} {
		t.Run(test.String(), func(t *testing.T) {
			start := time.Now()
			r := runPair(t, test, Options{}, Options{Params: Params{Size: 4096, Duration: 200 * time.Millisecond}, Impair: "loss=1"})
			require.Error(t, r.cliErr)
			assert.ErrorIs(t, r.cliErr, context.DeadlineExceeded)
			assert.ErrorContains(t, r.cliErr, "-D 200ms: the work requests still outstanding did not complete within 300ms")
			// Its own failure first, even when the server's (the same
			// bound, expiring at about the same time) arrived before.
			assert.NotRegexp(t, "^peer", r.cliErr.Error())
			assert.Error(t, r.srvErr, "the server cannot report a run that did not end")
			assert.Less(t, time.Since(start), 30*time.Second)
		})
	}
}

// TestServerMaxMem: a server takes -s and -q from its client, and refuses
// buffers over its --max-mem (here 1 MiB; the client asks 4 QPs × 1 MiB)
// with a message naming the flag, before it allocates anything.
func TestServerMaxMem(t *testing.T) {
	r := runPair(t, WriteBW, Options{MaxMem: 1 << 20}, Options{Params: Params{Size: 1 << 20, QPs: 4, Iters: 5}})
	require.Error(t, r.srvErr)
	assert.ErrorContains(t, r.srvErr, "buffers of 4194304 bytes (-q 4 × 1048576 bytes) are more than --max-mem 1048576 allows here")
	assert.Error(t, r.cliErr, "the client's run cannot happen")
	r = runPair(t, WriteBW, Options{MaxMem: 4 << 20}, Options{Params: Params{Size: 1 << 20, QPs: 4, Iters: 5}})
	requireOK(t, r)
}

// TestServerBadBindFailsAtOnce: a server whose --bind names an address
// that is not this host's (TEST-NET-2), or a UDP port in use, fails before
// it waits for a client instead of after one connected.
func TestServerBadBindFailsAtOnce(t *testing.T) {
	busy, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer busy.Close()
	for _, bind := range []string{"198.51.100.7", busy.LocalAddr().String()} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := Run(ctx, &Options{Test: WriteBW, Bind: bind, Port: 1})
		cancel()
		require.Error(t, err, bind)
		assert.ErrorContains(t, err, "--bind "+bind+": the device cannot bind there", bind)
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "it waited for a client")
	}
}

func writeTestFile(t *testing.T, n int) (path, sum string) {
	t.Helper()
	b := make([]byte, n)
	fillPattern(b, 99, 0)
	path = filepath.Join(t.TempDir(), "in.bin")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	s := sha256.Sum256(b)
	return path, hex.EncodeToString(s[:])
}

func TestFileTransfers(t *testing.T) {
	// A size that is not a multiple of the message size, through a ring
	// much smaller than the file (-s 8K -t 4: 4 slots of 8 KiB).
	in, sum := writeTestFile(t, 300_001)
	for _, test := range []Test{WriteBW, ReadBW, SendBW} {
		t.Run(test.String(), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out.bin")
			var srv, cli Options
			cli.Params = Params{Size: 8 << 10, TxDepth: 4}
			if test == ReadBW {
				srv.File, cli.Out = in, out
			} else {
				cli.File, srv.Out = in, out
			}
			r := runPair(t, test, srv, cli)
			requireOK(t, r)
			got, err := os.ReadFile(out)
			require.NoError(t, err)
			s := sha256.Sum256(got)
			assert.Equal(t, sum, hex.EncodeToString(s[:]))
			for _, res := range []*Result{r.srv, r.cli} {
				require.NotNil(t, res.Report.File)
				assert.Equal(t, sum, res.Report.File.SHA256)
				assert.Equal(t, sum, res.Report.File.Peer)
				assert.True(t, res.Report.File.Match)
				assert.Equal(t, int64(300_001), res.Report.File.Bytes)
			}
			assert.Equal(t, int64(37), r.cli.Report.BW[0].Iterations) // ceil(300001 / 8192)
			recv := r.srvOut
			if test == ReadBW {
				recv = r.cliOut
			}
			assert.Contains(t, recv, "SHA-256 "+sum+" (matches the sender's)")
		})
	}
}

// TestEmptyFile: an empty --file is refused as the demo refuses it
// (ErrUsage, before connecting: port 1 has no server), on the client of
// write-bw and send-bw and the server of read-bw: it would post nothing
// and report 0 iterations.
func TestEmptyFile(t *testing.T) {
	in, _ := writeTestFile(t, 0)
	for _, o := range []Options{
		{Test: WriteBW, Server: "127.0.0.1", Port: 1, File: in},
		{Test: SendBW, Server: "127.0.0.1", Port: 1, File: in},
		{Test: ReadBW, Port: 1, File: in},
	} {
		_, err := Run(context.Background(), &o)
		require.ErrorIs(t, err, ErrUsage, o.Test)
		assert.EqualError(t, err, "--file "+in+": empty, "+o.Test.String()+" needs bytes to move")
	}
}

func TestMismatchFailsBothSides(t *testing.T) {
	corruptAt := func(k0 int64, off int) func(int64, []byte) {
		return func(k int64, data []byte) {
			if k == k0 {
				data[off] ^= 0x40
			}
		}
	}
	t.Run("verify", func(t *testing.T) {
		testCorrupt = corruptAt(3, 123)
		defer func() { testCorrupt = nil }()
		r := runPair(t, WriteBW, Options{}, Options{Params: Params{Iters: 20, Size: 1000, Verify: true}})
		require.ErrorIs(t, r.srvErr, ErrMismatch)
		var me *MismatchError
		require.ErrorAs(t, r.srvErr, &me)
		assert.Equal(t, int64(123), me.Offset)
		assert.Equal(t, int64(3), me.Message)
		var pe *exchange.PeerError
		require.ErrorAs(t, r.cliErr, &pe)
		assert.Contains(t, pe.Reason, "message 3 differs at byte offset 123")
		assert.Contains(t, r.srv.Report.Error, "byte offset 123")
	})
	t.Run("file", func(t *testing.T) {
		in, _ := writeTestFile(t, 50_000)
		testCorrupt = corruptAt(2, 7)
		defer func() { testCorrupt = nil }()
		r := runPair(t, ReadBW, Options{File: in}, Options{Params: Params{Size: 4096}})
		require.ErrorIs(t, r.cliErr, ErrMismatch)
		var pe *exchange.PeerError
		require.ErrorAs(t, r.srvErr, &pe)
		assert.Contains(t, pe.Reason, "SHA-256")
		assert.False(t, r.cli.Report.File.Match)
	})
}

func TestJSONOutput(t *testing.T) {
	r := runPair(t, WriteBW, Options{JSON: true}, Options{JSON: true, ReportGbits: true, Params: Params{Iters: 20}})
	requireOK(t, r)
	for _, out := range []string{r.cliOut, r.srvOut} {
		var j report.JSON
		require.NoError(t, json.Unmarshal([]byte(out), &j), out)
		require.Len(t, j.BW, 1)
		assert.Equal(t, int64(65536), j.BW[0].Bytes)
		assert.Equal(t, 4096, j.MTU)
	}
	assert.Contains(t, r.cliOut, `"unit": "Gb/sec"`)
	assert.Contains(t, r.srvOut, `"side": "server"`)
}

// TestJSONOutputLat: a latency tool's --json rows are in microseconds and
// its unit says so on both sides, not the BW tools' MB/sec.
func TestJSONOutputLat(t *testing.T) {
	r := runPair(t, WriteLat, Options{JSON: true}, Options{JSON: true, Params: Params{Iters: 20}})
	requireOK(t, r)
	for _, out := range []string{r.cliOut, r.srvOut} {
		var j report.JSON
		require.NoError(t, json.Unmarshal([]byte(out), &j), out)
		assert.Equal(t, "usec", j.Unit, out)
		assert.Empty(t, j.BW, out)
	}
	var j report.JSON
	require.NoError(t, json.Unmarshal([]byte(r.cliOut), &j), r.cliOut)
	require.Len(t, j.Lat, 1)
	assert.Positive(t, j.Lat[0].Avg)
}

func TestMismatchedTools(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := Options{Test: ReadBW, Listener: ln, Bind: "127.0.0.1:0"}
	cli := Options{Test: WriteBW, Server: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port, Bind: "127.0.0.1:0"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var serr error
	var wg sync.WaitGroup
	wg.Go(func() { _, serr = Run(ctx, &srv) })
	_, cerr := Run(ctx, &cli)
	wg.Wait()
	assert.ErrorContains(t, serr, "the client runs write-bw, this side read-bw")
	var pe *exchange.PeerError
	require.ErrorAs(t, cerr, &pe)
	assert.Contains(t, pe.Reason, "the client runs write-bw")
}

func TestFileFlagsOnTheWrongSide(t *testing.T) {
	in, _ := writeTestFile(t, 10)
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Test: WriteBW, File: in}, "--file goes on the client"},
		{Options{Test: ReadBW, Server: "x", File: in}, "--file goes on the server"},
		{Options{Test: WriteBW, Server: "x", Out: "o"}, "--out goes on the server"},
		{Options{Test: WriteLat, Server: "x", File: in}, "for the BW tools"},
		{Options{Test: AtomicBW, Server: "x", File: in}, "do not apply"},
		{Options{Test: WriteBW, Server: "x", Impair: "loss=7"}, "--impair"},
		{Options{Test: WriteBW, Server: "x", Bind: "0.0.0.0"}, "specific IP"},
	} {
		_, err := Run(context.Background(), &tc.o)
		assert.ErrorContains(t, err, tc.want)
	}
}

func TestPeerGoneCancels(t *testing.T) {
	// A client that connects and says nothing, then leaves: the server
	// must not hang.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := Options{Test: WriteBW, Listener: ln, Bind: "127.0.0.1:0"}
	done := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), &srv)
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	c.Close()
	select {
	case err := <-done:
		assert.True(t, err != nil && !errors.Is(err, context.Canceled), "%v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("server did not notice its client left")
	}
}

// TestMTUAgreement: each side offers its own -m capped by its port's
// active MTU (loopback's: 4096) and both use the smaller (perftest's
// set_mtu and check_mtu), with softrdma's exchange and with perftest's;
// the banner shows the MTU the QPs use.
func TestMTUAgreement(t *testing.T) {
	for _, tc := range []struct {
		name     string
		srv, cli int // -m; 0: none
		want     int
	}{
		{"none", 0, 0, 4096},
		{"client smaller", 0, 512, 512},
		{"server smaller", 1024, 0, 1024},
		{"both", 2048, 256, 256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := Options{Params: Params{MTU: tc.srv}}
			cli := Options{Params: Params{MTU: tc.cli, Iters: 20, Size: 8192}}
			r := runPair(t, WriteBW, srv, cli)
			requireOK(t, r)
			line := fmt.Sprintf(" Mtu             : %d[B]\n", tc.want)
			assert.Contains(t, r.srvOut, line, "server")
			assert.Contains(t, r.cliOut, line, "client")
			assert.Equal(t, tc.want, r.srv.Report.MTU)
			assert.Equal(t, tc.want, r.cli.Report.MTU)
		})
		t.Run(tc.name+"/perftest", func(t *testing.T) {
			p := Params{Iters: 20, Size: 8192}
			srv, cli := Options{Params: p}, Options{Params: p, Perftest: true}
			srv.Params.MTU, cli.Params.MTU = tc.srv, tc.cli
			r := runPairPerftest(t, WriteBW, srv, cli)
			requireOK(t, r)
			line := fmt.Sprintf(" Mtu             : %d[B]\n", tc.want)
			assert.Contains(t, r.srvOut, line, "server")
			assert.Contains(t, r.cliOut, line, "client")
		})
	}
}

// TestReceiverClockStartsAtTheFirstMessage: the send-bw receiver's
// bandwidth, with --verify (a stream's sink) and without, is timed as
// perftest's receiver times it (set_on_first_rx_packet): from its first
// completion to its last, not from when it was ready to receive. Its
// clock (injected) reads an hour later once the first packet arrived, as
// if the sender had started an hour after the barrier: that hour is not
// in the receiver's time, whose messages then take a millisecond a poll.
func TestReceiverClockStartsAtTheFirstMessage(t *testing.T) {
	for _, verify := range []bool{false, true} {
		t.Run(fmt.Sprintf("verify=%v", verify), func(t *testing.T) {
			base := time.Unix(1_000_000, 0)
			testHookRunSide = func(s *session) {
				if !s.server {
					return
				}
				var polls atomic.Int64
				rx := &s.dev.Counters().RcvdPkts
				s.now = func() time.Time {
					if rx.Load() == 0 {
						return base
					}
					return base.Add(time.Hour + time.Duration(polls.Add(1))*time.Millisecond)
				}
			}
			t.Cleanup(func() { testHookRunSide = nil })
			r := runPair(t, SendBW, Options{}, Options{Params: Params{Size: 4096, Iters: 200, TxDepth: 16, Verify: verify}})
			requireOK(t, r)
			require.Len(t, r.srv.Report.BW, 1)
			el := r.srv.Report.BW[0].ElapsedSec
			assert.Positive(t, el)
			assert.Less(t, el, 60.0, "the hour before the first message is not the receiver's time")
		})
	}
}

// TestStreamEndsWithNoWorkRequestOutstanding: a side of a --file stream
// ends its run only once every work request it posted completed (the
// sink's credits included: their ACKs), as the stream's design promises
// (stream.go: the result goes to the peer only then); a credit still
// outstanding when the run returned had its ACK, or its retransmission
// on a loaded machine, reach a QP already destroyed: the demo's
// drop_unknown_qpn. Checked where each side's run returns, on QP 0 (the
// stream's), in many short rounds: -s 1K, a ring of 4 slots.
func TestStreamEndsWithNoWorkRequestOutstanding(t *testing.T) {
	in, _ := writeTestFile(t, 20_000)
	var mu sync.Mutex
	var bad []string
	testHookRunEnd = func(s *session, runErr error) {
		if runErr != nil {
			return
		}
		st := s.qps[0].RequesterState()
		if st.Posted != st.Completed {
			mu.Lock()
			bad = append(bad, fmt.Sprintf("%v server=%v: %d of %d work requests completed", s.test, s.server, st.Completed, st.Posted))
			mu.Unlock()
		}
	}
	t.Cleanup(func() { testHookRunEnd = nil })
	for _, test := range []Test{WriteBW, ReadBW, SendBW} {
		for range 5 {
			var srv, cli Options
			cli.Params = Params{Size: 1 << 10, TxDepth: 4}
			out := filepath.Join(t.TempDir(), "out.bin")
			if test == ReadBW {
				srv.File, cli.Out = in, out
			} else {
				cli.File, srv.Out = in, out
			}
			requireOK(t, runPair(t, test, srv, cli))
		}
	}
	assert.Empty(t, bad, "runs that returned with work requests outstanding")
}

// TestServerBindIPPort: a server whose --bind names an IP and a non-zero
// UDP port (docs/cli.md: "softrdma send-bw -R --bind 127.0.0.1:47911")
// serves its client on that port. The device opens at startup, and the
// server's probe of the address (checkBindable) found it taken by the
// device itself: every such server failed with "address already in use".
func TestServerBindIPPort(t *testing.T) {
	free, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	bind := free.LocalAddr().String()
	require.NoError(t, free.Close())
	r := runPair(t, WriteBW, Options{Bind: bind}, Options{Params: Params{Size: 4096, Iters: 5}})
	requireOK(t, r)
	assert.Contains(t, r.srvOut, "local address: IP 127.0.0.1 UDP "+strconv.Itoa(int(netip.MustParseAddrPort(bind).Port())))
}
