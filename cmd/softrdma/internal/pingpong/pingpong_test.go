package pingpong

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
)

// pair runs a server and a client in this process, each with its own
// device on a loopback address of its own at UDP port 4791 (the exchange
// carries no port, as with a stock peer), and returns their outputs.
func pair(t *testing.T, srv, cli Options) (srvOut, cliOut string, srvErr, cliErr error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	net3 := fmt.Sprintf("127.%d.%d.", 100+rand.IntN(100), rand.IntN(250))
	var so, co bytes.Buffer
	srv.Listener, srv.Stdout, srv.Bind = ln, &so, net3+"2"
	cli.Server, cli.Port, cli.Stdout, cli.Bind = "127.0.0.1", ln.Addr().(*net.TCPAddr).Port, &co, net3+"1"
	srv.Logf, cli.Logf = t.Logf, t.Logf
	var wg sync.WaitGroup
	wg.Go(func() { srvErr = Run(ctx, srv) })
	cliErr = Run(ctx, cli)
	if cliErr != nil {
		cancel()
	}
	wg.Wait()
	return so.String(), co.String(), srvErr, cliErr
}

var (
	reLocal  = regexp.MustCompile(`(?m)^  local address:  LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID (\S+)$`)
	reRemote = regexp.MustCompile(`(?m)^  remote address: LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID (\S+)$`)
	reBytes  = regexp.MustCompile(`(?m)^(\d+) bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$`)
	reIters  = regexp.MustCompile(`(?m)^(\d+) iters in \d+\.\d\d seconds = \d+\.\d\d usec/iter$`)
)

func TestPingpong(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options // both sides
	}{
		{"defaults", Options{Iters: 20, GIDIndex: 1}},
		{"events chk verify", Options{Iters: 50, GIDIndex: 1, Events: true, Check: true, Verify: true}},
		{"small", Options{Iters: 30, GIDIndex: 0, Size: 1, Verify: true}},
		{"mtu256 odd size", Options{Iters: 10, GIDIndex: 1, Size: 10000, MTU: 256, Check: true, Verify: true, RxDepth: 2}},
		{"zero size", Options{Iters: 5, GIDIndex: 1, Size: 0, Verify: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			if o.Size == 0 && tc.name != "zero size" {
				o.Size = DefaultSize
			}
			if o.MTU == 0 {
				o.MTU = DefaultMTU
			}
			if o.RxDepth == 0 {
				o.RxDepth = DefaultRxDepth
			}
			so, co, serr, cerr := pair(t, o, o)
			require.NoError(t, cerr, "client:\n%s", co)
			require.NoError(t, serr, "server:\n%s", so)
			for side, out := range map[string]string{"server": so, "client": co} {
				l, r := reLocal.FindStringSubmatch(out), reRemote.FindStringSubmatch(out)
				require.NotNil(t, l, "%s output:\n%s", side, out)
				require.NotNil(t, r, "%s output:\n%s", side, out)
				assert.True(t, strings.HasPrefix(l[1], "::ffff:127."), "%s GID %s", side, l[1])
				assert.Equal(t, fmt.Sprint(o.Size*o.Iters*2), reBytes.FindStringSubmatch(out)[1], side)
				assert.Equal(t, fmt.Sprint(o.Iters), reIters.FindStringSubmatch(out)[1], side)
				if o.Verify {
					assert.Contains(t, out, fmt.Sprintf("verified %d messages of %d bytes", o.Iters, o.Size), side)
				}
				assert.NotContains(t, out, "invalid data")
			}
			assert.Equal(t, reLocal.FindStringSubmatch(so)[1], reRemote.FindStringSubmatch(co)[1])
			assert.Equal(t, reLocal.FindStringSubmatch(co)[1], reRemote.FindStringSubmatch(so)[1])
		})
	}
}

