package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// closedTCPPort returns a loopback TCP port nothing listens on (one just
// closed), so that a client that got past its checks fails with
// "connection refused" and a check made before connecting is seen as such.
func closedTCPPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	require.NoError(t, ln.Close())
	return port
}

// TestFileIncompatibilitiesBeforeConnecting: --file with -a, with -q 2
// and with --perftest are refused as usage errors (exit 2) before the
// client connects (the port is closed: a check made only after
// connecting would end in "connection refused", exit 1), as --verify -q 2
// is; an empty --file likewise, in the words of the demo.
func TestFileIncompatibilitiesBeforeConnecting(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "text.txt")
	require.NoError(t, os.WriteFile(file, []byte("hello"), 0o644))
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, nil, 0o644))
	port := closedTCPPort(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"write-bw", "--file", file, "-a"}, "softrdma: --file and --all cannot be combined"},
		{[]string{"send-bw", "--file", file, "-q", "2"}, "softrdma: --file and --verify stream over one QP (-q 1)"},
		{[]string{"write-bw", "--file", file, "--perftest"}, "softrdma: --file and --out need a softrdma peer"},
		{[]string{"write-bw", "--verify", "-q", "2"}, "softrdma: --file and --verify stream over one QP (-q 1)"},
		{[]string{"write-bw", "--file", empty}, "softrdma: write-bw: --file " + empty + ": empty, write-bw needs bytes to move\n"},
		{[]string{"send-bw", "--file", empty, "-s", "64"}, "empty, send-bw needs bytes to move"},
	} {
		args := append(tc.args, "-p", port, "127.0.0.1")
		code, _, stderr := runCLI(t, args...)
		assert.Equal(t, exitUsage, code, "%v: %s", tc.args, stderr)
		assert.Contains(t, stderr, tc.want, tc.args)
		assert.NotContains(t, stderr, "connect", tc.args)
	}
	// read-bw's --file is the server's: an empty one fails it at once
	// (the server would otherwise wait for a client).
	code, _, stderr := runCLI(t, "read-bw", "--file", empty, "-p", port)
	assert.Equal(t, exitUsage, code, stderr)
	assert.Contains(t, stderr, "empty, read-bw needs bytes to move")
}

// TestBindPortTakenFailsAtStartup: an explicit --bind IP:PORT whose UDP
// port is taken fails at once (exit 1), on the server before it says it
// waits for a client, on the client before it connects, and the message
// names --bind with one "softrdma:" prefix.
func TestBindPortTakenFailsAtStartup(t *testing.T) {
	hold, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer hold.Close()
	bind := hold.LocalAddr().String()
	port := closedTCPPort(t)

	// The server: without the check it would wait for a client until
	// the context ends, so the context bounds a failing test.
	var o, e bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := run(ctx, []string{"write-bw", "--bind", bind, "-p", port}, &o, &e)
	assert.Equal(t, exitFail, code, e.String())
	assert.NoError(t, ctx.Err(), "the server waited instead of failing at startup")
	assert.NotContains(t, o.String(), "Waiting")
	assert.Contains(t, e.String(), "softrdma: write-bw: --bind "+bind+": the device cannot bind there: open "+bind+": ")
	assert.Contains(t, e.String(), "address already in use")
	assert.Equal(t, 1, strings.Count(e.String(), "softrdma:"), e.String())

	code, _, stderr := runCLI(t, "write-bw", "--bind", bind, "-p", port, "127.0.0.1")
	assert.Equal(t, exitFail, code, stderr)
	assert.Contains(t, stderr, "softrdma: write-bw: --bind "+bind+": the device cannot bind there: open ")
	assert.NotContains(t, stderr, "connection refused")
}

// TestRefusedConnectionHint: a refused connection says where to look.
func TestRefusedConnectionHint(t *testing.T) {
	port := closedTCPPort(t)
	code, _, stderr := runCLI(t, "write-bw", "-p", port, "127.0.0.1")
	assert.Equal(t, exitFail, code)
	assert.Contains(t, stderr, "connection refused (is the server running on port "+port+"? --connect-timeout retries until it is)\n")
}

// TestUsageErrorPointsToSubcommandHelp: a parse error of a subcommand
// points to that subcommand's help, which lists its flags; the top-level
// help lists none.
func TestUsageErrorPointsToSubcommandHelp(t *testing.T) {
	code, _, stderr := runCLI(t, "write-bw", "--bogus")
	assert.Equal(t, exitUsage, code)
	assert.True(t, strings.HasSuffix(stderr, " (see softrdma write-bw --help)\n"), stderr)
	code, _, stderr = runCLI(t, "rc-pingpong", "--bogus")
	assert.Equal(t, exitUsage, code)
	assert.True(t, strings.HasSuffix(stderr, " (see softrdma rc-pingpong --help)\n"), stderr)
	code, _, stderr = runCLI(t, "no-such-tool")
	assert.Equal(t, exitUsage, code)
	assert.True(t, strings.HasSuffix(stderr, " (see softrdma --help)\n"), stderr)
}

