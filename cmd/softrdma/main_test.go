package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/perf"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code = run(ctx, args, &o, &e)
	return code, o.String(), e.String()
}

// parse parses args into a cli without running anything.
func parse(t *testing.T, args ...string) (*cli, string, error) {
	t.Helper()
	var c cli
	p, err := newParser(&c, io.Discard, io.Discard, func(int) {})
	require.NoError(t, err)
	kctx, err := p.Parse(args)
	if err != nil {
		return nil, "", err
	}
	return &c, strings.Fields(kctx.Command())[0], nil
}

func TestHelp(t *testing.T) {
	code, out, _ := runCLI(t, "--help")
	assert.Equal(t, exitOK, code)
	for _, cmd := range []string{"write-bw", "write-lat", "read-bw", "read-lat", "send-bw", "send-lat", "atomic-bw", "demo"} {
		assert.Contains(t, out, cmd)
	}
	code, out, _ = runCLI(t, "write-bw", "--help")
	assert.Equal(t, exitOK, code)
	for _, flag := range []string{"-s, --size", "-n, --iters", "-D, --duration", "-a, --all", "-m, --mtu",
		"-t, --tx-depth", "-q, --qp", "-p, --port", "--report_gbits", "--json", "--verify", "--file", "--out",
		"--pcap", "--impair", "--bind", "-u, --qp-timeout"} {
		assert.Contains(t, out, flag)
	}
}

// TestHelpHidesInlineSentinel: -I's default depends on the tool (220
// write-lat, 236 send-lat, else 0, as its help says); the help showed the
// internal "not given" value instead, "-I, --inline_size=-1", a value
// that -I -2 is refused for ("must be 0 to 1024").
func TestHelpHidesInlineSentinel(t *testing.T) {
	for _, tool := range []string{"write-bw", "write-lat", "send-lat"} {
		code, out, _ := runCLI(t, tool, "--help")
		require.Equal(t, exitOK, code, tool)
		assert.Contains(t, out, "-I, --inline_size=BYTES", tool)
		assert.NotContains(t, out, "--inline_size=-1", tool)
	}
}

// TestToolHelpNamesWhatItMeasures: each perftest-style tool's --help
// opens with its own line, naming what it measures and the perftest tool
// it stands for.
func TestToolHelpNamesWhatItMeasures(t *testing.T) {
	seen := map[string]string{}
	for tool, want := range map[string]string{
		"write-bw":  "RDMA WRITE bandwidth (ib_write_bw).",
		"write-lat": "RDMA WRITE latency, ping-pong polling memory (ib_write_lat).",
		"read-bw":   "RDMA READ bandwidth (ib_read_bw).",
		"read-lat":  "RDMA READ latency (ib_read_lat).",
		"send-bw":   "SEND/RECV bandwidth (ib_send_bw).",
		"send-lat":  "SEND/RECV latency, ping-pong (ib_send_lat).",
		"atomic-bw": "Atomic FETCH_AND_ADD or CMP_AND_SWAP bandwidth (ib_atomic_bw).",
	} {
		code, out, _ := runCLI(t, tool, "--help")
		require.Equal(t, exitOK, code, tool)
		assert.Contains(t, out, "Usage: softrdma "+tool+" [<server>] [flags]\n\n"+want+"\n", tool)
		for other, o := range seen {
			assert.NotEqual(t, o, out, "%s and %s print the same help", tool, other)
		}
		seen[tool] = out
	}
}

func TestFlagsMapToParams(t *testing.T) {
	c, cmd, err := parse(t, "write-bw", "-s", "64K", "-n", "100", "-D", "2", "-a", "-m", "1024", "-t", "64",
		"-r", "256", "-Q", "10", "-q", "1", "-p", "5000", "-I", "100", "--report_gbits", "--json", "--verify",
		"--pcap", "x.pcap", "--impair", "loss=0.1", "--bind", "10.0.0.1:4791", "-u", "12", "127.0.0.2")
	require.NoError(t, err)
	require.Equal(t, "write-bw", cmd)
	test, err := perf.ParseTest(cmd)
	require.NoError(t, err)
	o, err := c.tool(test).options(test)
	require.NoError(t, err)
	assert.Equal(t, perf.Params{Size: 65536, Iters: 100, Duration: 2 * time.Second, All: true, MTU: 1024,
		TxDepth: 64, RxDepth: 256, CQMod: 10, QPs: 1, Inline: 100, Atomic: perf.FetchAndAdd, Verify: true, QPTimeout: 12}, o.Params)
	assert.Equal(t, "127.0.0.2", o.Server)
	assert.Equal(t, 5000, o.Port)
	assert.Equal(t, "10.0.0.1:4791", o.Bind)
	assert.Equal(t, "x.pcap", o.Pcap)
	assert.Equal(t, "loss=0.1", o.Impair)
	assert.True(t, o.JSON)
	assert.True(t, o.ReportGbits)
}

