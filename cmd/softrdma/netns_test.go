package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// skipWithoutNetns skips a test that needs network namespaces and a veth
// pair: root and iproute2's ip.
func skipWithoutNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces and a veth pair (CI runs it as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip (apt-get install -y iproute2)")
	}
}

// buildTool builds the softrdma binary into a temporary directory and
// returns its directory and path.
func buildTool(t *testing.T) (dir, bin string) {
	t.Helper()
	dir = t.TempDir()
	bin = filepath.Join(dir, "softrdma")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return dir, bin
}

// TestTwoHostsOverVeth is the two-host experiment of the README: two network
// namespaces joined by a veth pair, a server in one and a client in the
// other, each a separate softrdma process. It moves a 64 MiB file by RDMA
// WRITE and by RDMA READ under 1% injected loss on the client and checks
// that the SHA-256 of what arrived equals the file's; both processes exit 0
// only if every work request completed with SUCCESS.
//
// It needs root (ip netns, veth); as another user it skips. CI runs it.
func TestTwoHostsOverVeth(t *testing.T) {
	skipWithoutNetns(t)
	if testing.Short() {
		t.Skip("moves 2 × 64 MiB between two processes; skipped with -short")
	}
	dir, bin := buildTool(t)

	h := newHosts(t, 9000)
	file := filepath.Join(dir, "in.bin")
	data := make([]byte, 64<<20)
	r := rand.New(rand.NewPCG(7, 4791))
	for i := 0; i+8 <= len(data); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			data[i+k] = byte(v >> (8 * k))
		}
	}
	require.NoError(t, os.WriteFile(file, data, 0o644))
	want := sha256.Sum256(data)

	// 1% loss on the client's side, both directions. -u 10: retransmit
	// after 4.2 ms without an ACK (a lost tail has nothing behind it to
	// trigger a NAK).
	impair := "--impair=loss=0.01,seed=7"
	t.Run("write-bw", func(t *testing.T) {
		got := filepath.Join(dir, "write.out")
		h.run(t, bin,
			[]string{"write-bw", "--bind", h.ipA, "--out", got},
			[]string{"write-bw", h.ipA, "--bind", h.ipB, "--file", file, impair, "-u", "10"})
		checkSum(t, got, want)
	})
	t.Run("read-bw", func(t *testing.T) {
		got := filepath.Join(dir, "read.out")
		h.run(t, bin,
			[]string{"read-bw", "--bind", h.ipA, "--file", file},
			[]string{"read-bw", h.ipA, "--bind", h.ipB, "--out", got, impair, "-u", "10"})
		checkSum(t, got, want)
	})
}

// TestToolsOverMTU1500Veth: on a link of 1500 bytes (a veth pair left at
// its default) the port's active MTU is 1024, and the tools use it: without
// -m, and with -m 4096, which perftest lowers to the active MTU with a
// notice. The tools used to take 4096 whatever the link: the kernel refused
// every data packet (EMSGSIZE), the requester retransmitted for ever and
// the run hung, logging every refused send.
//
// It needs root (ip netns, veth); as another user it skips.
func TestToolsOverMTU1500Veth(t *testing.T) {
	skipWithoutNetns(t)
	_, bin := buildTool(t)

	h := newHosts(t, 1500)
	const notice = "Requested mtu is higher than active mtu\nChanging to active mtu - 3 (1024[B])\n"
	for _, tc := range []struct {
		name     string
		server   []string
		client   []string
		noticeOn string // the side that asked for more than its port carries
	}{
		{"write-bw", []string{"write-bw", "--bind", h.ipA}, []string{"write-bw", h.ipA, "--bind", h.ipB, "-n", "50"}, ""},
		{"write-bw-m4096", []string{"write-bw", "--bind", h.ipA},
			[]string{"write-bw", h.ipA, "--bind", h.ipB, "-n", "50", "-m", "4096"}, "client"},
		{"read-lat", []string{"read-lat", "--bind", h.ipA, "-m", "4096"},
			[]string{"read-lat", h.ipA, "--bind", h.ipB, "-s", "8000", "-n", "100"}, "server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sout, cout := h.runFor(t, time.Minute, bin, tc.server, tc.client)
			for side, out := range map[string]string{"server": sout, "client": cout} {
				assert.Contains(t, out, " Mtu             : 1024[B]\n", side)
				assert.NotContains(t, out, "message too long", side)
				if side == tc.noticeOn {
					assert.Contains(t, out, notice, side)
				} else {
					assert.NotContains(t, out, "Requested mtu", side)
				}
			}
			if tc.name != "read-lat" {
				// The result row: 65536 bytes, 50 iterations.
				assert.Regexp(t, `(?m)^ 65536 +50 `, cout)
			}
		})
	}
	// ud-pingpong checks -s against the port's active MTU, as
	// ibv_ud_pingpong does ("Requested size larger than port MTU"), before
	// it waits for a peer (--bind given: the device opens first).
	t.Run("ud-pingpong-size", func(t *testing.T) {
		out, err := exec.Command("ip", "netns", "exec", h.nsA, bin, "ud-pingpong", "-g", "1", "--bind", h.ipA, "-s", "2048").CombinedOutput()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%s", out)
		assert.Equal(t, exitUsage, ee.ExitCode(), "%s", out)
		assert.Contains(t, string(out), "-s 2048: requested size larger than the port's MTU (1024)")
	})
}

