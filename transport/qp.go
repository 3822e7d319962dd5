package transport

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/wire"
)

// Implementation limits.
const (
	// MaxSGE is the most SGEs a WR may carry (ibv_device_attr.max_sge).
	MaxSGE = 32
	// MaxInline is the largest max_inline_data a QP may ask for, in bytes.
	MaxInline = 1024
	// MaxQPWR is the largest send or receive queue, in WRs.
	MaxQPWR = 1 << 16
	// MaxRdAtomic is the most outstanding READ/atomic requests per QP, as
	// initiator or as target (ibv_device_attr.max_qp_rd_atom).
	MaxRdAtomic = 128
	// MaxUnackedPSNs bounds the PSNs a requester may have outstanding: a
	// window, so that a fast sender cannot overrun the receiver's socket
	// buffer (64 MiB holds 16k packets of 4 KiB; 1024 leaves room for many
	// QPs). READ responses count: a READ reserves one PSN per response.
	// At MTU 4096 the window is 4 MiB: 1.4 ms of write-bw at 2.9 GB/s,
	// more than an ACK's round trip through two receive loops on a busy
	// host. With 256 (1 MiB) the requester waited for ACKs: write-bw at
	// 64 KiB over loopback 2.76-2.84 GB/s against 2.97-3.55 with 1024 and
	// 2.78-2.94 with 512, same run (docs/performance.md, "Session 12"),
	// while the two-host test under 1 % loss took as long with either.
	MaxUnackedPSNs = 1024
	// AckEveryNPackets makes the requester set AckReq on every Nth packet
	// of a long message as well as on the last, so the window keeps moving
	// (rxe: RXE_MAX_PKT_PER_ACK).
	AckEveryNPackets = 64
	// maxOutstandingPSNs bounds the PSNs outstanding at once (a READ's
	// responses included), exclusive: the signed 24-bit PSN distance
	// orders only PSNs less than 2^23 apart.
	maxOutstandingPSNs = 1 << 23
	// requesterBudget is the number of packets one requester run may send
	// before yielding to other QPs.
	requesterBudget = 128
)

// AttrMask selects the QPAttr fields Modify applies (enum ibv_qp_attr_mask).
type AttrMask uint32

// Attribute mask bits, libibverbs values.
const (
	QPAttrState            AttrMask = 1 << 0
	QPAttrCurState         AttrMask = 1 << 1
	QPAttrEnSQDAsyncNotify AttrMask = 1 << 2
	QPAttrAccessFlags      AttrMask = 1 << 3
	QPAttrPKeyIndex        AttrMask = 1 << 4
	QPAttrPort             AttrMask = 1 << 5
	QPAttrQKey             AttrMask = 1 << 6
	QPAttrAV               AttrMask = 1 << 7
	QPAttrPathMTU          AttrMask = 1 << 8
	QPAttrTimeout          AttrMask = 1 << 9
	QPAttrRetryCnt         AttrMask = 1 << 10
	QPAttrRNRRetry         AttrMask = 1 << 11
	QPAttrRQPSN            AttrMask = 1 << 12
	QPAttrMaxQPRdAtomic    AttrMask = 1 << 13
	QPAttrMinRNRTimer      AttrMask = 1 << 15
	QPAttrSQPSN            AttrMask = 1 << 16
	QPAttrMaxDestRdAtomic  AttrMask = 1 << 17
	QPAttrDestQPN          AttrMask = 1 << 20
)

// attrNamed is every attribute mask bit this package defines; Modify
// ignores the others (alternate path, path migration).
const attrNamed = QPAttrState | QPAttrCurState | QPAttrEnSQDAsyncNotify | QPAttrAccessFlags | QPAttrPKeyIndex | QPAttrPort |
	QPAttrQKey | QPAttrAV | QPAttrPathMTU | QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry | QPAttrRQPSN |
	QPAttrMaxQPRdAtomic | QPAttrMinRNRTimer | QPAttrSQPSN | QPAttrMaxDestRdAtomic | QPAttrDestQPN

var attrNames = map[AttrMask]string{
	QPAttrState: "IBV_QP_STATE", QPAttrCurState: "IBV_QP_CUR_STATE",
	QPAttrEnSQDAsyncNotify: "IBV_QP_EN_SQD_ASYNC_NOTIFY", QPAttrAccessFlags: "IBV_QP_ACCESS_FLAGS",
	QPAttrPKeyIndex: "IBV_QP_PKEY_INDEX", QPAttrPort: "IBV_QP_PORT", QPAttrQKey: "IBV_QP_QKEY", QPAttrAV: "IBV_QP_AV",
	QPAttrPathMTU: "IBV_QP_PATH_MTU", QPAttrTimeout: "IBV_QP_TIMEOUT",
	QPAttrRetryCnt: "IBV_QP_RETRY_CNT", QPAttrRNRRetry: "IBV_QP_RNR_RETRY",
	QPAttrRQPSN: "IBV_QP_RQ_PSN", QPAttrMaxQPRdAtomic: "IBV_QP_MAX_QP_RD_ATOMIC",
	QPAttrMinRNRTimer: "IBV_QP_MIN_RNR_TIMER", QPAttrSQPSN: "IBV_QP_SQ_PSN",
	QPAttrMaxDestRdAtomic: "IBV_QP_MAX_DEST_RD_ATOMIC", QPAttrDestQPN: "IBV_QP_DEST_QPN",
}

