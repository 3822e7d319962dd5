package transport

import (
	"github.com/softrdma/softrdma/pagetable"
	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/wire"
)

// respond runs the responder on one request packet (rxe_responder's
// GET_REQ -> CHK_PSN -> CHK_OP_SEQ -> CHK_OP_VALID -> CHK_RESOURCE ->
// CHK_LENGTH -> CHK_RKEY -> EXECUTE -> ACKNOWLEDGE). Called only by the
// receive loop, which owns qp.resp.
func (qp *QP) respond(p *wire.Packet, path *path, b *txBatch) {
	r := &qp.resp
	ctr := &qp.dev.counters
	psn := p.PSN()
	switch d := r.ePSN.Distance(psn); {
	case d > 0:
		// A gap: NAK PSN sequence error once per gap (IBTA 9.7.5.2.1,
		// C9-98), then drop until the expected PSN arrives.
		ctr.OutOfSeqRequest.Add(1)
		ctr.drop(DropPSNOutOfWindow)
		if !r.nakSent {
			r.nakSent = true
			qp.sendAck(b, path, wire.SyndromeNAKPSNSeqErr, r.ePSN)
		}
		return
	case d < 0:
		ctr.DuplicateRequest.Add(1)
		qp.duplicate(p, path, b)
		return
	}
	op := p.Opcode()
	info := p.Info

	// CHK_OP_SEQ (IBTA 9.7.4.1.3): a MIDDLE or LAST must continue the
	// message in progress; a FIRST or ONLY must not interrupt one.
	if r.inMsg {
		cont := info.Mask&(wire.MaskMiddle|wire.MaskLast) != 0 && info.Mask&wire.MaskFirst == 0
		same := info.Mask&wire.MaskSend != 0 && wire.Info(r.lastOp).Mask&wire.MaskSend != 0 ||
			info.Mask&wire.MaskWrite != 0 && wire.Info(r.lastOp).Mask&wire.MaskWrite != 0
		if !cont || !same {
			qp.respError(b, path, DropOpSeq, wire.SyndromeNAKInvalidRequest, WCRemInvReqErr)
			return
		}
	} else if info.Mask&wire.MaskFirst == 0 {
		qp.respError(b, path, DropOpSeq, wire.SyndromeNAKInvalidRequest, WCRemInvReqErr)
		return
	}

	// CHK_OP_VALID: the QP must allow the operation (rxe check_op_valid:
	// invalid request when the access flag is missing).
	switch {
	case info.Mask&wire.MaskWrite != 0 && path.access&stag.AccessRemoteWrite == 0,
		info.Mask&wire.MaskRead != 0 && path.access&stag.AccessRemoteRead == 0,
		info.Mask&wire.MaskAtomic != 0 && path.access&stag.AccessRemoteAtomic == 0:
		qp.respError(b, path, DropAccess, wire.SyndromeNAKInvalidRequest, WCRemInvReqErr)
		return
	}

	// CHK_RESOURCE: a READ or atomic needs a responder resource; with
	// max_dest_rd_atomic 0 there is none and the request is an invalid
	// request, a class C error (IBTA 9.9.3; rxe check_resource:
	// RESPST_ERR_TOO_MANY_RDMA_ATM_REQ). Beyond that the resources are a
	// ring: the requester keeps within max_dest_rd_atomic (rxe likewise).
	if info.Mask&(wire.MaskRead|wire.MaskAtomic) != 0 && len(r.res) == 0 {
		qp.respError(b, path, DropAccess, wire.SyndromeNAKInvalidRequest, WCRemInvReqErr)
		return
	}

	// CHK_RESOURCE: a receive WQE for a SEND's first packet or a WRITE with
	// immediate's last; without one, RNR NAK (IBTA 9.7.5.2.8).
	if info.Mask&wire.MaskRWR != 0 && !r.haveRecv {
		if !qp.popRecv(&r.recv) {
			ctr.SendRNRErr.Add(1)
			ctr.drop(DropRNR)
			r.nakSent = true // the packets behind this one get no sequence NAK
			qp.sendAck(b, path, wire.RNRNAK(path.minRNRTimer), psn)
			return
		}
		r.haveRecv = true
		r.recvOff = 0
	}

	// CHK_LENGTH: FIRST and MIDDLE carry exactly one path MTU (C9-88), a
	// LAST at least one byte (an empty message is an ONLY; rxe
	// check_length). The path MTU bounds every packet (handle). A RETH's
	// DMA length is at most 2^31 bytes (IBTA 9.4.3, 9.4.4: an RDMA WRITE
	// or READ moves 0 to 2^31 bytes): beyond it the request is an invalid
	// request, checked before the R_Key as rxe's check_length does, so
	// that an rkey and range which are valid for the first 2^31 bytes do
	// not turn it into a remote access error.
	n := len(p.Payload)
	if info.Mask&(wire.MaskFirst|wire.MaskMiddle) != 0 && info.Mask&wire.MaskLast == 0 && n != path.mtu ||
		info.Mask&wire.MaskOnly == wire.MaskLast && n == 0 ||
		info.Mask&wire.MaskRETH != 0 && p.RETH().DMALength() > maxDMALength {
		qp.respError(b, path, DropLength, wire.SyndromeNAKInvalidRequest, WCRemInvReqErr)
		return
	}

	switch {
	case info.Mask&wire.MaskSend != 0:
		if !qp.execSend(p, path, b) {
			return
		}
	case info.Mask&wire.MaskWrite != 0:
		if !qp.execWrite(p, path, b) {
			return
		}
	case info.Mask&wire.MaskRead != 0:
		qp.execRead(p, path, b)
		return
	case info.Mask&wire.MaskAtomic != 0:
		qp.execAtomic(p, path, b)
		return
	}

	r.nakSent = false
	r.ePSN = r.ePSN.Add(1)
	r.lastOp = op
	r.inMsg = info.Mask&wire.MaskLast == 0
	if !r.inMsg {
		r.msn = r.msn.Add(1)
	}
	if p.BTH().AckReq() {
		if r.ackPend {
			ctr.AckDeferred.Add(1)
		}
		r.ackPend = true
		r.ackPSN = psn
		if !r.inAckList {
			r.inAckList = true
			qp.dev.ackList = append(qp.dev.ackList, qp)
		}
	}
}

