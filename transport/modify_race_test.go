package transport

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// TestModifyToResetOrErrorBeforeResponderDropsRequest: a request passes
// the demux's state check while the QP is in RTS, and a Modify to ERR or
// RESET completes before the responder runs. Once ibv_modify_qp has
// returned, the QP is in that state, and a QP in RESET or ERR does not
// process inbound packets (IBTA 10.3.1: RESET and Error "discard" /
// silently drop them; rxe check_type_state drops them too): the WRITE must
// not be placed, and nothing answered. The responder used to take the
// state it was checked in, place the WRITE and acknowledge it after the
// Modify to ERR, and NAK it with the reset expected PSN after the Modify
// to RESET.
func TestModifyToResetOrErrorBeforeResponderDropsRequest(t *testing.T) {
	for _, to := range []QPState{QPStateErr, QPStateReset} {
		t.Run(to.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newSyncRig(t)
				r.d.testHookRespond = func(qp *QP) {
					r.d.testHookRespond = nil
					require.NoError(t, qp.Modify(&QPAttr{State: to}, QPAttrState))
				}
				before := r.drops(DropBadQPState)
				r.deliver(r.build(wire.OpRDMAWriteOnly, 1000, []byte{1, 2, 3, 4, 5, 6, 7, 8}, true, r.reth(r.mr.Addr(), r.mr.RKey(), 8)))
				require.Equal(t, to, r.qp.State())
				require.Empty(t, r.sent(), "a QP in %v answers nothing", to)
				for i, c := range r.mem[rigGuard : rigGuard+8] {
					require.Equal(t, byte(0xA5), c, "byte %d placed after the Modify to %v returned", i, to)
				}
				require.Equal(t, before+1, r.drops(DropBadQPState))
			})
		})
	}
}

// TestModifyToErrorBeforeUCResponderDropsWrite: the same on UC, whose
// demux (handleUnreliable) checks the state before respMu likewise.
func TestModifyToErrorBeforeUCResponderDropsWrite(t *testing.T) {
	r := newDGRig(t, QPTypeUC, conn.PipeConfig{})
	r.d.testHookRespond = func(qp *QP) {
		r.d.testHookRespond = nil
		require.NoError(t, qp.Modify(&QPAttr{State: QPStateErr}, QPAttrState))
	}
	before := r.drops(DropBadQPState)
	r.deliver(r.uc(wire.OpRDMAWriteOnly, 1000, []byte{1, 2, 3, 4, 5, 6, 7, 8},
		&wire.RETHFields{VA: r.mr.Addr(), RKey: r.mr.RKey(), DMALength: 8}))
	require.Equal(t, make([]byte, 8), r.mem[:8], "placed after the Modify to ERR returned")
	require.Equal(t, before+1, r.drops(DropBadQPState))
}

// TestDestroyQPBeforeResponderLeavesNoCursor: the same window with
// DestroyQP: a WRITE FIRST that met the QP after DestroyQP returned began
// a placement cursor on the MR that nothing would end (the QP is gone),
// and the MR could then never be deregistered.
func TestDestroyQPBeforeResponderLeavesNoCursor(t *testing.T) {
	r := newResponderRig(t)
	r.d.testHookRespond = func(qp *QP) {
		r.d.testHookRespond = nil
		require.NoError(t, r.d.DestroyQP(qp))
	}
	r.deliver(r.build(wire.OpRDMAWriteFirst, 1000, make([]byte, rigMTU), false, r.reth(r.mr.Addr(), r.mr.RKey(), 2*rigMTU)))
	require.False(t, r.qp.resp.cur.Busy(), "a cursor is held on the MR for a destroyed QP")
	require.Equal(t, byte(0xA5), r.mem[rigGuard], "placed after DestroyQP returned")
}

// TestModifyToResetRacesNoCoalescedACK: the receive loop sends the ACKs it
// coalesced over a batch after the batch, outside the responder; a Modify
// to RESET (which rewrites the responder's state, its owed ACK included)
// may run in between. The two must be ordered (respMu): they were not, a
// data race on the QP's responder state that -race reports.
func TestModifyToResetRacesNoCoalescedACK(t *testing.T) {
	r := newResponderRig(t)
	r.d.handle(&conn.Packet{Buf: r.build(wire.OpRDMAWriteOnly, 1000, []byte{1}, true, r.reth(r.mr.Addr(), r.mr.RKey(), 1)), Addr: r.from}, &r.pkt)
	handled := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-handled
		require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
	}()
	close(handled)
	r.d.flushAcks() // the receive loop's end of batch, concurrent with the Modify
	<-done
	r.d.rxTx.flush()
	r.d.reader.Quiesce()
}
