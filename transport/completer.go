package transport

import (
	"encoding/binary"
	"time"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/transport/wire"
)

// completeRecv runs the completer on an ACK, NAK, READ response or atomic
// ACK (rxe_completer).
func (qp *QP) completeRecv(p *wire.Packet, path *path) {
	qp.sq.Lock()
	kick := qp.completer(p, path)
	fatal := qp.fatal
	qp.fatal = false
	qp.sq.Unlock()
	if fatal {
		qp.releaseResp() // the receive WQE in use completes first
		qp.flush()
		return
	}
	if kick {
		qp.dev.kick(qp)
	}
}

// completer handles one response; caller holds sq. It returns whether the
// requester should run (the window opened or a retry starts).
func (qp *QP) completer(p *wire.Packet, path *path) bool {
	c := &qp.comp
	ctr := &qp.dev.counters
	psn := p.PSN()
	st := qp.State()
	if st != QPStateRTS && st != QPStateSQD && st != QPStateSQE {
		ctr.drop(DropBadQPState)
		return false
	}
	// A response must fall in [comp.psn, hiPSN): older ones are
	// duplicates, newer ones answer nothing we sent.
	if !qp.req.hiSet || !psn.Before(qp.req.hiPSN) {
		ctr.drop(DropGhostResponse)
		return false
	}
	if psn.Before(c.psn) {
		ctr.drop(DropDuplicateResponse)
		qp.responderAlive()
		return false
	}
	op := p.Opcode()
	switch op {
	case wire.OpAcknowledge:
		return qp.onAETH(p.AETH().Syndrome(), psn)
	case wire.OpAtomicAcknowledge:
		if !qp.ackUpTo(psn.Sub(1)) {
			return qp.impliedNAK()
		}
		w := qp.oldest()
		if w == nil || !w.psnSet || (w.wr.Opcode != WRAtomicCmpAndSwp && w.wr.Opcode != WRAtomicFetchAndAdd) || w.firstPSN != psn {
			ctr.drop(DropGhostResponse)
			return false
		}
		var v [8]byte
		binary.NativeEndian.PutUint64(v[:], p.AtomicAckETH().OrigRemoteData())
		if st := qp.dev.place.Scatter(qp.pd, w.wr.SGL, 0, v[:]); st != placement.OK {
			if st == placement.Suspended {
				qp.placementSuspended(&qp.dev.rxTx, qp.path.Load(), p, nil)
				return false
			}
			qp.fail(w, WCLocProtErr)
			return false
		}
		c.psn = psn.Add(1)
		qp.retire(w, WCSuccess)
		qp.progress()
		return true
	default: // READ responses
		if !qp.ackUpTo(psn.Sub(1)) {
			return qp.impliedNAK()
		}
		w := qp.oldest()
		if w == nil || !w.psnSet || w.wr.Opcode != WRRDMARead ||
			psn.Before(w.firstPSN) || w.lastPSN.Before(psn) {
			ctr.drop(DropGhostResponse)
			return false
		}
		mtu := uint64(path.mtu)
		want := w.firstPSN.Add(uint32(w.readDone / mtu))
		if psn != want {
			if want.Before(psn) {
				// A response was lost: ask again for the rest (IBTA
				// 9.7.5.1.? requester behaviour on a missing READ
				// response). Responses of the earlier stream keep
				// arriving after the re-request and look like gaps too,
				// so while a re-request is pending, gaps are ignored until
				// the new stream has overtaken the furthest response seen
				// when it was sent; the retransmit timer covers a lost
				// re-request.
				ctr.drop(DropPSNOutOfWindow)
				qp.responderAlive()
				if c.readRetryPending {
					if c.readRetryUntil.Before(psn) {
						c.readRetryUntil = psn
					}
					return false
				}
				ctr.RcvdSeqErr.Add(1)
				if !qp.spendRetry() {
					return false
				}
				c.readRetryPending = true
				c.readRetryUntil = psn
				return qp.retry()
			}
			ctr.drop(DropDuplicateResponse)
			qp.responderAlive()
			return false
		}
		info := p.Info
		n := uint64(len(p.Payload))
		last := info.Mask&wire.MaskLast != 0
		end := w.readDone+n == w.length
		// A LAST or ONLY ends the READ, or, once the requester asked
		// for a piece of it (slow restart, sendReadRequest), maybe only
		// a piece: whole MTUs short of the end. The piece may be an
		// earlier one than the last asked for (its responses late
		// behind a backlog); the data is placed by PSN all the same.
		if w.readDone+n > w.length || (!last && n != mtu) || (last && !end && (!w.readPiece || n != mtu)) {
			qp.fail(w, WCBadRespErr)
			return false
		}
		if n > 0 {
			if st := qp.dev.place.Scatter(qp.pd, w.wr.SGL, w.readDone, p.Payload); st != placement.OK {
				if st == placement.Suspended {
					qp.placementSuspended(&qp.dev.rxTx, qp.path.Load(), p, nil)
					return false
				}
				qp.fail(w, WCLocProtErr)
				return false
			}
		}
		w.readDone += n
		c.psn = psn.Add(1)
		qp.resetRetry() // an in-order response is progress (rxe's check_ack)
		if c.readRetryPending && !psn.Before(c.readRetryUntil) {
			c.readRetryPending = false
		}
		if last && end {
			qp.retire(w, WCSuccess)
		}
		// After the LAST of a piece progress finds nothing outstanding
		// and stops the timer; the kick sends the next piece.
		qp.progress()
		return true
	}
}

