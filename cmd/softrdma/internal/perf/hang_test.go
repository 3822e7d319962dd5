package perf

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/exchange"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/idlewatch"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// fakeServer listens on a loopback port for one connection, sends it say
// (nothing if empty) and then reads until the peer leaves; it returns the
// port. The listener closes at the end of the test.
func fakeServer(t *testing.T, say string) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			c.Write([]byte(say))
			io.Copy(io.Discard, c)
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestSetupBoundsASilentPeer: a TCP peer that connects to the exchange
// port and says nothing fails the run after the setup's time limit with a
// message that names the peer and the limit, on either side, instead of
// hanging it.
func TestSetupBoundsASilentPeer(t *testing.T) {
	t.Run("client", func(t *testing.T) {
		port := fakeServer(t, "") // silent until the client leaves
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		_, err := Run(ctx, &Options{Test: WriteBW, Server: "127.0.0.1", Port: port, Bind: "127.0.0.1:0",
			SetupTimeout: 200 * time.Millisecond})
		require.Error(t, err)
		assert.EqualError(t, err, "the peer at 127.0.0.1:"+strconv.Itoa(port)+
			" connected but did not complete the exchange within 200ms: is it a softrdma or perftest peer?")
		assert.Less(t, time.Since(start), 10*time.Second)
	})
	t.Run("server", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := Run(context.Background(), &Options{Test: WriteBW, Listener: ln, Bind: "127.0.0.1:0",
				SetupTimeout: 200 * time.Millisecond})
			done <- err
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		select {
		case err := <-done:
			require.Error(t, err)
			assert.EqualError(t, err, "the peer at "+c.LocalAddr().String()+
				" connected but did not complete the exchange within 200ms: is it a softrdma or perftest peer?")
		case <-time.After(20 * time.Second):
			t.Fatal("the server waits for ever for a silent client")
		}
	})
}

// TestSetupRefusesGarbage: a peer whose first bytes cannot begin
// perftest's version exchange (an HTTP server or client) is refused at
// once, long before the setup's time limit.
func TestSetupRefusesGarbage(t *testing.T) {
	const garbage = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
	t.Run("client", func(t *testing.T) {
		port := fakeServer(t, garbage)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		_, err := Run(ctx, &Options{Test: WriteBW, Server: "127.0.0.1", Port: port, Bind: "127.0.0.1:0"})
		require.Error(t, err)
		assert.Regexp(t, `^the peer at 127.0.0.1:`+strconv.Itoa(port)+` is not a softrdma or perftest peer: it sent "HTTP/1.1 `, err.Error())
		assert.Less(t, time.Since(start), 5*time.Second, "refused at once, not after the setup limit")
	})
	t.Run("server", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := Run(context.Background(), &Options{Test: WriteBW, Listener: ln, Bind: "127.0.0.1:0"})
			done <- err
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Write([]byte("GET / HTTP/1.1\r\n")) // 16 bytes, and no more
		require.NoError(t, err)
		select {
		case err := <-done:
			require.Error(t, err)
			assert.Regexp(t, `is not a softrdma or perftest peer: it sent "G`, err.Error())
		case <-time.After(5 * time.Second):
			t.Fatal("the server did not refuse a client speaking HTTP at once")
		}
	})
}

// TestSetupPeerClosed: a peer that connects and closes (or resets) the
// connection before its version is named, as the other setup errors name
// it, on either side.
func TestSetupPeerClosed(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		for _, reset := range []bool{false, true} {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() {
				_, err := Run(context.Background(), &Options{Test: WriteBW, Listener: ln, Bind: "127.0.0.1:0"})
				done <- err
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			if reset {
				c.(*net.TCPConn).SetLinger(0)
			}
			peer := c.LocalAddr().String()
			c.Close()
			select {
			case err := <-done:
				assert.EqualError(t, err, "the peer at "+peer+" closed the connection before sending its version", "reset %v", reset)
			case <-time.After(20 * time.Second):
				t.Fatal("the server waits for ever for a client that left")
			}
		}
	})
	t.Run("client", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err == nil {
				io.ReadFull(c, make([]byte, 16)) // the client's version, then nothing
				c.Close()
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err = Run(ctx, &Options{Test: WriteBW, Server: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port, Bind: "127.0.0.1:0"})
		assert.EqualError(t, err, "the peer at "+ln.Addr().String()+" closed the connection before sending its version")
	})
}

