package conn_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// newPipe returns a pipe with queues of qlen (0: the default) closed at
// the end of the test.
func newPipe(t testing.TB, qlen int) (a, b *conn.PipeConn) {
	a, b, err := conn.NewPipeWith(conn.PipeConfig{QueueLen: qlen})
	require.NoError(t, err)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestPipeRoundTrip(t *testing.T) {
	goroutineLeakCheck(t)
	a, b := newPipe(t, 0)
	require.Equal(t, netip.MustParseAddrPort("127.0.0.1:4791"), a.LocalAddr())
	require.Equal(t, netip.MustParseAddrPort("127.0.0.2:4791"), b.LocalAddr())
	for _, dir := range []struct{ from, to *conn.PipeConn }{{a, b}, {b, a}} {
		pkts := make([]conn.Packet, 100)
		for i := range pkts {
			pkts[i] = conn.Packet{Buf: newPacket(uint32(i), 16+i*37), Addr: dir.to.LocalAddr()}
		}
		require.NoError(t, dir.from.Send(pkts))
		got := receiveN(t, dir.to, len(pkts), 5*time.Second)
		require.Len(t, got, len(pkts))
		for i, g := range got {
			require.Equal(t, pkts[i].Buf, g.buf)
			require.Equal(t, dir.from.LocalAddr(), g.from)
			// The ICRC covers the pipe's addresses and IPv4 ID 0.
			h := wire.IPHeader{Src: dir.from.LocalAddr().Addr(), Dst: dir.to.LocalAddr().Addr(), DF: true}
			require.Equal(t, wire.PacketICRC(g.buf), wire.ComputeICRC(&h, 4791, 4791, g.buf[:len(g.buf)-4]))
		}
	}
	require.Equal(t, uint64(100), a.Stats().SentDatagrams.Load())
	require.Equal(t, uint64(100), b.Stats().RcvdDatagrams.Load())
	require.Zero(t, a.Stats().BadICRC.Load()+b.Stats().BadICRC.Load())
}

func TestPipeQueueFullDropsAndCounts(t *testing.T) {
	a, b, err := conn.NewPipeWith(conn.PipeConfig{QueueLen: 8})
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	pkts := make([]conn.Packet, 20)
	for i := range pkts {
		pkts[i] = conn.Packet{Buf: newPacket(uint32(i), 64), Addr: b.LocalAddr()}
	}
	require.NoError(t, a.Send(pkts))
	require.Equal(t, uint64(12), b.Stats().RecvQueueFull.Load())
	got := receiveN(t, b, 8, 5*time.Second)
	for i, g := range got {
		require.Equal(t, uint32(i), seqOf(g.buf)) // the first 8 made it
	}
}

func TestPipeClose(t *testing.T) {
	goroutineLeakCheck(t)
	a, b := conn.NewPipe()
	errc := make(chan error, 1)
	go func() {
		_, err := b.Receive(make([]conn.Packet, 4))
		errc <- err
	}()
	require.NoError(t, b.Close())
	require.ErrorIs(t, <-errc, net.ErrClosed)
	// Sending to a closed peer is like UDP to a closed port: no error.
	require.NoError(t, a.Send([]conn.Packet{{Buf: newPacket(0, 64), Addr: b.LocalAddr()}}))
	require.NoError(t, a.Close())
	require.ErrorIs(t, a.Send([]conn.Packet{{Buf: newPacket(0, 64), Addr: b.LocalAddr()}}), net.ErrClosed)
	_, err := a.Receive(make([]conn.Packet, 4))
	require.ErrorIs(t, err, net.ErrClosed)
	require.NoError(t, a.Close()) // idempotent
}

func TestPipeRejectsOtherDestinations(t *testing.T) {
	a, _ := newPipe(t, 0)
	err := a.Send([]conn.Packet{{Buf: newPacket(0, 64), Addr: netip.MustParseAddrPort("127.0.0.3:4791")}})
	require.ErrorIs(t, err, conn.ErrAddressFamily)
	_, _, err = conn.NewPipeWith(conn.PipeConfig{AddrA: netip.MustParseAddrPort("[::1]:1"), AddrB: netip.MustParseAddrPort("127.0.0.1:1")})
	require.ErrorIs(t, err, conn.ErrAddressFamily)
}

func TestPipeIPv6(t *testing.T) {
	a, b, err := conn.NewPipeWith(conn.PipeConfig{AddrA: netip.MustParseAddrPort("[fd00::1]:4791"), AddrB: netip.MustParseAddrPort("[fd00::2]:4791")})
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	require.NoError(t, a.Send([]conn.Packet{{Buf: newPacket(7, 300), Addr: b.LocalAddr()}}))
	got := receiveN(t, b, 1, 5*time.Second)
	require.Len(t, got, 1)
	require.Equal(t, uint32(7), seqOf(got[0].buf))
}

// TestCloseWhileSendStartsTheTimer: a Send that delays a packet starts
// the timer goroutine (armTimer: timer.wg.Add) while Close waits for it
// (shutdown: timer.wg.Wait). Add at a zero count must happen before Wait
// (sync.WaitGroup); it did not, and the race detector reported it. Close
// now stops the timer under txMu, the lock armTimer runs under, and
// armTimer starts nothing once the conn is closed. Meaningful under
// -race, as the tests run.
func TestCloseWhileSendStartsTheTimer(t *testing.T) {
	for i := range 200 {
		a, b := conn.NewPipe()
		require.NoError(t, a.SetImpairment(&conn.Impairment{Delay: time.Millisecond, Seed: uint64(i)}))
		started := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			close(started)
			for {
				if a.Send([]conn.Packet{{Buf: newPacket(1, 64), Addr: b.LocalAddr()}}) != nil {
					return
				}
			}
		}()
		<-started
		a.Close()
		<-done
		b.Close()
	}
}

