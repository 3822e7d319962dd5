package perf

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/cmchan"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/exchange"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/idlewatch"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/odpbuf"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/transport/pcaptap"
)

// session is one side of one tool run: the control channel, the device,
// the registered buffer, and the QPs of the current round.
type session struct {
	closed bool // close ran
	// lastPeer is the peer's address in the last round destroyed
	// (destroyRound), for --stat.
	lastPeer string
	o        *Options
	p        Params
	test     Test
	server   bool
	ctrl     *exchange.Conn
	xch      exchange.QPExchanger
	// pt is perftest's exchange when the peer is a stock perftest tool
	// (or --perftest); ctrl and xch are nil then. See perftest.go.
	pt *exchange.Perftest
	pm ptMode // perftest mode's state
	// tcpLocal and tcpRemote are the control connection's addresses: the
	// IP that reaches the peer, and the peer's. With -R, the device's IP
	// and the peer's (see cm.go).
	tcpLocal, tcpRemote netip.Addr
	// -R (cm.go): the device's CM, the server's listener (the channel's
	// and the data connections' port), the channel the exchange runs
	// over, and the round's data connections.
	cm    *rdmacm.CM
	lst   *rdmacm.Listener
	ch    *cmchan.Conn
	conns []*rdmacm.Conn
	ctx   context.Context // canceled when the control channel closes
	// runCtx is Run's context: its end is an interrupt (SIGINT, SIGTERM).
	runCtx context.Context
	unit   report.Unit
	json   report.JSON // the report, filled as the run goes

	dev    *softrdma.Device
	ownDev bool
	tap    *pcaptap.Writer
	tapErr error // why the --pcap capture could not be written (close)
	pd     *softrdma.PD
	mem    []byte // the registered buffer: QPs regions of stride bytes
	stride int    // bytes per QP region
	region int    // bytes of each region the peer may access
	mr     *softrdma.MR
	base   uint64 // the IOVA of mem[0] through mr
	// odp is the buffer registered on demand (--odp, --iodp): mem, mr
	// and base are its; nil for a pinned buffer.
	odp *odpbuf.Buffer
	// peerODP is the peer's last ODP report (nil: its buffer is pinned).
	peerODP *report.ODPJSON

	// fileSize is the size of the file moved (-1: none); the file is the
	// client's for WRITE and SEND, the server's for READ.
	fileSize  int64
	file      *os.File // the file this side sends, if any
	out       *os.File // --out's temporary file, if this side receives a file (finishOut)
	outErr    error    // why out could not be closed
	outPath   string   // what the temporary file replaces: --out, its symlink resolved
	outDirect bool     // out is --out itself (not a regular file: a device such as /dev/null), written in place

	// The current round.
	cq      *softrdma.CQ
	qps     []*softrdma.QP
	psns    []uint32
	remote  []exchange.QPInfo
	nrounds int // rounds run so far
	// boundEnd is when the bounded context of this side's run (-D)
	// expires, in Unix nanoseconds; 0 when none is running. Read by the
	// goroutine that waits for the peer's result (round).
	boundEnd atomic.Int64
	// roundStart is when this side's run of the current round started
	// (after its barrier): what drainError measures its wait from.
	roundStart time.Time
	// boundUsed is whether this side's run of the round was bounded by
	// session.bounded (it posts the work, with -D).
	boundUsed bool
	// now, if set (by tests), replaces time.Now as the receivers' clock
	// (sendBWServer, pull: recvClock).
	now func() time.Time
	// idle is the idle watch of the round's run (-n, --idle-timeout;
	// nil: none), set before the run and read by its loops.
	idle *idlewatch.Watch
	// rcvdAtDrain is the device's rcvd_pkts when a -D run's duration
	// ended and its drain began (-1: not yet): a drain that expires says
	// whether the peer was still sending (drainError).
	rcvdAtDrain atomic.Int64
	// peerSpoke is closed when the peer's result (or error) of the
	// round arrived, set before the run like idle.
	peerSpoke chan struct{}
	// The exchange's setup: its time limit, when it expires, and the
	// peer's TCP address (for the messages).
	setupLimit time.Duration
	setupEnd   time.Time
	peerTCP    string
}

