package transport

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/transport/conn"
)

// refusingConn is a pipe whose Send drops every datagram of odd index, as
// a kernel that refuses some datagrams of a batch does: the rest are sent
// and a *conn.SendError says how many were not.
type refusingConn struct {
	*conn.PipeConn
}

func (c refusingConn) Send(pkts []conn.Packet) error {
	var keep []conn.Packet
	for i, p := range pkts {
		if i%2 == 0 {
			keep = append(keep, p)
		}
	}
	if err := c.PipeConn.Send(keep); err != nil {
		return err
	}
	if failed := len(pkts) - len(keep); failed > 0 {
		return &conn.SendError{Failed: failed, Err: fmt.Errorf("sendmmsg: %w", unix.EMSGSIZE)}
	}
	return nil
}

// TestSentPktsCountsWhatLeft: when the socket refuses some datagrams of a
// batch, sent_pkts counts the ones that left and send_err the refused
// ones (rxe counts sent_pkts per packet handed to the network). Before,
// a partial failure counted the whole batch as send_err and none as
// sent, so a capture showed more packets than sent_pkts said.
func TestSentPktsCountsWhatLeft(t *testing.T) {
	a, b := conn.NewPipe()
	d, err := NewDevice(Config{Conn: refusingConn{b}, Placement: placement.New(placement.Config{})})
	require.NoError(t, err)
	t.Cleanup(func() { d.Close(); a.Close() })

	var tx txBatch
	tx.init(d)
	for range 5 {
		buf := tx.alloc(64, a.LocalAddr(), 0)
		clear(buf)
	}
	tx.flush()
	c := d.Counters()
	require.Equal(t, uint64(3), c.SentPkts.Load(), "packets 0, 2 and 4 left")
	require.Equal(t, uint64(2), c.SendErr.Load(), "packets 1 and 3 were refused")
	require.Equal(t, uint64(3), b.Stats().SentDatagrams.Load())
}

// TestQPNWrapKeepsTheReceiveLoopsReader: when QPN allocation wraps from
// MaxQPN-1 back to FirstQPN, the device keeps the receive loop's STag-table
// reader. (It used to register a new one there, from CreateQP's goroutine:
// a data race with the receive loop, and a reader left online at that
// moment would hold up every later grace period, DeregMR included, for
// ever.)
func TestQPNWrapKeepsTheReceiveLoopsReader(t *testing.T) {
	a, b := conn.NewPipe()
	d, err := NewDevice(Config{Conn: b, Placement: placement.New(placement.Config{})})
	require.NoError(t, err)
	t.Cleanup(func() { d.Close(); a.Close() })
	r0 := d.reader
	cq := NewCQ(16)
	attr := &QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: QPTypeRC, Cap: Cap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}
	d.qps.Lock()
	d.qps.next = MaxQPN - 1
	d.qps.Unlock()
	for _, want := range []uint32{MaxQPN - 1, FirstQPN} {
		qp, err := d.CreateQP(1, attr)
		require.NoError(t, err)
		require.Equal(t, want, uint32(qp.QPN()))
		require.NoError(t, d.DestroyQP(qp))
	}
	require.Same(t, r0, d.reader, "the receive loop's reader was replaced")
}

// TestSendErrorLogIsRateLimited: a socket that refuses every datagram
// (EMSGSIZE: a path MTU larger than the link carries, retransmitted for
// ever with retry_cnt 7) is logged as the device's other warnings are,
// the first 10 failed sends, then one in 1000; every refused datagram is
// still counted as send_err.
func TestSendErrorLogIsRateLimited(t *testing.T) {
	a, b := conn.NewPipe()
	var logs []string
	logf := func(format string, args ...any) { logs = append(logs, fmt.Sprintf(format, args...)) }
	d, err := NewDevice(Config{Conn: refusingConn{b}, Placement: placement.New(placement.Config{}), Logf: logf})
	require.NoError(t, err)
	t.Cleanup(func() { d.Close(); a.Close() })

	var tx txBatch
	tx.init(d)
	for range 2500 {
		tx.alloc(64, a.LocalAddr(), 0)
		tx.alloc(64, a.LocalAddr(), 0) // refused
		tx.flush()
	}
	require.Len(t, logs, 12, "sends 1-10, 1000 and 2000")
	require.Contains(t, logs[0], "softrdma: send: ")
	require.Contains(t, logs[0], "message too long")
	require.Contains(t, logs[11], "failed sends so far: 2000")
	c := d.Counters()
	require.Equal(t, uint64(2500), c.SendErr.Load())
	require.Equal(t, uint64(2500), c.SentPkts.Load())
}

// queueConn is a pipe that reports a receive socket's drops and queue, as
// a UDPConn does (conn.UDPConn.RecvQueue).
type queueConn struct {
	*conn.PipeConn
	q conn.RecvQueue
}

func (c queueConn) RecvQueue() (conn.RecvQueue, error) { return c.q, nil }

// TestSnapshotShowsSocketOverflow: the datagrams the kernel dropped at the
// device's socket (its receive buffer full) and the bytes waiting in it
// are in the snapshot, so that a test's counter dump shows a receive loop
// that fell behind: the engine never sees those datagrams, and no other
// counter tells that they were sent to it. A conn that cannot tell (a
// pipe) shows zeros.
func TestSnapshotShowsSocketOverflow(t *testing.T) {
	value := func(d *Device, name string) (uint64, bool) {
		for _, c := range d.Snapshot() {
			if c.Name == name {
				return c.Value, true
			}
		}
		return 0, false
	}
	a, b := conn.NewPipe()
	d, err := NewDevice(Config{Conn: queueConn{b, conn.RecvQueue{Drops: 21000, Queued: 64 << 20}}, Placement: placement.New(placement.Config{})})
	require.NoError(t, err)
	t.Cleanup(func() { d.Close(); a.Close() })
	v, ok := value(d, "drop_socket_overflow")
	require.True(t, ok)
	require.Equal(t, uint64(21000), v)
	v, ok = value(d, "socket_rx_queued_bytes")
	require.True(t, ok)
	require.Equal(t, uint64(64<<20), v)

	a2, b2 := conn.NewPipe()
	d2, err := NewDevice(Config{Conn: b2, Placement: placement.New(placement.Config{})})
	require.NoError(t, err)
	t.Cleanup(func() { d2.Close(); a2.Close() })
	v, ok = value(d2, "drop_socket_overflow")
	require.True(t, ok)
	require.Zero(t, v)
}
