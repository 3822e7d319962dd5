package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// Implementation constants of the device.
const (
	// FirstQPN is the first QPN handed out; 0 and 1 are the special QPs
	// (SMI, GSI) and rxe starts at 17.
	FirstQPN = 0x11
	// MaxQPN bounds QPNs so that the QP table is a plain array.
	MaxQPN = 1 << 16
	// maxPacket is the largest RoCE packet we build or accept: the largest
	// header (WRITE_ONLY_WITH_IMMEDIATE, 32 bytes) + 4096 + ICRC, rounded.
	maxPacket = 4160
	// txBatchSize is the number of packets a send batch holds.
	txBatchSize = 128
)

// Config configures a Device.
type Config struct {
	Conn      conn.Conn            // the network; the device owns it from now on
	Placement *placement.Engine    // memory: STags and translation
	Logf      func(string, ...any) // rate-limited warnings; nil = silent
	// FaultPolicy says how the responder meets a page fault of an ODP MR
	// (FaultSync, the default, or FaultRNR).
	FaultPolicy FaultPolicy
	// ActiveMTU is the port's active MTU (0: MTU4096), derived from the
	// link's MTU by the caller (ActiveMTUFor).
	ActiveMTU MTU
	// SourcePort is the UDP source port of the device's packets (see
	// sport.go): SourcePortSpread (0, the default) gives each QP the one
	// Linux rxe would, 0xC000 plus a hash of its QPNs; SourcePortOwn (-1)
	// sends everything from the conn's own port, as does that port's
	// number; any other port number sends everything from that port
	// (NewDevice fails if it cannot be bound).
	SourcePort int
	// SlowRestart makes a retransmit timeout resend one packet and grow
	// the go-back-N window back as ACKs return (requester.go, onTimer),
	// instead of resending the whole window at once as rxe does; an RDMA
	// READ is asked for again in pieces no longer than that window
	// (sendReadRequest), not all its missing responses at once. It keeps
	// a receiver that fell behind (a loaded host) from drowning in copies
	// of the window, and costs throughput where the timeout is close to
	// the round trip (a false timeout restarts from one packet). Off by
	// default.
	SlowRestart bool
}

// FaultPolicy is how a responder handles a page fault on an ODP MR named
// by an incoming RDMA WRITE or atomic.
type FaultPolicy uint8

const (
	// FaultSync resolves the fault inline, before the packet is placed,
	// holding up the receive loop for the fault's duration (Linux rxe's
	// ODP: rxe_odp_mr_copy faults the range and copies).
	FaultSync FaultPolicy = iota
	// FaultRNR answers the packet with an RNR NAK (the QP's
	// min_rnr_timer), starts the fault in the background, and places the
	// packet when the requester retries it (mlx5's ODP on the responder).
	// The requester's rnr_retry bounds how often it retries.
	FaultRNR
)

func (p FaultPolicy) String() string {
	if p == FaultRNR {
		return "rnr"
	}
	return "sync"
}

// Device is one emulated RDMA NIC: a UDP endpoint, its QPs and the two
// goroutines that drive them (see the package doc).
type Device struct {
	conn        conn.Conn
	place       *placement.Engine
	logf        func(string, ...any)
	counters    Counters
	policy      FaultPolicy
	slowRestart bool // Config.SlowRestart
	// maxUnacked is the requesters' window in PSNs: MaxUnackedPSNs; tests
	// that count a window's packets set a smaller one.
	maxUnacked int32
	mtu        MTU // active MTU; 0: MTU4096
	susp       suspendState

	// spread: each QP sends from rxe's port for it (Config.SourcePort
	// 0); otherwise every packet leaves from fixedPort, held by the
	// device (0: the conn's own port). sportWarned counts the QPs that
	// could not hold their port.
	spread      bool
	fixedPort   uint16
	sportWarned atomic.Uint64

	// closing asks the receive loop to send its pending ACKs before Close
	// closes the socket; it closes acksFlushed when it has.
	warned          [NumDropReasons]atomic.Uint64 // warnDrop's per-reason counts
	sendWarned      atomic.Uint64                 // refused sends, for txBatch.flush's rate limit
	closing         atomic.Bool
	acksFlushed     chan struct{}
	acksFlushedOnce sync.Once

	// testHookRespond, when set (tests only, before a packet is handed
	// to handle), runs in the receive loop between the demux's checks of
	// a request and the responder, where a Modify may come in between.
	testHookRespond func(qp *QP)

	qps struct {
		sync.Mutex
		next uint32 // next QPN to try; guarded
	}
	qpTable [MaxQPN]atomic.Pointer[QP]
	// ahs counts the live address handles of each PD (DeallocPD).
	ahs struct {
		sync.Mutex
		perPD map[uint32]int
	}

	runq struct {
		sync.Mutex
		q []*QP // guarded
	}
	runqWake chan struct{}

	closed atomic.Bool
	done   chan struct{}
	wg     sync.WaitGroup
	rxTx   txBatch // used by the receive loop only
	// reader is the receive loop's RCU-style reader of the STag table: the
	// responders' cursors are bound to it, so a message takes no reference
	// count, and the loop quiesces after every batch (placement.Reader).
	reader   *placement.Reader
	workerTx txBatch // used by the send worker only
	ackList  []*QP   // QPs owing a coalesced ACK; receive loop only
	// buffered reports whether the conn holds packets already read
	// (conn.UDPConn.Buffered; nil if the conn cannot tell), and ackHeld
	// counts the packets handled since the coalesced ACKs were last sent:
	// the receive loop sends them when nothing is buffered or after
	// ackCoalescePackets packets. Receive loop only.
	buffered func() bool
	ackHeld  int
	// events is the asynchronous event queue (async.go).
	events eventQueue
}

