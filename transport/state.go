package transport

import (
	"github.com/softrdma/softrdma/transport/wire"
)

// RequesterState is a snapshot of a QP's requester and completer, for
// tools and for diagnosing a stuck test (in the spirit of gVisor's
// TCPSenderState). PSN names follow IBTA 9.7.
type RequesterState struct {
	State      QPState
	NextPSN    wire.PSN // next PSN the requester sends
	OldestPSN  wire.PSN // oldest PSN not acknowledged (completer)
	HighPSN    wire.PSN // one past the highest PSN ever sent
	Posted     uint64   // WQEs ever posted
	Completed  uint64   // WQEs retired
	NextWQE    uint64   // index of the WQE the requester works on
	Offset     uint64   // bytes of that WQE already sent
	RdAtomic   int      // outstanding READ/atomic WQEs counted against max_rd_atomic
	RetryCnt   uint8    // retries left
	RNRRetry   uint8    // RNR retries left
	RNRWait    bool     // waiting for an RNR timer
	TimerArmed bool
	// Oldest incomplete WQE, if any.
	OldestOp       WROpcode
	OldestFirstPSN wire.PSN
	OldestLastPSN  wire.PSN
	OldestLength   uint64
	OldestReadDone uint64
	ReadRetry      bool // a READ re-request is pending
	NAKRetry       bool // a go-back-N after a sequence NAK is pending
}

// ResponderState is a snapshot of a QP's responder. It is read without
// the receive loop's cooperation, so fields may be a moment stale.
type ResponderState struct {
	ExpectedPSN wire.PSN
	MSN         wire.MSN
	NAKSent     bool
	InMessage   bool
	LastOpcode  wire.Opcode
}

// RequesterState returns a snapshot of the requester and completer.
func (qp *QP) RequesterState() RequesterState {
	qp.sq.Lock()
	defer qp.sq.Unlock()
	s := RequesterState{
		State: qp.State(), NextPSN: qp.req.psn, OldestPSN: qp.comp.psn, HighPSN: qp.req.hiPSN,
		Posted: qp.sq.head, Completed: qp.comp.idx, NextWQE: qp.req.idx, Offset: qp.req.offset,
		RdAtomic: qp.req.rdAtomic, RetryCnt: qp.comp.retryCnt, RNRRetry: qp.comp.rnrRetry,
		RNRWait: qp.comp.rnrWait, TimerArmed: qp.comp.timerArmed,
		ReadRetry: qp.comp.readRetryPending, NAKRetry: qp.comp.nakRetryPending,
	}
	if w := qp.oldest(); w != nil {
		s.OldestOp, s.OldestFirstPSN, s.OldestLastPSN = w.wr.Opcode, w.firstPSN, w.lastPSN
		s.OldestLength, s.OldestReadDone = w.length, w.readDone
	}
	return s
}

// ResponderState returns a snapshot of the responder. It reads state the
// receive loop owns without synchronisation: use it only on an idle QP or
// for diagnostics.
func (qp *QP) ResponderState() ResponderState {
	r := &qp.resp
	return ResponderState{ExpectedPSN: r.ePSN, MSN: r.msn, NAKSent: r.nakSent, InMessage: r.inMsg, LastOpcode: r.lastOp}
}
