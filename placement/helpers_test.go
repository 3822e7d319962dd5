package placement_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
	"github.com/stretchr/testify/require"
)

const (
	rw     = stag.AccessLocalWrite | stag.AccessRemoteWrite | stag.AccessRemoteRead
	all    = rw | stag.AccessRemoteAtomic
	pd1    = 1
	pd2    = 2
	guard  = 0xee
	marker = 0x5a
)

func reg(t testing.TB, e *placement.Engine, pd uint32, buf []byte, a stag.Access) *placement.MR {
	t.Helper()
	mr, err := e.RegMR(pd, buf, a)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.DeregMR(mr) })
	return mr
}

// guarded returns a slice of n bytes in the middle of a larger buffer whose
// other bytes are guard bytes, and a check that they still are.
func guarded(t *testing.T, n int) ([]byte, func()) {
	mem := make([]byte, n+2*4096)
	for i := range mem {
		mem[i] = guard
	}
	lo := 4096 - 3 // start and end mid-page
	b := mem[lo : lo+n : lo+n]
	return b, func() {
		t.Helper()
		for i := 0; i < lo; i++ {
			require.Equal(t, byte(guard), mem[i], "guard byte %d before the region", lo-i)
		}
		for i := lo + n; i < len(mem); i++ {
			require.Equal(t, byte(guard), mem[i], "guard byte %d after the region", i-lo-n)
		}
	}
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

func vmLckKB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmLck:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no VmLck")
	return 0
}
