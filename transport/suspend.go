package transport

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// PausePolicy is what a device does with inbound packets whose placement
// is paused by a suspension.
type PausePolicy uint8

const (
	// PolicyHold queues the packets (bounded: HoldQueueLen) and replays
	// them in order when the suspension ends. A packet that finds the
	// queue full is dropped, counted, and recovered by the requester's
	// retransmission.
	PolicyHold PausePolicy = iota
	// PolicyNAK answers a paused request with an RNR NAK (the QP's
	// min_rnr_timer): the requester backs off and retries. Paused
	// responses (READ response data for a paused MR) are dropped, counted
	// and recovered by retransmission.
	PolicyNAK
)

func (p PausePolicy) String() string {
	if p == PolicyNAK {
		return "nak"
	}
	return "hold"
}

// ParsePausePolicy parses "hold" or "nak".
func ParsePausePolicy(s string) (PausePolicy, error) {
	switch s {
	case "", "hold":
		return PolicyHold, nil
	case "nak":
		return PolicyNAK, nil
	}
	return 0, fmt.Errorf("transport: pause policy %q: want hold or nak", s)
}

// HoldQueueLen bounds the packets a device holds while placement is paused.
const HoldQueueLen = 1024

// Suspension is placement paused at a scope (Device.Suspend); Resume ends
// it.
type Suspension struct {
	Scope  placement.Scope
	MR     *placement.MR // the MR the suspension is about (nil: a device-wide pause)
	Policy PausePolicy

	pd    uint32   // ScopePD, and ScopeQPAllowed without declarations
	qpns  []uint32 // ScopeQPAllowed: the QPs the rkey was advertised to
	gen   uint64   // suspension number: QPs paused by it carry it
	start time.Time
	base  SuspendCounters
	dev   *Device     // the device that made it: only it can Resume it
	done  atomic.Bool // resumed
}

// SuspendCounters count what suspensions did to traffic.
type SuspendCounters struct {
	Held         uint64 // packets queued while paused
	NAKed        uint64 // RNR NAKs sent for paused requests
	Dropped      uint64 // paused packets dropped (hold queue full, or responses under PolicyNAK)
	BytesDelayed uint64 // payload bytes of the packets held or NAKed
}

// SuspendReport is what a suspension did, returned by Resume.
type SuspendReport struct {
	SuspendCounters
	Duration  time.Duration // from Suspend's start to Resume
	QPsPaused int           // QPs that had a packet held or NAKed
}

// suspendState is a device's suspensions and hold queue.
type suspendState struct {
	mu        sync.Mutex
	list      atomic.Pointer[[]*Suspension] // the QP-scope suspensions
	active    atomic.Int32                  // len(*list)
	policy    atomic.Uint32                 // PausePolicy of the latest suspension
	policySet uint64                        // policy stores by Suspend (under mu): a failed one undoes its own only
	gen       atomic.Uint64
	replay    atomic.Bool // held packets may be due: the receive loop replays them

	held, naked, dropped, bytes atomic.Uint64

	// pausedQPs lists the QPs marked by markPaused since the last time
	// no suspension was active.
	pausedMu  sync.Mutex
	pausedQPs []*QP

	// The hold queue, owned by the receive loop.
	q     []heldPkt
	slots [][]byte
	free  []int
	// holdThis is set by the responder or completer when placement said
	// Suspended: handle then holds the packet (receive loop only).
	holdThis bool
}

type heldPkt struct {
	slot int
	n    int
	addr netip.AddrPort
	ip   conn.IPInfo // for a UD receive's GRH
	qpn  wire.QPN
}

func (s *suspendState) counters() SuspendCounters {
	return SuspendCounters{Held: s.held.Load(), NAKed: s.naked.Load(), Dropped: s.dropped.Load(), BytesDelayed: s.bytes.Load()}
}

// SuspendCounters returns the device's suspension counters.
func (d *Device) SuspendCounters() SuspendCounters { return d.susp.counters() }

