package placement_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/hostmem"
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

// newODPEngine returns an engine over a new 16 MiB host address space and
// an ODP MR (rw) of pd1 over a fresh allocation of pages pages, all torn
// down at the end of the test (register further cleanups of the address
// space after it: they run first).
func newODPEngine(t *testing.T, pages int) (*hostmem.AddressSpace, *placement.Engine, []byte, *placement.MR) {
	t.Helper()
	as, err := hostmem.NewAddressSpace(hostmem.Config{Size: 16 << 20})
	require.NoError(t, err)
	e := placement.New(placement.Config{AddressSpace: as})
	buf, err := as.Alloc(pages * 4096)
	require.NoError(t, err)
	mr, err := e.RegMR(pd1, buf, rw|stag.AccessOnDemand)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, e.DeregMR(mr))
		require.NoError(t, as.Free(hostmem.AddrOf(buf), len(buf)))
		require.NoError(t, as.Close())
	})
	return as, e, buf, mr
}

// placeFaulting places msg at mr's address + off as an inbound RDMA WRITE
// does under the sync fault policy (Begin, Write, and on WouldFault
// FaultCursor and Write again), and requires OK.
func placeFaulting(t *testing.T, e *placement.Engine, mr *placement.MR, off uint64, msg []byte) {
	t.Helper()
	var c placement.Cursor
	require.Equal(t, placement.OK, e.Begin(&c, pd1, mr.RKey(), mr.Addr()+off, uint64(len(msg)), stag.AccessRemoteWrite))
	st := e.Write(&c, msg)
	if st == placement.WouldFault {
		require.Equal(t, placement.OK, e.FaultCursor(&c, uint64(len(msg))))
		st = e.Write(&c, msg)
	}
	require.Equal(t, placement.OK, st)
	e.End(&c)
}
