package conn_test

import (
	"bytes"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
)

// idleConn is a conn with the idle hook (UDPConn and PipeConn).
type idleConn interface {
	conn.Conn
	SetIdleHook(func())
	Buffered() bool
}

// testIdleHook: a Receive that finds packets to hand out does not run the
// idle hook; one that finds nothing runs it before it waits, and the hook
// may send (a device sends its coalesced ACKs there).
func testIdleHook(t *testing.T, a, b idleConn) {
	var idle atomic.Int32
	sendErr := make(chan error, 1)
	ack := []conn.Packet{{Buf: newPacket(99, 64), Addr: a.LocalAddr()}}
	want := bytes.Clone(ack[0].Buf[:60]) // Send writes the ICRC trailer
	b.SetIdleHook(func() {
		if idle.Add(1) == 1 {
			sendErr <- b.Send(ack) // on the receiving goroutine, inside Receive
		}
	})
	pkts := make([]conn.Packet, 3)
	for i := range pkts {
		pkts[i] = conn.Packet{Buf: newPacket(uint32(i), 64), Addr: b.LocalAddr()}
	}
	require.NoError(t, a.Send(pkts))
	// The packets are already queued: Receive returns them without
	// waiting, and without the hook, unless it found the queue empty
	// before they arrived (UDP: the first recvmmsg may run first).
	got := receiveN(t, b, 3, 5e9)
	require.Len(t, got, 3)
	before := idle.Load()
	require.False(t, b.Buffered())
	// Now nothing is queued: the next Receive runs the hook, which sends
	// to a, then waits; a packet from a ends the wait.
	done := make(chan []received, 1)
	go func() { done <- receiveN(t, b, 1, 5e9) }()
	back := receiveN(t, a, 1, 5e9)
	require.Len(t, back, 1, "the hook's send arrived")
	require.Equal(t, want, back[0].buf[:60])
	require.NoError(t, <-sendErr)
	require.Greater(t, idle.Load(), before)
	require.NoError(t, a.Send([]conn.Packet{{Buf: newPacket(7, 64), Addr: b.LocalAddr()}}))
	require.Len(t, <-done, 1)
}

func TestIdleHookPipe(t *testing.T) {
	a, b := newPipe(t, 0)
	testIdleHook(t, a, b)
}

func TestIdleHookUDP(t *testing.T) {
	a := listen(t, conn.Config{})
	b := listen(t, conn.Config{})
	testIdleHook(t, a, b)
}