// QPAttr holds QP attributes (struct ibv_qp_attr, the fields RC, UC and
// UD use).
type QPAttr struct {
	State QPState // qp_state: Modify moves the QP to it (QPAttrState); Attr reports the current state
	// CurState is cur_qp_state. In Modify (QPAttrCurState, which only
	// RTR -> RTS, RTS -> RTS, SQD -> RTS and SQE -> RTS take) it is the
	// state the caller believes the QP is in: Modify fails with
	// ErrBadTransition, changing nothing, if the QP is in another one
	// (for example one that the engine moved to ERR, or SQE, since the
	// caller last looked). Attr reports the current state in it, as in
	// State (rxe_qp_to_attr, Linux commit 775e6d3c8fda "Set queue pair
	// cur_qp_state when being queried"; mlx4, mlx5).
	CurState    QPState
	AccessFlags stag.Access    // qp_access_flags: REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC
	PKeyIndex   uint16         // only index 0 (P_Key 0xffff) exists
	Port        uint8          // only port 1 exists
	Dest        netip.AddrPort // ah_attr: the peer's IP (its GID) and UDP port (4791 if 0)
	PathMTU     MTU            // path_mtu
	Timeout     uint8          // local ACK timeout: 4.096 µs × 2^Timeout, 0 = infinite (IBTA 9.7.6.1.3)
	RetryCnt    uint8          // retries on timeout or NAK; 7 = retry forever (as rxe does)
	RNRRetry    uint8          // retries on RNR NAK; 7 = retry forever (IBTA 9.7.5.2.8)
	// RQPSN is rq_psn. Modify (QPAttrRQPSN, on INIT -> RTR) sets the
	// responder's first expected PSN; Attr reports the PSN it expects
	// next, which moves with every request taken (rxe_qp_to_attr:
	// qp->resp.psn); on UD, which checks no PSN, one past the last
	// datagram received (0 before the first, as in rxe).
	RQPSN wire.PSN
	// SQPSN is sq_psn. Modify (QPAttrSQPSN, on RTR -> RTS) sets the
	// requester's first PSN; Attr reports the PSN it sends next, which
	// moves with every packet sent and back on a retransmission
	// (rxe_qp_to_attr: qp->req.psn; IBTA 9.7.1).
	SQPSN           wire.PSN
	MaxRdAtomic     uint8    // max_rd_atomic: outstanding READ/atomic as initiator
	MaxDestRdAtomic uint8    // max_dest_rd_atomic: as target
	MinRNRTimer     uint8    // min_rnr_timer, encoded (IBTA Table 45)
	DestQPN         wire.QPN // dest_qp_num
	QKey            uint32   // qkey: UD, the Q_Key datagrams must carry (IBTA 10.2.5)
	// FlowLabel is ah_attr.grh.flow_label (20 bits), set with QPAttrAV.
	// RoCEv2 packets carry no GRH; rxe derives the QP's UDP source port
	// from it (wire.SourcePort; 0: from the two QPNs), and so does the
	// device by default (Config.SourcePort).
	FlowLabel uint32
	// EnSQDAsyncNotify is en_sqd_async_notify (QPAttrEnSQDAsyncNotify,
	// which only RTS -> SQD takes): raise EventSQDrained once the send
	// queue has drained. Without it the drain raises no event
	// (IBTA 11.2.5.3 and 11.6.3.1; mlx4, mlx5 and mthca ask the device
	// for the event only then; rxe raises it always). Attr reports the
	// value last set.
	EnSQDAsyncNotify bool
	// SQDraining is ibv_qp_attr.sq_draining, filled by Attr: the QP is in
	// SQD and its send queue has not drained yet (rxe_qp_to_attr): RTS
	// is entered again only after the drain. Modify ignores it.
	SQDraining bool
}

// qpAccess is every flag qp_access_flags may hold (rxe
// RXE_ACCESS_SUPPORTED_QP, which rxe_qp_chk_attr checks): the MR flags
// but ZERO_BASED and HUGETLB, that is LOCAL_WRITE, the REMOTE_* flags,
// MW_BIND, ON_DEMAND, FLUSH_GLOBAL and FLUSH_PERSISTENT (1<<8, 1<<9), and
// the optional range (IBV_ACCESS_OPTIONAL_RANGE, bits 20-29: RELAXED_
// ORDERING), which a device may ignore. Only the REMOTE_* flags act on a
// QP.
const qpAccess = stag.AccessLocalWrite | stag.AccessRemote | stag.AccessMWBind | stag.AccessOnDemand |
	1<<8 | 1<<9 | 0x3ff00000

// required lists, per transition, the attributes ib_modify_qp_is_ok
// (IBTA 10.3.1, Table 91 "QP state transition properties") demands for RC.
var required = map[[2]QPState]AttrMask{
	{QPStateReset, QPStateInit}: QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags,
	{QPStateInit, QPStateRTR}: QPAttrAV | QPAttrPathMTU | QPAttrDestQPN | QPAttrRQPSN |
		QPAttrMaxDestRdAtomic | QPAttrMinRNRTimer,
	{QPStateRTR, QPStateRTS}: QPAttrSQPSN | QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry |
		QPAttrMaxQPRdAtomic,
}

// optional lists, per QP type and transition, the attributes Table 91
// allows besides the required ones (ib_modify_qp_is_ok's opt_param, for
// the attributes this package has); a transition not listed takes none
// (to RESET and to ERR among them).
var optional = map[QPType]map[[2]QPState]AttrMask{
	QPTypeRC: {
		{QPStateInit, QPStateInit}: QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags,
		{QPStateInit, QPStateRTR}:  QPAttrAccessFlags | QPAttrPKeyIndex,
		{QPStateRTR, QPStateRTS}:   QPAttrCurState | QPAttrAccessFlags | QPAttrMinRNRTimer,
		{QPStateRTS, QPStateRTS}:   QPAttrCurState | QPAttrAccessFlags | QPAttrMinRNRTimer,
		{QPStateSQD, QPStateRTS}:   QPAttrCurState | QPAttrAccessFlags | QPAttrMinRNRTimer,
		{QPStateRTS, QPStateSQD}:   QPAttrEnSQDAsyncNotify,
		{QPStateSQD, QPStateSQD}: QPAttrPort | QPAttrAV | QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry |
			QPAttrMaxQPRdAtomic | QPAttrMaxDestRdAtomic | QPAttrAccessFlags | QPAttrPKeyIndex | QPAttrMinRNRTimer,
	},
	QPTypeUC: {
		{QPStateInit, QPStateInit}: QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags,
		{QPStateInit, QPStateRTR}:  QPAttrAccessFlags | QPAttrPKeyIndex,
		{QPStateRTR, QPStateRTS}:   QPAttrCurState | QPAttrAccessFlags,
		{QPStateRTS, QPStateRTS}:   QPAttrCurState | QPAttrAccessFlags,
		{QPStateRTS, QPStateSQD}:   QPAttrEnSQDAsyncNotify,
		{QPStateSQD, QPStateRTS}:   QPAttrCurState | QPAttrAccessFlags,
		{QPStateSQD, QPStateSQD}:   QPAttrAV | QPAttrAccessFlags | QPAttrPKeyIndex,
		{QPStateSQE, QPStateRTS}:   QPAttrCurState | QPAttrAccessFlags,
	},
	QPTypeUD: {
		{QPStateInit, QPStateInit}: QPAttrPKeyIndex | QPAttrPort | QPAttrQKey,
		{QPStateInit, QPStateRTR}:  QPAttrPKeyIndex | QPAttrQKey,
		{QPStateRTR, QPStateRTS}:   QPAttrCurState | QPAttrQKey,
		{QPStateRTS, QPStateRTS}:   QPAttrCurState | QPAttrQKey,
		{QPStateRTS, QPStateSQD}:   QPAttrEnSQDAsyncNotify,
		{QPStateSQD, QPStateRTS}:   QPAttrCurState | QPAttrQKey,
		{QPStateSQD, QPStateSQD}:   QPAttrPKeyIndex | QPAttrQKey,
		{QPStateSQE, QPStateRTS}:   QPAttrCurState | QPAttrQKey,
	},
}

// allowed is the set of legal transitions (IBTA 10.3.1 Figure 125);
// any state may also go to RESET or ERR.
var allowed = map[[2]QPState]bool{
	{QPStateReset, QPStateInit}: true, {QPStateInit, QPStateInit}: true,
	{QPStateInit, QPStateRTR}: true, {QPStateRTR, QPStateRTS}: true,
	{QPStateRTS, QPStateRTS}: true, {QPStateRTS, QPStateSQD}: true,
	{QPStateSQD, QPStateSQD}: true, {QPStateSQD, QPStateRTS}: true,
	{QPStateSQE, QPStateRTS}: true,
}

