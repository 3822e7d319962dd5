package transport

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/transport/wire"
)

// QPState is a queue pair state (IBTA 10.3.1, ibv_qp_state).
//
// Modify moves a QP through RESET, INIT, RTR, RTS and SQD; the engine
// moves it to ERR or SQE on an error. An RC QP never enters SQE: any
// error of its send queue (a completion error: retries exceeded, a NAK, a
// local protection error) moves it to ERR and flushes both queues (IBTA
// 10.3.1: the Send Queue Error state exists for every service but RC; as
// rxe). A UC or UD send or RDMA WRITE that completes in error moves the
// QP from RTS or SQD to SQE: the WQEs behind it and those posted in SQE
// complete with WR_FLUSH_ERR, the receive queue goes on (C10-38), and
// Modify SQE -> RTS resumes sending. rxe moves UC and UD QPs to ERR
// instead (it never enters SQE). A UC local operation that fails
// (LOCAL_INV, REG_MR, BIND_MW) and a completion that overruns its CQ move
// any QP to ERR.
type QPState uint8

// QP states, libibverbs enum ibv_qp_state order.
const (
	QPStateReset QPState = iota
	QPStateInit
	QPStateRTR
	QPStateRTS
	QPStateSQD
	QPStateSQE
	QPStateErr
)

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

func (s QPState) String() string {
	if int(s) < len(qpStateNames) {
		return qpStateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// QPType is the transport service type (ibv_qp_type).
type QPType uint8

// QP types: Reliable Connected, Unreliable Connected (uc.go) and
// Unreliable Datagram (ud.go).
const (
	QPTypeRC QPType = 2
	QPTypeUC QPType = 3
	QPTypeUD QPType = 4
)

// WCStatus is a work completion status (enum ibv_wc_status; IBTA 11.4.2.1).
type WCStatus uint8

// Work completion statuses, libibverbs numbering.
const (
	WCSuccess WCStatus = iota
	WCLocLenErr
	WCLocQPOpErr
	WCLocEECOpErr
	WCLocProtErr
	WCWRFlushErr
	WCMWBindErr
	WCBadRespErr
	WCLocAccessErr
	WCRemInvReqErr
	WCRemAccessErr
	WCRemOpErr
	WCRetryExcErr
	WCRNRRetryExcErr
	WCLocRDDViolErr
	WCRemInvRDReqErr
	WCRemAbortErr
	WCInvEECNErr
	WCInvEECStateErr
	WCFatalErr
	WCRespTimeoutErr
	WCGeneralErr
)

var wcStatusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "Work Request Flushed Error", "memory bind operation error",
	"bad response error", "local access error", "remote invalid request error",
	"remote access error", "remote operation error", "transport retry counter exceeded",
	"RNR retry counter exceeded", "local RDD violation error", "remote invalid RD request",
	"aborted error", "invalid EE context number", "invalid EE context state", "fatal error",
	"response timeout error", "general error",
}

// String returns the text ibv_wc_status_str(3) gives.
func (s WCStatus) String() string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", uint8(s))
}

// WCOpcode is the operation a work completion reports (enum ibv_wc_opcode).
type WCOpcode uint8

// Work completion opcodes, libibverbs numbering.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCBindMW          WCOpcode = 5
	WCLocalInv        WCOpcode = 6
	WCRegMR           WCOpcode = 10 // kernel IB_WC_REG_MR (libibverbs has no REG_MR)
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

// WROpcode is a send work request opcode (enum ibv_wr_opcode).
type WROpcode uint8

// Send work request opcodes, libibverbs numbering.
const (
	WRRDMAWrite         WROpcode = 0
	WRRDMAWriteWithImm  WROpcode = 1
	WRSend              WROpcode = 2
	WRSendWithImm       WROpcode = 3
	WRRDMARead          WROpcode = 4
	WRAtomicCmpAndSwp   WROpcode = 5
	WRAtomicFetchAndAdd WROpcode = 6
	WRLocalInv          WROpcode = 7
	WRBindMW            WROpcode = 8
	WRSendWithInv       WROpcode = 9
	// WRRegMR is the kernel's IB_WR_REG_MR (0x20): fast registration of
	// an MR of AllocMR. libibverbs has no such opcode (userspace FRWR does
	// not exist in rdma-core); softrdma offers it as the kernel does.
	WRRegMR WROpcode = 0x20
)

var wrOpcodeNames = [...]string{"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM",
	"RDMA_READ", "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD", "LOCAL_INV", "BIND_MW", "SEND_WITH_INV"}

func (o WROpcode) String() string {
	if o == WRRegMR {
		return "REG_MR"
	}
	if int(o) < len(wrOpcodeNames) {
		return wrOpcodeNames[o]
	}
	return fmt.Sprintf("WROpcode(%d)", uint8(o))
}

// SendFlags are ibv_send_flags.
type SendFlags uint32

// Send flags, libibverbs values.
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 2
	SendSolicited SendFlags = 4
	SendInline    SendFlags = 8 // SEND and WRITE only: a READ or an atomic with it is ErrBadOpcode (rxe validate_send_wr)
)

// WCFlags are ibv_wc_flags.
type WCFlags uint32

// Work completion flags, libibverbs values.
const (
	WCWithGRH WCFlags = 1
	WCWithImm WCFlags = 2
	WCWithInv WCFlags = 8
)

