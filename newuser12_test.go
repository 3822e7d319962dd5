package softrdma_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// TestConnectLoopbackToOffHost: a device bound to a loopback address
// cannot reach a destination that is not one (Linux refuses the route:
// sendmmsg EINVAL for every packet, write-bw --bind 127.0.0.1 to a server
// at 10.0.0.1 then printing send errors until --idle-timeout), so the
// modify to RTR fails at once with an error naming both, as one across
// IP families does. A loopback destination is taken.
func TestConnectLoopbackToOffHost(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	newQP := func() *softrdma.QP {
		qp, err := p.A.Dev.CreateQP(p.A.PD, softrdma.QPInitAttr{SendCQ: p.A.CQ, RecvCQ: p.A.CQ, Type: softrdma.QPTypeRC,
			Cap: softrdma.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		require.NoError(t, err)
		return qp
	}
	err := softrdma.Connect(newQP(), softrdma.Endpoint{Addr: netip.MustParseAddrPort("10.0.0.1:4791"), QPN: 0x11, PSN: 1}, 1, softrdma.ConnectOptions{})
	require.ErrorIs(t, err, softrdma.ErrBadAttr)
	require.ErrorContains(t, err, "destination 10.0.0.1:4791 is not a loopback address, and the device is bound to 127.0.0.1")
	require.NoError(t, softrdma.Connect(newQP(), softrdma.Endpoint{Addr: netip.MustParseAddrPort("127.0.0.2:4791"), QPN: 0x11, PSN: 1}, 1, softrdma.ConnectOptions{}))
}
