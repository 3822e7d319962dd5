//go:build linux

package wire

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"
)

// guardedPage maps three pages and makes the first and the last
// inaccessible: a read before or after the middle page faults.
func guardedPage(t *testing.T) []byte {
	t.Helper()
	ps := unix.Getpagesize()
	m, err := unix.Mmap(-1, 0, 3*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	if err := unix.Mprotect(m[:ps], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mprotect(m[2*ps:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	return m[ps : 2*ps : 2*ps]
}

// Slices that end at the guard page (and ones that start right after the
// lower guard page): an over-read past the end of the slice or before its
// start faults the test binary.
func TestCRC32UpdatePageBoundary(t *testing.T) {
	page := guardedPage(t)
	r := rand.New(rand.NewPCG(31, 31))
	for i := range page {
		page[i] = byte(r.Uint32())
	}
	for l := 0; l <= len(page); l++ {
		crc := r.Uint32()
		end := page[len(page)-l:]
		if got, want := crc32Update(crc, end), crc32.Update(crc, crc32.IEEETable, end); got != want {
			t.Fatalf("ending at the page end, len %d: %#08x, want %#08x", l, got, want)
		}
		start := page[:l:l]
		if got, want := crc32Update(crc, start), crc32.Update(crc, crc32.IEEETable, start); got != want {
			t.Fatalf("starting at the page start, len %d: %#08x, want %#08x", l, got, want)
		}
	}
}
