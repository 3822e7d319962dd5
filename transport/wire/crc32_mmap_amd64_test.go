//go:build linux && !purego

package wire

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// The hash and copy functions of each fold on slices that end at a guard
// page, every length they take, and that start right after the lower guard
// page; the copy's destination ends (or starts) at a guard page too, so a
// read past the end of p or a write past dst[:len(p)&^15] faults.
func TestCRC32VPCLMULPageBoundary(t *testing.T) {
	forEachImpl(t, func(t *testing.T, im crcImpl) {
		page, out := guardedPage(t), guardedPage(t)
		r := rand.New(rand.NewPCG(32, 32))
		for i := range page {
			page[i] = byte(r.Uint32())
		}
		for l := 16; l <= len(page); l += 16 {
			s := r.Uint32()
			for _, p := range [][]byte{page[len(page)-l:], page[:l:l]} {
				want := ^crc32.Update(^s, crc32.IEEETable, p)
				if got := im.hash(s, p); got != want {
					t.Fatalf("len %d: %#08x, want %#08x", l, got, want)
				}
				for _, d := range [][]byte{out[len(out)-l:], out[:l:l]} {
					if got := im.copy(s, d, p); got != want || !bytes.Equal(d, p) {
						t.Fatalf("copy, len %d: %#08x, want %#08x, or copy wrong", l, got, want)
					}
				}
			}
		}
	})
}
