package transport

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/wire"
)

// TestModifyWithoutStateNeedsAValidSelfTransition: a Modify whose mask
// names no state is the transition from the current state to itself, and
// ib_modify_qp_is_ok refuses it where Table 91 has no such transition
// (qp_state_table[RTR][RTR] is not valid), whatever the mask: rxe answers
// EINVAL for ibv_modify_qp(qp, &attr, 0) in RTR. INIT -> INIT, RTS -> RTS,
// RESET -> RESET and ERR -> ERR are transitions and take an empty mask.
// An empty mask used to succeed in RTR.
func TestModifyWithoutStateNeedsAValidSelfTransition(t *testing.T) {
	r := newResponderRig(t)
	require.NoError(t, r.qp.Modify(&QPAttr{}, 0), "RTS -> RTS")
	r.toRTR(t)
	require.ErrorIs(t, r.qp.Modify(&QPAttr{}, 0), ErrBadTransition, "RTR -> RTR")
	require.Equal(t, QPStateRTR, r.qp.State())
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
	require.NoError(t, r.qp.Modify(&QPAttr{}, 0), "RESET -> RESET")
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateInit, Port: 1}, QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags))
	require.NoError(t, r.qp.Modify(&QPAttr{}, 0), "INIT -> INIT")
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateErr}, QPAttrState))
	require.NoError(t, r.qp.Modify(&QPAttr{}, 0), "ERR -> ERR")
}

// TestSQDIsLeftOnlyForErrorWhileDraining: after RTS -> SQD with a WRITE
// unacknowledged, the send queue drains; until it has drained, rxe refuses
// every transition out of SQD but the one to ERR (rxe_qp_chk_attr: "if
// (mask & IB_QP_STATE && cur_state == IB_QPS_SQD) if (sq_draining &&
// new_state != IB_QPS_ERR) EINVAL"), SQD -> SQD with attributes and SQD ->
// RTS among them: IBTA 10.3.1 has the attributes changed, and RTS entered
// again, once the SQ Drained event says nothing is in flight.
// ibv_query_qp reports the drain in sq_draining (rxe_qp_to_attr). Both
// transitions used to be taken at once, and no query said whether the
// drain was over.
func TestSQDIsLeftOnlyForErrorWhileDraining(t *testing.T) {
	start := func(t *testing.T) *syncRig {
		r := newSyncRig(t)
		_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		require.Len(t, r.sent(), 1)
		require.False(t, r.qp.Attr().SQDraining, "RTS")
		require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, EnSQDAsyncNotify: true}, QPAttrState|QPAttrEnSQDAsyncNotify))
		require.True(t, r.qp.Attr().SQDraining)
		return r
	}
	t.Run("drained", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := start(t)
			require.ErrorIs(t, r.qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState), ErrBadTransition)
			require.ErrorIs(t, r.qp.Modify(&QPAttr{State: QPStateSQD, Timeout: 20}, QPAttrState|QPAttrTimeout), ErrBadTransition)
			a := r.qp.Attr()
			require.Equal(t, QPStateSQD, a.State)
			require.Equal(t, uint8(14), a.Timeout, "the refused Modify changed nothing")

			r.ackPkt(wire.SyndromeACK, 5000, 1)
			synctest.Wait()
			require.Equal(t, []string{qpEv(EventSQDrained, r.qp)}, takeEvents(r.d))
			require.False(t, r.qp.Attr().SQDraining)
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, Timeout: 20}, QPAttrState|QPAttrTimeout))
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState))
			require.Equal(t, uint8(20), r.qp.Attr().Timeout)
		})
	})
	t.Run("to ERR", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := start(t)
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateErr}, QPAttrState))
			require.False(t, r.qp.Attr().SQDraining)
			wcs := r.poll()
			require.Len(t, wcs, 1)
			require.Equal(t, WCWRFlushErr, wcs[0].Status)
		})
	})
	t.Run("to RESET", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := start(t)
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
			require.False(t, r.qp.Attr().SQDraining)
			require.Empty(t, r.poll(), "RESET discards the WRITE without a completion")
		})
	})
}

// TestRefusedModifyToErrorKeepsMessageInProgress: a Modify to ERR (or
// RESET) that fails its checks changes nothing (ibv_modify_qp returns
// EINVAL and the QP goes on as before). Here RTS -> ERR names qkey, which
// no RC transition to ERR takes, while a two-packet SEND is half received:
// the SEND's LAST must still complete it. The refused Modify used to end
// the responder's message before its checks ran, and the LAST was then out
// of sequence: NAKed as an invalid request, the QP moved to ERR.
func TestRefusedModifyToErrorKeepsMessageInProgress(t *testing.T) {
	r := newResponderRig(t)
	_, err := r.qp.PostRecv(RecvWR{WRID: 7, SGL: []SGE{{Addr: r.mr.Addr(), Length: 4096, LKey: r.mr.LKey()}}})
	require.NoError(t, err)
	r.deliver(r.build(wire.OpSendFirst, 1000, make([]byte, rigMTU), false, nil))
	require.ErrorIs(t, r.qp.Modify(&QPAttr{State: QPStateErr, QKey: 5}, QPAttrState|QPAttrQKey), ErrBadAttr)
	require.ErrorIs(t, r.qp.Modify(&QPAttr{State: QPStateReset, PathMTU: MTU256}, QPAttrState|QPAttrPathMTU), ErrBadAttr)
	require.Equal(t, QPStateRTS, r.qp.State())
	r.deliver(r.build(wire.OpSendLast, 1001, make([]byte, 8), true, nil))
	op, syn, psn := r.answer()
	require.Equal(t, wire.OpAcknowledge, op)
	require.Equal(t, wire.SyndromeACK.Type(), syn.Type())
	require.Equal(t, wire.PSN(1001), psn)
	wcs := r.poll()
	require.Len(t, wcs, 1)
	require.Equal(t, WC{WRID: 7, Status: WCSuccess, Opcode: WCRecv, ByteLen: uint32(rigMTU + 8), QPN: wcs[0].QPN, SrcQP: wcs[0].SrcQP}, wcs[0])
	require.Equal(t, QPStateRTS, r.qp.State())
}