// NewDevice starts a device on cfg.Conn.
func NewDevice(cfg Config) (*Device, error) {
	if cfg.Conn == nil || cfg.Placement == nil {
		return nil, errors.New("transport: Config needs Conn and Placement")
	}
	d := &Device{
		conn:        cfg.Conn,
		place:       cfg.Placement,
		logf:        cfg.Logf,
		policy:      cfg.FaultPolicy,
		slowRestart: cfg.SlowRestart,
		maxUnacked:  MaxUnackedPSNs,
		mtu:         cfg.ActiveMTU,
		runqWake:    make(chan struct{}, 1),
		done:        make(chan struct{}),
		acksFlushed: make(chan struct{}),
	}
	if d.logf == nil {
		d.logf = func(string, ...any) {}
	}
	if err := d.initSourcePort(cfg.SourcePort); err != nil {
		return nil, err
	}
	d.qps.next = FirstQPN
	d.events.init()
	d.reader = d.place.NewReader()
	if b, ok := cfg.Conn.(interface{ Buffered() bool }); ok {
		d.buffered = b.Buffered
	}
	d.rxTx.init(d)
	d.workerTx.init(d)
	d.wg.Add(2)
	go d.rxLoop()
	go d.txLoop()
	return d, nil
}

// ActiveMTU returns the port's active MTU (ibv_port_attr.active_mtu).
func (d *Device) ActiveMTU() MTU {
	if d.mtu == 0 {
		return MTU4096
	}
	return d.mtu
}

// ActiveMTU returns the active MTU of the QP's device's port.
func (qp *QP) ActiveMTU() MTU { return qp.dev.ActiveMTU() }

// Closed reports whether Close was called.
func (d *Device) Closed() bool { return d.closed.Load() }

// Counters returns the device's counters.
func (d *Device) Counters() *Counters { return &d.counters }

// Snapshot returns every counter by name: the rxe hw_counters, the drops
// by reason (drop_bad_icrc and drop_short come from the socket layer, which
// checks them before the engine sees a packet), the impairment counts and,
// on a UDP socket (conn.UDPConn.RecvQueue; 0 on a pipe, or where the
// kernel does not tell), the kernel's view of the receive socket:
// drop_socket_overflow, the datagrams it dropped because the receive
// buffer was full, and socket_rx_queued_bytes, a gauge of what waits in it
// now (a full buffer means the receive loop is that far behind the wire).
func (d *Device) Snapshot() []Counter {
	out := d.counters.Snapshot()
	cs := d.conn.Stats().Snapshot()
	var rq conn.RecvQueue
	if q, ok := d.conn.(interface {
		RecvQueue() (conn.RecvQueue, error)
	}); ok {
		rq, _ = q.RecvQueue() // zero when the kernel does not tell
	}
	for i := range out {
		switch out[i].Name {
		case "drop_bad_icrc":
			out[i].Value = cs.BadICRC
		}
	}
	return append(out,
		Counter{"drop_short", cs.Short},
		Counter{"drop_recv_queue_full", cs.RecvQueueFull},
		Counter{"drop_socket_overflow", rq.Drops},
		Counter{"socket_rx_queued_bytes", rq.Queued},
		Counter{"impair_tx_dropped", cs.TxImpair.Dropped},
		Counter{"impair_rx_dropped", cs.RxImpair.Dropped},
		Counter{"impair_reordered", cs.TxImpair.Reordered + cs.RxImpair.Reordered},
		Counter{"impair_duplicated", cs.TxImpair.Duplicated + cs.RxImpair.Duplicated},
		Counter{"impair_corrupted", cs.TxImpair.Corrupted + cs.RxImpair.Corrupted},
		Counter{"impair_delayed", cs.TxImpair.Delayed + cs.RxImpair.Delayed},
		Counter{"impair_discarded", cs.TxImpair.Discarded + cs.RxImpair.Discarded},
	)
}