// execSend places a SEND packet into the receive WQE (scatter over its
// SGEs) and completes it on the last packet.
func (qp *QP) execSend(p *wire.Packet, path *path, b *txBatch) bool {
	r := &qp.resp
	n := uint64(len(p.Payload))
	if r.recvOff+n > r.recv.length {
		// The receive buffer is too small: LOC_LEN_ERR on the receive and
		// NAK invalid request to the requester (IBTA 9.7.5.2.2, rxe).
		qp.finishRecv(WCLocLenErr, r.recvOff, p, path)
		qp.respError(b, path, DropLength, wire.SyndromeNAKInvalidRequest, WCRemInvReqErr)
		return false
	}
	if n > 0 {
		if st := qp.dev.place.Scatter(qp.pd, r.recv.sgl[:r.recv.nsge], r.recvOff, p.Payload); st != placement.OK {
			if st == placement.Suspended {
				qp.placementSuspended(b, path, p, nil)
				return false
			}
			qp.finishRecv(WCLocProtErr, r.recvOff, p, path)
			qp.respError(b, path, DropAccess, wire.SyndromeNAKRemoteOp, WCRemOpErr)
			return false
		}
	}
	r.recvOff += n
	if p.Info.Mask&wire.MaskLast != 0 {
		if p.Info.Mask&wire.MaskIETH != 0 && !qp.invalidateIETH(p, path, b) {
			return false // class J error: NAKed, receive completed in error
		}
		if !qp.finishRecv(WCSuccess, r.recvOff, p, path) {
			return false // the receive CQ overran: ERR, not acknowledged
		}
	}
	return true
}

