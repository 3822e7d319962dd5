package perf

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/cmchan"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/softrdmatest"
	"github.com/softrdma/softrdma/transport/conn"
)

// TestCMConnectNoServer: a -R client whose server's device does not answer
// (no CM there: every REQ is dropped) says so once on stderr after the
// CM's first retry, and gives up when --connect-timeout expires (making a
// new attempt when the CM's own 15 retries end sooner), naming the
// address; without --connect-timeout it waits for the CM's retries, 71 s.
// It runs on synctest's clock, over the in-memory pipe (devices
// 127.0.0.1:4791 and 127.0.0.2:4791).
func TestCMConnectNoServer(t *testing.T) {
	const step = 4096*time.Nanosecond<<20 + 2*(4096*time.Nanosecond<<14) // the CM's wait for an answer
	for _, tc := range []struct {
		name     string
		timeout  time.Duration
		took     time.Duration
		progress string // "" for no line
		err      string
	}{
		{"no --connect-timeout", 0, 16 * step, "retrying (up to 15 times, 71s)",
			"connect to the server: rdma_cm 127.0.0.1:18515 (device 127.0.0.1:4791): rdmacm: no answer from the peer (CM response timeout)"},
		{"before the first retry", 2 * time.Second, 2 * time.Second, "",
			"connect to the server: no CM reply from rdma_cm 127.0.0.1:18515 (device 127.0.0.1:4791) within --connect-timeout 2s: is a server running there with -R?"},
		{"after a retry", 10 * time.Second, 10 * time.Second, "retrying (until --connect-timeout 10s)",
			"connect to the server: no CM reply from rdma_cm 127.0.0.1:18515 (device 127.0.0.1:4791) within --connect-timeout 10s: is a server running there with -R?"},
		{"longer than the CM's retries", 100 * time.Second, 100 * time.Second, "retrying (until --connect-timeout 1m40s)",
			"connect to the server: no CM reply from rdma_cm 127.0.0.1:18515 (device 127.0.0.1:4791) within --connect-timeout 1m40s: is a server running there with -R?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true, NoPcap: true, NoConnect: true})
				var mu sync.Mutex
				var lines []string
				var at []time.Duration
				start := time.Now()
				logf := func(format string, args ...any) {
					mu.Lock()
					defer mu.Unlock()
					lines = append(lines, strings.TrimPrefix(fmt.Sprintf(format, args...), "softrdma: "))
					at = append(at, time.Since(start))
				}
				_, err := Run(context.Background(), &Options{Test: WriteBW, Server: "127.0.0.1", RDMACM: true,
					Device: p.B.Dev, ConnectTimeout: tc.timeout, Logf: logf})
				require.EqualError(t, err, tc.err)
				assert.Equal(t, tc.took.Round(cmProgressEvery), time.Since(start).Round(cmProgressEvery))
				mu.Lock()
				defer mu.Unlock()
				var progress []string
				for i, l := range lines {
					if strings.HasPrefix(l, "no CM reply") {
						progress = append(progress, l)
						assert.InDelta(t, float64(step), float64(at[i]), float64(cmProgressEvery),
							"said after the first retry")
					}
				}
				if tc.progress == "" {
					assert.Empty(t, progress)
					return
				}
				require.Len(t, progress, 1, "once, not per retry: %q", lines)
				assert.Equal(t, "no CM reply from 127.0.0.1:18515 (device 127.0.0.1:4791) yet; "+tc.progress, progress[0])
			})
		})
	}
}

