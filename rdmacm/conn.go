package rdmacm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// ConnParam is struct rdma_conn_param: what a side offers in its REQ
// (Connect), REP (Accept) or REJ (Reject, PrivateData only). Zero means
// zero, as in librdmacm (rping passes 1, 1, 7, 7).
type ConnParam struct {
	// PrivateData: at most 56 bytes in a REQ (92 less the IP CM
	// header), 196 in a REP, 148 in a REJ; longer is ErrPrivateData. The
	// peer receives it padded with zeros to the message's size.
	PrivateData []byte
	// ResponderResources is how many RDMA READs and atomics this side
	// accepts in flight (max_dest_rd_atomic; the peer's InitiatorDepth
	// should not exceed it).
	ResponderResources uint8
	// InitiatorDepth is how many RDMA READs and atomics this side issues
	// in flight (max_rd_atomic).
	InitiatorDepth uint8
	// RetryCount is the QP's retry_cnt (3 bits; 7 = forever on rxe and
	// softrdma). Connect only: the passive side takes the REQ's.
	RetryCount uint8
	// RNRRetryCount is the rnr_retry the PEER's QP uses towards this side
	// (3 bits; 7 = forever): the REQ's value is the passive side's, the
	// REP's the active side's (ib_cm).
	RNRRetryCount uint8
	// RoCEPort is the UDP port of the peer's device for Connect (a
	// softrdma extension; 0 means RoCEv2's 4791, what every RoCE NIC
	// listens on).
	RoCEPort uint16
	// PathMTU caps the path MTU (a softrdma extension; 0: no cap, as
	// rdma_cm, whose path MTU is the port's active MTU). Connect's REQ
	// offers the smaller of the port's active MTU and PathMTU; Accept
	// uses the smallest of the REQ's, the port's and PathMTU. It lets a
	// side whose link is larger than the peer's (a 9000-byte bridge
	// against a 1500-byte NIC) offer what the peer can receive.
	PathMTU softrdma.MTU
}

// pathMTU returns the port's active MTU capped by p.PathMTU.
func (p *ConnParam) pathMTU(active softrdma.MTU) softrdma.MTU {
	if p.PathMTU != 0 {
		return min(active, p.PathMTU)
	}
	return active
}

type state uint8

const (
	stReqSent     state = iota + 1 // active: REQ sent, waiting for REP
	stMRARcvd                      // active: the peer MRAed our REQ
	stReqRcvd                      // passive: REQ received, the application decides
	stMRASent                      // passive: we MRAed a duplicate REQ
	stRepSent                      // passive: REP sent, waiting for RTU
	stEstablished                  // RTU sent (active) or received (passive)
	stDreqSent                     // DREQ sent, waiting for DREP
	stTimewait                     // disconnected; duplicates of the last exchange are still answered
	stClosed                       // rejected, failed or timewait over
)

var stateNames = [...]string{"", "REQ_SENT", "MRA_REQ_RCVD", "REQ_RCVD", "MRA_REQ_SENT", "REP_SENT",
	"ESTABLISHED", "DREQ_SENT", "TIMEWAIT", "CLOSED"}

func (s state) String() string { return stateNames[s] }

// Conn is one RC connection made by the CM (an rdma_cm_id after
// RDMA_CM_EVENT_ESTABLISHED). Its state is guarded by the CM's lock.
type Conn struct {
	cm      *CM
	state   state
	active  bool
	localID uint32
	// remoteID is the peer's local communication ID.
	remoteID uint32
	tid      uint64
	qp       *softrdma.QP
	// peer is the UDP address of the peer's device (its GID and RoCE
	// port): where its MADs go and its QP's packets.
	peer      netip.AddrPort
	peerGSI   softrdma.QPN // the QP the peer's MADs come from (QP1)
	remoteGID netip.Addr
	remoteQPN softrdma.QPN
	// sqPSN is where this side's send queue starts, rqPSN where the
	// peer's does (our receive queue's first expected PSN). The REQ
	// carries the passive side's sq PSN, the REP the active side's (what
	// Linux's ib_cm does; rping.pcap shows it).
	sqPSN, rqPSN wire.PSN
	// localAddr and remoteAddr are the rdma_cm addresses (IP and port).
	localAddr, remoteAddr netip.AddrPort
	param                 ConnParam // ours
	remoteParam           ConnParam // the peer's, with its private data
	req                   mad.REQFields

	timer    *time.Timer
	resend   func() // sends the message the timer waits an answer to
	retries  int
	onExpire func() // what to do when the retries are used up

	established chan struct{} // closed when established or failed
	done        chan struct{} // closed on disconnect or failure (RDMA_CM_EVENT_DISCONNECTED)
	err         error
	settled     bool
	finished    bool
	qpModified  bool // connectQP ran: the QP is the connection's
}

