//go:build !purego

#include "textflag.h"

// CRC-32 (IEEE 802.3, reflected) by folding with VPCLMULQDQ on 256-bit
// registers: the method of Gopal et al., "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ Instruction" (Intel, 2009), with two 128-bit
// lanes per register; crc32VPCLMUL512 and crc32VPCLMUL512Copy do the same on
// 512-bit registers (four lanes) where the CPU has AVX-512. crc32_consts_test.go
// derives every constant below, explains the representation, checks this file
// against the derivation (TestCRC32AsmConstants) and models the algorithms in
// Go (crcFoldModel, crcFoldModel512).
//
// Each pair is (low half, high half) of the 128-bit multiplier: the low
// half multiplies a block's low (earlier, higher-degree) 64 bits, the high
// half its high 64 bits, with VPCLMULQDQ $0x00 and $0x11.

// Fold across 128 bytes: x^(1024+63) and x^(1024-1) mod P.
DATA crcK1024<>+0(SB)/8, $0x7d657a1000000000
DATA crcK1024<>+8(SB)/8, $0x7406fa9500000000
GLOBL crcK1024<>(SB), RODATA|NOPTR, $16

// Fold across 256 bytes (the 4 x 512-bit loop of crc32VPCLMUL512):
// x^(2048+63) and x^(2048-1) mod P.
DATA crcK2048<>+0(SB)/8, $0x7cc8e1e700000000
DATA crcK2048<>+8(SB)/8, $0x03f9f86300000000
GLOBL crcK2048<>(SB), RODATA|NOPTR, $16

// Fold across 192 bytes (the first of four 512-bit accumulators onto the
// last): x^(1536+63) and x^(1536-1) mod P.
DATA crcK1536<>+0(SB)/8, $0x67f7947600000000
DATA crcK1536<>+8(SB)/8, $0xc56d949600000000
GLOBL crcK1536<>(SB), RODATA|NOPTR, $16

// Fold across 64 bytes (the 1 x 512-bit loop, and the third accumulator
// onto the last): x^(512+63) and x^(512-1) mod P.
DATA crcK512<>+0(SB)/8, $0x653d982200000000
DATA crcK512<>+8(SB)/8, $0xcad38e8f00000000
GLOBL crcK512<>(SB), RODATA|NOPTR, $16

// Fold across 32 bytes: x^(256+63) and x^(256-1) mod P.
DATA crcK256<>+0(SB)/8, $0x9570d49500000000
DATA crcK256<>+8(SB)/8, $0x01b5fd1d00000000
GLOBL crcK256<>(SB), RODATA|NOPTR, $16

// Fold across 16 bytes: x^(128+63) and x^(128-1) mod P.
DATA crcK128<>+0(SB)/8, $0x65673b4600000000
DATA crcK128<>+8(SB)/8, $0x9ba54c6f00000000
GLOBL crcK128<>(SB), RODATA|NOPTR, $16

// Reduction 128 -> 96 -> 64 bits: x^95 and x^63 mod P.
DATA crcKReduce<>+0(SB)/8, $0xccaa009e00000000
DATA crcKReduce<>+8(SB)/8, $0xb8bc676500000000
GLOBL crcKReduce<>(SB), RODATA|NOPTR, $16

// Barrett reduction 64 -> 32 bits: P and floor(x^64 / P), 33-bit reflected.
DATA crcBarrett<>+0(SB)/8, $0x00000001db710641
DATA crcBarrett<>+8(SB)/8, $0x00000001f7011641
GLOBL crcBarrett<>(SB), RODATA|NOPTR, $16

