package wire

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCRCWordMatchesBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for range 1000 {
		s, v := r.Uint32(), r.Uint64()
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], v)
		want := s
		for _, c := range b {
			want = crcByte(want, c)
		}
		require.Equal(t, want, crcWord(s, v))
	}
}

func TestZeroBytesAreMultiplicationByXPow8(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	for range 200 {
		s := r.Uint32()
		k := r.IntN(3000)
		want := s
		for range k {
			want = crcByte(want, 0)
		}
		require.Equal(t, want, gfMul(s, xPowBytes(k, &xPow8)), "k=%d", k)
		// And the inverse power undoes it.
		require.Equal(t, s, gfMul(want, xPowBytes(k, &xInvPow8)), "k=%d", k)
	}
	for j := range xPow8 {
		require.Equal(t, uint32(1<<31), gfMul(xPow8[j], xInvPow8[j]), "x^(8*2^%d) * inverse", j)
	}
	require.Equal(t, uint32(1<<31), crcUnshiftZero(crcByte(1<<31, 0)))
}

func TestIDRegIsInvertible(t *testing.T) {
	for d := range 1 << 16 {
		got, ok := idFromReg(idReg(uint16(d)))
		require.True(t, ok)
		require.Equal(t, uint16(d), got)
	}
	// Outside the image: random registers solve with probability 2^-16.
	r := rand.New(rand.NewPCG(3, 3))
	solved := 0
	for range 1 << 18 {
		if _, ok := idFromReg(r.Uint32()); ok {
			solved++
		}
	}
	require.LessOrEqual(t, solved, 16, "expected about 4 of 2^18")
}

func TestIDShiftCache(t *testing.T) {
	for _, n := range []int{16, 100, idCacheLen - 1, idCacheLen, 60000} {
		k := n - ICRCSize + idSuffix
		require.Equal(t, xPowBytes(k, &xPow8), idShiftFwd(n))
		require.Equal(t, xPowBytes(k, &xPow8), idShiftFwd(n), "cached")
		require.Equal(t, xPowBytes(k, &xInvPow8), idShiftInv(n))
		require.Equal(t, uint32(1<<31), gfMul(idShiftFwd(n), idShiftInv(n)))
	}
}
