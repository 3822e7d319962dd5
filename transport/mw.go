package transport

import (
	"fmt"
	"syscall"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/wire"
)

// Local operations on the send queue (rxe_do_local_ops): LOCAL_INV, REG_MR
// and BIND_MW use no PSN and send nothing. The requester executes each when
// it reaches it, in send-queue order; its completion is delivered in order
// with the others (rxe completes local operations at once, since no ACK
// comes for them). An invalidation (LOCAL_INV, the rebind of a type 1
// window) completes only when no placement through the old key is in
// flight: the requester begins it under sq, and runRequester waits after
// releasing sq (the wait is a grace period of the receive loop, which may
// itself be waiting for sq) and then lets the requester go on.

// RegWR is a REG_MR work request's fields (the kernel's struct ib_reg_wr).
type RegWR struct {
	MR     *placement.MR // an MR of AllocMR, mapped with MapMR
	Key    uint32        // its new key: the same index, a new key byte (IncRKey of its key)
	Access stag.Access   // the rights of the registration
}

// MWBind is a BIND_MW work request's fields (ibv_send_wr.bind_mw).
type MWBind struct {
	MW   *placement.MW
	RKey uint32             // the window's new rkey: the same index, a new key byte (IncRKey)
	Info placement.BindInfo // the MR, the window's range and rights
	// verb: posted by QP.BindMW (ibv_bind_mw), the only way to bind a
	// type 1 window; posted is its key change (MW.PostRKey), settled
	// when the WQE completes or is discarded.
	verb   bool
	posted placement.PostedBind
}

// settleBind settles the type 1 bind w posted by QP.BindMW (MW.Settle):
// ok, it executed. Caller holds sq; called once per such WQE, when it
// completes (complete) or is discarded (resetLocked).
func settleBind(w *sendWQE, ok bool) {
	if w.wr.Opcode == WRBindMW && w.wr.BindMW.verb && w.wr.BindMW.MW != nil {
		w.wr.BindMW.MW.Settle(w.wr.BindMW.posted, ok)
	}
}

// localState is a local operation WQE's progress.
type localState uint8

const (
	localNone    localState = iota // not executed (or not a local operation)
	localWaiting                   // executed; waiting for the placements in flight
	localDone                      // executed; completes in order
)

// localWait is an invalidation the requester began and runRequester waits
// for once sq is released.
type localWait struct {
	inv *placement.Invalidation
	idx uint64 // the WQE's position in the send queue (sq.head numbering)
}

// isLocalOp reports whether op is a local operation.
func isLocalOp(op WROpcode) bool { return op == WRLocalInv || op == WRRegMR || op == WRBindMW }

// checkLocalWR makes PostSend's checks of a local operation; the rest
// (keys, states, ranges) is checked when it executes, and a failure then
// completes it in error.
func checkLocalWR(wr *SendWR) error {
	switch {
	case wr.Flags&SendInline != 0:
		return fmt.Errorf("%w: %v cannot be inline", ErrBadOpcode, wr.Opcode)
	case len(wr.SGL) != 0:
		return fmt.Errorf("%w: %v carries no SGL", ErrBadOpcode, wr.Opcode)
	case wr.Opcode == WRRegMR && wr.Reg.MR == nil:
		return fmt.Errorf("%w: REG_MR without an MR", ErrBadOpcode)
	case wr.Opcode == WRBindMW && wr.BindMW.MW == nil:
		return fmt.Errorf("%w: BIND_MW without a window", ErrBadOpcode)
	case wr.Opcode == WRBindMW && wr.BindMW.MW.Type() == placement.MWType1 && !wr.BindMW.verb:
		// libibverbs: a type 1 window is bound with ibv_bind_mw, a type
		// 2 one with IBV_WR_BIND_MW (mlx5, ionic: EINVAL). A BIND_MW
		// posted for a type 1 window would also bypass MW.PostRKey, so
		// that the next QP.BindMW could reuse the key of the binding it
		// made (a stale rkey would then reach the new binding).
		return fmt.Errorf("%w: a type 1 window is bound with QP.BindMW (ibv_bind_mw)", ErrBadOpcode)
	}
	return nil
}