// finishRecv completes the receive WQE the responder holds. It reports
// false when the completion overran the receive CQ: the QP is then in ERR
// (recvCQOverrun) and the request must not be acknowledged.
func (qp *QP) finishRecv(st WCStatus, n uint64, p *wire.Packet, path *path) bool {
	r := &qp.resp
	if !r.haveRecv {
		return true
	}
	r.haveRecv = false
	r.wqeErr = st != WCSuccess
	wc := WC{WRID: r.recv.wrid, Status: st, Opcode: WCRecv, ByteLen: uint32(n),
		QPN: qpnOf(qp.qpn), SrcQP: qpnOf(path.destQPN)}
	if st == WCSuccess {
		info := p.Info
		if info.Mask&wire.MaskImmDt != 0 {
			wc.Flags |= WCWithImm
			wc.ImmData = p.ImmDt().Imm()
		}
		if info.Mask&wire.MaskIETH != 0 {
			wc.Flags |= WCWithInv
			wc.InvRKey = p.IETH().RKey()
		}
		if info.Mask&wire.MaskWrite != 0 {
			wc.Opcode = WCRecvRDMAWithImm
		}
	}
	ok := qp.recvCQ.push(&wc)
	qp.recvHeld.Store(false)
	if !ok {
		qp.cqOverrun(qp.recvCQ)
		qp.recvCQOverrun()
		return false
	}
	return true
}

// recvCQOverrun moves the QP whose receive completion overran its CQ to
// ERR (rxe RESPST_ERR_CQ_OVERFLOW, "All - Class G"; IBTA 11.4.2.1: the
// completion is lost, so the QP cannot go on) and raises EventQPFatal on
// it: no completion can tell its client why it stopped. Caller holds
// respMu.
func (qp *QP) recvCQOverrun() {
	qp.releaseRespLocked()
	if qp.setError() {
		qp.dev.raise(EventQPFatal, qp, nil)
		qp.flush()
	}
}

// execWrite places an RDMA WRITE packet: the RETH of a FIRST or ONLY is
// checked once for the whole message (rxe check_rkey) and the cursor
// carries it across MIDDLE and LAST.
func (qp *QP) execWrite(p *wire.Packet, path *path, b *txBatch) bool {
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
					qp.placementSuspended(b, path, p, &r.cur)
					return false
				}
				qp.respError(b, path, DropAccess, syndromeFor(st), statusFor(st))
				return false
			}
		}
	}
	last := info.Mask&wire.MaskLast != 0
	if r.wdone+n > r.wlen || (last && r.wdone+n != r.wlen) {
		e.End(&r.cur)
		qp.respError(b, path, DropLength, wire.SyndromeNAKInvalidRequest, WCRemInvReqErr)
		return false
	}
	if n > 0 {
		st := e.Write(&r.cur, p.Payload)
		for tries := 0; st == placement.WouldFault; tries++ {
			// An invalidation may clear the page again between the fault
			// and the copy: fault again, a bounded number of times, then
			// let the requester back off.
			if tries == maxFaultTries {
				qp.retryLater(b, path, p, &r.cur)
				return false
			}
			if st = qp.pageFault(b, path, p, &r.cur, n); st == placement.WouldFault {
				return false // RNR NAK sent; the packet comes again
			}
			if st == placement.OK {
				st = e.Write(&r.cur, p.Payload)
			}
		}
		if st == placement.Suspended {
			qp.placementSuspended(b, path, p, &r.cur)
			return false
		}
		if st != placement.OK {
			e.End(&r.cur)
			qp.respError(b, path, DropAccess, syndromeFor(st), statusFor(st))
			return false
		}
	}
	return qp.endWritePacket(p, path, n)
}

