package transport

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// TestAttrReportsLivePSNs: ibv_query_qp reports the PSNs the QP is at, not
// the ones Modify set: sq_psn is the next PSN the requester sends and
// rq_psn the next PSN the responder expects (rxe_qp_to_attr:
// attr->sq_psn = qp->req.psn, attr->rq_psn = qp->resp.psn). Before any
// traffic they are the ones set (what the rdma_cm path of cmd/softrdma
// reads). Attr returned the values of the last Modify for ever.
func TestAttrReportsLivePSNs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t) // RC in RTS: sq_psn 5000, rq_psn 1000, path MTU 1024
		a := r.qp.Attr()
		require.Equal(t, wire.PSN(5000), a.SQPSN, "before traffic: as set")
		require.Equal(t, wire.PSN(1000), a.RQPSN, "before traffic: as set")

		// The responder takes a WRITE (PSN 1000) and a READ of 2048
		// bytes (1001: its two responses take 1001 and 1002, IBTA
		// 9.7.5.1.1): it expects 1003 next.
		r.deliver(r.build(wire.OpRDMAWriteOnly, 1000, make([]byte, 8), true, r.reth(r.mr.Addr(), r.mr.RKey(), 8)))
		r.deliver(r.build(wire.OpRDMAReadRequest, 1001, nil, true, r.reth(r.mr.Addr(), r.mr.RKey(), 2048)))
		// The requester sends a WRITE of 3000 bytes: three packets, 5000
		// to 5002; it sends 5003 next, acknowledged or not.
		_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 3000, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		var writes int
		for _, p := range r.sent() {
			if p.Info.Mask&wire.MaskReq != 0 {
				writes++
			}
		}
		require.Equal(t, 3, writes)

		a = r.qp.Attr()
		require.Equal(t, wire.PSN(5003), a.SQPSN, "sq_psn: the requester's next PSN")
		require.Equal(t, wire.PSN(1003), a.RQPSN, "rq_psn: the responder's expected PSN")
		require.Equal(t, QPStateRTS, a.State)
	})
}

// TestModifyCurStateMustMatch: IBV_QP_CUR_STATE asserts the state the
// caller believes the QP is in (IBTA 11.2.5.3, the Modify QP verb's
// "current QP state" input; mthca and mlx4 pass it to the firmware as the
// transition's source state, whose MODIFY_QP from another state fails,
// which they return as EINVAL): a mismatch fails with EINVAL and changes
// nothing. It was ignored: an RTS -> RTS naming SQD (or RTR) as the
// current state changed the attributes. Attr reports cur_qp_state as the
// current state (rxe_qp_to_attr, Linux commit 775e6d3c8fda "RDMA/rxe: Set
// queue pair cur_qp_state when being queried"; mlx4, mlx5: cur_qp_state =
// qp_state).
func TestModifyCurStateMustMatch(t *testing.T) {
	r := newResponderRig(t) // RC in RTS, min_rnr_timer 1
	a := r.qp.Attr()
	require.Equal(t, QPStateRTS, a.CurState, "query: cur_qp_state is the current state")
	for _, cur := range []QPState{QPStateReset, QPStateInit, QPStateRTR, QPStateSQD, QPStateSQE, QPStateErr} {
		err := r.qp.Modify(&QPAttr{State: QPStateRTS, CurState: cur, MinRNRTimer: 9},
			QPAttrState|QPAttrCurState|QPAttrMinRNRTimer)
		require.ErrorIs(t, err, ErrBadTransition, "cur_qp_state %v on a QP in RTS", cur)
		require.Equal(t, QPStateRTS, r.qp.State())
		require.Equal(t, uint8(1), r.qp.Attr().MinRNRTimer, "a refused Modify changes nothing")
	}
	// Without a state, the transition is RTS -> RTS too.
	require.ErrorIs(t, r.qp.Modify(&QPAttr{CurState: QPStateSQD}, QPAttrCurState), ErrBadTransition)
	// The right one is taken, on the transitions that take it.
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS, CurState: QPStateRTS, MinRNRTimer: 9},
		QPAttrState|QPAttrCurState|QPAttrMinRNRTimer))
	require.Equal(t, uint8(9), r.qp.Attr().MinRNRTimer)
	// RTS -> SQD does not take it (ib_modify_qp_is_ok), right or not.
	require.ErrorIs(t, r.qp.Modify(&QPAttr{State: QPStateSQD, CurState: QPStateRTS}, QPAttrState|QPAttrCurState), ErrBadAttr)

	// A QP the engine moved to ERR (a NAK) is not taken back to RTS by a
	// caller who believed it in RTS.
	_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
		SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
	require.NoError(t, err)
	_, _, psn := r.answer()
	r.ackPkt(wire.SyndromeNAKRemoteAccess, psn, 0)
	require.Equal(t, QPStateErr, r.qp.State())
	require.ErrorIs(t, r.qp.Modify(&QPAttr{State: QPStateRTS, CurState: QPStateRTS}, QPAttrState|QPAttrCurState), ErrBadTransition)
	require.Equal(t, QPStateErr, r.qp.Attr().CurState)
}