// ringSlots is the number of message slots of a --verify or --file ring
// for messages of size bytes: at most tx-depth, and at most StreamBuffer
// bytes unless one message is larger.
func ringSlots(p *Params, size int64) int {
	return int(max(1, min(int64(p.TxDepth), StreamBuffer/size)))
}

// streams reports whether messages of t move through a ring with flow
// control (--file, or --verify of WRITE and SEND) rather than perftest's
// fixed buffer.
func (s *session) streams() bool {
	if s.pt != nil {
		return false // the perftest peer knows no streams
	}
	return s.fileSize >= 0 || s.p.Verify && (s.test == WriteBW || s.test == SendBW)
}

// slotStride is the distance between the two slots (receive, send) of a
// latency test's region.
func slotStride(maxSize int64) int { return roundUp(int(maxSize), 64) }

// regionSize returns the bytes of one QP's region for the test.
func (s *session) regionSize() int {
	var maxSize int64
	for _, n := range s.p.Sizes() {
		maxSize = max(maxSize, n)
	}
	if s.pt != nil {
		return s.ptRegionSize(maxSize)
	}
	switch {
	case s.test.verb() == verbAtomic:
		// Remote: the 8-byte target. Local: a fetch slot per outstanding WR.
		return max(8*s.p.TxDepth, 64)
	case s.test == WriteLat || s.test == SendLat:
		return 2 * slotStride(maxSize) // receive slot, send slot
	case s.streams() || s.test == ReadBW && s.p.Verify:
		n := 0
		for _, size := range s.p.Sizes() {
			n = max(n, ringSlots(&s.p, size)*int(size))
		}
		return n
	}
	return int(maxSize)
}

// openDevice opens the RoCEv2 device (unless Options.Device is set), on
// --bind or on the IP of the TCP connection.
func (s *session) openDevice() error {
	if s.dev != nil { // opened at startup (openBoundDevice)
		return nil
	}
	if s.o.Device != nil {
		s.dev = s.o.Device
		return nil
	}
	bind, hasPort, err := ParseBind(s.o.Bind)
	if err != nil {
		return err
	}
	ip := bind.Addr()
	if !ip.IsValid() {
		ip = s.tcpLocal
	}
	port := bind.Port()
	if !hasPort && (s.server || s.pt != nil || s.o.RDMACM) {
		// A perftest peer sends to 4791 whichever side it is: its
		// exchange carries no port; with -R neither does the CM.
		port = DefServerPort
	}
	imp, err := ParseImpair(s.o.Impair)
	if err != nil {
		return err
	}
	cfg := softrdma.Config{Addr: netip.AddrPortFrom(ip, port), Impair: imp, Logf: s.o.Logf, SourcePort: s.o.SourcePort}
	if err := s.o.ODP.Configure(&cfg); err != nil {
		return err
	}
	if s.o.Pcap != "" {
		s.tap, err = pcaptap.Create(s.o.Pcap)
		if err != nil {
			return fmt.Errorf("--pcap: %w", err)
		}
		cfg.Tap = s.tap
	}
	s.dev, err = softrdma.Open(cfg)
	if err != nil && s.pt != nil {
		return fmt.Errorf("%w (a perftest peer sends to UDP port %d: its exchange carries no port)", err, DefServerPort)
	}
	if err != nil && (s.server || s.o.RDMACM) && !hasPort {
		// 4791 is taken (another server, a daemon): any port will do, the
		// exchange tells the client which. With -R nothing does: the
		// peer must be told (--roce-port), and a RoCE NIC cannot be.
		cfg.Addr = netip.AddrPortFrom(ip, 0)
		var err2 error
		if s.dev, err2 = softrdma.Open(cfg); err2 == nil {
			note := ""
			if s.o.RDMACM {
				note = " (with -R a peer reaches it only if told the port: --roce-port; a RoCE NIC sends to 4791)"
			}
			s.logf("softrdma: %s; the device uses %v instead%s", strings.TrimPrefix(err.Error(), "softrdma: "), s.dev.LocalAddr(), note)
			err = nil
		}
	}
	if err != nil {
		return err
	}
	s.ownDev = true
	return nil
}