// runLocal executes the local operation w, the WQE at the requester's
// index, and reports whether the requester may go on to the next WQE.
// False: a fence waits for the WQEs before it (rxe: a fenced local
// operation waits until every earlier WQE has completed), an invalidation
// waits for the placements in flight (qp.local is set), or the operation
// failed: it completes with IBV_WC_LOC_QP_OP_ERR (LOCAL_INV, REG_MR) or
// IBV_WC_MW_BIND_ERR (BIND_MW) and the QP goes to ERR, as in rxe. Caller
// holds sq.
func (qp *QP) runLocal(w *sendWQE) bool {
	r := &qp.req
	switch w.local {
	case localDone: // executed before a rewind
		qp.passLocal()
		return true
	case localWaiting:
		return false
	}
	if w.wr.Flags&SendFence != 0 && qp.comp.idx != r.idx {
		return false // the completer kicks the requester as WQEs complete
	}
	e := qp.dev.place
	var (
		inv *placement.Invalidation
		err error
	)
	st := WCLocQPOpErr
	switch w.wr.Opcode {
	case WRLocalInv:
		inv, err = e.Invalidate(qp.pd, uint32(qp.qpn), w.wr.InvRKey, false)
	case WRRegMR:
		err = e.FastReg(qp.pd, w.wr.Reg.MR, w.wr.Reg.Key, w.wr.Reg.Access)
	case WRBindMW:
		st = WCMWBindErr
		b := &w.wr.BindMW
		if b.verb {
			inv, err = e.BindPosted(qp.pd, uint32(qp.qpn), qp.alive, b.MW, b.posted, b.Info)
		} else {
			inv, err = e.BindMWLive(qp.pd, uint32(qp.qpn), qp.alive, b.MW, b.RKey, b.Info)
		}
	}
	if err != nil {
		qp.dev.logf("softrdma: QP %d: %v: %v", qp.qpn, w.wr.Opcode, err)
		qp.fail(w, st)
		return false
	}
	if inv != nil {
		w.local = localWaiting
		qp.local = localWait{inv: inv, idx: r.idx}
		qp.passLocal()
		return false
	}
	w.local = localDone
	qp.passLocal()
	qp.retireLocal()
	return true
}

// alive reports whether the QP has not been destroyed; a bind that waited
// for another operation executes only if it still has not (DestroyQP sets
// destroyed before it releases the QP's type 2 windows).
func (qp *QP) alive() bool { return !qp.destroyed.Load() }

// passLocal moves the requester past the local operation at its index.
// Caller holds sq.
func (qp *QP) passLocal() {
	r := &qp.req
	if r.acct == r.idx {
		r.acct++
	}
	r.idx++
	r.offset = 0
}

// takeLocalWait returns the invalidation the requester began, if any, and
// forgets it. Caller holds sq.
func (qp *QP) takeLocalWait() localWait {
	lw := qp.local
	qp.local = localWait{}
	return lw
}

// finishLocal waits for the invalidation lw and completes its WQE (in
// order) unless the QP was reset meanwhile. If the QP went to ERR while it
// waited, flush stopped at the WQE: it completes successfully (it took
// effect) and the WQEs behind it are flushed now. A bind that waited for
// another operation on its window or MR (placement.Engine.BindMW) is
// checked and executed only after that wait, and may fail then: it
// completes with IBV_WC_MW_BIND_ERR and the QP goes to ERR, as a bind that
// fails at once does (runLocal). Called without sq, from the send worker;
// the placement-level operation completes either way.
func (qp *QP) finishLocal(lw localWait) {
	err := lw.inv.Wait()
	qp.sq.Lock()
	if lw.idx < qp.comp.idx || lw.idx >= qp.sq.head {
		qp.sq.Unlock()
		return
	}
	flush, flushSQ := false, false
	if w := &qp.sq.wqe[lw.idx%uint64(len(qp.sq.wqe))]; w.local == localWaiting {
		if err != nil {
			qp.dev.logf("softrdma: QP %d: %v: %v", qp.qpn, w.wr.Opcode, err)
			w.local = localNone
			st := WCLocQPOpErr
			if w.wr.Opcode == WRBindMW {
				st = WCMWBindErr
			}
			qp.fail(w, st)
			qp.fatal = false // flushed below, without sq
			qp.progress()
			flush = true
		} else {
			w.local = localDone
			qp.retireLocal()
			qp.progress()
			flush = qp.State() == QPStateErr
			flushSQ = qp.State() == QPStateSQE // the receive queue goes on
		}
	}
	qp.sq.Unlock()
	if flush {
		qp.releaseResp() // the receive WQE in use completes first
		qp.flush()
	} else if flushSQ {
		qp.flushSQ()
	}
}

// retireLocal completes the executed local operations at the head of the
// send queue. Caller holds sq.
func (qp *QP) retireLocal() {
	for {
		w := qp.oldest()
		if w == nil || w.local != localDone {
			return
		}
		qp.complete(w, WCSuccess, false)
		qp.comp.idx++
		if qp.req.acct < qp.comp.idx {
			qp.req.acct = qp.comp.idx
		}
		if qp.req.idx < qp.comp.idx {
			qp.req.idx, qp.req.offset = qp.comp.idx, 0
		}
	}
}

