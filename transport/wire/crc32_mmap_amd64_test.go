//go:build linux && !purego

package wire

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// crc32VPCLMUL on slices that end at the guard page, every length it
// takes, and that start right after the lower guard page.
func TestCRC32VPCLMULPageBoundary(t *testing.T) {
	if !hasVPCLMUL {
		t.Skip("no AVX2 + VPCLMULQDQ")
	}
	page := guardedPage(t)
	r := rand.New(rand.NewPCG(32, 32))
	for i := range page {
		page[i] = byte(r.Uint32())
	}
	for l := 16; l <= len(page); l += 16 {
		s := r.Uint32()
		for _, p := range [][]byte{page[len(page)-l:], page[:l:l]} {
			if got, want := crc32VPCLMUL(s, p), ^crc32.Update(^s, crc32.IEEETable, p); got != want {
				t.Fatalf("len %d: %#08x, want %#08x", l, got, want)
			}
		}
	}
}
