package transport

import (
	"time"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/transport/wire"
)

// isRdAtomic reports whether op needs a READ/atomic credit (IBTA 9.7.7:
// max_rd_atomic bounds outstanding RDMA READ and atomic requests).
func isRdAtomic(op WROpcode) bool {
	return op == WRRDMARead || op == WRAtomicCmpAndSwp || op == WRAtomicFetchAndAdd
}

// packetsFor returns how many PSNs a message of n bytes takes at mtu bytes
// per packet; a zero-length message takes one.
func packetsFor(n uint64, mtu int) uint32 {
	if n == 0 {
		return 1
	}
	return uint32((n + uint64(mtu) - 1) / uint64(mtu))
}

// runRequester turns send WQEs into packets (rxe_requester): it honours the
// PSN window, fences and max_rd_atomic, sets AckReq on the last packet of a
// message and every AckEveryNPackets, and arms the retransmit timer. It
// returns true when it stopped only because the batch or its budget ran
// out.
func (qp *QP) runRequester(b *txBatch) bool {
	qp.sq.Lock()
	more := qp.runRequesterLocked(b)
	fatal := qp.fatal
	qp.fatal = false
	lw := qp.takeLocalWait()
	qp.sq.Unlock()
	if qp.typ != QPTypeRC { // ud.go: on UC and UD, sent is complete
		m, f := qp.completeSent(b)
		more, fatal = more || m, fatal || f
	}
	if qp.State() == QPStateSQD {
		// The drain may be complete: the last message in progress was
		// sent (UC, UD) or acknowledged (RC: the completer kicks the
		// requester on every acknowledgement), as rxe's requester checks.
		qp.sq.Lock()
		qp.sqDrainedLocked()
		qp.sq.Unlock()
	}
	if fatal {
		qp.releaseResp() // the receive WQE in use completes first
		qp.flush()
	}
	if lw.inv != nil {
		// An invalidation waits for the placements in flight without
		// sq (mw.go); what was built before it goes out first.
		b.flush()
		qp.finishLocal(lw)
		more = true
	}
	return more
}

func (qp *QP) runRequesterLocked(b *txBatch) bool {
	switch qp.typ {
	case QPTypeUC:
		return qp.runRequesterUC(b)
	case QPTypeUD:
		return qp.runRequesterUD(b)
	}
	st := qp.State()
	if (st != QPStateRTS && st != QPStateSQD) || qp.comp.rnrWait {
		return false
	}
	// SQD (IBTA 10.3.1 "Send Queue Drain"): finish the messages in
	// progress, retransmissions included; start no new one.
	draining := st == QPStateSQD
	path := qp.path.Load()
	mtu := path.mtu
	r := &qp.req
	nslots := uint64(len(qp.sq.wqe))
	maxRd := int(qp.attr.MaxRdAtomic)
	if maxRd < 1 {
		maxRd = 1
	}
	sentAny := false
	budget := requesterBudget
	more := false
loop:
	for r.idx < qp.sq.head {
		if budget == 0 || b.full() {
			more = true
			break
		}
		if qp.comp.psn.Distance(r.psn) >= qp.sendWindow() {
			break // window full: the completer kicks us when it opens
		}
		w := &qp.sq.wqe[r.idx%nslots]
		op := w.wr.Opcode
		if draining && r.offset == 0 && !w.psnSet {
			// A message never sent does not start; one that was (and
			// was rewound by go-back-N or a timeout) is sent again: its
			// completion is part of the drain.
			break
		}
		if isLocalOp(op) {
			if !qp.runLocal(w) {
				break
			}
			continue
		}
		if r.idx == r.acct {
			// First visit of this WQE in this pass: fence and credits.
			if w.wr.Flags&SendFence != 0 && r.rdAtomic > 0 {
				break
			}
			if isRdAtomic(op) {
				if r.rdAtomic >= maxRd {
					break
				}
				r.rdAtomic++
			}
			r.acct++
			if r.offset == 0 {
				if !w.psnSet && (op == WRRDMARead || op == WRRDMAWrite || op == WRRDMAWriteWithImm) {
					qp.dev.counters.RDMASends.Add(1) // messages, not attempts
				}
				w.firstPSN = r.psn
				w.npkts = packetsFor(w.length, mtu)
				if op == WRAtomicCmpAndSwp || op == WRAtomicFetchAndAdd {
					w.npkts = 1
				}
				w.lastPSN = r.psn.Add(w.npkts - 1)
				w.psnSet = true
			}
		}
		switch op {
		case WRRDMARead:
			if r.offset > w.readDone {
				// A piece of it was requested (slow restart) and not
				// all of its responses are in: the next piece goes
				// when they are (the completer kicks the requester),
				// or after a retry rewinds to what was received.
				break loop
			}
			if n := packetsFor(w.length-r.offset, mtu); int64(qp.comp.psn.Distance(r.psn))+int64(n) >= maxOutstandingPSNs {
				// Its responses would put more than half the PSN space
				// in flight: wait for what is outstanding.
				break loop
			}
			qp.sendReadRequest(b, path, w)
			budget--
			if r.offset >= w.length {
				r.idx++
				r.offset = 0
			}
		case WRAtomicCmpAndSwp, WRAtomicFetchAndAdd:
			qp.sendAtomic(b, path, w)
			budget--
			r.idx++
			r.offset = 0
		default:
			for budget > 0 && !b.full() {
				if qp.comp.psn.Distance(r.psn) >= qp.sendWindow() {
					break
				}
				if !qp.sendSegment(b, path, w) {
					return false // local error; the WQE was completed
				}
				budget--
				if r.offset >= w.length {
					break
				}
			}
			if r.offset >= w.length {
				r.idx++
				r.offset = 0
			}
		}
		sentAny = true
	}
	if sentAny && !qp.comp.timerArmed {
		qp.armTimer(qp.timeoutDuration())
	}
	return more
}

