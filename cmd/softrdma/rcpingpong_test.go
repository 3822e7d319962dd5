package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/perf"
)

func TestRCPingpongFlags(t *testing.T) {
	c, cmd, err := parse(t, "rc-pingpong")
	require.NoError(t, err)
	require.Equal(t, "rc-pingpong", cmd)
	// ibv_rc_pingpong's defaults.
	assert.Equal(t, pingCmd{Port: 18515, Size: 4096, Iters: 1000, MTU: 1024, RxDepth: 500, GIDIdx: -1, IBPort: 1,
		IdleTimeout: 10 * time.Second}, c.Pingpong)

	c, _, err = parse(t, "rc-pingpong", "-p", "5000", "-s", "64", "-n", "5", "-m", "4096", "-r", "16", "-l", "3",
		"-e", "-g", "1", "-c", "-i", "1", "--verify", "--bind", "192.168.77.1", "--pcap", "x.pcap", "--stat",
		"--connect-timeout", "30s", "--idle-timeout", "0", "192.168.77.10")
	require.NoError(t, err)
	assert.Equal(t, pingCmd{Server: "192.168.77.10", Port: 5000, Size: 64, Iters: 5, MTU: 4096, RxDepth: 16, SL: 3,
		Events: true, GIDIdx: 1, Chk: true, IBPort: 1, Verify: true, Bind: "192.168.77.1", Pcap: "x.pcap",
		Stat: true, ConnectTimeout: 30 * time.Second}, c.Pingpong)

	// Long names as getopt_long's.
	c, _, err = parse(t, "rc-pingpong", "--port=1", "--size=2", "--iters=3", "--mtu=512", "--rx-depth=4", "--sl=5",
		"--events", "--gid-idx=0", "--chk", "--ib-port=1")
	require.NoError(t, err)
	assert.Equal(t, pingCmd{Port: 1, Size: 2, Iters: 3, MTU: 512, RxDepth: 4, SL: 5, Events: true, GIDIdx: 0,
		Chk: true, IBPort: 1, IdleTimeout: 10 * time.Second}, c.Pingpong)
}

// TestRCPingpongItersMismatch: the exchange carries no -n (as
// ibv_rc_pingpong's), so a side given more exchanges than its peer waits
// for messages that never come. It fails after --idle-timeout with a
// message saying so, instead of waiting for ever; the peer with the
// smaller -n passes.
func TestRCPingpongItersMismatch(t *testing.T) {
	for _, tc := range []struct {
		name       string
		srv, cli   string // -n
		clientMore bool
	}{
		{"server more", "20", "10", false},
		{"client more", "10", "20", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := runPingPair(t, "rc-pingpong", []string{"-g", "1", "-n", tc.srv, "--idle-timeout", "1s"},
				[]string{"-g", "1", "-n", tc.cli, "--idle-timeout", "1s"})
			code, errOut, okCode, okOut := r.srvCode, r.srvErr, r.cliCode, r.cliOut
			if tc.clientMore {
				code, errOut, okCode, okOut = r.cliCode, r.cliErr, r.srvCode, r.srvOut
			}
			assert.Equal(t, exitFail, code)
			assert.Contains(t, errOut, "rc-pingpong: no completion for 1s (--idle-timeout) after 10 of 20 exchanges (-n 20): "+
				"the peer stopped or went away (was it given a smaller -n? ibv_rc_pingpong's exchange does not carry it)")
			assert.Equal(t, exitOK, okCode)
			assert.Contains(t, okOut, "10 iters in ")
			assert.Less(t, time.Since(start), 30*time.Second)
		})
	}
}

// TestRCPingpongSizeMismatch: the exchange carries no -s either; a
// message longer than the peer's receive buffer fails both sides with
// ibv_rc_pingpong's statuses, then a hint to give both the same -s.
func TestRCPingpongSizeMismatch(t *testing.T) {
	r := runPingPair(t, "rc-pingpong", []string{"-g", "1", "-s", "4096", "--idle-timeout", "2s"},
		[]string{"-g", "1", "-s", "8192", "--idle-timeout", "2s"})
	assert.Equal(t, exitFail, r.srvCode)
	assert.Equal(t, exitFail, r.cliCode)
	assert.Contains(t, r.srvErr+r.cliErr, "failed status local length error (1) for wr_id 1 "+
		"(did the peer run with another -s? both sides need the same -s, here ")
	for side, stderr := range map[string]string{"server": r.srvErr, "client": r.cliErr} {
		if strings.Contains(stderr, "failed status") {
			assert.Contains(t, stderr, "both sides need the same -s", side)
		}
	}
}

func TestRCPingpongUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"rc-pingpong", "-m", "1000"},
		{"rc-pingpong", "-n", "0"},
		{"rc-pingpong", "-i", "2"},
		{"rc-pingpong", "--bind", "0.0.0.0"},
	} {
		code, _, stderr := runCLI(t, args...)
		assert.Equal(t, exitUsage, code, "%v: %s", args, stderr)
	}
	code, out, _ := runCLI(t, "rc-pingpong", "--help")
	assert.Equal(t, exitOK, code)
	for _, flag := range []string{"-p, --port", "-s, --size", "-n, --iters", "-m, --mtu", "-r, --rx-depth",
		"-l, --sl", "-e, --events", "-g, --gid-idx", "-c, --chk", "--verify", "--bind", "--connect-timeout"} {
		assert.Contains(t, out, flag)
	}
}

// runPingPair runs `tool` as a server and as a client through run(), over
// loopback: each device on an address of its own in a random 127/8
// subnet at UDP port 4791 (the exchange carries no port), the client
// retrying until the server listens. It returns both exit codes and
// outputs.
func runPingPair(t *testing.T, tool string, srvArgs, cliArgs []string) cliPair {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	require.NoError(t, ln.Close())
	subnet := fmt.Sprintf("127.%d.%d.", 100+rand.IntN(100), rand.IntN(250))
	var r cliPair
	var wg sync.WaitGroup
	wg.Go(func() {
		r.srvCode, r.srvOut, r.srvErr = runCLI(t, append([]string{tool, "-p", port, "--bind", subnet + "2"}, srvArgs...)...)
	})
	r.cliCode, r.cliOut, r.cliErr = runCLI(t, append([]string{tool, "-p", port, "--bind", subnet + "1",
		"--connect-timeout", "30s"}, append(cliArgs, "127.0.0.1")...)...)
	if r.cliCode != exitOK {
		go func() { // the server may wait for a client that never came
			if c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second); err == nil {
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

// TestRCPingpongODP runs rc-pingpong with ibv_rc_pingpong's demand-paging
// flags on both sides, 20 exchanges of one page with -c and --verify, and
// checks the exit status, the data checks and the ODP counters each side
// prints. The message's page is the SEND's source and the receive's
// destination: without -P it faults in once, on first use, and stays
// present (nothing invalidates it); with -P it is prefetched and nothing
// faults.
func TestRCPingpongODP(t *testing.T) {
	for _, tc := range []struct {
		flags    []string
		kind     string
		prefetch bool
	}{
		{[]string{"-o"}, "explicit", false},
		{[]string{"-O"}, "implicit", false},
		{[]string{"-o", "-P"}, "explicit, prefetched", true},
		{[]string{"--iodp", "--prefetch"}, "implicit, prefetched", true},
	} {
		t.Run(strings.Join(tc.flags, ""), func(t *testing.T) {
			args := append([]string{"-g", "1", "-n", "20", "-c", "--verify"}, tc.flags...)
			r := runPingPair(t, "rc-pingpong", args, args)
			require.Equal(t, exitOK, r.srvCode)
			require.Equal(t, exitOK, r.cliCode)
			for side, out := range map[string]string{"server": r.srvOut, "client": r.cliOut} {
				assert.Contains(t, out, "20 iters in ", side)
				assert.Contains(t, out, "verified 20 messages of 4096 bytes", side)
				assert.NotContains(t, out, "invalid data", side)
				assert.Contains(t, out, " ODP local MR    : "+tc.kind+", 1 pages (4096 bytes), fault policy sync, no budget", side)
				counters := "page_faults 1  page_faults_handled 1  page_invalidations 0  page_invalidations_handled 0  page_prefetch 0  evictions 0"
				latency := "fault latency: 1 faults, p50 "
				if tc.prefetch {
					counters = "page_faults 0  page_faults_handled 0  page_invalidations 0  page_invalidations_handled 0  page_prefetch 1  evictions 0"
					latency = "fault latency: no faults"
				}
				assert.Contains(t, out, counters, "%s:\n%s", side, out)
				assert.Contains(t, out, latency, "%s:\n%s", side, out)
				assert.Greater(t, strings.Index(out, " ODP local MR"), strings.Index(out, " iters in "), "after the results")
			}
		})
	}
}

// Without -o the buffer is pinned and no ODP report is printed.
func TestRCPingpongPinnedPrintsNoODP(t *testing.T) {
	args := []string{"-g", "1", "-n", "5", "--verify"}
	r := runPingPair(t, "rc-pingpong", args, args)
	require.Equal(t, exitOK, r.srvCode)
	require.Equal(t, exitOK, r.cliCode)
	assert.NotContains(t, r.srvOut+r.cliOut, "ODP")
}

// uc-pingpong takes rc-pingpong's flags, the demand-paging ones included.
func TestUCPingpongODP(t *testing.T) {
	args := []string{"-g", "1", "-n", "10", "--verify", "-O", "-P"}
	r := runPingPair(t, "uc-pingpong", args, args)
	require.Equal(t, exitOK, r.srvCode)
	require.Equal(t, exitOK, r.cliCode)
	for _, out := range []string{r.srvOut, r.cliOut} {
		assert.Contains(t, out, "verified 10 messages")
		assert.Contains(t, out, " ODP local MR    : implicit, prefetched, 1 pages (4096 bytes)")
		assert.Contains(t, out, "page_faults 0  page_faults_handled 0")
	}
}

func TestRCPingpongODPFlags(t *testing.T) {
	c, _, err := parse(t, "rc-pingpong", "-o", "-O", "-P")
	require.NoError(t, err)
	assert.True(t, c.Pingpong.ODP && c.Pingpong.IODP && c.Pingpong.Prefetch)
	c, _, err = parse(t, "rc-pingpong", "--odp", "--iodp", "--prefetch")
	require.NoError(t, err)
	assert.True(t, c.Pingpong.ODP && c.Pingpong.IODP && c.Pingpong.Prefetch)

	code, out, _ := runCLI(t, "rc-pingpong", "--help")
	require.Equal(t, exitOK, code)
	for _, flag := range []string{"-o, --odp", "-O, --iodp", "-P, --prefetch", "--sport"} {
		assert.Contains(t, out, flag)
	}

	// -P advises an ODP MR: alone it is a command-line error (exit 2;
	// ibv_rc_pingpong: "prefetch is valid only with on-demand memory
	// region"), found before anything is opened or connected.
	for _, args := range [][]string{
		{"rc-pingpong", "-P"},
		{"rc-pingpong", "--prefetch", "127.0.0.1"},
		{"uc-pingpong", "-P", "-g", "1"},
	} {
		code, _, stderr := runCLI(t, args...)
		assert.Equal(t, exitUsage, code, "%v: %s", args, stderr)
		assert.Contains(t, stderr, "--prefetch advises ODP MRs: add --odp or --iodp", args)
	}
}

func TestSourcePortFlag(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want sport
	}{
		{"spread", sport(softrdma.SourcePortSpread)},
		{"rxe", sport(softrdma.SourcePortSpread)},
		{"bind", sport(softrdma.SourcePortOwn)},
		{"4791", 4791},
		{"65535", 65535},
	} {
		for _, tool := range []string{"rc-pingpong", "uc-pingpong", "ud-pingpong", "write-bw"} {
			c, cmd, err := parse(t, tool, "--sport", tc.arg)
			require.NoError(t, err, tool, tc.arg)
			var got sport
			switch cmd {
			case "rc-pingpong":
				got = c.Pingpong.SourcePort
			case "uc-pingpong":
				got = c.UCPing.SourcePort
			case "ud-pingpong":
				got = c.UDPing.SourcePort
			default:
				got = c.WriteBW.SourcePort
			}
			assert.Equal(t, tc.want, got, "%s --sport %s", tool, tc.arg)
		}
	}
	c, _, err := parse(t, "write-bw", "--sport", "5000")
	require.NoError(t, err)
	o, err := c.tool(perf.WriteBW).options(perf.WriteBW)
	require.NoError(t, err)
	assert.Equal(t, 5000, o.SourcePort)
	c, _, err = parse(t, "write-bw")
	require.NoError(t, err)
	assert.Equal(t, sport(softrdma.SourcePortSpread), c.WriteBW.SourcePort, "spread by default")

	// 0 is not a port to send from: refused as 70000 is, not taken
	// for spread.
	for _, bad := range []string{"70000", "-1", "x", "0x10", "0"} {
		code, _, stderr := runCLI(t, "rc-pingpong", "--sport", bad)
		assert.Equal(t, exitUsage, code, bad)
		assert.Contains(t, stderr, "--sport \""+bad+"\": want spread, bind or a UDP port (1-65535)", bad)
	}
}