func TestFlagDefaultsAndAliases(t *testing.T) {
	c, cmd, err := parse(t, "atomic-bw", "--atomic-type", "CMP_AND_SWAP", "--report-gbits", "--inline-size", "0")
	require.NoError(t, err)
	o, err := c.tool(perf.AtomicBW).options(perf.AtomicBW)
	require.NoError(t, err)
	assert.Equal(t, "atomic-bw", cmd)
	assert.Equal(t, perf.CmpAndSwap, o.Params.Atomic)
	assert.True(t, o.ReportGbits)
	assert.Equal(t, 0, o.Params.Inline)
	assert.Equal(t, "", o.Server) // the server
	assert.Equal(t, 18515, o.Port)
	assert.Equal(t, 0, o.Params.MTU) // no -m: the port's active MTU, once the device is open

	c, _, err = parse(t, "send-lat", "server.example")
	require.NoError(t, err)
	o, err = c.tool(perf.SendLat).options(perf.SendLat)
	require.NoError(t, err)
	assert.Equal(t, -1, o.Params.Inline) // perftest's default, resolved by the runner
	assert.Equal(t, "server.example", o.Server)
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"write-bw", "--nope"}, "unknown flag"},
		{[]string{"write-bw", "-s", "lots"}, "not a size"},
		{[]string{"write-bw", "-D", "soon"}, "not a number of seconds"},
		{[]string{"atomic-bw", "-A", "SWAP"}, "must be one of"},
		{[]string{"write-bw", "-A", "CMP_AND_SWAP", "h"}, "--atomic_type is for atomic-bw"},
		{[]string{"write-bw", "-n", "2", "h"}, `--iters: "2": must be 5 to 100000000`},
		{[]string{"write-lat", "-q", "2", "h"}, "one QP"},
		{[]string{"write-bw", "-m", "1500", "h"}, "--mtu 1500 (-m)"},
		{[]string{"write-bw", "a", "b"}, "unexpected argument"},
		{[]string{"write-bw", "--file", "/does/not/exist", "h"}, "does/not/exist"},
		{[]string{"nope"}, "unexpected argument"},
		{[]string{"write-bw", "--impair", "loss=2", "h"}, "not a probability"},
		{[]string{"write-bw", "--impair", "foo=1", "h"}, `unknown key "foo"`},
		{[]string{"write-bw", "--impair", "delay=10h", "h"}, "conn: impairment delay=10h0m0s: at most 10s"},
		{[]string{"demo", "--impair", "jitter=1m"}, "conn: impairment jitter=1m0s: at most 10s"},
		{[]string{"write-bw", "--bind", "999.1.1.1", "h"}, "want IP or IP:port"},
		{[]string{"write-bw", "--bind", "127.0.0.1:99999", "h"}, "bad port"},
		{[]string{"write-bw", "-p", "65536", "h"}, "the port must be 1 to 65535"},
		{[]string{"write-bw", "--port=-1"}, "the port must be 1 to 65535"},
		{[]string{"write-bw", "--out", "o", "127.0.0.1"}, "write-bw: --out goes on the server"},
		{[]string{"write-bw", "--out", "/nonexistent/d/x"}, "--out: cannot create /nonexistent/d/x: no such file or directory"},
		{[]string{"write-bw", "--out", "/tmp"}, "--out: /tmp is a directory"},
		{[]string{"write-bw", "--pcap", "/nonexistent/d/x.pcap", "h"}, "--pcap: cannot create /nonexistent/d/x.pcap: no such file or directory"},
		{[]string{"read-bw", "--out", "/nonexistent/d/x", "h"}, "--out: cannot create /nonexistent/d/x: no such file or directory"},
		{[]string{"read-lat", "--file", "main.go", "127.0.0.1"}, "--file and --out are for the BW tools"},
		{[]string{"demo", "--impair", "loss=5"}, "not a probability"},
		{[]string{"demo", "-s", "0"}, "at least 1 byte"},
		{[]string{"demo", "-s", "3G"}, "-s 3221225472: must be 1 to 2^31 bytes"},
		{[]string{"demo", "--timeout", "0s"}, "--timeout 0s: must be positive (bad command line)"},
		{[]string{"demo", "--timeout=-1s"}, "--timeout -1s: must be positive (bad command line)"},
		{[]string{"write-bw", "-m", "100"}, "--mtu 100 (-m)"}, // a server's own flags are checked too
		{[]string{"write-bw", "-m", "0", "127.0.0.1"}, "must be 256, 512, 1024, 2048 or 4096"},
		{[]string{"write-bw", "-n", "4"}, `--iters: "4": must be 5 to 100000000`},
		{[]string{"write-bw", "-s", "0", "h"}, "at least 1 byte"},
		{[]string{"write-bw", "-n", "0", "h"}, `--iters: "0": must be 5 to 100000000`},
		{[]string{"write-bw", "-t", "0", "h"}, "at least 1"},
		{[]string{"send-bw", "-r", "0", "h"}, "at least 1"},
		{[]string{"write-bw", "-Q", "0", "h"}, "at least 1"},
		{[]string{"write-bw", "-q", "0", "h"}, "at least 1"},
		{[]string{"write-bw", "-u", "0", "h"}, "at least 1"},
		{[]string{"write-bw", "-D", "0", "h"}, `"0": must be 100ms to 24h0m0s`},
		{[]string{"write-bw", "-D", "0s", "h"}, `"0s": must be 100ms to 24h0m0s`},
		{[]string{"rping", "-c", "-a", "127.0.0.1", "-p", "0"}, "-p 0: not a port"},
		// An output path that cannot be written is a bad command line in
		// every tool (exit 2), found before anything opens or connects,
		// and the message names the path and the reason.
		{[]string{"rc-pingpong", "--pcap", "/nonexistent/d/x.pcap"}, "rc-pingpong: --pcap: cannot create /nonexistent/d/x.pcap: no such file or directory"},
		{[]string{"uc-pingpong", "--pcap", "/nonexistent/d/x.pcap", "h"}, "uc-pingpong: --pcap: cannot create /nonexistent/d/x.pcap"},
		{[]string{"ud-pingpong", "--pcap", "/nonexistent/d/x.pcap"}, "ud-pingpong: --pcap: cannot create /nonexistent/d/x.pcap"},
		{[]string{"rping", "-s", "--pcap", "/nonexistent/d/x.pcap"}, "rping: --pcap: cannot create /nonexistent/d/x.pcap"},
		{[]string{"rc-pingpong", "--pcap", "/tmp"}, "rc-pingpong: --pcap: /tmp is a directory"},
		{[]string{"write-bw", "--pcap", "/proc/version", "h"}, "--pcap: /proc/version is a file of the kernel's procfs, not one that keeps what is written to it"},
		{[]string{"rc-pingpong", "--pcap", "/proc/version"}, "rc-pingpong: --pcap: /proc/version is a file of the kernel's procfs"},
		{[]string{"rping", "-s", "--pcap", "/proc/version"}, "rping: --pcap: /proc/version is a file of the kernel's procfs"},
		{[]string{"demo", "--pcap", "/proc/version"}, "--pcap: /proc/version is a file of the kernel's procfs"},
		{[]string{"write-bw", "--out", "/proc/x"}, "--out: cannot create /proc/x: /proc is in the kernel's procfs, where no file can be created"},
		{[]string{"rc-pingpong", "-s", "bad"}, `--size: expected a valid 64 bit int but got "bad"`},
		{[]string{"rc-pingpong", "-s", "4294967296"}, "-s 4294967296: must be 0 to 2^31 bytes"},
		// Validation errors name the flag and the value.
		{[]string{"write-bw", "-u", "40", "h"}, "--qp-timeout 40 (-u): must be 1 to 31"},
		{[]string{"write-bw", "-I", "2000", "h"}, "--inline_size 2000 (-I): must be 0 to 1024"},
		// -D: at least 100 ms (a run that short may complete nothing),
		// at most a day; timeouts not negative, at most a day.
		{[]string{"write-bw", "-D", "1ns", "h"}, "--duration 1ns (-D): must be 100ms to 24h0m0s"},
		{[]string{"write-lat", "-D", "100000h", "h"}, "--duration 100000h0m0s (-D): must be 100ms to 24h0m0s"},
		{[]string{"write-bw", "-D", "99ms"}, "--duration 99ms (-D)"},
		{[]string{"write-bw", "--connect-timeout=-1s", "h"}, "--connect-timeout -1s: must not be negative"},
		{[]string{"read-bw", "--connect-timeout", "100000h", "h"}, "--connect-timeout 100000h0m0s: at most 24h0m0s"},
		{[]string{"write-bw", "-R", "--connect-timeout", "25h", "h"}, "--connect-timeout 25h0m0s: at most 24h0m0s"},
		{[]string{"write-bw", "--idle-timeout=-1s", "h"}, "--idle-timeout -1s: must not be negative"},
		// --connect-timeout: 0 (one attempt) or at least 100 ms; 1ns
		// failed every connection, saying the server's host was down.
		{[]string{"write-bw", "--connect-timeout", "1ns", "h"}, "--connect-timeout 1ns: must be 0 (one attempt) or at least 100ms"},
		{[]string{"rc-pingpong", "--connect-timeout", "99ms", "h"}, "rc-pingpong: --connect-timeout 99ms: must be 0 (one attempt) or at least 100ms"},
		{[]string{"ud-pingpong", "--connect-timeout", "1us", "h"}, "ud-pingpong: --connect-timeout 1µs: must be 0 (one attempt) or at least 100ms"},
		{[]string{"rping", "-c", "-a", "127.0.0.1", "--connect-timeout", "1ms"}, "rping: --connect-timeout 1ms: must be 0 (one attempt) or at least 100ms"},
		{[]string{"send-lat", "--idle-timeout", "100000h"}, "--idle-timeout 100000h0m0s: at most 24h0m0s"},
		{[]string{"write-bw", "--idle-timeout", "1ms", "h"}, "--idle-timeout 1ms: must be 0 (wait for ever) or at least 100ms"},
		{[]string{"read-lat", "--idle-timeout", "1ns"}, "--idle-timeout 1ns: must be 0 (wait for ever) or at least 100ms"},
		{[]string{"rc-pingpong", "--connect-timeout=-1s", "h"}, "rc-pingpong: --connect-timeout -1s: must not be negative"},
		{[]string{"ud-pingpong", "--connect-timeout=-1s", "h"}, "ud-pingpong: --connect-timeout -1s: must not be negative"},
		{[]string{"uc-pingpong", "--idle-timeout=-1s"}, "uc-pingpong: --idle-timeout -1s: must not be negative"},
		// The pingpong tools' --idle-timeout: 0 (wait for ever) or at
		// least 100 ms (shorter cuts healthy runs and blames the peer).
		{[]string{"rc-pingpong", "--idle-timeout", "1ns"}, "rc-pingpong: --idle-timeout 1ns: must be 0 (wait for ever) or at least 100ms"},
		{[]string{"uc-pingpong", "--idle-timeout", "1ms", "h"}, "uc-pingpong: --idle-timeout 1ms: must be 0 (wait for ever) or at least 100ms"},
		{[]string{"ud-pingpong", "--idle-timeout", "99ms"}, "ud-pingpong: --idle-timeout 99ms: must be 0 (wait for ever) or at least 100ms"},
		{[]string{"rping", "-c", "-a", "127.0.0.1", "--connect-timeout=-1s"}, "rping: --connect-timeout -1s: must not be negative"},
		{[]string{"rping", "-s", "--timeout", "100000h"}, "rping: --timeout 100000h0m0s: at most 24h0m0s"},
		{[]string{"demo", "--timeout", "100000h"}, "--timeout 100000h0m0s: at most 24h0m0s (bad command line)"},
		// A client's --max-mem is checked before it connects (nothing
		// listens on port 1: a connection attempt would fail, exit 1).
		{[]string{"write-bw", "--max-mem", "1M", "-s", "64K", "-q", "20", "-p", "1", "127.0.0.1"},
			"write-bw: buffers of 1310720 bytes (-q 20 × 65536 bytes) are more than --max-mem 1048576 allows here"},
		{[]string{"write-lat", "--max-mem", "4K", "-s", "4K", "-p", "1", "127.0.0.1"}, "more than --max-mem 4096"},
		{[]string{"atomic-bw", "--max-mem", "4K", "-t", "1024", "-p", "1", "127.0.0.1"}, "more than --max-mem 4096"},
	} {
		code, _, stderr := runCLI(t, tc.args...)
		assert.Equal(t, exitUsage, code, tc.args)
		assert.Contains(t, stderr, tc.want, tc.args)
		assert.NotContains(t, stderr, tc.args[0]+": "+tc.args[0]+":", "the command named twice")
	}
}