// TestQPWithoutSendQueue: ibv_create_qp with max_send_wr 0 creates a QP
// that only receives (rxe_qp_chk_cap bounds the capacities from above
// only, and its queue of 0 WRs takes no post; mlx5 likewise creates no
// send queue): ibv_query_qp reports 0, a post fails as the queue is full,
// and receives work. CreateQP refused it with ErrBadAttr.
func TestQPWithoutSendQueue(t *testing.T) {
	r := newResponderRig(t)
	qp, err := r.d.CreateQP(1, &QPInitAttr{SendCQ: r.cq, RecvCQ: r.cq, Type: QPTypeUD,
		Cap: Cap{MaxSendWR: 0, MaxRecvWR: 4, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.Equal(t, 0, qp.Cap().MaxSendWR)
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateInit, Port: 1, QKey: 0x11}, QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrQKey))
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTR}, QPAttrState))
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTS, SQPSN: 1}, QPAttrState|QPAttrSQPSN))
	ah, err := r.d.CreateAH(1, &AHAttr{Dest: r.from})
	require.NoError(t, err)
	n, err := qp.PostSend(SendWR{WRID: 1, Opcode: WRSend, AH: ah, RemoteQPN: 0x99, RemoteQKey: 0x11,
		SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}})
	require.ErrorIs(t, err, ErrSQFull)
	require.Zero(t, n)
	_, err = qp.PostRecv(RecvWR{WRID: 2, SGL: []SGE{{Addr: r.mr.Addr(), Length: 64, LKey: r.mr.LKey()}}})
	require.NoError(t, err)
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateErr}, QPAttrState))
	wcs := r.poll()
	require.Len(t, wcs, 1)
	require.Equal(t, uint64(2), wcs[0].WRID)
	require.Equal(t, WCWRFlushErr, wcs[0].Status)
}

// TestModifyRefusesUnknownAccessFlags: qp_access_flags outside the flags a
// QP takes are EINVAL (rxe_qp_chk_attr: qp_access_flags &
// ~RXE_ACCESS_SUPPORTED_QP), ZERO_BASED (an MR's) among them, and the
// refused Modify changes nothing; the optional range (RELAXED_ORDERING,
// 1<<20) is taken. Any flag used to be taken.
func TestModifyRefusesUnknownAccessFlags(t *testing.T) {
	r := newResponderRig(t)
	before := r.qp.Attr().AccessFlags
	for _, bad := range []stag.Access{1 << 12, stag.AccessZeroBased, 1 << 7, 1 << 30} {
		err := r.qp.Modify(&QPAttr{State: QPStateRTS, AccessFlags: stag.AccessRemoteWrite | bad}, QPAttrState|QPAttrAccessFlags)
		require.ErrorIs(t, err, ErrBadAttr, "%#x", uint32(bad))
	}
	require.Equal(t, before, r.qp.Attr().AccessFlags)
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS, AccessFlags: stag.AccessRemoteWrite | 1<<20}, QPAttrState|QPAttrAccessFlags))
	require.Equal(t, stag.AccessRemoteWrite|1<<20, r.qp.Attr().AccessFlags)
}

// TestQPWithoutReceiveQueue: max_recv_wr 0 is a QP without a receive
// queue, as max_send_wr 0 is one without a send queue (rxe's queue of 0
// WRs; ibv_query_qp reports 0): every receive post fails as the queue is
// full. CreateQP made it a queue of one, which took a post.
func TestQPWithoutReceiveQueue(t *testing.T) {
	r := newResponderRig(t)
	qp, err := r.d.CreateQP(1, &QPInitAttr{SendCQ: r.cq, RecvCQ: r.cq, Type: QPTypeRC, Cap: Cap{MaxSendWR: 4}})
	require.NoError(t, err)
	require.Equal(t, 0, qp.Cap().MaxRecvWR)
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateInit, Port: 1}, QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags))
	n, err := qp.PostRecv(RecvWR{WRID: 2, SGL: []SGE{{Addr: r.mr.Addr(), Length: 64, LKey: r.mr.LKey()}}})
	require.ErrorIs(t, err, ErrRQFull)
	require.Zero(t, n)
}