// Conn returns the device's network endpoint.
func (d *Device) Conn() conn.Conn { return d.conn }

// LocalAddr returns the device's UDP address; its IP is the GID.
func (d *Device) LocalAddr() netip.AddrPort { return d.conn.LocalAddr() }

// Close stops the device, moves every QP to ERR (flushing its WRs) and
// closes the network endpoint.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	// ACKs are coalesced per receive batch and sent at its end, after the
	// completions of the batch are visible: an application that polls its
	// last completion and closes at once must not leave the peer
	// retrying a request we executed. The receive loop sends what is
	// pending before the socket closes (bounded wait: a loop stuck in a
	// long page fault does not hold Close up).
	d.closing.Store(true)
	d.conn.Wake()
	select {
	case <-d.acksFlushed:
	case <-time.After(100 * time.Millisecond):
	}
	for i := range d.qpTable {
		if qp := d.qpTable[i].Load(); qp != nil {
			qp.enterError()
			qp.stopTimer()
		}
	}
	close(d.done)
	err := d.conn.Close()
	d.wg.Wait()
	return err
}

// CreateQP creates a QP in RESET (ibv_create_qp) in protection domain pd.
// Capacities above the device limits (MaxQPWR, MaxSGE, MaxInline) are an
// error; zero capacities become 1 (SGEs) or 0 (inline).
func (d *Device) CreateQP(pd uint32, init *QPInitAttr) (*QP, error) {
	return d.createQP(pd, init, 0)
}

// GSIQPN is the QPN of the general services interface (IBTA 3.9.1, QP1):
// the UD QP that receives management datagrams, the CM's among them.
const GSIQPN = 1

// CreateGSIQP creates the device's GSI QP, the UD QP numbered 1 (IBTA
// 13.5.1). On Linux the kernel owns QP1 and ib_cm / rdma_cm use it;
// here the connection manager (package rdmacm) creates it with this
// call. init.Type must be QPTypeUD; the QP is made ready as any UD QP.
// It takes and sends datagrams with the GSI's well-known Q_Key 0x80010000
// (IBTA 13.5.1.2) whatever Q_Key its attributes hold, as rxe's QP1 does.
// Errors: ErrBadAttr as CreateQP, and ErrBusy when QP1 exists already.
func (d *Device) CreateGSIQP(pd uint32, init *QPInitAttr) (*QP, error) {
	if init.Type != QPTypeUD {
		return nil, fmt.Errorf("%w: the GSI QP is a UD QP", ErrBadAttr)
	}
	return d.createQP(pd, init, GSIQPN)
}

