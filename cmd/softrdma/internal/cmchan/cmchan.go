// Package cmchan is the out-of-band channel of the perftest-style tools
// under -R (rdma_cm): a byte stream over an RC QP that the connection
// manager (package rdmacm) connected, as perftest carries its exchange
// over rdma_cm (src/perftest_communication.c: ctx_xchg_data_rdma,
// rdma_write_data and rdma_read_data; rdma_client_connect and
// rdma_server_connect make the connection).
//
// Conn is a net.Conn. Each Write is one SEND of at most MaxMessage bytes
// (a longer Write is split), waited for until it completes, as
// rdma_write_data polls its send completion: perftest's exchange writes
// each step as one Write, so a perftest peer receives each step as the one
// message it expects (its only receive is sizeof(struct pingpong_dest),
// 56 bytes). Reads see the received messages as a stream. Receives are
// posted before the connection is made (the QP is in INIT, as
// rdma_create_qp leaves it) and reposted as soon as a message is copied
// out, so a peer that sends several messages in a row (softrdma's own
// exchange) is limited only by the receive queue, then by RNR NAKs
// (rnr_retry 7 retries for ever).
package cmchan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/rdmacm"
)

// Implementation constants.
const (
	// MaxMessage is the largest SEND a Write posts and the size of each
	// receive buffer. A perftest peer sends at most 56 bytes.
	MaxMessage = 4096
	// nRecv receives are kept posted.
	nRecv = 32
)

// Conn is one end of the channel. Reads and writes may run concurrently
// with each other; concurrent Reads (or Writes) are serialized.
type Conn struct {
	dev  *softrdma.Device
	qp   *softrdma.QP
	scq  *softrdma.CQ
	rcq  *softrdma.CQ
	mr   *softrdma.MR
	buf  []byte // nRecv receive slots, then the send slot, each MaxMessage bytes
	conn *rdmacm.Conn

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc

	rmu     sync.Mutex // serializes Read; guards pending, eof
	pending []byte     // received bytes not yet read
	eof     error      // set when the receive queue flushed (the connection ended)

	wmu sync.Mutex // serializes Write

	dmu       sync.Mutex // guards the deadlines
	rDeadline time.Time
	wDeadline time.Time

	closeOnce sync.Once

	sent, rcvd atomic.Uint64 // messages (SENDs) sent and received
}