// TestIdleTimeoutBoundsADeadPath: in an -n run whose packets are all lost
// (--impair loss=1 on the client: the QPs retry for ever, retry_cnt 7 as
// on rxe), the side waiting for completions fails once none came for
// --idle-timeout, naming the flag and the iterations done, and the other
// side (passive for WRITE and READ: it has no completions) learns it
// through the exchange (send-bw: both wait for completions, and either
// may fail first); neither waits for ever.
func TestIdleTimeoutBoundsADeadPath(t *testing.T) {
	for _, test := range []Test{WriteBW, WriteLat, ReadLat, SendBW} {
		t.Run(test.String(), func(t *testing.T) {
			start := time.Now()
			r := runPair(t, test, Options{IdleTimeout: 300 * time.Millisecond},
				Options{Params: Params{Size: 4096, Iters: 50}, Impair: "loss=1", IdleTimeout: 300 * time.Millisecond})
			require.Error(t, r.cliErr)
			assert.Regexp(t, `^(peer: )?no completion for 300ms \(--idle-timeout\) after 0 of 50 iterations \(-n 50\): `+
				`the peer or the path to it is probably dead`, r.cliErr.Error())
			assert.NotContains(t, r.cliErr.Error(), "context canceled", "the passive peer's stop is no news")
			require.Error(t, r.srvErr, "the server cannot report a run that did not end")
			assert.Contains(t, r.srvErr.Error(), "--idle-timeout")
			assert.Less(t, time.Since(start), 30*time.Second)
		})
	}
}

// TestIdleTimeoutRestartsOnCompletions: the idle timer bounds the time
// between completions, not the run: every completion the run's loops see
// restarts it. The watch's own behaviour (a run longer than the limit
// whose progress keeps coming is not ended; a whole limit without any
// is) is tested on synctest's clock (idlewatch.TestWatch); here the
// run's loops must note each completion, counted, not timed: a limit
// exceeded by a run that waited for its CPU on a loaded machine (the
// race-enabled suite once paused longer than 400 ms between two
// completions) says nothing about the code. One WRITE at a time with
// every one signalled (-t 1, CQ moderation 1): one completion per poll.
func TestIdleTimeoutRestartsOnCompletions(t *testing.T) {
	const iters = 200
	var w *idlewatch.Watch
	testHookRunSide = func(s *session) {
		if !s.server {
			w = s.idle
		}
	}
	t.Cleanup(func() { testHookRunSide = nil })
	r := runPair(t, WriteBW, Options{IdleTimeout: time.Minute},
		Options{Params: Params{Size: 4096, Iters: iters, TxDepth: 1, CQMod: 1}, IdleTimeout: time.Minute})
	requireOK(t, r)
	require.NotNil(t, w, "the client's run had an idle watch")
	assert.GreaterOrEqual(t, w.Notes(), int64(iters), "the idle timer restarted on every completion")
	assert.EqualValues(t, iters, w.Count(), "the iterations the watch would report")
}

// TestIdleTimeoutWithFileSaysTheFile: a --file run whose packets are all
// lost fails on --idle-timeout (on either side: both have completions)
// with the file's messages as what was asked,
// not "-n 5000", a default the user never gave and the run never used
// (a file of 40000 bytes in 4096-byte messages is 10 of them).
func TestIdleTimeoutWithFileSaysTheFile(t *testing.T) {
	in := filepath.Join(t.TempDir(), "in.bin")
	require.NoError(t, os.WriteFile(in, make([]byte, 40000), 0o644))
	r := runPair(t, WriteBW, Options{IdleTimeout: 300 * time.Millisecond, Out: filepath.Join(t.TempDir(), "out.bin")},
		Options{Params: Params{Size: 4096}, File: in, Impair: "loss=1", IdleTimeout: 300 * time.Millisecond})
	require.Error(t, r.cliErr)
	assert.Regexp(t, `^(peer: )?no completion for 300ms \(--idle-timeout\) after 0 of 10 messages \((--file `+
		regexp.QuoteMeta(in)+`|the peer's --file): 40000 bytes in 4096-byte messages\): the peer or the path to it is probably dead`, r.cliErr.Error())
	assert.NotContains(t, r.cliErr.Error(), "-n ")
}

// unansweredListener returns the address of a loopback listener that
// answers no further SYN: its accept queue (listen backlog 0) holds one
// connection, never accepted, and Linux drops a SYN to a full queue, as a
// firewall's DROP rule or a host that is down leaves it unanswered.
func unansweredListener(t *testing.T) string {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, unix.Listen(fd, 0))
	sa, err := unix.Getsockname(fd)
	require.NoError(t, err)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*unix.SockaddrInet4).Port))
	c, err := net.DialTimeout("tcp", addr, 5*time.Second) // fills the queue
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return addr
}

