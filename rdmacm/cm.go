package rdmacm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// Defaults, from Linux's rdma_cm (drivers/infiniband/core/cma.c).
const (
	// DefaultResponseTimeout is CMA_CM_RESPONSE_TIMEOUT: 20, 4.3 s.
	DefaultResponseTimeout = 20
	// DefaultMaxRetries is CMA_MAX_CM_RETRIES: 15.
	DefaultMaxRetries = 15
	// mraServiceTimeout is CMA_CM_MRA_SETTING's timeout: 24, 69 s.
	mraServiceTimeout = 24
	// localACKTimeout is the Local ACK Timeout the REQ's path carries and
	// the QPs use: 14, 67 ms, perftest's default (rdma_cm derives it from
	// the route's packet life time; rxe's REQs carry 19).
	localACKTimeout = 14
	// targetACKDelay is the REP's Target ACK Delay (rxe's REPs carry 15).
	targetACKDelay = 15
)

// closeLinger bounds how long Close waits for posted MADs to leave.
const closeLinger = 200 * time.Millisecond

// GSI queue sizes: MADs in flight each way.
const (
	nRecv   = 64
	nSend   = 64
	recvLen = softrdma.GRHSize + mad.Size
)

// Errors, for errors.Is.
var (
	// ErrTimeout: the peer did not answer a REQ, REP or DREQ within the
	// CM response timeout and the retries (RDMA_CM_EVENT_UNREACHABLE).
	ErrTimeout = errors.New("rdmacm: no answer from the peer (CM response timeout)")
	// ErrClosed: the CM or the listener is closed.
	ErrClosed = errors.New("rdmacm: closed")
	// ErrPortInUse: another listener has the port (EADDRINUSE).
	ErrPortInUse = errors.New("rdmacm: port in use")
	// ErrPrivateData: private data longer than the message carries
	// (56 bytes in a REQ, 196 in a REP, 148 in a REJ; EINVAL).
	ErrPrivateData = errors.New("rdmacm: private data too long")
	// ErrBadQP: the QP is nil, not RC, or past INIT (EINVAL).
	ErrBadQP = errors.New("rdmacm: QP must be an RC QP in RESET or INIT")
	// ErrState: the call does not fit the connection's state (EINVAL).
	ErrState = errors.New("rdmacm: invalid in this connection state")
)

// RejectError is a connection refused with a REJ (RDMA_CM_EVENT_REJECTED):
// the IBTA reason (mad.RejConsumerDefined when the peer's application
// called rdma_reject) and the REJ's private data.
type RejectError struct {
	Reason      mad.RejectReason
	PrivateData []byte
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("rdmacm: connection rejected: %v (%d)", e.Reason, uint16(e.Reason))
}

// Options configure a CM. A zero field takes the default named on it.
type Options struct {
	// ResponseTimeout is this side's CM response timeout, a 5-bit
	// exponent of 4.096 µs (default 20, 4.3 s): how long the peer waits
	// for our answer before it sends again, and, for the peer's
	// messages, how long we wait (the peer's own value, from its REQ).
	ResponseTimeout uint8
	// MaxRetries is how many times a REQ, REP or DREQ is sent again
	// (default 15, at most 15: a 4-bit field). Our REQs carry it as
	// their Max CM Retries, which both sides of that connection use
	// (IBTA 12.7.27); on connections we accept, the peer's REQ's value
	// applies instead.
	MaxRetries uint8
	// Logf receives a line for each message refused or dropped (default
	// log.Printf).
	Logf func(format string, args ...any)
}

// Counters count the CM's messages (all monotonic).
type Counters struct {
	Sent, Received  [8]atomic.Uint64 // by message: index attr-0x10 for REQ..DREP (7 used)
	Retransmits     atomic.Uint64    // REQ, REP, DREQ sent again after a timeout
	Duplicates      atomic.Uint64    // duplicate REQ, REP, DREQ answered or ignored
	RejectsSent     atomic.Uint64    // REJs sent (any reason)
	UnknownCommID   atomic.Uint64    // messages for a connection we do not have, dropped
	Unsupported     atomic.Uint64    // MADs answered with a status (unknown class, version or attribute)
	Malformed       atomic.Uint64    // receives too short for a MAD, dropped
	SendNoBuffer    atomic.Uint64    // MADs not sent: every send buffer in flight (the timer sends again)
	BacklogOverflow atomic.Uint64    // REQs dropped because the listener's backlog is full
}

