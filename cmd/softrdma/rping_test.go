package main

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRPingFlags(t *testing.T) {
	c, cmd, err := parse(t, "rping", "-s")
	require.NoError(t, err)
	require.Equal(t, "rping", cmd)
	// rping.c's defaults: port 7174, size 64, count 0 (forever); and
	// softrdma's --idle-timeout 10s, as the other tools'.
	assert.Equal(t, rpingCmd{Server: true, Port: 7174, Size: 64, IdleTimeout: 10 * time.Second}, c.RPing)
	c, _, err = parse(t, "rping", "-c", "-a", "192.168.77.10", "-I", "192.168.77.1", "-p", "9000", "-C", "3",
		"-S", "100", "-v", "-V", "-d", "-q")
	require.NoError(t, err)
	assert.Equal(t, rpingCmd{Client: true, Addr: "192.168.77.10", Source: "192.168.77.1", Port: 9000, Count: 3,
		Size: 100, Verbose: true, Validate: true, Debug: true, SelfQP: true, IdleTimeout: 10 * time.Second}, c.RPing)

	for _, args := range [][]string{
		{"rping"},                      // neither -s nor -c
		{"rping", "-s", "-c"},          // both
		{"rping", "-c"},                // no -a
		{"rping", "-s", "-S", "25"},    // below RPING_MIN_BUFSIZE (26)
		{"rping", "-s", "-S", "65536"}, // above RPING_BUFSIZE - 1
		{"rping", "-c", "-a", "::1", "-C", "-1"},
		{"rping", "-s", "-P"}, // persistent server: not supported
		{"rping", "-s", "--bind", "nonsense"},
		{"rping", "-s", "--idle-timeout", "1ms"}, // 0 or at least 100ms, as every tool's
	} {
		code, _, stderr := runCLI(t, args...)
		assert.Equal(t, exitUsage, code, "%v: %s", args, stderr)
	}
}

// rxeServerLines is what rxe's rping server printed for `rping -c -C 3 -S
// 64 -v` (shared/rxe-testbed/captures/logs/rping.server.log, lines 11-13).
var rxeServerLines = []string{
	"server ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr",
	"server ping data: rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs",
	"server ping data: rdma-ping-2: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrst",
}

// TestRPingLoopback runs `softrdma rping -s` and `softrdma rping -c` against
// each other on two loopback addresses: the server prints exactly what
// rxe's rping server printed for the same client flags, the client
// validates every echo, and the client's disconnect ends the server.
func TestRPingLoopback(t *testing.T) {
	// A free UDP port for both devices (127.0.0.1 and 127.0.0.2), and a
	// free rdma_cm port.
	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	udp := strconv.Itoa(u.LocalAddr().(*net.UDPAddr).Port)
	require.NoError(t, u.Close())
	cmPort := strconv.Itoa(7174 + int(time.Now().UnixNano()%1000))

	var srvCode int
	var srvOut, srvErr string
	var wg sync.WaitGroup
	wg.Go(func() {
		srvCode, srvOut, srvErr = runCLI(t, "rping", "-s", "-a", "127.0.0.1", "-p", cmPort, "-v",
			"--bind", "127.0.0.1:"+udp)
	})
	// The client is refused ("invalid service ID") until the server
	// listens, as rping's would be; --connect-timeout tries again.
	code, out, stderr := runCLI(t, "rping", "-c", "-a", "127.0.0.1", "-p", cmPort, "-C", "3", "-S", "64", "-v", "-V",
		"--bind", "127.0.0.2:"+udp, "--roce-port", udp, "--timeout", "20s", "--connect-timeout", "30s")
	wg.Wait()
	require.Equal(t, exitOK, code, "client: %s", stderr)
	require.Equal(t, exitOK, srvCode, "server: %s", srvErr)
	assert.Equal(t, rxeServerLines, strings.Split(strings.TrimSpace(srvOut), "\n"))
	var want []string
	for _, l := range rxeServerLines {
		want = append(want, strings.TrimPrefix(l, "server "))
	}
	assert.Equal(t, want, strings.Split(strings.TrimSpace(out), "\n"))
	assert.Contains(t, srvErr, "server DISCONNECT EVENT...")
}

// TestRPingTimeoutMessage: a client whose server never answers gives up
// after --timeout saying so, not with Go's "context deadline exceeded".
func TestRPingTimeoutMessage(t *testing.T) {
	deaf, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}) // takes the CM's MADs, answers none
	require.NoError(t, err)
	defer deaf.Close()
	roce := strconv.Itoa(deaf.LocalAddr().(*net.UDPAddr).Port)
	code, _, stderr := runCLI(t, "rping", "-c", "-a", "127.0.0.1", "-p", "22550", "--timeout", "300ms",
		"--bind", "127.0.0.1:0", "--roce-port", roce)
	assert.Equal(t, exitFail, code)
	assert.Equal(t, "softrdma: rping: connect error: no server answered at 127.0.0.1:22550 within --timeout 300ms\n", stderr)
}

// firstPing is a writer that closes seen at the first "ping data" line.
type firstPing struct {
	mu   sync.Mutex
	buf  strings.Builder
	seen chan struct{}
}

func (w *firstPing) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), "ping data: ") && w.seen != nil {
		close(w.seen)
		w.seen = nil
	}
	return len(p), nil
}

// TestRPingServerKilledIdleTimeout: a client running until interrupted
// (-C 0) whose server is killed with SIGKILL fails once --idle-timeout
// passes without a completion or a packet, naming the flag; it waited
// for ever (the real rping's kernel CM sends a DREQ when its process
// dies; softrdma's CM lives in the process, and the QP retries for ever,
// retry_cnt 7 as on rxe).
func TestRPingServerKilledIdleTimeout(t *testing.T) {
	_, bin := buildTool(t)
	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	udp := strconv.Itoa(u.LocalAddr().(*net.UDPAddr).Port)
	require.NoError(t, u.Close())
	cmPort := strconv.Itoa(8174 + int(time.Now().UnixNano()%1000))
	srv := exec.Command(bin, "rping", "-s", "-a", "127.0.0.1", "-p", cmPort, "--bind", "127.0.0.1:"+udp)
	require.NoError(t, srv.Start())
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })

	seen := make(chan struct{})
	out := &firstPing{seen: seen}
	var e strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	go func() {
		select {
		case <-seen:
			srv.Process.Signal(syscall.SIGKILL)
		case <-ctx.Done():
		}
	}()
	code := run(ctx, []string{"rping", "-c", "-a", "127.0.0.1", "-p", cmPort, "-C", "0", "-v",
		"--bind", "127.0.0.2:" + udp, "--roce-port", udp, "--connect-timeout", "30s", "--idle-timeout", "300ms"}, out, &e)
	require.NoError(t, ctx.Err(), "the client waited until the test's limit: %s", e.String())
	assert.Equal(t, exitFail, code, e.String())
	assert.Regexp(t, `^softrdma: rping: no completion and no packet from the peer for 300ms \(--idle-timeout\), [0-9]+ pings done: `+
		`the peer or the path to it is probably dead`, e.String())
}