// pageFault handles a WouldFault of an RDMA WRITE packet of n bytes at the
// cursor c, by the device's fault policy. FaultSync resolves it inline and
// returns OK (place the packet now) or RemoteAccessErr. FaultRNR sends an
// RNR NAK for the packet, starts the fault of the rest of the message in
// the background and returns WouldFault: the packet is not placed and the
// expected PSN stays, so the requester's retry continues the message; the
// cursor of a FIRST or ONLY packet is ended, since the retry begins the
// message again.
func (qp *QP) pageFault(b *txBatch, path *path, p *wire.Packet, c *placement.Cursor, n uint64) placement.Status {
	e := qp.dev.place
	if qp.dev.policy == FaultRNR {
		ahead := uint64(maxAsyncFaultBytes)
		if lim := e.Budget().Limit(); lim > 0 {
			// Fault ahead at most half the page budget: more would evict
			// its own first pages before the retry places them.
			ahead = min(ahead, uint64(lim)*pagetable.PageSize/2)
		}
		st, busy := e.FaultCursorAsync(c, n, ahead, qp.pd)
		if st != placement.WouldFault {
			qp.dev.counters.ODPFaultErrs.Add(1)
			return st
		}
		if busy {
			qp.dev.counters.ODPAsyncFaultsBusy.Add(1)
		}
		if p.Info.Mask&wire.MaskFirst != 0 {
			e.End(c)
		}
		qp.odpRNR(b, path, p.PSN())
		return placement.WouldFault
	}
	qp.dev.counters.ODPSyncFaults.Add(1)
	// Blocking: quiesce first, so that a deregistration elsewhere does not
	// wait for the fault (the cursor refreshes its mapping at its next use).
	qp.dev.reader.Quiesce()
	st := e.FaultCursor(c, n)
	if st != placement.OK {
		qp.dev.counters.ODPFaultErrs.Add(1)
	}
	return st
}

// maxDMALength is the largest DMA length a RETH may carry: an RDMA WRITE
// or READ message is 0 to 2^31 bytes (IBTA 9.4.3, 9.4.4; rxe check_length).
const maxDMALength = 1 << 31

// maxFaultTries bounds how often the sync policy faults a packet's pages
// in again when an invalidation clears them before the copy; past it the
// packet gets an RNR NAK.
const maxFaultTries = 16

// retryLater answers a packet whose pages keep being invalidated with an
// RNR NAK (ending the cursor a FIRST packet began), so that the requester
// backs off and retries.
func (qp *QP) retryLater(b *txBatch, path *path, p *wire.Packet, c *placement.Cursor) {
	if c != nil && p.Info.Mask&wire.MaskFirst != 0 && c.Busy() {
		qp.dev.place.End(c)
	}
	qp.odpRNR(b, path, p.PSN())
}

// maxAsyncFaultBytes bounds what one background fault of the rnr policy
// resolves ahead of the faulting packet: the rest of the message, up to
// this many bytes (mlx5 likewise faults the rest of a WQE's range).
const maxAsyncFaultBytes = 4 << 20

// odpRNR sends an RNR NAK for psn because of a page fault, and lets the
// packets behind it go without a sequence NAK.
func (qp *QP) odpRNR(b *txBatch, path *path, psn wire.PSN) {
	ctr := &qp.dev.counters
	ctr.SendRNRErr.Add(1)
	ctr.ODPRNRNAKs.Add(1)
	ctr.drop(DropRNR)
	qp.resp.nakSent = true
	qp.sendAck(b, path, wire.RNRNAK(path.minRNRTimer), psn)
}

// endWritePacket advances the RDMA WRITE message in progress by the n
// bytes just placed and, on its LAST or ONLY packet, ends it: the cursor
// is released, rdma_recvs counted, and a WRITE with immediate completes
// its receive WQE. RC and UC share it. It reports false when that
// completion overran the receive CQ (finishRecv).
func (qp *QP) endWritePacket(p *wire.Packet, path *path, n uint64) bool {
	r := &qp.resp
	r.wdone += n
	if p.Info.Mask&wire.MaskLast == 0 {
		return true
	}
	if r.wlen > 0 {
		qp.dev.place.End(&r.cur)
	}
	qp.dev.counters.RDMARecvs.Add(1)
	if p.Info.Mask&wire.MaskImmDt != 0 {
		return qp.finishRecv(WCSuccess, r.wlen, p, path)
	}
	return true
}