// Counter is one named counter value.
type Counter struct {
	Name  string
	Value uint64
}

var msgNames = [...]string{"req", "mra", "rej", "rep", "rtu", "dreq", "drep"}

// Snapshot returns every counter by name: cm_<msg>_sent and
// cm_<msg>_rcvd for req, mra, rej, rep, rtu, dreq, drep, then
// cm_retransmits, cm_duplicates, cm_unknown_comm_id, cm_unsupported,
// cm_malformed, cm_send_no_buffer, cm_backlog_overflow (RejectsSent is
// cm_rej_sent).
func (c *Counters) Snapshot() []Counter {
	var out []Counter
	for i, n := range msgNames {
		out = append(out, Counter{"cm_" + n + "_sent", c.Sent[i].Load()}, Counter{"cm_" + n + "_rcvd", c.Received[i].Load()})
	}
	return append(out,
		Counter{"cm_retransmits", c.Retransmits.Load()}, Counter{"cm_duplicates", c.Duplicates.Load()},
		Counter{"cm_unknown_comm_id", c.UnknownCommID.Load()},
		Counter{"cm_unsupported", c.Unsupported.Load()}, Counter{"cm_malformed", c.Malformed.Load()},
		Counter{"cm_send_no_buffer", c.SendNoBuffer.Load()}, Counter{"cm_backlog_overflow", c.BacklogOverflow.Load()})
}

// CM is a device's connection manager. It owns the device's GSI QP (QP1);
// there is one per device. Safe for concurrent use.
type CM struct {
	warned [nWarnKinds]atomic.Uint64 // lines of each kind (warn)
	dev    *softrdma.Device
	opts   Options
	pd     *softrdma.PD
	cq     *softrdma.CQ
	qp     *softrdma.QP
	mr     *softrdma.MR
	buf    []byte // nRecv receive slots of recvLen, then nSend send slots of mad.Size
	gid    netip.Addr
	guid   uint64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	freeSend  []int
	ahs       map[netip.AddrPort]*softrdma.AH
	listeners map[uint16]*Listener
	byLocal   map[uint32]*Conn
	byRemote  map[remoteKey]*Conn
	nextTID   uint64

	ctr Counters
}

type remoteKey struct {
	id  uint32
	gid netip.Addr
}

