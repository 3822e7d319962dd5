package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRCPingpongFlags(t *testing.T) {
	c, cmd, err := parse(t, "rc-pingpong")
	require.NoError(t, err)
	require.Equal(t, "rc-pingpong", cmd)
	// ibv_rc_pingpong's defaults.
	assert.Equal(t, pingCmd{Port: 18515, Size: 4096, Iters: 1000, MTU: 1024, RxDepth: 500, GIDIdx: -1, IBPort: 1}, c.Pingpong)

	c, _, err = parse(t, "rc-pingpong", "-p", "5000", "-s", "64", "-n", "5", "-m", "4096", "-r", "16", "-l", "3",
		"-e", "-g", "1", "-c", "-i", "1", "--verify", "--bind", "192.168.77.1", "--pcap", "x.pcap", "--stat",
		"--connect-timeout", "30s", "192.168.77.10")
	require.NoError(t, err)
	assert.Equal(t, pingCmd{Server: "192.168.77.10", Port: 5000, Size: 64, Iters: 5, MTU: 4096, RxDepth: 16, SL: 3,
		Events: true, GIDIdx: 1, Chk: true, IBPort: 1, Verify: true, Bind: "192.168.77.1", Pcap: "x.pcap",
		Stat: true, ConnectTimeout: 30 * time.Second}, c.Pingpong)

	// Long names as getopt_long's.
	c, _, err = parse(t, "rc-pingpong", "--port=1", "--size=2", "--iters=3", "--mtu=512", "--rx-depth=4", "--sl=5",
		"--events", "--gid-idx=0", "--chk", "--ib-port=1")
	require.NoError(t, err)
	assert.Equal(t, pingCmd{Port: 1, Size: 2, Iters: 3, MTU: 512, RxDepth: 4, SL: 5, Events: true, GIDIdx: 0,
		Chk: true, IBPort: 1}, c.Pingpong)
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