// REDUCE128 reduces the 128-bit remainder in X1 to the 32-bit CRC register
// in AX; it clobbers X0, X2 and X5-X8. X1 = H (low half) : L (high half).
//  1. Z1 = H*x^96 + L*x^32: the product of the low halves, XOR L moved up
//     4 bytes (into bits 32..95); bits 0..31 clear.
//  2. Z2 = G*x^64 + M: Z1's low half times x^63's constant (the high half
//     of X0), XOR Z1; T = Z2's high half, moved to the low half.
//  3. Barrett: q = low 32 bits of T1*mu, T1 the low 32 bits of T; the CRC
//     is bits 32..63 of T XOR q*P.
#define REDUCE128 \
	VMOVDQU    crcKReduce<>(SB), X0 \
	VPCLMULQDQ $0x00, X0, X1, X5 \
	VPSRLDQ    $8, X1, X2 \
	VPSLLDQ    $4, X2, X2 \
	VPXOR      X2, X5, X5 \
	VPCLMULQDQ $0x10, X0, X5, X6 \
	VPXOR      X5, X6, X6 \
	VPSRLDQ    $8, X6, X6 \
	VMOVDQU    crcBarrett<>(SB), X0 \
	VPXOR      X7, X7, X7 \
	VPBLENDD   $1, X6, X7, X7 \
	VPCLMULQDQ $0x10, X0, X7, X7 \
	VPXOR      X8, X8, X8 \
	VPBLENDD   $1, X7, X8, X8 \
	VPCLMULQDQ $0x00, X0, X8, X8 \
	VPXOR      X6, X8, X8 \
	VPEXTRD    $1, X8, AX