// createQP is CreateQP; a non-zero qpn asks for that number (a special
// QP) instead of the next free one from FirstQPN.
func (d *Device) createQP(pd uint32, init *QPInitAttr, qpn uint32) (*QP, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if init.Type != QPTypeRC && init.Type != QPTypeUC && init.Type != QPTypeUD {
		return nil, fmt.Errorf("%w: QP type %d (RC, UC or UD)", ErrBadAttr, init.Type)
	}
	if init.SendCQ == nil || init.RecvCQ == nil {
		return nil, fmt.Errorf("%w: send and receive CQs are required", ErrBadAttr)
	}
	for _, cq := range []*CQ{init.SendCQ, init.RecvCQ} {
		if cq.devDone != nil && cq.devDone != d.done {
			return nil, fmt.Errorf("%w: a CQ of another device", ErrBadAttr)
		}
	}
	c := init.Cap
	if c.MaxSendWR < 0 || c.MaxSendWR > MaxQPWR || c.MaxRecvWR < 0 || c.MaxRecvWR > MaxQPWR {
		return nil, fmt.Errorf("%w: max_send_wr %d / max_recv_wr %d (0-%d)", ErrBadAttr, c.MaxSendWR, c.MaxRecvWR, MaxQPWR)
	}
	if c.MaxSendSGE > MaxSGE || c.MaxRecvSGE > MaxSGE || c.MaxInlineData > MaxInline || c.MaxInlineData < 0 {
		return nil, fmt.Errorf("%w: max_sge %d/%d (max %d), max_inline_data %d (max %d)",
			ErrBadAttr, c.MaxSendSGE, c.MaxRecvSGE, MaxSGE, c.MaxInlineData, MaxInline)
	}
	if c.MaxSendSGE < 1 {
		c.MaxSendSGE = 1
	}
	if c.MaxRecvSGE < 1 {
		c.MaxRecvSGE = 1
	}
	qp := &QP{dev: d, typ: init.Type, pd: pd, sendCQ: init.SendCQ, recvCQ: init.RecvCQ, cap: c, sigAll: init.SQSigAll}
	// A QP may have no send queue (max_send_wr 0, a QP that only
	// receives: rxe and mlx5 create it, and every post is refused as the
	// queue is full), or no receive queue (max_recv_wr 0); each ring keeps
	// one slot, never used then, so that the ring arithmetic needs no
	// special case.
	slots := max(c.MaxSendWR, 1)
	qp.sq.wqe = make([]sendWQE, slots)
	sgl := make([]SGE, slots*c.MaxSendSGE)
	inl := make([]byte, slots*c.MaxInlineData)
	for i := range qp.sq.wqe {
		qp.sq.wqe[i].sgl = sgl[i*c.MaxSendSGE : (i+1)*c.MaxSendSGE : (i+1)*c.MaxSendSGE]
		qp.sq.wqe[i].inline = inl[i*c.MaxInlineData : (i+1)*c.MaxInlineData : (i+1)*c.MaxInlineData]
	}
	rslots := max(c.MaxRecvWR, 1)
	qp.rq.wqe = make([]recvWQE, rslots)
	rsgl := make([]SGE, rslots*c.MaxRecvSGE)
	for i := range qp.rq.wqe {
		qp.rq.wqe[i].sgl = rsgl[i*c.MaxRecvSGE : (i+1)*c.MaxRecvSGE : (i+1)*c.MaxRecvSGE]
	}
	qp.resp.recv.sgl = make([]SGE, c.MaxRecvSGE)
	qp.bindCursors()
	qp.resp.res = make([]rdRes, 1)
	mtu := MTU4096.Bytes()
	if init.Type == QPTypeUD {
		// A UD message is bounded by the port's MTU (IBTA C10-93.1.1;
		// rxe get_mtu: port.mtu_cap for UD); Modify never sets a UD
		// QP's path MTU (Table 91 has none for UD).
		mtu = d.ActiveMTU().Bytes()
	}
	qp.path.Store(&path{mtu: mtu})
	qp.timer = time.AfterFunc(time.Hour, qp.onTimer)
	qp.timer.Stop()

	d.qps.Lock()
	defer d.qps.Unlock()
	if init.SendCQ.destroyed.Load() || init.RecvCQ.destroyed.Load() {
		return nil, fmt.Errorf("%w: a destroyed CQ", ErrBadAttr)
	}
	if qpn != 0 {
		if d.qpTable[qpn].Load() != nil {
			return nil, fmt.Errorf("%w: QP %d exists", ErrBusy, qpn)
		}
		qp.qpn = wire.QPN(qpn)
		qp.bindCursors()
		// The GSI QP sends from rxe's port for QP1 (55410) on a RoCEv2
		// device (port 4791), and from the device's own port on a lab
		// device (any other port): a peer's CM answers a MAD at the port
		// it came from when the device is not on 4791 (package rdmacm),
		// and only the device's own socket receives.
		if d.conn.LocalAddr().Port() == wire.RoCEv2Port {
			qp.src.rxe = wire.QPSourcePort(qp.qpn)
		} else {
			qp.src.own = true
		}
		d.qpTable[qpn].Store(qp)
		return qp, nil
	}
	for range MaxQPN {
		n := d.qps.next
		d.qps.next++
		if d.qps.next >= MaxQPN {
			d.qps.next = FirstQPN
		}
		if d.qpTable[n].Load() == nil {
			qp.qpn = wire.QPN(n)
			qp.bindCursors() // again, now with the QPN that type 2 windows check
			// The UDP source port rxe gives a new QP (rxe_qp_init_req).
			qp.src.rxe = wire.QPSourcePort(qp.qpn)
			d.qpTable[n].Store(qp)
			return qp, nil
		}
	}
	return nil, fmt.Errorf("transport: all %d QPNs in use", MaxQPN-FirstQPN)
}

