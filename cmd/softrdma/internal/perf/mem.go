package perf

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The tools' registered buffers are anonymous mappings outside the Go
// heap, page aligned, as perftest's are (memalign); with --odp and --iodp
// they are memory of the device's host address space (memfd mappings,
// also page aligned and outside the heap). They stand for memory a
// NIC writes by DMA: the engine's receive path writes them while the tool
// polls them (write-lat), and the race detector, which only watches the Go
// heap, rightly leaves that alone; the tool reads the word it polls with an
// atomic load.

// allocBuffer maps n bytes (rounded up to a page) of zeroed memory.
func allocBuffer(n int) ([]byte, error) {
	n = roundUp(max(n, 1), pageSize)
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("allocate %d bytes: %w", n, err)
	}
	return b, nil
}

func freeBuffer(b []byte) {
	if b != nil {
		_ = unix.Munmap(b[:cap(b)])
	}
}

const pageSize = 4096

func roundUp(n, to int) int { return (n + to - 1) / to * to }

// loadByte reads b[i] with an atomic load of the aligned 32-bit word that
// holds it (b must be a page-aligned buffer such as allocBuffer's, so the
// word is inside it).
func loadByte(b []byte, i int) byte {
	p := unsafe.Pointer(&b[i])
	off := uintptr(p) & 3
	w := atomic.LoadUint32((*uint32)(unsafe.Add(p, -int(off))))
	if !littleEndian {
		off = 3 - off
	}
	return byte(w >> (8 * off))
}

var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1
