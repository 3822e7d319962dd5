package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/perf"
)

// TestDurationDecimalSeconds: -D is "this many seconds (or a Go duration
// like 500ms)", so a decimal number of seconds is one too: -D 0.5 is
// 500 ms and -D 2.5 is 2.5 s (it used to be refused as "not a number of
// seconds"), and a whole number too large for 32 bits is out of range,
// not "not a number". Text that is neither still names both forms.
func TestDurationDecimalSeconds(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want time.Duration
	}{
		{"0.5", 500 * time.Millisecond},
		{"2.5", 2500 * time.Millisecond},
		{".25", 250 * time.Millisecond},
		{"3.", 3 * time.Second},
		{"2", 2 * time.Second},
		{"1.5s", 1500 * time.Millisecond},
	} {
		c, cmd, err := parse(t, "write-bw", "-D", tc.arg, "127.0.0.2")
		require.NoError(t, err, tc.arg)
		test, err := perf.ParseTest(cmd)
		require.NoError(t, err)
		o, err := c.tool(test).options(test)
		require.NoError(t, err, tc.arg)
		assert.Equal(t, tc.want, o.Params.Duration, tc.arg)
	}
	for _, tc := range []struct{ arg, want string }{
		{"0.05", "--duration 50ms (-D): must be 100ms to 24h0m0s"},
		{"0.0", `--duration: "0.0": must be 100ms to 24h0m0s`},
		{"4294967296", "--duration 1193046h28m16s (-D): must be 100ms to 24h0m0s"},
		{"abc", `--duration: "abc" is not a number of seconds (such as 2 or 0.5) or a Go duration (such as 500ms)`},
		{"1,5", `--duration: "1,5" is not a number of seconds (such as 2 or 0.5) or a Go duration (such as 500ms)`},
		{"1e3", `--duration: "1e3" is not a number of seconds (such as 2 or 0.5) or a Go duration (such as 500ms)`},
	} {
		code, _, stderr := runCLI(t, "write-bw", "-D", tc.arg, "-p", closedTCPPort(t), "127.0.0.1")
		assert.Equal(t, exitUsage, code, "%s: %s", tc.arg, stderr)
		assert.Contains(t, stderr, tc.want, tc.arg)
	}
}

// TestPingpongIdleNamesThePort: rc-pingpong's exchange carries no port,
// so each side sends to its peer's IP at UDP 4791. Two sides whose
// devices are bound off 4791 (--bind IP:PORT) never complete an exchange;
// the idle timeout used to blame the peer ("stopped or went away ... a
// smaller -n?"). With no exchange done and this side's device off 4791,
// it says that instead.
func TestPingpongIdleNamesThePort(t *testing.T) {
	port := closedTCPPort(t)
	subnet := fmt.Sprintf("127.%d.%d.", 100+rand.IntN(100), rand.IntN(250))
	var srvCode int
	var srvErr string
	var wg sync.WaitGroup
	wg.Go(func() {
		srvCode, _, srvErr = runCLI(t, "rc-pingpong", "-g", "1", "-p", port, "--bind", subnet+"2:0",
			"-n", "5", "--idle-timeout", "1s")
	})
	cliCode, _, cliErr := runCLI(t, "rc-pingpong", "-g", "1", "-p", port, "--bind", subnet+"1:0",
		"--connect-timeout", "30s", "-n", "5", "--idle-timeout", "1s", "127.0.0.1")
	wg.Wait()
	for _, side := range []struct {
		code int
		err  string
	}{{srvCode, srvErr}, {cliCode, cliErr}} {
		assert.Equal(t, exitFail, side.code, side.err)
		assert.Contains(t, side.err, "rc-pingpong: no completion for 1s (--idle-timeout) after 0 of 5 exchanges (-n 5): "+
			"this side's device is on UDP ")
		assert.Contains(t, side.err, ", not 4791, and ibv_rc_pingpong's exchange carries no port: the peer sends to 4791 "+
			"(give each side its own IP with --bind IP, both on UDP 4791)")
		assert.NotContains(t, side.err, "smaller -n", side.err)
		// The warning names the port bound, not --bind's 0.
		assert.Contains(t, side.err, "rc-pingpong: the device binds UDP port ")
		assert.NotContains(t, side.err, "binds UDP port 0;")
	}
}