// Open creates the CM of dev: its GSI QP (QP1) in a PD of its own, made
// ready with the GSI Q_Key, and the receive loop. Errors: the device's
// (transport.ErrBusy when dev has a CM already).
func Open(dev *softrdma.Device, o Options) (*CM, error) {
	if o.ResponseTimeout == 0 {
		o.ResponseTimeout = DefaultResponseTimeout
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = DefaultMaxRetries
	}
	o.ResponseTimeout &= 31
	o.MaxRetries = min(o.MaxRetries, 15)
	if o.Logf == nil {
		o.Logf = log.Printf
	}
	cm := &CM{dev: dev, opts: o, ahs: map[netip.AddrPort]*softrdma.AH{}, listeners: map[uint16]*Listener{},
		byLocal: map[uint32]*Conn{}, byRemote: map[remoteKey]*Conn{}}
	var err error
	if cm.pd, err = dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("rdmacm: %w", err)
	}
	if cm.cq, err = dev.CreateCQ(nRecv + nSend); err != nil {
		return nil, fmt.Errorf("rdmacm: %w", err)
	}
	cm.qp, err = dev.CreateGSIQP(cm.pd, softrdma.QPInitAttr{SendCQ: cm.cq, RecvCQ: cm.cq,
		Cap: softrdma.Cap{MaxSendWR: nSend, MaxRecvWR: nRecv, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, fmt.Errorf("rdmacm: %w", err)
	}
	fail := func(err error) (*CM, error) {
		_ = dev.DestroyQP(cm.qp)
		return nil, fmt.Errorf("rdmacm: %w", err)
	}
	if err = softrdma.InitUD(cm.qp, softrdma.GSIQKey, 0); err != nil {
		return fail(err)
	}
	cm.buf = make([]byte, nRecv*recvLen+nSend*mad.Size)
	if cm.mr, err = dev.RegMR(cm.pd, cm.buf, softrdma.AccessLocalWrite); err != nil {
		return fail(err)
	}
	for i := range nRecv {
		if err = cm.postRecv(i); err != nil {
			_ = dev.DeregMR(cm.mr)
			return fail(err)
		}
	}
	cm.freeSend = make([]int, nSend)
	for i := range cm.freeSend {
		cm.freeSend[i] = i
	}
	cm.gid = netip.AddrFrom16(dev.GID())
	cm.guid = guidOf(cm.gid)
	var r [4]byte
	_, _ = rand.Read(r[:])
	cm.nextTID = uint64(binary.BigEndian.Uint32(r[:])) // the low half; the high half is 1, our agent
	cm.ctx, cm.cancel = context.WithCancel(context.Background())
	cm.wg.Add(1)
	go cm.run()
	return cm, nil
}

// guidOf makes a node GUID from a GID: an EUI-64 in the manner of a MAC's
// (rxe's Local CA GUID is its MAC with ff:fe in the middle); softrdma has
// no MAC, so the last 6 bytes of the address stand for it.
func guidOf(gid netip.Addr) uint64 {
	a := gid.As16()
	return uint64(a[10]^2)<<56 | uint64(a[11])<<48 | uint64(a[12])<<40 | 0xfffe<<24 |
		uint64(a[13])<<16 | uint64(a[14])<<8 | uint64(a[15])
}

// Counters returns the CM's counters.
func (cm *CM) Counters() *Counters { return &cm.ctr }

// Retries returns how many times the CM sends a REQ, REP or DREQ again
// when the peer does not answer (Options.MaxRetries), and how long it
// waits for an answer each time: Connect gives up on a peer that never
// answers (ErrTimeout) after (n+1) × every.
func (cm *CM) Retries() (n int, every time.Duration) {
	return int(cm.opts.MaxRetries), retransmitAfter(cm.opts.ResponseTimeout)
}

// QPN returns the GSI QP's number: 1.
func (cm *CM) QPN() softrdma.QPN { return cm.qp.QPN() }

// Close stops the CM: connections still open are failed (their QPs moved
// to ERR, no DREQ sent), listeners closed, the MADs already posted (a last
// DREP or DREQ) given up to 200 ms to leave, QP1 destroyed.
func (cm *CM) Close() error {
	cm.mu.Lock()
	if cm.closed {
		cm.mu.Unlock()
		return nil
	}
	cm.closed = true
	for _, l := range cm.listeners {
		l.closeLocked()
	}
	for _, c := range cm.byLocal {
		c.failLocked(ErrClosed)
		c.stopTimer()
	}
	cm.mu.Unlock()
	// Let the MADs already posted (a DREP just sent, say) leave before
	// QP1 goes: their send completions come back once they are on the
	// wire; at most closeLinger.
	for deadline := time.Now().Add(closeLinger); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		cm.mu.Lock()
		idle := len(cm.freeSend) == nSend
		cm.mu.Unlock()
		if idle {
			break
		}
	}
	cm.cancel()
	cm.wg.Wait()
	err := cm.dev.DestroyQP(cm.qp)
	for _, ah := range cm.ahs {
		_ = cm.dev.DestroyAH(ah)
	}
	if e := cm.dev.DeregMR(cm.mr); err == nil {
		err = e
	}
	return err
}

func (cm *CM) postRecv(i int) error {
	_, err := cm.qp.PostRecv(softrdma.RecvWR{WRID: uint64(i), SGL: []softrdma.SGE{{
		Addr: cm.mr.Addr() + uint64(i*recvLen), Length: recvLen, LKey: cm.mr.LKey()}}})
	return err
}

func (cm *CM) sendSlot(i int) []byte {
	off := nRecv*recvLen + i*mad.Size
	return cm.buf[off : off+mad.Size : off+mad.Size]
}

