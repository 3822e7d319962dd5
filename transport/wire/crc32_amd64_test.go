//go:build !purego

package wire

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// crcImpl is one of the assembly CRC functions pairs, with whether this
// CPU can run it.
type crcImpl struct {
	name string
	ok   bool
	hash func(crc uint32, p []byte) uint32
	copy func(crc uint32, dst, p []byte) uint32
}

// crcImpls are the 256-bit (YMM) and 512-bit (ZMM) folds: the tests run
// both where the CPU has them, whichever crc32Update uses.
var crcImpls = []crcImpl{
	{"ymm", hasVPCLMUL, crc32VPCLMUL, crc32VPCLMULCopy},
	{"zmm", hasVPCLMUL512, crc32VPCLMUL512, crc32VPCLMUL512Copy},
}

// forEachImpl runs f as a subtest for each implementation, skipping those
// the CPU lacks.
func forEachImpl(t *testing.T, f func(t *testing.T, im crcImpl)) {
	for _, im := range crcImpls {
		t.Run(im.name, func(t *testing.T) {
			if !im.ok {
				t.Skipf("CPU lacks the %s fold", im.name)
			}
			f(t, im)
		})
	}
}

// The hash function itself, on every length up to 4 KiB (every multiple of
// 16, and at some offsets every length between: the 0..15 bytes over a
// multiple of 16 must be ignored) and every offset 0..63: this reaches the
// 16-byte start that crc32Update (which calls it from crc32VPCLMULMin bytes
// on) does not, and every count of leftover 64-, 32- and 16-byte blocks
// after the 128- or 256-byte loop.
func TestCRC32VPCLMULDirect(t *testing.T) {
	forEachImpl(t, func(t *testing.T, im crcImpl) {
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
					if got := im.hash(s, buf[off:off+l+extra]); got != want {
						t.Fatalf("off %d len %d: %#08x, want %#08x", off, l+extra, got, want)
					}
				}
			}
		}
	})
}

// The CPU this runs on is reported (the test log says which path the other
// tests took).
func TestCRC32Features(t *testing.T) {
	t.Logf("hasVPCLMUL = %v, hasVPCLMUL512 = %v, crc32UseZMM = %v", hasVPCLMUL, hasVPCLMUL512, crc32UseZMM)
}

// The 512-bit fold is only selected where the CPU has it.
func TestCRC32UseZMMNeedsCPU(t *testing.T) {
	if crc32UseZMM && !hasVPCLMUL512 {
		t.Fatal("crc32UseZMM set without hasVPCLMUL512")
	}
	if hasVPCLMUL512 && !hasVPCLMUL {
		t.Fatal("hasVPCLMUL512 without hasVPCLMUL")
	}
}

// checkCopy runs im.copy from src into dst[doff:doff+len(src)], with guard
// bytes 0xa5 around and after the copied range, and checks the CRC, the
// copy and that nothing else was written.
func checkCopy(t *testing.T, im crcImpl, s uint32, dst []byte, doff int, src []byte, what string) {
	t.Helper()
	for i := range dst {
		dst[i] = 0xa5
	}
	n := len(src) &^ 15
	want := ^crc32.Update(^s, crc32.IEEETable, src[:n])
	if got := im.copy(s, dst[doff:doff+len(src)], src); got != want {
		t.Fatalf("%s, length %d: crc %#x, want %#x", what, len(src), got, want)
	}
	if !bytes.Equal(dst[doff:doff+n], src[:n]) {
		t.Fatalf("%s, length %d: copy differs", what, len(src))
	}
	for _, g := range [][]byte{dst[:doff], dst[doff+n:]} {
		if bytes.Count(g, []byte{0xa5}) != len(g) {
			t.Fatalf("%s, length %d: a byte outside dst[%d:%d] written", what, len(src), doff, doff+n)
		}
	}
}

// The copy function hashes what the hash function hashes and copies exactly
// those bytes, at every length up to 4 KiB + 15 and misaligned sources and
// destinations; the bytes around the copied range are left alone.
func TestCRC32VPCLMULCopy(t *testing.T) {
	forEachImpl(t, func(t *testing.T, im crcImpl) {
		r := rand.New(rand.NewPCG(23, 23))
		src := randBytes(r, 64+4096+15)
		dst := make([]byte, 64+4096+32)
		for _, off := range []int{0, 1, 7, 8, 16, 31, 32, 63} {
			doff := (off * 5) % 33
			for l := 0; l <= 4096+15; l++ {
				checkCopy(t, im, r.Uint32(), dst, doff, src[off:off+l], fmt.Sprintf("offset %d/%d", off, doff))
			}
		}
	})
}

// Random lengths up to 1 MiB at random source and destination alignments,
// hash and copy, against hash/crc32.
func TestCRC32VPCLMULLong(t *testing.T) {
	forEachImpl(t, func(t *testing.T, im crcImpl) {
		r := rand.New(rand.NewPCG(25, 25))
		const max = 1 << 20
		src := randBytes(r, 64+max)
		dst := make([]byte, 64+max+32)
		iters := 60
		if testing.Short() {
			iters = 10
		}
		for i := range iters {
			off, doff, l := r.IntN(64), r.IntN(64), r.IntN(max+1)
			if i < 4 {
				l = max - i
			}
			s := r.Uint32()
			p := src[off : off+l]
			want := ^crc32.Update(^s, crc32.IEEETable, p[:l&^15])
			if got := im.hash(s, p); got != want {
				t.Fatalf("off %d len %d: %#08x, want %#08x", off, l, got, want)
			}
			checkCopy(t, im, s, dst, doff, p, fmt.Sprintf("offset %d/%d", off, doff))
		}
	})
}

