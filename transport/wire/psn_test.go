package wire_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

const maxPSN = wire.PSN(wire.PSNMask) // 0xFFFFFF

func TestPSNAdd(t *testing.T) {
	for _, tc := range []struct {
		p    wire.PSN
		n    uint32
		want wire.PSN
	}{
		{0, 0, 0},
		{0, 1, 1},
		{100, 28, 128},
		// Wrap at 2^24.
		{maxPSN, 1, 0},
		{maxPSN, 2, 1},
		{maxPSN - 7, 8, 0},
		{maxPSN - 7, 16, 8},
		{1, wire.PSNMask, 0},
		// A full turn is the identity; extra high bits are dropped.
		{12345, 1 << 24, 12345},
		{12345, 1<<32 - 1, 12344},
		// Half the space.
		{0, wire.PSNHalfSpace, wire.PSNHalfSpace},
		{wire.PSNHalfSpace, wire.PSNHalfSpace, 0},
	} {
		if got := tc.p.Add(tc.n); got != tc.want {
			t.Errorf("PSN(%#x).Add(%#x), got: %#x, want: %#x", tc.p, tc.n, got, tc.want)
		}
	}
}

func TestPSNSub(t *testing.T) {
	for _, tc := range []struct {
		p    wire.PSN
		n    uint32
		want wire.PSN
	}{
		{5, 0, 5},
		{5, 5, 0},
		{128, 28, 100},
		// Wrap below zero.
		{0, 1, maxPSN},
		{1, 2, maxPSN},
		{7, 8, maxPSN},
		{0, wire.PSNHalfSpace, wire.PSNHalfSpace},
		{0, 1 << 24, 0},
	} {
		if got := tc.p.Sub(tc.n); got != tc.want {
			t.Errorf("PSN(%#x).Sub(%#x), got: %#x, want: %#x", tc.p, tc.n, got, tc.want)
		}
	}
}

func TestPSNDistanceAndBefore(t *testing.T) {
	for _, tc := range []struct {
		p, q wire.PSN
		want int32
	}{
		// Equal.
		{0, 0, 0},
		{maxPSN, maxPSN, 0},
		// Forward, no wrap.
		{0, 1, 1},
		{100, 108, 8},
		{0, wire.PSNHalfSpace - 1, wire.PSNHalfSpace - 1},
		// Backward, no wrap.
		{1, 0, -1},
		{108, 100, -8},
		// Forward across 0xFFFFFF -> 0.
		{maxPSN, 0, 1},
		{maxPSN, 7, 8},
		{maxPSN - 3, 4, 8},
		// Backward across the wrap.
		{0, maxPSN, -1},
		{4, maxPSN - 3, -8},
		// Exactly half the space away is "before" (the range is [-2^23, 2^23)).
		{0, wire.PSNHalfSpace, -wire.PSNHalfSpace},
		{wire.PSNHalfSpace, 0, -wire.PSNHalfSpace},
		{5, 5 + wire.PSNHalfSpace, -wire.PSNHalfSpace},
		// Just inside half the space either way.
		{wire.PSNHalfSpace + 1, 0, wire.PSNHalfSpace - 1},
		{0, wire.PSNHalfSpace + 1, -(wire.PSNHalfSpace - 1)},
	} {
		got := tc.p.Distance(tc.q)
		if got != tc.want {
			t.Errorf("PSN(%#x).Distance(%#x), got: %d, want: %d", tc.p, tc.q, got, tc.want)
		}
		if got, want := tc.p.Before(tc.q), tc.want > 0; got != want {
			t.Errorf("PSN(%#x).Before(%#x), got: %t, want: %t", tc.p, tc.q, got, want)
		}
		if got, want := tc.p.BeforeEq(tc.q), tc.want >= 0; got != want {
			t.Errorf("PSN(%#x).BeforeEq(%#x), got: %t, want: %t", tc.p, tc.q, got, want)
		}
		// Distance is consistent with Add.
		if tc.want != 0 && tc.want != -wire.PSNHalfSpace {
			require.Equal(t, tc.q, tc.p.Add(uint32(tc.want)))
			require.Equal(t, -tc.want, tc.q.Distance(tc.p))
		}
	}
}

func TestPSNInWindow(t *testing.T) {
	for _, tc := range []struct {
		p     wire.PSN
		first wire.PSN
		size  uint32
		want  bool
	}{
		// Empty window.
		{0, 0, 0, false},
		{5, 5, 0, false},
		// Edges of [first, first+size).
		{10, 10, 4, true},
		{13, 10, 4, true},
		{14, 10, 4, false},
		{9, 10, 4, false},
		// The window wraps through 0xFFFFFF -> 0.
		{maxPSN - 1, maxPSN - 1, 4, true},
		{maxPSN, maxPSN - 1, 4, true},
		{0, maxPSN - 1, 4, true},
		{1, maxPSN - 1, 4, true},
		{2, maxPSN - 1, 4, false},
		{maxPSN - 2, maxPSN - 1, 4, false},
		// Window of one.
		{maxPSN, maxPSN, 1, true},
		{0, maxPSN, 1, false},
		// Half the space and the whole space.
		{wire.PSNHalfSpace - 1, 0, wire.PSNHalfSpace, true},
		{wire.PSNHalfSpace, 0, wire.PSNHalfSpace, false},
		{maxPSN, 0, 1 << 24, true},
		{12345, 54321, 1 << 24, true},
	} {
		if got := tc.p.InWindow(tc.first, tc.size); got != tc.want {
			t.Errorf("PSN(%#x).InWindow(%#x, %d), got: %t, want: %t", tc.p, tc.first, tc.size, got, tc.want)
		}
	}
}

func TestMSNArithmetic(t *testing.T) {
	require.Equal(t, wire.MSN(0), wire.MSN(wire.PSNMask).Add(1))
	require.Equal(t, wire.MSN(3), wire.MSN(wire.PSNMask-1).Add(5))
	require.Equal(t, int32(2), wire.MSN(wire.PSNMask).Distance(1))
	require.Equal(t, int32(-2), wire.MSN(1).Distance(wire.PSNMask))
	require.Equal(t, int32(0), wire.MSN(42).Distance(42))
}
