package scopes

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
)

// TestDirtyCopyEstimateAtMostTheSection: the re-copy of the dirty pages
// runs inside the critical section, so its estimate (pages re-copied ×
// the median pre-copy time per page) is at most the section, and
// crit−copy is never negative. A 256 MiB MR (bench scopes --mr-size 256M
// --mrs 1 -q 1) pre-copied 65536 pages at 6.9 µs a page and re-copied
// all 65536 in a 34-ms critical section: the estimate was 451 ms,
// crit−copy p50 -417 ms, and the targets line said "met".
func TestDirtyCopyEstimateAtMostTheSection(t *testing.T) {
	reps := []softrdma.RemapReport{
		{PrecopyUs: 450748, PagesMoved: 65536, PagesRecopied: 65536, CriticalUs: 33799.4},
		{PrecopyUs: 450748, PagesMoved: 65536, PagesRecopied: 65536, CriticalUs: 34211.3},
		// A small re-copy keeps the product: 2 pages × 6.878 µs.
		{PrecopyUs: 450748, PagesMoved: 65536, PagesRecopied: 2, CriticalUs: 30},
	}
	dc, over := dirtyCopyEstimates(reps)
	require.Len(t, dc, 3)
	require.Equal(t, 33799.4, dc[0])
	require.Equal(t, 34211.3, dc[1])
	require.InDelta(t, 2*450748.0/65536, dc[2], 1e-9)
	require.Equal(t, []float64{0, 0}, over[:2])
	require.InDelta(t, 30-2*450748.0/65536, over[2], 1e-9)
	for i, o := range over {
		require.GreaterOrEqual(t, o, 0.0, "remap %d: crit−copy %v", i, o)
	}
}
