// Package exchange is the out-of-band channel of the perftest-style tools:
// the TCP connection (port 18515 by default, as perftest) over which a
// client and a server agree on the test, exchange what each needs to
// connect its QPs to the other's (perftest's struct pingpong_dest: GID,
// QPN, PSN, rkey, virtual address, plus the RoCEv2 UDP port and the buffer
// size), synchronize, and report results.
//
// Every connection starts with perftest's version exchange (Perftest,
// perftest.go): 16 bytes each way. A softrdma tool adds a mark after the
// NUL of its version string; when both sides did, they switch to
// softrdma's own framing (Conn): a preface ("SOFTRDMA" and a version
// byte), then frames of a type byte, a 4-byte big-endian length and a
// payload. Otherwise the peer is a stock perftest tool (or was told
// --perftest) and the rest of the exchange is perftest's, byte for byte
// (Perftest).
package exchange

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
)

// DefaultPort is perftest's DEF_PORT.
const DefaultPort = 18515

// Version is the protocol version in the preface; peers must match.
const Version = 1

var preface = [9]byte{'S', 'O', 'F', 'T', 'R', 'D', 'M', 'A', Version}

// MaxFrame bounds a frame's payload.
const MaxFrame = 16 << 20

// MsgType is the type of a frame.
type MsgType uint8

// Message types. Which side sends which, in order, is the runner's
// business; the channel only checks that the expected type arrives.
const (
	MsgHello  MsgType = iota + 1 // client -> server: test parameters (JSON)
	MsgReply                     // server -> client: acceptance and server-side parameters (JSON)
	MsgQPs                       // per-QP connection data (Native: binary QPInfos)
	MsgSync                      // barrier, optional JSON payload
	MsgResult                    // a side's result (JSON)
	MsgError                     // the sender failed; payload is the reason (text)
)

var msgNames = [...]string{"", "hello", "reply", "qps", "sync", "result", "error"}

func (t MsgType) String() string {
	if int(t) < len(msgNames) && t != 0 {
		return msgNames[t]
	}
	return fmt.Sprintf("MsgType(%d)", uint8(t))
}

// Errors.
var (
	ErrNotSoftrdma = errors.New("exchange: peer is not a softrdma tool of this version (bad preface)")
	ErrFrameSize   = errors.New("exchange: frame too large")
)

// PeerError is the reason a peer sent with MsgError.
type PeerError struct{ Reason string }

func (e *PeerError) Error() string { return "peer: " + e.Reason }

// ClosedError is a connection the peer closed or reset (its process
// killed, or ended after a failure it could not send) while this side
// waited for a message: "the peer at 10.0.0.2:41234 closed the connection
// (unexpected EOF) while this side waited for the peer's sync". The
// caller may say what this side was doing instead (Doing): "... while
// this side was still running the test; no result came from it". It
// unwraps to the cause (io.ErrUnexpectedEOF, ECONNRESET, EPIPE).
type ClosedError struct {
	Peer    netip.AddrPort
	Waiting MsgType // the message this side waited for
	Err     error
	// Doing, if set, replaces "while this side waited for the peer's
	// <Waiting>": what this side was doing and what it missed.
	Doing string
}

func (e *ClosedError) Error() string {
	why := "unexpected EOF"
	switch {
	case errors.Is(e.Err, syscall.ECONNRESET):
		why = "connection reset"
	case errors.Is(e.Err, syscall.EPIPE):
		why = "broken pipe"
	}
	doing := e.Doing
	if doing == "" {
		doing = fmt.Sprintf("while this side waited for the peer's %v", e.Waiting)
	}
	return fmt.Sprintf("the peer at %v closed the connection (%s) %s", e.Peer, why, doing)
}

func (e *ClosedError) Unwrap() error { return e.Err }

type frame struct {
	typ     MsgType
	payload []byte
}

// Conn is one end of the control channel. A goroutine reads frames as they
// arrive, so that Done reports a peer that went away even while the local
// side is busy with RDMA traffic.
//
// Send and Recv may be called from different goroutines; Recv must not be
// called concurrently with itself.
type Conn struct {
	c    net.Conn
	wmu  sync.Mutex // serializes writes
	w    *bufio.Writer
	in   chan frame    // frames read; closed when the reader stops
	done chan struct{} // closed when the reader stops
	err  error         // why the reader stopped; written before done is closed
}

// New wraps c, writes the preface and starts reading. The caller gives up
// c; Close closes it.
func New(c net.Conn) (*Conn, error) {
	x := &Conn{c: c, w: bufio.NewWriter(c), in: make(chan frame, 64), done: make(chan struct{})}
	// Read first: on a synchronous conn (net.Pipe) both prefaces would
	// otherwise block each other.
	go x.read()
	if _, err := c.Write(preface[:]); err != nil {
		c.Close()
		<-x.done
		return nil, fmt.Errorf("exchange: write preface: %w", err)
	}
	return x, nil
}