// run is the receive loop: completions of QP1, one MAD each.
func (cm *CM) run() {
	defer cm.wg.Done()
	var wcs [16]softrdma.WC
	for {
		n, err := cm.cq.Wait(cm.ctx, wcs[:])
		if err != nil {
			return
		}
		for i := range wcs[:n] {
			wc := &wcs[i]
			if wc.Opcode != softrdma.WCRecv {
				cm.mu.Lock()
				cm.freeSend = append(cm.freeSend, int(wc.WRID))
				cm.mu.Unlock()
				continue
			}
			if wc.Status != softrdma.WCSuccess {
				continue // flushed at close
			}
			slot := int(wc.WRID)
			b := cm.buf[slot*recvLen : slot*recvLen+int(wc.ByteLen)]
			cm.receive(b, wc)
			if cm.postRecv(slot) != nil {
				return
			}
		}
	}
}

// peerOf returns where to answer a MAD that arrived with grh and wc: the
// sender's IP address and RoCE UDP port (see the package doc).
func (cm *CM) peerOf(grh []byte, wc *softrdma.WC) netip.AddrPort {
	var src netip.Addr
	if grh[20]>>4 == 4 { // IPv4 header in the last 20 bytes of the GRH (ibverbs' layout)
		src = netip.AddrFrom4([4]byte(grh[32:36]))
	} else {
		src = netip.AddrFrom16([16]byte(grh[8:24])).Unmap()
	}
	port := uint16(wire.RoCEv2Port)
	if cm.dev.LocalAddr().Port() != wire.RoCEv2Port && wc.SrcPort != 0 {
		port = wc.SrcPort
	}
	return netip.AddrPortFrom(src, port)
}

func (cm *CM) logf(format string, args ...any) { cm.opts.Logf(format, args...) }

// warnKind is a kind of message a peer can make the CM log; each kind is
// rate-limited on its own (warn).
type warnKind int

const (
	warnMalformed   warnKind = iota // a MAD that does not parse
	warnStatus                      // a peer's GetResp with a non-zero status
	warnNotOurs                     // a message for a comm ID not ours
	warnUnsupported                 // a request we answer with a MAD status
	warnRejected                    // a REQ refused by the CM itself
	warnBacklog                     // a REQ dropped for a full backlog
	warnSend                        // a MAD that could not be sent
	nWarnKinds
)

// warn logs a line of a kind a peer can repeat at will, rate-limited as
// the device's drop warnings are: the first 10 of each kind, then one in
// 1000. What it reports is counted by the caller (Counters) in any case.
func (cm *CM) warn(k warnKind, format string, args ...any) {
	if n := cm.warned[k].Add(1); n <= 10 || n%1000 == 0 {
		cm.logf(format, args...)
	}
}

// receive handles one received MAD (b: GRH then the datagram).
func (cm *CM) receive(b []byte, wc *softrdma.WC) {
	if len(b) < recvLen {
		cm.ctr.Malformed.Add(1)
		return
	}
	peer := cm.peerOf(b[:softrdma.GRHSize], wc)
	d, err := mad.Parse(b[softrdma.GRHSize:])
	if err != nil {
		cm.ctr.Malformed.Add(1)
		cm.warn(warnMalformed, "rdmacm: dropped a MAD from %v: %v", peer, err)
		return
	}
	to := dest{peer, softrdma.QPN(wc.SrcQP)} // answers go to the sending QP (IBTA 13.5.1; normally QP1)
	if d.Response() {
		if d.Status() != 0 {
			cm.warn(warnStatus, "rdmacm: %v answered %v with MAD status %#04x", peer, d.AttributeID(), d.Status())
		}
		return // nobody here sends requests that expect GetResp
	}
	if d.Class() != mad.ClassCM || d.ClassVersion() != mad.CMClassVersion {
		cm.unsupported(d, to, statusBadVersion,
			fmt.Sprintf("class %v version %d (the CM, class version %d, only)", d.Class(), d.ClassVersion(), mad.CMClassVersion))
		return
	}
	attr, data, err := d.CM()
	if err != nil || d.Method() != mad.MethodSend {
		cm.unsupported(d, to, statusUnsupportedAttr,
			fmt.Sprintf("CM attribute %v method %v (REQ, MRA, REJ, REP, RTU, DREQ, DREP with Send only)", d.AttributeID(), d.Method()))
		return
	}
	if i := int(attr - mad.AttrREQ); i >= 0 && i < len(cm.ctr.Received) {
		cm.ctr.Received[i].Add(1)
	}
	tid := d.TransactionID()
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if cm.closed {
		return
	}
	switch attr {
	case mad.AttrREQ:
		cm.onREQ(mad.REQ(data), tid, to)
		return
	case mad.AttrDREQ:
		cm.onDREQ(mad.DREQ(data), tid, to)
		return
	}
	local, remote := mad.CommIDs(attr, data)
	c := cm.byLocal[remote]
	if c == nil && attr == mad.AttrREJ {
		c = cm.timedOutConn(mad.REJ(data))
	}
	if c == nil {
		cm.ctr.UnknownCommID.Add(1)
		cm.warn(warnNotOurs, "rdmacm: dropped a %v from %v for comm ID %#08x (local %#08x), which is not ours", attr, peer, remote, local)
		return
	}
	switch attr {
	case mad.AttrREP:
		c.onREP(mad.REP(data), tid)
	case mad.AttrRTU:
		c.onRTU()
	case mad.AttrREJ:
		c.onREJ(mad.REJ(data))
	case mad.AttrMRA:
		c.onMRA(mad.MRA(data))
	case mad.AttrDREP:
		c.onDREP()
	}
}

