package wire

import (
	"bufio"
	"fmt"
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The folding constants of crc32_amd64.s, derived here with GF(2)
// arithmetic (the method of Gopal et al., "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ Instruction", Intel, 2009), and a pure-Go
// model of the assembly that uses them.
//
// Representation. A 16-byte block loaded little-endian into a 128-bit
// register holds the polynomial whose coefficient of x^(127-k) is bit k:
// the first bit of the stream (bit 0 of byte 0) has the highest degree.
// Each 64-bit half is a polynomial of degree < 64 the same way (bit i is
// x^(63-i)), the low half the upper-degree one. A carry-less multiply of
// two such halves a and b puts the coefficient of x^(126-k) of a*b in bit
// k of the 128-bit product, which read as a block is a*b*x.
//
// So multiplying a half by x^E modulo P, with the product still fitting a
// block, uses the constant x^(E-1) mod P (degree < 32) as a half: its
// reflected 32-bit form in the top 32 bits, bits 32..63 (crcFoldConst).
//
// Folding a block X = H*x^64 + L across D bits of stream (onto the block
// that ends D bits later) multiplies H by x^(D+64) and L by x^D: the low
// half by the constant for E = D+64, the high half by the one for E = D.
// Both products have degree < 96 and are XORed into the later block.
//
// Reducing the last block X to the CRC, X*x^32 mod P:
//
//	Z1 = H*(x^96) + L*x^32       degree < 96: H times the constant for
//	                             E = 96, XOR L moved 32 bits (4 bytes) down
//	Z2 = G*(x^64) + M            Z1 = G*x^64 + M, G of degree < 32 in the
//	                             top of the low half: degree < 64, the high
//	                             half of the result
//	Barrett                      T = Z2 = T1*x^32 + T0; q = floor(T1*mu/x^32)
//	                             with mu = floor(x^64/P); T mod P = T + q*P
//
// The Barrett step works on T as a 64-bit half (bit i is x^(63-i)), with mu
// and P as 33-bit reflected values (bit j is x^(32-j)), so that T1*mu has
// x^(63-k) in bit k, q is its low 32 bits (reflected) and the remainder is
// bits 32..63 of T XOR q*P (Gopal et al., section "Barrett reduction").

// polyMulMod returns a*b mod P, a and b in the normal representation
// (bit i is x^i), both of degree < 32.
func polyMulMod(a, b uint64) uint64 {
	var p uint64
	for i := range 32 {
		if a>>i&1 != 0 {
			p ^= b << i
		}
	}
	return polyMod(p)
}

// crcPolyNormal is P in the normal representation, x^32 included.
const crcPolyNormal = 1<<32 | 0x04c11db7

// polyMod returns p mod P, p of degree < 64.
func polyMod(p uint64) uint64 {
	for i := 63; i >= 32; i-- {
		if p>>i&1 != 0 {
			p ^= crcPolyNormal << (i - 32)
		}
	}
	return p
}

// xPowMod returns x^n mod P in the normal representation.
func xPowMod(n int) uint64 {
	r, b := uint64(1), uint64(2) // 1, x
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			r = polyMulMod(r, b)
		}
		b = polyMulMod(b, b)
	}
	return r
}

// crcFoldConst returns the 64-bit half that multiplies a half by x^e mod P:
// x^(e-1) mod P reflected into bits 32..63 (bit 63-m is x^m).
func crcFoldConst(e int) uint64 {
	return uint64(bits.Reverse32(uint32(xPowMod(e-1)))) << 32
}