// gsi is where the connection's MADs go.
func (c *Conn) gsi() dest { return dest{c.peer, c.peerGSI} }

// QP returns the connection's QP.
func (c *Conn) QP() *softrdma.QP { return c.qp }

// LocalAddr returns this side's rdma_cm address (IP and port;
// rdma_get_local_addr).
func (c *Conn) LocalAddr() netip.AddrPort { return c.localAddr }

// RemoteAddr returns the peer's rdma_cm address (rdma_get_peer_addr): for
// a passive side, the active side's IP and source port from the REQ's IP
// CM header.
func (c *Conn) RemoteAddr() netip.AddrPort { return c.remoteAddr }

// RemoteQPN returns the peer's QPN.
func (c *Conn) RemoteQPN() softrdma.QPN { return c.remoteQPN }

// RemoteParam returns what the peer offered: its REQ's parameters on the
// passive side, its REP's on the active side, with the private data
// (event->param.conn).
func (c *Conn) RemoteParam() ConnParam { return c.remoteParam }

// Done is closed when the connection ends: the peer's DREQ or our
// Disconnect (RDMA_CM_EVENT_DISCONNECTED), or a failure. The QP is in ERR
// by then.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the connection ended: nil after a disconnect, else the
// failure (ErrTimeout, ErrClosed).
func (c *Conn) Err() error {
	c.cm.mu.Lock()
	defer c.cm.mu.Unlock()
	return c.err
}

// State returns the ib_cm state name (REQ_SENT, ESTABLISHED, TIMEWAIT ...),
// for logs and tests.
func (c *Conn) State() string {
	c.cm.mu.Lock()
	defer c.cm.mu.Unlock()
	return c.state.String()
}

// Listener receives connection requests for one port (an rdma_cm_id in
// RDMA_CM_LISTEN).
type Listener struct {
	cm     *CM
	port   uint16
	reqs   chan *ConnRequest
	closed chan struct{}
}

// Listen binds port in the TCP port space (RDMA_PS_TCP, ServiceID
// 0x0000000001060000|port) and listens with a backlog of pending requests
// (rdma_bind_addr + rdma_listen; backlog < 1 means 128). A REQ beyond the
// backlog is dropped and counted; the active side sends it again.
// Errors: ErrPortInUse, ErrClosed.
func (cm *CM) Listen(port uint16, backlog int) (*Listener, error) {
	if backlog < 1 {
		backlog = 128
	}
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if cm.closed {
		return nil, ErrClosed
	}
	if cm.listeners[port] != nil {
		return nil, fmt.Errorf("%w: %d", ErrPortInUse, port)
	}
	l := &Listener{cm: cm, port: port, reqs: make(chan *ConnRequest, backlog), closed: make(chan struct{})}
	cm.listeners[port] = l
	return l, nil
}

// Port returns the port listened on.
func (l *Listener) Port() uint16 { return l.port }