// QPInitAttr configures CreateQP (struct ibv_qp_init_attr).
type QPInitAttr struct {
	SendCQ, RecvCQ *CQ
	Cap            Cap
	Type           QPType // QPTypeRC, QPTypeUC or QPTypeUD
	SQSigAll       bool   // every send WR generates a completion
}

// QP is a queue pair: reliable connected, unreliable connected (uc.go) or
// unreliable datagram (ud.go).
type QP struct {
	// destroyed is set by DestroyQP: posts then fail with ErrBadQP.
	destroyed atomic.Bool
	// held counts this QP's packets in the device's hold queue (receive
	// loop only); while it is not zero, every packet of the QP is held
	// behind them (RC places in PSN order). pausedGen is the number of the
	// latest suspension that held or NAKed one of its packets.
	held      int
	pausedGen atomic.Uint64
	// pausedCounted is the number of the last suspension whose Resume
	// counted this QP (guarded by the device's susp.pausedMu).
	pausedCounted uint64
	// delayedPSN is the newest PSN counted in the bytes delayed by
	// suspensions (receive loop only).
	delayedPSN wire.PSN
	delayedSet bool

	dev    *Device
	qpn    wire.QPN
	typ    QPType
	pd     uint32
	sendCQ *CQ
	recvCQ *CQ
	cap    Cap
	sigAll bool

	state atomic.Uint32 // QPState; written under sq.mu and rq.mu

	// attr is written by Modify under sq.mu and rq.mu; read under either.
	attr     QPAttr
	modifyMu sync.Mutex // serializes Modify
	// path is what the data path reads of attr, published atomically by
	// Modify so that the receive loop needs no lock.
	path atomic.Pointer[path]
	// src is the UDP source port state (sport.go); guarded by modifyMu.
	src qpSource

	sq struct {
		sync.Mutex
		wqe  []sendWQE // ring of cap.MaxSendWR slots (one if that is 0)
		head uint64    // next slot to post
		// req (requester) and comp (completer) below are guarded by this
		// lock too.
	}
	req   reqState  // guarded by sq
	fatal bool      // guarded by sq: move to ERR once sq is unlocked
	comp  compState // guarded by sq
	local localWait // guarded by sq: an invalidation to wait for after unlocking (mw.go)

	rq struct {
		sync.Mutex
		wqe  []recvWQE // ring of cap.MaxRecvWR slots (one if that is 0)
		head uint64    // next slot to post
		tail uint64    // oldest posted, not yet consumed
	}

	// respMu is held by the receive loop while it runs the responder, and
	// by whoever releases the responder's cursors from outside it (Modify
	// to RESET or ERR, DestroyQP, errors). Lock order: respMu, sq, rq.
	respMu sync.Mutex
	resp   respState // guarded by respMu (in practice: the receive loop)
	// recvHeld mirrors resp.haveRecv for flush, which runs without
	// respMu: the responder holds a receive WQE it took from rq (set by
	// popRecv under rq, cleared once the WQE's completion is queued).
	recvHeld atomic.Bool

	// commEst is set when the QP raised EventCommEst (its first request
	// packet in RTR); cleared by RESET.
	commEst atomic.Bool
	// sqDraining is set by Modify to SQD until the send queue has drained
	// (or the QP leaves SQD). Guarded by sq.
	sqDraining bool
	// sqdNotify: the Modify to SQD asked for EventSQDrained
	// (en_sqd_async_notify). Guarded by sq.
	sqdNotify bool
	ev        eventCount // guarded by the device's events.mu (async.go)

	scheduled atomic.Bool // on the send worker's run queue
	timer     *time.Timer // retransmit / RNR timer; fires qp.onTimer
	timerGen  atomic.Uint64
}

// path holds the attributes the data path reads; immutable once published.
type path struct {
	dest        netip.AddrPort // peer IP (its GID) and UDP port
	destQPN     wire.QPN
	mtu         int         // path MTU in bytes
	access      stag.Access // qp_access_flags
	minRNRTimer uint8
	qkey        uint32 // UD: the QP's Q_Key
	sport       uint16 // UDP source port of the QP's packets; 0: the device's own
}

// sendWQE is one send queue entry. sgl and inline are preallocated per
// slot so that posting allocates nothing.
type sendWQE struct {
	wr       SendWR
	sgl      []SGE  // backing for wr.SGL (cap.MaxSendSGE)
	inline   []byte // backing for inline data (cap.MaxInlineData)
	isInline bool
	length   uint64 // total bytes of the message
	npkts    uint32 // packets (or READ response packets)
	firstPSN wire.PSN
	lastPSN  wire.PSN
	psnSet   bool // firstPSN/lastPSN assigned
	done     bool // completed (by ACK or response)
	status   WCStatus
	readDone uint64     // READ: response bytes placed so far
	local    localState // LOCAL_INV, REG_MR, BIND_MW: executed? (mw.go)
	// readPiece: a READ request for only part of what this READ has not
	// received was sent (slow restart, sendReadRequest), so a response
	// LAST or ONLY may end before the READ does.
	readPiece bool
}

type recvWQE struct {
	wrid   uint64
	sgl    []SGE
	nsge   int
	length uint64
}

// reqState is the requester's state (rxe qp->req). Guarded by sq.
type reqState struct {
	idx      uint64   // next WQE to send from
	offset   uint64   // bytes of WQE idx already sent
	psn      wire.PSN // next PSN to send (IBTA 9.7.1: the requester's current PSN)
	noack    int      // packets sent since the last AckReq
	acct     uint64   // next WQE whose fence and credit checks have not run in this pass
	rdAtomic int      // READ/atomic WQEs in [comp.idx, idx) not yet completed
	hiPSN    wire.PSN // one past the highest PSN ever sent (for counting retransmissions)
	hiSet    bool
	// restartWnd is the slow-restart window after a local ACK timeout:
	// the PSNs the requester may have outstanding, from 1 after the
	// timeout, growing by the PSNs each acknowledgement covers, until it
	// reaches MaxUnackedPSNs and 0 again (no limit but the window). See
	// onTimer.
	restartWnd uint32
	// restartAcked is comp.psn when restartWnd last grew.
	restartAcked wire.PSN
}

// compState is the completer's state (rxe qp->comp). Guarded by sq.
type compState struct {
	idx      uint64    // oldest WQE not completed
	psn      wire.PSN  // oldest PSN not acknowledged
	retryCnt uint8     // retries left (7 = forever)
	rnrRetry uint8     // RNR retries left (7 = forever)
	rnrWait  bool      // waiting for the RNR timer
	rnrPSN   wire.PSN  // the PSN the RNR NAK named
	deadline time.Time // when the armed timer expires without progress
	// readRetryPending: a READ re-request was sent and the responses of
	// the earlier stream, up to readRetryUntil, may still arrive.
	readRetryPending bool
	readRetryUntil   wire.PSN
	// nakRetryPending: the requester went back to nakRetryPSN after a PSN
	// sequence error NAK and has not been acknowledged past it yet.
	nakRetryPending bool
	nakRetryPSN     wire.PSN
	timerArmed      bool
}

