package transport

import (
	"fmt"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// The Unreliable Connected service (IBTA vol. 1 chapter 9, the unreliable
// service; rxe's UC paths).
//
// A UC QP is connected like an RC QP and carries SEND and RDMA WRITE (with
// or without immediate) in the same packets, with the UC opcodes, but
// nothing is acknowledged: AckReq is never set, no ACK is sent, nothing is
// retransmitted, and a send WQE completes once its last packet is built.
//
// The responder accepts a message only whole and in order (rxe check_psn,
// check_op_seq for UC): a FIRST or ONLY packet always starts a message (a
// message in progress is abandoned); a MIDDLE or LAST must carry the
// expected PSN and continue the message of its kind, else the message it
// belongs to is lost: that packet and every packet up to the next FIRST or
// ONLY are dropped. A SEND whose receive buffer is too small, a WRITE that
// fails its rkey or bounds checks, a FIRST or MIDDLE that does not carry
// the path MTU or an empty LAST, or a message arriving with no receive
// WQE is dropped likewise (IBTA's class D errors, without SRQ). The QP
// stays in RTS; an abandoned SEND's receive WQE is used again by the next
// SEND (rxe do_class_d1e_error), its partial data overwritten. Only a
// local fault (the receive buffer's MR gone) completes the receive WQE in
// error and moves the QP to ERR (class A).

// requiredByType lists, per QP type and transition, the attributes
// ib_modify_qp_is_ok demands (IBTA 10.3.1, Table 91). RC's are in
// required.
var requiredByType = map[QPType]map[[2]QPState]AttrMask{
	QPTypeUC: {
		{QPStateReset, QPStateInit}: QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags,
		{QPStateInit, QPStateRTR}:   QPAttrAV | QPAttrPathMTU | QPAttrDestQPN | QPAttrRQPSN,
		{QPStateRTR, QPStateRTS}:    QPAttrSQPSN,
	},
	QPTypeUD: {
		{QPStateReset, QPStateInit}: QPAttrPKeyIndex | QPAttrPort | QPAttrQKey,
		{QPStateRTR, QPStateRTS}:    QPAttrSQPSN,
	},
}

// requiredAttrs returns the attributes the transition cur -> next needs
// on this QP's type.
func (qp *QP) requiredAttrs(cur, next QPState) AttrMask {
	if t, ok := requiredByType[qp.typ]; ok {
		return t[[2]QPState{cur, next}]
	}
	return required[[2]QPState{cur, next}]
}

// Type returns the QP's transport service type.
func (qp *QP) Type() QPType { return qp.typ }

// transport returns the opcode prefix of the QP's service (IBTA Table 38),
// which every packet it receives must carry (rxe check_type_state).
func (t QPType) transport() wire.Opcode {
	switch t {
	case QPTypeUC:
		return wire.OpUC
	case QPTypeUD:
		return wire.OpUD
	}
	return wire.OpRC
}

func (t QPType) String() string {
	switch t {
	case QPTypeRC:
		return "RC"
	case QPTypeUC:
		return "UC"
	case QPTypeUD:
		return "UD"
	}
	return fmt.Sprintf("QPType(%d)", uint8(t))
}

// checkWRType makes PostSend's checks that depend on the QP type. Caller
// holds sq.
func (qp *QP) checkWRType(wr *SendWR) error {
	switch qp.typ {
	case QPTypeUC:
		switch wr.Opcode {
		case WRSend, WRSendWithImm, WRRDMAWrite, WRRDMAWriteWithImm, WRLocalInv, WRRegMR, WRBindMW:
			return nil
		}
		return fmt.Errorf("%w: %v on a UC QP (SEND and RDMA WRITE only)", ErrBadOpcode, wr.Opcode)
	case QPTypeUD:
		return qp.checkUDWR(wr)
	}
	return nil
}

// checkWRLength refuses a UD send longer than the port's active MTU, which
// is a UD QP's path MTU (a datagram is one packet; IBTA C10-93.1.1 bounds
// it by the port's MTU: rxe emits no packet for it, softrdma refuses it at
// post). total is the message length in bytes.
func (qp *QP) checkWRLength(total uint64) error {
	if qp.typ == QPTypeUD {
		if mtu := qp.path.Load().mtu; total > uint64(mtu) {
			return fmt.Errorf("%w: %d bytes, path MTU %d", ErrMsgSize, total, mtu)
		}
	}
	return nil
}

// runRequesterUC turns UC send WQEs into packets: as RC's requester, but
// without a PSN window (nothing is acknowledged), READ, atomics or timers;
// a WQE completes when its last packet is built. Caller holds sq.
func (qp *QP) runRequesterUC(b *txBatch) bool {
	st := qp.State()
	if st != QPStateRTS && st != QPStateSQD {
		return false
	}
	draining := st == QPStateSQD // finish the message in progress, start none
	path := qp.path.Load()
	r := &qp.req
	nslots := uint64(len(qp.sq.wqe))
	budget := requesterBudget
	for r.idx < qp.sq.head {
		if budget == 0 || b.full() {
			return true
		}
		w := &qp.sq.wqe[r.idx%nslots]
		if draining && r.offset == 0 {
			break
		}
		if isLocalOp(w.wr.Opcode) {
			if !qp.runLocal(w) {
				break
			}
			continue
		}
		if r.offset == 0 && r.idx == r.acct {
			op := w.wr.Opcode
			if op == WRRDMAWrite || op == WRRDMAWriteWithImm {
				qp.dev.counters.RDMASends.Add(1)
			}
			w.firstPSN = r.psn
			w.npkts = packetsFor(w.length, path.mtu)
			w.lastPSN = r.psn.Add(w.npkts - 1)
			w.psnSet = true
			r.acct++
		}
		for budget > 0 && !b.full() {
			if !qp.sendSegment(b, path, w) {
				return false // local error; the WQE was completed
			}
			budget--
			if r.offset >= w.length {
				break
			}
		}
		if r.offset >= w.length {
			qp.sentWhole(w)
		}
	}
	return false
}

// handleUnreliable is handle's second half for UC and UD QPs: the state,
// (UD) Q_Key, length and (UC) peer checks, the suspension gate, and the
// responder. A
// paused packet is held (PolicyHold) or dropped: there is no RNR NAK on
// the unreliable services.
func (d *Device) handleUnreliable(qp *QP, pkt *conn.Packet, p *wire.Packet) {
	c := &d.counters
	if !qp.receiving() {
		c.drop(DropBadQPState)
		return
	}
	if p.Info.Mask&wire.MaskReq == 0 {
		c.drop(DropUnknownOpcode) // cannot happen: UC and UD have no responses
		return
	}
	path := qp.path.Load()
	if qp.typ == QPTypeUD && p.DETH().QKey() != qp.qkeyOf(path) {
		// IBTA 10.2.5: a datagram whose Q_Key is not the QP's is
		// silently dropped. A header check, as the P_Key's (rxe
		// check_keys, in hdr_check: counted in the port's
		// qkey_viol_cntr, never in rcvd_pkts), so before the
		// suspension gate: such a datagram is neither held nor
		// counted as suspended.
		c.drop(DropBadQKey)
		return
	}
	maxPayload := path.mtu
	if qp.typ == QPTypeUD {
		// A datagram longer than this port's MTU is taken if it fits
		// the receive WQE (rxe's check_length checks UD requests only
		// against the receive buffer, IBA C9-92); 4096 is the largest
		// IBTA MTU.
		maxPayload = MTU4096.Bytes()
	}
	if len(p.Payload) > maxPayload {
		c.drop(DropTooLong)
		return
	}
	if qp.typ == QPTypeUC && path.dest.Addr() != pkt.Addr.Addr().Unmap() {
		c.drop(DropWrongAddress)
		return
	}
	if qp.State() == QPStateRTR && qp.typ == QPTypeUC {
		qp.commEstablished()
	}
	d.reader.Enter()
	if qp.held != 0 || d.susp.active.Load() != 0 && d.qpPaused(qp) {
		d.markPaused(qp)
		if PausePolicy(d.susp.policy.Load()) == PolicyNAK && qp.held == 0 {
			d.susp.dropped.Add(1)
			c.drop(DropSuspended)
			return
		}
		d.hold(qp, pkt, p)
		return
	}
	if d.testHookRespond != nil {
		d.testHookRespond(qp)
	}
	qp.respMu.Lock()
	if !qp.receiving() {
		// A Modify to RESET or ERR returned since the check above (as
		// in handle).
		qp.respMu.Unlock()
		c.drop(DropBadQPState)
		return
	}
	c.RcvdPkts.Add(1)
	if qp.typ == QPTypeUD {
		qp.respondUD(p, pkt, path)
	} else {
		qp.respondUC(p, path)
	}
	qp.respMu.Unlock()
	if d.susp.holdThis {
		// Placement into a suspended MR: the packet changed nothing and
		// is counted as received when it is replayed.
		d.susp.holdThis = false
		c.RcvdPkts.Add(^uint64(0))
		d.hold(qp, pkt, p)
	}
}

// datagramSuspended handles a Suspended status from placement on a UC or
// UD QP: the packet changed nothing; it is held (and replayed at Resume),
// or under PolicyNAK dropped, since no RNR NAK exists on these services.
func (qp *QP) datagramSuspended() {
	d := qp.dev
	d.markPaused(qp)
	if PausePolicy(d.susp.policy.Load()) == PolicyNAK {
		d.susp.dropped.Add(1)
		d.counters.drop(DropSuspended)
		return
	}
	d.susp.holdThis = true
}

// recvQPError completes the receive WQE the responder holds with a local
// protection error and moves the QP to ERR: the receive buffer's MR went
// away (IBTA class A, a local QP fault; rxe RESPST_ERR_MALFORMED_WQE).
// Caller holds respMu.
func (qp *QP) recvQPError(path *path) {
	r := &qp.resp
	qp.dev.counters.drop(DropAccess)
	if r.haveRecv {
		r.haveRecv = false
		wc := WC{WRID: r.recv.wrid, Status: WCLocProtErr, Opcode: WCRecv, QPN: qpnOf(qp.qpn), SrcQP: qpnOf(path.destQPN)}
		qp.pushWC(qp.recvCQ, &wc)
		qp.recvHeld.Store(false)
	}
	qp.releaseRespLocked()
	if qp.setError() {
		qp.flush()
	}
}

// respondUC runs the UC responder on one request packet. Called by the
// receive loop with respMu held.
func (qp *QP) respondUC(p *wire.Packet, path *path) {
	r := &qp.resp
	info := p.Info
	psn := p.PSN()
	if info.Mask&wire.MaskFirst != 0 {
		// A new message, whatever came before: resynchronize on it.
		if r.inMsg {
			qp.abandonUC()
		}
		r.dropMsg = false
	} else {
		same := r.inMsg && (info.Mask&wire.MaskSend != 0 && wire.Info(r.lastOp).Mask&wire.MaskSend != 0 ||
			info.Mask&wire.MaskWrite != 0 && wire.Info(r.lastOp).Mask&wire.MaskWrite != 0)
		if r.dropMsg || psn != r.ePSN || !same {
			// A packet of this message was lost (or this one is out of
			// sequence): the message is lost; wait for the next FIRST or
			// ONLY.
			qp.ucDrop(DropUCMessage)
			return
		}
	}
	// CHK_OP_VALID: a WRITE needs REMOTE_WRITE on the QP.
	if info.Mask&wire.MaskWrite != 0 && path.access&stag.AccessRemoteWrite == 0 {
		qp.ucDrop(DropAccess)
		return
	}
	// CHK_RESOURCE: no RNR NAK on UC; the message is dropped.
	if info.Mask&wire.MaskRWR != 0 && !r.haveRecv {
		if !qp.popRecv(&r.recv) {
			qp.ucDrop(DropNoRecvWQE)
			return
		}
		r.haveRecv = true
		r.recvOff = 0
	}
	// CHK_LENGTH: FIRST and MIDDLE carry exactly one path MTU, a LAST
	// at least one byte (an empty message is an ONLY; rxe check_length,
	// class D on UC). The path MTU bounds every packet (handleUnreliable).
	// A RETH's DMA length is at most 2^31 bytes, checked before the R_Key
	// as on RC (maxDMALength).
	n := len(p.Payload)
	if info.Mask&(wire.MaskFirst|wire.MaskMiddle) != 0 && info.Mask&wire.MaskLast == 0 && n != path.mtu ||
		info.Mask&wire.MaskOnly == wire.MaskLast && n == 0 ||
		info.Mask&wire.MaskRETH != 0 && p.RETH().DMALength() > maxDMALength {
		qp.ucDrop(DropLength)
		return
	}
	if info.Mask&wire.MaskSend != 0 {
		if !qp.execSendUC(p, path) {
			return
		}
	} else if !qp.execWriteUC(p, path) {
		return
	}
	r.ePSN = psn.Add(1)
	r.lastOp = p.Opcode()
	r.inMsg = info.Mask&wire.MaskLast == 0
	if !r.inMsg {
		r.msn = r.msn.Add(1)
	}
}

// ucDrop drops the packet and the rest of its message, counted as why.
func (qp *QP) ucDrop(why DropReason) {
	qp.dev.counters.drop(why)
	qp.abandonUC()
	qp.resp.dropMsg = true
}

// abandonUC gives up the message in progress (or the one its FIRST
// packet began): a WRITE's cursor is ended, a SEND's receive WQE stays to
// take the next SEND from its start.
func (qp *QP) abandonUC() {
	r := &qp.resp
	if r.cur.Busy() {
		qp.dev.place.End(&r.cur)
	}
	r.recvOff = 0
	r.inMsg = false
}

// execSendUC places a UC SEND packet and completes the receive on the
// last one. It reports whether the packet was placed.
func (qp *QP) execSendUC(p *wire.Packet, path *path) bool {
	r := &qp.resp
	n := uint64(len(p.Payload))
	if r.recvOff+n > r.recv.length {
		qp.ucDrop(DropRecvTooSmall)
		return false
	}
	if n > 0 {
		if st := qp.dev.place.Scatter(qp.pd, r.recv.sgl[:r.recv.nsge], r.recvOff, p.Payload); st != placement.OK {
			if st == placement.Suspended {
				qp.datagramSuspended()
				return false
			}
			qp.recvQPError(path)
			return false
		}
	}
	r.recvOff += n
	if p.Info.Mask&wire.MaskLast != 0 {
		return qp.finishRecv(WCSuccess, r.recvOff, p, path)
	}
	return true
}

// execWriteUC places a UC RDMA WRITE packet: the RETH of a FIRST or ONLY
// is checked once for the message and the cursor carries it. Page faults
// of an ODP MR are resolved inline whatever the fault policy (an RNR NAK
// does not exist on UC). It reports whether the packet was placed.
func (qp *QP) execWriteUC(p *wire.Packet, path *path) bool {
	r := &qp.resp
	e := qp.dev.place
	info := p.Info
	n := uint64(len(p.Payload))
	if info.Mask&wire.MaskFirst != 0 {
		reth := p.RETH()
		r.wlen = uint64(reth.DMALength())
		r.wdone = 0
		if r.wlen > 0 {
			if st := e.Begin(&r.cur, qp.pd, reth.RKey(), reth.VA(), r.wlen, stag.AccessRemoteWrite); st != placement.OK {
				if st == placement.Suspended {
					qp.datagramSuspended()
					return false
				}
				qp.ucDrop(DropAccess)
				return false
			}
		}
	}
	last := info.Mask&wire.MaskLast != 0
	if r.wdone+n > r.wlen || (last && r.wdone+n != r.wlen) {
		qp.ucDrop(DropLength)
		return false
	}
	if n > 0 {
		st := e.Write(&r.cur, p.Payload)
		for tries := 0; st == placement.WouldFault && tries < maxFaultTries; tries++ {
			qp.dev.counters.ODPSyncFaults.Add(1)
			qp.dev.reader.Quiesce()
			if st = e.FaultCursor(&r.cur, n); st == placement.OK {
				st = e.Write(&r.cur, p.Payload)
			} else {
				qp.dev.counters.ODPFaultErrs.Add(1)
			}
		}
		if st == placement.Suspended {
			if info.Mask&wire.MaskFirst != 0 {
				e.End(&r.cur) // the replay begins the message again
			}
			qp.datagramSuspended()
			return false
		}
		if st != placement.OK {
			qp.ucDrop(DropAccess)
			return false
		}
	}
	return qp.endWritePacket(p, path, n)
}