// MAD status codes (IBTA 13.4.7, Table 120: bits 2-4).
const (
	statusBadVersion      = 1 << 2 // class or class version not supported
	statusUnsupportedAttr = 3 << 2 // method/attribute combination not supported
)

// unsupported answers a request MAD we do not implement with a GetResp
// carrying status (as Linux's ib_mad answers a MAD no agent takes), counts
// it and logs the peer and what it asked.
func (cm *CM) unsupported(d mad.Datagram, to dest, status uint16, what string) {
	cm.ctr.Unsupported.Add(1)
	cm.warn(warnUnsupported, "rdmacm: %v sent %s: answered with MAD status %#04x", to.addr, what, status)
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if cm.closed {
		return
	}
	cm.sendRaw(to, func(b []byte) {
		copy(b, d)
		var h mad.HeaderFields
		d.Decode(&h)
		h.Method = mad.MethodGetResp
		h.Status = status
		mad.Datagram(b).Encode(&h)
	})
}

// dest is where a MAD goes: a device's UDP address and a QP on it (QP1,
// or the QP that sent the MAD answered).
type dest struct {
	addr netip.AddrPort
	qpn  softrdma.QPN
}

// sendRaw builds a MAD with fill into a send buffer and posts it to
// to. Caller holds mu. A MAD that cannot be sent is counted; its
// retransmission timer (if any) sends it again.
func (cm *CM) sendRaw(to dest, fill func(b []byte)) {
	if len(cm.freeSend) == 0 {
		cm.ctr.SendNoBuffer.Add(1)
		return
	}
	ah, err := cm.ahFor(to.addr)
	if err != nil {
		cm.logf("rdmacm: no address handle for %v: %v", to.addr, err)
		return
	}
	slot := cm.freeSend[len(cm.freeSend)-1]
	b := cm.sendSlot(slot)
	clear(b)
	fill(b)
	_, err = cm.qp.PostSend(softrdma.SendWR{WRID: uint64(slot), Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
		SGL: []softrdma.SGE{{Addr: cm.mr.Addr() + uint64(nRecv*recvLen+slot*mad.Size), Length: mad.Size, LKey: cm.mr.LKey()}},
		AH:  ah, RemoteQPN: to.qpn, RemoteQKey: softrdma.GSIQKey})
	if err != nil {
		cm.warn(warnSend, "rdmacm: send to %v: %v", to.addr, err)
		return
	}
	cm.freeSend = cm.freeSend[:len(cm.freeSend)-1]
}

// sendCM sends a CM message (attr, the class data written by fill) with
// transaction ID tid. Caller holds mu.
func (cm *CM) sendCM(to dest, attr mad.AttributeID, tid uint64, fill func(data []byte)) {
	// Counted first: the peer may answer before PostSend returns.
	if i := int(attr - mad.AttrREQ); i >= 0 && i < len(cm.ctr.Sent) {
		cm.ctr.Sent[i].Add(1)
	}
	if attr == mad.AttrREJ {
		cm.ctr.RejectsSent.Add(1)
	}
	cm.sendRaw(to, func(b []byte) {
		d := mad.Datagram(b)
		d.Encode(&mad.HeaderFields{Class: mad.ClassCM, ClassVersion: mad.CMClassVersion, Method: mad.MethodSend,
			TransactionID: tid, AttributeID: attr})
		fill(b[mad.HeaderSize:])
	})
}