// onAETH handles an ACKNOWLEDGE packet's syndrome (IBTA 9.7.5.1 and rxe's
// check_ack).
func (qp *QP) onAETH(syn wire.Syndrome, psn wire.PSN) bool {
	c := &qp.comp
	ctr := &qp.dev.counters
	switch syn.Type() {
	case wire.TypeACK:
		if c.nakRetryPending && !psn.Before(c.nakRetryPSN) {
			c.nakRetryPending = false
		}
		if c.rnrWait && !psn.Before(c.rnrPSN) {
			// The responder accepted the packet it had RNR-NAKed (a
			// retransmission that crossed the NAK): the back-off is moot.
			// progress re-arms the timer for what is still outstanding.
			c.rnrWait = false
			defer qp.dev.kick(qp)
		}
		if !qp.ackUpTo(psn) {
			return qp.impliedNAK()
		}
		qp.resetRetry()
		// An ACK inside a READ's or atomic's PSNs acknowledges none of
		// them: their responses do (rxe's check_psn ignores it).
		if w := qp.oldest(); (w == nil || !w.psnSet || !isRdAtomic(w.wr.Opcode) || psn.Before(w.firstPSN)) &&
			c.psn.Before(psn.Add(1)) {
			c.psn = psn.Add(1)
		}
		qp.progress()
		return true
	case wire.TypeRNRNAK:
		ctr.RcvdRNRErr.Add(1)
		if !qp.ackUpTo(psn.Sub(1)) {
			return qp.impliedNAK()
		}
		c.psn = psn
		if c.rnrRetry == 0 {
			// The counter first: a test that polls the WC reads it.
			ctr.RetryRNRExceededErr.Add(1)
			qp.fail(qp.oldest(), WCRNRRetryExcErr)
			return false
		}
		if c.rnrRetry != 7 {
			c.rnrRetry--
		}
		c.rnrWait = true
		c.rnrPSN = psn
		qp.armTimer(timeDuration(wire.RNRTimerNanoseconds(syn.Value())))
		return false
	case wire.TypeNAK:
		if syn != wire.SyndromeNAKPSNSeqErr {
			qp.failAt(psn, syn)
			return false
		}
		if !qp.ackUpTo(psn.Sub(1)) {
			return qp.impliedNAK()
		}
		c.psn = psn
		if syn == wire.SyndromeNAKPSNSeqErr {
			ctr.RcvdSeqErr.Add(1)
			// A second NAK for the PSN we already went back to adds
			// nothing (the responder NAKs once per gap; a repeat comes
			// from reordered stale packets): do not resend the window
			// again. Progress past the PSN re-arms it.
			if c.nakRetryPending && c.nakRetryPSN == psn {
				return false
			}
			c.nakRetryPending, c.nakRetryPSN = true, psn
			if !qp.spendRetry() {
				return false
			}
			return qp.retry()
		}
	}
	ctr.drop(DropMalformed)
	return false
}