// TestSQDrainedOnlyWhenAsked: the Send Queue Drained event is raised only
// if the Modify to SQD asked for it with en_sqd_async_notify (IBTA
// 11.2.5.3, the "SQD event request" input; mlx4, mlx5 and mthca set the
// firmware's sqd_event only for IB_QP_EN_SQD_ASYNC_NOTIFY with
// attr->en_sqd_async_notify); the drain itself, and sq_draining, are the
// same either way. RTS -> SQD is the one transition that takes the
// attribute (ib_modify_qp_is_ok). The event used to be raised on every
// drain (rxe's behaviour).
func TestSQDrainedOnlyWhenAsked(t *testing.T) {
	write := func(r *syncRig) {
		_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
	}
	t.Run("not asked", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newSyncRig(t)
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD}, QPAttrState))
			synctest.Wait()
			require.Empty(t, takeEvents(r.d), "idle, not asked: no event")
			require.False(t, r.qp.Attr().SQDraining, "drained at once")
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState))

			write(r)
			require.Len(t, r.sent(), 1)
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, EnSQDAsyncNotify: false},
				QPAttrState|QPAttrEnSQDAsyncNotify))
			require.True(t, r.qp.Attr().SQDraining)
			r.ackPkt(wire.SyndromeACK, 5000, 1)
			synctest.Wait()
			require.Empty(t, takeEvents(r.d), "drained, not asked: no event")
			require.False(t, r.qp.Attr().SQDraining, "the drain is over all the same")
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState))
		})
	})
	t.Run("asked", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newSyncRig(t)
			write(r)
			require.Len(t, r.sent(), 1)
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, EnSQDAsyncNotify: true},
				QPAttrState|QPAttrEnSQDAsyncNotify))
			require.True(t, r.qp.Attr().EnSQDAsyncNotify)
			synctest.Wait()
			require.Empty(t, takeEvents(r.d), "not drained yet")
			require.ErrorIs(t, r.qp.Modify(&QPAttr{State: QPStateSQD, EnSQDAsyncNotify: true},
				QPAttrState|QPAttrEnSQDAsyncNotify), ErrBadAttr, "SQD -> SQD does not take it")
			r.ackPkt(wire.SyndromeACK, 5000, 1)
			synctest.Wait()
			require.Equal(t, []string{qpEv(EventSQDrained, r.qp)}, takeEvents(r.d))
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState))
			// The next drain that does not ask raises nothing.
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD}, QPAttrState))
			synctest.Wait()
			require.Empty(t, takeEvents(r.d))
		})
	})
}

