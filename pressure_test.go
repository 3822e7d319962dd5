package softrdma_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// TestPressureUpcall: lowering the pin limit below what is pinned asks
// the application for the difference; the handler deregisters one of two
// 64 KiB MRs and re-registers it on demand; the report shows the request,
// the answer and the 64 KiB really returned.
func TestPressureUpcall(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	d := p.B.Dev
	const sz = 64 << 10
	as := mustAS(t, p.B)
	b1, err := as.Alloc(sz)
	require.NoError(t, err)
	b2, err := as.Alloc(sz)
	require.NoError(t, err)
	m1, err := d.RegMR(p.B.PD, b1, rw)
	require.NoError(t, err)
	m2, err := d.RegMR(p.B.PD, b2, rw)
	require.NoError(t, err)
	var odp *softrdma.MR
	d.SetPressureHandler(func(req softrdma.PressureRequest) softrdma.PressureAnswer {
		require.EqualValues(t, sz, req.Bytes)
		require.Equal(t, "limit lowered", req.Reason)
		require.NoError(t, d.DeregMR(m2))
		var err error
		odp, err = d.RegMR(p.B.PD, b2, rw|softrdma.AccessOnDemand)
		require.NoError(t, err)
		return softrdma.PressureAnswer{Released: sz, Note: "m2 converted to ODP"}
	})
	rep, err := d.SetPinLimit(sz)
	require.NoError(t, err)
	require.True(t, rep.Answered)
	require.EqualValues(t, sz, rep.Request.Bytes)
	require.EqualValues(t, 2*sz, rep.Request.Pinned)
	require.EqualValues(t, sz, rep.BytesReturned)
	require.Equal(t, "m2 converted to ODP", rep.Answer.Note)
	require.True(t, odp.ODP())
	// Over the new limit, a registration fails with the pin limit.
	b3, err := as.Alloc(4096)
	require.NoError(t, err)
	_, err = d.RegMR(p.B.PD, b3, rw)
	require.Error(t, err)

	// A handler that gives nothing back: the request is reported unmet.
	d.SetPressureHandler(func(softrdma.PressureRequest) softrdma.PressureAnswer { return softrdma.PressureAnswer{} })
	rep, err = d.RequestPinnedBytes(4096)
	require.ErrorIs(t, err, softrdma.ErrPressureUnmet)
	require.True(t, rep.Answered)
	require.Zero(t, rep.BytesReturned)
	require.NoError(t, d.DeregMR(m1))
	require.NoError(t, d.DeregMR(odp))
}