// newConn creates the QP (in INIT, its receives posted) and its buffers.
func newConn(dev *softrdma.Device, pd *softrdma.PD) (*Conn, error) {
	c := &Conn{dev: dev, buf: make([]byte, (nRecv+1)*MaxMessage)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	var err error
	if c.scq, err = dev.CreateCQ(4); err != nil {
		return nil, err
	}
	if c.rcq, err = dev.CreateCQ(nRecv); err != nil {
		return nil, err
	}
	if c.qp, err = dev.CreateQP(pd, softrdma.QPInitAttr{Type: softrdma.QPTypeRC, SendCQ: c.scq, RecvCQ: c.rcq,
		Cap: softrdma.Cap{MaxSendWR: 2, MaxRecvWR: nRecv, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return nil, err
	}
	fail := func(err error) (*Conn, error) {
		c.free()
		return nil, err
	}
	if c.mr, err = dev.RegMR(pd, c.buf, softrdma.AccessLocalWrite); err != nil {
		return fail(err)
	}
	// INIT, as rdma_create_qp leaves it, so that the receives are posted
	// before the peer can send.
	if err = c.qp.Modify(&softrdma.QPAttr{State: softrdma.QPStateInit, Port: 1},
		softrdma.QPAttrState|softrdma.QPAttrPKeyIndex|softrdma.QPAttrPort|softrdma.QPAttrAccessFlags); err != nil {
		return fail(err)
	}
	for i := range nRecv {
		if err = c.postRecv(i); err != nil {
			return fail(err)
		}
	}
	return c, nil
}

// Dial connects a new channel to the rdma_cm listener at dst (IP and
// port) through cm (rdma_client_connect).
func Dial(ctx context.Context, cm *rdmacm.CM, dev *softrdma.Device, pd *softrdma.PD, dst netip.AddrPort,
	p rdmacm.ConnParam) (*Conn, error) {
	c, err := newConn(dev, pd)
	if err != nil {
		return nil, err
	}
	if c.conn, err = cm.Connect(ctx, c.qp, dst, p); err != nil {
		c.free()
		return nil, err
	}
	return c, nil
}

// Accept accepts req on a new channel (rdma_server_connect).
func Accept(ctx context.Context, req *rdmacm.ConnRequest, dev *softrdma.Device, pd *softrdma.PD,
	p rdmacm.ConnParam) (*Conn, error) {
	c, err := newConn(dev, pd)
	if err != nil {
		return nil, err
	}
	if c.conn, err = req.Accept(ctx, c.qp, p); err != nil {
		c.free()
		return nil, err
	}
	return c, nil
}

// Messages returns the number of messages (SENDs) sent and received so
// far.
func (c *Conn) Messages() (sent, rcvd uint64) { return c.sent.Load(), c.rcvd.Load() }

// CM returns the connection the CM made (for Disconnect and Done).
func (c *Conn) CM() *rdmacm.Conn { return c.conn }

// QP returns the channel's QP.
func (c *Conn) QP() *softrdma.QP { return c.qp }

func (c *Conn) slot(i int) []byte { return c.buf[i*MaxMessage : (i+1)*MaxMessage] }

func (c *Conn) postRecv(i int) error {
	_, err := c.qp.PostRecv(softrdma.RecvWR{WRID: uint64(i), SGL: []softrdma.SGE{{
		Addr: c.mr.Addr() + uint64(i*MaxMessage), Length: MaxMessage, LKey: c.mr.LKey()}}})
	return err
}

// waitCtx returns a context that ends at Close, at the deadline (if set)
// and when the connection ends.
func (c *Conn) waitCtx(deadline time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := c.ctx, context.CancelFunc(func() {})
	if !deadline.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, deadline)
	}
	return ctx, cancel
}

// waitErr turns the end of a wait into net.Conn's errors.
func (c *Conn) waitErr(ctx context.Context) error {
	if c.ctx.Err() != nil {
		return net.ErrClosed
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return os.ErrDeadlineExceeded
	}
	return ctx.Err()
}

// Read reads received bytes; io.EOF once the connection ended and every
// message that arrived before was read.
func (c *Conn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.pending) == 0 {
		if c.eof != nil {
			return 0, c.eof
		}
		if err := c.receive(); err != nil {
			return 0, err
		}
	}
	n := copy(b, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// receive waits for the next receive completion and appends its message
// to pending. The connection's end (a DREQ either way, a failure) moves
// the QP to ERR, which flushes the posted receives: a WR_FLUSH_ERR
// completion is the end of the stream. Caller holds rmu.
func (c *Conn) receive() error {
	c.dmu.Lock()
	deadline := c.rDeadline
	c.dmu.Unlock()
	ctx, cancel := c.waitCtx(deadline)
	defer cancel()
	var wc [1]softrdma.WC
	n, err := c.rcq.Wait(ctx, wc[:])
	if err != nil || c.ctx.Err() != nil {
		// (Wait returns a completion that arrived as its context
		// ended: after Close, the receives it flushed are not read.)
		return c.waitErr(ctx)
	}
	if n == 0 {
		return nil
	}
	if st := wc[0].Status; st != softrdma.WCSuccess {
		c.eof = io.EOF
		if st != softrdma.WCWRFlushErr {
			c.eof = fmt.Errorf("cmchan: receive completed with %v", st)
		}
		return nil
	}
	i := int(wc[0].WRID)
	c.rcvd.Add(1)
	c.pending = append(c.pending[:0], c.slot(i)[:wc[0].ByteLen]...)
	if err := c.postRecv(i); err != nil {
		c.eof = fmt.Errorf("cmchan: repost receive: %w", err)
	}
	return nil
}

// Write sends b as one SEND (several of MaxMessage bytes if longer) and
// waits until each completed (the peer acknowledged it). An empty b sends
// nothing.
func (c *Conn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.ctx.Err() != nil {
		return 0, net.ErrClosed
	}
	c.dmu.Lock()
	deadline := c.wDeadline
	c.dmu.Unlock()
	ctx, cancel := c.waitCtx(deadline)
	defer cancel()
	sent := 0
	for sent < len(b) {
		n := copy(c.slot(nRecv), b[sent:])
		_, err := c.qp.PostSend(softrdma.SendWR{Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
			SGL: []softrdma.SGE{{Addr: c.mr.Addr() + uint64(nRecv*MaxMessage), Length: uint32(n), LKey: c.mr.LKey()}}})
		if err != nil {
			return sent, fmt.Errorf("cmchan: post send: %w", err)
		}
		var wc [1]softrdma.WC
		if _, err := c.scq.Wait(ctx, wc[:]); err != nil {
			// The SEND may still complete; the channel is unusable now
			// (a later SEND could complete first).
			c.closeQP()
			return sent, c.waitErr(ctx)
		}
		if wc[0].Status != softrdma.WCSuccess {
			if c.ctx.Err() != nil {
				return sent, net.ErrClosed // Close flushed it
			}
			if wc[0].Status == softrdma.WCWRFlushErr {
				return sent, io.ErrClosedPipe
			}
			return sent, fmt.Errorf("cmchan: send completed with %v", wc[0].Status)
		}
		sent += n
		c.sent.Add(1)
	}
	return sent, nil
}

// closeQP moves the QP to ERR: outstanding work completes flushed.
func (c *Conn) closeQP() {
	_ = c.qp.Modify(&softrdma.QPAttr{State: softrdma.QPStateErr}, softrdma.QPAttrState)
}

// Close disconnects (rdma_disconnect: a DREQ, without waiting for the
// DREP), ends the waits of Read and Write and releases the QP and its
// buffer. A caller that wants the peer's DREQ first (perftest's client
// waits for the server's) waits on CM().Done() before.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.cancel()
		if c.conn != nil {
			_ = c.conn.Disconnect()
		}
		// Read and Write leave their waits at once; take their locks so
		// that nothing touches the buffer after it is deregistered.
		c.rmu.Lock()
		c.wmu.Lock()
		c.free()
		c.wmu.Unlock()
		c.rmu.Unlock()
	})
	return nil
}