func (cm *CM) ahFor(peer netip.AddrPort) (*softrdma.AH, error) {
	if ah := cm.ahs[peer]; ah != nil {
		return ah, nil
	}
	ah, err := cm.dev.CreateAH(cm.pd, softrdma.AHAttrFor(peer))
	if err != nil {
		return nil, err
	}
	cm.ahs[peer] = ah
	return ah, nil
}

// newTID returns a transaction ID: 1 in the high half (this agent), a
// counter in the low half (Linux's ib_mad puts its agent's hi_tid there
// and the CM its comm ID in the low half). Caller holds mu.
func (cm *CM) newTID() uint64 {
	cm.nextTID++
	return 1<<32 | cm.nextTID&0xffffffff
}

// newLocalID returns an unused non-zero local communication ID. Caller
// holds mu.
func (cm *CM) newLocalID() uint32 {
	for {
		var r [4]byte
		_, _ = rand.Read(r[:])
		id := binary.BigEndian.Uint32(r[:])
		if id != 0 && cm.byLocal[id] == nil {
			return id
		}
	}
}

// reject sends a REJ answering msg (a REQ or REP) from the peer's comm ID
// remoteID; localID is ours (0 when we kept no state). A REJ "timeout"
// carries our Local CA GUID as its ARI (IBTA 12.6.7.2, Table 112; ib_cm
// sends its node GUID): a peer that never learnt our comm ID finds the
// connection by it (timedOutConn). Caller holds mu.
func (cm *CM) reject(to dest, tid uint64, localID, remoteID uint32, msg mad.MessageKind,
	reason mad.RejectReason, private []byte) {
	var ari []byte
	var guid [8]byte
	if reason == mad.RejTimeout {
		binary.BigEndian.PutUint64(guid[:], cm.guid)
		ari = guid[:]
	}
	cm.sendCM(to, mad.AttrREJ, tid, func(data []byte) {
		mad.REJ(data).Encode(&mad.REJFields{LocalCommID: localID, RemoteCommID: remoteID,
			MessageRejected: msg, Reason: reason, ARI: ari, PrivateData: private})
	})
}

// timedOutConn returns the passive connection a REJ "timeout" ends when
// the REJ does not name our comm ID (an active side that gives up on its
// REQ before any REP never learnt it): the one whose REQ came with the
// REJ's local comm ID from the CA whose GUID is the REJ's ARI, as ib_cm
// finds it (cm_acquire_rejected_id). nil if none. Caller holds mu.
func (cm *CM) timedOutConn(r mad.REJ) *Conn {
	ari := r.ARI()
	if r.Reason() != mad.RejTimeout || len(ari) < 8 {
		return nil
	}
	guid := binary.BigEndian.Uint64(ari)
	for k, c := range cm.byRemote {
		if k.id == r.LocalCommID() && !c.active && c.req.LocalCAGUID == guid {
			return c
		}
	}
	return nil
}