// invalidateIETH invalidates the R_Key that a SEND with Invalidate carries
// in its IETH (its LAST or ONLY packet), after the payload is placed and
// before the receive completes, as rxe's execute does (invalidate_rkey).
// When it returns true no byte is placed through the key any more. The
// receive loop quiesces first: the invalidation waits for a grace period
// of the readers and must not wait for itself.
//
// A key that cannot be invalidated (unknown, of another PD, a type 1
// window, a window bound to another QP, an MR with windows bound, an MR
// not of AllocMR) is rxe's class J error (RESPST_ERR_INVALIDATE_RKEY): the
// receive completes with IBV_WC_REM_INV_REQ_ERR and the QP goes to ERR.
// rxe then acknowledges the SEND; softrdma NAKs it (invalid request), so
// that the sender's completion (IBV_WC_REM_INV_REQ_ERR) tells it that the
// key is still valid.
func (qp *QP) invalidateIETH(p *wire.Packet, path *path, b *txBatch) bool {
	qp.dev.reader.Quiesce()
	inv, err := qp.dev.place.Invalidate(qp.pd, uint32(qp.qpn), p.IETH().RKey(), true)
	if err != nil {
		qp.dev.logf("softrdma: QP %d: SEND with Invalidate: %v", qp.qpn, err)
		qp.finishRecv(WCRemInvReqErr, qp.resp.recvOff, p, path)
		qp.respError(b, path, DropAccess, wire.SyndromeNAKInvalidRequest, WCRemInvReqErr)
		return false
	}
	inv.Wait()
	return true
}

// BindMW binds a type 1 memory window (ibv_bind_mw): it posts a BIND_MW
// work request with the window's next rkey (ibv_inc_rkey of MW.RKey) and
// returns that rkey, which names the window once the request has
// executed; Length 0 unbinds it. MW.RKey returns the new rkey as soon as
// BindMW returns, as rdma-core's ibv_bind_mw updates ibv_mw.rkey when its
// post succeeds (providers/rxe rxe_bind_mw, mlx5_bind_mw), and the
// previous one again if the bind fails. The completion (WCBindMW) is
// generated if flags has SendSignaled (or the QP signals all); a bind that
// fails completes with WCMWBindErr and moves the QP to ERR, as in rxe. Binds
// of one window by several QPs execute one after the other (a bind that
// reaches a window another QP is rebinding waits for it, as rxe serialises
// them under the window's lock), in the order they were posted: a bind
// that executes before one posted earlier fails (rxe_bind_mw: the key it
// was posted against, mw_rkey, is not the window's). A type 2 window is
// bound with a BIND_MW work request posted with PostSend. Errors, with nothing posted: a nil or type 2 window
// (ErrBadOpcode); an MR of another PD than the window's (EPERM), a
// zero-based window, an address or length without an MR (EINVAL), as
// rdma-core's rxe provider checks them; and those of PostSend.
func (qp *QP) BindMW(mw *placement.MW, wrid uint64, flags SendFlags, info placement.BindInfo) (uint32, error) {
	if mw == nil || mw.Type() != placement.MWType1 {
		return 0, fmt.Errorf("%w: ibv_bind_mw binds type 1 windows (post BIND_MW for type 2)", ErrBadOpcode)
	}
	// What rdma-core's rxe provider checks when it posts (nothing is
	// posted, the QP stays usable); the rest is checked when the bind
	// executes.
	switch {
	case info.MR == nil && (info.Addr != 0 || info.Length != 0):
		return 0, fmt.Errorf("transport: bind MW: an address or length without an MR: %w", syscall.EINVAL)
	case info.Access&stag.AccessZeroBased != 0:
		return 0, fmt.Errorf("transport: bind MW: a zero-based type 1 window: %w", syscall.EINVAL)
	case info.MR != nil && info.MR.PD() != mw.PD():
		return 0, fmt.Errorf("transport: bind MW: the MR's PD is not the window's: %w", syscall.EPERM)
	}
	// ibv_mw.rkey changes now (MW.RKey), as rdma-core's ibv_bind_mw
	// sets it once its post succeeds; a failed post undoes it.
	p := mw.PostRKey()
	_, err := qp.PostSend(SendWR{WRID: wrid, Opcode: WRBindMW, Flags: flags,
		BindMW: MWBind{MW: mw, RKey: p.RKey, Info: info, verb: true, posted: p}})
	if err != nil {
		mw.Settle(p, false)
		return 0, err
	}
	return p.RKey, nil
}
