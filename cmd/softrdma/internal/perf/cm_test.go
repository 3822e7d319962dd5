package perf

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
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