// countTx notes a request packet with PSN psn, counting retransmissions.
func (qp *QP) countTx(psn wire.PSN, n uint32) {
	r := &qp.req
	if r.hiSet && psn.Before(r.hiPSN) {
		qp.dev.counters.Retransmits.Add(1)
	}
	end := psn.Add(n)
	if r.hiPSN.Before(end) || !r.hiSet {
		r.hiPSN = end
		r.hiSet = true
	}
}

// sendSegment sends the next packet of a SEND or RDMA WRITE WQE.
func (qp *QP) sendSegment(b *txBatch, path *path, w *sendWQE) bool {
	r := &qp.req
	mtu := uint64(path.mtu)
	n := w.length - r.offset
	if n > mtu {
		n = mtu
	}
	first := r.offset == 0
	last := r.offset+n == w.length
	var op wire.Opcode
	write := w.wr.Opcode == WRRDMAWrite || w.wr.Opcode == WRRDMAWriteWithImm
	imm := w.wr.Opcode == WRRDMAWriteWithImm || w.wr.Opcode == WRSendWithImm
	inv := w.wr.Opcode == WRSendWithInv
	switch {
	case write && first && last && imm:
		op = wire.OpRDMAWriteOnlyWithImmediate
	case write && first && last:
		op = wire.OpRDMAWriteOnly
	case write && first:
		op = wire.OpRDMAWriteFirst
	case write && last && imm:
		op = wire.OpRDMAWriteLastWithImmediate
	case write && last:
		op = wire.OpRDMAWriteLast
	case write:
		op = wire.OpRDMAWriteMiddle
	case first && last && imm:
		op = wire.OpSendOnlyWithImmediate
	case first && last && inv:
		op = wire.OpSendOnlyWithInvalidate
	case first && last:
		op = wire.OpSendOnly
	case first:
		op = wire.OpSendFirst
	case last && imm:
		op = wire.OpSendLastWithImmediate
	case last && inv:
		op = wire.OpSendLastWithInvalidate
	case last:
		op = wire.OpSendLast
	default:
		op = wire.OpSendMiddle
	}
	r.noack++
	// In slow restart the packet that fills the window asks for an ACK:
	// the window opens only when one comes back (the requester may set
	// the BTH AckReq bit on any request packet; rxe sets it on the last
	// packet and every RXE_MAX_PKT_PER_ACK).
	ackReq := last || r.noack >= AckEveryNPackets ||
		(r.restartWnd != 0 && qp.comp.psn.Distance(r.psn.Add(1)) >= int32(r.restartWnd))
	if ackReq {
		r.noack = 0
	}
	if qp.typ == QPTypeUC {
		op |= wire.OpUC // the same operations; nothing is acknowledged
		ackReq = false
	}
	psn := r.psn
	buf, info := buildPacket(b, path, op, psn, ackReq, int(n))
	if last && w.wr.Flags&SendSolicited != 0 && (!write || imm) {
		// BTH SE: solicited event (IBTA 9.2.3), on the last packet of a
		// SEND or an RDMA WRITE with immediate, the messages that
		// consume a receive WQE (rxe likewise).
		buf[1] |= 0x80
	}
	if info.Mask&wire.MaskRETH != 0 {
		wire.RETH(buf[info.Offset[wire.HdrRETH]:]).Encode(&wire.RETHFields{
			VA: w.wr.RemoteAddr, RKey: w.wr.RKey, DMALength: uint32(w.length)})
	}
	if info.Mask&wire.MaskImmDt != 0 {
		wire.ImmDt(buf[info.Offset[wire.HdrImmDt]:]).SetImm(w.wr.ImmData)
	}
	if info.Mask&wire.MaskIETH != 0 {
		wire.IETH(buf[info.Offset[wire.HdrIETH]:]).SetRKey(w.wr.InvRKey)
	}
	// The ICRC is computed here, over the headers and then over the
	// payload while it is copied in (it is read once for both), for IPv4
	// ID 0; the conn corrects it for the ID the datagram gets
	// (conn.Packet.ICRCReady).
	c := b.beginICRC(path, buf, info.Length)
	dst := buf[info.Length : info.Length+int(n)]
	if w.isInline {
		c.Copy(dst, w.inline[r.offset:r.offset+n])
	} else if n > 0 {
		if st := qp.dev.place.GatherWith(qp.pd, w.wr.SGL, r.offset, dst, c); st != placement.OK {
			// The MR went away under the WR: a local protection error
			// (IBTA 10.7.2.2). Drop the packet we were building.
			b.n--
			qp.fail(w, WCLocProtErr)
			return false
		}
	}
	b.endICRC(buf, info.Length+int(n))
	qp.countTx(psn, 1)
	r.psn = r.psn.Add(1)
	r.offset += n
	return true
}