// execRead executes an RDMA READ request: it saves a responder resource
// (so a duplicate is answered again, IBTA 9.7.5.1.4) and sends the
// responses.
func (qp *QP) execRead(p *wire.Packet, path *path, b *txBatch) {
	r := &qp.resp
	reth := p.RETH()
	length := uint64(reth.DMALength())
	psn := p.PSN()
	if length > 0 {
		if st := qp.dev.place.Begin(&r.readCur, qp.pd, reth.RKey(), reth.VA(), length, stag.AccessRemoteRead); st != placement.OK {
			qp.respError(b, path, DropAccess, syndromeFor(st), statusFor(st))
			return
		}
		qp.dev.place.End(&r.readCur)
	}
	npkts := packetsFor(length, path.mtu)
	res := &r.res[r.resNext]
	r.resNext = (r.resNext + 1) % len(r.res)
	*res = rdRes{valid: true, firstPSN: psn, lastPSN: psn.Add(npkts - 1), va: reth.VA(), rkey: reth.RKey(), length: length}
	r.nakSent = false
	r.ePSN = psn.Add(npkts)
	r.lastOp = p.Opcode()
	r.inMsg = false
	r.msn = r.msn.Add(1)
	res.msn = r.msn
	qp.dev.counters.RDMARecvs.Add(1)
	qp.sendReadResponses(b, path, psn, reth.VA(), reth.RKey(), length)
}

// sendReadResponses sends the READ response packets for [va, va+length)
// starting at psn. A failure to read (the MR vanished) ends the stream with
// a remote access error NAK and moves the QP to ERR (respErrorAt).
func (qp *QP) sendReadResponses(b *txBatch, path *path, psn wire.PSN, va uint64, rkey uint32, length uint64) {
	r := &qp.resp
	qp.supersedeAck(psn)
	e := qp.dev.place
	// READ responses use their own cursor: a duplicate READ may arrive in
	// the middle of a multi-packet WRITE, whose cursor must survive it.
	if length > 0 {
		if st := e.Begin(&r.readCur, qp.pd, rkey, va, length, stag.AccessRemoteRead); st != placement.OK {
			// A duplicate READ whose region has gone since (a new READ
			// was checked by execRead): a class C error as for a new one
			// (rxe read_reply: rxe_recheck_mr fails, RESPST_ERR_RKEY_VIOLATION).
			qp.respErrorAt(b, path, DropAccess, syndromeFor(st), psn)
			return
		}
		defer e.End(&r.readCur)
	}
	mtu := uint64(path.mtu)
	npkts := packetsFor(length, path.mtu)
	var off uint64
	for i := uint32(0); i < npkts; i++ {
		n := length - off
		if n > mtu {
			n = mtu
		}
		var op wire.Opcode
		switch {
		case npkts == 1:
			op = wire.OpRDMAReadResponseOnly
		case i == 0:
			op = wire.OpRDMAReadResponseFirst
		case i == npkts-1:
			op = wire.OpRDMAReadResponseLast
		default:
			op = wire.OpRDMAReadResponseMiddle
		}
		buf, info := buildPacket(b, path, op, psn.Add(i), false, int(n))
		if info.Mask&wire.MaskAETH != 0 {
			wire.AETH(buf[info.Offset[wire.HdrAETH]:]).Encode(wire.SyndromeACK, r.msn)
		}
		if n > 0 {
			st := e.Read(&r.readCur, buf[info.Length:info.Length+int(n)])
			for tries := 0; st == placement.WouldFault && tries < maxFaultTries; tries++ {
				// READ faults are resolved inline under both policies:
				// the responses are generated here, and an RNR NAK does
				// not answer a READ (IBTA 9.7.5.2.8). A page invalidated
				// again before the copy is faulted again.
				qp.dev.counters.ODPSyncFaults.Add(1)
				qp.dev.reader.Quiesce()
				if st = e.FaultCursor(&r.readCur, n); st == placement.OK {
					st = e.Read(&r.readCur, buf[info.Length:info.Length+int(n)])
				} else {
					qp.dev.counters.ODPFaultErrs.Add(1)
				}
			}
			if st != placement.OK {
				// The region went away or a page cannot be faulted in:
				// NAK the response's PSN and move the QP to ERR, a class
				// C responder error (IBTA 9.9.3; rxe read_reply's
				// RESPST_ERR_RKEY_VIOLATION goes to do_class_ac_error),
				// as for the same error found before the first response.
				b.n-- // drop the half-built packet
				qp.respErrorAt(b, path, DropAccess, syndromeFor(st), psn.Add(i))
				return
			}
		}
		off += n
	}
}

