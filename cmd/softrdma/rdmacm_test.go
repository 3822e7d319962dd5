package main

import (
	"bytes"
	"context"
	"net"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/perf"
)

// freeUDPPort returns a UDP port of 127.0.0.1 that was free a moment ago.
func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// udpBound reports whether someone has bound 127.0.0.1:port.
func udpBound(port int) bool {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		return true
	}
	c.Close()
	return false
}

// runCLIPairCM runs a server and a client of the same tool with -R over
// loopback: each device on 127.0.0.1 and a port of its own (the server's
// is not 4791, so its CM answers the client's MADs at the port they came
// from), the client told the server's with --roce-port. The client starts
// once the server's device is up and retries while its CM does not listen
// yet (--connect-timeout).
func runCLIPairCM(t *testing.T, srvArgs, cliArgs []string) cliPair {
	t.Helper()
	srvPort, cliPort := freeUDPPort(t), freeUDPPort(t)
	for cliPort == srvPort {
		cliPort = freeUDPPort(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runIt := func(args []string) (int, string, string) {
		var o, e bytes.Buffer
		code := run(ctx, args, &o, &e)
		return code, o.String(), e.String()
	}
	srv := append(append([]string{}, srvArgs...), "-R", "--bind", "127.0.0.1:"+strconv.Itoa(srvPort))
	cli := append(append([]string{}, cliArgs...), "-R", "--bind", "127.0.0.1:"+strconv.Itoa(cliPort),
		"--roce-port", strconv.Itoa(srvPort), "--connect-timeout", "30s", "127.0.0.1")
	var r cliPair
	var wg sync.WaitGroup
	srvDone := make(chan struct{})
	wg.Go(func() {
		r.srvCode, r.srvOut, r.srvErr = runIt(srv)
		close(srvDone)
	})
	for !udpBound(srvPort) {
		select {
		case <-srvDone:
		case <-time.After(5 * time.Millisecond):
			continue
		}
		break
	}
	r.cliCode, r.cliOut, r.cliErr = runIt(cli)
	if r.cliCode != exitOK {
		// The server may still wait for a client that never came.
		go func() {
			select {
			case <-srvDone:
			case <-time.After(10 * time.Second):
				cancel()
			}
		}()
	}
	wg.Wait()
	if t.Failed() || r.srvCode != exitOK || r.cliCode != exitOK {
		t.Logf("server %q (exit %d):\n%s%s\nclient %q (exit %d):\n%s%s", srv, r.srvCode, r.srvOut, r.srvErr,
			cli, r.cliCode, r.cliOut, r.cliErr)
	}
	return r
}

// statOf returns a counter of --stat's output ("  name = value").
func statOf(t *testing.T, out, name string) uint64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(name) + ` = (\d+)$`).FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseUint(m[1], 10, 64)
	require.NoError(t, err)
	return v
}