// openBoundDevice opens the device at startup when --bind names its IP
// and port (the port 0 included): its address does not depend on the
// peer, so a UDP port already taken fails the run at once, before a
// server says it waits for a client or a client connects, instead of
// when the peer arrives (checkBindable, which only probes the address,
// covers a --bind without a port). Without a port the device waits for the TCP
// connection (its IP, perftest's 4791 fallback rules).
func (s *session) openBoundDevice() error {
	if s.o.Device != nil {
		return nil
	}
	if _, hasPort, err := ParseBind(s.o.Bind); err != nil || !hasPort {
		return err
	}
	if err := s.openDevice(); err != nil {
		// (Without softrdma.Open's "softrdma: ": the CLI's own prefix
		// says it.)
		return fmt.Errorf("--bind %s: the device cannot bind there: %s", s.o.Bind, strings.TrimPrefix(err.Error(), "softrdma: "))
	}
	return nil
}

// localMTU opens the device unless it is open and returns the path MTU
// this side offers the peer: setMTU of its own -m and its port's active
// MTU (perftest's check_mtu calls set_mtu once connected, before the QPs
// are created). The notice goes where perftest prints it, on stdout, or
// to the log with --json, whose stdout is the JSON.
func (s *session) localMTU() (int, error) {
	if s.dev == nil {
		if err := s.openDevice(); err != nil {
			return 0, err
		}
	}
	return setMTU(s.o.Params.MTU, s.dev.Attr().ActiveMTU, func(msg string) {
		if s.o.JSON {
			s.logf("softrdma: %s", strings.ReplaceAll(strings.TrimSuffix(msg, "\n"), "\n", "; "))
			return
		}
		fmt.Fprint(s.o.Stdout, msg)
	}), nil
}

// cmUsedMTU takes the path MTU the CM gave the round's QPs (-R: the
// smallest of the REQ's, the server's port's and what each side offered)
// as the MTU the banner and report show.
func (s *session) cmUsedMTU() {
	if len(s.qps) == 0 {
		return
	}
	if mtu := s.qps[0].Attr().PathMTU.Bytes(); mtu != 0 {
		s.p.MTU, s.json.MTU = mtu, mtu
	}
}

// setup opens the device (unless -R opened it already) and registers the
// buffer.
func (s *session) setup() error {
	var err error
	if s.o.Pcap != "" && s.p.Duration > 0 {
		// A capture holds every payload byte the run moves, and a -D
		// run moves as much as it can: hundreds of MB a second over
		// loopback (107 MB for -D 200ms on a 2-vCPU machine).
		s.logf("softrdma: warning: --pcap %s records every packet of the -D %v run: about its BW average × %v "+
			"in bytes (hundreds of MB a second over loopback); -n bounds it", s.o.Pcap, s.p.Duration, s.p.Duration)
	}
	if s.dev == nil {
		if err = s.openDevice(); err != nil {
			return err
		}
	}
	if s.pd == nil {
		if s.pd, err = s.dev.AllocPD(); err != nil {
			return err
		}
	}
	s.region = s.regionSize()
	s.stride = roundUp(s.region, pageSize)
	if err := s.fitMaxMem(s.stride, s.p.QPs); err != nil {
		return err
	}
	if s.o.ODP.Enabled() {
		return s.setupODP(s.stride * s.p.QPs)
	}
	if s.mem, err = allocBuffer(s.stride * s.p.QPs); err != nil {
		return err
	}
	if s.mr, err = s.dev.RegMR(s.pd, s.mem, bufAccess); err != nil {
		return err
	}
	s.base = s.mr.Addr()
	return nil
}

// fitMaxMem checks qps regions of stride bytes against --max-mem.
func (s *session) fitMaxMem(stride, qps int) error {
	maxMem := s.o.MaxMem
	if maxMem <= 0 {
		maxMem = DefaultMaxMem
	}
	if total := int64(stride) * int64(qps); total > maxMem {
		return fmt.Errorf("buffers of %d bytes (-q %d × %d bytes) are more than --max-mem %d allows here",
			total, qps, stride, maxMem)
	}
	return nil
}