// DestroyCQ destroys cq (ibv_destroy_cq): Poll and Wait then return
// ErrBadCQ, and CreateQP refuses it. Errors: ErrBadCQ (nil, another
// device's CQ, or destroyed already); ErrBusy (EBUSY, as
// ibv_destroy_cq(3)) while a QP uses it as its send or receive CQ. Its
// asynchronous events are handled as DestroyQP handles a QP's: those not
// returned yet are discarded, and it returns once those returned are
// acknowledged.
func (d *Device) DestroyCQ(cq *CQ) error {
	if cq == nil || cq.devDone != d.done {
		return fmt.Errorf("transport: destroy CQ: %w", ErrBadCQ)
	}
	d.qps.Lock()
	if cq.destroyed.Load() {
		d.qps.Unlock()
		return fmt.Errorf("transport: destroy CQ: %w", ErrBadCQ)
	}
	for i := range d.qpTable {
		if qp := d.qpTable[i].Load(); qp != nil && (qp.sendCQ == cq || qp.recvCQ == cq) {
			d.qps.Unlock()
			return fmt.Errorf("transport: destroy CQ: QP %d uses it: %w", i, ErrBusy)
		}
	}
	cq.destroyed.Store(true)
	close(cq.gone) // every waiter polls again and gets ErrBadCQ
	d.qps.Unlock()
	d.forget(&cq.ev, func(ev *AsyncEvent) bool { return ev.CQ == cq })
	d.waitAcked(&cq.ev)
	return nil
}

// PDInUse names what keeps protection domain pd in use in the transport
// ("a QP", "an address handle"), or returns "" (ibv_dealloc_pd's EBUSY
// check, the transport's half).
func (d *Device) PDInUse(pd uint32) string {
	d.qps.Lock()
	for i := range d.qpTable {
		if qp := d.qpTable[i].Load(); qp != nil && qp.pd == pd {
			d.qps.Unlock()
			return fmt.Sprintf("QP %d", i)
		}
	}
	d.qps.Unlock()
	d.ahs.Lock()
	defer d.ahs.Unlock()
	if d.ahs.perPD[pd] > 0 {
		return "an address handle"
	}
	return ""
}

// DestroyQP removes the QP (ibv_destroy_qp). Its outstanding WRs are
// discarded without completions, as rxe discards them (rxe_qp_do_cleanup
// runs the completer and responder with qp->valid cleared, whose flushes
// then complete nothing: notify = qp->valid && state == ERR); a consumer
// that wants every WR back moves the QP to ERR and polls the flushed
// completions first, as ib_drain_qp does. Completions already in the CQs
// stay there. Its asynchronous events not yet returned are discarded and none is
// raised any more; like ibv_destroy_qp, it returns only when every event
// of the QP that GetAsyncEvent or PollAsyncEvent returned has been
// acknowledged (AckAsyncEvent), so that no goroutine handles an event of
// a QP destroyed under it.
func (d *Device) DestroyQP(qp *QP) error {
	if qp == nil || qp.dev != d || d.qpTable[qp.qpn].Load() != qp || qp.destroyed.Swap(true) {
		return fmt.Errorf("transport: destroy QP: %w", ErrBadQP)
	}
	d.forget(&qp.ev, func(ev *AsyncEvent) bool { return ev.QP == qp })
	defer d.waitAcked(&qp.ev)
	qp.discard()
	qp.stopTimer()
	d.qpTable[qp.qpn].CompareAndSwap(qp, nil)
	qp.modifyMu.Lock()
	qp.releaseSourcePort()
	qp.modifyMu.Unlock()
	// Type 2 windows go with their QP, so that a later QP of the same
	// number cannot use them.
	d.place.ReleaseQPWindows(uint32(qp.qpn))
	return nil
}

// QP returns the QP numbered qpn, or nil.
func (d *Device) QP(qpn wire.QPN) *QP {
	if qpn >= MaxQPN {
		return nil
	}
	return d.qpTable[qpn].Load()
}

// kick puts qp on the send worker's run queue unless it is there already.
func (d *Device) kick(qp *QP) {
	if !qp.scheduled.CompareAndSwap(false, true) {
		return
	}
	d.runq.Lock()
	d.runq.q = append(d.runq.q, qp)
	d.runq.Unlock()
	select {
	case d.runqWake <- struct{}{}:
	default:
	}
}

// txLoop is the send worker: it runs the requesters of kicked QPs and
// sends what they build.
func (d *Device) txLoop() {
	defer d.wg.Done()
	var work []*QP
	for {
		d.runq.Lock()
		work, d.runq.q = d.runq.q, work[:0]
		d.runq.Unlock()
		if len(work) == 0 {
			select {
			case <-d.runqWake:
				continue
			case <-d.done:
				return
			}
		}
		for _, qp := range work {
			qp.scheduled.Store(false)
			more := qp.runRequester(&d.workerTx)
			d.workerTx.flush()
			if more {
				d.kick(qp)
			}
		}
		clear(work)
	}
}