func checkSum(t *testing.T, path string, want [32]byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, 64<<20, len(b), "bytes received")
	require.Equal(t, fmt.Sprintf("%x", want), fmt.Sprintf("%x", sha256.Sum256(b)), "SHA-256 of the received file")
}

// hosts is a pair of network namespaces joined by a veth pair.
type hosts struct {
	nsA, nsB string
	ipA, ipB string
}

// vethPair creates network namespaces nsA and nsB (deleted at the end of
// the test) joined by a veth pair vA-vB, both links down and without
// addresses, and returns a runner of ip(8) that fails the test on error.
func vethPair(t *testing.T, nsA, nsB, vA, vB string) func(args ...string) {
	ip := func(args ...string) {
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
	}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", nsA).Run()
		exec.Command("ip", "netns", "del", nsB).Run()
	})
	ip("netns", "add", nsA)
	ip("netns", "add", nsB)
	ip("link", "add", vA, "netns", nsA, "type", "veth", "peer", "name", vB, "netns", nsB)
	return ip
}

// newHosts creates the namespaces and the veth pair, at linkMTU bytes.
func newHosts(t *testing.T, linkMTU int) *hosts {
	id := os.Getpid() % 200
	h := &hosts{
		nsA: fmt.Sprintf("srdma-a-%d", os.Getpid()),
		nsB: fmt.Sprintf("srdma-b-%d", os.Getpid()),
		ipA: fmt.Sprintf("10.233.%d.1", id),
		ipB: fmt.Sprintf("10.233.%d.2", id),
	}
	vA, vB := fmt.Sprintf("srv%da", id), fmt.Sprintf("srv%db", id)
	ip := vethPair(t, h.nsA, h.nsB, vA, vB)
	// The port's active MTU follows (rxe's rule: link MTU minus headers,
	// rounded down to 256-4096): 9000 carries 4096-byte RoCE payloads,
	// 1500 1024-byte ones.
	for _, c := range []struct{ ns, dev, addr string }{{h.nsA, vA, h.ipA}, {h.nsB, vB, h.ipB}} {
		ip("-n", c.ns, "link", "set", "lo", "up")
		ip("-n", c.ns, "link", "set", c.dev, "mtu", strconv.Itoa(linkMTU), "up")
		ip("-n", c.ns, "addr", "add", c.addr+"/24", "dev", c.dev)
	}
	return h
}

// run starts the server in namespace A, waits until it listens on the
// exchange port, runs the client in namespace B, requires both to exit 0
// within 5 minutes, and returns their outputs (stdout and stderr).
func (h *hosts) run(t *testing.T, bin string, server, client []string) (srvOut, cliOut string) {
	return h.runFor(t, 5*time.Minute, bin, server, client)
}

// runFor is run with a timeout.
func (h *hosts) runFor(t *testing.T, timeout time.Duration, bin string, server, client []string) (srvOut, cliOut string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var sout, cout bytes.Buffer
	srv := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.nsA, bin}, server...)...)
	srv.Stdout, srv.Stderr = &sout, &sout
	require.NoError(t, srv.Start())
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	// Readiness: the server's TCP exchange port (18515) is listening.
	for {
		o, _ := exec.Command("ip", "netns", "exec", h.nsA, "ss", "-Hltn", "sport = :18515").Output()
		if len(bytes.TrimSpace(o)) > 0 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("server exited before listening: %v\n%s", err, sout.String())
		case <-ctx.Done():
			t.Fatalf("server did not listen: %s", sout.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	cli := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.nsB, bin}, client...)...)
	cli.Stdout, cli.Stderr = &cout, &cout
	cerr := cli.Run()
	serr := <-done
	t.Logf("server %v:\n%s", server, sout.String())
	t.Logf("client %v:\n%s", client, cout.String())
	require.NoError(t, cerr, "client")
	require.NoError(t, serr, "server")
	return sout.String(), cout.String()
}