// respState is the responder's state (rxe qp->resp). Owned by the receive loop.
type respState struct {
	ePSN      wire.PSN    // expected PSN (IBTA 9.7.4.1)
	msn       wire.MSN    // messages completed (IBTA 9.7.5.1.2)
	nakSent   bool        // a PSN sequence error NAK was sent for the current gap
	lastOp    wire.Opcode // opcode of the last in-order request, for sequence checks
	inMsg     bool        // inside a multi-packet SEND or WRITE
	recv      recvWQE     // the receive WQE a SEND is filling
	haveRecv  bool
	recvOff   uint64
	wcStatus  WCStatus         // error to report for the current SEND (e.g. LocLenErr)
	wqeErr    bool             // the current request's error completed its receive WQE (finishRecv); respError clears it
	cur       placement.Cursor // the RDMA WRITE in progress
	readCur   placement.Cursor // READ responses being sent
	wlen      uint64           // WRITE: DMA length of the current message
	wdone     uint64           // WRITE: bytes placed
	res       []rdRes          // READ/atomic resources (max_dest_rd_atomic), a ring
	resNext   int
	ackPend   bool // an ACK is owed, coalesced until the end of the receive batch
	ackPSN    wire.PSN
	inAckList bool
	dropMsg   bool // UC: a packet of the current message was lost; drop until the next FIRST or ONLY (rxe drop_msg)
}

// rdRes remembers an executed READ or atomic so that a duplicate request is
// answered again without executing it twice (IBTA 9.7.5.1.4, o9-31).
type rdRes struct {
	valid    bool
	atomic   bool
	firstPSN wire.PSN
	lastPSN  wire.PSN
	va       uint64
	rkey     uint32
	length   uint64
	orig     uint64 // atomic: original value
	msn      wire.MSN
}

// QPN returns the QP number.
func (qp *QP) QPN() wire.QPN { return qp.qpn }

// State returns the current state.
func (qp *QP) State() QPState { return QPState(qp.state.Load()) }

// Cap returns the queue capacities.
func (qp *QP) Cap() Cap { return qp.cap }

// Attr returns the QP's attributes (ibv_query_qp): those last set by
// Modify, with the current state in State and CurState, the live PSNs in
// SQPSN (the next the requester sends) and RQPSN (the next the responder
// expects), and SQDraining, as rxe_qp_to_attr reports them. Before any
// traffic the PSNs are the ones Modify set.
func (qp *QP) Attr() QPAttr {
	// Lock order respMu, sq: the responder's expected PSN is the receive
	// loop's, under respMu; the requester's is under sq.
	qp.respMu.Lock()
	defer qp.respMu.Unlock()
	qp.sq.Lock()
	defer qp.sq.Unlock()
	a := qp.attr
	a.State = qp.State()
	a.CurState = a.State
	a.SQPSN = qp.req.psn
	a.RQPSN = qp.resp.ePSN
	a.SQDraining = qp.sqDraining && a.State == QPStateSQD
	return a
}

