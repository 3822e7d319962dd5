package pingpong

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loBind returns a device address of its own for a test: a random
// loopback IP at UDP port 4791.
func loBind() string {
	return fmt.Sprintf("127.%d.%d.%d", 100+rand.IntN(100), rand.IntN(250), 1+rand.IntN(250))
}

// setupOpts are the options of one side of the setup tests.
func setupOpts(limit time.Duration) Options {
	return Options{Iters: 1, RxDepth: 1, MTU: 1024, Size: 64, GIDIndex: 1, Bind: loBind(), SetupTimeout: limit}
}

// asServer runs a server with o on a listener of its own, lets peer play
// the client on a connection to it, and returns the server's error and
// the peer's address as the server sees it. It fails the test if the
// server has not returned within wait.
func asServer(t *testing.T, o Options, wait time.Duration, peer func(c net.Conn)) (error, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	o.Listener = ln
	done := make(chan error, 1)
	go func() { done <- Run(context.Background(), o) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	go peer(c)
	select {
	case err := <-done:
		return err, c.LocalAddr().String()
	case <-time.After(wait):
		c.Close()
		<-done
		t.Fatalf("the server did not return within %v", wait)
		return nil, ""
	}
}

// asClient runs a client with o against a listener whose one connection
// peer plays, and returns the client's error and the listener's address.
func asClient(t *testing.T, o Options, peer func(c net.Conn)) (error, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			peer(c)
		}
	}()
	o.Server, o.Port = "127.0.0.1", ln.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = Run(ctx, o)
	assert.NoError(t, ctx.Err(), "the client waited until the test's deadline")
	return err, ln.Addr().String()
}

// silent reads what its peer sends and says nothing, until the peer
// leaves.
func silent(c net.Conn) { io.Copy(io.Discard, c) }

// TestSetupBoundsASilentPeer: a TCP peer that connects to (or listens on)
// the exchange port and says nothing fails the run after the setup limit
// with a message that names the peer and the limit, on either side,
// instead of hanging it.
func TestSetupBoundsASilentPeer(t *testing.T) {
	const want = " connected but did not complete the exchange within 200ms: is it a softrdma or ibv_rc_pingpong peer?"
	t.Run("server", func(t *testing.T) {
		start := time.Now()
		err, peer := asServer(t, setupOpts(200*time.Millisecond), 20*time.Second, silent)
		assert.EqualError(t, err, "the peer at "+peer+want)
		assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
		var te *SetupTimeoutError
		assert.ErrorAs(t, err, &te)
	})
	t.Run("client", func(t *testing.T) {
		err, peer := asClient(t, setupOpts(200*time.Millisecond), silent)
		assert.EqualError(t, err, "the peer at "+peer+want)
	})
	t.Run("server after a partial message", func(t *testing.T) {
		// A valid beginning, then silence: still bounded.
		err, peer := asServer(t, setupOpts(200*time.Millisecond), 20*time.Second, func(c net.Conn) {
			c.Write([]byte("0000:000011:be15"))
			silent(c)
		})
		assert.EqualError(t, err, "the peer at "+peer+want)
	})
	t.Run("server without done", func(t *testing.T) {
		// The address, then no "done".
		err, peer := asServer(t, setupOpts(200*time.Millisecond), 20*time.Second, func(c net.Conn) {
			c.Write(goldenClient)
			silent(c)
		})
		assert.EqualError(t, err, "the peer at "+peer+want)
	})
	t.Run("default", func(t *testing.T) {
		o := setupOpts(0)
		require.NoError(t, o.Validate())
		assert.Equal(t, DefaultSetupTimeout, o.SetupTimeout)
		assert.Equal(t, 10*time.Second, DefaultSetupTimeout)
	})
}

// TestSetupRefusesGarbage: a peer whose first bytes cannot begin an
// address message (an HTTP server's answer, shorter than the message) is
// refused at once, on either side, not after the setup limit or when it
// closes the connection.
func TestSetupRefusesGarbage(t *testing.T) {
	const garbage = "HTTP/1.1 200 OK\r\n\r\n"
	talk := func(c net.Conn) {
		c.Write([]byte(garbage))
		silent(c)
	}
	const want = " is not a softrdma or ibv_rc_pingpong peer: pingpong: malformed address message: \"HTTP/1.1 200 OK\\r\\n\\r\\n\""
	t.Run("server", func(t *testing.T) {
		err, peer := asServer(t, setupOpts(time.Minute), 20*time.Second, talk)
		assert.EqualError(t, err, "the peer at "+peer+want)
		assert.ErrorIs(t, err, ErrBadMsg)
	})
	t.Run("client", func(t *testing.T) {
		start := time.Now()
		err, peer := asClient(t, setupOpts(time.Minute), talk)
		assert.EqualError(t, err, "the peer at "+peer+want)
		assert.Less(t, time.Since(start), 20*time.Second)
	})
	t.Run("bad done", func(t *testing.T) {
		err, peer := asServer(t, setupOpts(time.Minute), 20*time.Second, func(c net.Conn) {
			c.Write(goldenClient)
			io.ReadFull(c, make([]byte, MsgSize))
			c.Write([]byte("HTTP"))
			silent(c)
		})
		assert.EqualError(t, err, "the peer at "+peer+` is not a softrdma or ibv_rc_pingpong peer: `+
			`pingpong: malformed address message: expected "done\0", got "HTTP"`)
	})
}

// TestSetupPeerClosed: a peer that closes (or resets) the connection
// before its address is named simply.
func TestSetupPeerClosed(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		err, peer := asServer(t, setupOpts(time.Minute), 20*time.Second, func(c net.Conn) {
			c.(*net.TCPConn).SetLinger(0) // a reset
			c.Close()
		})
		assert.EqualError(t, err, "the peer at "+peer+" closed the connection before sending its address")
	})
	t.Run("client", func(t *testing.T) {
		err, peer := asClient(t, setupOpts(time.Minute), func(c net.Conn) {
			io.ReadFull(c, make([]byte, MsgSize))
		})
		assert.EqualError(t, err, "the peer at "+peer+" closed the connection before sending its address")
	})
	t.Run("partial", func(t *testing.T) {
		err, peer := asServer(t, setupOpts(time.Minute), 20*time.Second, func(c net.Conn) {
			c.Write([]byte("0000:0000"))
			c.Close()
		})
		assert.EqualError(t, err, "the peer at "+peer+" closed the connection before sending its address (9 of "+
			strconv.Itoa(MsgSize)+" bytes received)")
	})
}

// TestMsgPrefix: the bytes that can begin a message Parse accepts.
func TestMsgPrefix(t *testing.T) {
	m := (&Dest{LID: 0xabcd, QPN: 0x123456, PSN: 0xfedcba, GID: gid("::ffff:192.168.77.11")}).Marshal()
	for i := 0; i <= MsgSize; i++ {
		assert.True(t, msgPrefix(m[:i]), "%q", m[:i])
	}
	assert.True(t, msgPrefix(goldenClient))
	assert.True(t, msgPrefix([]byte("0:1:2:")), "short fields")
	for _, bad := range []string{"H", "HTTP/1.1 200 OK\r\n\r\n", ":", "0000::", "0:1:2:3:", "0000:0000g",
		"0:1:2:000000000000000000000000000000000", "0:1:2:3\x00", "0000:00 ", "\x00"} {
		assert.False(t, msgPrefix([]byte(bad)), "%q", bad)
	}
}