// crcBarrettMu returns floor(x^64 / P) in the 33-bit reflected form
// (bit j is x^(32-j)).
func crcBarrettMu() uint64 {
	// Long division of x^64 by P, the quotient (degree 32) in q.
	var q uint64
	rem := [2]uint64{0, 1} // x^64 as a 65-bit value: rem[1] bit 0 is x^64
	for i := 64; i >= 32; i-- {
		var bit uint64
		if i == 64 {
			bit = rem[1] & 1
		} else {
			bit = rem[0] >> i & 1
		}
		if bit != 0 {
			q |= 1 << (i - 32)
			// Subtract P*x^(i-32); P*x^(i-32) has degree i.
			v := uint64(crcPolyNormal)
			if i == 64 {
				rem[1] ^= 1
				rem[0] ^= (v &^ (1 << 32)) << 32
			} else {
				rem[0] ^= v << (i - 32)
			}
		}
	}
	return reflect33(q)
}

// reflect33 reverses the low 33 bits of v.
func reflect33(v uint64) uint64 { return bits.Reverse64(v) >> 31 }

// crcAsmConsts lists every DATA word of crc32_amd64.s with its derivation.
// Folding distances: 128 bytes per lane in the 4 x 256-bit main loop, 32
// bytes in the 1 x 256-bit loop (and for combining the 4 accumulators), 16
// bytes in the 128-bit loop (and for combining the two lanes of a 256-bit
// register). The 512-bit code (crc32VPCLMUL512) adds 256 bytes for its 4 x
// 512-bit main loop, 192, 128 and 64 bytes for folding its first three
// accumulators onto the fourth, 64 bytes for its 1 x 512-bit loop, and 32
// bytes (crcK256) for folding the low half of a 512-bit register onto the
// high half.
func crcAsmConsts() map[string]uint64 {
	m := map[string]uint64{}
	fold := func(name string, d int) { // d in bytes
		m[name+"+0"] = crcFoldConst(8*d + 64)
		m[name+"+8"] = crcFoldConst(8 * d)
	}
	fold("crcK2048", 256)
	fold("crcK1536", 192)
	fold("crcK1024", 128)
	fold("crcK512", 64)
	fold("crcK256", 32)
	fold("crcK128", 16)
	m["crcKReduce+0"] = crcFoldConst(96)
	m["crcKReduce+8"] = crcFoldConst(64)
	m["crcBarrett+0"] = reflect33(crcPolyNormal)
	m["crcBarrett+8"] = crcBarrettMu()
	return m
}

// crcAsmConstNames lists the DATA symbols of crc32_amd64.s in file order.
var crcAsmConstNames = []string{"crcK2048", "crcK1536", "crcK1024", "crcK512", "crcK256", "crcK128", "crcKReduce", "crcBarrett"}

