package wire

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// randBytes returns n random bytes from r.
func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// checkCRC32Update compares crc32Update with hash/crc32 on p from crc.
func checkCRC32Update(t *testing.T, crc uint32, p []byte, what string) {
	t.Helper()
	if got, want := crc32Update(crc, p), crc32.Update(crc, crc32.IEEETable, p); got != want {
		t.Fatalf("%s: len %d crc %#08x: crc32Update %#08x, hash/crc32 %#08x", what, len(p), crc, got, want)
	}
}

// Every length 0..2048 at every starting offset 0..63 (so every alignment
// of the start and of the end), with a random initial CRC and random bytes
// after the slice (which must not count).
func TestCRC32UpdateEveryLength(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 11))
	buf := randBytes(r, 64+2048+64)
	n := 2048
	if testing.Short() {
		n = 600
	}
	for off := range 64 {
		for l := 0; l <= n; l++ {
			checkCRC32Update(t, r.Uint32(), buf[off:off+l], fmt.Sprintf("off %d", off))
		}
	}
}

// Special initial values and inputs: zero and all-ones CRCs, all-zero and
// all-0xff data (the carry-less products are all zero or all ones).
func TestCRC32UpdateSpecialValues(t *testing.T) {
	zeros := make([]byte, 4096)
	ones := make([]byte, 4096)
	for i := range ones {
		ones[i] = 0xff
	}
	for _, crc := range []uint32{0, 0xffffffff, 1, 0x80000000} {
		for _, l := range []int{0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 1024, 4095, 4096} {
			checkCRC32Update(t, crc, zeros[:l], "zeros")
			checkCRC32Update(t, crc, ones[:l], "ones")
		}
	}
	// The check value of CRC-32/ISO-HDLC.
	if got := crc32Update(0, []byte("123456789")); got != 0xcbf43926 {
		t.Fatalf("check value %#08x, want 0xcbf43926", got)
	}
}

// Random lengths up to 64 KiB at random offsets.
func TestCRC32UpdateRandomLengths(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 12))
	buf := randBytes(r, 64+65536+64)
	iters := 3000
	if testing.Short() {
		iters = 300
	}
	for range iters {
		off, l := r.IntN(64), r.IntN(65537)
		checkCRC32Update(t, r.Uint32(), buf[off:off+l], fmt.Sprintf("off %d", off))
	}
	for _, l := range []int{65536 - 1, 65536, 9000, 9216} {
		checkCRC32Update(t, r.Uint32(), buf[:l], "fixed")
	}
}

// Chaining: updating over p in pieces equals one update, for every split
// point of a 700-byte buffer.
func TestCRC32UpdateChained(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 13))
	buf := randBytes(r, 700)
	want := crc32.ChecksumIEEE(buf)
	for i := 0; i <= len(buf); i++ {
		if got := crc32Update(crc32Update(0, buf[:i]), buf[i:]); got != want {
			t.Fatalf("split at %d: %#08x, want %#08x", i, got, want)
		}
	}
}

// A single flipped bit anywhere changes the result as it does for
// hash/crc32 (every bit position reaches the folds and the reduction).
func TestCRC32UpdateBitFlips(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 14))
	for _, l := range []int{16, 48, 64, 80, 128, 144, 272, 1040} {
		buf := randBytes(r, l)
		for bit := 0; bit < 8*l; bit++ {
			buf[bit/8] ^= 1 << (bit % 8)
			checkCRC32Update(t, 0, buf, fmt.Sprintf("bit %d", bit))
			buf[bit/8] ^= 1 << (bit % 8)
		}
	}
}

// FuzzCRC32 compares crc32Update with hash/crc32 (differential), on the
// input from an offset so that every alignment is reached.
func FuzzCRC32(f *testing.F) {
	r := rand.New(rand.NewPCG(15, 15))
	for _, l := range []int{0, 1, 15, 16, 31, 32, 63, 64, 65, 127, 128, 129, 200, 256, 1000, 4100} {
		f.Add(r.Uint32(), uint8(r.IntN(64)), randBytes(r, l))
	}
	f.Fuzz(func(t *testing.T, crc uint32, off uint8, data []byte) {
		o := int(off) % 64
		if o > len(data) {
			o = len(data)
		}
		checkCRC32Update(t, crc, data[o:], "fuzz")
	})
}

func BenchmarkCRC32(b *testing.B) {
	r := rand.New(rand.NewPCG(16, 16))
	for _, size := range []int{64, 1024, 4096, 65536} {
		buf := randBytes(r, size)
		b.Run(fmt.Sprintf("impl=hashcrc32/%dB", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			var c uint32
			for b.Loop() {
				c = crc32.Update(c, crc32.IEEETable, buf)
			}
			_ = c
		})
		b.Run(fmt.Sprintf("impl=wire/%dB", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			var c uint32
			for b.Loop() {
				c = crc32Update(c, buf)
			}
			_ = c
		})
	}
}

// crc32UpdateCopy is copy plus crc32Update, at every length that selects
// a different path (short, bulk and tail).
func TestCRC32UpdateCopy(t *testing.T) {
	r := rand.New(rand.NewPCG(24, 24))
	src := randBytes(r, 5000)
	for _, l := range []int{0, 1, 15, 16, 31, 32, 33, 100, 127, 128, 129, 4095, 4096, 4097, 5000} {
		dst := make([]byte, l+8)
		c := r.Uint32()
		got := crc32UpdateCopy(c, dst, src[:l])
		if want := crc32.Update(c, crc32.IEEETable, src[:l]); got != want {
			t.Fatalf("length %d: crc %#x, want %#x", l, got, want)
		}
		if string(dst[:l]) != string(src[:l]) || string(dst[l:]) != "\x00\x00\x00\x00\x00\x00\x00\x00" {
			t.Fatalf("length %d: copy wrong", l)
		}
	}
}