// onREQ handles a REQ. Caller holds mu.
func (cm *CM) onREQ(r mad.REQ, tid uint64, to dest) {
	peer := to.addr
	rk := remoteKey{r.LocalCommID(), r.PrimaryPath().LocalGID().Unmap()}
	if c := cm.byRemote[rk]; c != nil {
		cm.ctr.Duplicates.Add(1)
		if c.state == stReqRcvd || c.state == stMRASent {
			// The application has not answered yet: tell the active side
			// to wait (ib_cm's MRA on a duplicate REQ, rdma_cm's delayed MRA).
			c.state = stMRASent
			cm.sendCM(c.gsi(), mad.AttrMRA, c.tid, func(data []byte) {
				mad.MRA(data).Encode(&mad.MRAFields{LocalCommID: c.localID, RemoteCommID: c.remoteID,
					MessageMRAed: mad.MsgREQ, ServiceTimeout: mraServiceTimeout})
			})
		}
		return // REP_SENT: the REP's own timer sends it again
	}
	sid := r.ServiceID()
	refuse := func(reason mad.RejectReason, why string) {
		cm.warn(warnRejected, "rdmacm: rejected a REQ from %v (QPN %d, service %v): %s", peer, r.LocalQPN(), sid, why)
		cm.reject(to, tid, 0, r.LocalCommID(), mad.MsgREQ, reason, nil)
	}
	if t := r.TransportServiceType(); t != mad.TransportRC {
		refuse(mad.RejInvalidTransportType, fmt.Sprintf("transport %v (extended type %d): softrdma's CM connects RC QPs only", t, r.ExtendedTransportType()))
		return
	}
	if !sid.IsIP() || sid.PortSpace() != mad.PortSpaceTCP {
		refuse(mad.RejInvalidServiceID, "not an RDMA_PS_TCP IP service ID")
		return
	}
	ip := mad.IPPrivateData(r.PrivateData())
	if !ip.Valid() {
		refuse(mad.RejInvalidServiceID, "no valid IP CM private data header")
		return
	}
	l := cm.listeners[sid.Port()]
	if l == nil {
		refuse(mad.RejInvalidServiceID, fmt.Sprintf("nobody listens on port %d", sid.Port()))
		return
	}
	var f mad.REQFields
	r.Decode(&f)
	c := &Conn{cm: cm, state: stReqRcvd, localID: cm.newLocalID(), remoteID: f.LocalCommID, tid: tid, peer: peer, peerGSI: to.qpn,
		remoteGID: rk.gid, remoteQPN: f.LocalQPN, sqPSN: f.StartingPSN, // the REQ carries the passive side's sq PSN
		established: make(chan struct{}), done: make(chan struct{})}
	c.req = f
	c.req.PrivateData = nil
	c.remoteParam = ConnParam{
		PrivateData:        append([]byte(nil), ip.ConsumerData()...),
		ResponderResources: f.ResponderResources, InitiatorDepth: f.InitiatorDepth,
		RetryCount: f.RetryCount, RNRRetryCount: f.RNRRetryCount,
	}
	c.localAddr = netip.AddrPortFrom(ip.DstIP(), sid.Port())
	c.remoteAddr = netip.AddrPortFrom(ip.SrcIP(), ip.SrcPort())
	req := &ConnRequest{c: c}
	select {
	case l.reqs <- req:
	default:
		cm.ctr.BacklogOverflow.Add(1)
		cm.warn(warnBacklog, "rdmacm: dropped a REQ from %v for port %d: backlog of %d full", peer, sid.Port(), cap(l.reqs))
		return // the active side sends it again
	}
	cm.byLocal[c.localID] = c
	cm.byRemote[rk] = c
}

// onDREQ handles a DREQ. Caller holds mu.
func (cm *CM) onDREQ(d mad.DREQ, tid uint64, to dest) {
	c := cm.byLocal[d.RemoteCommID()]
	if c == nil || c.remoteID != d.LocalCommID() {
		// Gone already (timewait over) or never ours: ib_cm answers a DREP
		// anyway, so that the peer stops asking.
		cm.ctr.UnknownCommID.Add(1)
		cm.sendCM(to, mad.AttrDREP, tid, func(data []byte) {
			mad.DREP(data).Encode(&mad.RTUFields{LocalCommID: d.RemoteCommID(), RemoteCommID: d.LocalCommID()})
		})
		return
	}
	c.onDREQ(tid)
}

// localIPFor returns the local address the kernel routes towards dst from
// (the device's own when it is bound to one).
func (cm *CM) localIPFor(dst netip.Addr) (netip.Addr, error) {
	if !cm.gid.IsUnspecified() {
		return cm.gid.Unmap(), nil
	}
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, wire.RoCEv2Port)))
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// retransmitAfter is how long to wait for an answer from a peer whose CM
// response timeout is the exponent t: 4.096 µs × 2^t, plus the packet's
// round trip (small beside it; ib_cm adds twice the packet life time).
func retransmitAfter(t uint8) time.Duration {
	return mad.Timeout(t) + 2*mad.Timeout(localACKTimeout)
}