// TestDemoRefusesUnusableFiles: a --file or --pcap the demo cannot use is
// a bad command line (exit 2, the flag named, "(bad command line)" as the
// demo's other usage errors), found before the NICs open.
func TestDemoRefusesUnusableFiles(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	for _, tc := range []struct {
		args []string
		want string
	}{
		// An empty file moves no byte: each transfer would pass having
		// posted no WRITE, READ or SEND.
		{[]string{"--file", empty}, "--file " + empty + ": empty, the demo needs bytes to move (bad command line)"},
		{[]string{"--file", "/dev/null"}, "--file /dev/null: not a regular file (bad command line)"},
		{[]string{"--pcap", filepath.Join(dir, "no", "dir.pcap")}, "--pcap: cannot create " + filepath.Join(dir, "no", "dir.pcap") + ": no such file or directory"},
		{[]string{"--pcap", dir}, "--pcap: " + dir + " is a directory (bad command line)"},
		{[]string{"--file", dir}, "is a directory"},                      // kong's existingfile
		{[]string{"--file", filepath.Join(dir, "nope")}, "--file: stat"}, // kong's existingfile
	} {
		code, out, stderr := runCLI(t, append([]string{"demo"}, tc.args...)...)
		assert.Equal(t, exitUsage, code, "%v: %s", tc.args, stderr)
		assert.Contains(t, stderr, tc.want, tc.args)
		assert.Empty(t, out, "%v: nothing ran", tc.args)
	}
	// An existing --pcap is left as it is by a refused run, and the check
	// leaves no scratch file.
	old := filepath.Join(dir, "old.pcap")
	require.NoError(t, os.WriteFile(old, []byte("old capture"), 0o600))
	code, _, stderr := runCLI(t, "demo", "--pcap", old, "--file", empty)
	require.Equal(t, exitUsage, code, stderr)
	b, err := os.ReadFile(old)
	require.NoError(t, err)
	assert.Equal(t, "old capture", string(b))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 2, "empty and old.pcap only")
}