// runPairCM is runPair with -R: two devices of this process on loopback
// (ephemeral UDP ports: the client reaches the server's with --roce-port),
// the server's CM on rdma_cm port 47213.
func runPairCM(t *testing.T, test Test, srv, cli Options) pairRun {
	t.Helper()
	open := func() *softrdma.Device {
		d, err := softrdma.Open(softrdma.Config{Addr: netip.MustParseAddrPort("127.0.0.1:0"), Logf: t.Logf})
		require.NoError(t, err)
		t.Cleanup(func() { d.Close() })
		return d
	}
	sd, cd := open(), open()
	srv.Test, cli.Test = test, test
	srv.RDMACM, cli.RDMACM = true, true
	srv.Device, cli.Device = sd, cd
	srv.Bind, srv.Port = "127.0.0.1", 47213
	cli.Server, cli.Port, cli.RoCEPort = "127.0.0.1", 47213, int(sd.LocalAddr().Port())
	srv.Logf, cli.Logf = t.Logf, t.Logf
	ready := make(chan struct{})
	srv.Ready = func(net.Addr) { close(ready) }
	var sout, cout bytes.Buffer
	srv.Stdout, cli.Stdout = &sout, &cout
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var r pairRun
	var wg sync.WaitGroup
	wg.Go(func() { r.srv, r.srvErr = Run(ctx, &srv) })
	select {
	case <-ready:
		r.cli, r.cliErr = Run(ctx, &cli)
	case <-ctx.Done():
	}
	wg.Wait()
	r.srvOut, r.cliOut = sout.String(), cout.String()
	if t.Failed() || r.srvErr != nil || r.cliErr != nil {
		t.Logf("server output:\n%s\nclient output:\n%s", r.srvOut, r.cliOut)
	}
	return r
}

// TestRDMACMWithoutConnectTimeout: a -R client without --connect-timeout
// connects and runs (the watch of the CM's retries ends with the dial: it
// once kept a connected client waiting for ever).
func TestRDMACMWithoutConnectTimeout(t *testing.T) {
	requireOK(t, runPairCM(t, WriteBW, Options{}, Options{Params: Params{Size: 4096, Iters: 50}}))
}

// TestIdleTimeoutBoundsADeadPathRDMACM: with -R the exchange runs over the
// path the data takes, so when that path dies in the middle of an -n run
// (every packet of the client's device lost once both sides started it) the
// active side cannot tell its peer: it fails on --idle-timeout without
// waiting for the peer to acknowledge its result, and the passive side
// (write-bw's server) fails on its own once nothing arrived for
// --idle-timeout; neither waits for ever.
func TestIdleTimeoutBoundsADeadPathRDMACM(t *testing.T) {
	t.Cleanup(func() { testHookRunSide = nil })
	const limit = 300 * time.Millisecond
	for _, tc := range []struct {
		test     Test
		perftest bool   // perftest's exchange over the channel
		srv      string // the server's error
	}{
		{WriteBW, false, `^nothing received from the peer for 300ms \(--idle-timeout\) during the run: the peer or the path to it is probably dead \(with -R `},
		{SendBW, false, `^no completion for 300ms \(--idle-timeout\) after 0 of 50 iterations \(-n 50\): `},
		{WriteBW, true, `^nothing received from the peer for 300ms \(--idle-timeout\) during the run: the peer or the path to it is probably dead \(with -R `},
		{SendBW, true, `^no completion for 300ms \(--idle-timeout\) after 0 of 50 iterations \(-n 50\): `},
	} {
		name := tc.test.String()
		if tc.perftest {
			name += "/perftest"
		}
		t.Run(name, func(t *testing.T) {
			// The path dies once both sides are in the run (the server's
			// last message of the exchange acknowledged).
			serverIn := make(chan struct{})
			testHookRunSide = func(s *session) {
				if s.server {
					close(serverIn)
					return
				}
				select {
				case <-serverIn:
				case <-time.After(20 * time.Second):
					t.Error("the server did not start its run")
				}
				assert.NoError(t, s.dev.SetImpairment(&conn.Impairment{Loss: 1}))
			}
			start := time.Now()
			p := Params{Size: 4096, Iters: 50}
			r := runPairCM(t, tc.test, Options{Params: p, IdleTimeout: limit},
				Options{Params: p, IdleTimeout: limit, Perftest: tc.perftest})
			require.Error(t, r.cliErr)
			assert.Regexp(t, `^no completion for 300ms \(--idle-timeout\) after 0 of 50 iterations \(-n 50\): `+
				`the peer or the path to it is probably dead`, r.cliErr.Error())
			require.Error(t, r.srvErr)
			assert.Regexp(t, tc.srv, r.srvErr.Error())
			assert.Less(t, time.Since(start), 20*time.Second)
		})
	}
}

