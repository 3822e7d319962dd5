package perf

import (
	"context"
	"io"
	"net"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// freezingProxy forwards one TCP connection (the exchange) until frozen;
// then it forwards nothing more in either direction and keeps both ends
// open, as a link that died does: no byte and no FIN or RST gets through,
// and TCP on each side would retransmit for minutes.
type freezingProxy struct {
	frozen atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

// listen starts the proxy to addr and returns its port; it closes at the
// end of the test.
func (p *freezingProxy) listen(t *testing.T, addr string) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	go func() {
		a, err := ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", addr)
		if err != nil {
			a.Close()
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, a, b)
		p.mu.Unlock()
		go p.pipe(a, b)
		go p.pipe(b, a)
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// pipe copies from src to dst until frozen; once frozen it reads and
// drops, and passes on neither an end nor an error.
func (p *freezingProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.frozen.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !p.frozen.Load() && err == io.EOF {
				dst.(*net.TCPConn).CloseWrite()
			}
			return
		}
	}
}

// killLinkAtRunStart makes the link die, in this process, once both sides
// started a round's run (both passed the barrier): the client's device
// loses every packet (--impair loss=1, set by the caller) and the proxy
// of the exchange freezes. Neither side's run goes on before the link is
// dead: the first side at the hook waits for the second. (It once ran on:
// a loaded machine that kept the second side from its hook for longer
// than --idle-timeout let the first side's result cross the link still
// alive, and the other side failed on that result, not on the dead link.)
//
// late, if not 0, keeps the server from its hook that long, as a loaded
// machine that does not schedule it: the client, its bounds running,
// waits for it at the hook.
func killLinkAtRunStart(t *testing.T, p *freezingProxy, late time.Duration) {
	var started atomic.Int32
	dead := make(chan struct{})
	testHookRunSide = func(s *session) {
		if s.server && late > 0 {
			time.Sleep(late) // not a timer under test: a goroutine not scheduled
		}
		if started.Add(1) == 2 {
			p.frozen.Store(true)
			close(dead)
		}
		<-dead
	}
	t.Cleanup(func() { testHookRunSide = nil })
}

// TestDeadLinkBoundsBothSides: when the whole link dies during a round
// (the data path and the exchange's TCP connection), neither side waits
// for TCP to give up (about 150 s): in an -n run the client fails after
// --idle-timeout and at most peerGrace more (not drainLimit more: its
// limit said 300ms), and the server, which has no completions, after
// --idle-timeout without a packet from the client and no result; in a -D
// run the client fails after its drain limit and the server once the
// client's result did not come as long again after that.
func TestDeadLinkBoundsBothSides(t *testing.T) {
	const idle = 300 * time.Millisecond
	for _, tc := range []struct {
		name    string
		test    Test
		p       Params
		drain   time.Duration // drainMin, if not 0
		cliWant string
		srvWant string
		within  time.Duration
		late    time.Duration // the server's lateness to its run (killLinkAtRunStart)
	}{
		{"write-bw -n", WriteBW, Params{Size: 4096, Iters: 100_000_000}, 0,
			`^no completion for 300ms \(--idle-timeout\) after 0 of 100000000 iterations`,
			`^nothing received from the peer for 300ms \(--idle-timeout\) during the run and no result from it over the exchange: ` +
				`the peer or the path to it is probably dead \(a link that died takes the exchange's TCP connection with it; `,
			idle + peerGrace + 3*time.Second, 0},
		{"send-bw -D", SendBW, Params{Duration: 300 * time.Millisecond}, 200 * time.Millisecond,
			`^-D 300ms: the work requests still outstanding did not complete within 300ms after the run, and no result came ` +
				`from the server at 127\.0\.0\.1:\d+ in the 300ms after that \(300ms \+ 300ms \+ 300ms allowed, (\d+\.\d)s waited in all\): ` +
				`the server or the path to it is probably dead`,
			`^-D 300ms: the peer's run did not end and no result came from it within 900ms \(the duration, 300ms for its work requests ` +
				`still outstanding, and 300ms for its result\): the peer or the path to it is probably dead`,
			900*time.Millisecond + 3*time.Second, 0},
		{"write-bw -D", WriteBW, Params{Duration: 300 * time.Millisecond}, 200 * time.Millisecond,
			`^-D 300ms: the work requests still outstanding did not complete within 300ms after the run, and no result came ` +
				`from the server at 127\.0\.0\.1:\d+ in the 300ms after that \(300ms \+ 300ms \+ 300ms allowed, (\d+\.\d)s waited in all\): `,
			`^-D 300ms: the peer's run did not end and no result came from it within 900ms`,
			900*time.Millisecond + 3*time.Second, 0},
		// A side that reached its run late, its bounds already running
		// (here the client, held at the hook): the time it says it waited
		// in all is still at least the limits that expired (it once
		// counted from after the stall: "0.6s waited" of 0.9s allowed).
		{"write-bw -D, late", WriteBW, Params{Duration: 300 * time.Millisecond}, 200 * time.Millisecond,
			`^-D 300ms: the work requests still outstanding did not complete within 300ms after the run, and no result came ` +
				`from the server at 127\.0\.0\.1:\d+ in the 300ms after that \(300ms \+ 300ms \+ 300ms allowed, (\d+\.\d)s waited in all\): `,
			`^-D 300ms: the peer's run did not end and no result came from it within 900ms`,
			900*time.Millisecond + 3*time.Second + 600*time.Millisecond, 600 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.drain != 0 {
				old := drainMin
				drainMin = tc.drain
				t.Cleanup(func() { drainMin = old })
			}
			p := &freezingProxy{}
			killLinkAtRunStart(t, p, tc.late)
			start := time.Now()
			r := runPairWith(t, tc.test,
				Options{IdleTimeout: idle, Logf: func(string, ...any) {}},
				Options{Params: tc.p, Impair: "loss=1", IdleTimeout: idle},
				pairOpts{timeout: 30 * time.Second, via: func(addr string) int { return p.listen(t, addr) }})
			took := time.Since(start) // until both sides returned
			require.Error(t, r.cliErr)
			assert.Regexp(t, tc.cliWant, r.cliErr.Error())
			assert.NotContains(t, r.cliErr.Error(), "context deadline exceeded", "Go's text, not the user's")
			if m := regexp.MustCompile(tc.cliWant).FindStringSubmatch(r.cliErr.Error()); len(m) > 1 {
				// The time said is the time waited: at least the three
				// limits (0.9s), at most the test's own bound.
				waited, err := time.ParseDuration(m[1] + "s")
				require.NoError(t, err)
				assert.GreaterOrEqual(t, waited, 900*time.Millisecond, "the client's error says it waited %v", waited)
				assert.Less(t, waited, tc.within)
			}
			require.Error(t, r.srvErr)
			assert.Regexp(t, tc.srvWant, r.srvErr.Error())
			assert.NotContains(t, r.srvErr.Error(), "context deadline exceeded", "the pair's own time limit ended the server")
			assert.Less(t, took, tc.within)
		})
	}
}