// Modify changes attributes and state (ibv_modify_qp). The transition must
// be legal (IBTA 10.3.1; ERR is entered from any state but RESET) and
// carry the attributes Table 91 requires and no attribute it neither
// requires nor allows for the QP's type (the checks of the kernel's
// ib_modify_qp_is_ok, which rxe answers with EINVAL: for example an RC
// QP's address vector changes in RTR or SQD, not in RTS). Without
// QPAttrState in mask the transition is from the current state to itself,
// which must be a transition too (none from RTR or SQE). While the send
// queue drains (SQDraining), SQD is left only for ERR or RESET. With
// QPAttrCurState, attr.CurState must be the QP's current state.
// Errors are ErrBadTransition and ErrBadAttr, wrapped with the missing or
// refused attribute's libibverbs name; a refused Modify changes nothing.
func (qp *QP) Modify(attr *QPAttr, mask AttrMask) error {
	if attr == nil {
		return fmt.Errorf("%w: nil attributes", ErrBadAttr)
	}
	if qp.destroyed.Load() {
		return fmt.Errorf("%w: modify QP %d after DestroyQP", ErrBadQP, qp.qpn)
	}
	qp.modifyMu.Lock()
	defer qp.modifyMu.Unlock()
	cur := qp.State()
	next := cur
	if mask&QPAttrState != 0 {
		next = attr.State
	}
	if mask&QPAttrCurState != 0 && attr.CurState != cur {
		// cur_qp_state asserts the state the caller believes the QP is
		// in (IBTA 11.2.5.3 "Current QP state"); a device asked for a
		// transition from another state refuses it with EINVAL (mthca,
		// mlx4: the firmware's modify from cur_qp_state fails). rxe
		// instead checks the transition as if from cur_qp_state and
		// applies it to whatever state the QP is in.
		return fmt.Errorf("%w: cur_qp_state %v, but the QP is in %v", ErrBadTransition, attr.CurState, cur)
	}
	if qp.dev.closed.Load() && next != QPStateReset && next != QPStateErr {
		return fmt.Errorf("%w: modify QP to %v", ErrClosed, next)
	}
	if next == QPStateErr && cur == QPStateReset && mask&QPAttrState != 0 {
		// ERR is entered from any state but RESET (ib_modify_qp_is_ok).
		return fmt.Errorf("%w: %v -> %v", ErrBadTransition, cur, next)
	}
	if next != QPStateReset && next != QPStateErr {
		// Without QPAttrState the transition is cur -> cur, which must
		// be one too: RTR -> RTR and SQE -> SQE are none, so a Modify of
		// an RTR QP that names no state fails even with an empty mask
		// (ib_modify_qp_is_ok: qp_state_table[cur][cur].valid).
		if !allowed[[2]QPState{cur, next}] {
			return fmt.Errorf("%w: %v -> %v", ErrBadTransition, cur, next)
		}
		if req := qp.requiredAttrs(cur, next); mask&req != req {
			for b := AttrMask(1); b != 0; b <<= 1 {
				if req&b != 0 && mask&b == 0 {
					return fmt.Errorf("%w: %v -> %v needs %s", ErrBadAttr, cur, next, attrNames[b])
				}
			}
		}
	}
	// Every attribute named must be one the transition takes (a Modify
	// without a state is the transition to the current state), as
	// ib_modify_qp_is_ok checks: sq_psn in RTS, say, would move the
	// requester's PSN under its outstanding requests.
	if extra := mask & attrNamed &^ (QPAttrState | qp.requiredAttrs(cur, next) | optional[qp.typ][[2]QPState{cur, next}]); extra != 0 {
		for b := AttrMask(1); b != 0; b <<= 1 {
			if extra&b != 0 {
				return fmt.Errorf("%w: %v -> %v does not take %s", ErrBadAttr, cur, next, attrNames[b])
			}
		}
	}
	if mask&QPAttrAccessFlags != 0 && attr.AccessFlags&^qpAccess != 0 {
		return fmt.Errorf("%w: qp_access_flags %#x has flags a QP does not take (%#x)", ErrBadAttr,
			uint32(attr.AccessFlags), uint32(attr.AccessFlags&^qpAccess))
	}
	if mask&QPAttrPathMTU != 0 && attr.PathMTU.Bytes() == 0 {
		return fmt.Errorf("%w: path MTU code %d (want 1-5)", ErrBadAttr, attr.PathMTU)
	}
	if mask&QPAttrPKeyIndex != 0 && attr.PKeyIndex != 0 {
		return fmt.Errorf("%w: P_Key index %d (only 0 exists)", ErrBadAttr, attr.PKeyIndex)
	}
	if mask&QPAttrPort != 0 && attr.Port != 1 {
		return fmt.Errorf("%w: port %d (only port 1 exists)", ErrBadAttr, attr.Port)
	}
	if mask&QPAttrAV != 0 && !attr.Dest.Addr().IsValid() {
		return fmt.Errorf("%w: address vector has no destination address", ErrBadAttr)
	}
	if mask&QPAttrAV != 0 {
		// A device speaks one IP family (its GID's): an IPv4 destination
		// (or IPv4-mapped GID) cannot be reached from an IPv6 device and
		// the other way round (rxe: no route / EINVAL on modify).
		local := qp.dev.conn.LocalAddr().Addr()
		if dst := attr.Dest.Addr().Unmap(); dst.Is4() != local.Unmap().Is4() {
			return fmt.Errorf("%w: destination %v is %s but the device is bound to %v", ErrBadAttr,
				attr.Dest, map[bool]string{true: "IPv4", false: "IPv6"}[dst.Is4()], local)
		}
	}
	if mask&QPAttrAV != 0 && attr.FlowLabel > wire.FlowLabelMask {
		return fmt.Errorf("%w: flow label %#x is wider than 20 bits", ErrBadAttr, attr.FlowLabel)
	}
	if mask&QPAttrRetryCnt != 0 && attr.RetryCnt > 7 || mask&QPAttrRNRRetry != 0 && attr.RNRRetry > 7 {
		return fmt.Errorf("%w: retry_cnt and rnr_retry are 3-bit values (0-7)", ErrBadAttr)
	}
	if mask&QPAttrMinRNRTimer != 0 && attr.MinRNRTimer > 31 {
		return fmt.Errorf("%w: min_rnr_timer is a 5-bit code (0-31)", ErrBadAttr)
	}
	if mask&QPAttrTimeout != 0 && attr.Timeout > 31 {
		return fmt.Errorf("%w: timeout is a 5-bit exponent (0-31)", ErrBadAttr)
	}
	if mask&QPAttrMaxQPRdAtomic != 0 && int(attr.MaxRdAtomic) > MaxRdAtomic ||
		mask&QPAttrMaxDestRdAtomic != 0 && int(attr.MaxDestRdAtomic) > MaxRdAtomic {
		return fmt.Errorf("%w: max_rd_atomic above the device limit %d", ErrBadAttr, MaxRdAtomic)
	}

	if mask&QPAttrState != 0 && cur == QPStateSQD && next != QPStateErr && next != QPStateReset && qp.draining() {
		// While the send queue drains, SQD is left only for ERR (rxe
		// rxe_qp_chk_attr: sq_draining and a new state other than ERR
		// is EINVAL; IBTA 10.3.1: the attributes are changed and RTS
		// entered again once the SQ Drained event has come). RESET, the
		// other transition from any state, is taken too.
		return fmt.Errorf("%w: %v -> %v while the send queue drains", ErrBadTransition, cur, next)
	}

	// The responder's state changes only once the Modify is known to
	// succeed: a refused one changes nothing, a message in progress
	// included.
	if mask&QPAttrState != 0 && (next == QPStateReset || next == QPStateErr) {
		// The responder's cursors go with the state (lock order respMu,
		// sq, rq).
		qp.respMu.Lock()
		defer qp.respMu.Unlock()
		qp.releaseRespLocked()
	} else if mask&(QPAttrMaxDestRdAtomic|QPAttrRQPSN) != 0 {
		// They change the responder's state, which the receive loop
		// uses under respMu: in SQD (SQD -> SQD may change
		// max_dest_rd_atomic) the responder is running.
		qp.respMu.Lock()
		defer qp.respMu.Unlock()
	}

	// The UDP source port (sport.go): rxe's changes with an address
	// vector (rxe_modify_qp, after the other attributes, so with this
	// call's destination QPN); a QP that may send holds its port, one
	// reset gives it up. Decided before sq and rq are locked: holding a
	// new port may bind a socket.
	if mask&QPAttrAV != 0 && qp.typ != QPTypeUD {
		dqpn := qp.path.Load().destQPN // Attr would take respMu, which may be held
		if mask&QPAttrDestQPN != 0 {
			dqpn = attr.DestQPN & wire.QPNMask
		}
		qp.src.rxe = wire.SourcePort(attr.FlowLabel, qp.qpn, dqpn)
	}
	sport := qp.path.Load().sport
	switch {
	case sendingState(next):
		sport = qp.chooseSourcePort()
	case next == QPStateReset:
		qp.releaseSourcePort()
		sport = 0
	}

	var flush bool
	qp.sq.Lock()
	qp.rq.Lock()
	np := *qp.path.Load()
	np.sport = sport
	a := &qp.attr
	if mask&QPAttrAccessFlags != 0 {
		a.AccessFlags = attr.AccessFlags
		np.access = attr.AccessFlags
	}
	if mask&QPAttrAV != 0 {
		a.Dest = attr.Dest
		a.FlowLabel = attr.FlowLabel
		if a.Dest.Port() == 0 {
			a.Dest = netip.AddrPortFrom(a.Dest.Addr(), wire.RoCEv2Port)
		}
		np.dest = netip.AddrPortFrom(a.Dest.Addr().Unmap(), a.Dest.Port())
	}
	if mask&QPAttrPathMTU != 0 {
		a.PathMTU = attr.PathMTU
		np.mtu = attr.PathMTU.Bytes()
	}
	if mask&QPAttrTimeout != 0 {
		a.Timeout = attr.Timeout
	}
	if mask&QPAttrRetryCnt != 0 {
		a.RetryCnt = attr.RetryCnt
		qp.comp.retryCnt = attr.RetryCnt
	}
	if mask&QPAttrRNRRetry != 0 {
		a.RNRRetry = attr.RNRRetry
		qp.comp.rnrRetry = attr.RNRRetry
	}
	if mask&QPAttrRQPSN != 0 {
		a.RQPSN = attr.RQPSN & wire.PSNMask
		qp.resp.ePSN = a.RQPSN
	}
	if mask&QPAttrSQPSN != 0 {
		a.SQPSN = attr.SQPSN & wire.PSNMask
		qp.req.psn = a.SQPSN
		qp.comp.psn = a.SQPSN
	}
	if mask&QPAttrMaxQPRdAtomic != 0 {
		a.MaxRdAtomic = attr.MaxRdAtomic
	}
	if mask&QPAttrMaxDestRdAtomic != 0 {
		a.MaxDestRdAtomic = attr.MaxDestRdAtomic
		// None with 0: READ and atomic requests are then NAKed
		// (respond, CHK_RESOURCE).
		qp.resp.res = make([]rdRes, attr.MaxDestRdAtomic)
		qp.resp.resNext = 0
	}
	if mask&QPAttrMinRNRTimer != 0 {
		a.MinRNRTimer = attr.MinRNRTimer
		np.minRNRTimer = attr.MinRNRTimer
	}
	if mask&QPAttrDestQPN != 0 {
		a.DestQPN = attr.DestQPN & wire.QPNMask
		np.destQPN = a.DestQPN
	}
	if mask&QPAttrQKey != 0 {
		a.QKey = attr.QKey
		np.qkey = attr.QKey
	}
	if mask&QPAttrEnSQDAsyncNotify != 0 {
		a.EnSQDAsyncNotify = attr.EnSQDAsyncNotify
	}
	qp.path.Store(&np)
	if mask&QPAttrState != 0 {
		switch next {
		case QPStateReset:
			qp.resetLocked()
		case QPStateErr:
			flush = cur != QPStateErr
		}
		// A drain starts with RTS -> SQD and goes on through SQD -> SQD;
		// leaving SQD ends it without an event. The event comes only if
		// RTS -> SQD asked for it (en_sqd_async_notify).
		qp.sqDraining = next == QPStateSQD && (cur != QPStateSQD || qp.sqDraining)
		if cur != QPStateSQD || next != QPStateSQD {
			qp.sqdNotify = next == QPStateSQD && mask&QPAttrEnSQDAsyncNotify != 0 && attr.EnSQDAsyncNotify
		}
		qp.state.Store(uint32(next))
		qp.sqDrainedLocked() // nothing in progress: drained at once
	}
	qp.rq.Unlock()
	qp.sq.Unlock()
	if flush {
		qp.flushRespRecvLocked() // respMu is held (above)
		qp.flush()
	}
	if next == QPStateRTS {
		qp.dev.kick(qp)
	}
	return nil
}