// Suspend pauses placement at scope for mr (placement.Scope; the caller
// has widened it to what the device supports), with policy for the paused
// packets, and returns when no placement that the pause covers is still in
// flight. Every scope also pauses placement into mr itself (its key
// refuses writes), so no byte is written into mr until Resume whatever the
// scope; the wider scopes add the QPs they pause: ScopeQPAllowed the QPs
// mr.AdvertisedTo names (else every QP of mr's PD), ScopePD every QP of
// mr's PD, ScopeDevice every QP. mr may be nil only for ScopeDevice.
// Errors: an unknown scope, a nil mr, an MR already suspended or
// deregistered (EINVAL).
func (d *Device) Suspend(scope placement.Scope, mr *placement.MR, policy PausePolicy) (*Suspension, error) {
	if !scope.Valid() {
		return nil, fmt.Errorf("transport: suspend: scope %v: %w", scope, placement.ErrInvalid)
	}
	if mr == nil && scope != placement.ScopeDevice {
		return nil, fmt.Errorf("transport: suspend at scope %v needs an MR: %w", scope, placement.ErrInvalid)
	}
	if policy > PolicyNAK {
		return nil, fmt.Errorf("transport: suspend: policy %d: %w", policy, placement.ErrInvalid)
	}
	s := &Suspension{Scope: scope, MR: mr, Policy: policy, start: time.Now(), gen: d.susp.gen.Add(1), dev: d}
	if mr != nil {
		s.pd = mr.PD()
	}
	if scope == placement.ScopeQPAllowed {
		// The QPs allowed to use the MR: those its rkey was declared
		// advertised to, and those its type 2 windows are bound to. A
		// type 1 window, usable by any QP of the PD, or no declaration
		// at all, means the whole PD (qpns stays empty).
		wqps, type1 := d.place.WindowQPs(mr)
		if adv := mr.AdvertisedTo(); !type1 && len(adv)+len(wqps) > 0 {
			s.qpns = append(adv, wqps...)
		}
	}
	s.base = d.susp.counters()
	// The policy is the device's, for every suspension active (the
	// latest one's); a suspension that fails (an MR already suspended,
	// deregistered) gives the previous one back, so that it does not
	// change what happens to the packets of those still active.
	d.susp.mu.Lock()
	prev := d.susp.policy.Swap(uint32(policy))
	d.susp.policySet++
	set := d.susp.policySet
	d.susp.mu.Unlock()
	if scope != placement.ScopeMR {
		d.susp.mu.Lock()
		var l []*Suspension
		if p := d.susp.list.Load(); p != nil {
			l = slices.Clone(*p)
		}
		l = append(l, s)
		d.susp.list.Store(&l)
		d.susp.active.Store(int32(len(l)))
		d.susp.mu.Unlock()
	}
	if mr != nil {
		// The MR's own gate, and the wait for what is in flight (a grace
		// period of the receive loop covers the QP gates too).
		if err := d.place.SuspendMR(mr); err != nil {
			d.unlist(s)
			d.susp.mu.Lock()
			if d.susp.policySet == set { // no Suspend stored one since
				d.susp.policy.Store(prev)
			}
			d.susp.mu.Unlock()
			return nil, err
		}
	} else {
		d.place.Synchronize()
	}
	return s, nil
}

// unlist removes s from the QP-scope suspensions.
func (d *Device) unlist(s *Suspension) {
	d.susp.mu.Lock()
	defer d.susp.mu.Unlock()
	p := d.susp.list.Load()
	if p == nil {
		return
	}
	l := slices.DeleteFunc(slices.Clone(*p), func(x *Suspension) bool { return x == s })
	d.susp.list.Store(&l)
	d.susp.active.Store(int32(len(l)))
}

// Resume ends s: placement into its MR and the QPs it paused goes on, and
// the receive loop replays the held packets in order. It reports what the
// suspension did. Errors (EINVAL): s nil or already resumed, s made by
// another device (it stays active, for its own device's Resume); the MR's
// (deregistered while suspended: the suspension ends all the same).
func (d *Device) Resume(s *Suspension) (SuspendReport, error) {
	if s == nil || s.dev != d {
		return SuspendReport{}, fmt.Errorf("transport: resume: nil suspension, or one of another device: %w", placement.ErrInvalid)
	}
	if !s.done.CompareAndSwap(false, true) {
		return SuspendReport{}, fmt.Errorf("transport: resume of a suspension that is not active: %w", placement.ErrInvalid)
	}
	d.unlist(s)
	var err error
	if s.MR != nil {
		err = d.place.ResumeMR(s.MR)
	}
	d.susp.replay.Store(true)
	d.conn.Wake() // the loop may be blocked with packets to replay
	now := d.susp.counters()
	rep := SuspendReport{Duration: time.Since(s.start), SuspendCounters: SuspendCounters{
		Held: now.Held - s.base.Held, NAKed: now.NAKed - s.base.NAKed,
		Dropped: now.Dropped - s.base.Dropped, BytesDelayed: now.BytesDelayed - s.base.BytesDelayed,
	}}
	d.susp.pausedMu.Lock()
	for _, qp := range d.susp.pausedQPs {
		// A QP may be listed twice: marked late for an earlier
		// suspension (the receive loop read its number before that
		// Resume emptied the list), then again for this one.
		if qp.pausedGen.Load() >= s.gen && qp.pausedCounted != s.gen {
			qp.pausedCounted = s.gen
			rep.QPsPaused++
		}
	}
	if d.susp.active.Load() == 0 {
		clear(d.susp.pausedQPs)
		d.susp.pausedQPs = d.susp.pausedQPs[:0]
	}
	d.susp.pausedMu.Unlock()
	return rep, err
}

// markPaused records that a suspension held or NAKed a packet of qp: the
// QP carries the suspension's number and is listed once per number, so
// that Resume counts the paused QPs without scanning the QP table.
func (d *Device) markPaused(qp *QP) {
	g := d.susp.gen.Load()
	if qp.pausedGen.Swap(g) == g {
		return
	}
	d.susp.pausedMu.Lock()
	d.susp.pausedQPs = append(d.susp.pausedQPs, qp)
	d.susp.pausedMu.Unlock()
}

// qpPaused reports whether a QP-scope suspension covers qp. Called by the
// receive loop when a suspension is active.
func (d *Device) qpPaused(qp *QP) bool {
	p := d.susp.list.Load()
	if p == nil {
		return false
	}
	for _, s := range *p {
		switch s.Scope {
		case placement.ScopeDevice:
			return true
		case placement.ScopePD:
			if qp.pd == s.pd {
				return true
			}
		case placement.ScopeQPAllowed:
			if len(s.qpns) == 0 && qp.pd == s.pd || slices.Contains(s.qpns, uint32(qp.qpn)) {
				return true
			}
		}
	}
	return false
}

// paused handles a packet the gate stopped before any processing (a
// paused QP, or one with packets held before it): hold it, or under
// PolicyNAK answer a request at the expected PSN with an RNR NAK and drop
// the rest (they come again after the requester's back-off).
func (d *Device) paused(qp *QP, pkt *conn.Packet, p *wire.Packet) {
	d.markPaused(qp)
	if PausePolicy(d.susp.policy.Load()) == PolicyNAK && qp.held == 0 {
		if p.Info.Mask&wire.MaskReq != 0 {
			// Under respMu: a Modify to RESET or ERR may have returned
			// since handle's state check, and the expected PSN is the
			// responder's.
			qp.respMu.Lock()
			if qp.receiving() && p.PSN() == qp.resp.ePSN {
				qp.pauseNAK(&d.rxTx, qp.path.Load(), p)
				qp.respMu.Unlock()
				return
			}
			qp.respMu.Unlock()
		}
		d.susp.dropped.Add(1)
		d.counters.drop(DropSuspended)
		return
	}
	d.hold(qp, pkt, p)
}

// hold copies the packet into the hold queue.
func (d *Device) hold(qp *QP, pkt *conn.Packet, p *wire.Packet) {
	s := &d.susp
	d.markPaused(qp)
	if s.slots == nil {
		s.slots = make([][]byte, HoldQueueLen)
		for i := range s.slots {
			s.free = append(s.free, i)
		}
	}
	if len(s.free) == 0 {
		s.dropped.Add(1)
		d.counters.drop(DropSuspended)
		return
	}
	i := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	if s.slots[i] == nil {
		s.slots[i] = make([]byte, maxPacket+wire.ICRCSize)
	}
	n := len(pkt.Buf)
	if &s.slots[i][0] != &pkt.Buf[0] {
		n = copy(s.slots[i], pkt.Buf)
	}
	s.q = append(s.q, heldPkt{slot: i, n: n, addr: pkt.Addr, ip: pkt.IP, qpn: qp.qpn})
	qp.held++
	// The bytes first: a reader (Resume's report) that sees the packet
	// held sees its bytes too.
	qp.countDelayed(p)
	s.held.Add(1)
	if testHookDelayedCounted != nil {
		testHookDelayedCounted()
	}
}

// testHookDelayedCounted, when set (by tests), runs in the receive loop
// once a held or NAKed packet is counted.
var testHookDelayedCounted func()

// replayHeld hands the held packets to handle again, in the order they
// arrived; those still paused are held again, in the same order.
func (d *Device) replayHeld(p *wire.Packet) {
	s := &d.susp
	if len(s.q) == 0 {
		return
	}
	q := s.q
	s.q = nil
	for _, h := range q {
		if qp := d.QP(h.qpn); qp != nil {
			qp.held = 0
		}
	}
	for _, h := range q {
		// The slot is free again before the packet is handled: if it is
		// held again, hold takes this very slot back (the free list is a
		// stack) and copies the bytes onto themselves.
		s.free = append(s.free, h.slot)
		d.handle(&conn.Packet{Buf: s.slots[h.slot][:h.n], Addr: h.addr, IP: h.ip}, p)
	}
}

// pauseNAK answers a paused request with an RNR NAK (PolicyNAK). The
// cursor of a FIRST packet was not begun (or is ended by the caller).
func (qp *QP) pauseNAK(b *txBatch, path *path, p *wire.Packet) {
	d := qp.dev
	qp.countDelayed(p) // (before the packet, as hold)
	d.susp.naked.Add(1)
	if testHookDelayedCounted != nil {
		testHookDelayedCounted()
	}
	d.counters.SendRNRErr.Add(1)
	d.counters.drop(DropSuspended)
	qp.resp.nakSent = true
	qp.sendAck(b, path, wire.RNRNAK(path.minRNRTimer), p.PSN())
}

// placementSuspended handles a Suspended status from placement (the MR's
// own gate) in the responder or completer: the packet changed nothing (a
// FIRST packet's cursor, if begun, is ended here). Under PolicyNAK a
// request gets an RNR NAK and a response is dropped; otherwise handle holds
// the packet.
func (qp *QP) placementSuspended(b *txBatch, path *path, p *wire.Packet, c *placement.Cursor) {
	d := qp.dev
	d.markPaused(qp)
	if c != nil && p.Info.Mask&wire.MaskFirst != 0 && c.Busy() {
		d.place.End(c)
	}
	if PausePolicy(d.susp.policy.Load()) == PolicyNAK {
		if p.Info.Mask&wire.MaskReq != 0 {
			qp.pauseNAK(b, path, p)
		} else {
			d.susp.dropped.Add(1)
			d.counters.drop(DropSuspended)
		}
		return
	}
	d.susp.holdThis = true
}

// countDelayed adds the packet's payload to the bytes delayed, once per
// PSN: a retransmission or an RNR retry of a packet already held or NAKed
// is a packet, not more bytes delayed. Receive loop only.
func (qp *QP) countDelayed(p *wire.Packet) {
	psn := p.PSN()
	if qp.delayedSet && !qp.delayedPSN.Before(psn) {
		return
	}
	qp.delayedSet, qp.delayedPSN = true, psn
	qp.dev.susp.bytes.Add(uint64(len(p.Payload)))
}
