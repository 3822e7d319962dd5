//go:build !purego

package wire

import (
	"hash/crc32"

	"golang.org/x/sys/cpu"
)

// crc32VPCLMUL advances the CRC register crc (before the final inversion)
// over the first len(p)&^15 bytes of p (no others are read) by folding with
// VPCLMULQDQ on 256-bit registers (crc32_amd64.s). Requires hasVPCLMUL.
//
//go:noescape
func crc32VPCLMUL(crc uint32, p []byte) uint32

// crc32VPCLMULCopy is crc32VPCLMUL that also copies the bytes it hashes
// (the first len(p)&^15) into dst, which must be at least that long.
//
//go:noescape
func crc32VPCLMULCopy(crc uint32, dst, p []byte) uint32

// crc32VPCLMUL512 is crc32VPCLMUL (the same contract) folding on 512-bit
// registers, 256 bytes per iteration (crc32_amd64.s); below 256 bytes it is
// crc32VPCLMUL. Requires hasVPCLMUL512.
//
//go:noescape
func crc32VPCLMUL512(crc uint32, p []byte) uint32

// crc32VPCLMUL512Copy is crc32VPCLMULCopy (the same contract) on 512-bit
// registers as crc32VPCLMUL512. Requires hasVPCLMUL512.
//
//go:noescape
func crc32VPCLMUL512Copy(crc uint32, dst, p []byte) uint32

// cpuid executes CPUID with EAX=eaxArg and ECX=ecxArg.
func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)

// hasVPCLMUL reports whether crc32VPCLMUL can run: AVX2 (which
// golang.org/x/sys/cpu sets only when the OS saves the YMM registers),
// PCLMULQDQ, and VPCLMULQDQ, the 256-bit carry-less multiply (CPUID leaf 7,
// ECX bit 10). x/sys/cpu reports that bit only as HasAVX512VPCLMULQDQ, and
// only on CPUs with AVX-512 (not on e.g. AMD Zen 3), so it is read here.
var hasVPCLMUL = detectVPCLMUL()

func detectVPCLMUL() bool {
	if !cpu.X86.HasAVX2 || !cpu.X86.HasPCLMULQDQ {
		return false
	}
	if maxID, _, _, _ := cpuid(0, 0); maxID < 7 {
		return false
	}
	_, _, ecx7, _ := cpuid(7, 0)
	return ecx7&(1<<10) != 0
}

// hasVPCLMUL512 reports whether crc32VPCLMUL512 can run: hasVPCLMUL, and
// AVX-512F, AVX-512VL (the EVEX forms on YMM registers) and VPCLMULQDQ as
// golang.org/x/sys/cpu reports them. x/sys/cpu sets the AVX-512 flags only
// when CPUID leaf 1 has OSXSAVE and XGETBV shows the OS saving the SSE,
// AVX, opmask, ZMM0-15 upper and ZMM16-31 state (XCR0 bits 1, 2, 5, 6, 7).
// No byte or word operations are used, so AVX-512BW is not needed.
var hasVPCLMUL512 = hasVPCLMUL && cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ

// crc32UseZMM selects crc32VPCLMUL512 over crc32VPCLMUL in crc32Update and
// crc32UpdateCopy. Tests set it to run either path on one machine; it is
// not changed while packets are processed.
var crc32UseZMM = hasVPCLMUL512

// crc32VPCLMULMin is the length from which crc32Update uses crc32VPCLMUL;
// below it the slicing-by-8 loop of icrc.go is as fast (about even at 16
// to 31 bytes, the asm 2x faster at 32 and more).
const crc32VPCLMULMin = 32

// crc32Update returns crc32.Update(crc, crc32.IEEETable, p): VPCLMULQDQ
// folding on 256-bit registers (512-bit with crc32UseZMM) for the
// multiple-of-16 bulk of p where the CPU has it, the slicing-by-8 tables
// for the last 0..15 bytes; hash/crc32 otherwise.
func crc32Update(crc uint32, p []byte) uint32 {
	if !hasVPCLMUL {
		return crc32.Update(crc, crc32.IEEETable, p)
	}
	s := ^crc
	if len(p) >= crc32VPCLMULMin {
		n := len(p) &^ 15
		if crc32UseZMM {
			s = crc32VPCLMUL512(s, p[:n])
		} else {
			s = crc32VPCLMUL(s, p[:n])
		}
		p = p[n:]
	}
	return ^crcUpdate(s, p)
}

// crc32UpdateCopy copies p into dst (at least as long) and returns
// crc32Update(crc, p), loading each byte once where the CPU has the
// 256-bit (or 512-bit) fold.
func crc32UpdateCopy(crc uint32, dst, p []byte) uint32 {
	if !hasVPCLMUL {
		copy(dst, p)
		return crc32.Update(crc, crc32.IEEETable, p)
	}
	dst = dst[:len(p)]
	s := ^crc
	if len(p) >= crc32VPCLMULMin {
		n := len(p) &^ 15
		if crc32UseZMM {
			s = crc32VPCLMUL512Copy(s, dst[:n], p[:n])
		} else {
			s = crc32VPCLMULCopy(s, dst[:n], p[:n])
		}
		p, dst = p[n:], dst[n:]
	}
	copy(dst, p)
	return ^crcUpdate(s, p)
}