// execAtomic executes CMP_SWAP or FETCH_ADD once and saves the original
// value so that a duplicate gets the same answer without a second
// execution (IBTA 9.7.5.1.4, o9-31).
func (qp *QP) execAtomic(p *wire.Packet, path *path, b *txBatch) {
	r := &qp.resp
	a := p.AtomicETH()
	// A misaligned VA is an invalid request (rxe
	// RESPST_ERR_MISALIGNED_ATOMIC), but only once the R_Key and the range
	// have passed: AtomicQP checks them first and then reports the
	// misalignment as InvalidRequest, so that a bad rkey with a misaligned
	// VA is a remote access error, as from rxe (check_rkey runs before
	// atomic_reply).
	op := placement.FetchAdd
	if p.Opcode() == wire.OpCompareSwap {
		op = placement.CmpSwap
	}
	orig, st := qp.dev.place.AtomicQP(qp.pd, uint32(qp.qpn), a.RKey(), a.VA(), op, a.SwapAdd(), a.Compare())
	if st == placement.WouldFault {
		if qp.dev.policy == FaultRNR {
			if qp.dev.place.ResolvableRemoteQP(qp.pd, uint32(qp.qpn), a.RKey(), a.VA(), 8, true) {
				qp.odpRNR(b, path, p.PSN())
				if !qp.dev.place.FaultAsyncQP(qp.pd, uint32(qp.qpn), a.RKey(), a.VA(), 8, true) {
					qp.dev.counters.ODPAsyncFaultsBusy.Add(1)
				}
				return
			}
			qp.dev.counters.ODPFaultErrs.Add(1)
			qp.respError(b, path, DropAccess, wire.SyndromeNAKRemoteAccess, WCRemAccessErr)
			return
		}
		for tries := 0; st == placement.WouldFault; tries++ {
			if tries == maxFaultTries {
				qp.retryLater(b, path, p, nil)
				return
			}
			qp.dev.counters.ODPSyncFaults.Add(1)
			qp.dev.reader.Quiesce()
			if st = qp.dev.place.FaultRemoteQP(qp.pd, uint32(qp.qpn), a.RKey(), a.VA(), 8, true); st == placement.OK {
				orig, st = qp.dev.place.AtomicQP(qp.pd, uint32(qp.qpn), a.RKey(), a.VA(), op, a.SwapAdd(), a.Compare())
			} else {
				qp.dev.counters.ODPFaultErrs.Add(1)
			}
		}
	}
	if st == placement.Suspended {
		qp.placementSuspended(b, path, p, nil)
		return
	}
	if st != placement.OK {
		qp.respError(b, path, DropAccess, syndromeFor(st), statusFor(st))
		return
	}
	psn := p.PSN()
	res := &r.res[r.resNext]
	r.resNext = (r.resNext + 1) % len(r.res)
	r.nakSent = false
	r.ePSN = psn.Add(1)
	r.lastOp = p.Opcode()
	r.inMsg = false
	r.msn = r.msn.Add(1)
	*res = rdRes{valid: true, atomic: true, firstPSN: psn, lastPSN: psn, orig: orig, msn: r.msn}
	qp.sendAtomicAck(b, path, psn, orig, r.msn)
}

func (qp *QP) sendAtomicAck(b *txBatch, path *path, psn wire.PSN, orig uint64, msn wire.MSN) {
	qp.supersedeAck(psn)
	buf, info := buildPacket(b, path, wire.OpAtomicAcknowledge, psn, false, 0)
	wire.AETH(buf[info.Offset[wire.HdrAETH]:]).Encode(wire.SyndromeACK, msn)
	wire.AtomicAckETH(buf[info.Offset[wire.HdrAtomicAckETH]:]).SetOrigRemoteData(orig)
}

