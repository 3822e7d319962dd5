package softrdma_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
)

// TestInitUDAndConnectRefuseWrongQP: InitUD(nil) returns ErrBadQP as
// Connect(nil) does (it panicked on the nil pointer); InitUD of an RC or
// UC QP and Connect of a UD QP are refused with ErrBadAttr saying which
// call the QP needs, before any Modify (the QP stays in RESET), instead
// of the first Modify's "RESET -> INIT needs IBV_QP_ACCESS_FLAGS" or
// "... IBV_QP_QKEY", which sent the user looking for a missing attribute.
func TestInitUDAndConnectRefuseWrongQP(t *testing.T) {
	d, err := softrdma.Open(softrdma.Config{Addr: netip.MustParseAddrPort("127.0.0.1:0")})
	require.NoError(t, err)
	defer d.Close()
	pd, err := d.AllocPD()
	require.NoError(t, err)
	cq, err := d.CreateCQ(4)
	require.NoError(t, err)
	mk := func(typ softrdma.QPType) *softrdma.QP {
		qp, err := d.CreateQP(pd, softrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: typ,
			Cap: softrdma.Cap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
		require.NoError(t, err)
		return qp
	}

	err = softrdma.InitUD(nil, 0x1234, 0)
	assert.True(t, errors.Is(err, softrdma.ErrBadQP), "%v", err)

	for _, typ := range []softrdma.QPType{softrdma.QPTypeRC, softrdma.QPTypeUC} {
		qp := mk(typ)
		err := softrdma.InitUD(qp, 0x1234, 0)
		assert.True(t, errors.Is(err, softrdma.ErrBadAttr), "%v: %v", typ, err)
		assert.ErrorContains(t, err, "is "+typ.String()+", not UD (Connect connects RC and UC QPs)")
		assert.Equal(t, softrdma.QPStateReset, qp.State())
	}

	ud := mk(softrdma.QPTypeUD)
	peer := softrdma.Endpoint{Addr: netip.MustParseAddrPort("127.0.0.2:4791"), QPN: 17, PSN: 1}
	err = softrdma.Connect(ud, peer, 1, softrdma.ConnectOptions{})
	assert.True(t, errors.Is(err, softrdma.ErrBadAttr), "%v", err)
	assert.ErrorContains(t, err, "is UD, which is not connected (InitUD, then an address handle for each send)")
	assert.Equal(t, softrdma.QPStateReset, ud.State())
	// The right call still works.
	require.NoError(t, softrdma.InitUD(ud, 0x1234, 0))
	assert.Equal(t, softrdma.QPStateRTS, ud.State())
}
