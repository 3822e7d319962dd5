package perf

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
)

// fillPattern fills b with the --verify pattern of message k: a splitmix64
// stream seeded by (seed, k), so that every message differs from its
// neighbours and a byte placed in the wrong message or at the wrong offset
// is caught.
func fillPattern(b []byte, seed uint64, k int64) {
	x := seed ^ (uint64(k)+1)*0x9e3779b97f4a7c15
	next := func() uint64 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		return z ^ (z >> 31)
	}
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], next())
	}
	if i < len(b) {
		var t [8]byte
		binary.LittleEndian.PutUint64(t[:], next())
		copy(b[i:], t[:])
	}
}

// MismatchError reports the first byte that differs from what was sent.
type MismatchError struct {
	What    string // "message 12 of 5000" or "file"
	Offset  int64  // byte offset in the message (or in the file)
	Got     byte
	Want    byte
	Message int64
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("verify: %s differs at byte offset %d: got %#02x, want %#02x", e.What, e.Offset, e.Got, e.Want)
}

// ErrMismatch is what every verification failure wraps, for errors.Is.
var ErrMismatch = errors.New("verify: data mismatch")

func (e *MismatchError) Unwrap() error { return ErrMismatch }

// firstDiff returns the index of the first byte where a and b differ, or
// -1. They must have the same length.
func firstDiff(a, b []byte) int {
	for i := 0; i < len(a); i += 4096 {
		j := min(i+4096, len(a))
		if string(a[i:j]) != string(b[i:j]) {
			for ; i < j; i++ {
				if a[i] != b[i] {
					return i
				}
			}
		}
	}
	return -1
}

// checker compares messages with the pattern.
type checker struct {
	seed    uint64
	scratch []byte
}

// check returns a *MismatchError if data is not message k's pattern.
func (c *checker) check(data []byte, k int64, what string) error {
	if cap(c.scratch) < len(data) {
		c.scratch = make([]byte, len(data))
	}
	want := c.scratch[:len(data)]
	fillPattern(want, c.seed, k)
	if i := firstDiff(data, want); i >= 0 {
		return &MismatchError{What: what, Offset: int64(i), Got: data[i], Want: want[i], Message: k}
	}
	return nil
}

// A source produces the messages of a stream: the pattern (--verify) or a
// file's bytes (--file), in order.
type source interface {
	// fill writes message k into dst (len(dst) is the slot size) and
	// returns its length. Messages are asked for in order, once each.
	fill(k int64, dst []byte) (int, error)
}

// A sink takes the messages of a stream in order.
type sink interface {
	consume(k int64, data []byte) error
}

type patternSource struct{ seed uint64 }

func (p patternSource) fill(k int64, dst []byte) (int, error) {
	fillPattern(dst, p.seed, k)
	return len(dst), nil
}

type patternSink struct {
	c checker
	n int64 // messages checked
}

func (p *patternSink) consume(k int64, data []byte) error {
	p.n++
	return p.c.check(data, k, fmt.Sprintf("message %d", k))
}

// fileSource reads a file in order and hashes what it read.
type fileSource struct {
	r    *bufio.Reader
	h    hash.Hash
	left int64 // bytes not yet read
	next int64 // message expected next
}

func newFileSource(f *os.File, size int64) *fileSource {
	return &fileSource{r: bufio.NewReaderSize(f, 1<<20), h: sha256.New(), left: size}
}

func (f *fileSource) fill(k int64, dst []byte) (int, error) {
	if k != f.next {
		panic(fmt.Sprintf("perf: file message %d asked for, expected %d", k, f.next))
	}
	f.next++
	n := int(min(int64(len(dst)), f.left))
	if _, err := io.ReadFull(f.r, dst[:n]); err != nil {
		return 0, fmt.Errorf("read file: %w", err)
	}
	f.left -= int64(n)
	f.h.Write(dst[:n])
	return n, nil
}

func (f *fileSource) sum() string { return hex.EncodeToString(f.h.Sum(nil)) }

// fileSink hashes what it receives and writes it to w (nil: discard).
type fileSink struct {
	w    *bufio.Writer
	h    hash.Hash
	n    int64 // bytes received
	next int64
}

func newFileSink(w io.Writer) *fileSink {
	s := &fileSink{h: sha256.New()}
	if w != nil {
		s.w = bufio.NewWriterSize(w, 1<<20)
	}
	return s
}

func (f *fileSink) consume(k int64, data []byte) error {
	if k != f.next {
		return fmt.Errorf("file message %d arrived, expected %d", k, f.next)
	}
	f.next++
	f.n += int64(len(data))
	f.h.Write(data)
	if f.w != nil {
		if _, err := f.w.Write(data); err != nil {
			return fmt.Errorf("write --out: %w", err)
		}
	}
	return nil
}

func (f *fileSink) flush() error {
	if f.w == nil {
		return nil
	}
	if err := f.w.Flush(); err != nil {
		return fmt.Errorf("write --out: %w", err)
	}
	return nil
}

func (f *fileSink) sum() string { return hex.EncodeToString(f.h.Sum(nil)) }

// chunks returns the number of messages of size bytes a file of n bytes
// takes (0 for an empty file).
func chunks(n, size int64) int64 { return (n + size - 1) / size }

// chunkLen returns the length of message k of a file of n bytes cut into
// messages of size bytes.
func chunkLen(k, n, size int64) int { return int(min(size, n-k*size)) }