// checkMaxMem refuses, before a client connects, the buffers its own
// parameters need over --max-mem (a usage error): at least the largest
// message per QP (with -a, 2^23 bytes), two message slots for write-lat
// and send-lat, a fetch slot per outstanding atomic, whatever exchange
// the server answers with. setup checks the exact size once connected
// (a stream's ring, perftest's cycle buffer).
func (s *session) checkMaxMem() error {
	p := s.o.Params
	p.Defaults(s.test)
	if p.QPs < 1 || p.QPs > MaxQPs || p.Size < 1 || p.Size > 1<<31 || p.TxDepth < 1 {
		return nil // Validate says what is wrong with them
	}
	var maxSize int64
	for _, n := range p.Sizes() {
		maxSize = max(maxSize, n)
	}
	region := int(maxSize)
	switch {
	case s.test.verb() == verbAtomic:
		region = max(8*p.TxDepth, 64)
	case s.test == WriteLat || s.test == SendLat:
		region = 2 * slotStride(maxSize)
	}
	if err := s.fitMaxMem(roundUp(region, pageSize), p.QPs); err != nil {
		return usage(err)
	}
	return nil
}

// bufAccess is the access of the registered buffer: every tool's peer may
// write, read or run atomics on it.
const bufAccess = softrdma.AccessLocalWrite | softrdma.AccessRemoteWrite | softrdma.AccessRemoteRead |
	softrdma.AccessRemoteAtomic

// close releases everything, once; it is safe on a partly set up session.
func (s *session) close() {
	if s.closed {
		return
	}
	s.closed = true
	s.cmClose()
	s.destroyRound()
	if s.mr != nil {
		s.dev.DeregMR(s.mr)
	}
	// The buffer goes before the device: closing the device closes the
	// address space it created, and with it the buffer's mapping.
	s.freeMem()
	if s.ownDev && s.dev != nil {
		s.dev.Close()
	}
	if s.tap != nil {
		if err := s.tap.Close(); err != nil {
			s.tapErr = fmt.Errorf("--pcap: %w", err)
		}
	}
	if s.file != nil {
		s.file.Close()
	}
	if s.out != nil {
		if err := s.out.Close(); err != nil {
			s.outErr = fmt.Errorf("--out: %w", err)
		}
	}
	if s.ctrl != nil {
		s.ctrl.Close()
	}
	if s.pt != nil {
		s.pt.Close(false) // a no-op after closePerftest
	}
}

// local returns QP i's region.
func (s *session) local(i int) []byte { return s.mem[i*s.stride : i*s.stride+s.region] }

// addr returns the IOVA of byte off of QP i's region.
func (s *session) addr(i int, off int) uint64 { return s.base + uint64(i*s.stride+off) }

// sge returns the SGE of n bytes at off in QP i's region.
func (s *session) sge(i, off, n int) softrdma.SGE {
	return softrdma.SGE{Addr: s.addr(i, off), Length: uint32(n), LKey: s.mr.LKey()}
}

// queueDepths returns the send and receive queue depths of the round's
// QPs for messages of size bytes.
func (s *session) queueDepths(size int64) (sq, rq int) {
	slots := 0
	if s.streams() || s.test == ReadBW && s.p.Verify {
		slots = ringSlots(&s.p, size)
	}
	sq = max(s.p.TxDepth, slots) + 16
	rq = max(slots+8, 16)
	if s.test.verb() == verbSend {
		rq = max(rq, s.p.RxDepth)
	}
	return sq, rq
}

// createRound creates the round's CQ and QPs. Every round has fresh QPs,
// so that nothing of one round (a receive still posted, a completion not
// yet polled) leaks into the next.
func (s *session) createRound(size int64) error {
	s.nrounds++
	sq, rq := s.queueDepths(size)
	depth := min(s.p.QPs*(sq+rq)+16, softrdma.MaxCQE)
	var err error
	if s.cq, err = s.dev.CreateCQ(depth); err != nil {
		return err
	}
	s.qps = make([]*softrdma.QP, s.p.QPs)
	s.psns = make([]uint32, s.p.QPs)
	for i := range s.qps {
		s.qps[i], err = s.dev.CreateQP(s.pd, softrdma.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq, Type: softrdma.QPTypeRC,
			Cap: softrdma.Cap{MaxSendWR: sq, MaxRecvWR: rq, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: s.p.Inline}})
		if err != nil {
			return err
		}
		s.psns[i] = rand.Uint32() & 0xffffff // perftest: lrand48() & 0xffffff
	}
	return nil
}