func (c *Conn) free() {
	if c.qp != nil {
		_ = c.dev.DestroyQP(c.qp)
	}
	if c.mr != nil {
		_ = c.dev.DeregMR(c.mr)
		c.mr = nil
	}
}

// Addr is an rdma_cm address (IP and port) as a net.Addr.
type Addr netip.AddrPort

// Network implements net.Addr.
func (Addr) Network() string { return "rdma_cm" }

func (a Addr) String() string { return netip.AddrPort(a).String() }

// LocalAddr returns this side's rdma_cm address.
func (c *Conn) LocalAddr() net.Addr { return Addr(c.conn.LocalAddr()) }

// RemoteAddr returns the peer's rdma_cm address.
func (c *Conn) RemoteAddr() net.Addr { return Addr(c.conn.RemoteAddr()) }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	c.dmu.Lock()
	c.rDeadline, c.wDeadline = t, t
	c.dmu.Unlock()
	return nil
}

// SetReadDeadline sets the deadline of Reads (waits that start after it
// was set).
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.dmu.Lock()
	c.rDeadline = t
	c.dmu.Unlock()
	return nil
}

// SetWriteDeadline sets the deadline of Writes (those that start after it
// was set).
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.dmu.Lock()
	c.wDeadline = t
	c.dmu.Unlock()
	return nil
}

var _ net.Conn = (*Conn)(nil)