// bindCursors binds the responder's idle cursors to the receive loop's
// reader (placement.Cursor.Bind).
func (qp *QP) bindCursors() {
	qp.resp.cur.Bind(qp.dev.reader)
	qp.resp.readCur.Bind(qp.dev.reader)
	// A type 2 memory window opens only for the QP it is bound to.
	qp.resp.cur.SetQP(uint32(qp.qpn))
	qp.resp.readCur.SetQP(uint32(qp.qpn))
}

// resetLocked returns the QP to its just-created condition; queued work is
// discarded without completions (IBTA 10.3.1: RESET clears the queues).
func (qp *QP) resetLocked() {
	qp.commEst.Store(false) // a new connection raises EventCommEst again
	for i := qp.comp.idx; i < qp.sq.head; i++ {
		if w := &qp.sq.wqe[i%uint64(len(qp.sq.wqe))]; !w.done {
			settleBind(w, false) // never completes: its ibv_mw.rkey is undone
		}
	}
	qp.sq.head = 0
	qp.req = reqState{}
	qp.comp = compState{}
	qp.rq.head, qp.rq.tail = 0, 0
	qp.recvHeld.Store(false)
	qp.resp = respState{res: qp.resp.res, recv: recvWQE{sgl: qp.resp.recv.sgl}}
	for i := range qp.resp.res {
		qp.resp.res[i] = rdRes{}
	}
	qp.bindCursors()
	for i := range qp.sq.wqe {
		qp.sq.wqe[i].reset()
	}
}

func (w *sendWQE) reset() {
	sgl, inl := w.sgl, w.inline
	*w = sendWQE{sgl: sgl, inline: inl}
}

// enterError moves the QP to ERR and flushes its queues (IBTA 10.3.1: a
// QP in the error state completes every outstanding WR with
// WR_FLUSH_ERR). Called by the engine on a fatal error.
func (qp *QP) enterError() {
	if qp.setError() {
		qp.releaseResp() // the receive WQE in use completes first
		qp.flush()
		return
	}
	qp.releaseResp()
}

// discard moves a QP being destroyed to ERR and empties its queues
// without a completion, the receive WQE the responder holds included
// (DestroyQP). Once it returns the engine completes nothing of the QP:
// the requester, completer and responder take no work in ERR, and a
// local invalidation that finishes later finds its WQE gone
// (finishLocal). A type 2 window a discarded bind was to bind stays
// unbound, as after RESET.
func (qp *QP) discard() {
	qp.setError()
	qp.respMu.Lock()
	qp.resp.haveRecv = false // taken from the queue: discarded with it
	qp.recvHeld.Store(false)
	qp.releaseRespLocked()
	qp.respMu.Unlock()

	qp.sq.Lock()
	for i := qp.comp.idx; i < qp.sq.head; i++ {
		w := &qp.sq.wqe[i%uint64(len(qp.sq.wqe))]
		if !w.done {
			settleBind(w, false)
		}
		w.reset()
	}
	qp.comp.idx = qp.sq.head
	qp.req.idx = qp.sq.head
	qp.req.offset = 0
	qp.req.rdAtomic = 0
	qp.fatal = false
	qp.sqDraining, qp.sqdNotify = false, false
	qp.sq.Unlock()

	qp.rq.Lock()
	qp.rq.tail = qp.rq.head
	qp.rq.Unlock()
}

// setSQE moves the state from RTS or SQD to SQE and reports whether it
// did (IBTA 10.3.1: SQE is entered from those two).
func (qp *QP) setSQE() bool {
	return qp.state.CompareAndSwap(uint32(QPStateRTS), uint32(QPStateSQE)) ||
		qp.state.CompareAndSwap(uint32(QPStateSQD), uint32(QPStateSQE))
}

// setError moves the state to ERR and reports whether it changed.
func (qp *QP) setError() bool {
	return QPState(qp.state.Swap(uint32(QPStateErr))) != QPStateErr
}

// fail completes w (if any) with an error status after moving the QP to
// ERR, so that a consumer of the WC already sees the QP in ERR, and asks
// for the queues to be flushed once sq is released. Without a WQE to
// complete, the QP's client learns of the error from EventQPFatal.
//
// A UC or UD send or RDMA WRITE that fails in RTS or SQD moves the QP to
// SQE instead (IBTA 10.3.1, "Send Queue Error": the unreliable services'
// send queue errors; the receive queue goes on): w completes in error and
// the WQEs behind it are flushed at once, the receive queue is not. A
// failed local operation (LOCAL_INV, REG_MR, BIND_MW) still moves the QP
// to ERR, as in rxe (runLocal). Caller holds sq.
func (qp *QP) fail(w *sendWQE, st WCStatus) {
	if qp.typ != QPTypeRC {
		qp.retireSent() // UC, UD: the WQEs sent before w complete first
		if w != nil && !isLocalOp(w.wr.Opcode) && qp.setSQE() {
			qp.complete(w, st, true) // a full send CQ moves it on to ERR (qp.fatal)
			qp.flushSQLocked()
			return
		}
	}
	changed := qp.setError()
	if w != nil {
		qp.complete(w, st, true)
	} else if changed {
		qp.dev.raise(EventQPFatal, qp, nil)
	}
	qp.fatal = true
}

