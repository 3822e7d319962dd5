package softrdma_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// TestQueryQPDuringTraffic: ibv_query_qp while the QPs carry traffic and
// change attributes returns (no deadlock between Attr, which takes the
// responder's and the requester's locks, the receive loop and Modify; the
// race detector watches the rest) and, once the traffic is over, reports
// live PSNs (rxe_qp_to_attr: sq_psn = qp->req.psn, rq_psn =
// qp->resp.psn): the writer's sq_psn is its first PSN plus the packets it
// sent, across the 2^24 wrap, and the target's rq_psn the same PSN, the
// next it expects.
func TestQueryQPDuringTraffic(t *testing.T) {
	start := [2]uint32{0xfffff0, 0x10}
	p := softrdmatest.NewPair(t, softrdmatest.Options{StartPSN: &start, NoPcap: true})
	const size, writes = 65536 + 7, 20
	_, srcMR := reg(t, p.A, size, rw)
	_, dstMR := reg(t, p.B, size, rw)
	mtu := p.A.QP.Attr().PathMTU.Bytes()
	require.NotZero(t, mtu)

	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, qp := range []*softrdma.QP{p.A.QP, p.B.QP} {
		wg.Go(func() {
			for !stop.Load() {
				_ = qp.Attr()
			}
		})
	}
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			a := p.A.QP.Attr()
			_ = p.A.QP.Modify(&softrdma.QPAttr{State: softrdma.QPStateRTS, CurState: softrdma.QPStateRTS,
				MinRNRTimer: uint8(i % 32), AccessFlags: a.AccessFlags},
				softrdma.QPAttrState|softrdma.QPAttrCurState|softrdma.QPAttrMinRNRTimer|softrdma.QPAttrAccessFlags)
		}
	})
	for range writes {
		_, err := p.A.QP.PostSend(softrdma.SendWR{WRID: 1, Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
			SGL:        []softrdma.SGE{{Addr: srcMR.Addr(), Length: size, LKey: srcMR.LKey()}},
			RemoteAddr: dstMR.Addr(), RKey: dstMR.RKey()})
		require.NoError(t, err)
		wc := waitWC(t, p.A.CQ, 1)[0]
		require.Equal(t, softrdma.WCSuccess, wc.Status)
	}
	stop.Store(true)
	wg.Wait()

	pkts := uint32(writes * ((size + mtu - 1) / mtu))
	want := softrdma.PSN((start[0] + pkts) & 0xffffff)
	require.Equal(t, want, p.A.QP.Attr().SQPSN, "the writer's sq_psn: %d packets after %#x", pkts, start[0])
	require.Equal(t, want, p.B.QP.Attr().RQPSN, "the target's rq_psn")
	require.Equal(t, softrdma.PSN(start[1]), p.B.QP.Attr().SQPSN, "the target sent no request")
}
