package transport

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// syncRig is a responder rig built inside a synctest bubble, whose peer end
// is read by a goroutine into a channel, so that a test can ask, once the
// bubble is idle, whether the device sent something.
type syncRig struct {
	*responderRig
	out chan wire.Packet
}

func newSyncRig(t *testing.T) *syncRig {
	r := &syncRig{responderRig: newResponderRig(t), out: make(chan wire.Packet, 256)}
	// The tests on this rig count a window's packets (600-packet
	// messages against 256-packet windows, slow-restart rounds up to 128):
	// they run with the window of 256 they were written for.
	r.d.maxUnacked = testWindow
	go func() {
		pkts := make([]conn.Packet, 1)
		for {
			n, err := r.peer.Receive(pkts)
			if err != nil {
				close(r.out)
				return
			}
			for i := range n {
				b := append([]byte(nil), pkts[i].Buf...)
				var p wire.Packet
				if wire.Parse(b, &p) == nil {
					r.out <- p
				}
			}
		}
	}()
	return r
}

// sent returns what the device sent, once the bubble is idle.
func (r *syncRig) sent() []wire.Packet {
	synctest.Wait()
	var ps []wire.Packet
	for {
		select {
		case p := <-r.out:
			ps = append(ps, p)
		default:
			return ps
		}
	}
}

func (r *responderRig) ackPkt(syn wire.Syndrome, psn wire.PSN, msn wire.MSN) {
	r.deliver(r.build(wire.OpAcknowledge, psn, nil, false, func(b []byte, info *wire.OpInfo) {
		wire.AETH(b[info.Offset[wire.HdrAETH]:]).Encode(syn, msn)
	}))
}

func (r *responderRig) poll() []WC {
	var out []WC
	wcs := make([]WC, 16)
	for {
		n, _ := r.cq.Poll(wcs)
		if n == 0 {
			return out
		}
		out = append(out, wcs[:n]...)
	}
}

// TestSQDRetransmitsOutstandingMessage: a WRITE is sent, the QP is moved to
// SQD, and the responder NAKs the WRITE's PSN (sequence error: it never
// arrived). In SQD the send queue stops taking new WRs but the WRs in
// progress are finished (IBTA 10.3.1, "Send Queue Drain": the QP completes
// the outstanding messages, retries included). The requester must send the
// WRITE again; it used to stop at it, since its offset is 0 after the
// rewind and SQD starts no message at offset 0, and the WR only ever ended
// in RETRY_EXC_ERR.
func TestSQDRetransmitsOutstandingMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		ps := r.sent()
		require.Len(t, ps, 1)
		require.Equal(t, wire.PSN(5000), ps[0].PSN())
		require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD}, QPAttrState))
		r.ackPkt(wire.SyndromeNAKPSNSeqErr, 5000, 0)
		ps = r.sent()
		require.Len(t, ps, 1, "the WRITE is sent again in SQD")
		require.Equal(t, wire.OpRDMAWriteOnly, ps[0].Opcode())
		require.Equal(t, wire.PSN(5000), ps[0].PSN())
		r.ackPkt(wire.SyndromeACK, 5000, 1)
		wcs := r.poll()
		require.Len(t, wcs, 1)
		require.Equal(t, WCSuccess, wcs[0].Status)
	})
}

// TestSQDRetransmitsAfterTimeout: as above, with the WRITE lost and no NAK:
// the local ACK timeout fires in SQD and the WRITE goes again.
func TestSQDRetransmitsAfterTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		require.Len(t, r.sent(), 1)
		require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD}, QPAttrState))
		time.Sleep(r.qp.timeoutDuration() + time.Microsecond)
		ps := r.sent()
		require.Len(t, ps, 1, "the WRITE is sent again after the timeout in SQD")
		require.Equal(t, wire.PSN(5000), ps[0].PSN())
	})
}

// TestErrorFlushesReceiveWQEInProgress: a multi-packet SEND has begun
// filling a receive WQE when the QP is moved to ERR. Every posted receive
// WR must complete (IBTA 10.3.1 / 11.4: in the Error state outstanding WRs
// complete with WR_FLUSH_ERR); the one the responder had taken from the
// queue used to vanish without a completion.
func TestErrorFlushesReceiveWQEInProgress(t *testing.T) {
	for _, how := range []string{"modify", "retry-exceeded"} {
		t.Run(how, func(t *testing.T) {
			r := newResponderRig(t)
			_, err := r.qp.PostRecv(RecvWR{WRID: 7, SGL: []SGE{{Addr: r.mr.Addr(), Length: 4096, LKey: r.mr.LKey()}}},
				RecvWR{WRID: 8, SGL: []SGE{{Addr: r.mr.Addr(), Length: 4096, LKey: r.mr.LKey()}}})
			require.NoError(t, err)
			r.deliver(r.build(wire.OpSendFirst, 1000, make([]byte, rigMTU), false, nil))
			switch how {
			case "modify":
				require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateErr}, QPAttrState))
			case "retry-exceeded":
				r.qp.enterError() // what Close, DestroyQP and the requester's fatal errors do
			}
			wcs := r.poll()
			require.Len(t, wcs, 2, "both receive WRs complete")
			require.Equal(t, uint64(7), wcs[0].WRID, "in order")
			require.Equal(t, WCWRFlushErr, wcs[0].Status)
			require.Equal(t, uint64(8), wcs[1].WRID)
			require.Equal(t, WCWRFlushErr, wcs[1].Status)
		})
	}
}