// flush completes every outstanding send and receive WQE with
// WR_FLUSH_ERR. Signaled or not, each flushed WR generates a completion
// (IBA 10.7.3.1: an error always generates a completion).
func (qp *QP) flush() {
	qp.sq.Lock()
	qp.flushSQLocked()
	qp.sq.Unlock()
	qp.flushRQ()
}

// flushSQ flushes the send queue only: in SQE the receive queue is
// processed as in RTS (IBTA C10-38).
func (qp *QP) flushSQ() {
	qp.sq.Lock()
	qp.flushSQLocked()
	qp.sq.Unlock()
}

// flushSQLocked completes every outstanding send WQE with WR_FLUSH_ERR.
// Caller holds sq.
func (qp *QP) flushSQLocked() {
	end := qp.sq.head
	for i := qp.comp.idx; i < qp.sq.head; i++ {
		w := &qp.sq.wqe[i%uint64(len(qp.sq.wqe))]
		if w.local == localWaiting {
			// An invalidation that has taken effect completes when its
			// wait ends, in order, and then flushes the rest
			// (finishLocal): its completion is seen only when no byte is
			// placed through the key any more.
			end = i
			break
		}
		if !w.done {
			qp.complete(w, WCWRFlushErr, true)
		}
		w.reset()
	}
	qp.comp.idx = end
	qp.req.idx = end
	qp.req.offset = 0
	qp.req.rdAtomic = 0
}

// flushRQ completes every posted receive WQE with WR_FLUSH_ERR, unless the
// responder holds the oldest (see below).
func (qp *QP) flushRQ() {
	qp.rq.Lock()
	if qp.recvHeld.Load() {
		// The responder holds the oldest receive WQE, taken from the
		// queue: its completion comes first (completions in posting
		// order, IBTA 11.4.2.1). Whoever moved the QP to ERR completes
		// it (flushRespRecvLocked) and then flushes the queue.
		qp.rq.Unlock()
		return
	}
	for ; qp.rq.tail < qp.rq.head; qp.rq.tail++ {
		w := &qp.rq.wqe[qp.rq.tail%uint64(len(qp.rq.wqe))]
		wc := WC{WRID: w.wrid, Status: WCWRFlushErr, Opcode: WCRecv, QPN: qpnOf(qp.qpn)}
		qp.pushWC(qp.recvCQ, &wc)
	}
	qp.rq.Unlock()
}

// complete retires a send WQE into the send CQ if it is signaled or failed.
// Caller holds sq.
func (qp *QP) complete(w *sendWQE, st WCStatus, force bool) {
	w.done = true
	w.status = st
	settleBind(w, st == WCSuccess)
	if st == WCSuccess && !force && !qp.sigAll && w.wr.Flags&SendSignaled == 0 {
		return
	}
	wc := WC{WRID: w.wr.WRID, Status: st, QPN: qpnOf(qp.qpn), Opcode: wcOpcodeFor(w.wr.Opcode)}
	if st == WCSuccess {
		switch w.wr.Opcode {
		case WRRDMARead:
			wc.ByteLen = uint32(w.length)
		case WRAtomicCmpAndSwp, WRAtomicFetchAndAdd:
			wc.ByteLen = 8
		}
	}
	if !qp.sendCQ.push(&wc) {
		qp.cqOverrun(qp.sendCQ)
		// IBTA C9-218, a requester class F error: a WQE that cannot
		// complete because its CQ is full moves the QP to ERR with an
		// affiliated asynchronous error; the caller's flush (qp.fatal)
		// takes the rest.
		if qp.setError() {
			qp.dev.raise(EventQPFatal, qp, nil)
		}
		qp.fatal = true
	}
}

func (qp *QP) pushWC(cq *CQ, wc *WC) {
	if !cq.push(wc) {
		qp.cqOverrun(cq)
	}
}

// cqOverrun counts a completion lost to a full CQ and, the first time,
// raises EventCQErr on the CQ, which has entered its error state (IBTA
// 11.6.3.2 "CQ Error"; rxe rxe_cq_post raises IB_EVENT_CQ_ERR).
func (qp *QP) cqOverrun(cq *CQ) {
	qp.dev.counters.CQOverruns.Add(1)
	if cq.errRaised.CompareAndSwap(false, true) {
		qp.dev.raise(EventCQErr, nil, cq)
	}
}

func wcOpcodeFor(op WROpcode) WCOpcode {
	switch op {
	case WRRDMAWrite, WRRDMAWriteWithImm:
		return WCRDMAWrite
	case WRRDMARead:
		return WCRDMARead
	case WRAtomicCmpAndSwp:
		return WCCompSwap
	case WRAtomicFetchAndAdd:
		return WCFetchAdd
	case WRLocalInv:
		return WCLocalInv
	case WRBindMW:
		return WCBindMW
	case WRRegMR:
		return WCRegMR
	}
	return WCSend
}

// postable refuses posts to a QP that was destroyed (ErrBadQP) or whose
// device was closed (ErrClosed). A QP in ERR still takes posts, which
// complete with WR_FLUSH_ERR (the IBTA Error state).
func (qp *QP) postable() error {
	switch {
	case qp.destroyed.Load():
		return fmt.Errorf("%w: post to QP %d after DestroyQP", ErrBadQP, qp.qpn)
	case qp.dev.closed.Load():
		return fmt.Errorf("%w: post to QP %d", ErrClosed, qp.qpn)
	}
	return nil
}

// PostSend queues send work requests (ibv_post_send). WRs are checked one by
// one; the first that fails is not queued and its index is returned with
// the error, and the WRs before it stay queued. Errors: ErrQPState (the
// QP is RESET, INIT or RTR), ErrSQFull, ErrTooManySGE, ErrInlineTooBig,
// ErrBadSGE (an lkey that does not cover its SGE), ErrMsgTooLong (over
// 2 GiB, max_msg_sz, or an RC READ whose responses would take half the
// 24-bit PSN space: 2^31-255 bytes at path MTU 256), ErrBadOpcode,
// ErrAtomicAlign, ErrAtomicLength, ErrBadQP (after DestroyQP), ErrClosed
// (after the device's Close). In ERR the WRs are queued and flushed with
// WR_FLUSH_ERR, as libibverbs providers do.
func (qp *QP) PostSend(wrs ...SendWR) (int, error) {
	if err := qp.postable(); err != nil {
		return 0, err
	}
	qp.sq.Lock()
	st := qp.State()
	if st != QPStateRTS && st != QPStateSQD && st != QPStateErr && st != QPStateSQE {
		qp.sq.Unlock()
		return 0, fmt.Errorf("%w: post send in %v", ErrQPState, st)
	}
	for i := range wrs {
		if err := qp.postSendLocked(&wrs[i]); err != nil {
			qp.sq.Unlock()
			if i > 0 {
				qp.dev.kick(qp)
			}
			return i, err
		}
	}
	qp.sq.Unlock()
	switch st {
	case QPStateErr:
		qp.flush()
		return len(wrs), nil
	case QPStateSQE:
		qp.flushSQ() // the receive queue goes on (IBTA C10-38)
		return len(wrs), nil
	}
	qp.dev.kick(qp)
	return len(wrs), nil
}