// sendReadRequest sends an RDMA READ request for the part of the WQE not
// yet received: all of it, or the rest after a retry (IBTA 9.7.5.1.3: the
// re-request names the PSN of the first missing response and the VA and
// length of what it covers). In slow restart (restartWnd set) the request
// covers no more response packets than the window has room for, whole
// MTUs from the first missing byte: a READ request for a sub-range of the
// READ, which a responder that executed the READ answers as a duplicate
// from its saved resource (IBTA 9.7.5.1.4; rxe's duplicate_request
// accepts any sub-range under the same rkey) and one that did not as a
// new, shorter READ whose PSNs are the same. The requester sends the next
// piece when this one is in. It sets r.psn after the request and r.offset
// to the bytes requested so far. Caller holds sq.
func (qp *QP) sendReadRequest(b *txBatch, path *path, w *sendWQE) {
	r := &qp.req
	mtu := uint64(path.mtu)
	done := w.readDone
	psn := w.firstPSN.Add(uint32(done / mtu))
	length := w.length - done
	n := packetsFor(length, path.mtu)
	if r.restartWnd != 0 {
		room := int64(r.restartWnd) - int64(qp.comp.psn.Distance(psn))
		if room < 1 {
			room = 1
		}
		if room < int64(n) {
			n = uint32(room)
			length = uint64(n) * mtu
			w.readPiece = true
		}
	}
	buf, info := buildPacket(b, path, wire.OpRDMAReadRequest, psn, true, 0)
	wire.RETH(buf[info.Offset[wire.HdrRETH]:]).Encode(&wire.RETHFields{
		VA: w.wr.RemoteAddr + done, RKey: w.wr.RKey, DMALength: uint32(length)})
	qp.countTx(psn, n)
	r.psn = psn.Add(n)
	r.offset = done + length
	r.noack = 0
}

// sendAtomic sends a COMPARE_SWAP or FETCH_ADD request.
func (qp *QP) sendAtomic(b *txBatch, path *path, w *sendWQE) {
	r := &qp.req
	op := wire.OpFetchAdd
	f := wire.AtomicETHFields{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, SwapAdd: w.wr.CompareAdd}
	if w.wr.Opcode == WRAtomicCmpAndSwp {
		op = wire.OpCompareSwap
		f.SwapAdd, f.Compare = w.wr.Swap, w.wr.CompareAdd
	}
	buf, info := buildPacket(b, path, op, w.firstPSN, true, 0)
	wire.AtomicETH(buf[info.Offset[wire.HdrAtomicETH]:]).Encode(&f)
	qp.countTx(w.firstPSN, 1)
	r.psn = w.firstPSN.Add(1)
	r.noack = 0
}

// rewind restarts the requester at the oldest unacknowledged PSN
// (go-back-N, IBTA 9.7.5.1.3 / C9-118). Caller holds sq.
func (qp *QP) rewind() {
	r := &qp.req
	c := &qp.comp
	r.idx = c.idx
	r.acct = c.idx
	r.rdAtomic = 0
	r.noack = 0
	r.offset = 0
	r.psn = c.psn
	if c.idx >= qp.sq.head {
		return
	}
	w := &qp.sq.wqe[c.idx%uint64(len(qp.sq.wqe))]
	if !w.psnSet {
		return
	}
	mtu := uint64(qp.path.Load().mtu)
	switch w.wr.Opcode {
	case WRRDMARead:
		r.offset = w.readDone
		r.psn = w.firstPSN.Add(uint32(w.readDone / mtu))
	case WRAtomicCmpAndSwp, WRAtomicFetchAndAdd:
		r.psn = w.firstPSN
	default:
		k := w.firstPSN.Distance(c.psn)
		if k < 0 {
			k = 0
		}
		r.offset = uint64(k) * mtu
		if r.offset > w.length {
			r.offset = w.length
		}
		r.psn = w.firstPSN.Add(uint32(k))
	}
}

