package transport

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// TestModifyRefusesAttributesTheTransitionDoesNotTake: ibv_modify_qp fails
// with EINVAL when the mask names an attribute that is neither required
// nor optional for the transition (IBTA 10.3.1 Table 91; the kernel's
// ib_modify_qp_is_ok: mask & ~(req_param | opt_param | IB_QP_STATE)), and
// changes nothing. In particular sq_psn and rq_psn are set only on the way
// to RTS and RTR: an RTS -> RTS that moved the requester's PSN under
// outstanding requests made their acknowledgements ghosts. These were
// applied.
func TestModifyRefusesAttributesTheTransitionDoesNotTake(t *testing.T) {
	r := newResponderRig(t) // RC in RTS: sq_psn 5000, rq_psn 1000
	_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
		SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
	require.NoError(t, err)
	_, _, psn := r.answer()
	require.Equal(t, wire.PSN(5000), psn)
	for _, c := range []struct {
		name string
		attr QPAttr
		mask AttrMask
	}{
		{"RTS->RTS sq_psn", QPAttr{State: QPStateRTS, SQPSN: 9}, QPAttrState | QPAttrSQPSN},
		{"RTS sq_psn, no state", QPAttr{SQPSN: 9}, QPAttrSQPSN},
		{"RTS->RTS rq_psn", QPAttr{State: QPStateRTS, RQPSN: 9}, QPAttrState | QPAttrRQPSN},
		{"RTS->RTS path_mtu", QPAttr{State: QPStateRTS, PathMTU: MTU256}, QPAttrState | QPAttrPathMTU},
		{"RTS->RTS dest_qp_num", QPAttr{State: QPStateRTS, DestQPN: 7}, QPAttrState | QPAttrDestQPN},
		{"RTS->RTS timeout", QPAttr{State: QPStateRTS, Timeout: 1}, QPAttrState | QPAttrTimeout},
		{"RTS->SQD access", QPAttr{State: QPStateSQD}, QPAttrState | QPAttrAccessFlags},
		{"RTS->ERR qkey", QPAttr{State: QPStateErr, QKey: 5}, QPAttrState | QPAttrQKey},
	} {
		err := r.qp.Modify(&c.attr, c.mask)
		require.ErrorIs(t, err, ErrBadAttr, c.name)
		require.Equal(t, QPStateRTS, r.qp.State(), c.name)
	}
	a := r.qp.Attr()
	require.Equal(t, wire.PSN(5001), a.SQPSN, "the next PSN after the WRITE's 5000, not 9")
	require.Equal(t, wire.PSN(1000), a.RQPSN)
	require.Equal(t, MTU1024, a.PathMTU)
	require.Equal(t, wire.PSN(5001), r.qp.RequesterState().NextPSN)
	require.Equal(t, wire.PSN(1000), r.qp.ResponderState().ExpectedPSN)

	// What the transitions do take is taken: min_rnr_timer and the
	// access flags in RTS -> RTS, timeout and retry counts in SQD -> SQD
	// (once the send queue has drained: the acknowledgement of the WRITE
	// still completes it).
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS, MinRNRTimer: 3, AccessFlags: r.qp.Attr().AccessFlags},
		QPAttrState|QPAttrMinRNRTimer|QPAttrAccessFlags))
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, EnSQDAsyncNotify: true}, QPAttrState|QPAttrEnSQDAsyncNotify))
	r.ackPkt(wire.SyndromeACK, 5000, 1)
	wcs := r.poll()
	require.Len(t, wcs, 1)
	require.Equal(t, WCSuccess, wcs[0].Status)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := r.d.GetAsyncEvent(ctx) // the requester notices the drain
	require.NoError(t, err)
	r.d.AckAsyncEvent(ev)
	require.Equal(t, qpEv(EventSQDrained, r.qp), evString(ev))
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, Timeout: 15, RetryCnt: 3}, QPAttrState|QPAttrTimeout|QPAttrRetryCnt))
	require.Equal(t, uint8(15), r.qp.Attr().Timeout)
}

// TestModifyRefusesAttributesByQPType: UC and UD take fewer attributes
// (ib_modify_qp_is_ok's per-type columns): UD no path (its MTU is the
// port's) and UC no READ/atomic or retry attributes.
func TestModifyRefusesAttributesByQPType(t *testing.T) {
	ud := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	require.ErrorIs(t, ud.qp.Modify(&QPAttr{State: QPStateRTS, Timeout: 14}, QPAttrState|QPAttrTimeout), ErrBadAttr)
	require.NoError(t, ud.qp.Modify(&QPAttr{State: QPStateRTS, QKey: 9}, QPAttrState|QPAttrQKey))
	uc := newDGRig(t, QPTypeUC, conn.PipeConfig{})
	require.ErrorIs(t, uc.qp.Modify(&QPAttr{State: QPStateRTS, MinRNRTimer: 1}, QPAttrState|QPAttrMinRNRTimer), ErrBadAttr)
	require.NoError(t, uc.qp.Modify(&QPAttr{State: QPStateRTS, AccessFlags: uc.qp.Attr().AccessFlags}, QPAttrState|QPAttrAccessFlags))
}