// TestIdleTimeoutPerftestExchange: with perftest's exchange (over TCP) the
// side waiting for completions fails on --idle-timeout too when every
// packet is lost (--impair loss=1 on the client), instead of waiting for
// ever; its peer learns of it when the exchange closes.
func TestIdleTimeoutPerftestExchange(t *testing.T) {
	const limit = 300 * time.Millisecond
	for _, tc := range []struct {
		test Test
		p    Params
		want string
	}{
		{WriteBW, Params{Size: 4096, Iters: 50}, `after 0 of 50 iterations \(-n 50\)`},
		{ReadLat, Params{Size: 64, Iters: 50}, `after 0 of 50 iterations \(-n 50\)`},
		{SendLat, Params{Size: 64, Iters: 50}, `after 0 of 50 iterations \(-n 50\)`},
		{SendBW, Params{Size: 4096, Iters: 50}, `after 0 of 50 iterations \(-n 50\)`},
	} {
		t.Run(tc.test.String(), func(t *testing.T) {
			start := time.Now()
			r := runPairPerftest(t, tc.test, Options{Params: tc.p, IdleTimeout: limit},
				Options{Params: tc.p, IdleTimeout: limit, Perftest: true, Impair: "loss=1"})
			require.Error(t, r.cliErr)
			assert.Regexp(t, `^no completion for 300ms \(--idle-timeout\) `+tc.want+`: the peer or the path to it is probably dead`,
				r.cliErr.Error())
			require.Error(t, r.srvErr)
			assert.Less(t, time.Since(start), 20*time.Second)
		})
	}
}

// TestRDMACMSetupBoundsASilentPeer: with -R, a client whose CM connects
// the exchange's channel and which then says nothing (no version, no
// hello) fails the server's run after the setup time limit, as over TCP,
// naming the peer and the limit, instead of holding it for ever.
func TestRDMACMSetupBoundsASilentPeer(t *testing.T) {
	open := func() *softrdma.Device {
		d, err := softrdma.Open(softrdma.Config{Addr: netip.MustParseAddrPort("127.0.0.1:0"), Logf: t.Logf})
		require.NoError(t, err)
		t.Cleanup(func() { d.Close() })
		return d
	}
	sd, cd := open(), open()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), &Options{Test: WriteBW, RDMACM: true, Device: sd, Bind: "127.0.0.1", Port: 47219,
			SetupTimeout: 300 * time.Millisecond, Logf: t.Logf, Stdout: io.Discard, Ready: func(net.Addr) { close(ready) }})
		done <- err
	}()
	<-ready
	cm, err := rdmacm.Open(cd, rdmacm.Options{Logf: t.Logf})
	require.NoError(t, err)
	defer cm.Close()
	pd, err := cd.AllocPD()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, err := cmchan.Dial(ctx, cm, cd, pd, netip.MustParseAddrPort("127.0.0.1:47219"),
		rdmacm.ConnParam{RetryCount: 7, RNRRetryCount: 7, RoCEPort: sd.LocalAddr().Port()})
	require.NoError(t, err)
	defer ch.Close()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.EqualError(t, err, "the peer at 127.0.0.1 connected but did not complete the exchange within 300ms: "+
			"is it a softrdma or perftest peer?")
	case <-ctx.Done():
		t.Fatal("the -R server waits for ever for a silent client")
	}
}

// TestRDMACMPSNsAgree: with -R the CM chooses the PSNs and each side
// reads them back from its QP (ibv_query_qp, QP.Attr) before any traffic:
// the local PSN (sq_psn) and QPN one side prints are the remote ones the
// other prints (rq_psn, dest_qp_num). Attr reports live PSNs, as
// rxe_qp_to_attr does; read before the first packet they are still the
// ones the CM set.
func TestRDMACMPSNsAgree(t *testing.T) {
	r := runPairCM(t, WriteBW, Options{}, Options{Params: Params{Size: 4096, Iters: 50}})
	requireOK(t, r)
	addr := regexp.MustCompile(`(local|remote) address: IP \S+ UDP \d+ QPN (0x[0-9a-f]+) PSN (0x[0-9a-f]+)`)
	parse := func(out string) (local, remote [2]string) {
		m := addr.FindAllStringSubmatch(out, -1)
		require.Len(t, m, 2, "one local and one remote address line in:\n%s", out)
		for _, l := range m {
			if l[1] == "local" {
				local = [2]string{l[2], l[3]}
			} else {
				remote = [2]string{l[2], l[3]}
			}
		}
		return local, remote
	}
	sl, sr := parse(r.srvOut)
	cl, cr := parse(r.cliOut)
	assert.Equal(t, sl, cr, "the server's QPN and sq_psn are the client's remote ones")
	assert.Equal(t, cl, sr, "the client's QPN and sq_psn are the server's remote ones")
}