// duplicate answers a request whose PSN is before the expected one (IBTA
// 9.7.5.1.4): SEND and WRITE are acknowledged again (not executed), READ
// is answered again from its saved resource, an atomic from its saved
// result.
func (qp *QP) duplicate(p *wire.Packet, path *path, b *txBatch) {
	r := &qp.resp
	psn := p.PSN()
	info := p.Info
	switch {
	case info.Mask&wire.MaskRead != 0:
		for i := range r.res {
			res := &r.res[i]
			if !res.valid || res.atomic || psn.Before(res.firstPSN) || res.lastPSN.Before(psn) {
				continue
			}
			reth := p.RETH()
			va, length := reth.VA(), uint64(reth.DMALength())
			// The re-request must name the same rkey and a sub-range of
			// the saved READ (IBTA 9.7.5.1.4; rxe duplicate_request checks
			// the same), usually the rest of it from the first missing
			// response; its responses must stay within the saved READ's
			// PSNs.
			if reth.RKey() != res.rkey || va < res.va || length > res.length || va-res.va > res.length-length ||
				uint64(res.firstPSN.Distance(psn))+uint64(packetsFor(length, path.mtu)) > uint64(packetsFor(res.length, path.mtu)) {
				break
			}
			qp.sendReadResponses(b, path, psn, va, reth.RKey(), length)
			return
		}
		qp.dev.counters.drop(DropStaleDuplicate)
	case info.Mask&wire.MaskAtomic != 0:
		for i := range r.res {
			res := &r.res[i]
			if res.valid && res.atomic && res.firstPSN == psn {
				qp.sendAtomicAck(b, path, psn, res.orig, res.msn)
				return
			}
		}
		qp.dev.counters.drop(DropStaleDuplicate)
	default:
		// Acknowledge everything received so far (coalesced).
		if r.ackPend {
			qp.dev.counters.AckDeferred.Add(1)
		}
		r.ackPend = true
		r.ackPSN = r.ePSN.Sub(1)
		if !r.inAckList {
			r.inAckList = true
			qp.dev.ackList = append(qp.dev.ackList, qp)
		}
	}
}

// respError NAKs the current request and moves the QP to ERR: the class
// B/C responder errors of IBTA 9.9.3 (rxe do_class_ac_error). Invalid
// request, remote access and remote operational errors are all fatal to
// the responder's QP. An error related to a receive WQE completes it in
// error; one that is not raises the affiliated asynchronous error the
// syndrome names (IBTA C9-222.1.1; eventForNAK).
func (qp *QP) respError(b *txBatch, path *path, why DropReason, syn wire.Syndrome, _ WCStatus) {
	qp.respErrorAt(b, path, why, syn, qp.resp.ePSN)
}

// respErrorAt is respError with a NAK for psn instead of the expected PSN:
// a READ whose responses fail after the expected PSN has moved past it
// (sendReadResponses).
func (qp *QP) respErrorAt(b *txBatch, path *path, why DropReason, syn wire.Syndrome, psn wire.PSN) {
	r := &qp.resp
	qp.dev.counters.drop(why)
	qp.sendAck(b, path, syn, psn)
	related := r.haveRecv || r.wqeErr
	r.wqeErr = false
	if r.haveRecv {
		wc := WC{WRID: r.recv.wrid, Status: WCRemInvReqErr, Opcode: WCRecv, QPN: qpnOf(qp.qpn), SrcQP: qpnOf(path.destQPN)}
		if syn == wire.SyndromeNAKRemoteAccess {
			wc.Status = WCRemAccessErr
		}
		r.haveRecv = false
		qp.pushWC(qp.recvCQ, &wc)
		qp.recvHeld.Store(false)
	}
	qp.releaseRespLocked()
	if qp.setError() {
		if !related {
			qp.dev.raise(eventForNAK(syn), qp, nil)
		}
		qp.flush()
	}
}