// sendWindow returns the PSNs the requester may have outstanding: the
// slow-restart window after a local ACK timeout, else the device's window
// (MaxUnackedPSNs). Caller holds sq.
func (qp *QP) sendWindow() int32 {
	if w := qp.req.restartWnd; w != 0 {
		return int32(w)
	}
	return qp.dev.maxUnacked
}

// growRestartWindow opens the slow-restart window by the PSNs acknowledged
// since it last grew (RFC 5681 3.1's slow start: one segment per segment
// acknowledged, so the window doubles each round trip); at the device's
// window (MaxUnackedPSNs) the restart is over. Caller holds sq.
func (qp *QP) growRestartWindow() {
	r := &qp.req
	if r.restartWnd == 0 {
		return
	}
	n := r.restartAcked.Distance(qp.comp.psn)
	if n <= 0 {
		return
	}
	r.restartAcked = qp.comp.psn
	if w := int64(r.restartWnd) + int64(n); w < int64(qp.dev.maxUnacked) {
		r.restartWnd = uint32(w)
	} else {
		r.restartWnd = 0
	}
}

// armTimer (re)starts the retransmit or RNR timer. Caller holds sq.
func (qp *QP) armTimer(d time.Duration) {
	if d == 0 {
		return
	}
	qp.comp.timerArmed = true
	qp.comp.deadline = time.Now().Add(d)
	qp.timer.Reset(d)
}

func (qp *QP) stopTimer() {
	qp.timer.Stop()
}

// onTimer runs when the retransmit or RNR timer fires (rxe's retransmit
// timer and rnr_nak_timer): after an RNR wait it retries; after a local ACK
// timeout without progress it retries go-back-N, or completes the oldest
// WQE with RETRY_EXC_ERR when retry_cnt is spent (7 retries forever).
func (qp *QP) onTimer() {
	qp.sq.Lock()
	c := &qp.comp
	st := qp.State()
	if st != QPStateRTS && st != QPStateSQD {
		c.timerArmed = false
		qp.sq.Unlock()
		return
	}
	if c.rnrWait {
		c.rnrWait = false
		c.timerArmed = false
		qp.rewind()
		qp.sq.Unlock()
		qp.dev.kick(qp)
		return
	}
	if c.idx >= qp.req.idx && c.psn == qp.req.psn {
		c.timerArmed = false // nothing outstanding
		qp.sq.Unlock()
		return
	}
	if left := time.Until(c.deadline); left > 0 {
		qp.timer.Reset(left)
		qp.sq.Unlock()
		return
	}
	if c.retryCnt == 0 {
		c.timerArmed = false
		qp.dev.counters.RetryExceededErr.Add(1) // before the WC, which a reader of the counter waits for
		qp.fail(qp.oldest(), WCRetryExcErr)
		qp.fatal = false
		qp.sq.Unlock()
		qp.releaseResp() // the receive WQE in use completes first
		qp.flush()
		return
	}
	if c.retryCnt != 7 {
		c.retryCnt--
	}
	qp.dev.counters.RetransmitTimeouts.Add(1)
	qp.dev.counters.CompleterRetryErr.Add(1)
	c.readRetryPending, c.nakRetryPending = false, false
	qp.rewind()
	// Slow restart (Config.SlowRestart; off by default): go-back-N resends from the oldest unacknowledged PSN
	// (IBTA 9.7.5.1.3), one packet at first, the window growing as
	// acknowledgements return. A timeout means the responder fell silent
	// or behind: a lost tail, or a receiver that drains its socket slower
	// than a window per timeout (a loaded host). Resending the whole
	// window on every expiry would queue copies of the window at such a
	// receiver faster than it drains them, until its socket holds seconds
	// of stale requests and overflows (congestion collapse). TCP restarts
	// from a loss window of one segment after its retransmission timer
	// (RFC 5681 3.1), and RoCE NICs do the same (NVIDIA ConnectX's "slow
	// restart", ROCE_ACCL roce_slow_restart_en).
	// Off by default: where the timeout is close to the round trip (an
	// --impair delay with -u 10), a false timeout restarts from one packet
	// and write-bw fell 2-7x; rxe resends the whole window.
	if qp.dev.slowRestart {
		qp.req.restartWnd, qp.req.restartAcked = 1, c.psn
	}
	c.timerArmed = false
	qp.armTimer(qp.timeoutDuration())
	qp.sq.Unlock()
	qp.dev.kick(qp)
}