func TestRunErrorsExitOne(t *testing.T) {
	// A client whose server is not there.
	code, _, stderr := runCLI(t, "write-bw", "-p", "1", "127.0.0.1")
	assert.Equal(t, exitFail, code)
	assert.Contains(t, stderr, "softrdma: write-bw: connect to the server")
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "64K": 65536, "64KiB": 65536, "64KB": 65536, "1M": 1 << 20,
		"2MiB": 2 << 20, "1G": 1 << 30, "0x100": 256, "8B": 8, "16k": 16 << 10} {
		var b byteSize
		require.NoError(t, b.UnmarshalText([]byte(in)), in)
		assert.Equal(t, want, int64(b), in)
	}
	for _, in := range []string{"", "K", "-1", "1.5M", "1T", "99999999999G"} {
		var b byteSize
		assert.Error(t, b.UnmarshalText([]byte(in)), in)
	}
}

func TestSeconds(t *testing.T) {
	var d seconds
	require.NoError(t, d.UnmarshalText([]byte("5")))
	assert.Equal(t, 5*time.Second, time.Duration(d))
	require.NoError(t, d.UnmarshalText([]byte("250ms")))
	assert.Equal(t, 250*time.Millisecond, time.Duration(d))
	assert.Error(t, d.UnmarshalText([]byte("-1s")))
	assert.Error(t, d.UnmarshalText([]byte("x")))
}