// func crc32VPCLMUL(crc uint32, p []byte) uint32
//
// crc is the CRC register before the final inversion (^crc32.Update's
// argument) and so is the result. It hashes the first len(p)&^15 bytes of
// p and reads no others (none at all when len(p) < 16, returning crc).
// Requires AVX2 and VPCLMULQDQ.
//
// Registers: SI the data, CX the bytes left, Y0 the fold constant,
// Y1-Y4 the accumulators, Y5-Y8 products.
TEXT ·crc32VPCLMUL(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	ANDQ $-16, CX
	JZ   empty

	// X0 = crc, zero elsewhere (the VEX move clears bits 32..255).
	VMOVD AX, X0

	CMPQ CX, $32
	JB   start16
	CMPQ CX, $128
	JB   start32

	// Four 256-bit accumulators: 128 bytes, eight 128-bit lanes.
	VMOVDQU (SI), Y1
	VMOVDQU 32(SI), Y2
	VMOVDQU 64(SI), Y3
	VMOVDQU 96(SI), Y4
	VPXOR   Y0, Y1, Y1
	ADDQ    $128, SI
	SUBQ    $128, CX
	VBROADCASTI128 crcK1024<>(SB), Y0
	CMPQ    CX, $128
	JB      reduce4

	PCALIGN $32
loop128:
	VPCLMULQDQ $0x00, Y0, Y1, Y5
	VPCLMULQDQ $0x11, Y0, Y1, Y1
	VPCLMULQDQ $0x00, Y0, Y2, Y6
	VPCLMULQDQ $0x11, Y0, Y2, Y2
	VPCLMULQDQ $0x00, Y0, Y3, Y7
	VPCLMULQDQ $0x11, Y0, Y3, Y3
	VPCLMULQDQ $0x00, Y0, Y4, Y8
	VPCLMULQDQ $0x11, Y0, Y4, Y4
	VPXOR      (SI), Y5, Y5
	VPXOR      32(SI), Y6, Y6
	VPXOR      64(SI), Y7, Y7
	VPXOR      96(SI), Y8, Y8
	VPXOR      Y5, Y1, Y1
	VPXOR      Y6, Y2, Y2
	VPXOR      Y7, Y3, Y3
	VPXOR      Y8, Y4, Y4
	ADDQ       $128, SI
	SUBQ       $128, CX
	CMPQ       CX, $128
	JAE        loop128

reduce4:
	// Fold Y1 into Y2, Y2 into Y3, Y3 into Y4: each lane across 32 bytes.
	VBROADCASTI128 crcK256<>(SB), Y0
	VPCLMULQDQ $0x00, Y0, Y1, Y5
	VPCLMULQDQ $0x11, Y0, Y1, Y1
	VPXOR      Y5, Y2, Y2
	VPXOR      Y1, Y2, Y2
	VPCLMULQDQ $0x00, Y0, Y2, Y5
	VPCLMULQDQ $0x11, Y0, Y2, Y2
	VPXOR      Y5, Y3, Y3
	VPXOR      Y2, Y3, Y3
	VPCLMULQDQ $0x00, Y0, Y3, Y5
	VPCLMULQDQ $0x11, Y0, Y3, Y3
	VPXOR      Y5, Y4, Y4
	VPXOR      Y3, Y4, Y1
	JMP        loop32

start32:
	// One 256-bit accumulator: 32 bytes.
	VMOVDQU (SI), Y1
	VPXOR   Y0, Y1, Y1
	ADDQ    $32, SI
	SUBQ    $32, CX
	VBROADCASTI128 crcK256<>(SB), Y0

loop32:
	CMPQ       CX, $32
	JB         reduce2
	VPCLMULQDQ $0x00, Y0, Y1, Y5
	VPCLMULQDQ $0x11, Y0, Y1, Y1
	VPXOR      (SI), Y5, Y5
	VPXOR      Y5, Y1, Y1
	ADDQ       $32, SI
	SUBQ       $32, CX
	JMP        loop32

reduce2:
	// Fold the low lane of Y1 into the high lane: across 16 bytes.
	VMOVDQU       crcK128<>(SB), X0
	VEXTRACTI128  $1, Y1, X2
	VPCLMULQDQ    $0x00, X0, X1, X5
	VPCLMULQDQ    $0x11, X0, X1, X1
	VPXOR         X5, X2, X2
	VPXOR         X2, X1, X1
	JMP           loop16

start16:
	VMOVDQU (SI), X1
	VPXOR   X0, X1, X1
	ADDQ    $16, SI
	SUBQ    $16, CX
	VMOVDQU crcK128<>(SB), X0

loop16:
	CMPQ       CX, $16
	JB         reduce
	VPCLMULQDQ $0x00, X0, X1, X5
	VPCLMULQDQ $0x11, X0, X1, X1
	VPXOR      (SI), X5, X5
	VPXOR      X5, X1, X1
	ADDQ       $16, SI
	SUBQ       $16, CX
	JMP        loop16

reduce:
	REDUCE128

	VZEROUPPER

empty:
	MOVL AX, ret+32(FP)
	RET

// func crc32VPCLMULCopy(crc uint32, dst, p []byte) uint32
//
// crc32VPCLMUL that also copies what it hashes into dst (len(dst) >=
// len(p)&^15): each block is loaded once, stored to dst and folded, so
// the copy costs no second pass over p. Registers as crc32VPCLMUL, plus DI
// the destination and Y9-Y12 the loaded blocks.
TEXT ·crc32VPCLMULCopy(SB), NOSPLIT, $0-60
	MOVL crc+0(FP), AX
	MOVQ p_base+32(FP), SI
	MOVQ dst_base+8(FP), DI
	MOVQ p_len+40(FP), CX
	ANDQ $-16, CX
	JZ   empty

	// X0 = crc, zero elsewhere (the VEX move clears bits 32..255).
	VMOVD AX, X0

	CMPQ CX, $32
	JB   start16
	CMPQ CX, $128
	JB   start32

	// Four 256-bit accumulators: 128 bytes, eight 128-bit lanes.
	VMOVDQU (SI), Y1
	VMOVDQU Y1, (DI)
	VMOVDQU 32(SI), Y2
	VMOVDQU Y2, 32(DI)
	VMOVDQU 64(SI), Y3
	VMOVDQU Y3, 64(DI)
	VMOVDQU 96(SI), Y4
	VMOVDQU Y4, 96(DI)
	VPXOR   Y0, Y1, Y1
	ADDQ    $128, SI
	ADDQ    $128, DI
	SUBQ    $128, CX
	VBROADCASTI128 crcK1024<>(SB), Y0
	CMPQ    CX, $128
	JB      reduce4

	PCALIGN $32
loop128:
	VPCLMULQDQ $0x00, Y0, Y1, Y5
	VPCLMULQDQ $0x11, Y0, Y1, Y1
	VPCLMULQDQ $0x00, Y0, Y2, Y6
	VPCLMULQDQ $0x11, Y0, Y2, Y2
	VPCLMULQDQ $0x00, Y0, Y3, Y7
	VPCLMULQDQ $0x11, Y0, Y3, Y3
	VPCLMULQDQ $0x00, Y0, Y4, Y8
	VPCLMULQDQ $0x11, Y0, Y4, Y4
	VMOVDQU    (SI), Y9
	VMOVDQU    Y9, (DI)
	VPXOR      Y9, Y5, Y5
	VMOVDQU    32(SI), Y10
	VMOVDQU    Y10, 32(DI)
	VPXOR      Y10, Y6, Y6
	VMOVDQU    64(SI), Y11
	VMOVDQU    Y11, 64(DI)
	VPXOR      Y11, Y7, Y7
	VMOVDQU    96(SI), Y12
	VMOVDQU    Y12, 96(DI)
	VPXOR      Y12, Y8, Y8
	VPXOR      Y5, Y1, Y1
	VPXOR      Y6, Y2, Y2
	VPXOR      Y7, Y3, Y3
	VPXOR      Y8, Y4, Y4
	ADDQ       $128, SI
	ADDQ       $128, DI
	SUBQ       $128, CX
	CMPQ       CX, $128
	JAE        loop128

reduce4:
	// Fold Y1 into Y2, Y2 into Y3, Y3 into Y4: each lane across 32 bytes.
	VBROADCASTI128 crcK256<>(SB), Y0
	VPCLMULQDQ $0x00, Y0, Y1, Y5
	VPCLMULQDQ $0x11, Y0, Y1, Y1
	VPXOR      Y5, Y2, Y2
	VPXOR      Y1, Y2, Y2
	VPCLMULQDQ $0x00, Y0, Y2, Y5
	VPCLMULQDQ $0x11, Y0, Y2, Y2
	VPXOR      Y5, Y3, Y3
	VPXOR      Y2, Y3, Y3
	VPCLMULQDQ $0x00, Y0, Y3, Y5
	VPCLMULQDQ $0x11, Y0, Y3, Y3
	VPXOR      Y5, Y4, Y4
	VPXOR      Y3, Y4, Y1
	JMP        loop32

start32:
	// One 256-bit accumulator: 32 bytes.
	VMOVDQU (SI), Y1
	VMOVDQU Y1, (DI)
	VPXOR   Y0, Y1, Y1
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $32, CX
	VBROADCASTI128 crcK256<>(SB), Y0

loop32:
	CMPQ       CX, $32
	JB         reduce2
	VPCLMULQDQ $0x00, Y0, Y1, Y5
	VPCLMULQDQ $0x11, Y0, Y1, Y1
	VMOVDQU    (SI), Y9
	VMOVDQU    Y9, (DI)
	VPXOR      Y9, Y5, Y5
	VPXOR      Y5, Y1, Y1
	ADDQ       $32, SI
	ADDQ       $32, DI
	SUBQ       $32, CX
	JMP        loop32

reduce2:
	// Fold the low lane of Y1 into the high lane: across 16 bytes.
	VMOVDQU       crcK128<>(SB), X0
	VEXTRACTI128  $1, Y1, X2
	VPCLMULQDQ    $0x00, X0, X1, X5
	VPCLMULQDQ    $0x11, X0, X1, X1
	VPXOR         X5, X2, X2
	VPXOR         X2, X1, X1
	JMP           loop16

start16:
	VMOVDQU (SI), X1
	VMOVDQU X1, (DI)
	VPXOR   X0, X1, X1
	ADDQ    $16, SI
	ADDQ    $16, DI
	SUBQ    $16, CX
	VMOVDQU crcK128<>(SB), X0

loop16:
	CMPQ       CX, $16
	JB         reduce
	VPCLMULQDQ $0x00, X0, X1, X5
	VPCLMULQDQ $0x11, X0, X1, X1
	VMOVDQU    (SI), X9
	VMOVDQU    X9, (DI)
	VPXOR      X9, X5, X5
	VPXOR      X5, X1, X1
	ADDQ       $16, SI
	ADDQ       $16, DI
	SUBQ       $16, CX
	JMP        loop16

reduce:
	REDUCE128

	VZEROUPPER

empty:
	MOVL AX, ret+56(FP)
	RET

// func crc32VPCLMUL512(crc uint32, p []byte) uint32
//
// crc32VPCLMUL, the same contract (crc and the result are the register
// before the final inversion; it hashes the first len(p)&^15 bytes of p and
// reads no others), folding on 512-bit registers: four accumulators, 256
// bytes (sixteen 128-bit lanes) per iteration. Below 256 bytes it is
// crc32VPCLMUL (a tail call). Requires hasVPCLMUL512: AVX-512F, AVX-512VL,
// VPCLMULQDQ, and an OS that saves the opmask and ZMM state.
//
// Registers: SI the data, CX the bytes left, Z0 and Z9-Z10 fold constants,
// Z1-Z4 the accumulators, Z5-Z8 products. It uses no Z16-Z31, so
// VZEROUPPER leaves no dirty upper state.
TEXT ·crc32VPCLMUL512(SB), NOSPLIT, $0-36
	MOVQ p_len+16(FP), CX
	CMPQ CX, $256
	JB   short
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	ANDQ $-16, CX

	// X0 = crc, zero elsewhere (the VEX move clears bits 32..511).
	VMOVD     AX, X0
	VMOVDQU64 (SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VPXORQ    Z0, Z1, Z1
	ADDQ      $256, SI
	SUBQ      $256, CX
	VBROADCASTI32X4 crcK2048<>(SB), Z0
	CMPQ      CX, $256
	JB        reduce4

	PCALIGN $32
loop256:
	VPCLMULQDQ $0x00, Z0, Z1, Z5
	VPCLMULQDQ $0x11, Z0, Z1, Z1
	VPCLMULQDQ $0x00, Z0, Z2, Z6
	VPCLMULQDQ $0x11, Z0, Z2, Z2
	VPCLMULQDQ $0x00, Z0, Z3, Z7
	VPCLMULQDQ $0x11, Z0, Z3, Z3
	VPCLMULQDQ $0x00, Z0, Z4, Z8
	VPCLMULQDQ $0x11, Z0, Z4, Z4
	VPTERNLOGQ $0x96, (SI), Z5, Z1
	VPTERNLOGQ $0x96, 64(SI), Z6, Z2
	VPTERNLOGQ $0x96, 128(SI), Z7, Z3
	VPTERNLOGQ $0x96, 192(SI), Z8, Z4
	ADDQ       $256, SI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JAE        loop256

reduce4:
	// Fold Z1 across 192 bytes, Z2 across 128 and Z3 across 64 onto Z4,
	// independently (VPTERNLOGQ $0x96 is a three-way XOR), into Z1.
	VBROADCASTI32X4 crcK1536<>(SB), Z0
	VBROADCASTI32X4 crcK1024<>(SB), Z9
	VBROADCASTI32X4 crcK512<>(SB), Z10
	VPCLMULQDQ $0x00, Z0, Z1, Z5
	VPCLMULQDQ $0x11, Z0, Z1, Z1
	VPCLMULQDQ $0x00, Z9, Z2, Z6
	VPCLMULQDQ $0x11, Z9, Z2, Z2
	VPCLMULQDQ $0x00, Z10, Z3, Z7
	VPCLMULQDQ $0x11, Z10, Z3, Z3
	VPTERNLOGQ $0x96, Z5, Z4, Z1
	VPTERNLOGQ $0x96, Z6, Z7, Z2
	VPTERNLOGQ $0x96, Z3, Z2, Z1

loop64:
	// One 512-bit accumulator over the 0..255 bytes left: 64 at a time.
	CMPQ       CX, $64
	JB         reduce1
	VPCLMULQDQ $0x00, Z10, Z1, Z5
	VPCLMULQDQ $0x11, Z10, Z1, Z1
	VPTERNLOGQ $0x96, (SI), Z5, Z1
	ADDQ       $64, SI
	SUBQ       $64, CX
	JMP        loop64

reduce1:
	// Fold the low half of Z1 onto its high half, across 32 bytes, into Y1.
	VBROADCASTI128 crcK256<>(SB), Y0
	VEXTRACTI64X4  $1, Z1, Y2
	VPCLMULQDQ     $0x00, Y0, Y1, Y5
	VPCLMULQDQ     $0x11, Y0, Y1, Y1
	VPTERNLOGQ     $0x96, Y5, Y2, Y1

	// 0..63 bytes are left: at most one 32-byte and one 16-byte block.
	CMPQ       CX, $32
	JB         reduce2
	VPCLMULQDQ $0x00, Y0, Y1, Y5
	VPCLMULQDQ $0x11, Y0, Y1, Y1
	VPTERNLOGQ $0x96, (SI), Y5, Y1
	ADDQ       $32, SI
	SUBQ       $32, CX

reduce2:
	// Fold the low lane of Y1 into the high lane: across 16 bytes.
	VMOVDQU      crcK128<>(SB), X0
	VEXTRACTI128 $1, Y1, X2
	VPCLMULQDQ   $0x00, X0, X1, X5
	VPCLMULQDQ   $0x11, X0, X1, X1
	VPXOR        X5, X2, X2
	VPXOR        X2, X1, X1

	CMPQ       CX, $16
	JB         reduce
	VPCLMULQDQ $0x00, X0, X1, X5
	VPCLMULQDQ $0x11, X0, X1, X1
	VPXOR      (SI), X5, X5
	VPXOR      X5, X1, X1

reduce:
	REDUCE128

	VZEROUPPER

	MOVL AX, ret+32(FP)
	RET

short:
	JMP ·crc32VPCLMUL(SB)

// func crc32VPCLMUL512Copy(crc uint32, dst, p []byte) uint32
//
// crc32VPCLMULCopy (the same contract: it hashes the first len(p)&^15
// bytes of p, copies exactly those into dst, len(dst) >= len(p)&^15, and
// writes nothing else) on 512-bit registers as crc32VPCLMUL512; below 256
// bytes it is crc32VPCLMULCopy. Registers as crc32VPCLMUL512, plus DI the
// destination and Z9-Z12 the loaded blocks.
TEXT ·crc32VPCLMUL512Copy(SB), NOSPLIT, $0-60
	MOVQ p_len+40(FP), CX
	CMPQ CX, $256
	JB   short
	MOVL crc+0(FP), AX
	MOVQ p_base+32(FP), SI
	MOVQ dst_base+8(FP), DI
	ANDQ $-16, CX

	// X0 = crc, zero elsewhere (the VEX move clears bits 32..511).
	VMOVD     AX, X0
	VMOVDQU64 (SI), Z1
	VMOVDQU64 Z1, (DI)
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 Z2, 64(DI)
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 Z3, 128(DI)
	VMOVDQU64 192(SI), Z4
	VMOVDQU64 Z4, 192(DI)
	VPXORQ    Z0, Z1, Z1
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $256, CX
	VBROADCASTI32X4 crcK2048<>(SB), Z0
	CMPQ      CX, $256
	JB        reduce4

	PCALIGN $32
loop256:
	VPCLMULQDQ $0x00, Z0, Z1, Z5
	VPCLMULQDQ $0x11, Z0, Z1, Z1
	VPCLMULQDQ $0x00, Z0, Z2, Z6
	VPCLMULQDQ $0x11, Z0, Z2, Z2
	VPCLMULQDQ $0x00, Z0, Z3, Z7
	VPCLMULQDQ $0x11, Z0, Z3, Z3
	VPCLMULQDQ $0x00, Z0, Z4, Z8
	VPCLMULQDQ $0x11, Z0, Z4, Z4
	VMOVDQU64  (SI), Z9
	VMOVDQU64  Z9, (DI)
	VPTERNLOGQ $0x96, Z9, Z5, Z1
	VMOVDQU64  64(SI), Z10
	VMOVDQU64  Z10, 64(DI)
	VPTERNLOGQ $0x96, Z10, Z6, Z2
	VMOVDQU64  128(SI), Z11
	VMOVDQU64  Z11, 128(DI)
	VPTERNLOGQ $0x96, Z11, Z7, Z3
	VMOVDQU64  192(SI), Z12
	VMOVDQU64  Z12, 192(DI)
	VPTERNLOGQ $0x96, Z12, Z8, Z4
	ADDQ       $256, SI
	ADDQ       $256, DI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JAE        loop256

reduce4:
	// As crc32VPCLMUL512: Z1, Z2, Z3 folded onto Z4, into Z1.
	VBROADCASTI32X4 crcK1536<>(SB), Z0
	VBROADCASTI32X4 crcK1024<>(SB), Z9
	VBROADCASTI32X4 crcK512<>(SB), Z10
	VPCLMULQDQ $0x00, Z0, Z1, Z5
	VPCLMULQDQ $0x11, Z0, Z1, Z1
	VPCLMULQDQ $0x00, Z9, Z2, Z6
	VPCLMULQDQ $0x11, Z9, Z2, Z2
	VPCLMULQDQ $0x00, Z10, Z3, Z7
	VPCLMULQDQ $0x11, Z10, Z3, Z3
	VPTERNLOGQ $0x96, Z5, Z4, Z1
	VPTERNLOGQ $0x96, Z6, Z7, Z2
	VPTERNLOGQ $0x96, Z3, Z2, Z1

loop64:
	CMPQ       CX, $64
	JB         reduce1
	VPCLMULQDQ $0x00, Z10, Z1, Z5
	VPCLMULQDQ $0x11, Z10, Z1, Z1
	VMOVDQU64  (SI), Z11
	VMOVDQU64  Z11, (DI)
	VPTERNLOGQ $0x96, Z11, Z5, Z1
	ADDQ       $64, SI
	ADDQ       $64, DI
	SUBQ       $64, CX
	JMP        loop64

reduce1:
	// Fold the low half of Z1 onto its high half, across 32 bytes, into Y1.
	VBROADCASTI128 crcK256<>(SB), Y0
	VEXTRACTI64X4  $1, Z1, Y2
	VPCLMULQDQ     $0x00, Y0, Y1, Y5
	VPCLMULQDQ     $0x11, Y0, Y1, Y1
	VPTERNLOGQ     $0x96, Y5, Y2, Y1

	// 0..63 bytes are left: at most one 32-byte and one 16-byte block.
	CMPQ       CX, $32
	JB         reduce2
	VPCLMULQDQ $0x00, Y0, Y1, Y5
	VPCLMULQDQ $0x11, Y0, Y1, Y1
	VMOVDQU    (SI), Y9
	VMOVDQU    Y9, (DI)
	VPTERNLOGQ $0x96, Y9, Y5, Y1
	ADDQ       $32, SI
	ADDQ       $32, DI
	SUBQ       $32, CX

reduce2:
	// Fold the low lane of Y1 into the high lane: across 16 bytes.
	VMOVDQU      crcK128<>(SB), X0
	VEXTRACTI128 $1, Y1, X2
	VPCLMULQDQ   $0x00, X0, X1, X5
	VPCLMULQDQ   $0x11, X0, X1, X1
	VPXOR        X5, X2, X2
	VPXOR        X2, X1, X1

	CMPQ       CX, $16
	JB         reduce
	VPCLMULQDQ $0x00, X0, X1, X5
	VPCLMULQDQ $0x11, X0, X1, X1
	VMOVDQU    (SI), X9
	VMOVDQU    X9, (DI)
	VPXOR      X9, X5, X5
	VPXOR      X5, X1, X1

reduce:
	REDUCE128

	VZEROUPPER

	MOVL AX, ret+56(FP)
	RET

short:
	JMP ·crc32VPCLMULCopy(SB)

// func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL eaxArg+0(FP), AX
	MOVL ecxArg+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET
