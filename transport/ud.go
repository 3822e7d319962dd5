package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// The Unreliable Datagram service (IBTA vol. 1 chapter 9; Q_Keys 10.2.5;
// rxe's UD paths).
//
// A UD send is one packet, UD_SEND_ONLY or UD_SEND_ONLY_WITH_IMMEDIATE,
// with a DETH that carries the Q_Key and the source QPN; it goes where the
// work request's address handle says, to the QPN it names, and completes
// as soon as it is built (nothing acknowledges it). Its payload is at most
// the port's active MTU (IBTA C10-93.1.1), which PostSend checks; a
// received datagram may be longer (up to 4096 bytes) if it fits the
// receive WQE. The PSN counts up from sq_psn and is not checked by the
// receiver.
//
// A UD receive checks the Q_Key (QP1's is always the GSI's, 0x80010000),
// takes a receive WQE, and places the 40 bytes of the GRH and then the
// payload: on RoCEv2 the GRH area holds the
// packet's IP header as it arrived, as rxe copies it (for IPv4, 20 zero
// bytes and the 20-byte IPv4 header; for IPv6 the 40-byte IPv6 header).
// The WC has WCWithGRH, ByteLen 40 + payload and SrcQP from the DETH.
// A datagram that does not fit the receive WQE, a wrong Q_Key or a missing
// receive WQE drops the datagram, counted, and leaves the QP as it was:
// IBTA's class D errors of the unreliable services, rxe's behaviour (the
// receive WQE stays posted for the next datagram).

// GRHSize is the size of the Global Route Header a UD receive places at
// the head of its buffer (IBTA 8.3; ibv_grh).
const GRHSize = 40

// Errors of UD work requests.
var (
	// ErrBadAH reports a UD send without an address handle, with a
	// destroyed one, or with one of another protection domain.
	ErrBadAH = errors.New("address handle missing, destroyed or of another PD")
	// ErrBadAHAttr reports address-vector attributes CreateAH cannot use.
	ErrBadAHAttr = errors.New("invalid address handle attributes")
	// ErrMsgSize reports a UD send longer than the port's active MTU (a
	// datagram is one packet; IBTA C10-93.1.1).
	ErrMsgSize = errors.New("message longer than the path MTU")
)

// controlledQKey is the high bit of a Q_Key: a work request whose
// RemoteQKey has it set is sent with the QP's own Q_Key (IBTA 10.2.5,
// "controlled Q_Keys"; ibv_post_send(3)).
const controlledQKey = 0x80000000

// qkeyOf returns the Q_Key the UD QP takes datagrams with and sends
// controlled ones with: the GSI's well-known Q_Key 0x80010000 on QP1
// whatever its attributes hold (IBTA 13.5.1.2; rxe check_keys and
// init_req_packet use GSI_QKEY for QPN 1), else the QP's attribute.
func (qp *QP) qkeyOf(path *path) uint32 {
	if qp.qpn == GSIQPN {
		return mad.GSIQKey
	}
	return path.qkey
}

// AHAttr is what the transport needs of an address vector (the root
// package's AHAttr mirrors struct ibv_ah_attr).
type AHAttr struct {
	// Dest is the destination's IP address (its GID) and UDP port (0:
	// RoCEv2's 4791).
	Dest netip.AddrPort
	// HopLimit, TrafficClass and FlowLabel are the GRH fields of the
	// address vector. They are kept, not applied: every datagram leaves
	// with the socket's TTL (hop limit) 64 and TOS 0, which is what rxe
	// sends for an ibverbs AH too (the kernel resolves a RoCEv2 hop limit
	// from the route).
	HopLimit     uint8
	TrafficClass uint8
	FlowLabel    uint32
	SL           uint8
}

// AH is an address handle (struct ibv_ah): where a UD send goes. It is
// immutable; DestroyAH only marks it so that later posts refuse it.
type AH struct {
	pd        uint32
	attr      AHAttr
	dest      netip.AddrPort // normalized: unmapped IP, port set
	destroyed atomic.Bool
	dev       *Device
}

// CreateAH creates an address handle in protection domain pd
// (ibv_create_ah). The destination must be an address of the device's IP
// family. Errors: ErrBadAHAttr for a zero, multicast or broadcast
// destination, or one of the other IP family.
func (d *Device) CreateAH(pd uint32, attr *AHAttr) (*AH, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	ip := attr.Dest.Addr().Unmap()
	if !ip.IsValid() || ip.IsUnspecified() {
		return nil, fmt.Errorf("%w: no destination address (a zero DGID)", ErrBadAHAttr)
	}
	if ip.Is4() != d.conn.LocalAddr().Addr().Unmap().Is4() {
		return nil, fmt.Errorf("%w: %v is not of the device's address family (%v)", ErrBadAHAttr, ip, d.conn.LocalAddr().Addr())
	}
	if ip.IsMulticast() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return nil, fmt.Errorf("%w: %v: multicast and broadcast destinations are not supported", ErrBadAHAttr, ip)
	}
	port := attr.Dest.Port()
	if port == 0 {
		port = wire.RoCEv2Port
	}
	ah := &AH{pd: pd, attr: *attr, dest: netip.AddrPortFrom(ip, port), dev: d}
	d.ahs.Lock()
	if d.ahs.perPD == nil {
		d.ahs.perPD = make(map[uint32]int)
	}
	d.ahs.perPD[pd]++
	d.ahs.Unlock()
	return ah, nil
}

// DestroyAH destroys an address handle (ibv_destroy_ah). Work requests
// already posted with it are sent; later ones are refused.
func (d *Device) DestroyAH(ah *AH) error {
	if ah == nil || ah.dev != d || ah.destroyed.Swap(true) {
		return fmt.Errorf("%w: destroy", ErrBadAH)
	}
	d.ahs.Lock()
	if d.ahs.perPD[ah.pd]--; d.ahs.perPD[ah.pd] <= 0 {
		delete(d.ahs.perPD, ah.pd)
	}
	d.ahs.Unlock()
	return nil
}

// Dest returns the address the handle sends to.
func (ah *AH) Dest() netip.AddrPort { return ah.dest }

// Attr returns the attributes the handle was created with.
func (ah *AH) Attr() AHAttr { return ah.attr }

// checkUDWR makes PostSend's UD checks of wr (the opcode and the address
// handle). Caller holds sq.
func (qp *QP) checkUDWR(wr *SendWR) error {
	switch wr.Opcode {
	case WRSend, WRSendWithImm:
	default:
		return fmt.Errorf("%w: %v on a UD QP (SEND and SEND_WITH_IMM only)", ErrBadOpcode, wr.Opcode)
	}
	if wr.AH == nil || wr.AH.destroyed.Load() || wr.AH.pd != qp.pd {
		return ErrBadAH
	}
	return nil
}

// runRequesterUD builds one packet per UD send WQE and completes it
// (rxe_requester for UD: no window, no timer, no retry). Caller holds sq.
func (qp *QP) runRequesterUD(b *txBatch) bool {
	st := qp.State()
	if st != QPStateRTS {
		// SQD: a datagram is never in progress, so none is started.
		return false
	}
	path := qp.path.Load()
	r := &qp.req
	nslots := uint64(len(qp.sq.wqe))
	for budget := requesterBudget; r.idx < qp.sq.head; budget-- {
		if budget == 0 || b.full() {
			return true
		}
		if !qp.sendDatagram(b, path, &qp.sq.wqe[r.idx%nslots]) {
			return false // local error; the WQE was completed and the QP is in SQE (fail)
		}
	}
	return false
}

// sendDatagram builds the packet of UD send WQE w, the requester's next,
// and completes it. Caller holds sq.
func (qp *QP) sendDatagram(b *txBatch, path *path, w *sendWQE) bool {
	r := &qp.req
	op := wire.OpUDSendOnly
	if w.wr.Opcode == WRSendWithImm {
		op = wire.OpUDSendOnlyWithImmediate
	}
	n := int(w.length)
	info := wire.Info(op)
	pad := wire.PadFor(n)
	buf := b.alloc(info.Length+n+pad+wire.ICRCSize, w.wr.AH.dest, path.sport)
	wire.BTH(buf).Encode(&wire.BTHFields{
		Opcode:         op,
		SolicitedEvent: w.wr.Flags&SendSolicited != 0,
		PadCount:       pad,
		PKey:           wire.DefaultPKey,
		DestQP:         w.wr.RemoteQPN & wire.QPNMask,
		PSN:            r.psn,
	})
	qkey := w.wr.RemoteQKey
	if qkey&controlledQKey != 0 || qp.qpn == GSIQPN {
		qkey = qp.qkeyOf(path)
	}
	wire.DETH(buf[info.Offset[wire.HdrDETH]:]).Encode(qkey, qp.qpn)
	if info.Mask&wire.MaskImmDt != 0 {
		wire.ImmDt(buf[info.Offset[wire.HdrImmDt]:]).SetImm(w.wr.ImmData)
	}
	dst := buf[info.Length : info.Length+n]
	if pad != 0 {
		clear(buf[info.Length+n : info.Length+n+pad])
	}
	if w.isInline {
		copy(dst, w.inline[:n])
	} else if n > 0 {
		if st := qp.dev.place.Gather(qp.pd, w.wr.SGL, 0, dst); st != placement.OK {
			b.n-- // the MR went away under the WR (IBTA 10.7.2.2)
			qp.fail(w, WCLocProtErr)
			return false
		}
	}
	w.firstPSN, w.lastPSN, w.npkts, w.psnSet = r.psn, r.psn, 1, true
	r.psn = r.psn.Add(1)
	qp.sentWhole(w)
	return true
}

// sentWhole moves the requester past UC or UD send WQE w, whose last
// packet was just built. The unreliable services complete a send once it
// is handed to the network (rxe completes it after transmission): w
// completes in completeSent, after the batch holding its packets is sent.
// Caller holds sq.
func (qp *QP) sentWhole(w *sendWQE) {
	r := &qp.req
	r.idx++
	r.offset = 0
	if r.acct < r.idx {
		r.acct = r.idx
	}
}

// completeSent sends the batch and then completes, in order, the UC or UD
// send WQEs whose packets it held (runRequester calls it, without sq). It
// reports whether WQEs completed and others wait: a fenced local
// operation behind them may go now, and the requester must run again; and
// whether a completion overran the send CQ, which moved the QP to ERR
// (the caller flushes).
func (qp *QP) completeSent(b *txBatch) (more, fatal bool) {
	b.flush()
	qp.sq.Lock()
	defer qp.sq.Unlock()
	before := qp.comp.idx
	qp.retireSent()
	fatal, qp.fatal = qp.fatal, false // a completion overran the send CQ
	return qp.comp.idx != before && qp.req.idx < qp.sq.head, fatal
}

// retireSent completes, in order, the UC or UD WQEs the requester has gone
// past: sends as successful, executed local operations as retireLocal
// does; it stops at a local operation still waiting. Caller holds sq.
func (qp *QP) retireSent() {
	for qp.comp.idx < qp.req.idx {
		w := qp.oldest()
		switch w.local {
		case localDone:
			qp.retireLocal()
			continue
		case localWaiting:
			return
		}
		if w.done {
			return // completed in error (fail); the flush that follows takes the rest
		}
		qp.comp.psn = w.lastPSN.Add(1)
		qp.retire(w, WCSuccess)
	}
}

// respondUD runs the UD responder on one UD SEND whose Q_Key
// handleUnreliable checked (rxe: CHK_RESOURCE, CHK_LENGTH, EXECUTE with
// the GRH, COMPLETE). Called by the receive loop with respMu held.
func (qp *QP) respondUD(p *wire.Packet, pkt *conn.Packet, path *path) {
	ctr := &qp.dev.counters
	deth := p.DETH()
	r := &qp.resp
	if !r.haveRecv {
		if !qp.popRecv(&r.recv) {
			ctr.drop(DropNoRecvWQE) // no RNR NAK on UD: dropped (class D)
			return
		}
		r.haveRecv = true
		r.recvOff = 0
	}
	n := uint64(len(p.Payload))
	if GRHSize+n > r.recv.length {
		// Does not fit: dropped, counted, the WQE kept for the next
		// datagram and the QP unharmed (rxe: RESPST_ERR_LENGTH on UD
		// without SRQ, class D).
		ctr.drop(DropRecvTooSmall)
		return
	}
	var grh [GRHSize]byte
	putGRH(&grh, pkt.Addr.Addr(), qp.dev.conn.LocalAddr().Addr(), &pkt.IP, len(p.Raw))
	sgl := r.recv.sgl[:r.recv.nsge]
	st := qp.dev.place.Scatter(qp.pd, sgl, 0, grh[:])
	if st == placement.OK && n > 0 {
		st = qp.dev.place.Scatter(qp.pd, sgl, GRHSize, p.Payload)
	}
	if st != placement.OK {
		if st == placement.Suspended {
			qp.datagramSuspended()
			return
		}
		qp.recvQPError(path)
		return
	}
	r.haveRecv = false
	// rq_psn follows the datagrams taken, unchecked (rxe execute:
	// qp->resp.psn = pkt->psn + 1 for every request, UD's included).
	r.ePSN = p.PSN().Add(1)
	wc := WC{WRID: r.recv.wrid, Status: WCSuccess, Opcode: WCRecv, ByteLen: uint32(GRHSize + n),
		QPN: qpnOf(qp.qpn), SrcQP: uint32(deth.SrcQP()), Flags: WCWithGRH, SrcPort: pkt.Addr.Port()}
	if p.Info.Mask&wire.MaskImmDt != 0 {
		wc.Flags |= WCWithImm
		wc.ImmData = p.ImmDt().Imm()
	}
	ok := qp.recvCQ.push(&wc)
	qp.recvHeld.Store(false)
	if !ok {
		qp.cqOverrun(qp.recvCQ)
		qp.recvCQOverrun() // class G, as RC and UC
	}
}

// putGRH writes into grh the GRH area of a UD receive for a packet of
// pktLen bytes (the UDP payload, ICRC included) sent from src to dst: on
// RoCEv2 the IP header the packet arrived with, rebuilt from the addresses
// and what the conn reports of the rest (rxe copies the received header:
// for IPv4 into the last 20 bytes after 20 zero bytes, for IPv6 all 40).
func putGRH(grh *[GRHSize]byte, src, dst netip.Addr, ip *conn.IPInfo, pktLen int) {
	src, dst = src.Unmap(), dst.Unmap()
	udpLen := 8 + pktLen
	if src.Is4() {
		clear(grh[:20])
		h := grh[20:]
		h[0] = 0x45 // version 4, IHL 5
		h[1] = ip.TOS
		binary.BigEndian.PutUint16(h[2:], uint16(20+udpLen))
		binary.BigEndian.PutUint16(h[4:], ip.ID)
		binary.BigEndian.PutUint16(h[6:], 0x4000) // DF, as rxe and softrdma send (the ICRC was verified with it)
		h[8] = ip.TTL
		h[9] = 17 // UDP
		h[10], h[11] = 0, 0
		s4, d4 := src.As4(), dst.As4()
		copy(h[12:16], s4[:])
		copy(h[16:20], d4[:])
		binary.BigEndian.PutUint16(h[10:], ipv4Checksum(h))
		return
	}
	binary.BigEndian.PutUint32(grh[0:], 6<<28|uint32(ip.TOS)<<20|ip.FlowLabel&0xfffff)
	binary.BigEndian.PutUint16(grh[4:], uint16(udpLen))
	grh[6] = 17 // next header: UDP
	grh[7] = ip.TTL
	s16, d16 := src.As16(), dst.As16()
	copy(grh[8:24], s16[:])
	copy(grh[24:40], d16[:])
}

// ipv4Checksum returns the header checksum of the 20-byte IPv4 header h
// (RFC 791), computed with its checksum field zero.
func ipv4Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i < 20; i += 2 {
		s += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
