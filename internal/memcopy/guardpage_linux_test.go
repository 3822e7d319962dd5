package memcopy

import (
	"bytes"
	"syscall"
	"testing"
)

// guarded maps n bytes so that they end at a page boundary followed by
// an inaccessible page (and start right after another if n is a multiple
// of the page size): any access past either end faults.
func guarded(t *testing.T, n int) (atEnd []byte, atStart []byte) {
	t.Helper()
	pg := syscall.Getpagesize()
	span := (n + pg - 1) / pg * pg
	mem, err := syscall.Mmap(-1, 0, span+2*pg, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	if err := syscall.Mprotect(mem[:pg], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mprotect(mem[pg+span:], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	return mem[pg+span-n : pg+span], mem[pg : pg+n]
}

// TestCopyStaysInsideItsSlices: the loop reads no byte of src and writes
// no byte of dst outside the n copied, at every source alignment within
// a cache line: src and dst are placed against an inaccessible page at
// either end, where an access past the slice faults.
func TestCopyStaysInsideItsSlices(t *testing.T) {
	for _, n := range []int{MinAVX512, MinAVX512 + 1, 300, 4096 - 1, 4096, 4096 + 65, MaxAVX512} {
		srcEnd, srcStart := guarded(t, n)
		dstEnd, dstStart := guarded(t, n)
		for i := range srcEnd {
			srcEnd[i] = byte(i*13 + 1)
		}
		copy(srcStart, srcEnd)
		for _, c := range []struct{ dst, src []byte }{
			{dstEnd, srcEnd}, {dstStart, srcStart}, {dstEnd, srcStart}, {dstStart, srcEnd},
		} {
			clear(c.dst)
			Copy(c.dst, c.src)
			if !bytes.Equal(c.dst, c.src) {
				t.Fatalf("n %d: dst differs from src", n)
			}
			if hasAVX512 {
				clear(c.dst)
				copyAVX512(&c.dst[0], &c.src[0], n)
				if !bytes.Equal(c.dst, c.src) {
					t.Fatalf("n %d (copyAVX512): dst differs from src", n)
				}
			}
		}
		// Unaligned ends against the guard: trim k bytes off the front so
		// that the source's first aligned load and its tail sit anywhere.
		for k := 1; k < 64 && n-k >= 128; k++ {
			s, d := srcEnd[k:], dstEnd[k:]
			clear(d)
			Copy(d, s)
			if hasAVX512 {
				copyAVX512(&d[0], &s[0], len(s))
			}
			if !bytes.Equal(d, s) {
				t.Fatalf("n %d k %d: dst differs", n, k)
			}
		}
	}
}