// TestResponderWithoutRdAtomicResourcesNAKs: a QP whose max_dest_rd_atomic
// is 0 has no responder resources for RDMA READ or atomics; such a request
// is answered with NAK invalid request and the QP goes to ERR (a class C
// error, IBTA 9.9.3; rxe check_resource: RESPST_ERR_TOO_MANY_RDMA_ATM_REQ ->
// do_class_ac_error(NAK_INVALID_REQ)). It used to be executed with one
// resource.
func TestResponderWithoutRdAtomicResourcesNAKs(t *testing.T) {
	for _, op := range []wire.Opcode{wire.OpRDMAReadRequest, wire.OpFetchAdd} {
		t.Run(op.String(), func(t *testing.T) {
			r := newResponderRig(t)
			qp := r.qp
			require.NoError(t, qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
			require.NoError(t, qp.Modify(&QPAttr{State: QPStateInit, Port: 1,
				AccessFlags: stag.AccessRemoteWrite | stag.AccessRemoteRead | stag.AccessRemoteAtomic},
				QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags))
			require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTR, Dest: r.from, PathMTU: MTU1024, DestQPN: r.peerQP,
				RQPSN: 1000, MaxDestRdAtomic: 0, MinRNRTimer: 1},
				QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN|QPAttrMaxDestRdAtomic|QPAttrMinRNRTimer))
			var f func([]byte, *wire.OpInfo)
			if op == wire.OpRDMAReadRequest {
				f = r.reth(r.mr.Addr(), r.mr.RKey(), 8)
			} else {
				f = func(b []byte, info *wire.OpInfo) {
					wire.AtomicETH(b[info.Offset[wire.HdrAtomicETH]:]).Encode(&wire.AtomicETHFields{VA: r.mr.Addr(), RKey: r.mr.RKey(), SwapAdd: 1})
				}
			}
			before := r.mem[rigGuard]
			r.deliver(r.build(op, 1000, nil, true, f))
			gotOp, syn, psn := r.answer()
			require.Equal(t, wire.OpAcknowledge, gotOp)
			require.Equal(t, wire.SyndromeNAKInvalidRequest, syn)
			require.Equal(t, wire.PSN(1000), psn)
			require.Equal(t, before, r.mem[rigGuard], "not executed")
			require.Equal(t, QPStateErr, qp.State())
		})
	}
}

// TestModifyMaxDestRdAtomicWhileResponding: SQD -> SQD may change
// max_dest_rd_atomic (IBTA 10.3.1 Table 91, ib_modify_qp_is_ok) while the
// responder keeps answering requests (SQD drains the send queue only). The
// responder's resource ring is replaced under the receive loop: Modify
// must hold respMu for it (run with -race).
func TestModifyMaxDestRdAtomicWhileResponding(t *testing.T) {
	r := newResponderRig(t)
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD}, QPAttrState))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2000 {
			require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, MaxDestRdAtomic: uint8(1 + i%4)}, QPAttrState|QPAttrMaxDestRdAtomic))
		}
	}()
	psn := wire.PSN(1000)
	for range 2000 {
		r.deliver(r.build(wire.OpRDMAReadRequest, psn, nil, true, r.reth(r.mr.Addr(), r.mr.RKey(), 8)))
		op, _, _ := r.answer()
		require.Equal(t, wire.OpRDMAReadResponseOnly, op)
		psn = psn.Add(1)
	}
	<-done
}

// TestModifyShrinkingMaxDestRdAtomic: three READs use responder resources
// 0-2 of 4, then SQD -> SQD sets max_dest_rd_atomic 1. The next READ must
// take the one resource there is (it indexed the new ring with the old
// ring's next slot, 3, and the receive loop panicked).
func TestModifyShrinkingMaxDestRdAtomic(t *testing.T) {
	r := newResponderRig(t)
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD}, QPAttrState))
	psn := wire.PSN(1000)
	read := func() {
		r.deliver(r.build(wire.OpRDMAReadRequest, psn, nil, true, r.reth(r.mr.Addr(), r.mr.RKey(), 8)))
		op, _, got := r.answer()
		require.Equal(t, wire.OpRDMAReadResponseOnly, op)
		require.Equal(t, psn, got)
		psn = psn.Add(1)
	}
	for range 3 {
		read()
	}
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, MaxDestRdAtomic: 1}, QPAttrState|QPAttrMaxDestRdAtomic))
	read()
	// The duplicate of the last READ is answered from the one resource.
	psn = psn.Sub(1)
	read()
}

