//go:build race || asan || msan

package memcopy

import "testing"

// TestBuiltinUnderSanitizers: a build with the race detector, ASan or
// MSan copies with the built-in copy, which the compiler instruments
// (racewriterange, asanwrite, msanmove), so that the sanitizer sees the
// data path's copies; the assembler loop is invisible to it.
func TestBuiltinUnderSanitizers(t *testing.T) {
	if useAVX512 {
		t.Fatal("Copy takes the AVX-512 loop in a sanitizer build")
	}
}