// TestCRC32AsmConstants checks the constants written in crc32_amd64.s
// against crcAsmConsts. On a mismatch it prints the DATA lines to paste.
func TestCRC32AsmConstants(t *testing.T) {
	want := crcAsmConsts()
	f, err := os.Open("crc32_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	re := regexp.MustCompile(`^DATA\s+(\w+)<>\+(\d+)\(SB\)/8,\s*\$(0x[0-9a-fA-F]+)`)
	got := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		mm := re.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if mm == nil {
			continue
		}
		v, err := strconv.ParseUint(mm[3], 0, 64)
		if err != nil {
			t.Fatal(err)
		}
		got[mm[1]+"+"+mm[2]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	bad := false
	for k, v := range want {
		if got[k] != v {
			bad = true
			t.Errorf("%s: have %#016x, want %#016x", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			bad = true
			t.Errorf("%s: in the .s file but not derived", k)
		}
	}
	if bad {
		for _, k := range crcAsmConstNames {
			t.Logf("DATA %s<>+0(SB)/8, $%#016x", k, want[k+"+0"])
			t.Logf("DATA %s<>+8(SB)/8, $%#016x", k, want[k+"+8"])
		}
	}
}

// Known values: the Barrett constants of Gopal et al. for the IEEE
// polynomial, also in hash/crc32's crc32_amd64.s (rupoly).
func TestCRC32BarrettConstantsKnown(t *testing.T) {
	if got := reflect33(crcPolyNormal); got != 0x1db710641 {
		t.Errorf("P' = %#x, want 0x1db710641", got)
	}
	if got := crcBarrettMu(); got != 0x1f7011641 {
		t.Errorf("mu' = %#x, want 0x1f7011641", got)
	}
	// x^(8k) mod P here must agree with the reflected powers of icrc.go.
	for _, k := range []int{1, 2, 3, 100, 4096} {
		if got, want := bits.Reverse32(uint32(xPowMod(8*k))), xPowBytes(k, &xPow8); got != want {
			t.Errorf("x^(8*%d): %#x, want %#x", k, got, want)
		}
	}
}

// clmul64 is a software carry-less multiply: the 128-bit product of a and
// b as (lo, hi).
func clmul64(a, b uint64) (lo, hi uint64) {
	for i := range 64 {
		if b>>i&1 != 0 {
			lo ^= a << i
			if i != 0 {
				hi ^= a >> (64 - i)
			}
		}
	}
	return
}

type block [2]uint64 // a 128-bit register: [0] the low half

func loadBlock(p []byte) block {
	return block{leU64(p), leU64(p[8:])}
}

func leU64(p []byte) uint64 {
	_ = p[7]
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(p[i])
	}
	return v
}

// fold is VPCLMULQDQ $0x00 and $0x11 of x with the constant pair k, XORed.
func (x block) fold(k block) block {
	l0, h0 := clmul64(x[0], k[0])
	l1, h1 := clmul64(x[1], k[1])
	return block{l0 ^ l1, h0 ^ h1}
}

func (x block) xor(y block) block { return block{x[0] ^ y[0], x[1] ^ y[1]} }

func asmConst(name string) block {
	m := crcAsmConsts()
	return block{m[name+"+0"], m[name+"+8"]}
}

// crcFoldModel is the algorithm of crc32VPCLMUL in Go, lane for lane: s is
// the CRC register (before the final inversion), len(p) a multiple of 16,
// at least 16.
func crcFoldModel(s uint32, p []byte) uint32 {
	var acc []block // 128-bit lanes in stream order
	take := func(n int) {
		for i := 0; i < n; i += 16 {
			acc = append(acc, loadBlock(p[i:]))
		}
		p = p[n:]
	}
	switch {
	case len(p) >= 128:
		take(128)
	case len(p) >= 32:
		take(32)
	default:
		take(16)
	}
	acc[0][0] ^= uint64(s)
	if len(acc) == 8 {
		k := asmConst("crcK1024")
		for len(p) >= 128 {
			for i := range acc {
				acc[i] = acc[i].fold(k).xor(loadBlock(p[16*i:]))
			}
			p = p[128:]
		}
		// Four 256-bit accumulators into the last: lane pairs fold by 32 bytes.
		k = asmConst("crcK256")
		for j := 0; j < 6; j += 2 {
			acc[j+2] = acc[j].fold(k).xor(acc[j+2])
			acc[j+3] = acc[j+1].fold(k).xor(acc[j+3])
		}
		acc = acc[6:]
	}
	if len(acc) == 2 {
		k := asmConst("crcK256")
		for len(p) >= 32 {
			acc[0] = acc[0].fold(k).xor(loadBlock(p))
			acc[1] = acc[1].fold(k).xor(loadBlock(p[16:]))
			p = p[32:]
		}
		acc = []block{acc[0].fold(asmConst("crcK128")).xor(acc[1])}
	}
	x := acc[0]
	k := asmConst("crcK128")
	for len(p) >= 16 {
		x = x.fold(k).xor(loadBlock(p))
		p = p[16:]
	}
	if len(p) != 0 {
		panic("crcFoldModel: length not a multiple of 16")
	}
	return crcReduceModel(x)
}

// crcReduceModel is the reduction of the last block x to the CRC register
// (the "reduce" label of crc32_amd64.s).
func crcReduceModel(x block) uint32 {
	kr := asmConst("crcKReduce")
	lo, hi := clmul64(x[0], kr[0])
	z1 := block{lo ^ x[1]<<32, hi ^ x[1]>>32}
	_, t := clmul64(z1[0], kr[1])
	t ^= z1[1]
	kb := asmConst("crcBarrett")
	q, _ := clmul64(t&0xffffffff, kb[1])
	r, _ := clmul64(q&0xffffffff, kb[0])
	return uint32((r ^ t) >> 32)
}

// crcFoldModel512 is the algorithm of crc32VPCLMUL512 in Go, lane for
// lane (a 512-bit register is four lanes, acc[4*i:4*i+4] the i-th
// accumulator): s is the CRC register, len(p) a multiple of 16, at least
// 256 (below that the assembly is crc32VPCLMUL, crcFoldModel).
func crcFoldModel512(s uint32, p []byte) uint32 {
	acc := make([]block, 16)
	for i := range acc {
		acc[i] = loadBlock(p[16*i:])
	}
	p = p[256:]
	acc[0][0] ^= uint64(s)
	k := asmConst("crcK2048")
	for len(p) >= 256 {
		for i := range acc {
			acc[i] = acc[i].fold(k).xor(loadBlock(p[16*i:]))
		}
		p = p[256:]
	}
	// Accumulators 0, 1, 2 onto 3: lane j of each across 192, 128 and 64
	// bytes onto lane j of the last.
	z := acc[12:16]
	for i, name := range []string{"crcK1536", "crcK1024", "crcK512"} {
		k := asmConst(name)
		for j := range 4 {
			z[j] = acc[4*i+j].fold(k).xor(z[j])
		}
	}
	k = asmConst("crcK512")
	for len(p) >= 64 {
		for j := range 4 {
			z[j] = z[j].fold(k).xor(loadBlock(p[16*j:]))
		}
		p = p[64:]
	}
	// The low 256 bits (lanes 0, 1) onto the high (lanes 2, 3).
	k = asmConst("crcK256")
	y := [2]block{z[0].fold(k).xor(z[2]), z[1].fold(k).xor(z[3])}
	if len(p) >= 32 {
		y = [2]block{y[0].fold(k).xor(loadBlock(p)), y[1].fold(k).xor(loadBlock(p[16:]))}
		p = p[32:]
	}
	k = asmConst("crcK128")
	x := y[0].fold(k).xor(y[1])
	if len(p) >= 16 {
		x = x.fold(k).xor(loadBlock(p))
		p = p[16:]
	}
	if len(p) != 0 {
		panic("crcFoldModel512: length not a multiple of 16")
	}
	return crcReduceModel(x)
}

func TestCRC32FoldModel512(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	buf := make([]byte, 1200)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for n := 256; n <= len(buf); n += 16 {
		crc := r.Uint32()
		want := crc32.Update(crc, crc32.IEEETable, buf[:n])
		if got := ^crcFoldModel512(^crc, buf[:n]); got != want {
			t.Fatalf("n=%d: model %#08x, hash/crc32 %#08x", n, got, want)
		}
	}
}

func TestCRC32FoldModel(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	buf := make([]byte, 1200)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for n := 16; n <= len(buf); n += 16 {
		crc := r.Uint32()
		want := crc32.Update(crc, crc32.IEEETable, buf[:n])
		if got := ^crcFoldModel(^crc, buf[:n]); got != want {
			t.Fatalf("n=%d: model %#08x, hash/crc32 %#08x", n, got, want)
		}
	}
}

// Print the constants (go test -run TestCRC32PrintConstants -v).
func TestCRC32PrintConstants(t *testing.T) {
	if !testing.Verbose() {
		t.Skip("prints only with -v")
	}
	m := crcAsmConsts()
	for _, k := range crcAsmConstNames {
		t.Log(fmt.Sprintf("DATA %s<>+0(SB)/8, $%#016x", k, m[k+"+0"]))
		t.Log(fmt.Sprintf("DATA %s<>+8(SB)/8, $%#016x", k, m[k+"+8"]))
	}
}