func TestDemo(t *testing.T) {
	b := make([]byte, 200_000)
	for i := range b {
		b[i] = byte(i*31 + i>>8)
	}
	path := filepath.Join(t.TempDir(), "payload")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	sum := sha256.Sum256(b)
	hexSum := hex.EncodeToString(sum[:])

	code, out, stderr := runCLI(t, "demo", "--file", path, "-s", "16K")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, stderr)
	assert.Contains(t, out, "SHA-256 "+hexSum)
	assert.Equal(t, 3, strings.Count(out, hexSum+"  ok"), out)
	assert.Contains(t, out, "RDMA WRITE")
	assert.Contains(t, out, "RDMA READ")
	assert.Contains(t, out, "SEND")
	assert.Contains(t, out, " #bytes     #iterations    BW peak[MB/sec]")
	assert.Contains(t, out, "sent_pkts")
	// The legend of the counters an ibverbs user misreads.
	assert.Contains(t, out, " rdma_sends/rdma_recvs: RDMA WRITE and READ requests sent/executed, as rxe counts them (SENDs are not counted; the WRITE stream ends with one zero-length WRITE WITH IMM more)\n")
	assert.Contains(t, out, "PASS: 3 of 3 transfers arrived intact")
}

// TestDemoLeavesNoLatePackets: a clean demo drops no packet as for an
// unknown QPN. The sink of a stream sent credits the source no longer
// waited for, and the last one reached it after its run had ended and its
// QP was gone (READ: the client's run ended before its last credit was
// acknowledged). Without the fix 8 runs of 10 showed one; three runs here.
func TestDemoLeavesNoLatePackets(t *testing.T) {
	b := make([]byte, 200_000)
	for i := range b {
		b[i] = byte(i*7 + i>>9)
	}
	path := filepath.Join(t.TempDir(), "payload")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	for range 3 {
		code, out, stderr := runCLI(t, "demo", "--file", path, "-s", "1K")
		require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, stderr)
		require.NotContains(t, out, "drop_unknown_qpn  ", out)
	}
}

