package mad

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/softrdma/softrdma/transport/wire"
)

// The communication manager's messages, IBTA 12.6 (Tables 106-113; byte
// offsets below are from the start of the MAD class data, i.e. byte 24 of
// the MAD). Each view must be at least DataSize bytes: pass Datagram.Data()
// or the data returned by Datagram.CM. Multi-bit fields that share a byte
// are listed high bits first.
//
// Every message but the REQ starts with the two communication IDs:
//
//	0  Local Communication ID (32)   the sender's ID for the connection
//	4  Remote Communication ID (32)  the receiver's ID (0 until it is known)

// Sizes of the private data of each message, in bytes.
const (
	REQPrivateDataSize  = DataSize - reqPrivateData  // 92
	MRAPrivateDataSize  = DataSize - mraPrivateData  // 222
	REJPrivateDataSize  = DataSize - rejPrivateData  // 148
	REPPrivateDataSize  = DataSize - repPrivateData  // 196
	RTUPrivateDataSize  = DataSize - rtuPrivateData  // 224
	DREQPrivateDataSize = DataSize - dreqPrivateData // 220
	DREPPrivateDataSize = DataSize - drepPrivateData // 224
	// ARISize is the size of the REJ's Additional Rejection Information.
	ARISize = rejPrivateData - rejARI // 72
	// PathSize is the size of a REQ's path description (Path).
	PathSize = 44
)

const (
	cmLocalCommID  = 0
	cmRemoteCommID = 4

	reqServiceID       = 8
	reqLocalCAGUID     = 16
	reqLocalQKey       = 28
	reqLocalQPN        = 32 // 24 bits, then Responder Resources
	reqLocalEECN       = 36 // 24 bits, then Initiator Depth
	reqRemoteEECN      = 40 // 24 bits, then Remote CM Response Timeout 5, Transport Service Type 2, End-to-End Flow Control 1
	reqStartingPSN     = 44 // 24 bits, then Local CM Response Timeout 5, Retry Count 3
	reqPKey            = 48
	reqMTU             = 50 // Path MTU 4, RDC Exists 1, RNR Retry Count 3
	reqMaxCMRetries    = 51 // Max CM Retries 4, SRQ 1, Extended Transport Type 3
	reqPrimaryPath     = 52
	reqAlternatePath   = 96
	reqPrivateData     = 140
	mraMsgMRAed        = 8 // 2 bits
	mraServiceTimeout  = 9 // 5 bits
	mraPrivateData     = 10
	rejMsgRejected     = 8 // 2 bits
	rejInfoLength      = 9 // 7 bits
	rejReason          = 10
	rejARI             = 12
	rejPrivateData     = 84
	repLocalQKey       = 8
	repLocalQPN        = 12 // 24 bits
	repLocalEECN       = 16 // 24 bits
	repStartingPSN     = 20 // 24 bits
	repResponderRes    = 24
	repInitiatorDepth  = 25
	repTargetACKDelay  = 26 // Target ACK Delay 5, Failover Accepted 2, End-to-End Flow Control 1
	repRNRRetryCount   = 27 // RNR Retry Count 3, SRQ 1
	repLocalCAGUID     = 28
	repPrivateData     = 36
	rtuPrivateData     = 8
	dreqRemoteQPN      = 8 // 24 bits
	dreqPrivateData    = 12
	drepPrivateData    = 8
	pathLocalLID       = 0
	pathRemoteLID      = 2
	pathLocalGID       = 4
	pathRemoteGID      = 20
	pathFlowLabel      = 36 // 20 bits, 6 reserved, Packet Rate 6
	pathTrafficClass   = 40
	pathHopLimit       = 41
	pathSL             = 42 // SL 4, Subnet Local 1
	pathLocalACKTimout = 43 // 5 bits
)

// get24 returns the 24-bit field at b[off:off+3].
func get24(b []byte, off int) uint32 {
	return uint32(b[off])<<16 | uint32(b[off+1])<<8 | uint32(b[off+2])
}

// put24 writes the low 24 bits of v at b[off:off+3].
func put24(b []byte, off int, v uint32) {
	b[off], b[off+1], b[off+2] = byte(v>>16), byte(v>>8), byte(v)
}

