package pingpong

import (
	"fmt"
	"io"
)

// ClientExchange is pp_client_exch_dest after the connect: send my
// message, read the server's, send "done". The caller closes rw.
func ClientExchange(rw io.ReadWriter, my *Dest) (Dest, error) {
	m := my.Marshal()
	if _, err := rw.Write(m[:]); err != nil {
		return Dest{}, fmt.Errorf("couldn't send local address: %w", err)
	}
	var in [MsgSize]byte
	if _, err := io.ReadFull(rw, in[:]); err != nil {
		return Dest{}, fmt.Errorf("couldn't read remote address: %w", err)
	}
	rem, err := Parse(in[:])
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
	var in [MsgSize]byte
	if n, err := io.ReadFull(rw, in[:]); err != nil {
		return Dest{}, fmt.Errorf("%d/%d: couldn't read remote address: %w", n, MsgSize, err)
	}
	rem, err := Parse(in[:])
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
	if _, err := io.ReadFull(rw, done[:]); err != nil {
		return Dest{}, fmt.Errorf("couldn't recv done: %w", err)
	}
	if done != Done {
		return Dest{}, fmt.Errorf("%w: expected \"done\\0\", got %q", ErrBadMsg, done[:])
	}
	return rem, nil
}
