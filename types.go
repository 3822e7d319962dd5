package softrdma

import (
	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport"
	"github.com/softrdma/softrdma/transport/wire"
)

// Vocabulary types, re-exported from the packages that own them so that a
// program needs one import.
type (
	QP         = transport.QP
	CQ         = transport.CQ
	WC         = transport.WC
	SendWR     = transport.SendWR
	RecvWR     = transport.RecvWR
	SGE        = transport.SGE
	QPAttr     = transport.QPAttr
	QPInitAttr = transport.QPInitAttr
	Cap        = transport.Cap
	AttrMask   = transport.AttrMask
	QPState    = transport.QPState
	QPType     = transport.QPType
	WCStatus   = transport.WCStatus
	WCOpcode   = transport.WCOpcode
	WCFlags    = transport.WCFlags
	WROpcode   = transport.WROpcode
	SendFlags  = transport.SendFlags
	MTU        = transport.MTU
	Access     = stag.Access
	PSN        = wire.PSN
	QPN        = wire.QPN
)

// Access flags (enum ibv_access_flags).
const (
	AccessLocalWrite   = stag.AccessLocalWrite
	AccessRemoteWrite  = stag.AccessRemoteWrite
	AccessRemoteRead   = stag.AccessRemoteRead
	AccessRemoteAtomic = stag.AccessRemoteAtomic
	AccessOnDemand     = stag.AccessOnDemand
)

// QP states (enum ibv_qp_state).
const (
	QPStateReset = transport.QPStateReset
	QPStateInit  = transport.QPStateInit
	QPStateRTR   = transport.QPStateRTR
	QPStateRTS   = transport.QPStateRTS
	QPStateSQD   = transport.QPStateSQD
	QPStateSQE   = transport.QPStateSQE
	QPStateErr   = transport.QPStateErr
)

// QP type (enum ibv_qp_type).
const QPTypeRC = transport.QPTypeRC

// QP attribute mask bits (enum ibv_qp_attr_mask).
const (
	QPAttrState            = transport.QPAttrState
	QPAttrCurState         = transport.QPAttrCurState
	QPAttrEnSQDAsyncNotify = transport.QPAttrEnSQDAsyncNotify
	QPAttrAccessFlags      = transport.QPAttrAccessFlags
	QPAttrPKeyIndex        = transport.QPAttrPKeyIndex
	QPAttrPort             = transport.QPAttrPort
	QPAttrAV               = transport.QPAttrAV
	QPAttrPathMTU          = transport.QPAttrPathMTU
	QPAttrTimeout          = transport.QPAttrTimeout
	QPAttrRetryCnt         = transport.QPAttrRetryCnt
	QPAttrRNRRetry         = transport.QPAttrRNRRetry
	QPAttrRQPSN            = transport.QPAttrRQPSN
	QPAttrMaxQPRdAtomic    = transport.QPAttrMaxQPRdAtomic
	QPAttrMinRNRTimer      = transport.QPAttrMinRNRTimer
	QPAttrSQPSN            = transport.QPAttrSQPSN
	QPAttrMaxDestRdAtomic  = transport.QPAttrMaxDestRdAtomic
	QPAttrDestQPN          = transport.QPAttrDestQPN
)

// Work completion statuses (enum ibv_wc_status).
const (
	WCSuccess        = transport.WCSuccess
	WCLocLenErr      = transport.WCLocLenErr
	WCLocQPOpErr     = transport.WCLocQPOpErr
	WCLocProtErr     = transport.WCLocProtErr
	WCWRFlushErr     = transport.WCWRFlushErr
	WCBadRespErr     = transport.WCBadRespErr
	WCLocAccessErr   = transport.WCLocAccessErr
	WCRemInvReqErr   = transport.WCRemInvReqErr
	WCRemAccessErr   = transport.WCRemAccessErr
	WCRemOpErr       = transport.WCRemOpErr
	WCRetryExcErr    = transport.WCRetryExcErr
	WCRNRRetryExcErr = transport.WCRNRRetryExcErr
	WCGeneralErr     = transport.WCGeneralErr
)