// TestBufferedReportsWhatReceiveHolds: Buffered is true while packets
// already taken from the network wait for the next Receive, and false once
// a Receive has handed out the last of them (the next one would block).
func TestBufferedReportsWhatReceiveHolds(t *testing.T) {
	a, b := newPipe(t, 0)
	require.False(t, b.Buffered())
	pkts := make([]conn.Packet, 10)
	for i := range pkts {
		pkts[i] = conn.Packet{Buf: newPacket(uint32(i), 64), Addr: b.LocalAddr()}
	}
	require.NoError(t, a.Send(pkts))
	got := make([]conn.Packet, 4)
	for _, want := range []struct {
		n        int
		buffered bool
	}{{4, true}, {4, true}, {2, false}} {
		n, err := b.Receive(got)
		require.NoError(t, err)
		require.Equal(t, want.n, n)
		require.Equal(t, want.buffered, b.Buffered(), "after %d", n)
	}
}

// TestReceiveAfterBufferedDoesNotBlock: when Buffered is true the next
// Receive does not block, even if every packet it held is dropped on
// delivery (here a bad ICRC): it returns 0 packets, and the receive loop,
// which held its ACKs on Buffered's word, sends them. Found by the
// session-12 smoke test.
func TestReceiveAfterBufferedDoesNotBlock(t *testing.T) {
	t.Run("pipe", func(t *testing.T) {
		a, b := newPipe(t, 0)
		testReceiveAfterBuffered(t, a, b)
	})
	// UDPConn.Receive has the same three lines; over UDP the corrupted
	// datagram's arrival is not ordered with the test's Receive.
}

func testReceiveAfterBuffered(t *testing.T, a, b interface {
	conn.Conn
	Buffered() bool
}) {
	send := func(seq uint32) {
		require.NoError(t, a.Send([]conn.Packet{{Buf: newPacket(seq, 64), Addr: b.LocalAddr()}}))
	}
	for i := range 4 {
		send(uint32(i))
	}
	require.NoError(t, a.SetImpairment(&conn.Impairment{Corrupt: 1, Dir: conn.DirTx}))
	send(4) // arrives with a bad ICRC
	got := make([]conn.Packet, 4)
	n, err := b.Receive(got)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.True(t, b.Buffered(), "the 5th datagram was read with the others")
	done := make(chan int, 1)
	go func() { n, _ := b.Receive(got); done <- n }()
	select {
	case n := <-done:
		require.Zero(t, n)
	case <-time.After(5 * time.Second):
		b.Wake()
		<-done
		t.Fatal("Buffered was true, but the next Receive blocked")
	}
	require.Equal(t, uint64(1), b.Stats().BadICRC.Load())
	require.False(t, b.Buffered())
}