func TestDemoWithImpairmentAndPcap(t *testing.T) {
	if testing.Short() {
		t.Skip("impaired transfers take a while")
	}
	pcap := filepath.Join(t.TempDir(), "demo.pcap")
	b := make([]byte, 100_000)
	path := filepath.Join(t.TempDir(), "payload")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	code, out, stderr := runCLI(t, "demo", "--file", path, "-s", "8K", "--impair", "loss=0.01,reorder=0.01,dup=0.005,seed=7",
		"--pcap", pcap)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, stderr)
	assert.Contains(t, out, "impair  loss=0.01")
	st, err := os.Stat(pcap)
	require.NoError(t, err)
	assert.Greater(t, st.Size(), int64(100_000))
}

// TestDemoTimeout: with every packet lost no transfer can finish (the QPs
// retry for ever, as rxe's with retry_cnt 7); --timeout bounds the whole
// demo, not each transfer: the first transfer fails with the reason, the
// other two are not started, and the demo fails after one --timeout
// instead of three.
func TestDemoTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "payload")
	require.NoError(t, os.WriteFile(path, make([]byte, 10_000), 0o600))
	code, out, _ := runCLI(t, "demo", "--file", path, "--impair", "loss=1,seed=1", "--timeout", "300ms")
	require.Equal(t, exitFail, code)
	assert.Contains(t, out, "timeout 300ms for the three transfers together (--timeout)")
	assert.Equal(t, 1, strings.Count(out, "FAILED: not done within the demo's 300ms (--timeout)"), out)
	assert.Equal(t, 2, strings.Count(out, "FAILED: not started, the demo's --timeout 300ms had passed"), out)
	assert.Contains(t, out, "FAIL: 3 of 3 transfers did not arrive intact")
}