// failAt handles a fatal NAK (invalid request, remote access or remote
// operational error) for PSN psn: the WQEs acknowledged before it complete
// as usual, an older READ or atomic still waiting for its response is
// flushed (the responder has gone to ERR and will not answer it), the WQE
// that holds psn completes with the status the syndrome names (IBTA
// 9.7.5.2 / Table 42), and the QP goes to ERR; completions stay in order.
// A reserved NAK code (5 to 31) names no error the responder could have
// meant; it completes with WCRemOpErr, as from rxe's check_ack ("unexpected
// nak": IB_WC_REM_OP_ERR), not as an invalid request the responder did not
// report.
func (qp *QP) failAt(psn wire.PSN, syn wire.Syndrome) {
	status := WCRemOpErr
	switch syn {
	case wire.SyndromeNAKInvalidRequest:
		status = WCRemInvReqErr
	case wire.SyndromeNAKRemoteAccess:
		status = WCRemAccessErr
	case wire.SyndromeNAKRemoteOp:
		status = WCRemOpErr
	case wire.SyndromeNAKInvalidRDReq:
		status = WCRemInvRDReqErr
	}
	qp.ackUpTo(psn.Sub(1))
	qp.setError()
	for w := qp.oldest(); w != nil; w = qp.oldest() {
		if !w.psnSet || psn.Before(w.firstPSN) {
			break
		}
		st := WCWRFlushErr
		if !w.lastPSN.Before(psn) {
			st = status
		}
		qp.complete(w, st, true)
		qp.comp.idx++
		if st == status {
			break
		}
	}
	if qp.req.idx < qp.comp.idx {
		qp.req.idx = qp.comp.idx
	}
	qp.fatal = true
}

// oldest returns the oldest incomplete WQE, or nil.
func (qp *QP) oldest() *sendWQE {
	if qp.comp.idx >= qp.sq.head {
		return nil
	}
	return &qp.sq.wqe[qp.comp.idx%uint64(len(qp.sq.wqe))]
}

// ackUpTo completes the WQEs whose last PSN is at or before psn. It reports
// false when it meets a READ or atomic that has not received its response:
// an ACK beyond it means the responses were lost (an implied NAK), and the
// caller retries.
func (qp *QP) ackUpTo(psn wire.PSN) bool {
	for {
		w := qp.oldest()
		if w != nil && w.local == localDone {
			qp.retireLocal() // executed local operations have no PSN (mw.go)
			continue
		}
		if w == nil || !w.psnSet || psn.Before(w.lastPSN) {
			if w != nil && w.psnSet && !psn.Before(w.firstPSN) &&
				w.wr.Opcode != WRRDMARead && !isRdAtomic(w.wr.Opcode) && qp.comp.psn.Before(psn.Add(1)) {
				qp.comp.psn = psn.Add(1) // part of a long SEND/WRITE is acknowledged
			}
			return true
		}
		if isRdAtomic(w.wr.Opcode) {
			return false
		}
		if qp.comp.psn.Before(w.lastPSN.Add(1)) {
			qp.comp.psn = w.lastPSN.Add(1)
		}
		qp.retire(w, WCSuccess)
	}
}

// retire completes the oldest WQE and advances the completer past it.
// comp.psn must already be past the WQE's last PSN: if the requester was
// rewound to this WQE and had not resent it yet, it resumes after it.
func (qp *QP) retire(w *sendWQE, st WCStatus) {
	qp.complete(w, st, false)
	if isRdAtomic(w.wr.Opcode) && qp.req.rdAtomic > 0 && qp.comp.idx < qp.req.acct {
		qp.req.rdAtomic--
	}
	if isRdAtomic(w.wr.Opcode) {
		qp.comp.readRetryPending = false
	}
	qp.comp.idx++
	if qp.req.idx < qp.comp.idx || (qp.req.idx == qp.comp.idx && qp.req.psn.Before(qp.comp.psn)) {
		qp.req.idx, qp.req.acct, qp.req.offset = qp.comp.idx, qp.comp.idx, 0
		qp.req.psn = qp.comp.psn
	}
	if qp.req.acct < qp.comp.idx {
		qp.req.acct = qp.comp.idx
	}
	qp.resetRetry()
	qp.retireLocal() // local operations executed behind w complete now
}