// TestItersRangeMessage: -n below perftest's 5, 0 included, says the
// real range in one message.
func TestItersRangeMessage(t *testing.T) {
	for _, n := range []string{"0", "4", "-5", "100000001", "x"} {
		code, _, stderr := runCLI(t, "write-bw", "-n", n, "h")
		assert.Equal(t, exitUsage, code, n)
		assert.Equal(t, "softrdma: --iters: \""+n+"\": must be 5 to 100000000 (see softrdma write-bw --help)\n", stderr, n)
	}
}

// runPair runs a server with srvArgs and a client with cliArgs (the
// client retries until the server listens: --connect-timeout, no
// sleeps) on a free TCP port, and returns both sides' outputs.
func runPair(t *testing.T, srvArgs, cliArgs []string) (srvCode int, srvOut, srvErr string, cliCode int, cliOut, cliErr string) {
	t.Helper()
	port := closedTCPPort(t)
	var wg sync.WaitGroup
	wg.Go(func() { srvCode, srvOut, srvErr = runCLI(t, append(srvArgs, "-p", port)...) })
	cliCode, cliOut, cliErr = runCLI(t, append(cliArgs, "-p", port, "--connect-timeout", "60s")...)
	wg.Wait()
	return
}

// TestDurationRunNoticeAndPeak: -D with an explicit -n runs for the time
// (perftest's -D sets iters to 0) and says on stderr that -n is ignored;
// a -D run reports a BW peak of 0 on both sides, --verify's stream too
// (perftest's -D sets noPeak).
func TestDurationRunNoticeAndPeak(t *testing.T) {
	srvCode, srvOut, srvErr, cliCode, cliOut, cliErr := runPair(t,
		[]string{"write-bw", "--bind", "127.0.0.1:0", "--json"},
		[]string{"write-bw", "-D", "100ms", "-n", "7", "-s", "4096", "--verify", "--json", "127.0.0.1"})
	require.Equal(t, exitOK, srvCode, srvErr)
	require.Equal(t, exitOK, cliCode, cliErr)
	assert.Contains(t, cliErr, "softrdma: -n 7 ignored: -D 100ms runs for the time, however many iterations fit\n")
	for side, out := range map[string]string{"server": srvOut, "client": cliOut} {
		var r struct {
			BW []struct {
				Iterations int64   `json:"iterations"`
				Peak       float64 `json:"bw_peak"`
				Avg        float64 `json:"bw_average"`
			} `json:"bw"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &r), side)
		require.Len(t, r.BW, 1, side)
		assert.Positive(t, r.BW[0].Iterations, side)
		assert.Positive(t, r.BW[0].Avg, side)
		assert.Zero(t, r.BW[0].Peak, side)
	}

	// Without -n, no notice.
	_, _, srvErr, cliCode, _, cliErr = runPair(t,
		[]string{"write-bw", "--bind", "127.0.0.1:0"},
		[]string{"write-bw", "-D", "100ms", "-s", "4096", "127.0.0.1"})
	require.Equal(t, exitOK, cliCode, cliErr+srvErr)
	assert.NotContains(t, cliErr, "ignored")
}

// TestFileNoticeSingular: a file of one message says "1 message".
func TestFileNoticeSingular(t *testing.T) {
	file := filepath.Join(t.TempDir(), "text.txt")
	require.NoError(t, os.WriteFile(file, []byte("hello"), 0o644))
	srvCode, _, srvErr, cliCode, _, cliErr := runPair(t,
		[]string{"write-bw", "--bind", "127.0.0.1:0"},
		[]string{"write-bw", "--file", file, "-n", "7", "127.0.0.1"})
	require.Equal(t, exitOK, srvCode, srvErr)
	require.Equal(t, exitOK, cliCode, cliErr)
	assert.Contains(t, cliErr, "softrdma: -n 7 ignored: a --file run moves the whole file, 1 message of -s 65536 bytes\n")
}

// TestPerftestClientRefusesItsOwnDevice: perftest's exchange carries no
// port, so a --perftest client takes its server's device to be on UDP
// 4791. With the server's device elsewhere and the client's on 4791 of
// the same IP, that is the client's own device: refused at once with
// what happened, instead of WRITEs to itself that time out as a dead
// peer; the server warns that a perftest peer sends to 4791.
func TestPerftestClientRefusesItsOwnDevice(t *testing.T) {
	const ip = "127.0.0.7"
	probe, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(ip), Port: 4791})
	if err != nil {
		t.Skipf("%s:4791 is taken: %v", ip, err)
	}
	require.NoError(t, probe.Close())
	srvCode, _, srvErr, cliCode, _, cliErr := runPair(t,
		[]string{"write-bw", "--bind", ip + ":0", "--perftest", "--idle-timeout", "100ms"},
		[]string{"write-bw", "--bind", ip, "--perftest", "-n", "5", "-s", "64", ip})
	assert.Equal(t, exitFail, cliCode, cliErr)
	assert.Contains(t, cliErr, "the peer's device is taken to be at "+ip+":4791 (perftest's exchange carries no port, so UDP 4791), which is this side's own device")
	assert.NotContains(t, cliErr, "dead")
	assert.Equal(t, exitFail, srvCode, srvErr)
	assert.Equal(t, 1, strings.Count(srvErr, "softrdma: warning: this device is on UDP "), srvErr)
	assert.Contains(t, srvErr, ", not 4791: perftest's exchange carries no port, so a perftest peer sends to 4791\n")
}