// crc32Update and crc32UpdateCopy on both paths (crc32UseZMM false and,
// where the CPU has it, true): every length 0..4096 at a few offsets,
// random lengths up to 1 MiB.
func TestCRC32UpdateBothPaths(t *testing.T) {
	r := rand.New(rand.NewPCG(26, 26))
	buf := randBytes(r, 64+1<<20)
	dst := make([]byte, len(buf)+8)
	saved := crc32UseZMM
	t.Cleanup(func() { crc32UseZMM = saved })
	for _, zmm := range []bool{false, true} {
		t.Run(fmt.Sprintf("zmm=%v", zmm), func(t *testing.T) {
			if zmm && !hasVPCLMUL512 {
				t.Skip("no AVX-512 VPCLMULQDQ")
			}
			crc32UseZMM = zmm
			check := func(off, l int) {
				p := buf[off : off+l]
				c := r.Uint32()
				want := crc32.Update(c, crc32.IEEETable, p)
				if got := crc32Update(c, p); got != want {
					t.Fatalf("off %d len %d: crc32Update %#08x, want %#08x", off, l, got, want)
				}
				dst[l] = 0x5a
				if got := crc32UpdateCopy(c, dst, p); got != want || !bytes.Equal(dst[:l], p) || dst[l] != 0x5a {
					t.Fatalf("off %d len %d: crc32UpdateCopy %#08x, want %#08x, or copy wrong", off, l, got, want)
				}
			}
			for _, off := range []int{0, 3, 16, 33} {
				for l := 0; l <= 4096; l++ {
					check(off, l)
				}
			}
			for range 40 {
				check(r.IntN(64), r.IntN(1<<20+1))
			}
		})
	}
}

// The folds side by side with hash/crc32 (128-bit PCLMULQDQ), hashing and
// copying while hashing (hash/crc32: copy, then hash), at the sizes of a
// short message, MTU 1024 and 4096 payloads, and a large buffer.
func BenchmarkCRC32Fold(b *testing.B) {
	r := rand.New(rand.NewPCG(27, 27))
	for _, size := range []int{64, 1024, 4096, 65536} {
		src, dst := randBytes(r, size), make([]byte, size)
		b.Run(fmt.Sprintf("op=hash/impl=hashcrc32/%dB", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			var c uint32
			for b.Loop() {
				c = crc32.Update(c, crc32.IEEETable, src)
			}
			_ = c
		})
		for _, im := range crcImpls {
			b.Run(fmt.Sprintf("op=hash/impl=%s/%dB", im.name, size), func(b *testing.B) {
				if !im.ok {
					b.Skipf("CPU lacks the %s fold", im.name)
				}
				b.SetBytes(int64(size))
				var c uint32
				for b.Loop() {
					c = im.hash(c, src)
				}
				_ = c
			})
		}
		b.Run(fmt.Sprintf("op=copy/impl=hashcrc32/%dB", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			var c uint32
			for b.Loop() {
				copy(dst, src)
				c = crc32.Update(c, crc32.IEEETable, src)
			}
			_ = c
		})
		for _, im := range crcImpls {
			b.Run(fmt.Sprintf("op=copy/impl=%s/%dB", im.name, size), func(b *testing.B) {
				if !im.ok {
					b.Skipf("CPU lacks the %s fold", im.name)
				}
				b.SetBytes(int64(size))
				var c uint32
				for b.Loop() {
					c = im.copy(c, dst, src)
				}
				_ = c
			})
		}
	}
}

// FuzzCRC32Fold runs the hash and copy functions of each fold the CPU has
// on the input from an offset (every alignment), against hash/crc32, with
// guard bytes around the copy.
func FuzzCRC32Fold(f *testing.F) {
	r := rand.New(rand.NewPCG(28, 28))
	for _, l := range []int{0, 16, 255, 256, 257, 320, 511, 512, 1024, 4100, 9000} {
		f.Add(r.Uint32(), uint8(r.IntN(64)), uint8(r.IntN(64)), randBytes(r, l))
	}
	f.Fuzz(func(t *testing.T, crc uint32, off, doff uint8, data []byte) {
		o := min(int(off)%64, len(data))
		p := data[o:]
		dst := make([]byte, 64+len(p)+16)
		for _, im := range crcImpls {
			if !im.ok {
				continue
			}
			want := ^crc32.Update(^crc, crc32.IEEETable, p[:len(p)&^15])
			if got := im.hash(crc, p); got != want {
				t.Fatalf("%s: len %d: %#08x, want %#08x", im.name, len(p), got, want)
			}
			checkCopy(t, im, crc, dst, int(doff)%64, p, im.name)
		}
	})
}