func (qp *QP) postSendLocked(wr *SendWR) error {
	if qp.sq.head-qp.comp.idx >= uint64(qp.cap.MaxSendWR) {
		return ErrSQFull
	}
	if len(wr.SGL) > qp.cap.MaxSendSGE {
		return fmt.Errorf("%w: %d SGEs, max_send_sge %d", ErrTooManySGE, len(wr.SGL), qp.cap.MaxSendSGE)
	}
	if err := qp.checkWRType(wr); err != nil {
		return err
	}
	var need stag.Access
	switch wr.Opcode {
	case WRSend, WRSendWithImm, WRSendWithInv, WRRDMAWrite, WRRDMAWriteWithImm:
	case WRLocalInv, WRRegMR, WRBindMW:
		if err := checkLocalWR(wr); err != nil {
			return err
		}
	case WRRDMARead:
		need = stag.AccessLocalWrite
		if wr.Flags&SendInline != 0 {
			return fmt.Errorf("%w: RDMA READ cannot be inline", ErrBadOpcode)
		}
	case WRAtomicCmpAndSwp, WRAtomicFetchAndAdd:
		need = stag.AccessLocalWrite
		if wr.Flags&SendInline != 0 { // rxe validate_send_wr: no inline data for the opcode
			return fmt.Errorf("%w: an atomic cannot be inline", ErrBadOpcode)
		}
		if wr.RemoteAddr&7 != 0 {
			return fmt.Errorf("%w: 0x%x", ErrAtomicAlign, wr.RemoteAddr)
		}
	default:
		return fmt.Errorf("%w: %v", ErrBadOpcode, wr.Opcode)
	}
	if wr.Opcode == WRAtomicCmpAndSwp || wr.Opcode == WRAtomicFetchAndAdd {
		// rxe validate_send_wr: the SGE lengths must add up to 8 (length
		// != 8 is EINVAL), over any number of SGEs; the completer
		// scatters the original value over them.
		var sum uint64
		for _, sge := range wr.SGL {
			sum += uint64(sge.Length)
		}
		if sum != 8 {
			return fmt.Errorf("%w: %d bytes in %d SGEs", ErrAtomicLength, sum, len(wr.SGL))
		}
	}
	total, pst := qp.dev.place.CheckSGL(qp.pd, wr.SGL, need)
	if pst != placement.OK {
		return fmt.Errorf("%w: %v", ErrBadSGE, pst)
	}
	inline := wr.Flags&SendInline != 0
	if inline && total > uint64(qp.cap.MaxInlineData) {
		return fmt.Errorf("%w: %d bytes, max_inline_data %d", ErrInlineTooBig, total, qp.cap.MaxInlineData)
	}
	if total > 1<<31 {
		return fmt.Errorf("%w: %d bytes exceed 2 GiB (max_msg_sz)", ErrMsgTooLong, total)
	}
	if err := qp.checkWRLength(total); err != nil {
		return err
	}
	if wr.Opcode == WRRDMARead && qp.typ == QPTypeRC {
		// A READ's responses take one PSN each, all outstanding at once;
		// PSN comparisons order at most half the 24-bit space.
		if mtu := qp.path.Load().mtu; packetsFor(total, mtu) >= maxOutstandingPSNs {
			return fmt.Errorf("%w: an RDMA READ of %d bytes takes %d response PSNs at path MTU %d, at most %d may be outstanding",
				ErrMsgTooLong, total, packetsFor(total, mtu), mtu, maxOutstandingPSNs-1)
		}
	}
	w := &qp.sq.wqe[qp.sq.head%uint64(len(qp.sq.wqe))]
	w.reset()
	w.wr = *wr
	w.wr.SGL = w.sgl[:copy(w.sgl, wr.SGL)]
	w.length = total
	if inline {
		if pst := qp.dev.place.Gather(qp.pd, w.wr.SGL, 0, w.inline[:total]); pst != placement.OK {
			return fmt.Errorf("%w: %v", ErrBadSGE, pst)
		}
		w.isInline = true
	}
	qp.sq.head++
	return nil
}

// PostRecv queues receive work requests (ibv_post_recv). Errors as
// PostSend: ErrQPState in RESET, ErrRQFull, ErrTooManySGE, ErrBadSGE,
// ErrBadQP, ErrClosed. In ERR the WRs are queued and flushed.
func (qp *QP) PostRecv(wrs ...RecvWR) (int, error) {
	if err := qp.postable(); err != nil {
		return 0, err
	}
	qp.rq.Lock()
	st := qp.State()
	if st == QPStateReset {
		qp.rq.Unlock()
		return 0, fmt.Errorf("%w: post recv in %v", ErrQPState, st)
	}
	for i := range wrs {
		wr := &wrs[i]
		if qp.rq.head-qp.rq.tail >= uint64(qp.cap.MaxRecvWR) {
			qp.rq.Unlock()
			return i, ErrRQFull
		}
		if len(wr.SGL) > qp.cap.MaxRecvSGE {
			qp.rq.Unlock()
			return i, fmt.Errorf("%w: %d SGEs, max_recv_sge %d", ErrTooManySGE, len(wr.SGL), qp.cap.MaxRecvSGE)
		}
		total, pst := qp.dev.place.CheckSGL(qp.pd, wr.SGL, stag.AccessLocalWrite)
		if pst != placement.OK {
			qp.rq.Unlock()
			return i, fmt.Errorf("%w: %v", ErrBadSGE, pst)
		}
		w := &qp.rq.wqe[qp.rq.head%uint64(len(qp.rq.wqe))]
		w.wrid = wr.WRID
		w.nsge = copy(w.sgl, wr.SGL)
		w.length = total
		qp.rq.head++
	}
	qp.rq.Unlock()
	if st == QPStateErr {
		qp.flush()
	}
	return len(wrs), nil
}

// popRecv takes the oldest receive WQE. Called by the receive loop.
func (qp *QP) popRecv(w *recvWQE) bool {
	qp.rq.Lock()
	defer qp.rq.Unlock()
	if qp.rq.tail == qp.rq.head {
		return false
	}
	src := &qp.rq.wqe[qp.rq.tail%uint64(len(qp.rq.wqe))]
	w.wrid = src.wrid
	w.nsge = src.nsge
	w.length = src.length
	if cap(w.sgl) < src.nsge {
		w.sgl = make([]SGE, len(src.sgl))
	}
	w.sgl = w.sgl[:src.nsge]
	copy(w.sgl, src.sgl[:src.nsge])
	qp.rq.tail++
	qp.recvHeld.Store(true)
	return true
}

// timeoutDuration returns the local ACK timeout, 4.096 µs × 2^Timeout
// (IBTA 9.7.6.1.3), or 0 for infinite.
func (qp *QP) timeoutDuration() time.Duration {
	t := qp.attr.Timeout
	if t == 0 {
		return 0
	}
	return time.Duration(4096<<t) * time.Nanosecond
}
