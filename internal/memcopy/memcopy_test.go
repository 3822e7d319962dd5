package memcopy

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

const guard = 0xa5

// check copies n bytes from src+soff to dst+doff with f inside guard bytes
// and compares every byte with what the built-in copy gives.
func check(t testing.TB, f func(dst, src []byte), n, doff, soff int) {
	t.Helper()
	src := make([]byte, soff+n+64)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	mem := make([]byte, doff+n+128)
	for i := range mem {
		mem[i] = guard
	}
	want := bytes.Clone(mem)
	copy(want[64+doff:64+doff+n], src[soff:soff+n])
	f(mem[64+doff:64+doff+n], src[soff:soff+n+64]) // src longer than dst: n bytes move
	if !bytes.Equal(want, mem) {
		for i := range mem {
			if mem[i] != want[i] {
				t.Fatalf("n %d doff %d soff %d: byte %d of dst (guard before is 64) is %#x, want %#x", n, doff, soff, i-64, mem[i], want[i])
			}
		}
	}
}

// TestCopyMatchesTheBuiltin checks Copy against copy for every length up
// to 1 KiB and some longer ones, at every destination alignment within a
// cache line and a few source alignments, with guard bytes on both sides.
func TestCopyMatchesTheBuiltin(t *testing.T) {
	if !useAVX512 {
		t.Log("no AVX-512 here (or the race detector is on): Copy is the built-in copy")
	}
	lens := []int{4096, 4096 + 37, 65536, 65536 - 1, 1<<20 + 3}
	for n := 0; n <= 1024; n++ {
		lens = append(lens, n)
	}
	for _, n := range lens {
		for doff := 0; doff < 64; doff++ {
			for _, soff := range []int{0, 1, 13, 63} {
				if n > 4096 && doff%16 != 0 && doff != 63 {
					continue // the long ones at a few alignments
				}
				check(t, Copy, n, doff, soff)
			}
		}
	}
}

// TestCopyAVX512Directly runs the assembler loop itself (not through
// Copy's size and overlap checks) from its smallest length, 128 bytes,
// so that a race-detector build, whose Copy never calls it, tests it too.
func TestCopyAVX512Directly(t *testing.T) {
	if !hasAVX512 {
		t.Skip("the CPU has no AVX-512F")
	}
	direct := func(dst, src []byte) { copyAVX512(&dst[0], &src[0], min(len(dst), len(src))) }
	for n := 128; n <= 1100; n++ {
		for doff := 0; doff < 64; doff += 3 {
			check(t, direct, n, doff, n%64)
		}
	}
	check(t, direct, 4096, 100, 0)
}

// TestCopyOverlapping checks that overlapping slices, forward and
// backward, give what copy gives (they take the built-in copy).
func TestCopyOverlapping(t *testing.T) {
	for _, shift := range []int{-300, -64, -1, 1, 64, 300} {
		a := make([]byte, 4096)
		b := make([]byte, 4096)
		for i := range a {
			a[i] = byte(i)
			b[i] = byte(i)
		}
		lo := 600
		Copy(a[lo+shift:lo+shift+2000], a[lo:lo+2000])
		copy(b[lo+shift:lo+shift+2000], b[lo:lo+2000])
		require.Equal(t, b, a, "shift %d", shift)
	}
}

// FuzzCopy compares Copy with copy for arbitrary lengths of dst and src
// (each up to 64 KiB − 1, so either may be the shorter), arbitrary
// offsets, and, with same set, dst and src cut from one buffer, so that
// they overlap at every distance (including just touching, or one byte
// into each other) or do not.
func FuzzCopy(f *testing.F) {
	f.Add(uint16(4096), uint16(4096), uint16(100), uint16(0), false, uint64(1))
	f.Add(uint16(256), uint16(256), uint16(63), uint16(1), false, uint64(2))
	f.Add(uint16(255), uint16(255), uint16(0), uint16(0), false, uint64(3))
	f.Add(uint16(8192), uint16(300), uint16(7), uint16(9), false, uint64(4))
	f.Add(uint16(300), uint16(8192), uint16(7), uint16(9), false, uint64(5))
	f.Add(uint16(300), uint16(300), uint16(300), uint16(0), true, uint64(6)) // touching: no overlap
	f.Add(uint16(300), uint16(300), uint16(299), uint16(0), true, uint64(7)) // one byte of overlap
	f.Add(uint16(300), uint16(300), uint16(0), uint16(299), true, uint64(8))
	f.Fuzz(func(t *testing.T, dn, sn, doff, soff uint16, same bool, seed uint64) {
		r := rand.New(rand.NewPCG(seed, 0))
		fill := func(b []byte) {
			for i := range b {
				b[i] = byte(r.Uint32())
			}
		}
		if same {
			buf := make([]byte, max(int(doff)+int(dn), int(soff)+int(sn))+64)
			fill(buf)
			want := bytes.Clone(buf)
			copy(want[doff:int(doff)+int(dn)], want[soff:int(soff)+int(sn)])
			Copy(buf[doff:int(doff)+int(dn)], buf[soff:int(soff)+int(sn)])
			if !bytes.Equal(buf, want) {
				t.Fatalf("one buffer, dst [%d, +%d) src [%d, +%d): Copy differs from copy", doff, dn, soff, sn)
			}
			return
		}
		src := make([]byte, int(soff)+int(sn))
		fill(src)
		dst := make([]byte, int(doff)+int(dn)+64)
		fill(dst)
		want := bytes.Clone(dst)
		copy(want[doff:int(doff)+int(dn)], src[soff:])
		Copy(dst[doff:int(doff)+int(dn)], src[soff:])
		if !bytes.Equal(dst, want) {
			t.Fatalf("dst %d at %d, src %d at %d: Copy differs from copy", dn, doff, sn, soff)
		}
	})
}

// BenchmarkCopy compares Copy with the built-in copy in the same run,
// the destination 100 bytes into a 2 MiB buffer (where an RDMA WRITE at
// an unaligned address lands) and 64-byte aligned; cache-hot up to 64
// KiB. At 1 MiB, above MaxAVX512, Copy is the built-in copy too: the two
// lines there differ only by noise.
func BenchmarkCopy(b *testing.B) {
	for _, sz := range []struct {
		name string
		n    int
	}{{"256B", 256}, {"1KiB", 1 << 10}, {"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20}} {
		for _, off := range []int{100, 0} {
			dst := make([]byte, 2<<20+128)
			src := make([]byte, sz.n)
			d := dst[off : off+sz.n]
			b.Run(sz.name+"/off="+strconv.Itoa(off)+"/builtin", func(b *testing.B) {
				b.SetBytes(int64(sz.n))
				for b.Loop() {
					copy(d, src)
				}
			})
			b.Run(sz.name+"/off="+strconv.Itoa(off)+"/memcopy", func(b *testing.B) {
				b.SetBytes(int64(sz.n))
				for b.Loop() {
					Copy(d, src)
				}
			})
		}
	}
}

// TestCopyShortSource checks a src shorter than dst, both in the AVX-512
// range: min(len) bytes move and the rest of dst is untouched.
func TestCopyShortSource(t *testing.T) {
	for _, c := range []struct{ dst, src int }{{8192, 4096}, {4096, 300}, {4096, 255}, {300, 299}} {
		dst := bytes.Repeat([]byte{guard}, c.dst)
		src := bytes.Repeat([]byte{7}, c.src)
		Copy(dst, src)
		want := append(bytes.Repeat([]byte{7}, c.src), bytes.Repeat([]byte{guard}, c.dst-c.src)...)
		require.Equal(t, want, dst, "dst %d src %d", c.dst, c.src)
	}
}