// rxLoop receives batches of datagrams and runs responders and completers.
func (d *Device) rxLoop() {
	defer d.wg.Done()
	defer d.reader.Close()
	pkts := make([]conn.Packet, d.conn.BatchSize())
	var p wire.Packet
	errs := 0
	for {
		n, err := d.conn.Receive(pkts)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || d.closed.Load() {
				return
			}
			errs++
			if errs%1000 == 1 {
				d.logf("softrdma: receive: %v", err)
			}
			continue
		}
		if d.susp.replay.Swap(false) {
			// A suspension ended: the packets it held go first.
			d.replayHeld(&p)
		}
		if d.closing.Load() && n == 0 {
			d.flushAcks()
			d.rxTx.flush()
			d.reader.Quiesce()
			d.acksFlushedOnce.Do(func() { close(d.acksFlushed) })
			continue
		}
		for i := range n {
			d.handle(&pkts[i], &p)
			// A suspension or deregistration waiting for a grace
			// period waits for this packet, not for the whole batch.
			d.reader.QuiesceIfWaited()
		}
		// Quiescent state: nothing found in the STag table during the
		// batch is used any more (the packets to send were copied into
		// the batch's slab), and the gates are not checked again until
		// the next batch; a DeregMR or a suspension waiting for a grace
		// period may proceed without waiting for the sends below.
		// Always before Receive blocks.
		d.endBatch(n)
	}
}

// endBatch ends a receive batch of n packets: the reader quiesces, the
// coalesced ACKs go if nothing more is buffered in the conn or
// ackCoalescePackets packets were handled since they last went, and what
// the batch owes is sent.
func (d *Device) endBatch(n int) {
	d.reader.Quiesce()
	d.ackHeld += n
	if d.ackHeld >= ackCoalescePackets || d.buffered == nil || !d.buffered() {
		d.flushAcks()
	}
	d.rxTx.flush()
}

// ackCoalescePackets bounds how many packets the receive loop handles
// before it sends the ACKs it coalesced, while more packets wait in the
// conn: a quarter of a requester's window (MaxUnackedPSNs), so that the
// window keeps moving. IBTA 9.7.5.1.1 lets a responder acknowledge many
// requests with one ACK. A receive batch is 64 packets (conn.
// IdealBatchSize), and an ACK per batch cost a write-bw at 64 KiB over
// loopback an ACK per 4 messages, each a wake-up of the requester's
// receive loop (docs/performance.md, "Session 12"). When nothing more is
// buffered the ACKs go at once, before the next Receive may block, so a
// lone request is acknowledged as fast as before.
const ackCoalescePackets = MaxUnackedPSNs / 4

// warnDrop logs a dropped packet that a peer should not have sent (the
// log names the peer and what it asked), rate-limited per reason: the first
// 10, then one in 1000. The drop itself is counted by the caller.
func (d *Device) warnDrop(r DropReason, format string, args ...any) {
	if warnNth(d.warned[r].Add(1)) {
		d.logf(format, args...)
	}
}

// warnNth reports whether the nth warning of one kind is logged: the
// first 10, then one in 1000, so that a fault that repeats for every
// packet (a peer sending garbage, a socket refusing every datagram) does
// not flood the log.
func warnNth(n uint64) bool { return n <= 10 || n%1000 == 0 }