// eventForNAK names the affiliated asynchronous error of a responder
// error that concerns no receive WQE, by the NAK it sent (IBTA 11.6.3.2):
// an invalid request is an "Invalid Request Local Work Queue Error"
// (EventQPReqErr), an R_Key, bounds or access violation a "Local Access
// Violation Work Queue Error" (EventQPAccessErr), and a remote
// operational error, a fault of the responder itself, a "Local Work Queue
// Catastrophic Error" (EventQPFatal).
func eventForNAK(syn wire.Syndrome) EventType {
	switch syn {
	case wire.SyndromeNAKInvalidRequest:
		return EventQPReqErr
	case wire.SyndromeNAKRemoteAccess:
		return EventQPAccessErr
	}
	return EventQPFatal
}

// releaseRespLocked ends the responder's placement cursors, so that the
// MRs they hold can be deregistered: a message cut short by an error, a
// reset or a peer that went away must not pin an MR forever. Caller holds
// respMu.
func (qp *QP) releaseRespLocked() {
	r := &qp.resp
	if r.cur.Busy() {
		qp.dev.place.End(&r.cur)
	}
	if r.readCur.Busy() {
		qp.dev.place.End(&r.readCur)
	}
	r.inMsg = false
	if qp.State() == QPStateErr {
		qp.flushRespRecvLocked()
	}
}

// flushRespRecvLocked completes the receive WQE a SEND in progress had
// taken from the receive queue with WR_FLUSH_ERR: in ERR every posted
// receive WR completes (IBTA 10.3.1, 11.4), and this one is no longer in
// the queue that flush empties. It is the oldest, so it goes first.
// Caller holds respMu.
func (qp *QP) flushRespRecvLocked() {
	r := &qp.resp
	if !r.haveRecv {
		return
	}
	r.haveRecv = false
	wc := WC{WRID: r.recv.wrid, Status: WCWRFlushErr, Opcode: WCRecv, QPN: qpnOf(qp.qpn)}
	qp.pushWC(qp.recvCQ, &wc)
	qp.recvHeld.Store(false)
}

// releaseResp is releaseRespLocked for callers outside the receive loop.
func (qp *QP) releaseResp() {
	qp.respMu.Lock()
	qp.releaseRespLocked()
	qp.respMu.Unlock()
}

// sendAck sends an ACKNOWLEDGE with syndrome syn for psn, carrying the
// current MSN.
func (qp *QP) sendAck(b *txBatch, path *path, syn wire.Syndrome, psn wire.PSN) {
	qp.supersedeAck(psn)
	buf, info := buildPacket(b, path, wire.OpAcknowledge, psn, false, 0)
	wire.AETH(buf[info.Offset[wire.HdrAETH]:]).Encode(syn, qp.resp.msn)
	if syn.Type() != wire.TypeACK {
		qp.dev.counters.NAKsSent.Add(1)
	}
}

// supersedeAck drops the batch's coalesced ACK when a response for a later
// PSN is about to go out: an ACK, NAK, READ response or atomic ACK for psn
// acknowledges every request before psn too (IBTA 9.7.5.1.2, coalesced
// acknowledgements), and the coalesced ACK, sent at the end of the batch,
// would arrive after it and be dropped by the requester as a duplicate
// response. It counts as an ACK deferred. Receive loop only (respMu).
func (qp *QP) supersedeAck(psn wire.PSN) {
	r := &qp.resp
	if r.ackPend && r.ackPSN.Before(psn) {
		r.ackPend = false
		qp.dev.counters.AckDeferred.Add(1)
	}
}

// syndromeFor maps a placement failure to the NAK IBTA names for it:
// bad key, PD, access or bounds is a remote access error (9.7.5.2.4); a
// length beyond the request is an invalid request (9.7.5.2.2).
func syndromeFor(st placement.Status) wire.Syndrome {
	switch st {
	case placement.InvalidRequest:
		return wire.SyndromeNAKInvalidRequest
	case placement.RemoteOpErr:
		return wire.SyndromeNAKRemoteOp
	}
	return wire.SyndromeNAKRemoteAccess
}

func statusFor(st placement.Status) WCStatus {
	switch st {
	case placement.InvalidRequest:
		return WCRemInvReqErr
	case placement.RemoteOpErr:
		return WCRemOpErr
	}
	return WCRemAccessErr
}
