package placement_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/placement"
)

// TestSuspensionSurvivesFastReg: a suspended FRWR MR invalidated by
// LOCAL_INV and registered again by REG_MR stays suspended ("no byte is
// written into mr until ResumeMR"), and ResumeMR ends the suspension.
func TestSuspensionSurvivesFastReg(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	mr, err := e.AllocMR(pd1, 1)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.DeregMR(mr)) }()
	buf := make([]byte, 4096)
	require.NoError(t, e.MapMR(mr, buf))
	k1 := incKey(mr.LKey())
	require.NoError(t, e.FastReg(pd1, mr, k1, rw))
	require.NoError(t, e.SuspendMR(mr))
	require.Equal(t, placement.Suspended, write(e, pd1, 0, k1, mr.Addr(), []byte{1}))

	inv, err := e.Invalidate(pd1, 0, k1, false)
	require.NoError(t, err)
	inv.Wait()
	require.NoError(t, e.MapMR(mr, buf))
	k2 := incKey(k1)
	require.NoError(t, e.FastReg(pd1, mr, k2, rw))
	require.Equal(t, placement.Suspended, write(e, pd1, 0, k2, mr.Addr(), []byte{2}),
		"placed into a suspended MR")
	require.Zero(t, buf[0])
	require.NoError(t, e.ResumeMR(mr))
	require.Equal(t, placement.OK, write(e, pd1, 0, k2, mr.Addr(), []byte{3}))
	require.Equal(t, byte(3), buf[0])
}