// TestPassiveServerLetsTheClientExplain: when only the data path died
// (--impair loss=1; the exchange works), the passive server's watch of
// the packets it receives fires about when the client's watch of its
// completions does, here first (a shorter --idle-timeout); it then waits
// for the client's result, which says more, instead of failing first and
// ending the client's run with its own story.
func TestPassiveServerLetsTheClientExplain(t *testing.T) {
	r := runPair(t, WriteBW, Options{IdleTimeout: 200 * time.Millisecond},
		Options{Params: Params{Size: 4096, Iters: 50}, Impair: "loss=1", IdleTimeout: 600 * time.Millisecond})
	require.Error(t, r.cliErr)
	assert.Regexp(t, `^no completion for 600ms \(--idle-timeout\) after 0 of 50 iterations`, r.cliErr.Error())
	require.Error(t, r.srvErr)
	assert.Regexp(t, `^peer: no completion for 600ms \(--idle-timeout\)`, r.srvErr.Error())
}

// TestPeerGoneMidRunIsNamed: a client whose connection closes during the
// run (its process killed) is named by the server, with what it waited
// for, not "exchange: waiting for result: unexpected EOF"; a client
// interrupted (Ctrl-C, SIGTERM: Run's context ends) tells the server so,
// not "context canceled".
func TestPeerGoneMidRunIsNamed(t *testing.T) {
	t.Run("killed", func(t *testing.T) {
		p := &freezingProxy{}
		var proxyPort int
		var started atomic.Int32
		testHookRunSide = func(*session) {
			if started.Add(1) == 2 {
				p.mu.Lock()
				for _, c := range p.conns {
					c.Close()
				}
				p.mu.Unlock()
			}
		}
		t.Cleanup(func() { testHookRunSide = nil })
		r := runPairWith(t, WriteBW, Options{}, Options{Params: Params{Size: 4096, Iters: 100_000_000}},
			pairOpts{timeout: 30 * time.Second, via: func(addr string) int { proxyPort = p.listen(t, addr); return proxyPort }})
		require.Error(t, r.srvErr)
		// The server (passive: it serves the client's WRITEs) was
		// serving the run when the client's connection closed.
		assert.Regexp(t, `^the peer at 127\.0\.0\.1:\d+ closed the connection \((unexpected EOF|connection reset)\) `+
			`during the run, which this side was serving; no result came from it \(was its process killed\?\)$`,
			r.srvErr.Error())
		require.Error(t, r.cliErr)
		// The client was still posting its 100000000 WRITEs.
		assert.Regexp(t, `^the peer at 127\.0\.0\.1:\d+ closed the connection \((unexpected EOF|connection reset)\) `+
			`while this side was still running the test; no result came from it`, r.cliErr.Error())
	})
	t.Run("interrupted", func(t *testing.T) {
		var cancel context.CancelFunc
		testHookRunSide = func(s *session) {
			if !s.server {
				cancel()
			}
		}
		t.Cleanup(func() { testHookRunSide = nil })
		r := runPairWith(t, SendBW, Options{}, Options{Params: Params{Size: 4096, Iters: 100_000_000}},
			pairOpts{timeout: 30 * time.Second, cliCtx: func(ctx context.Context) context.Context {
				ctx, cancel = context.WithCancel(ctx)
				return ctx
			}})
		require.ErrorIs(t, r.cliErr, context.Canceled)
		require.Error(t, r.srvErr)
		assert.EqualError(t, r.srvErr, "peer: interrupted (SIGINT or SIGTERM)")
	})
}