func TestPingpongChkFindsBadData(t *testing.T) {
	// The client runs without -c (its pages start with 0x7b), the server
	// with -c: the server reports each page as rc_pingpong does, and fails.
	o := Options{Iters: 3, GIDIndex: 1, Size: 3 * 4096, MTU: 1024, RxDepth: 10}
	s := o
	s.Check = true
	so, co, serr, cerr := pair(t, s, o)
	require.NoError(t, cerr, co)
	require.ErrorIs(t, serr, ErrData)
	for p := range 3 {
		assert.Contains(t, so, fmt.Sprintf("invalid data in page %d\n", p))
	}
}

func TestVerify(t *testing.T) {
	r := &run{o: &Options{Verify: true}}
	msg := []byte("abcd")
	require.NoError(t, r.verify(&softrdma.WC{ByteLen: 4}, msg, 1)) // server: the reference
	require.NoError(t, r.verify(&softrdma.WC{ByteLen: 4}, msg, 2))
	assert.ErrorIs(t, r.verify(&softrdma.WC{ByteLen: 3}, msg, 3), ErrData)
	msg[2] = 'x'
	err := r.verify(&softrdma.WC{ByteLen: 4}, msg, 4)
	assert.ErrorIs(t, err, ErrData)
	assert.ErrorContains(t, err, "message 4 differs at byte 2")
	assert.Equal(t, 2, r.checks)
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Iters: 1, RxDepth: 1, MTU: 1000}, "-m 1000"},
		{Options{Iters: 0, RxDepth: 1, MTU: 1024}, "-n 0"},
		{Options{Iters: 1, RxDepth: 0, MTU: 1024}, "-r 0"},
		{Options{Iters: 1, RxDepth: 1, MTU: 1024, Size: -1}, "-s -1"},
		{Options{Iters: 1, RxDepth: 1, MTU: 1024, Port: 70000}, "-p 70000"},
		{Options{Iters: 1, RxDepth: 1, MTU: 1024, SL: 16}, "-l 16"},
		{Options{Iters: 1, RxDepth: 1, MTU: 1024, IdleTimeout: time.Nanosecond}, "--idle-timeout 1ns: must be 0 (wait for ever) or at least 100ms"},
		{Options{Iters: 1, RxDepth: 1, MTU: 1024, IdleTimeout: 99 * time.Millisecond}, "--idle-timeout 99ms"},
	} {
		err := tc.o.Validate()
		var ue *UsageError
		require.ErrorAs(t, err, &ue, "%+v", tc.o)
		assert.Contains(t, err.Error(), tc.want)
	}
	_, err := parseBind("0.0.0.0")
	assert.Error(t, err)
	ap, err := parseBind("10.0.0.1")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1:4791", ap.String())
	ap, err = parseBind("[fd00::1]:5000")
	require.NoError(t, err)
	assert.Equal(t, "[fd00::1]:5000", ap.String())
}

func TestClientConnectTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	start := time.Now()
	err = Run(context.Background(), Options{Server: "127.0.0.1", Port: port, Iters: 1, RxDepth: 1, MTU: 1024,
		ConnectTimeout: 500 * time.Millisecond})
	assert.ErrorContains(t, err, fmt.Sprintf("couldn't connect to 127.0.0.1:%d", port))
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "retried")
}

// TestServerBadBindFailsAtOnce: with --bind IP the device opens before the
// wait for a peer (pp_init_ctx runs before the exchange), so an address
// that is not this host's (TEST-NET-2), a UDP port in use or a --pcap path
// that cannot be created fails at once instead of after a client came.
func TestServerBadBindFailsAtOnce(t *testing.T) {
	busy, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer busy.Close()
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Bind: "198.51.100.7"}, "couldn't open the device"},
		{Options{Bind: busy.LocalAddr().String()}, "address already in use"},
		{Options{Bind: "127.0.0.1:0", Pcap: "/nonexistent/dir/x.pcap"}, "--pcap"},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		tc.o.Listener, tc.o.Iters, tc.o.RxDepth, tc.o.MTU, tc.o.Size = ln, 1, 1, 1024, 64
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = Run(ctx, tc.o)
		cancel()
		ln.Close()
		require.Error(t, err, tc.o.Bind)
		assert.ErrorContains(t, err, tc.want)
		assert.NotErrorIs(t, err, context.DeadlineExceeded, "it waited for a client")
	}
}