// TestReceiveCQOverrunMovesQPToError: a SEND whose receive completion
// finds the receive CQ full. The CQ goes to its error state, and the QP
// that overran it to ERR (rxe: RESPST_ERR_CQ_OVERFLOW, "All - Class G" ->
// RESPST_ERROR); the SEND is not acknowledged. The QP stayed in RTS and
// acknowledged a SEND whose completion was lost.
func TestReceiveCQOverrunMovesQPToError(t *testing.T) {
	for _, op := range []wire.Opcode{wire.OpSendOnly, wire.OpRDMAWriteOnlyWithImmediate} {
		t.Run(op.String(), func(t *testing.T) {
			r := newResponderRig(t)
			r.qp.recvCQ = NewCQ(1)
			_, err := r.qp.PostRecv(RecvWR{WRID: 1, SGL: []SGE{{Addr: r.mr.Addr(), Length: 64, LKey: r.mr.LKey()}}},
				RecvWR{WRID: 2, SGL: []SGE{{Addr: r.mr.Addr(), Length: 64, LKey: r.mr.LKey()}}})
			require.NoError(t, err)
			var f func([]byte, *wire.OpInfo)
			if op == wire.OpRDMAWriteOnlyWithImmediate {
				f = r.reth(r.mr.Addr(), r.mr.RKey(), 8)
			}
			r.deliver(r.build(op, 1000, make([]byte, 8), true, f))
			gotOp, syn, psn := r.answer()
			require.Equal(t, wire.OpAcknowledge, gotOp)
			require.Equal(t, wire.SyndromeACK, syn)
			require.Equal(t, wire.PSN(1000), psn)
			sent := r.d.counters.SentPkts.Load()
			r.deliver(r.build(op, 1001, make([]byte, 8), true, f))
			require.Equal(t, uint64(1), r.d.counters.CQOverruns.Load())
			require.Equal(t, QPStateErr, r.qp.State(), "the QP that overran its CQ")
			require.Equal(t, sent, r.d.counters.SentPkts.Load(), "the SEND is not acknowledged")
			_, err = r.qp.recvCQ.Poll(make([]WC, 4))
			require.ErrorIs(t, err, ErrCQOverrun)
		})
	}
}

// TestReceiveCQOverrunMovesUCAndUDQPToError: as
// TestReceiveCQOverrunMovesQPToError on the unreliable services (rxe's
// class G is "All").
func TestReceiveCQOverrunMovesUCAndUDQPToError(t *testing.T) {
	for _, typ := range []QPType{QPTypeUC, QPTypeUD} {
		t.Run(typ.String(), func(t *testing.T) {
			r := newDGRig(t, typ, conn.PipeConfig{})
			r.qp.recvCQ = NewCQ(1)
			r.postRecv(1, 0, 1024)
			r.postRecv(2, 1024, 1024)
			pkt := func() []byte {
				if typ == QPTypeUD {
					return r.ud(dgQKey, 0x42, []byte("hi"), false)
				}
				return r.uc(wire.OpSendOnly, 1000, []byte("hi"), nil)
			}
			r.deliver(pkt())
			require.Equal(t, QPStateRTS, r.qp.State())
			if typ == QPTypeUC {
				r.deliver(r.uc(wire.OpSendOnly, 1001, []byte("hi"), nil))
			} else {
				r.deliver(pkt())
			}
			require.Equal(t, uint64(1), r.d.counters.CQOverruns.Load())
			require.Equal(t, QPStateErr, r.qp.State())
		})
	}
}

// TestModifyRefusesResetToError: a QP enters ERR from any state but RESET
// (IBTA 10.3.1; ib_modify_qp_is_ok's state table has no RESET -> ERR, and
// rxe answers EINVAL). Modify took it.
func TestModifyRefusesResetToError(t *testing.T) {
	r := newResponderRig(t)
	qp := r.qp
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
	require.ErrorIs(t, qp.Modify(&QPAttr{State: QPStateErr}, QPAttrState), ErrBadTransition, "RESET -> ERR")
	require.Equal(t, QPStateReset, qp.State())
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateInit, Port: 1}, QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags))
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateErr}, QPAttrState), "INIT -> ERR")
}
