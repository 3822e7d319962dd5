//go:build !purego

package wire

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// crc32VPCLMUL itself, on every length up to 4 KiB (every multiple of 16,
// and at some offsets every length between: the 0..15 bytes over a multiple
// of 16 must be ignored) and every offset 0..63: this reaches the 16-byte
// start that crc32Update (which calls it from crc32VPCLMULMin bytes on)
// does not, and every count of leftover 32- and 16-byte blocks after the
// 128-byte loop.
func TestCRC32VPCLMULDirect(t *testing.T) {
	if !hasVPCLMUL {
		t.Skip("no AVX2 + VPCLMULQDQ")
	}
	r := rand.New(rand.NewPCG(21, 21))
	buf := randBytes(r, 64+4096+15)
	for off := range 64 {
		for l := 0; l <= 4096; l += 16 {
			s := r.Uint32()
			want := ^crc32.Update(^s, crc32.IEEETable, buf[off:off+l])
			// Lengths l..l+15 hash the first l bytes only.
			for extra := range 16 {
				if off%8 != 0 && extra != 0 && extra != 15 {
					continue
				}
				if got := crc32VPCLMUL(s, buf[off:off+l+extra]); got != want {
					t.Fatalf("off %d len %d: %#08x, want %#08x", off, l+extra, got, want)
				}
			}
		}
	}
}

// The CPU this runs on is reported (the test log says which path the other
// tests took).
func TestCRC32Features(t *testing.T) {
	t.Logf("hasVPCLMUL = %v", hasVPCLMUL)
}

// crc32VPCLMULCopy hashes what crc32VPCLMUL hashes and copies exactly
// those bytes, at every length up to 4 KiB and misaligned sources and
// destinations; the bytes around the copied range are left alone.
func TestCRC32VPCLMULCopy(t *testing.T) {
	if !hasVPCLMUL {
		t.Skip("no AVX2 + VPCLMULQDQ")
	}
	r := rand.New(rand.NewPCG(23, 23))
	src := randBytes(r, 64+4096+15)
	dst := make([]byte, 64+4096+32)
	for _, off := range []int{0, 1, 7, 8, 16, 31, 32, 63} {
		for l := 0; l <= 4096+15; l += 1 + r.IntN(24) {
			doff := (off * 5) % 33
			for i := range dst {
				dst[i] = 0xa5
			}
			s := r.Uint32()
			n := l &^ 15
			want := ^crc32.Update(^s, crc32.IEEETable, src[off:off+n])
			got := crc32VPCLMULCopy(s, dst[doff:doff+l], src[off:off+l])
			if got != want {
				t.Fatalf("offset %d, length %d: crc %#x, want %#x", off, l, got, want)
			}
			if string(dst[doff:doff+n]) != string(src[off:off+n]) {
				t.Fatalf("offset %d, length %d: copy differs", off, l)
			}
			for i, b := range dst {
				if (i < doff || i >= doff+n) && b != 0xa5 {
					t.Fatalf("offset %d, length %d: byte %d outside the copy written", off, l, i)
				}
			}
		}
	}
}
