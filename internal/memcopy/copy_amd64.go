package memcopy

import "golang.org/x/sys/cpu"

// useAVX512 says whether Copy uses the AVX-512 loop: the CPU has
// AVX-512F (VMOVDQU64, VMOVDQA64), the OS saves ZMM state (cpu checks
// XCR0), and no sanitizer (race, ASan, MSan) is on.
var (
	hasAVX512 = cpu.X86.HasAVX512F
	useAVX512 = hasAVX512 && !raceEnabled
)

// copyAVX512 copies n ≥ 128 bytes from src to dst, which must not overlap.
//
//go:noescape
func copyAVX512(dst, src *byte, n int)