// GetRequest waits for the next connection request
// (RDMA_CM_EVENT_CONNECT_REQUEST, rdma_get_request). Errors: ctx's,
// ErrClosed.
func (l *Listener) GetRequest(ctx context.Context) (*ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.closed:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close stops listening (rdma_destroy_id of the listening ID); requests
// not yet taken are rejected ("no resources"... as Linux: the port is
// gone, so "invalid service ID" for later REQs).
func (l *Listener) Close() error {
	l.cm.mu.Lock()
	defer l.cm.mu.Unlock()
	l.closeLocked()
	return nil
}

func (l *Listener) closeLocked() {
	select {
	case <-l.closed:
		return
	default:
	}
	close(l.closed)
	if l.cm.listeners[l.port] == l {
		delete(l.cm.listeners, l.port)
	}
	for {
		select {
		case r := <-l.reqs:
			if r.c.state == stReqRcvd || r.c.state == stMRASent { // not ended by the peer's REJ
				r.c.rejectLocked(mad.RejInvalidServiceID, nil)
			}
		default:
			return
		}
	}
}

// ConnRequest is a REQ waiting for the application's answer.
type ConnRequest struct{ c *Conn }

// RemoteAddr returns the active side's rdma_cm address (IP and source
// port, from the REQ's IP CM header).
func (r *ConnRequest) RemoteAddr() netip.AddrPort { return r.c.remoteAddr }

// LocalAddr returns the address the active side connected to.
func (r *ConnRequest) LocalAddr() netip.AddrPort { return r.c.localAddr }

// Param returns what the active side offered (its REQ), with its private
// data (56 bytes, zero-padded).
func (r *ConnRequest) Param() ConnParam { return r.c.remoteParam }

// RemoteQPN returns the active side's QPN.
func (r *ConnRequest) RemoteQPN() softrdma.QPN { return r.c.remoteQPN }

// Accept accepts the request on qp, an RC QP of the same device in RESET
// or INIT (receives may be posted in INIT, as after rdma_create_qp)
// (rdma_accept): the QP goes to INIT, RTR and RTS with the REQ's
// attributes (path MTU the smallest of the REQ's, the port's and
// p.PathMTU, the peer's QPN and start PSN, max_dest_rd_atomic =
// p.ResponderResources, max_rd_atomic = p.InitiatorDepth, retry_cnt and
// rnr_retry from the REQ, timeout 14), a REP goes back, and Accept waits for the RTU
// (RDMA_CM_EVENT_ESTABLISHED), sending the REP again at each timeout.
// Errors: ErrBadQP, ErrPrivateData (over 196 bytes), ErrState (answered
// already), ErrTimeout (no RTU), *RejectError (the active side gave up),
// the QP's modify error, ctx's (the connection is then abandoned with a
// REJ "timeout").
func (r *ConnRequest) Accept(ctx context.Context, qp *softrdma.QP, p ConnParam) (*Conn, error) {
	c := r.c
	cm := c.cm
	if len(p.PrivateData) > mad.REPPrivateDataSize {
		return nil, fmt.Errorf("%w: %d bytes in a REP (at most %d)", ErrPrivateData, len(p.PrivateData), mad.REPPrivateDataSize)
	}
	if err := checkQP(qp); err != nil {
		return nil, err
	}
	cm.mu.Lock()
	if c.state == stClosed && c.err != nil {
		// Ended before the application answered: the active side gave
		// up (its REJ), or the listener closed.
		err := c.err
		cm.mu.Unlock()
		return nil, err
	}
	if c.state != stReqRcvd && c.state != stMRASent {
		cm.mu.Unlock()
		return nil, fmt.Errorf("%w: accept in state %v", ErrState, c.state)
	}
	c.qp, c.param = qp, p
	c.rqPSN = randomPSN()
	mtu := min(softrdma.MTU(c.req.PathMTU), p.pathMTU(qp.ActiveMTU()))
	if err := c.connectQP(mtu, p.ResponderResources, p.InitiatorDepth, c.req.RetryCount, c.req.RNRRetryCount); err != nil {
		c.rejectLocked(mad.RejConsumerDefined, nil)
		cm.mu.Unlock()
		return nil, err
	}
	c.state = stRepSent
	c.resend = func() {
		cm.sendCM(c.gsi(), mad.AttrREP, c.tid, func(data []byte) {
			mad.REP(data).Encode(&mad.REPFields{LocalCommID: c.localID, RemoteCommID: c.remoteID,
				LocalQPN: qp.QPN(), StartingPSN: c.rqPSN, ResponderResources: p.ResponderResources,
				InitiatorDepth: p.InitiatorDepth, TargetACKDelay: targetACKDelay, RNRRetryCount: p.RNRRetryCount,
				LocalCAGUID: cm.guid, PrivateData: p.PrivateData})
		})
	}
	c.onExpire = func() { c.sendReject(mad.RejTimeout, nil); c.failLocked(ErrTimeout) }
	c.resend()
	c.arm(retransmitAfter(c.peerTimeout()))
	cm.mu.Unlock()
	return c, c.wait(ctx)
}

// Reject refuses the request with a REJ, reason "consumer defined" (28)
// and the given private data (rdma_reject; at most 148 bytes). Errors:
// ErrPrivateData, ErrState (answered already).
func (r *ConnRequest) Reject(privateData []byte) error {
	if len(privateData) > mad.REJPrivateDataSize {
		return fmt.Errorf("%w: %d bytes in a REJ (at most %d)", ErrPrivateData, len(privateData), mad.REJPrivateDataSize)
	}
	c := r.c
	c.cm.mu.Lock()
	defer c.cm.mu.Unlock()
	if c.state != stReqRcvd && c.state != stMRASent {
		return fmt.Errorf("%w: reject in state %v", ErrState, c.state)
	}
	c.rejectLocked(mad.RejConsumerDefined, privateData)
	return nil
}

// Connect connects qp, an RC QP of the CM's device in RESET or INIT (with
// receives posted, as after rdma_create_qp), to the rdma_cm listener at
// dst (IP and port), and waits until the connection is established
// (rdma_resolve_addr, rdma_resolve_route, rdma_connect and
// RDMA_CM_EVENT_ESTABLISHED): a REQ goes out (sent again at each CM
// response timeout), the REP's attributes take the QP to RTR and RTS
// (max_rd_atomic = the REP's responder resources, max_dest_rd_atomic =
// its initiator depth, rnr_retry its RNR retry count, retry_cnt
// p.RetryCount, timeout 14, path MTU the port's capped by p.PathMTU, as
// the REQ offered it), and an RTU goes back.
// The peer's device is at dst's IP and UDP port p.RoCEPort (default
// 4791). Errors: ErrBadQP, ErrPrivateData (over 56 bytes), *RejectError
// (RDMA_CM_EVENT_REJECTED: the reason and private data), ErrTimeout
// (RDMA_CM_EVENT_UNREACHABLE), the QP's modify error, ctx's (the attempt
// is abandoned with a REJ "timeout").
func (cm *CM) Connect(ctx context.Context, qp *softrdma.QP, dst netip.AddrPort, p ConnParam) (*Conn, error) {
	if len(p.PrivateData) > mad.IPConsumerDataSize {
		return nil, fmt.Errorf("%w: %d bytes in a REQ (at most %d after the IP CM header)", ErrPrivateData, len(p.PrivateData), mad.IPConsumerDataSize)
	}
	if err := checkQP(qp); err != nil {
		return nil, err
	}
	dstIP := dst.Addr().Unmap()
	src, err := cm.localIPFor(dstIP)
	if err != nil {
		return nil, fmt.Errorf("rdmacm: no route to %v: %w", dstIP, err)
	}
	if src.Is4() != dstIP.Is4() {
		return nil, fmt.Errorf("rdmacm: %v is not reachable from the device's address %v (other IP family)", dstIP, src)
	}
	rport := p.RoCEPort
	if rport == 0 {
		rport = wire.RoCEv2Port
	}
	cm.mu.Lock()
	if cm.closed {
		cm.mu.Unlock()
		return nil, ErrClosed
	}
	c := &Conn{cm: cm, active: true, state: stReqSent, localID: cm.newLocalID(), tid: cm.newTID(), qp: qp,
		peer: netip.AddrPortFrom(dstIP, rport), peerGSI: 1, remoteGID: dstIP, rqPSN: randomPSN(), param: p,
		localAddr:   netip.AddrPortFrom(src, ephemeralPort()),
		remoteAddr:  netip.AddrPortFrom(dstIP, dst.Port()),
		established: make(chan struct{}), done: make(chan struct{})}
	c.req = mad.REQFields{
		LocalCommID: c.localID, ServiceID: mad.IPServiceID(mad.PortSpaceTCP, dst.Port()), LocalCAGUID: cm.guid,
		LocalQPN: qp.QPN(), ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		RemoteCMResponseTimeout: cm.opts.ResponseTimeout, TransportServiceType: mad.TransportRC,
		StartingPSN: c.rqPSN, LocalCMResponseTimeout: cm.opts.ResponseTimeout, RetryCount: p.RetryCount & 7,
		PKey: wire.DefaultPKey, PathMTU: mad.PathMTU(p.pathMTU(qp.ActiveMTU())), RNRRetryCount: p.RNRRetryCount & 7,
		MaxCMRetries: cm.opts.MaxRetries,
		Primary: mad.PathFields{LocalLID: 0xffff, RemoteLID: 0xffff, LocalGID: src, RemoteGID: dstIP,
			HopLimit: 64, LocalACKTimeout: localACKTimeout},
	}
	var pd [mad.REQPrivateDataSize]byte
	mad.IPPrivateData(pd[:]).Encode(&mad.IPPrivateDataFields{SrcPort: c.localAddr.Port(), SrcIP: src, DstIP: dstIP,
		ConsumerData: p.PrivateData})
	c.req.PrivateData = pd[:]
	cm.byLocal[c.localID] = c
	c.resend = func() {
		cm.sendCM(c.gsi(), mad.AttrREQ, c.tid, func(data []byte) { mad.REQ(data).Encode(&c.req) })
	}
	c.onExpire = func() { c.sendReject(mad.RejTimeout, nil); c.failLocked(ErrTimeout) }
	c.resend()
	c.arm(retransmitAfter(cm.opts.ResponseTimeout))
	cm.mu.Unlock()
	if err := c.wait(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Disconnect ends the connection (rdma_disconnect): the QP goes to ERR
// (its outstanding WRs complete with WR_FLUSH_ERR) and a DREQ goes to the
// peer, sent again at each CM response timeout until its DREP; Done is
// closed at the DREP (or when the retries are used up). Disconnecting a
// connection already ending does nothing. Errors: ErrState before the
// connection is established.
func (c *Conn) Disconnect() error {
	cm := c.cm
	cm.mu.Lock()
	defer cm.mu.Unlock()
	switch c.state {
	case stDreqSent, stTimewait, stClosed:
		return nil
	case stEstablished, stRepSent:
	default:
		return fmt.Errorf("%w: disconnect in state %v", ErrState, c.state)
	}
	c.settleLocked(nil) // a passive side still waiting for the RTU
	c.qpToErr()
	c.state = stDreqSent
	c.tid = cm.newTID()
	c.resend = func() {
		cm.sendCM(c.gsi(), mad.AttrDREQ, c.tid, func(data []byte) {
			mad.DREQ(data).Encode(&mad.DREQFields{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.remoteQPN})
		})
	}
	c.onExpire = func() { c.timewaitLocked() }
	c.retries = 0
	c.resend()
	c.arm(retransmitAfter(c.peerTimeout()))
	return nil
}

// peerTimeout is the CM response timeout (a 5-bit exponent of 4.096 µs)
// of the peer's CM, how long it may take to answer us: ours for the
// active side (the REQ's Remote CM Response Timeout), the REQ's Local CM
// Response Timeout for the passive side (IBTA 12.7.31; ib_cm's
// cm_req_handler).
func (c *Conn) peerTimeout() uint8 {
	if c.active {
		return c.cm.opts.ResponseTimeout
	}
	return c.req.LocalCMResponseTimeout
}

// maxRetries is how many times a request (REQ, REP, DREQ) is sent again
// without an answer: the REQ's Max CM Retries, which "either CM" uses
// (IBTA 12.7.27): ours on the active side, which sent it, the REQ's on
// the passive side (ib_cm's cm_req_handler).
func (c *Conn) maxRetries() int {
	if c.active {
		return int(c.cm.opts.MaxRetries)
	}
	return int(c.req.MaxCMRetries)
}

// --- events, with cm.mu held -----------------------------------------

func (c *Conn) onREP(r mad.REP, tid uint64) {
	cm := c.cm
	switch c.state {
	case stEstablished, stDreqSent, stTimewait:
		if r.LocalCommID() == c.remoteID {
			cm.ctr.Duplicates.Add(1) // our RTU was lost: send it again (ib_cm)
			c.sendRTU()
		}
		return
	case stReqSent, stMRARcvd:
	default:
		cm.ctr.Duplicates.Add(1)
		return
	}
	var f mad.REPFields
	r.Decode(&f)
	c.remoteID = f.LocalCommID
	c.remoteQPN = f.LocalQPN
	c.sqPSN = f.StartingPSN
	c.remoteParam = ConnParam{PrivateData: append([]byte(nil), f.PrivateData...),
		ResponderResources: f.ResponderResources, InitiatorDepth: f.InitiatorDepth, RNRRetryCount: f.RNRRetryCount}
	c.stopTimer()
	// ib_cm: the active side's max_rd_atomic is the REP's responder
	// resources, its max_dest_rd_atomic the REP's initiator depth, its
	// rnr_retry the REP's RNR retry count.
	err := c.connectQP(softrdma.MTU(c.req.PathMTU), f.InitiatorDepth, f.ResponderResources, c.param.RetryCount, f.RNRRetryCount)
	if err != nil {
		cm.reject(c.gsi(), c.tid, c.localID, c.remoteID, mad.MsgREP, mad.RejConsumerDefined, nil)
		c.failLocked(err)
		return
	}
	c.sendRTU()
	c.state = stEstablished
	cm.byRemote[remoteKey{c.remoteID, c.remoteGID}] = c
	c.settleLocked(nil)
}

func (c *Conn) sendRTU() {
	c.cm.sendCM(c.gsi(), mad.AttrRTU, c.tid, func(data []byte) {
		mad.RTU(data).Encode(&mad.RTUFields{LocalCommID: c.localID, RemoteCommID: c.remoteID})
	})
}

func (c *Conn) onRTU() {
	if c.state != stRepSent {
		c.cm.ctr.Duplicates.Add(1)
		return
	}
	c.stopTimer()
	c.state = stEstablished
	c.settleLocked(nil)
}

func (c *Conn) onREJ(r mad.REJ) {
	switch c.state {
	case stReqSent, stMRARcvd, stReqRcvd, stMRASent, stRepSent, stEstablished:
		// A REJ after the RTU is a peer that timed out on us; it ends
		// the connection as well (ib_cm moves to TIMEWAIT).
	default:
		c.cm.ctr.Duplicates.Add(1)
		return
	}
	c.failLocked(&RejectError{Reason: r.Reason(), PrivateData: append([]byte(nil), r.PrivateData()...)})
}

func (c *Conn) onMRA(m mad.MRA) {
	wait := mad.Timeout(m.ServiceTimeout()) + retransmitAfter(c.peerTimeout())
	switch {
	case c.state == stReqSent && m.MessageMRAed() == mad.MsgREQ:
		c.state = stMRARcvd
	case c.state == stMRARcvd && m.MessageMRAed() == mad.MsgREQ,
		c.state == stRepSent && m.MessageMRAed() == mad.MsgREP:
	default:
		c.cm.ctr.Duplicates.Add(1)
		return
	}
	c.arm(wait) // the answer takes longer: wait, do not send again meanwhile
}

func (c *Conn) onDREQ(tid uint64) {
	cm := c.cm
	switch c.state {
	case stEstablished, stRepSent, stDreqSent:
	case stTimewait:
		cm.ctr.Duplicates.Add(1)
	default:
		cm.ctr.UnknownCommID.Add(1)
		return
	}
	cm.sendCM(c.gsi(), mad.AttrDREP, tid, func(data []byte) {
		mad.DREP(data).Encode(&mad.RTUFields{LocalCommID: c.localID, RemoteCommID: c.remoteID})
	})
	if c.state != stTimewait {
		c.settleLocked(nil)
		c.qpToErr()
		c.timewaitLocked()
	}
}

func (c *Conn) onDREP() {
	if c.state != stDreqSent {
		c.cm.ctr.Duplicates.Add(1)
		return
	}
	c.timewaitLocked()
}

// --- helpers, with cm.mu held ----------------------------------------

// connectQP takes c.qp from RESET or INIT to RTS towards the peer (the three
// ibv_modify_qp calls rdma_cm makes through ib_cm_init_qp_attr). The QP's
// qp_access_flags are REMOTE_WRITE, plus REMOTE_READ and REMOTE_ATOMIC
// when it accepts READs and atomics (ib_cm's cm_init_qp_init_attr).
func (c *Conn) connectQP(mtu softrdma.MTU, maxDest, maxRd, retry, rnr uint8) error {
	access := softrdma.AccessRemoteWrite
	if maxDest > 0 {
		access |= softrdma.AccessRemoteRead | softrdma.AccessRemoteAtomic
	}
	qp := c.qp
	c.qpModified = true
	if err := qp.Modify(&softrdma.QPAttr{State: softrdma.QPStateInit, Port: 1, AccessFlags: access},
		softrdma.QPAttrState|softrdma.QPAttrPKeyIndex|softrdma.QPAttrPort|softrdma.QPAttrAccessFlags); err != nil {
		return fmt.Errorf("rdmacm: QP to INIT: %w", err)
	}
	// The flow label is the REQ's primary path's, on both sides (ib_cm's
	// address vector): rxe derives the UDP source port from it, so both
	// sides of a connection send from the same port.
	if err := qp.Modify(&softrdma.QPAttr{State: softrdma.QPStateRTR, Dest: c.peer, PathMTU: mtu, DestQPN: c.remoteQPN,
		FlowLabel: c.req.Primary.FlowLabel & 0xfffff,
		RQPSN:     c.rqPSN, MaxDestRdAtomic: max(maxDest, 1), MinRNRTimer: 12},
		softrdma.QPAttrState|softrdma.QPAttrAV|softrdma.QPAttrPathMTU|softrdma.QPAttrDestQPN|softrdma.QPAttrRQPSN|
			softrdma.QPAttrMaxDestRdAtomic|softrdma.QPAttrMinRNRTimer); err != nil {
		return fmt.Errorf("rdmacm: QP to RTR: %w", err)
	}
	if err := qp.Modify(&softrdma.QPAttr{State: softrdma.QPStateRTS, SQPSN: c.sqPSN, Timeout: localACKTimeout,
		RetryCnt: retry & 7, RNRRetry: rnr & 7, MaxRdAtomic: max(maxRd, 1)},
		softrdma.QPAttrState|softrdma.QPAttrSQPSN|softrdma.QPAttrTimeout|softrdma.QPAttrRetryCnt|
			softrdma.QPAttrRNRRetry|softrdma.QPAttrMaxQPRdAtomic); err != nil {
		return fmt.Errorf("rdmacm: QP to RTS: %w", err)
	}
	return nil
}

// qpToErr moves the QP to ERR once the CM has taken it past INIT (a QP
// whose connection attempt failed before the REP stays as the
// application gave it, so that it may try again).
func (c *Conn) qpToErr() {
	if c.qp != nil && c.qpModified {
		_ = c.qp.Modify(&softrdma.QPAttr{State: softrdma.QPStateErr}, softrdma.QPAttrState)
	}
}

// rejectLocked refuses a REQ we hold (passive side) or abandons our own
// REQ or REP, with reason and private data, and ends the connection.
func (c *Conn) rejectLocked(reason mad.RejectReason, private []byte) {
	c.sendReject(reason, private)
	c.failLocked(&RejectError{Reason: reason, PrivateData: private})
}

// sendReject sends the REJ of rejectLocked without ending the connection.
func (c *Conn) sendReject(reason mad.RejectReason, private []byte) {
	msg := mad.MsgREQ
	if c.active {
		msg = mad.MsgREP // REJ answering a REP (or, before one, "timeout" of our REQ)
		if c.state == stReqSent || c.state == stMRARcvd {
			msg = mad.MsgOther
		}
	}
	c.cm.reject(c.gsi(), c.tid, c.localID, c.remoteID, msg, reason, private)
}

// arm (re)starts the retransmission timer.
func (c *Conn) arm(d time.Duration) {
	c.stopTimer()
	c.timer = time.AfterFunc(d, c.expired)
}

func (c *Conn) stopTimer() {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}

// expired runs when the peer did not answer in time: send again, or give
// up after MaxRetries.
func (c *Conn) expired() {
	cm := c.cm
	cm.mu.Lock()
	defer cm.mu.Unlock()
	switch c.state {
	case stReqSent, stMRARcvd, stRepSent, stDreqSent:
	default:
		return
	}
	if c.retries >= c.maxRetries() {
		c.timer = nil
		c.onExpire()
		return
	}
	c.retries++
	cm.ctr.Retransmits.Add(1)
	if c.state == stMRARcvd {
		c.state = stReqSent
	}
	c.resend()
	c.timer = time.AfterFunc(retransmitAfter(c.peerTimeout()), c.expired)
}

// settleLocked ends the wait of Connect or Accept with err (nil:
// established).
func (c *Conn) settleLocked(err error) {
	if c.settled {
		return
	}
	c.settled = true
	c.err = err
	close(c.established)
}

// failLocked ends the connection with err: QP to ERR, state forgotten,
// waiters woken.
func (c *Conn) failLocked(err error) {
	c.stopTimer()
	if c.state == stClosed {
		return
	}
	if c.finished {
		// Ended already (TIMEWAIT after a disconnect; CM.Close fails
		// every connection it has): the end stands, with its error.
		c.state = stClosed
		c.forget()
		return
	}
	c.settleLocked(err)
	if c.err == nil {
		c.err = err
	}
	c.qpToErr()
	c.state = stClosed
	c.forget()
	c.finish()
}

func (c *Conn) finish() {
	if !c.finished {
		c.finished = true
		close(c.done)
	}
}

func (c *Conn) forget() {
	cm := c.cm
	if cm.byLocal[c.localID] == c {
		delete(cm.byLocal, c.localID)
	}
	k := remoteKey{c.remoteID, c.remoteGID}
	if cm.byRemote[k] == c {
		delete(cm.byRemote, k)
	}
}

// timewaitLocked ends a disconnected connection: Done is closed, and the
// IDs are kept for a response timeout so that duplicates of the last
// exchange are answered (IBTA 12.9.7, TimeWait), then forgotten.
func (c *Conn) timewaitLocked() {
	c.stopTimer()
	c.state = stTimewait
	c.finish()
	c.timer = time.AfterFunc(retransmitAfter(c.cm.opts.ResponseTimeout), func() {
		c.cm.mu.Lock()
		defer c.cm.mu.Unlock()
		if c.state == stTimewait {
			c.state = stClosed
			c.forget()
		}
	})
}

// wait waits for the connection to be established or to fail. On ctx's
// end the attempt is abandoned with a REJ "timeout".
func (c *Conn) wait(ctx context.Context) error {
	select {
	case <-c.established:
	case <-ctx.Done():
		c.cm.mu.Lock()
		if !c.settled {
			c.rejectLocked(mad.RejTimeout, nil)
			c.err = ctx.Err()
		}
		c.cm.mu.Unlock()
	}
	c.cm.mu.Lock()
	defer c.cm.mu.Unlock()
	return c.err
}

func checkQP(qp *softrdma.QP) error {
	if qp == nil || qp.Type() != softrdma.QPTypeRC {
		return ErrBadQP
	}
	if st := qp.State(); st != softrdma.QPStateReset && st != softrdma.QPStateInit {
		return ErrBadQP
	}
	return nil
}

func randomPSN() wire.PSN {
	var r [4]byte
	_, _ = rand.Read(r[:])
	return wire.PSN(binary.BigEndian.Uint32(r[:])) & wire.PSNMask
}

// ephemeralPort returns the active side's rdma_cm source port for the IP
// CM header: a number from the Linux ephemeral range 32768-60999 (rdma_cm
// binds one; softrdma has no port table to bind, so it is only reported).
func ephemeralPort() uint16 {
	var r [2]byte
	_, _ = rand.Read(r[:])
	return 32768 + binary.BigEndian.Uint16(r[:])%(61000-32768)
}