// destroyRound destroys the round's QPs.
func (s *session) destroyRound() {
	for _, qp := range s.qps {
		if qp != nil {
			s.dev.DestroyQP(qp)
		}
	}
	s.lastPeer = s.peerAddr()
	s.qps, s.cq, s.remote = nil, nil, nil
}

// localInfos describes the round's QPs for the peer.
func (s *session) localInfos() []exchange.QPInfo {
	la := s.dev.LocalAddr()
	gid := la.Addr().As16()
	infos := make([]exchange.QPInfo, len(s.qps))
	for i, qp := range s.qps {
		infos[i] = exchange.QPInfo{GID: gid, Port: la.Port(), QPN: uint32(qp.QPN()), PSN: s.psns[i],
			RKey: s.mr.RKey(), VAddr: s.addr(i, 0), Size: uint64(s.region)}
	}
	return infos
}

// connect exchanges the round's QP data with the peer, connects every QP
// and waits until both sides are ready to send (RTS on both ends).
// xctx bounds the wait for the peer's QP data (the first round's: the
// setup time limit), ctx the rest.
func (s *session) connect(ctx, xctx context.Context) error {
	remote, err := s.xch.ExchangeQPs(xctx, s.server, s.localInfos())
	if err != nil {
		return err
	}
	for i, r := range remote {
		if r.Size < uint64(s.region) {
			return fmt.Errorf("peer's QP %d buffer is %d bytes, want %d", i, r.Size, s.region)
		}
	}
	s.remote = remote
	if s.cm != nil {
		if err := s.cmConnectQPs(ctx); err != nil {
			return err
		}
		s.cmRemoteFromQPs()
		s.cmUsedMTU()
		return s.ctrl.Sync(ctx)
	}
	mtu := mtuCode(s.p.MTU)
	for i, qp := range s.qps {
		ep := softrdma.Endpoint{Addr: remote[i].Addr(), QPN: softrdma.QPN(remote[i].QPN), PSN: softrdma.PSN(remote[i].PSN)}
		if err := softrdma.Connect(qp, ep, softrdma.PSN(s.psns[i]), softrdma.ConnectOptions{MTU: mtu, Timeout: uint8(s.p.QPTimeout)}); err != nil {
			return fmt.Errorf("connect QP %#x to %v QPN %#x: %w", qp.QPN(), ep.Addr, ep.QPN, err)
		}
	}
	return s.ctrl.Sync(ctx)
}

func (s *session) logf(format string, args ...any) {
	if s.o.Logf != nil {
		s.o.Logf(format, args...)
	}
}

// errWC is a work completion that failed.
type errWC struct {
	wc softrdma.WC
}

func (e *errWC) Error() string {
	return fmt.Sprintf("work completion error: %v (status %d, opcode %d, QPN %#x, wr_id %#x)",
		e.wc.Status, e.wc.Status, e.wc.Opcode, e.wc.QPN, e.wc.WRID)
}

func checkWC(wc *softrdma.WC) error {
	if wc.Status != softrdma.WCSuccess {
		return &errWC{*wc}
	}
	return nil
}

var errStopped = errors.New("stopped")

// clock returns the time: s.now's, if set, else time.Now's.
func (s *session) clock() time.Time {
	if s.now != nil {
		return s.now()
	}
	return time.Now()
}

// recvClock is the clock of a side that receives messages (the send-bw
// server, a stream's sink): as perftest's receiver
// (set_on_first_rx_packet), it starts at the first completion, not when
// this side was ready, so that neither the wait for the sender's first
// message (the barrier's latency, the sender's own setup) nor the
// messages that completed while this side was posting its receives skew
// the rate. A run whose messages all completed in the first poll has no
// interval to time: it is timed from the round's start barrier instead
// (with perftest's exchange, from the end of its setup).
type recvClock struct {
	s           *session
	first, last time.Time
}

// tick records a poll that found completions of messages at now.
func (c *recvClock) tick(now time.Time) {
	if c.first.IsZero() {
		c.first = now
	}
	c.last = now
}

// elapsed is the time from the first completion to the last.
func (c *recvClock) elapsed() time.Duration {
	if c.last.After(c.first) {
		return c.last.Sub(c.first)
	}
	if !c.last.IsZero() && !c.s.roundStart.IsZero() {
		return c.last.Sub(c.s.roundStart)
	}
	return 0
}
