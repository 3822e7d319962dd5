package transport

import "sync/atomic"

// Counters are a device's hardware counters, named as Linux rxe's
// hw_counters (drivers/infiniband/sw/rxe/rxe_hw_counters.c) so that results
// compare line by line, plus one drop counter per reason.
type Counters struct {
	SentPkts            atomic.Uint64 // sent_pkts: packets handed to the network
	RcvdPkts            atomic.Uint64 // rcvd_pkts: packets that passed the ICRC and header checks
	DuplicateRequest    atomic.Uint64 // duplicate_request: requests with a PSN before the expected one
	OutOfSeqRequest     atomic.Uint64 // out_of_seq_request: requests with a PSN after the expected one
	RcvdRNRErr          atomic.Uint64 // rcvd_rnr_err: RNR NAKs received by a requester
	SendRNRErr          atomic.Uint64 // send_rnr_err: RNR NAKs sent by a responder
	RcvdSeqErr          atomic.Uint64 // rcvd_seq_err: PSN sequence error NAKs received
	AckDeferred         atomic.Uint64 // ack_deferred: ACKs coalesced into a later one
	RetryExceededErr    atomic.Uint64 // retry_exceeded_err: WRs completed with RETRY_EXC_ERR
	RetryRNRExceededErr atomic.Uint64 // retry_rnr_exceeded_err: WRs completed with RNR_RETRY_EXC_ERR
	CompleterRetryErr   atomic.Uint64 // completer_retry_err: go-back-N retries started
	SendErr             atomic.Uint64 // send_err: datagrams the socket refused
	RDMASends           atomic.Uint64 // rdma_sends: RDMA WRITE/READ requests sent (messages)
	RDMARecvs           atomic.Uint64 // rdma_recvs: RDMA WRITE/READ requests executed (messages)
	Retransmits         atomic.Uint64 // request packets sent again (not an rxe counter)
	RetransmitTimeouts  atomic.Uint64 // retransmit timer expiries that retried (not an rxe counter)
	NAKsSent            atomic.Uint64 // NAKs of any kind sent by responders
	CQOverruns          atomic.Uint64 // completions lost to a full CQ (the CQ enters error)
	ODPSyncFaults       atomic.Uint64 // responder page faults resolved inline (fault policy sync, and READ)
	ODPRNRNAKs          atomic.Uint64 // RNR NAKs sent for responder page faults (fault policy rnr; also in send_rnr_err)
	ODPFaultErrs        atomic.Uint64 // responder page faults that could not be resolved (NAK remote access error)
	ODPAsyncFaultsBusy  atomic.Uint64 // fault policy rnr: RNR NAKs whose background fault was not started, placement's limit of faults in flight being reached (the retry faults again; not an rxe counter)
	AsyncEventsDropped  atomic.Uint64 // asynchronous events dropped because the device's event queue (MaxAsyncEvents) was full (not an rxe counter)

	Drops [NumDropReasons]atomic.Uint64 // per DropReason
}

// DropReason says why a received datagram was dropped without effect.
type DropReason uint8

// Drop reasons.
const (
	DropBadICRC           DropReason = iota // ICRC mismatch (counted by the conn, mirrored here)
	DropMalformed                           // too short, bad TVer, bad pad, header lengths
	DropUnknownOpcode                       // opcode not in the table or not of the QP's service (RC, UC, UD)
	DropUnknownQPN                          // DestQP names no QP
	DropBadQPState                          // QP not in a state that accepts the packet
	DropPSNOutOfWindow                      // request PSN after the expected one (NAKed once per gap)
	DropGhostResponse                       // response/ACK for nothing outstanding
	DropBadPKey                             // P_Key mismatch
	DropTooLong                             // payload longer than the path MTU
	DropRNR                                 // request that got an RNR NAK
	DropOpSeq                               // opcode out of sequence (NAK invalid request)
	DropLength                              // length error (NAK invalid request)
	DropAccess                              // rkey/bounds/access failure (NAK remote access error)
	DropWrongAddress                        // source address is not the QP's peer
	DropDuplicateResponse                   // ACK or response for a PSN already acknowledged
	DropStaleDuplicate                      // duplicate READ/atomic request older than the saved resources
	DropSuspended                           // placement paused: RNR-NAKed or not held (queue full, or a response under the nak policy)
	DropBadQKey                             // UD: DETH Q_Key is not the QP's (IBTA 10.2.5; rxe's qkey_viol_cntr)
	DropUCMessage                           // UC: packet of a message that lost a packet (PSN gap, MIDDLE/LAST out of sequence)
	DropNoRecvWQE                           // UC/UD: SEND with no receive WQE posted (no RNR NAK on these services)
	DropRecvTooSmall                        // UC/UD: SEND longer than its receive WQE (UD: payload + 40-byte GRH); the WQE is kept
	NumDropReasons
)

var dropNames = [NumDropReasons]string{
	"bad_icrc", "malformed", "unknown_opcode", "unknown_qpn", "bad_qp_state",
	"psn_out_of_window", "ghost_response", "bad_pkey", "too_long", "rnr", "opcode_out_of_seq",
	"length_error", "access_error", "wrong_address", "duplicate_response", "stale_duplicate",
	"suspended", "bad_qkey", "uc_message_lost", "no_recv_wqe", "recv_too_small",
}

func (r DropReason) String() string {
	if r < NumDropReasons {
		return dropNames[r]
	}
	return "unknown"
}

func (c *Counters) drop(r DropReason) { c.Drops[r].Add(1) }

// Snapshot returns every counter by its rxe hw_counters name (drops as
// "drop_<reason>"), in a stable order.
func (c *Counters) Snapshot() []Counter {
	out := []Counter{
		{"sent_pkts", c.SentPkts.Load()},
		{"rcvd_pkts", c.RcvdPkts.Load()},
		{"duplicate_request", c.DuplicateRequest.Load()},
		{"out_of_seq_request", c.OutOfSeqRequest.Load()},
		{"rcvd_rnr_err", c.RcvdRNRErr.Load()},
		{"send_rnr_err", c.SendRNRErr.Load()},
		{"rcvd_seq_err", c.RcvdSeqErr.Load()},
		{"ack_deferred", c.AckDeferred.Load()},
		{"retry_exceeded_err", c.RetryExceededErr.Load()},
		{"retry_rnr_exceeded_err", c.RetryRNRExceededErr.Load()},
		{"completer_retry_err", c.CompleterRetryErr.Load()},
		{"send_err", c.SendErr.Load()},
		{"rdma_sends", c.RDMASends.Load()},
		{"rdma_recvs", c.RDMARecvs.Load()},
		{"retransmits", c.Retransmits.Load()},
		{"retransmit_timeouts", c.RetransmitTimeouts.Load()},
		{"naks_sent", c.NAKsSent.Load()},
		{"cq_overruns", c.CQOverruns.Load()},
		{"odp_sync_faults", c.ODPSyncFaults.Load()},
		{"odp_rnr_naks", c.ODPRNRNAKs.Load()},
		{"odp_fault_errors", c.ODPFaultErrs.Load()},
		{"odp_async_faults_busy", c.ODPAsyncFaultsBusy.Load()},
		{"async_events_dropped", c.AsyncEventsDropped.Load()},
	}
	for r := DropReason(0); r < NumDropReasons; r++ {
		out = append(out, Counter{"drop_" + r.String(), c.Drops[r].Load()})
	}
	return out
}

// Counter is one named counter value.
type Counter struct {
	Name  string
	Value uint64
}