// handle is the receive demux (rxe_rcv's checklist): decode, find the QP,
// check P_Key and peer, then hand requests to the responder and responses
// to the completer. Every drop is counted by reason.
func (d *Device) handle(pkt *conn.Packet, p *wire.Packet) {
	c := &d.counters
	if err := wire.Parse(pkt.Buf, p); err != nil {
		if errors.Is(err, wire.ErrUnknownOpcode) {
			c.drop(DropUnknownOpcode)
			if len(pkt.Buf) > 0 {
				// XRC, RD, CNP and reserved opcodes: not implemented.
				d.warnDrop(DropUnknownOpcode, "softrdma: dropped a packet from %v: opcode %#02x is not supported (RC, UC and UD only)", pkt.Addr, pkt.Buf[0])
			}
		} else {
			c.drop(DropMalformed)
			d.warnDrop(DropMalformed, "softrdma: dropped a malformed packet from %v: %v", pkt.Addr, err)
		}
		return
	}
	bth := p.BTH()
	if pk := bth.PKey(); pk&0x7fff != wire.DefaultPKey&0x7fff {
		c.drop(DropBadPKey)
		return
	}
	qp := d.QP(bth.DestQP())
	if qp == nil {
		c.drop(DropUnknownQPN)
		return
	}
	if p.Opcode().Transport() != qp.typ.transport() {
		c.drop(DropUnknownOpcode) // not of the QP's service (rxe check_type_state)
		d.warnDrop(DropUnknownOpcode, "softrdma: dropped a packet from %v: opcode %v for QP %d, which is not of that service", pkt.Addr, p.Opcode(), bth.DestQP())
		return
	}
	if qp.typ != QPTypeRC {
		d.handleUnreliable(qp, pkt, p) // uc.go
		return
	}
	if !qp.receiving() {
		c.drop(DropBadQPState)
		return
	}
	path := qp.path.Load()
	// The peer's address before anything about the packet itself, as
	// rxe's hdr_check runs check_addr before the responder's check_length:
	// a packet from another host is a wrong_address drop whatever its
	// length.
	if path.dest.Addr() != pkt.Addr.Addr().Unmap() {
		c.drop(DropWrongAddress)
		return
	}
	if len(p.Payload) > path.mtu {
		c.drop(DropTooLong)
		return
	}
	if qp.State() == QPStateRTR && p.Info.Mask&wire.MaskReq != 0 {
		qp.commEstablished()
	}
	// The suspension gate. The reader goes online first, so that a
	// Suspend that closes the gate and then waits for a grace period
	// waits for this packet too.
	d.reader.Enter()
	if qp.held != 0 || d.susp.active.Load() != 0 && d.qpPaused(qp) {
		d.paused(qp, pkt, p)
		return
	}
	if p.Info.Mask&wire.MaskReq != 0 {
		if d.testHookRespond != nil {
			d.testHookRespond(qp)
		}
		qp.respMu.Lock()
		if !qp.receiving() {
			// A Modify to RESET or ERR, which holds respMu, has returned
			// since the check above: the request meets the QP in that
			// state and is dropped (the responder would otherwise place
			// and acknowledge it after ibv_modify_qp returned).
			qp.respMu.Unlock()
			c.drop(DropBadQPState)
			return
		}
		c.RcvdPkts.Add(1)
		qp.respond(p, path, &d.rxTx)
		qp.respMu.Unlock()
	} else {
		c.RcvdPkts.Add(1)
		qp.completeRecv(p, path) // checks the state under sq
	}
	if d.susp.holdThis {
		// Placement into a suspended MR: the packet changed nothing and
		// is counted as received when it is replayed.
		d.susp.holdThis = false
		c.RcvdPkts.Add(^uint64(0))
		d.hold(qp, pkt, p)
	}
}

// receiving reports whether the QP's state lets its responder take
// packets: RTR, RTS, SQD or SQE (IBTA 10.3.1; RESET, INIT and ERR drop
// them). The receive loop checks it again under respMu, which a Modify
// to RESET or ERR holds.
func (qp *QP) receiving() bool {
	st := qp.State()
	return st != QPStateReset && st != QPStateInit && st != QPStateErr
}

// flushAcks sends the ACKs coalesced during one receive batch, one per QP
// (the latest), counting the ones saved as ack_deferred. The owed ACK is
// responder state, which a Modify to RESET rewrites: it is read under
// respMu.
func (d *Device) flushAcks() {
	d.ackHeld = 0
	for _, qp := range d.ackList {
		qp.respMu.Lock()
		qp.resp.inAckList = false
		if qp.resp.ackPend {
			qp.resp.ackPend = false
			qp.sendAck(&d.rxTx, qp.path.Load(), wire.SyndromeACK, qp.resp.ackPSN)
		}
		qp.respMu.Unlock()
	}
	clear(d.ackList)
	d.ackList = d.ackList[:0]
}

// txBatch collects packets to send in one Conn.Send call. Buffers are
// preallocated in one slab; a batch is used by one goroutine.
type txBatch struct {
	d    *Device
	slab []byte
	pkts []conn.Packet
	n    int
	icrc icrcCopier // the ICRC of the packet being built (beginICRC)
	// prefixes caches the ICRC prefixes of the last two (path, length)
	// pairs: a message's packets have one or two lengths (a FIRST with a
	// RETH, then MIDDLEs and a LAST), and the prefix is the same for all
	// packets of a length.
	prefixes [2]icrcPrefix
	victim   int // the entry of prefixes to replace next
}

type icrcPrefix struct {
	path   *path // nil: empty
	pktLen int
	p      wire.ICRCPrefix
}

// icrcCopier is the placement.Copier of the payload of the packet being
// built: it advances the packet's ICRC over what it copies.
type icrcCopier struct{ st wire.ICRCState }

func (c *icrcCopier) Copy(dst, src []byte) { c.st = c.st.Copy(dst, src) }
func (c *icrcCopier) Copied(p []byte)      { c.st = c.st.Update(p) }

// beginICRC starts the ICRC of the packet buf, the batch's last, whose
// headers (BTH and extension headers, final) are its first hdrLen bytes,
// as the conn will send it: from the device's address and the path's
// source port, for IPv4 ID 0 (conn.Packet.ICRCReady). The payload must
// follow through the returned copier, then endICRC.
func (b *txBatch) beginICRC(path *path, buf []byte, hdrLen int) *icrcCopier {
	b.icrc.st = b.prefix(path, len(buf)).BeginCached(buf).Update(buf[wire.BTHSize:hdrLen])
	return &b.icrc
}