// TestConnectTimeoutBoundsAnUnansweredSYN: --connect-timeout bounds a
// connection attempt whose SYN nothing answers (the kernel would retry it
// for about 2 minutes), and the error names the address and the flag,
// not "i/o timeout" or "context canceled".
func TestConnectTimeoutBoundsAnUnansweredSYN(t *testing.T) {
	addr := unansweredListener(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	_, err := Run(ctx, &Options{Test: WriteBW, Server: host, Port: p, Bind: "127.0.0.1:0", ConnectTimeout: 300 * time.Millisecond})
	require.Error(t, err)
	assert.Equal(t, "connect to the server: no answer from "+addr+" within --connect-timeout 300ms "+
		"(its host is down, or a firewall drops the connection)", err.Error())
	assert.Less(t, time.Since(start), 10*time.Second, "the test's own 20s limit ended it")
	require.NoError(t, ctx.Err(), "the test's own limit ended it")
}

// TestSetupBoundsAPeerSilentAfterItsHello: a client that completes the
// setup (versions, hello; it takes the reply) and then sends nothing, not
// its QP data, fails the server's run after the setup time limit, counted
// afresh once the server is ready for that data, with a message naming
// the peer and what it did not send, instead of holding it for ever.
func TestSetupBoundsAPeerSilentAfterItsHello(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), &Options{Test: WriteBW, Listener: ln, Bind: "127.0.0.1:0",
			SetupTimeout: 300 * time.Millisecond, Logf: t.Logf, Stdout: io.Discard})
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	native, err := exchange.NewPerftest(c, true).ExchangeVersions(true)
	require.NoError(t, err)
	require.True(t, native)
	x, err := exchange.New(c)
	require.NoError(t, err)
	defer x.Close()
	p := Params{Size: 4096, Iters: 50}
	p.Defaults(WriteBW)
	p.Seed, p.FileSize = 1, -1
	require.NoError(t, x.SendJSON(exchange.MsgHello, &p))
	var r reply
	require.NoError(t, x.RecvJSON(context.Background(), exchange.MsgReply, &r))
	select {
	case err := <-done:
		require.Error(t, err)
		assert.EqualError(t, err, "the peer at "+c.LocalAddr().String()+
			" said hello but sent no QP data within 300ms (the setup time limit): is it stopped, or its host or the path down?")
	case <-time.After(20 * time.Second):
		t.Fatal("the server waits for ever for a client silent after its hello")
	}
}

// TestIdleWatchCountsPackets: the idle watch of the side posting the work
// counts the packets its device receives (the peer's ACKs) as progress,
// as the passive side's does, not only completions: with few WRs
// signaled and large messages the first completion comes long after the
// ACKs began (a new-user pass: write-bw -s 1G -n 5 signals only its last
// WRITE, 5 GiB that took 23 s here, and failed after the default 10 s
// with "no completion ...: the peer or the path to it is probably dead"
// while the ACKs kept coming). The watch's reading of its source is tested
// on synctest's clock (idlewatch.TestWatchSource); here, that each side's
// watch reads one.
func TestIdleWatchCountsPackets(t *testing.T) {
	var cli, srv *idlewatch.Watch
	testHookRunSide = func(s *session) {
		if s.server {
			srv = s.idle
		} else {
			cli = s.idle
		}
	}
	t.Cleanup(func() { testHookRunSide = nil })
	r := runPair(t, WriteBW, Options{IdleTimeout: time.Minute},
		Options{Params: Params{Size: 1 << 20, Iters: 5}, IdleTimeout: time.Minute})
	requireOK(t, r)
	require.NotNil(t, cli, "the client's run had an idle watch")
	require.NotNil(t, srv, "the server's run had an idle watch")
	assert.True(t, cli.Sourced(), "the client's watch counts received packets")
	assert.True(t, srv.Sourced(), "the server's watch counts received packets")
}

// TestSetupErrKeepsAnUnacknowledgedMessage: with -R a message of the
// exchange that the peer did not acknowledge within --idle-timeout
// (boundWrites) during the setup fails it as that, not as the setup time
// limit's expiry (the unackedError unwraps to os.ErrDeadlineExceeded, and
// under load a run said "did not complete the exchange within 10s" after
// 1 s); a write or read that the setup limit ended still says the limit.
func TestSetupErrKeepsAnUnacknowledgedMessage(t *testing.T) {
	s := &session{setupLimit: 10 * time.Second, tcpRemote: netip.MustParseAddr("127.0.0.1")}
	unacked := fmt.Errorf("exchange: send hello: %w", &unackedError{300 * time.Millisecond, os.ErrDeadlineExceeded})
	err := s.setupErr(context.Background(), "hello", unacked)
	assert.ErrorAs(t, err, new(*unackedError))
	assert.Regexp(t, `^exchange: send hello: the peer did not acknowledge a message of the exchange \(over rdma_cm\) within 300ms \(--idle-timeout\)`, err.Error())

	err = s.setupErr(context.Background(), "hello", fmt.Errorf("exchange: read: %w", os.ErrDeadlineExceeded))
	assert.ErrorAs(t, err, new(*setupError))
	assert.Regexp(t, `^the peer at 127\.0\.0\.1 connected but did not complete the exchange within 10s: `, err.Error())
}