// TestDestroyQPDiscardsOutstandingWRs: ibv_destroy_qp discards the QP's
// outstanding work requests without completions, as rxe does:
// rxe_qp_do_cleanup clears qp->valid and runs the completer and responder,
// whose flush_send_queue and flush_recv_queue then complete nothing
// (notify = qp->valid && state == ERR). Completions already queued stay,
// and nothing of the QP completes afterwards (an ACK of its WRITE, a
// local invalidation finishing). DestroyQP used to flush every WR with
// WR_FLUSH_ERR into the CQs of a QP the consumer no longer has.
func TestDestroyQPDiscardsOutstandingWRs(t *testing.T) {
	r := newResponderRig(t) // RC in RTS; send and receive CQ r.cq
	for i := range 4 {
		_, err := r.qp.PostRecv(RecvWR{WRID: uint64(100 + i), SGL: []SGE{{Addr: r.mr.Addr(), Length: 2048, LKey: r.mr.LKey()}}})
		require.NoError(t, err)
	}
	// A SEND completes receive 100; a SEND_FIRST takes receive 101, which
	// the responder holds.
	r.deliver(r.build(wire.OpSendOnly, 1000, make([]byte, 8), true, nil))
	r.deliver(r.build(wire.OpSendFirst, 1001, make([]byte, rigMTU), false, nil))
	for i := range 2 {
		_, err := r.qp.PostSend(SendWR{WRID: uint64(i + 1), Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
	}
	_, _, _ = r.answer() // the SEND's ACK
	_, _, psn := r.answer()
	require.Equal(t, wire.PSN(5000), psn)

	require.NoError(t, r.d.DestroyQP(r.qp))
	wcs := r.poll()
	require.Len(t, wcs, 1, "only the completion queued before DestroyQP: %v", wcs)
	require.Equal(t, uint64(100), wcs[0].WRID)
	require.Equal(t, WCSuccess, wcs[0].Status)

	r.ackPkt(wire.SyndromeACK, psn, 1) // its QP is gone: dropped
	require.Empty(t, r.poll(), "nothing completes after DestroyQP")
}

// TestUnreliableSendErrorEntersSQE: on UC and UD a send queue WQE that
// completes in error moves the QP to the Send Queue Error state (IBTA
// 10.3.1, "Send Queue Error (SQEr)": entered from RTS or SQD by a send
// WQE completing in error, for every service but RC, which goes to ERR):
// the WQE completes with its error, the ones behind it and those posted
// in SQE complete with WR_FLUSH_ERR, and the receive queue goes on
// (C10-38: its WRs are processed normally and new ones may be posted).
// Modify SQE -> RTS resumes sending. The QP went to ERR, and its receive
// WRs were flushed, as rxe does (rxe never enters SQE: rxe_qp_from_attr
// "Not possible from modify_qp", its completer calls rxe_qp_error).
func TestUnreliableSendErrorEntersSQE(t *testing.T) {
	for _, typ := range []QPType{QPTypeUC, QPTypeUD} {
		t.Run(map[QPType]string{QPTypeUC: "UC", QPTypeUD: "UD"}[typ], func(t *testing.T) {
			r := newDGRig(t, typ, conn.PipeConfig{})
			mr2, err := r.place.RegMR(1, make([]byte, 64), stag.AccessLocalWrite)
			require.NoError(t, err)
			var ah *AH
			if typ == QPTypeUD {
				ah, err = r.d.CreateAH(1, &AHAttr{Dest: r.from})
				require.NoError(t, err)
			}
			send := func(wrid uint64, sge SGE) SendWR {
				return SendWR{WRID: wrid, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{sge},
					AH: ah, RemoteQPN: 0x11, RemoteQKey: dgQKey}
			}
			ok := SGE{Addr: r.mr.Addr(), Length: 16, LKey: r.mr.LKey()}
			r.postRecv(10, 0, 2048)
			r.postRecv(11, 2048, 2048)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			wait := func(n int) []WC {
				var got []WC
				wcs := make([]WC, 8)
				for len(got) < n {
					k, err := r.cq.Wait(ctx, wcs)
					require.NoError(t, err)
					got = append(got, wcs[:k]...)
				}
				return got
			}

			// Posted in SQD, where the requester starts nothing; the
			// second WR's MR goes away before it runs (IBTA 10.7.2.2: a
			// local protection error).
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD}, QPAttrState))
			_, err = r.qp.PostSend(send(1, ok), send(2, SGE{Addr: mr2.Addr(), Length: 16, LKey: mr2.LKey()}), send(3, ok))
			require.NoError(t, err)
			require.NoError(t, r.place.DeregMR(mr2))
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState))
			wcs := wait(3)
			require.Equal(t, []uint64{1, 2, 3}, []uint64{wcs[0].WRID, wcs[1].WRID, wcs[2].WRID})
			require.Equal(t, []WCStatus{WCSuccess, WCLocProtErr, WCWRFlushErr}, []WCStatus{wcs[0].Status, wcs[1].Status, wcs[2].Status})
			require.Equal(t, QPStateSQE, r.qp.State())
			require.Equal(t, QPStateSQE, r.qp.Attr().CurState)
			require.Empty(t, r.poll(), "the receive WRs are not flushed")

			// Sends posted in SQE are flushed; receives still complete.
			_, err = r.qp.PostSend(send(4, ok))
			require.NoError(t, err)
			wcs = r.poll()
			require.Len(t, wcs, 1)
			require.Equal(t, WCWRFlushErr, wcs[0].Status)
			r.postRecv(12, 4096, 2048)
			if typ == QPTypeUD {
				r.deliver(r.ud(dgQKey, 0x11, make([]byte, 8), false))
			} else {
				r.deliver(r.uc(wire.OpSendOnly, 1000, make([]byte, 8), nil))
			}
			wcs = r.poll()
			require.Len(t, wcs, 1)
			require.Equal(t, uint64(10), wcs[0].WRID)
			require.Equal(t, WCSuccess, wcs[0].Status)

			// SQE -> RTS (cur_qp_state SQE asserted) sends again.
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS, CurState: QPStateSQE}, QPAttrState|QPAttrCurState))
			_, err = r.qp.PostSend(send(5, ok))
			require.NoError(t, err)
			wcs = wait(1)
			require.Equal(t, uint64(5), wcs[0].WRID)
			require.Equal(t, WCSuccess, wcs[0].Status)
			require.Equal(t, QPStateRTS, r.qp.State())
		})
	}
}

// TestUDAttrRQPSNFollowsDatagrams: a UD QP's rq_psn, which no Modify
// sets (INIT -> RTR takes no RQ_PSN for UD), is one past the PSN of the
// last datagram received, as rxe's execute sets qp->resp.psn = pkt->psn +
// 1 for every request it takes, UD's included (check_psn checks none on
// UD), and rxe_qp_to_attr reports it.
func TestUDAttrRQPSNFollowsDatagrams(t *testing.T) {
	r := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	require.Equal(t, wire.PSN(0), r.qp.Attr().RQPSN)
	r.postRecv(1, 0, 2048)
	r.deliver(r.ud(dgQKey, 0x11, make([]byte, 8), false)) // PSN 77
	require.Len(t, r.poll(), 1)
	require.Equal(t, wire.PSN(78), r.qp.Attr().RQPSN)
}