func (x *Conn) read() {
	defer close(x.done)
	defer close(x.in)
	r := bufio.NewReader(x.c)
	var p [len(preface)]byte
	if _, err := io.ReadFull(r, p[:]); err != nil {
		x.err = fmt.Errorf("exchange: read preface: %w", err)
		return
	}
	if p != preface {
		x.err = fmt.Errorf("%w: got %q", ErrNotSoftrdma, p[:])
		return
	}
	for {
		var h [5]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.EOF
			}
			x.err = err
			return
		}
		n := binary.BigEndian.Uint32(h[1:])
		if n > MaxFrame {
			x.err = fmt.Errorf("%w: %d bytes", ErrFrameSize, n)
			return
		}
		f := frame{typ: MsgType(h[0]), payload: make([]byte, n)}
		if _, err := io.ReadFull(r, f.payload); err != nil {
			x.err = fmt.Errorf("exchange: read %v frame: %w", f.typ, err)
			return
		}
		x.in <- f
	}
}

// Done is closed when the peer closed the connection or it failed; Err
// then says why.
func (x *Conn) Done() <-chan struct{} { return x.done }

// Err returns why the reader stopped (io.EOF when the peer closed), or nil
// while it runs.
func (x *Conn) Err() error {
	select {
	case <-x.done:
		return x.err
	default:
		return nil
	}
}

// LocalAddr returns the local TCP address; its IP is the one that reaches
// the peer.
func (x *Conn) LocalAddr() netip.AddrPort { return addrPort(x.c.LocalAddr()) }

// RemoteAddr returns the peer's TCP address.
func (x *Conn) RemoteAddr() netip.AddrPort { return addrPort(x.c.RemoteAddr()) }

func addrPort(a net.Addr) netip.AddrPort {
	if t, ok := a.(*net.TCPAddr); ok {
		ap := t.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// Send writes one frame.
func (x *Conn) Send(t MsgType, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("%w: %d bytes", ErrFrameSize, len(payload))
	}
	var h [5]byte
	h[0] = byte(t)
	binary.BigEndian.PutUint32(h[1:], uint32(len(payload)))
	x.wmu.Lock()
	defer x.wmu.Unlock()
	x.w.Write(h[:])
	x.w.Write(payload)
	if err := x.w.Flush(); err != nil {
		return fmt.Errorf("exchange: send %v: %w", t, err)
	}
	return nil
}

// SendJSON sends v encoded as JSON.
func (x *Conn) SendJSON(t MsgType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("exchange: encode %v: %w", t, err)
	}
	return x.Send(t, b)
}

// SendError tells the peer this side failed; best effort.
func (x *Conn) SendError(err error) { _ = x.Send(MsgError, []byte(err.Error())) }

// Recv waits for the next frame, which must be of type t. A MsgError from
// the peer is returned as a *PeerError; another type is a protocol error;
// a closed connection is io.ErrUnexpectedEOF. Frames that arrived before
// the connection closed are still delivered.
func (x *Conn) Recv(ctx context.Context, t MsgType) ([]byte, error) {
	var f frame
	var ok bool
	select {
	case f, ok = <-x.in:
	default:
		if testHookRecvWait != nil {
			testHookRecvWait()
		}
		select {
		case f, ok = <-x.in:
		case <-ctx.Done():
			// A frame can arrive as ctx ends (the peer's last frame, then
			// its close, which cancels the caller's run): select picks
			// either ready case at random, and the frame wins.
			select {
			case f, ok = <-x.in:
				if !ok {
					return nil, ctx.Err()
				}
			default:
				return nil, ctx.Err()
			}
		}
	}
	if !ok {
		err := x.err
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
			return nil, &ClosedError{Peer: x.RemoteAddr(), Waiting: t, Err: err}
		}
		return nil, fmt.Errorf("exchange: waiting for %v: %w", t, err)
	}
	if f.typ == MsgError {
		return nil, &PeerError{Reason: string(f.payload)}
	}
	if f.typ != t {
		return nil, fmt.Errorf("exchange: got %v, want %v", f.typ, t)
	}
	return f.payload, nil
}

// testHookRecvWait, when set, runs in Recv after it found no frame
// queued and before it waits for one or for its context.
var testHookRecvWait func()

// RecvJSON receives a frame of type t and decodes it into v.
func (x *Conn) RecvJSON(ctx context.Context, t MsgType, v any) error {
	b, err := x.Recv(ctx, t)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("exchange: decode %v: %w", t, err)
	}
	return nil
}

// Sync is a barrier: both sides send a MsgSync and wait for the other's.
func (x *Conn) Sync(ctx context.Context) error {
	if err := x.Send(MsgSync, nil); err != nil {
		return err
	}
	_, err := x.Recv(ctx, MsgSync)
	return err
}

// Close closes the connection.
func (x *Conn) Close() error { return x.c.Close() }