// Work completion opcodes (enum ibv_wc_opcode).
const (
	WCSend            = transport.WCSend
	WCRDMAWrite       = transport.WCRDMAWrite
	WCRDMARead        = transport.WCRDMARead
	WCCompSwap        = transport.WCCompSwap
	WCFetchAdd        = transport.WCFetchAdd
	WCRecv            = transport.WCRecv
	WCRecvRDMAWithImm = transport.WCRecvRDMAWithImm
)

// Work completion flags (enum ibv_wc_flags).
const (
	WCWithImm = transport.WCWithImm
	WCWithInv = transport.WCWithInv
)

// Send work request opcodes (enum ibv_wr_opcode).
const (
	WRRDMAWrite         = transport.WRRDMAWrite
	WRRDMAWriteWithImm  = transport.WRRDMAWriteWithImm
	WRSend              = transport.WRSend
	WRSendWithImm       = transport.WRSendWithImm
	WRRDMARead          = transport.WRRDMARead
	WRAtomicCmpAndSwp   = transport.WRAtomicCmpAndSwp
	WRAtomicFetchAndAdd = transport.WRAtomicFetchAndAdd
	WRSendWithInv       = transport.WRSendWithInv
)

// Send flags (enum ibv_send_flags).
const (
	SendFence     = transport.SendFence
	SendSignaled  = transport.SendSignaled
	SendSolicited = transport.SendSolicited
	SendInline    = transport.SendInline
)

// Path MTUs (enum ibv_mtu).
const (
	MTU256  = transport.MTU256
	MTU512  = transport.MTU512
	MTU1024 = transport.MTU1024
	MTU2048 = transport.MTU2048
	MTU4096 = transport.MTU4096
)

// Errors from posting and modifying, for errors.Is.
var (
	ErrQPState      = transport.ErrQPState
	ErrSQFull       = transport.ErrSQFull
	ErrRQFull       = transport.ErrRQFull
	ErrTooManySGE   = transport.ErrTooManySGE
	ErrInlineTooBig = transport.ErrInlineTooBig
	ErrBadSGE       = transport.ErrBadSGE
	// ErrMsgTooLong: a send WR's message is over 2 GiB (max_msg_sz, IBTA
	// 9.4: a message is 0 to 2^31 bytes), or an RC RDMA READ's responses
	// would take 2^23 PSNs or more, half the PSN space (2^31-255 bytes at
	// path MTU 256); EINVAL in libibverbs providers.
	ErrMsgTooLong = transport.ErrMsgTooLong
	ErrBadAttr    = transport.ErrBadAttr
	ErrCQOverrun  = transport.ErrCQOverrun
	// ErrBadTransition: Modify to a state the current one cannot reach
	// (IBTA 10.3.1; RESET -> ERR among them), EINVAL in rxe.
	ErrBadTransition = transport.ErrBadTransition
	// ErrAtomicAlign: an atomic WR's remote address is not 8-byte aligned
	// (IBTA 9.4.5, C9-57); ErrAtomicLength: its local SGEs do not add up
	// to 8 bytes (rxe validate_send_wr; several SGEs may).
	ErrAtomicAlign  = transport.ErrAtomicAlign
	ErrAtomicLength = transport.ErrAtomicLength
	// ErrBadQP: DestroyQP or Connect of a nil QP, DestroyQP of a QP
	// destroyed already or of another device (EINVAL).
	ErrBadQP = transport.ErrBadQP
	// ErrBadCQ: DestroyCQ of a nil CQ, one destroyed already or of another
	// device; Poll and Wait of a destroyed CQ (EINVAL).
	ErrBadCQ = transport.ErrBadCQ
	// ErrClosed: a call on a device after its Close (a post, a
	// registration, a CQ).
	ErrClosed = transport.ErrClosed
)