// TestRDMACMLoopback runs the tools with -R between two softrdma devices:
// softrdma's own exchange over the CM channel (every byte of --verify
// checked, the data both ways: SEND client to server, READ server to
// client; several QPs, atomics with the depths the CM negotiated) and
// perftest's, byte for byte (--perftest: what ib_send_bw -R speaks),
// with one and two QPs. Each run makes the channel and one CM
// connection per QP, and ends with the server's DREQs, answered.
func TestRDMACMLoopback(t *testing.T) {
	for _, tc := range []struct {
		name     string
		tool     string
		args     []string // both sides (perftest's exchange carries no parameters)
		cli      []string // the client's (softrdma's exchange: the server adopts them)
		qps      uint64
		exchange string
		verified string // the Verify line of the side that checks
		checker  string // "server" or "client"
		row      string // the result row's start
	}{
		{"send-bw", "send-bw", nil, []string{"-s", "4096", "-n", "300", "--verify"}, 1,
			"rdma_cm (softrdma framing)", "every byte matched", "server", "4096       300"},
		{"send-bw-perftest", "send-bw", []string{"--perftest", "-s", "1024", "-n", "5", "--verify"}, nil, 1,
			"rdma_cm (perftest's exchange; peer perftest 6.24)", "5 messages of 1024 bytes received", "server", "1024       5"},
		{"read-bw", "read-bw", nil, []string{"-s", "3000", "-n", "200", "--verify"}, 1,
			"rdma_cm (softrdma framing)", "every byte matched", "client", "3000       200"},
		{"write-bw-perftest-q2", "write-bw", []string{"--perftest", "-s", "8192", "-n", "50", "-q", "2"}, nil, 2,
			"rdma_cm (perftest's exchange; peer perftest 6.24)", "", "", "8192       100"},
		{"atomic-bw-q2", "atomic-bw", nil, []string{"-n", "100", "-q", "2", "--verify"}, 2,
			"rdma_cm (softrdma framing)", "every counter chain held", "server", "8          200"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := append([]string{tc.tool, "--stat"}, tc.args...)
			cli := append(append([]string{tc.tool, "--stat"}, tc.args...), tc.cli...)
			r := runCLIPairCM(t, srv, cli)
			require.Equal(t, exitOK, r.srvCode, "server")
			require.Equal(t, exitOK, r.cliCode, "client")
			for _, out := range []string{r.srvOut, r.cliOut} {
				assert.Contains(t, out, " Data ex. method : "+tc.exchange)
				assert.Regexp(t, `(?m)^ `+regexp.QuoteMeta(tc.row), out, "result row")
			}
			if tc.verified != "" {
				out := r.srvOut
				if tc.checker == "client" {
					out = r.cliOut
				}
				assert.Regexp(t, `(?m)^ Verify          : `+regexp.QuoteMeta(tc.verified), out)
			}
			// The channel and one connection per QP: REQ, REP, RTU; the
			// server's DREQs, the client's DREPs; nothing sent twice.
			conns := tc.qps + 1
			for _, c := range []struct {
				out, name string
				want      uint64
			}{
				{r.cliOut, "cm_req_sent", conns}, {r.srvOut, "cm_req_rcvd", conns},
				{r.srvOut, "cm_rep_sent", conns}, {r.cliOut, "cm_rtu_sent", conns},
				{r.srvOut, "cm_dreq_sent", conns}, {r.cliOut, "cm_dreq_rcvd", conns},
				{r.cliOut, "cm_drep_sent", conns}, {r.srvOut, "cm_drep_rcvd", conns},
				{r.cliOut, "cm_dreq_sent", 0}, {r.srvOut, "cm_rej_sent", 0}, {r.cliOut, "cm_rej_sent", 0},
				{r.cliOut, "cm_retransmits", 0}, {r.srvOut, "cm_retransmits", 0},
			} {
				assert.Equal(t, c.want, statOf(t, c.out, c.name), c.name)
			}
			if tc.name == "send-bw-perftest" {
				// ib_send_bw -R's 11 steps each way (send_bw_rdmacm.pcap):
				// version, cycle buffer, cache line, MTU, 2 hand shakes
				// of zeros, 4 hand shakes, the closing one.
				for _, out := range []string{r.srvOut, r.cliOut} {
					assert.Equal(t, uint64(11), statOf(t, out, "cm_channel_sent"))
					assert.Equal(t, uint64(11), statOf(t, out, "cm_channel_rcvd"))
				}
			}
			assert.NotContains(t, r.srvErr+r.cliErr, "softrdma: ", "warnings and errors")
		})
	}
}

// TestRDMACMFlags: -R and --roce-port reach the options; --roce-port
// belongs to a -R client.
func TestRDMACMFlags(t *testing.T) {
	c, _, err := parse(t, "send-bw", "-R", "--roce-port", "4792", "-p", "7000", "10.0.0.1")
	require.NoError(t, err)
	o, err := c.tool(perf.SendBW).options(perf.SendBW)
	require.NoError(t, err)
	assert.True(t, o.RDMACM)
	assert.Equal(t, 4792, o.RoCEPort)
	assert.Equal(t, 7000, o.Port)
	c, _, err = parse(t, "write-bw", "--rdma_cm")
	require.NoError(t, err)
	o, err = c.tool(perf.WriteBW).options(perf.WriteBW)
	require.NoError(t, err)
	assert.True(t, o.RDMACM)
	c, _, err = parse(t, "write-bw", "--rdma-cm")
	require.NoError(t, err)
	assert.True(t, c.WriteBW.RDMACM)

	code, out, _ := runCLI(t, "send-bw", "--help")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "-R, --rdma_cm")
	assert.Contains(t, out, "--roce-port")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"send-bw", "--roce-port", "4792", "h"}, "it needs -R"},
		{[]string{"send-bw", "-R", "--roce-port", "4792"}, "--roce-port is the client's"},
		{[]string{"send-bw", "-R", "--roce-port", "70000", "h"}, "not a UDP port"},
	} {
		code, _, stderr := runCLI(t, tc.args...)
		assert.Equal(t, exitUsage, code, tc.args)
		assert.Contains(t, stderr, tc.want, tc.args)
	}
}

// TestRDMACMMTU: with -R the sides agree on the smaller of their MTUs as
// over TCP (check_mtu), the CM connects the data QPs with it, and the
// banner shows the path MTU the CM gave the QPs.
func TestRDMACMMTU(t *testing.T) {
	for _, tc := range []struct {
		name     string
		srv, cli []string
		want     string
	}{
		{"softrdma", []string{"write-bw", "-m", "512"}, []string{"write-bw", "-n", "20", "-s", "8192"}, "512"},
		{"perftest", []string{"write-bw", "--perftest", "-n", "20", "-s", "8192", "-m", "2048"},
			[]string{"write-bw", "--perftest", "-n", "20", "-s", "8192", "-m", "1024"}, "1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLIPairCM(t, tc.srv, tc.cli)
			require.Equal(t, exitOK, r.srvCode, "server")
			require.Equal(t, exitOK, r.cliCode, "client")
			for _, out := range []string{r.srvOut, r.cliOut} {
				assert.Contains(t, out, " Mtu             : "+tc.want+"[B]\n")
			}
		})
	}
}