// TestAllIgnoresSizeNotice: -a runs every size from 2 to 2^23 bytes
// whatever -s says (perftest's force_dependecies sets size to MAX_SIZE
// under RUN_ALL, silently); a client given both says on stderr that -s
// is ignored, as it does for -n under -D.
func TestAllIgnoresSizeNotice(t *testing.T) {
	srvCode, _, srvErr, cliCode, cliOut, cliErr := runPair(t,
		[]string{"write-bw", "--bind", "127.0.0.1:0"},
		[]string{"write-bw", "-a", "-s", "4096", "-n", "5", "127.0.0.1"})
	require.Equal(t, exitOK, srvCode, srvErr)
	require.Equal(t, exitOK, cliCode, cliErr)
	assert.Contains(t, cliErr, "softrdma: -s 4096 ignored: -a runs every size from 2 to 8388608 bytes\n")
	assert.Contains(t, cliOut, " 8388608    5 ")
	// Without -s, nothing to say.
	srvCode, _, srvErr, cliCode, _, cliErr = runPair(t,
		[]string{"read-bw", "--bind", "127.0.0.1:0"},
		[]string{"read-bw", "-a", "-n", "5", "127.0.0.1"})
	require.Equal(t, exitOK, srvCode, srvErr)
	require.Equal(t, exitOK, cliCode, cliErr)
	assert.NotContains(t, cliErr, "ignored")
}

// TestRefusedAfterConnectTimeoutSaysItRetried: a connection still refused
// when --connect-timeout ends says that it was retried for that long; it
// used to read as a single refused attempt.
func TestRefusedAfterConnectTimeoutSaysItRetried(t *testing.T) {
	port := closedTCPPort(t)
	start := time.Now()
	code, _, stderr := runCLI(t, "write-bw", "-p", port, "--connect-timeout", "300ms", "127.0.0.1")
	assert.Equal(t, exitFail, code)
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "it retried")
	assert.Contains(t, stderr, "connection refused (still, after retrying for --connect-timeout 300ms: is the server running on port "+port+"?)\n")
}

// TestIPv6ServerInFreshNetns follows the README's two-host recipe with
// IPv6 addresses: `ip netns add` leaves lo down, so a Go process in the
// namespace with IPv4 and IPv6 addresses on its veth finds no IPv6
// loopback, and its "tcp" ":18515" listener is IPv4 only; a server whose device is IPv6 (--bind fdXX::1) then refused
// its client ("connect: connection refused") while it waited for one.
// The exchange's listener of an IPv6 device is IPv6 (hostaddr.ListenAll):
// send-bw and rc-pingpong complete over the veth pair. Needs root.
func TestIPv6ServerInFreshNetns(t *testing.T) {
	skipWithoutNetns(t)
	_, bin := buildTool(t)
	id := os.Getpid() % 200
	h := &hosts{
		nsA: fmt.Sprintf("srdma6-a-%d", os.Getpid()),
		nsB: fmt.Sprintf("srdma6-b-%d", os.Getpid()),
		ipA: fmt.Sprintf("fd%02x::1", id),
		ipB: fmt.Sprintf("fd%02x::2", id),
	}
	vA, vB := fmt.Sprintf("s6v%da", id), fmt.Sprintf("s6v%db", id)
	ip := vethPair(t, h.nsA, h.nsB, vA, vB)
	// As the README's recipe: lo stays down, IPv4 addresses on the veth
	// (with them, Go's listener on ":port" is IPv4 only; with IPv6
	// addresses alone it happens to be dual-stack), and IPv6 ones added.
	for i, c := range []struct{ ns, dev, addr string }{{h.nsA, vA, h.ipA}, {h.nsB, vB, h.ipB}} {
		ip("-n", c.ns, "link", "set", c.dev, "mtu", "9000", "up")
		ip("-n", c.ns, "addr", "add", fmt.Sprintf("10.234.%d.%d/24", id, i+1), "dev", c.dev)
		ip("-n", c.ns, "addr", "add", c.addr+"/64", "dev", c.dev, "nodad")
	}
	_, cli := h.runFor(t, 2*time.Minute, bin,
		[]string{"send-bw", "--bind", h.ipA},
		[]string{"send-bw", h.ipA, "--bind", h.ipB, "-n", "50", "--verify"})
	assert.Contains(t, cli, "Verify          : every byte matched")
	_, cli = h.runFor(t, 2*time.Minute, bin,
		[]string{"rc-pingpong", "-g", "1", "--bind", h.ipA, "-n", "20"},
		[]string{"rc-pingpong", "-g", "1", "--bind", h.ipB, "-n", "20", h.ipA})
	assert.Contains(t, cli, "20 iters in ")
}