// TestDemoInterrupted: Ctrl-C or SIGTERM (a cancelled context) ends the
// demo with one "INTERRUPTED" line and exit 1, as the other tools'
// "interrupted", not with a "FAILED: context canceled" per transfer.
func TestDemoInterrupted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "payload")
	require.NoError(t, os.WriteFile(path, make([]byte, 10_000), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var o, e bytes.Buffer
	code := run(ctx, []string{"demo", "--file", path}, &o, &e)
	out := o.String() + e.String()
	require.Equal(t, exitFail, code, out)
	assert.Equal(t, 1, strings.Count(out, "INTERRUPTED after 0 of 3 transfers"), out)
	assert.NotContains(t, out, "context canceled")
	assert.NotContains(t, out, "FAIL")
}

// TestDemoPcapWriteError: a capture that cannot be written (/dev/full
// refuses every write) fails the demo (exit 1) with the reason, although
// the transfers arrived intact: the pcap writer's errors are sticky and
// silent until it is closed.
func TestDemoPcapWriteError(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	path := filepath.Join(t.TempDir(), "small.txt")
	require.NoError(t, os.WriteFile(path, []byte("hello world\n"), 0o600))
	code, out, stderr := runCLI(t, "demo", "--pcap", "/dev/full", "--file", path, "-s", "7")
	require.Equal(t, exitFail, code, "stdout:\n%s\nstderr:\n%s", out, stderr)
	assert.Contains(t, out, "FAILED: --pcap /dev/full: write /dev/full: no space left on device")
	assert.Contains(t, out, "FAIL: 3 of 3 transfers arrived intact, but the capture could not be written")
	assert.NotContains(t, out, "PASS")
}

// TestInterrupted: a run ended by Ctrl-C says "interrupted", not Go's
// "context canceled", also with a note after it; an error that says more
// is kept.
func TestInterrupted(t *testing.T) {
	assert.Equal(t, "interrupted", interrupted(context.Canceled))
	wrapped := fmt.Errorf("poll CQ: %w", context.Canceled)
	assert.Equal(t, wrapped, interrupted(wrapped))
	assert.Nil(t, interrupted(nil))
	// A note after it is kept (a server interrupted with --out said
	// "context canceled (--out out.bin was not written)").
	noted := fmt.Errorf("%w (--out out.bin was not written)", context.Canceled)
	assert.Equal(t, "interrupted (--out out.bin was not written)", interrupted(noted))
}

// TestErrText: the command's "softrdma: " prefix is not doubled by an
// error of package softrdma or bench/scopes, and other messages keep
// theirs.
func TestErrText(t *testing.T) {
	for in, want := range map[string]string{
		"softrdma: open 127.0.0.1:4791: address in use": "open 127.0.0.1:4791: address in use",
		"scopes: -q 0: at least 1":                      "-q 0: at least 1",
		"softrdma: scopes: x":                           "x",
		"transport: destroy QP: bad":                    "transport: destroy QP: bad",
		"a softrdma: inside":                            "a softrdma: inside",
	} {
		require.Equal(t, want, errText(errors.New(in)), in)
	}
}

// TestDemoPcapOnceEachDatagram: the two NICs share one capture, and each
// datagram is recorded once (as sent), not once by its sender and again
// by its receiver: the frames are the NICs' sent_pkts.
func TestDemoPcapOnceEachDatagram(t *testing.T) {
	path := filepath.Join(t.TempDir(), "small.txt")
	require.NoError(t, os.WriteFile(path, []byte("hello world\n"), 0o600))
	pcap := filepath.Join(t.TempDir(), "demo.pcap")
	code, out, stderr := runCLI(t, "demo", "--pcap", pcap, "--file", path, "-s", "7")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, stderr)
	var sentA, sentB, rcvdA, rcvdB int
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "sent_pkts" {
			sentA, _ = strconv.Atoi(f[1])
			sentB, _ = strconv.Atoi(f[2])
		} else if len(f) == 3 && f[0] == "rcvd_pkts" {
			rcvdA, _ = strconv.Atoi(f[1])
			rcvdB, _ = strconv.Atoi(f[2])
		}
	}
	require.NotZero(t, sentA, out)
	require.NotZero(t, rcvdA, out)
	f, err := os.Open(pcap)
	require.NoError(t, err)
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	require.NoError(t, err)
	frames := 0
	for {
		if _, _, err := r.ReadPacketData(); err != nil {
			break
		}
		frames++
	}
	// Each datagram once: at least every one the counters saw sent, and
	// fewer than the sent and received counts together, which a capture
	// recording each datagram at its sender and again at its receiver
	// reaches. (Not equal to the sent count: the counters are read while
	// a last ACK may still be on its way; CI saw 17 counted, 18 captured.)
	sent, rcvd := sentA+sentB, rcvdA+rcvdB
	assert.GreaterOrEqual(t, frames, sent, out)
	assert.Less(t, frames, sent+rcvd, out)
}