func b2u(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// putPrivate copies p into dst and zeroes the rest of dst; bytes of p
// beyond len(dst) are dropped.
func putPrivate(dst, p []byte) {
	n := copy(dst, p)
	clear(dst[n:])
}

// Timeout returns the duration a 5-bit CM or ACK timeout exponent encodes:
// 4.096 µs × 2^n (IBTA 12.6, "CM Response Timeout"; also Target ACK Delay
// and Local ACK Timeout). n is taken modulo 32.
func Timeout(n uint8) time.Duration { return 4096 * time.Nanosecond << (n & 31) }

// PathMTU is the 4-bit MTU code of a REQ ("Path Packet Payload MTU", the
// IBTA's enum: 1 = 256 bytes ... 5 = 4096 bytes).
type PathMTU uint8

// Bytes returns the MTU in bytes, or 0 for a reserved code.
func (m PathMTU) Bytes() int {
	if m < 1 || m > 5 {
		return 0
	}
	return 128 << m
}

// PathMTUFor returns the code of an MTU of n bytes (256, 512, 1024, 2048
// or 4096), or 0 when n is none of them.
func PathMTUFor(n int) PathMTU {
	for m := PathMTU(1); m <= 5; m++ {
		if m.Bytes() == n {
			return m
		}
	}
	return 0
}

// TransportType is a REQ's 2-bit "Transport Service Type".
type TransportType uint8

// Transport service types.
const (
	TransportRC TransportType = 0
	TransportUC TransportType = 1
	TransportRD TransportType = 2
	// TransportExtended defers to the Extended Transport Type field (XRC,
	// IBTA Annex A14).
	TransportExtended TransportType = 3
)

// String returns "RC", "UC", "RD" or "extended".
func (t TransportType) String() string {
	switch t & 3 {
	case TransportRC:
		return "RC"
	case TransportUC:
		return "UC"
	case TransportRD:
		return "RD"
	}
	return "extended"
}

// MessageKind is the 2-bit "Message REJected" of a REJ or "Message MRAed"
// of an MRA: which message the REJ or MRA answers.
type MessageKind uint8

// Message kinds.
const (
	MsgREQ MessageKind = 0
	MsgREP MessageKind = 1
	// MsgOther is "other" in a REJ (a REJ not answering a REQ or REP) and
	// the LAP in an MRA.
	MsgOther MessageKind = 2
)

// String returns "REQ", "REP", "other" or "reserved".
func (k MessageKind) String() string {
	switch k {
	case MsgREQ:
		return "REQ"
	case MsgREP:
		return "REP"
	case MsgOther:
		return "other"
	}
	return "reserved"
}

// RejectReason is a REJ's 16-bit "Reason" (IBTA 12.6, REJ; the codes are
// those of Linux's enum ib_cm_rej_reason).
type RejectReason uint16

// Rejection reasons.
const (
	RejNoQP                     RejectReason = 1
	RejNoEEC                    RejectReason = 2
	RejNoResources              RejectReason = 3
	RejTimeout                  RejectReason = 4
	RejUnsupported              RejectReason = 5
	RejInvalidCommID            RejectReason = 6
	RejInvalidCommInstance      RejectReason = 7
	RejInvalidServiceID         RejectReason = 8
	RejInvalidTransportType     RejectReason = 9
	RejStaleConn                RejectReason = 10
	RejRDCNotExist              RejectReason = 11
	RejInvalidGID               RejectReason = 12
	RejInvalidLID               RejectReason = 13
	RejInvalidSL                RejectReason = 14
	RejInvalidTrafficClass      RejectReason = 15
	RejInvalidHopLimit          RejectReason = 16
	RejInvalidPacketRate        RejectReason = 17
	RejInvalidAltGID            RejectReason = 18
	RejInvalidAltLID            RejectReason = 19
	RejInvalidAltSL             RejectReason = 20
	RejInvalidAltTrafficClass   RejectReason = 21
	RejInvalidAltHopLimit       RejectReason = 22
	RejInvalidAltPacketRate     RejectReason = 23
	RejPortCMRedirect           RejectReason = 24
	RejPortRedirect             RejectReason = 25
	RejInvalidMTU               RejectReason = 26
	RejInsufficientRespRes      RejectReason = 27
	RejConsumerDefined          RejectReason = 28
	RejInvalidRNRRetry          RejectReason = 29
	RejDuplicateLocalCommID     RejectReason = 30
	RejInvalidClassVersion      RejectReason = 31
	RejInvalidFlowLabel         RejectReason = 32
	RejInvalidAltFlowLabel      RejectReason = 33
	RejVendorOptionNotSupported RejectReason = 35
)

var rejectNames = map[RejectReason]string{
	RejNoQP: "no QP", RejNoEEC: "no EEC", RejNoResources: "no resources", RejTimeout: "timeout",
	RejUnsupported: "unsupported request", RejInvalidCommID: "invalid comm ID",
	RejInvalidCommInstance: "invalid comm instance", RejInvalidServiceID: "invalid service ID",
	RejInvalidTransportType: "invalid transport type", RejStaleConn: "stale connection",
	RejRDCNotExist: "RDC does not exist", RejInvalidGID: "invalid GID", RejInvalidLID: "invalid LID",
	RejInvalidSL: "invalid SL", RejInvalidTrafficClass: "invalid traffic class",
	RejInvalidHopLimit: "invalid hop limit", RejInvalidPacketRate: "invalid packet rate",
	RejInvalidAltGID: "invalid alt GID", RejInvalidAltLID: "invalid alt LID", RejInvalidAltSL: "invalid alt SL",
	RejInvalidAltTrafficClass: "invalid alt traffic class", RejInvalidAltHopLimit: "invalid alt hop limit",
	RejInvalidAltPacketRate: "invalid alt packet rate", RejPortCMRedirect: "port CM redirect",
	RejPortRedirect: "port redirect", RejInvalidMTU: "invalid MTU",
	RejInsufficientRespRes: "insufficient responder resources", RejConsumerDefined: "consumer defined",
	RejInvalidRNRRetry: "invalid RNR retry count", RejDuplicateLocalCommID: "duplicate local comm ID",
	RejInvalidClassVersion: "invalid class version", RejInvalidFlowLabel: "invalid flow label",
	RejInvalidAltFlowLabel: "invalid alt flow label", RejVendorOptionNotSupported: "vendor option not supported",
}

// String returns the reason in words, as Linux's ibcm_reject_msg does, or
// its number.
func (r RejectReason) String() string {
	if s, ok := rejectNames[r]; ok {
		return s
	}
	return fmt.Sprintf("reason %d", uint16(r))
}

// --- REQ --------------------------------------------------------------

// REQ is a view of a ConnectRequest (IBTA 12.6, Table 106):
//
//	  0 Local Communication ID (32)      4 reserved (32)
//	  8 ServiceID (64)                  16 Local CA GUID (64)
//	 24 reserved (32)                   28 Local Q_Key (32)
//	 32 Local QPN (24) | Responder Resources (8)
//	 36 Local EECN (24) | Initiator Depth (8)
//	 40 Remote EECN (24) | Remote CM Response Timeout (5) Transport Service Type (2) End-to-End Flow Control (1)
//	 44 Starting PSN (24) | Local CM Response Timeout (5) Retry Count (3)
//	 48 Partition Key (16) | Path MTU (4) RDC Exists (1) RNR Retry Count (3) | Max CM Retries (4) SRQ (1) Extended Transport Type (3)
//	 52 primary path (44, see Path)     96 alternate path (44)
//	140 Private Data (92)
type REQ []byte

// LocalCommID returns the "Local Communication ID".
func (r REQ) LocalCommID() uint32 { return binary.BigEndian.Uint32(r[cmLocalCommID:]) }

// ServiceID returns the "ServiceID" (for RDMA CM, an IP service ID).
func (r REQ) ServiceID() ServiceID { return ServiceID(binary.BigEndian.Uint64(r[reqServiceID:])) }

// LocalCAGUID returns the "Local CA GUID" (rxe: the EUI-64 of the MAC).
func (r REQ) LocalCAGUID() uint64 { return binary.BigEndian.Uint64(r[reqLocalCAGUID:]) }

// LocalQKey returns the "Local Q_Key" (meaningful for RD only).
func (r REQ) LocalQKey() uint32 { return binary.BigEndian.Uint32(r[reqLocalQKey:]) }

// LocalQPN returns the "Local QPN": the active side's QP.
func (r REQ) LocalQPN() wire.QPN { return wire.QPN(get24(r, reqLocalQPN)) }

// ResponderResources returns the "Responder Resources": the RDMA READs and
// atomics the active side accepts in flight.
func (r REQ) ResponderResources() uint8 { return r[reqLocalQPN+3] }

// LocalEECN returns the 24-bit "Local EECN" (RD only).
func (r REQ) LocalEECN() uint32 { return get24(r, reqLocalEECN) }

// InitiatorDepth returns the "Initiator Depth": the RDMA READs and atomics
// the active side sends in flight.
func (r REQ) InitiatorDepth() uint8 { return r[reqLocalEECN+3] }

// RemoteEECN returns the 24-bit "Remote EECN" (RD only).
func (r REQ) RemoteEECN() uint32 { return get24(r, reqRemoteEECN) }

// RemoteCMResponseTimeout returns the 5-bit "Remote CM Response Timeout"
// exponent (see Timeout).
func (r REQ) RemoteCMResponseTimeout() uint8 { return r[reqRemoteEECN+3] >> 3 }

// TransportServiceType returns the 2-bit "Transport Service Type".
func (r REQ) TransportServiceType() TransportType { return TransportType(r[reqRemoteEECN+3] >> 1 & 3) }

// EndToEndFlowControl returns the "End-to-End Flow Control" bit.
func (r REQ) EndToEndFlowControl() bool { return r[reqRemoteEECN+3]&1 != 0 }

// StartingPSN returns the 24-bit "Starting PSN". Linux starts the passive
// side's send queue there (and the active side's receive queue expects
// it), as the rping captures show.
func (r REQ) StartingPSN() wire.PSN { return wire.PSN(get24(r, reqStartingPSN)) }

// LocalCMResponseTimeout returns the 5-bit "Local CM Response Timeout"
// exponent (see Timeout).
func (r REQ) LocalCMResponseTimeout() uint8 { return r[reqStartingPSN+3] >> 3 }

// RetryCount returns the 3-bit "Retry Count" for the connection's QPs.
func (r REQ) RetryCount() uint8 { return r[reqStartingPSN+3] & 7 }

// PKey returns the "Partition Key".
func (r REQ) PKey() uint16 { return binary.BigEndian.Uint16(r[reqPKey:]) }

// PathMTU returns the 4-bit "Path Packet Payload MTU" code.
func (r REQ) PathMTU() PathMTU { return PathMTU(r[reqMTU] >> 4) }

// RDCExists returns the "RDC Exists" bit (RD only).
func (r REQ) RDCExists() bool { return r[reqMTU]&0x08 != 0 }

// RNRRetryCount returns the 3-bit "RNR Retry Count" (7: retry forever).
func (r REQ) RNRRetryCount() uint8 { return r[reqMTU] & 7 }

// MaxCMRetries returns the 4-bit "Max CM Retries".
func (r REQ) MaxCMRetries() uint8 { return r[reqMaxCMRetries] >> 4 }

// SRQ returns the "SRQ" bit: the active side's QP uses a shared receive
// queue.
func (r REQ) SRQ() bool { return r[reqMaxCMRetries]&0x08 != 0 }

// ExtendedTransportType returns the 3-bit "Extended Transport Type" (1:
// XRC, when TransportServiceType is TransportExtended).
func (r REQ) ExtendedTransportType() uint8 { return r[reqMaxCMRetries] & 7 }

// PrimaryPath returns the view of the primary path.
func (r REQ) PrimaryPath() Path { return Path(r[reqPrimaryPath : reqPrimaryPath+PathSize]) }

// AlternatePath returns the view of the alternate path (all zero when
// there is none, as on RoCE).
func (r REQ) AlternatePath() Path { return Path(r[reqAlternatePath : reqAlternatePath+PathSize]) }

// PrivateData returns the REQPrivateDataSize bytes of "Private Data"; for
// an IP service ID, an IPPrivateData.
func (r REQ) PrivateData() []byte { return r[reqPrivateData:DataSize:DataSize] }

// REQFields holds the fields of a REQ.
type REQFields struct {
	LocalCommID             uint32
	ServiceID               ServiceID
	LocalCAGUID             uint64
	LocalQKey               uint32
	LocalQPN                wire.QPN
	ResponderResources      uint8
	LocalEECN               uint32 // 24 bits
	InitiatorDepth          uint8
	RemoteEECN              uint32 // 24 bits
	RemoteCMResponseTimeout uint8  // 5-bit exponent, see Timeout
	TransportServiceType    TransportType
	EndToEndFlowControl     bool
	StartingPSN             wire.PSN
	LocalCMResponseTimeout  uint8 // 5-bit exponent
	RetryCount              uint8 // 3 bits
	PKey                    uint16
	PathMTU                 PathMTU
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtendedTransportType   uint8 // 3 bits
	Primary, Alternate      PathFields
	// PrivateData aliases the message in Decode; Encode copies at most
	// REQPrivateDataSize bytes and zeroes the rest.
	PrivateData []byte
}

// Decode fills f from r.
func (r REQ) Decode(f *REQFields) {
	*f = REQFields{
		LocalCommID: r.LocalCommID(), ServiceID: r.ServiceID(), LocalCAGUID: r.LocalCAGUID(),
		LocalQKey: r.LocalQKey(), LocalQPN: r.LocalQPN(), ResponderResources: r.ResponderResources(),
		LocalEECN: r.LocalEECN(), InitiatorDepth: r.InitiatorDepth(), RemoteEECN: r.RemoteEECN(),
		RemoteCMResponseTimeout: r.RemoteCMResponseTimeout(), TransportServiceType: r.TransportServiceType(),
		EndToEndFlowControl: r.EndToEndFlowControl(), StartingPSN: r.StartingPSN(),
		LocalCMResponseTimeout: r.LocalCMResponseTimeout(), RetryCount: r.RetryCount(), PKey: r.PKey(),
		PathMTU: r.PathMTU(), RDCExists: r.RDCExists(), RNRRetryCount: r.RNRRetryCount(),
		MaxCMRetries: r.MaxCMRetries(), SRQ: r.SRQ(), ExtendedTransportType: r.ExtendedTransportType(),
		PrivateData: r.PrivateData(),
	}
	r.PrimaryPath().Decode(&f.Primary)
	r.AlternatePath().Decode(&f.Alternate)
}

// Encode writes f into r (at least DataSize bytes), reserved bits zero.
// Fields wider than their bit width are truncated.
func (r REQ) Encode(f *REQFields) {
	_ = r[DataSize-1]
	binary.BigEndian.PutUint32(r[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(r[cmRemoteCommID:], 0)
	binary.BigEndian.PutUint64(r[reqServiceID:], uint64(f.ServiceID))
	binary.BigEndian.PutUint64(r[reqLocalCAGUID:], f.LocalCAGUID)
	binary.BigEndian.PutUint32(r[reqLocalCAGUID+8:], 0)
	binary.BigEndian.PutUint32(r[reqLocalQKey:], f.LocalQKey)
	put24(r, reqLocalQPN, uint32(f.LocalQPN))
	r[reqLocalQPN+3] = f.ResponderResources
	put24(r, reqLocalEECN, f.LocalEECN)
	r[reqLocalEECN+3] = f.InitiatorDepth
	put24(r, reqRemoteEECN, f.RemoteEECN)
	r[reqRemoteEECN+3] = f.RemoteCMResponseTimeout<<3 | byte(f.TransportServiceType&3)<<1 | b2u(f.EndToEndFlowControl)
	put24(r, reqStartingPSN, uint32(f.StartingPSN))
	r[reqStartingPSN+3] = f.LocalCMResponseTimeout<<3 | f.RetryCount&7
	binary.BigEndian.PutUint16(r[reqPKey:], f.PKey)
	r[reqMTU] = byte(f.PathMTU)<<4 | b2u(f.RDCExists)<<3 | f.RNRRetryCount&7
	r[reqMaxCMRetries] = f.MaxCMRetries<<4 | b2u(f.SRQ)<<3 | f.ExtendedTransportType&7
	r.PrimaryPath().Encode(&f.Primary)
	r.AlternatePath().Encode(&f.Alternate)
	putPrivate(r[reqPrivateData:DataSize], f.PrivateData)
}

// Path is a view of the primary or alternate path of a REQ (PathSize
// bytes; IBTA 12.6, Table 106):
//
//	 0 Local Port LID (16)   2 Remote Port LID (16)
//	 4 Local Port GID (128) 20 Remote Port GID (128)
//	36 Flow Label (20) | reserved (6) | Packet Rate (6)
//	40 Traffic Class (8) | Hop Limit (8) | SL (4) Subnet Local (1) reserved (3) | Local ACK Timeout (5) reserved (3)
//
// On RoCEv2 the GIDs are the IP addresses (IPv4 as ::ffff:a.b.c.d) and
// Linux puts 0xffff (the permissive LID) in the LIDs.
type Path []byte

// LocalLID returns the "Local Port LID".
func (p Path) LocalLID() uint16 { return binary.BigEndian.Uint16(p[pathLocalLID:]) }

// RemoteLID returns the "Remote Port LID".
func (p Path) RemoteLID() uint16 { return binary.BigEndian.Uint16(p[pathRemoteLID:]) }

// LocalGID returns the "Local Port GID" as a 16-byte address.
func (p Path) LocalGID() netip.Addr {
	return netip.AddrFrom16([16]byte(p[pathLocalGID : pathLocalGID+16]))
}

// RemoteGID returns the "Remote Port GID" as a 16-byte address.
func (p Path) RemoteGID() netip.Addr {
	return netip.AddrFrom16([16]byte(p[pathRemoteGID : pathRemoteGID+16]))
}

// FlowLabel returns the 20-bit "Flow Label".
func (p Path) FlowLabel() uint32 { return binary.BigEndian.Uint32(p[pathFlowLabel:]) >> 12 }

// PacketRate returns the 6-bit "Packet Rate" (IBTA static rate code).
func (p Path) PacketRate() uint8 { return p[pathFlowLabel+3] & 0x3f }

// TrafficClass returns the "Traffic Class".
func (p Path) TrafficClass() uint8 { return p[pathTrafficClass] }

// HopLimit returns the "Hop Limit".
func (p Path) HopLimit() uint8 { return p[pathHopLimit] }

// SL returns the 4-bit "SL" (service level).
func (p Path) SL() uint8 { return p[pathSL] >> 4 }

// SubnetLocal returns the "Subnet Local" bit.
func (p Path) SubnetLocal() bool { return p[pathSL]&0x08 != 0 }

// LocalACKTimeout returns the 5-bit "Local ACK Timeout" exponent (see
// Timeout): the QP's transport timer.
func (p Path) LocalACKTimeout() uint8 { return p[pathLocalACKTimout] >> 3 }

// PathFields holds the fields of a Path.
type PathFields struct {
	LocalLID, RemoteLID uint16
	// LocalGID and RemoteGID are written with As16 (IPv4 as ::ffff:a.b.c.d;
	// the zero Addr as all zeros) and decoded as 16-byte addresses.
	LocalGID, RemoteGID netip.Addr
	FlowLabel           uint32 // 20 bits
	PacketRate          uint8  // 6 bits
	TrafficClass        uint8
	HopLimit            uint8
	SL                  uint8 // 4 bits
	SubnetLocal         bool
	LocalACKTimeout     uint8 // 5-bit exponent
}

// Decode fills f from p.
func (p Path) Decode(f *PathFields) {
	*f = PathFields{
		LocalLID: p.LocalLID(), RemoteLID: p.RemoteLID(), LocalGID: p.LocalGID(), RemoteGID: p.RemoteGID(),
		FlowLabel: p.FlowLabel(), PacketRate: p.PacketRate(), TrafficClass: p.TrafficClass(),
		HopLimit: p.HopLimit(), SL: p.SL(), SubnetLocal: p.SubnetLocal(), LocalACKTimeout: p.LocalACKTimeout(),
	}
}

// Encode writes f into p (at least PathSize bytes), reserved bits zero.
func (p Path) Encode(f *PathFields) {
	_ = p[PathSize-1]
	binary.BigEndian.PutUint16(p[pathLocalLID:], f.LocalLID)
	binary.BigEndian.PutUint16(p[pathRemoteLID:], f.RemoteLID)
	l, r := f.LocalGID.As16(), f.RemoteGID.As16()
	copy(p[pathLocalGID:], l[:])
	copy(p[pathRemoteGID:], r[:])
	binary.BigEndian.PutUint32(p[pathFlowLabel:], f.FlowLabel<<12|uint32(f.PacketRate&0x3f))
	p[pathTrafficClass] = f.TrafficClass
	p[pathHopLimit] = f.HopLimit
	p[pathSL] = f.SL<<4 | b2u(f.SubnetLocal)<<3
	p[pathLocalACKTimout] = f.LocalACKTimeout << 3
}

// --- MRA --------------------------------------------------------------

// MRA is a view of a MsgRcptAck (IBTA 12.6, Table 107): "I got your
// message, the answer takes longer".
//
//	0 Local Communication ID (32)   4 Remote Communication ID (32)
//	8 Message MRAed (2) reserved (6) | Service Timeout (5) reserved (3) | Private Data (222)
type MRA []byte

// LocalCommID returns the "Local Communication ID".
func (m MRA) LocalCommID() uint32 { return binary.BigEndian.Uint32(m[cmLocalCommID:]) }

// RemoteCommID returns the "Remote Communication ID".
func (m MRA) RemoteCommID() uint32 { return binary.BigEndian.Uint32(m[cmRemoteCommID:]) }

// MessageMRAed returns the 2-bit "Message MRAed" (MsgOther is the LAP).
func (m MRA) MessageMRAed() MessageKind { return MessageKind(m[mraMsgMRAed] >> 6) }

// ServiceTimeout returns the 5-bit "Service Timeout" exponent (see
// Timeout): how much longer the sender needs.
func (m MRA) ServiceTimeout() uint8 { return m[mraServiceTimeout] >> 3 }

// PrivateData returns the MRAPrivateDataSize bytes of "Private Data".
func (m MRA) PrivateData() []byte { return m[mraPrivateData:DataSize:DataSize] }

// MRAFields holds the fields of an MRA.
type MRAFields struct {
	LocalCommID, RemoteCommID uint32
	MessageMRAed              MessageKind
	ServiceTimeout            uint8  // 5-bit exponent
	PrivateData               []byte // as in REQFields
}

// Decode fills f from m.
func (m MRA) Decode(f *MRAFields) {
	*f = MRAFields{LocalCommID: m.LocalCommID(), RemoteCommID: m.RemoteCommID(), MessageMRAed: m.MessageMRAed(),
		ServiceTimeout: m.ServiceTimeout(), PrivateData: m.PrivateData()}
}

// Encode writes f into m (at least DataSize bytes), reserved bits zero.
func (m MRA) Encode(f *MRAFields) {
	_ = m[DataSize-1]
	binary.BigEndian.PutUint32(m[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(m[cmRemoteCommID:], f.RemoteCommID)
	m[mraMsgMRAed] = byte(f.MessageMRAed&3) << 6
	m[mraServiceTimeout] = f.ServiceTimeout << 3
	putPrivate(m[mraPrivateData:DataSize], f.PrivateData)
}

// --- REJ --------------------------------------------------------------

// REJ is a view of a ConnectReject (IBTA 12.6, Table 108):
//
//	 0 Local Communication ID (32)   4 Remote Communication ID (32)
//	 8 Message REJected (2) reserved (6) | Reject Info Length (7) reserved (1) | Reason (16)
//	12 ARI, Additional Rejection Information (72)
//	84 Private Data (148)
type REJ []byte

// LocalCommID returns the "Local Communication ID".
func (r REJ) LocalCommID() uint32 { return binary.BigEndian.Uint32(r[cmLocalCommID:]) }

// RemoteCommID returns the "Remote Communication ID".
func (r REJ) RemoteCommID() uint32 { return binary.BigEndian.Uint32(r[cmRemoteCommID:]) }

// MessageRejected returns the 2-bit "Message REJected".
func (r REJ) MessageRejected() MessageKind { return MessageKind(r[rejMsgRejected] >> 6) }

// RejectInfoLength returns the 7-bit "Reject Info Length": the bytes of
// ARI that are meaningful (at most ARISize are there).
func (r REJ) RejectInfoLength() uint8 { return r[rejInfoLength] >> 1 }

// Reason returns the "Reason".
func (r REJ) Reason() RejectReason { return RejectReason(binary.BigEndian.Uint16(r[rejReason:])) }

// ARI returns the first RejectInfoLength bytes (at most ARISize) of the
// "Additional Rejection Information".
func (r REJ) ARI() []byte {
	n := min(int(r.RejectInfoLength()), ARISize)
	return r[rejARI : rejARI+n : rejARI+n]
}

// PrivateData returns the REJPrivateDataSize bytes of "Private Data".
func (r REJ) PrivateData() []byte { return r[rejPrivateData:DataSize:DataSize] }

// REJFields holds the fields of a REJ.
type REJFields struct {
	LocalCommID, RemoteCommID uint32
	MessageRejected           MessageKind
	Reason                    RejectReason
	// ARI aliases the message in Decode (RejectInfoLength bytes); Encode
	// copies at most ARISize bytes and sets Reject Info Length to that.
	ARI         []byte
	PrivateData []byte // as in REQFields
}

// Decode fills f from r.
func (r REJ) Decode(f *REJFields) {
	*f = REJFields{LocalCommID: r.LocalCommID(), RemoteCommID: r.RemoteCommID(),
		MessageRejected: r.MessageRejected(), Reason: r.Reason(), ARI: r.ARI(), PrivateData: r.PrivateData()}
}

// Encode writes f into r (at least DataSize bytes), reserved bits zero.
func (r REJ) Encode(f *REJFields) {
	_ = r[DataSize-1]
	binary.BigEndian.PutUint32(r[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(r[cmRemoteCommID:], f.RemoteCommID)
	r[rejMsgRejected] = byte(f.MessageRejected&3) << 6
	n := min(len(f.ARI), ARISize)
	r[rejInfoLength] = byte(n) << 1
	binary.BigEndian.PutUint16(r[rejReason:], uint16(f.Reason))
	putPrivate(r[rejARI:rejPrivateData], f.ARI[:n])
	putPrivate(r[rejPrivateData:DataSize], f.PrivateData)
}

// --- REP --------------------------------------------------------------

// REP is a view of a ConnectReply (IBTA 12.6, Table 110):
//
//	 0 Local Communication ID (32)   4 Remote Communication ID (32)
//	 8 Local Q_Key (32)
//	12 Local QPN (24) | reserved (8)
//	16 Local EE Context Number (24) | reserved (8)
//	20 Starting PSN (24) | reserved (8)
//	24 Responder Resources (8) | Initiator Depth (8) | Target ACK Delay (5) Failover Accepted (2) End-to-End Flow Control (1) | RNR Retry Count (3) SRQ (1) reserved (4)
//	28 Local CA GUID (64)
//	36 Private Data (196)
type REP []byte

// LocalCommID returns the "Local Communication ID": the passive side's.
func (r REP) LocalCommID() uint32 { return binary.BigEndian.Uint32(r[cmLocalCommID:]) }

// RemoteCommID returns the "Remote Communication ID": the REQ's local one.
func (r REP) RemoteCommID() uint32 { return binary.BigEndian.Uint32(r[cmRemoteCommID:]) }

// LocalQKey returns the "Local Q_Key" (RD only).
func (r REP) LocalQKey() uint32 { return binary.BigEndian.Uint32(r[repLocalQKey:]) }

// LocalQPN returns the "Local QPN": the passive side's QP.
func (r REP) LocalQPN() wire.QPN { return wire.QPN(get24(r, repLocalQPN)) }

// LocalEECN returns the 24-bit "Local EE Context Number" (RD only).
func (r REP) LocalEECN() uint32 { return get24(r, repLocalEECN) }

// StartingPSN returns the 24-bit "Starting PSN": where the active side's
// send queue starts (in the captures, the PSN of its first packet).
func (r REP) StartingPSN() wire.PSN { return wire.PSN(get24(r, repStartingPSN)) }

// ResponderResources returns the "Responder Resources".
func (r REP) ResponderResources() uint8 { return r[repResponderRes] }

// InitiatorDepth returns the "Initiator Depth".
func (r REP) InitiatorDepth() uint8 { return r[repInitiatorDepth] }

// TargetACKDelay returns the 5-bit "Target ACK Delay" exponent (see
// Timeout).
func (r REP) TargetACKDelay() uint8 { return r[repTargetACKDelay] >> 3 }

// FailoverAccepted returns the 2-bit "Failover Accepted" (0: the
// alternate path is accepted).
func (r REP) FailoverAccepted() uint8 { return r[repTargetACKDelay] >> 1 & 3 }

// EndToEndFlowControl returns the "End-to-End Flow Control" bit.
func (r REP) EndToEndFlowControl() bool { return r[repTargetACKDelay]&1 != 0 }

// RNRRetryCount returns the 3-bit "RNR Retry Count".
func (r REP) RNRRetryCount() uint8 { return r[repRNRRetryCount] >> 5 }

// SRQ returns the "SRQ" bit.
func (r REP) SRQ() bool { return r[repRNRRetryCount]&0x10 != 0 }

// LocalCAGUID returns the "Local CA GUID".
func (r REP) LocalCAGUID() uint64 { return binary.BigEndian.Uint64(r[repLocalCAGUID:]) }

// PrivateData returns the REPPrivateDataSize bytes of "Private Data".
func (r REP) PrivateData() []byte { return r[repPrivateData:DataSize:DataSize] }

// REPFields holds the fields of a REP.
type REPFields struct {
	LocalCommID, RemoteCommID uint32
	LocalQKey                 uint32
	LocalQPN                  wire.QPN
	LocalEECN                 uint32 // 24 bits
	StartingPSN               wire.PSN
	ResponderResources        uint8
	InitiatorDepth            uint8
	TargetACKDelay            uint8 // 5-bit exponent
	FailoverAccepted          uint8 // 2 bits
	EndToEndFlowControl       bool
	RNRRetryCount             uint8 // 3 bits
	SRQ                       bool
	LocalCAGUID               uint64
	PrivateData               []byte // as in REQFields
}

// Decode fills f from r.
func (r REP) Decode(f *REPFields) {
	*f = REPFields{
		LocalCommID: r.LocalCommID(), RemoteCommID: r.RemoteCommID(), LocalQKey: r.LocalQKey(),
		LocalQPN: r.LocalQPN(), LocalEECN: r.LocalEECN(), StartingPSN: r.StartingPSN(),
		ResponderResources: r.ResponderResources(), InitiatorDepth: r.InitiatorDepth(),
		TargetACKDelay: r.TargetACKDelay(), FailoverAccepted: r.FailoverAccepted(),
		EndToEndFlowControl: r.EndToEndFlowControl(), RNRRetryCount: r.RNRRetryCount(), SRQ: r.SRQ(),
		LocalCAGUID: r.LocalCAGUID(), PrivateData: r.PrivateData(),
	}
}

// Encode writes f into r (at least DataSize bytes), reserved bits zero.
func (r REP) Encode(f *REPFields) {
	_ = r[DataSize-1]
	binary.BigEndian.PutUint32(r[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(r[cmRemoteCommID:], f.RemoteCommID)
	binary.BigEndian.PutUint32(r[repLocalQKey:], f.LocalQKey)
	binary.BigEndian.PutUint32(r[repLocalQPN:], uint32(f.LocalQPN)<<8)
	binary.BigEndian.PutUint32(r[repLocalEECN:], f.LocalEECN<<8)
	binary.BigEndian.PutUint32(r[repStartingPSN:], uint32(f.StartingPSN)<<8)
	r[repResponderRes] = f.ResponderResources
	r[repInitiatorDepth] = f.InitiatorDepth
	r[repTargetACKDelay] = f.TargetACKDelay<<3 | (f.FailoverAccepted&3)<<1 | b2u(f.EndToEndFlowControl)
	r[repRNRRetryCount] = f.RNRRetryCount<<5 | b2u(f.SRQ)<<4
	binary.BigEndian.PutUint64(r[repLocalCAGUID:], f.LocalCAGUID)
	putPrivate(r[repPrivateData:DataSize], f.PrivateData)
}

// --- RTU, DREQ, DREP --------------------------------------------------

// RTU is a view of a ReadyToUse (IBTA 12.6, Table 111): the two
// communication IDs and 224 bytes of private data.
type RTU []byte

// LocalCommID returns the "Local Communication ID": the active side's.
func (r RTU) LocalCommID() uint32 { return binary.BigEndian.Uint32(r[cmLocalCommID:]) }

// RemoteCommID returns the "Remote Communication ID": the passive side's.
func (r RTU) RemoteCommID() uint32 { return binary.BigEndian.Uint32(r[cmRemoteCommID:]) }

// PrivateData returns the RTUPrivateDataSize bytes of "Private Data".
func (r RTU) PrivateData() []byte { return r[rtuPrivateData:DataSize:DataSize] }

// RTUFields holds the fields of an RTU (and of a DREP, which has the same
// shape).
type RTUFields struct {
	LocalCommID, RemoteCommID uint32
	PrivateData               []byte // as in REQFields
}

// Decode fills f from r.
func (r RTU) Decode(f *RTUFields) {
	*f = RTUFields{LocalCommID: r.LocalCommID(), RemoteCommID: r.RemoteCommID(), PrivateData: r.PrivateData()}
}

// Encode writes f into r (at least DataSize bytes).
func (r RTU) Encode(f *RTUFields) {
	_ = r[DataSize-1]
	binary.BigEndian.PutUint32(r[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(r[cmRemoteCommID:], f.RemoteCommID)
	putPrivate(r[rtuPrivateData:DataSize], f.PrivateData)
}

// DREQ is a view of a DisconnectRequest (IBTA 12.6, Table 112):
//
//	 0 Local Communication ID (32)   4 Remote Communication ID (32)
//	 8 Remote QPN/EECN (24) | reserved (8)
//	12 Private Data (220)
type DREQ []byte

// LocalCommID returns the "Local Communication ID".
func (d DREQ) LocalCommID() uint32 { return binary.BigEndian.Uint32(d[cmLocalCommID:]) }

// RemoteCommID returns the "Remote Communication ID".
func (d DREQ) RemoteCommID() uint32 { return binary.BigEndian.Uint32(d[cmRemoteCommID:]) }

// RemoteQPN returns the 24-bit "Remote QPN/EECN": the receiver's QP.
func (d DREQ) RemoteQPN() wire.QPN { return wire.QPN(get24(d, dreqRemoteQPN)) }

// PrivateData returns the DREQPrivateDataSize bytes of "Private Data".
func (d DREQ) PrivateData() []byte { return d[dreqPrivateData:DataSize:DataSize] }

// DREQFields holds the fields of a DREQ.
type DREQFields struct {
	LocalCommID, RemoteCommID uint32
	RemoteQPN                 wire.QPN
	PrivateData               []byte // as in REQFields
}

// Decode fills f from d.
func (d DREQ) Decode(f *DREQFields) {
	*f = DREQFields{LocalCommID: d.LocalCommID(), RemoteCommID: d.RemoteCommID(), RemoteQPN: d.RemoteQPN(),
		PrivateData: d.PrivateData()}
}

// Encode writes f into d (at least DataSize bytes), reserved bits zero.
func (d DREQ) Encode(f *DREQFields) {
	_ = d[DataSize-1]
	binary.BigEndian.PutUint32(d[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(d[cmRemoteCommID:], f.RemoteCommID)
	binary.BigEndian.PutUint32(d[dreqRemoteQPN:], uint32(f.RemoteQPN)<<8)
	putPrivate(d[dreqPrivateData:DataSize], f.PrivateData)
}

// DREP is a view of a DisconnectReply (IBTA 12.6, Table 113): the two
// communication IDs and 224 bytes of private data. Its fields are
// RTUFields.
type DREP []byte

// LocalCommID returns the "Local Communication ID".
func (d DREP) LocalCommID() uint32 { return binary.BigEndian.Uint32(d[cmLocalCommID:]) }

// RemoteCommID returns the "Remote Communication ID".
func (d DREP) RemoteCommID() uint32 { return binary.BigEndian.Uint32(d[cmRemoteCommID:]) }

// PrivateData returns the DREPPrivateDataSize bytes of "Private Data".
func (d DREP) PrivateData() []byte { return d[drepPrivateData:DataSize:DataSize] }

// Decode fills f from d.
func (d DREP) Decode(f *RTUFields) { RTU(d).Decode(f) }

// Encode writes f into d (at least DataSize bytes).
func (d DREP) Encode(f *RTUFields) { RTU(d).Encode(f) }

// CommIDs returns the local and remote communication IDs of any CM message
// with a view here (the REQ has no remote ID: 0), given its attribute and
// class data (at least DataSize bytes).
func CommIDs(attr AttributeID, data []byte) (local, remote uint32) {
	local = binary.BigEndian.Uint32(data[cmLocalCommID:])
	if attr != AttrREQ {
		remote = binary.BigEndian.Uint32(data[cmRemoteCommID:])
	}
	return local, remote
}