// TestDeliverPeerResultBeforeStop: when the peer's result ends the run
// (its run context cancelled, or the passive side's wait on spoke), the
// result is already in peerc: the passive side then reads it with a limit
// of 0 (resultWait), and a result delivered after the cancel or the close
// of spoke was lost on a loaded machine, ending write-bw's server with a
// bare "context canceled" (TestIdleTimeoutBoundsADeadPath/write-bw).
func TestDeliverPeerResultBeforeStop(t *testing.T) {
	peerc := make(chan peerMsg, 1)
	spoke := make(chan struct{})
	stopped := false
	deliverPeerResult(peerMsg{r: roundResult{Err: "no completion"}}, peerc, spoke, func() {
		stopped = true
		assert.True(t, closed(spoke), "spoke is closed before the run is stopped")
		require.Len(t, peerc, 1, "the result is in peerc before the run is stopped")
	})
	assert.True(t, stopped)
	pm := <-peerc
	assert.Equal(t, "no completion", pm.r.Err)
}

// TestInterruptedSideReportsItsInterrupt: a side whose Run's context
// ended (Ctrl-C, SIGTERM) reports that, whatever the peer's result says:
// the peer, stopped by this side's "interrupted", reports "context
// canceled", and the read of its result could take that result before it
// saw the end of the context (both ready, on a loaded machine: 2 runs of
// 15 of TestPeerGoneMidRunIsNamed/interrupted said "peer: context
// canceled"). A side whose run only stopped because the peer failed (its
// own context alive) reports the peer's failure.
func TestInterruptedSideReportsItsInterrupt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := &session{runCtx: ctx}
	for _, pm := range []peerMsg{
		{r: roundResult{Err: context.Canceled.Error()}}, // the peer's result came first
		{err: context.Canceled},                         // the read saw the context's end first
	} {
		err := s.roundErr(context.Canceled, nil, pm)
		require.ErrorIs(t, err, context.Canceled, "%+v", pm)
		assert.NotContains(t, err.Error(), "peer", "%+v", pm)
	}
	live := &session{runCtx: context.Background()}
	err := live.roundErr(context.Canceled, nil, peerMsg{r: roundResult{Err: peerInterrupted}})
	assert.EqualError(t, err, "peer: "+peerInterrupted)
}