// resetRetry restores retry_cnt and rnr_retry after forward progress: an
// ACK that acknowledges something new, an in-order READ response, a
// completion. The counters bound retries without progress, not the
// retries of a whole message (IBTA 9.7.5.1.3; rxe's reset_retry_counters,
// called from check_ack on every such response).
func (qp *QP) resetRetry() {
	qp.comp.retryCnt = qp.attr.RetryCnt
	qp.comp.rnrRetry = qp.attr.RNRRetry
}

// spendRetry spends one of retry_cnt for a retry that a NAK sequence
// error, an implied NAK or a gap in READ responses starts (7 is infinite).
// With none left it completes the oldest WQE with RETRY_EXC_ERR, which
// moves the QP to ERR (rxe's COMPST_ERROR_RETRY), and reports false.
func (qp *QP) spendRetry() bool {
	c := &qp.comp
	if c.retryCnt == 0 {
		qp.dev.counters.RetryExceededErr.Add(1) // before the WC, which a reader of the counter waits for
		qp.fail(qp.oldest(), WCRetryExcErr)
		return false
	}
	if c.retryCnt != 7 {
		c.retryCnt--
	}
	return true
}

// impliedNAK handles a response that acknowledges past a READ or atomic
// whose response has not arrived (IBTA 9.7.5.1: the responses were lost):
// the requester asks again from that WQE. With reordering the responses may
// only be late, so one such retry is pending at a time, until the WQE
// completes or the retransmit timer fires. Each retry spends one of
// retry_cnt, as a sequence NAK's does; with none left the WQE completes
// with RETRY_EXC_ERR and the QP goes to ERR (rxe's COMPST_ERROR_RETRY).
func (qp *QP) impliedNAK() bool {
	c := &qp.comp
	if c.readRetryPending {
		return false
	}
	if !qp.spendRetry() {
		return false
	}
	c.readRetryPending = true
	c.readRetryUntil = qp.req.hiPSN
	if w := qp.oldest(); w != nil && w.psnSet {
		c.readRetryUntil = w.lastPSN
	}
	return qp.retry()
}

// retry starts go-back-N from the oldest unacknowledged PSN.
func (qp *QP) retry() bool {
	qp.dev.counters.CompleterRetryErr.Add(1)
	qp.rewind()
	return true
}

// responderAlive pushes the retransmit deadline back when a response
// arrives that is not progress (a duplicate or an out-of-order READ
// response): the responder is still answering an earlier request, and a
// timeout now would only ask it to send the same data again, which under
// load feeds on itself. The retry counter is not reset.
func (qp *QP) responderAlive() {
	if qp.comp.timerArmed {
		if d := qp.timeoutDuration(); d != 0 {
			qp.comp.deadline = time.Now().Add(d)
		}
	}
}

// progress re-arms or stops the retransmit timer after forward progress,
// and opens the slow-restart window.
func (qp *QP) progress() {
	if r := &qp.req; r.idx == qp.comp.idx && r.psn.Before(qp.comp.psn) {
		// The requester was rewound (a timeout or a NAK) and this
		// acknowledges past where it stands: a response to an earlier
		// copy, late behind a backlog. Those PSNs are acknowledged; it
		// resumes after them instead of sending them again (retire does
		// the same when a whole WQE completes).
		qp.rewind()
	}
	qp.growRestartWindow()
	if qp.comp.idx >= qp.sq.head || (qp.comp.idx >= qp.req.idx && qp.comp.psn == qp.req.psn) {
		if qp.comp.timerArmed {
			qp.comp.timerArmed = false
			qp.timer.Stop()
		}
		// Nothing outstanding: no RNR wait can be pending either (the
		// stopped timer would never end it, and the next WR would wait
		// forever).
		qp.comp.rnrWait = false
		return
	}
	qp.armTimer(qp.timeoutDuration())
}

func timeDuration(ns int64) time.Duration { return time.Duration(ns) }
