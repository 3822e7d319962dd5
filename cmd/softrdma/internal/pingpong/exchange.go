package pingpong

import (
	"errors"
	"fmt"
	"io"
	"strings"
)

// ClientExchange is pp_client_exch_dest after the connect: send my
// message, read the server's, send "done". The caller closes rw.
func ClientExchange(rw io.ReadWriter, my *Dest) (Dest, error) {
	m := my.Marshal()
	if _, err := rw.Write(m[:]); err != nil {
		return Dest{}, fmt.Errorf("couldn't send local address: %w", err)
	}
	rem, err := readAddr(rw)
	if err != nil {
		return Dest{}, err
	}
	if _, err := rw.Write(Done[:]); err != nil {
		return Dest{}, fmt.Errorf("couldn't write done: %w", err)
	}
	return rem, nil
}

// ServerExchange is pp_server_exch_dest after the accept: read the
// client's message, call connect with it (the server's QP must be ready
// to receive before the client learns its address), send my message and
// wait for the client's "done". The caller closes rw.
func ServerExchange(rw io.ReadWriter, my *Dest, connect func(rem Dest) error) (Dest, error) {
	rem, err := readAddr(rw)
	if err != nil {
		return Dest{}, err
	}
	if err := connect(rem); err != nil {
		return Dest{}, fmt.Errorf("couldn't connect to remote QP: %w", err)
	}
	m := my.Marshal()
	if _, err := rw.Write(m[:]); err != nil {
		return Dest{}, fmt.Errorf("couldn't send local address: %w", err)
	}
	var done [len(Done)]byte
	for n := 0; n < len(done); {
		k, err := rw.Read(done[n:])
		n += k
		if string(done[:n]) != string(Done[:n]) {
			return Dest{}, fmt.Errorf("%w: expected \"done\\0\", got %q", ErrBadMsg, done[:n])
		}
		if err != nil && n < len(done) {
			return Dest{}, &ExchangeReadError{What: `"done"`, Got: n, Want: len(done), Err: err}
		}
	}
	return rem, nil
}

// ExchangeReadError is a read of the exchange that failed before the
// whole message arrived: the peer closed the connection (Err is io.EOF,
// io.ErrUnexpectedEOF or a reset), or a deadline passed.
type ExchangeReadError struct {
	What      string // "its address" or `"done"`
	Got, Want int    // bytes received of the message
	Err       error
}

func (e *ExchangeReadError) Error() string {
	if e.What == `"done"` {
		return fmt.Sprintf("%d/%d: couldn't recv done: %v", e.Got, e.Want, e.Err)
	}
	return fmt.Sprintf("%d/%d: couldn't read remote address: %v", e.Got, e.Want, e.Err)
}

func (e *ExchangeReadError) Unwrap() error { return e.Err }

// readAddr reads the peer's address message. It refuses at once bytes
// that cannot begin a message Parse accepts (an HTTP server's "HTTP/1.1
// 200 OK", say), instead of waiting for MsgSize bytes that may never
// come.
func readAddr(r io.Reader) (Dest, error) {
	var in [MsgSize]byte
	n := 0
	for n < MsgSize {
		k, err := r.Read(in[n:])
		n += k
		if !msgPrefix(in[:n]) {
			return Dest{}, fmt.Errorf("%w: %q", ErrBadMsg, in[:n])
		}
		if err != nil && n < MsgSize {
			if errors.Is(err, io.EOF) && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			return Dest{}, &ExchangeReadError{What: "its address", Got: n, Want: MsgSize, Err: err}
		}
	}
	return Parse(in[:])
}

// msgPrefix reports whether b can begin an address message Parse accepts:
// up to the first NUL, four fields of hex digits separated by ':', none
// empty, the GID at most 32 digits (Parse checks the rest once the NUL
// or the whole message is in).
func msgPrefix(b []byte) bool {
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		_, err := Parse(b[:i])
		return err == nil
	}
	f := strings.Split(s, ":")
	if len(f) > 4 || len(f) == 4 && len(f[3]) > 32 {
		return false
	}
	for i, x := range f {
		if x == "" && i < len(f)-1 {
			return false // an empty field, or a leading ':'
		}
		for _, c := range []byte(x) {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}
