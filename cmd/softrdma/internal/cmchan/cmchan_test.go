package cmchan_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/cmchan"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/softrdmatest"
)

const port = 18515

// pair connects a channel from B (client) to A (server) over the
// in-memory pipe, in a synctest bubble's fake time.
func pair(t *testing.T) (srv, cli *cmchan.Conn, p *softrdmatest.Pair) {
	t.Helper()
	p = softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true, NoPcap: true, NoConnect: true})
	cmA, err := rdmacm.Open(p.A.Dev, rdmacm.Options{Logf: t.Logf})
	require.NoError(t, err)
	cmB, err := rdmacm.Open(p.B.Dev, rdmacm.Options{Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() { cmA.Close(); cmB.Close() })
	l, err := cmA.Listen(port, 1)
	require.NoError(t, err)
	param := rdmacm.ConnParam{RetryCount: 7, RNRRetryCount: 7}
	type res struct {
		c   *cmchan.Conn
		err error
	}
	accepted := make(chan res, 1)
	go func() {
		r, err := l.GetRequest(context.Background())
		if err != nil {
			accepted <- res{nil, err}
			return
		}
		c, err := cmchan.Accept(context.Background(), r, p.A.Dev, p.A.PD, param)
		accepted <- res{c, err}
	}()
	cli, err = cmchan.Dial(context.Background(), cmB, p.B.Dev, p.B.PD,
		netip.AddrPortFrom(p.A.Dev.LocalAddr().Addr(), port), param)
	require.NoError(t, err)
	r := <-accepted
	require.NoError(t, r.err)
	t.Cleanup(func() { cli.Close(); r.c.Close() })
	return r.c, cli, p
}

// TestMessagesAndStream: each Write is one message (a Read with room for
// more returns one message's bytes, as perftest's one 56-byte receive
// gets one step); a Write longer than MaxMessage arrives whole as a
// stream; both directions at once.
func TestMessagesAndStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, cli, p := pair(t)
		assert.Equal(t, "rdma_cm", srv.RemoteAddr().Network())
		assert.Equal(t, netip.AddrPort(srv.LocalAddr().(cmchan.Addr)).Port(), uint16(port))

		for _, m := range [][]byte{[]byte("6.06\x00"), {0, 0, 0x10, 0}, []byte("3\x00")} {
			n, err := cli.Write(m)
			require.NoError(t, err)
			require.Equal(t, len(m), n)
			buf := make([]byte, 100)
			n, err = srv.Read(buf)
			require.NoError(t, err)
			assert.Equal(t, m, buf[:n], "one Write, one message")
		}

		big := make([]byte, 3*cmchan.MaxMessage+123)
		for i := range big {
			big[i] = byte(i * 13)
		}
		back := make([]byte, len(big))
		errc := make(chan error, 2)
		go func() { // the server echoes, the client reads concurrently with its write
			got := make([]byte, len(big))
			if _, err := io.ReadFull(srv, got); err != nil {
				errc <- err
				return
			}
			_, err := srv.Write(got)
			errc <- err
		}()
		go func() {
			_, err := io.ReadFull(cli, back)
			errc <- err
		}()
		n, err := cli.Write(big)
		require.NoError(t, err)
		require.Equal(t, len(big), n)
		require.NoError(t, <-errc)
		require.NoError(t, <-errc)
		require.True(t, bytes.Equal(big, back))
		sent, rcvd := cli.Messages()
		assert.Equal(t, [2]uint64{3 + 4, 4}, [2]uint64{sent, rcvd}, "3 small messages and 4 for the big one each way")
		assert.Zero(t, p.A.Dev.Counters().SendRNRErr.Load()+p.B.Dev.Counters().SendRNRErr.Load(),
			"the posted receives took every message")
	})
}

// TestEOFAfterDisconnect: the peer's Close (a DREQ) ends the stream after
// the messages that arrived before it; writes then fail.
func TestEOFAfterDisconnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, cli, _ := pair(t)
		_, err := cli.Write([]byte("last words"))
		require.NoError(t, err)
		require.NoError(t, cli.Close())
		<-srv.CM().Done()
		got, err := io.ReadAll(srv)
		require.NoError(t, err)
		assert.Equal(t, "last words", string(got))
		_, err = srv.Write([]byte("x"))
		require.Error(t, err)
		_, err = cli.Write([]byte("x"))
		require.ErrorIs(t, err, net.ErrClosed)
	})
}

// TestDeadlineAndClose: a read deadline ends a wait with
// os.ErrDeadlineExceeded and leaves the channel usable; Close ends a
// pending Read with net.ErrClosed.
func TestDeadlineAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, cli, _ := pair(t)
		require.NoError(t, srv.SetReadDeadline(time.Now().Add(time.Second)))
		start := time.Now()
		_, err := srv.Read(make([]byte, 8))
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		assert.Equal(t, time.Second, time.Since(start))
		require.NoError(t, srv.SetDeadline(time.Time{}))
		_, err = cli.Write([]byte("ok"))
		require.NoError(t, err)
		buf := make([]byte, 8)
		n, err := srv.Read(buf)
		require.NoError(t, err)
		assert.Equal(t, "ok", string(buf[:n]))

		errc := make(chan error, 1)
		go func() {
			_, err := srv.Read(buf)
			errc <- err
		}()
		synctest.Wait()
		require.NoError(t, srv.Close())
		err = <-errc
		require.True(t, errors.Is(err, net.ErrClosed), "%v", err)
	})
}