// prefix returns the ICRC prefix of packets of pktLen bytes on path (the
// batch's own, for BeginCached).
func (b *txBatch) prefix(path *path, pktLen int) *wire.ICRCPrefix {
	for i := range b.prefixes {
		if e := &b.prefixes[i]; e.path == path && e.pktLen == pktLen {
			return &e.p
		}
	}
	local := b.d.conn.LocalAddr()
	sport := path.sport
	if sport == 0 {
		sport = local.Port()
	}
	h := wire.IPHeader{Src: local.Addr(), Dst: path.dest.Addr(), DF: true}
	e := &b.prefixes[b.victim]
	b.victim = (b.victim + 1) % len(b.prefixes)
	*e = icrcPrefix{path: path, pktLen: pktLen, p: wire.NewICRCPrefix(&h, sport, path.dest.Port(), pktLen)}
	return &e.p
}

// endICRC hashes the pad, from byte end of buf, stores the ICRC in the
// trailer and marks the batch's last packet ICRCReady.
func (b *txBatch) endICRC(buf []byte, end int) {
	body := len(buf) - wire.ICRCSize
	st := b.icrc.st.Update(buf[end:body])
	binary.LittleEndian.PutUint32(buf[body:], st.Sum())
	b.pkts[b.n-1].ICRCReady = true
}

func (b *txBatch) init(d *Device) {
	b.d = d
	b.slab = make([]byte, txBatchSize*maxPacket)
	b.pkts = make([]conn.Packet, txBatchSize)
}

// full reports whether the batch has no free slot.
func (b *txBatch) full() bool { return b.n == txBatchSize }

// alloc returns a zeroed-length slot of size bytes addressed to to, to be
// sent from UDP source port sport (0: the device's own), flushing first if
// the batch is full.
func (b *txBatch) alloc(size int, to netip.AddrPort, sport uint16) []byte {
	if b.n == txBatchSize {
		b.flush()
	}
	buf := b.slab[b.n*maxPacket : b.n*maxPacket+size : (b.n+1)*maxPacket]
	// Field by field: a composite literal is built on the stack and
	// copied in 16-byte moves that wait on its 8-byte stores (a failed
	// store forward, 8 % of BenchmarkRequesterWrite's time).
	p := &b.pkts[b.n]
	p.Buf, p.Addr, p.IP, p.SrcPort, p.ICRCReady = buf, to, conn.IPInfo{}, sport, false
	b.n++
	return buf
}

// flush sends the batch.
func (b *txBatch) flush() {
	if b.n == 0 {
		return
	}
	err := b.d.conn.Send(b.pkts[:b.n])
	failed := 0
	if err != nil {
		failed = refused(err, b.n)
	}
	b.d.counters.SentPkts.Add(uint64(b.n - failed))
	if err != nil {
		b.d.counters.SendErr.Add(uint64(failed))
		// Rate-limited as warnDrop: a datagram the kernel always refuses
		// (EMSGSIZE, a path MTU larger than the link carries) fails again
		// on every retransmission, for ever with retry_cnt 7.
		if n := b.d.sendWarned.Add(1); !b.d.closed.Load() && warnNth(n) {
			b.d.logf("softrdma: send: %v (failed sends so far: %d; send_err counts the datagrams)", err, n)
		}
	}
	clear(b.pkts[:b.n])
	b.n = 0
}

// refused returns how many of the n datagrams of a failed Send did not
// leave: the count of a *conn.SendError (the kernel refused some, the rest
// left), else all n. Apart from flush so that the error's variable, which
// escapes, is allocated only on this path.
func refused(err error, n int) int {
	var se *conn.SendError
	if errors.As(err, &se) {
		return min(se.Failed, n)
	}
	return n
}

// buildHeader writes a BTH for op into a packet of the QP and returns the
// packet buffer sized for payload bytes plus pad and ICRC.
func buildPacket(b *txBatch, path *path, op wire.Opcode, psn wire.PSN, ackReq bool, payload int) ([]byte, *wire.OpInfo) {
	info := wire.Info(op)
	pad := wire.PadFor(payload)
	buf := b.alloc(info.Length+payload+pad+wire.ICRCSize, path.dest, path.sport)
	wire.BTH(buf).Encode(&wire.BTHFields{
		Opcode:   op,
		PadCount: pad,
		PKey:     wire.DefaultPKey,
		DestQP:   path.destQPN,
		AckReq:   ackReq,
		PSN:      psn,
	})
	if pad != 0 {
		clear(buf[info.Length+payload : info.Length+payload+pad])
	}
	return buf, info
}
