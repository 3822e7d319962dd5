package hostmem

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Errors of Buffer.
var (
	ErrBufferBusy  = errors.New("hostmem: buffer is registered (deregister its MRs first)")
	ErrBufferFreed = errors.New("hostmem: buffer freed")
)

// Buffer is memory that the application and the NIC map together: a memfd
// mapped twice with MAP_SHARED. The application reads and writes Bytes();
// the NIC's translation tables point into the NIC mapping. Because the two
// are separate mappings of the same pages, a later issue can move a page
// (copy it to a new memfd page, remap the application's view with
// MAP_FIXED, switch the NIC's frame) without the application's slice
// changing: see docs/memory.md. The fields that migration needs are here:
// the memfd, the two bases and the mapped length.
type Buffer struct {
	fd   int
	size int            // bytes the caller asked for
	n    uintptr        // mapped bytes (size rounded up to pages)
	app  unsafe.Pointer // application mapping
	nic  unsafe.Pointer // NIC mapping

	mu struct {
		sync.Mutex
		holds int    // translation tables that point into the NIC mapping
		freed bool   // Free has run
		space *Space // the Space the buffer is registered in, if any
	}
}

// Alloc creates a buffer of size bytes (rounded up to whole pages in the
// mappings). The pages are allocated on first touch or when pinned.
func Alloc(size int) (*Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("hostmem: alloc %d bytes: size must be positive", size)
	}
	n := (uintptr(size) + pageMask) &^ pageMask
	fd, err := unix.MemfdCreate("softrdma", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("hostmem: memfd_create: %w", err)
	}
	b := &Buffer{fd: fd, size: size, n: n}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("hostmem: ftruncate memfd to %d bytes: %w", n, err)
	}
	const prot = unix.PROT_READ | unix.PROT_WRITE
	if b.app, err = unix.MmapPtr(fd, 0, nil, n, prot, unix.MAP_SHARED); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("hostmem: mmap application view: %w", err)
	}
	if b.nic, err = unix.MmapPtr(fd, 0, nil, n, prot, unix.MAP_SHARED); err != nil {
		_ = unix.MunmapPtr(b.app, n)
		unix.Close(fd)
		return nil, fmt.Errorf("hostmem: mmap NIC view: %w", err)
	}
	return b, nil
}

// Bytes returns the application's view: len and cap are the size asked for.
func (b *Buffer) Bytes() []byte { return unsafe.Slice((*byte)(b.app), b.n)[:b.size:b.size] }

// NIC returns the NIC's view of the same pages.
func (b *Buffer) NIC() []byte { return unsafe.Slice((*byte)(b.nic), b.n)[:b.size:b.size] }

// Len returns the size asked for.
func (b *Buffer) Len() int { return b.size }

// Hold records that a translation table points into the NIC mapping, so
// that Free refuses to unmap it. It fails once the buffer is freed.
func (b *Buffer) Hold() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.freed {
		return ErrBufferFreed
	}
	b.mu.holds++
	return nil
}

// Unhold drops a Hold.
func (b *Buffer) Unhold() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.holds <= 0 {
		panic("hostmem: Unhold without Hold")
	}
	b.mu.holds--
}

// Free unregisters the buffer from its Space, unmaps both views and closes
// the memfd. It fails with ErrBufferBusy while a memory region is registered
// on the buffer. The application must not use Bytes() afterwards.
func (b *Buffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.freed {
		return ErrBufferFreed
	}
	if b.mu.holds > 0 {
		return ErrBufferBusy
	}
	b.mu.freed = true
	if s := b.mu.space; s != nil {
		s.remove(b)
		b.mu.space = nil
	}
	err := errors.Join(unix.MunmapPtr(b.app, b.n), unix.MunmapPtr(b.nic, b.n), unix.Close(b.fd))
	if err != nil {
		return fmt.Errorf("hostmem: free buffer: %w", err)
	}
	return nil
}

// Space is the NIC's view of the application's address space: the set of
// Buffers whose pages the NIC reaches through their NIC mapping. Any other
// address (Go heap, anonymous memory, files) is its own frame: the NIC uses
// the application's mapping directly.
//
// Resolve is lock-free (an atomically published, sorted, copy-on-write
// slice); Register and Free serialize on a mutex. The zero Space is empty
// and ready to use.
type Space struct {
	ranges atomicRanges
	mu     sync.Mutex // serializes writers of ranges
}

type spaceRange struct {
	start, end uintptr // application mapping [start, end)
	buf        *Buffer
}

// Register adds b to the space. A buffer belongs to at most one space.
func (s *Space) Register(b *Buffer) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.freed {
		return ErrBufferFreed
	}
	if b.mu.space != nil {
		return errors.New("hostmem: buffer already registered in a space")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.ranges.load()
	start := uintptr(b.app)
	r := spaceRange{start: start, end: start + b.n, buf: b}
	i := 0
	for i < len(old) && old[i].start < r.start {
		i++
	}
	next := make([]spaceRange, 0, len(old)+1)
	next = append(next, old[:i]...)
	next = append(next, r)
	next = append(next, old[i:]...)
	s.ranges.store(next)
	b.mu.space = s
	return nil
}

// remove drops b from the space. Called by Free with b.mu held.
func (s *Space) remove(b *Buffer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.ranges.load()
	next := make([]spaceRange, 0, len(old))
	for _, r := range old {
		if r.buf != b {
			next = append(next, r)
		}
	}
	s.ranges.store(next)
}

// Resolve returns the NIC-side address of the application byte at p, and
// the Buffer that maps it (nil for an identity frame: p itself). A nil
// Space resolves every address to itself.
func (s *Space) Resolve(p unsafe.Pointer) (unsafe.Pointer, *Buffer) {
	if s == nil {
		return p, nil
	}
	rs := s.ranges.load()
	a := uintptr(p)
	lo, hi := 0, len(rs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		switch {
		case a < rs[m].start:
			hi = m
		case a >= rs[m].end:
			lo = m + 1
		default:
			r := rs[m]
			// The NIC mapping is not Go memory, so this arithmetic
			// forms no pointer into a Go object.
			return unsafe.Add(r.buf.nic, a-r.start), r.buf
		}
	}
	return p, nil
}