// SGE is a scatter/gather element (struct ibv_sge): Addr is an address in
// the MR named by LKey, Length in bytes.
type SGE = placement.SGE

// SendWR is a send work request (struct ibv_send_wr). SGL is copied at
// post time; the memory it names must stay registered until completion.
type SendWR struct {
	WRID       uint64
	Opcode     WROpcode
	SGL        []SGE
	Flags      SendFlags
	RemoteAddr uint64 // RDMA and atomic: remote virtual address
	RKey       uint32 // RDMA and atomic: remote key
	CompareAdd uint64 // atomic: compare (CMP_AND_SWP) or add (FETCH_AND_ADD) operand
	Swap       uint64 // atomic: swap operand
	ImmData    uint32 // WITH_IMM: immediate data, host order as the application means it
	InvRKey    uint32 // SEND_WITH_INV: the rkey the responder invalidates; LOCAL_INV: the key invalidated (invalidate_rkey)
	Reg        RegWR  // REG_MR: the MR, its new key and rights (ib_reg_wr)
	BindMW     MWBind // BIND_MW: the window, its new rkey and binding (ibv_send_wr.bind_mw)
	// UD (ibv_send_wr.wr.ud): the address handle, the destination QPN and
	// its Q_Key (one with the high bit set means the QP's own Q_Key).
	AH         *AH
	RemoteQPN  wire.QPN
	RemoteQKey uint32
}

// RecvWR is a receive work request (struct ibv_recv_wr).
type RecvWR struct {
	WRID uint64
	SGL  []SGE
}

// WC is a work completion (struct ibv_wc).
type WC struct {
	WRID    uint64
	Status  WCStatus
	Opcode  WCOpcode
	ByteLen uint32
	ImmData uint32 // valid when Flags has WCWithImm
	InvRKey uint32 // valid when Flags has WCWithInv
	QPN     uint32
	SrcQP   uint32
	Flags   WCFlags
	// SrcPort is the UDP source port of a UD datagram (a softrdma
	// extension, not in ibv_wc: RoCEv2 carries the peer's GID in the IP
	// header, which the GRH gives, but its UDP port nowhere else). A peer
	// listening on a port other than 4791 (a lab device) sends from that
	// port, and the connection manager answers it there. 0 on other WCs.
	SrcPort uint16
}

// Cap holds queue capacities (struct ibv_qp_cap).
type Cap struct {
	MaxSendWR     int
	MaxRecvWR     int
	MaxSendSGE    int
	MaxRecvSGE    int
	MaxInlineData int // bytes
}

// MTU is a path MTU code (enum ibv_mtu): 1 = 256 bytes ... 5 = 4096 bytes.
type MTU uint8

// Path MTU codes.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for an invalid code.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// MaxHeaderBytes is what rxe reserves for headers when it derives the
// active MTU from the link MTU (RXE_MAX_HDR_LENGTH: Ethernet, IP, UDP, BTH
// and the largest extension headers, 80 bytes).
const MaxHeaderBytes = 80

// ActiveMTUFor returns the active MTU of a port on a link of linkMTU bytes,
// as rxe derives it (eth_mtu_int_to_enum): the largest MTU code not above
// linkMTU - MaxHeaderBytes, at least MTU256 (1500 -> 1024, 9000 -> 4096).
func ActiveMTUFor(linkMTU int) MTU {
	if m := MTUFromBytes(linkMTU - MaxHeaderBytes); m != 0 {
		return m
	}
	return MTU256
}

// MTUFromBytes returns the largest MTU code not above n bytes (256 to 4096),
// the rule rxe applies to a link MTU; 0 if n < 256.
func MTUFromBytes(n int) MTU {
	for m := MTU4096; m >= MTU256; m-- {
		if m.Bytes() <= n {
			return m
		}
	}
	return 0
}

// Errors returned by the verbs. They wrap into the root package's errors.
var (
	ErrQPState       = errors.New("QP is in the wrong state for this operation")
	ErrSQFull        = errors.New("send queue full")
	ErrRQFull        = errors.New("receive queue full")
	ErrTooManySGE    = errors.New("too many SGEs")
	ErrInlineTooBig  = errors.New("inline data exceeds max_inline_data")
	ErrBadSGE        = errors.New("SGE outside its lkey's range or bad lkey")
	ErrMsgTooLong    = errors.New("message longer than the QP can send")
	ErrBadOpcode     = errors.New("work request opcode not supported on this QP")
	ErrBadAttr       = errors.New("invalid QP attribute")
	ErrBadTransition = errors.New("invalid QP state transition")
	ErrCQOverrun     = errors.New("CQ overrun")
	ErrClosed        = errors.New("device closed")
	ErrAtomicAlign   = errors.New("atomic remote address is not 8-byte aligned")
	ErrAtomicLength  = errors.New("atomic needs local SGEs of 8 bytes in all")
	ErrBusy          = fmt.Errorf("resource in use: %w", syscall.EBUSY)
	ErrBadQP         = errors.New("QP missing, destroyed or of another device")
	ErrBadCQ         = errors.New("CQ missing, destroyed or of another device")
)

// qpnOf is a helper for WC.QPN.
func qpnOf(q wire.QPN) uint32 { return uint32(q) }
