package perf

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/exchange"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
	"github.com/softrdma/softrdma/transport/wire"
)

// A run with perftest's exchange (exchange.Perftest): the peer is a stock
// ib_write_bw, ib_read_bw, ... (perftest 4.5-0.17 and 25.01 were checked,
// on Linux rxe) or a softrdma tool run with --perftest. perftest exchanges
// no test parameters, so both sides must be given the same -s, -n, -q,
// -A, ... as with perftest itself, and the data path follows perftest's:
//
//   - The hand shakes before the run (from the captures, which show the
//     QP each message describes): ib_write_bw, ib_read_bw and ib_atomic_bw
//     exchange every QP's keys (QPs 0, 1, ... n-1), then again, then QP
//     0's; ib_send_bw QPs 0 ... n-1, then 0, then 0 ... n-1, then 0 once
//     the server posted its receives. The latency tools (one QP) hand
//     shake four times, ib_send_lat's last after both sides posted their
//     receives. softrdma connects its QPs after the first round, and
//     checks that every later message describes the QP expected.
//   - After the run: write, read and atomic bandwidth hand shake, exchange
//     the client's report (the server prints it) and hand shake to close;
//     ib_send_bw, ib_send_lat and ib_read_lat hand shake to close;
//     ib_write_lat closes without one.
//   - Remote addresses: a bandwidth client steps through the peer's buffer
//     by the message size rounded up to the cache line, wrapping at the
//     cycle buffer (the page size), when a message fits in half of it
//     (perftest's increase_rem_addr); atomics step by 64 bytes.
//     FETCH_AND_ADD adds 1, CMP_AND_SWAP compares with 0 and swaps in 0.
//   - ib_write_lat's server writes first, then each side writes message i
//     once it saw the peer's i in the last byte of its buffer;
//     ib_send_lat's client sends first.
//   - Both sides' RoCEv2 devices use UDP port 4791, the only port a
//     perftest peer sends to.
//   - With -R the steps cross as SENDs on an RDMA CM connection, the hand
//     shakes in binary, and the CM connects the QPs (cm.go).
//
// perftest checks no data. --verify checks what one side can: a read-bw
// or read-lat client that every READ of a remote range returns what the
// first READ of it did (the server's buffer does not change); an atomic-bw
// client that the values fetched from each remote slot go up by one per
// FETCH_AND_ADD (and stay put under CMP_AND_SWAP 0 -> 0); an atomic-bw
// server that its slots hold the counts the client's atomics left; a
// send-bw server that every message has -s bytes.

// ptMode is the state of a run with perftest's exchange.
type ptMode struct {
	cycle     int // cycle buffer both sides agreed on (check_sys_data)
	cacheLine int
	my, rem   []exchange.PerftestDest // per QP
	// preposted: the receives of a SEND test were posted before the last
	// hand shake, as the perftest peer expects.
	preposted bool
	// refs[q][k]: the first value read from remote slot k of QP q
	// (read-bw, read-lat and atomic-bw --verify).
	refs    [][][]byte
	checked []string // what --verify checked
}

// Perftest-mode constants.
const (
	// ptCacheLine is the cache line size this side announces (perftest
	// reads coherency_line_size from sysfs; 64 on x86 and most arm64).
	ptCacheLine = 64
	// ptLinger keeps the device up after the exchange ended, so that the
	// ACK of the last message received leaves (the engine sends it at the
	// end of its receive batch) and a retransmission would be answered:
	// ib_write_lat has no closing hand shake at all.
	ptLinger = 50 * time.Millisecond
)

// exchangeName describes the out-of-band exchange for the banner.
func (s *session) exchangeName() string {
	switch {
	case s.pt != nil && s.ch != nil:
		return fmt.Sprintf("rdma_cm (perftest's exchange; peer perftest %s)", s.pt.Remote)
	case s.pt != nil:
		return fmt.Sprintf("Ethernet (TCP, perftest's exchange; peer perftest %s)", s.pt.Remote)
	case s.ch != nil:
		return "rdma_cm (softrdma framing)"
	}
	return s.xch.Name()
}

// outReads is the READ/atomic depth this side's QPs accept as responder,
// as it advertises it: the device's limit, as perftest does (rxe: 128),
// and 1 for WRITE and SEND; with softrdma's exchange, the default
// max_rd_atomic.
func (s *session) outReads() int {
	if s.pt == nil {
		return 16 // softrdma.ConnectOptions' default max_rd_atomic
	}
	if v := s.test.verb(); v == verbRead || v == verbAtomic {
		return s.dev.Attr().MaxQPRdAtom
	}
	return 1
}

// ptRegionSize is the bytes of one QP's region: perftest's BUFF_SIZE (the
// message, at least the cycle buffer) for a peer that steps through it;
// the fetch slots of the atomics this side posts; the latency tools' two
// slots.
func (s *session) ptRegionSize(maxSize int64) int {
	switch {
	case s.test.verb() == verbAtomic:
		return max(8*s.p.TxDepth, s.pm.cycle, 64)
	case s.test == WriteLat || s.test == SendLat:
		return 2 * slotStride(maxSize)
	}
	return max(int(maxSize), s.pm.cycle)
}

// ptSlots returns perftest's step through the remote buffer for messages of
// size bytes and the number of steps before it wraps (increase_rem_addr):
// the size rounded up to the cache line, while a message fits in half the
// cycle buffer; else the address does not move (step 0, one slot).
func (s *session) ptSlots(size int64) (step, n int64) {
	cycle, line := int64(s.pm.cycle), int64(s.pm.cacheLine)
	if size > cycle/2 {
		return 0, 1
	}
	step = (size + line - 1) / line * line
	return step, cycle / step
}

// runPerftest runs the test with perftest's exchange and closes the exchange.
func (s *session) runPerftest(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.pt.Close(false) })
	defer stop()
	return ctxErr(ctx, s.ptRun(ctx))
}

func (s *session) ptRun(ctx context.Context) error {
	if err := s.ptParams(); err != nil {
		return err
	}
	pt := s.pt
	var err error
	// The setup's time limit covers the steps up to the MTU, which a
	// perftest peer answers at once.
	if !s.setupEnd.IsZero() {
		pt.SetDeadline(s.setupEnd)
	}
	if s.pm.cycle, s.pm.cacheLine, err = pt.SysData(os.Getpagesize(), ptCacheLine); err != nil {
		return s.setupErr(ctx, "system data", err)
	}
	if s.pm.cycle < pageSize || s.pm.cycle > 1<<30 || s.pm.cacheLine < 8 || s.pm.cacheLine > s.pm.cycle {
		return fmt.Errorf("perftest peer: cycle buffer %d and cache line %d are not usable", s.pm.cycle, s.pm.cacheLine)
	}
	mine, err := s.localMTU()
	if err != nil {
		return err
	}
	if s.cm == nil { // (with -R the CM reaches the peer's port: --roce-port)
		s.ptWarnPort()
	}
	mtu, err := pt.MTU(int(mtuCode(mine)))
	if err != nil {
		return s.setupErr(ctx, "MTU", err)
	}
	if !s.setupEnd.IsZero() {
		pt.SetDeadline(time.Time{})
	}
	s.p.MTU = softrdma.MTU(mtu).Bytes()
	s.json.MTU, s.json.QPs = s.p.MTU, s.p.QPs
	if err := s.setup(); err != nil {
		return err
	}
	sizes := s.p.Sizes()
	maxSize := s.maxSize()
	if err := s.createRound(maxSize); err != nil {
		return err
	}
	s.ptPrepare()
	if s.ch != nil {
		if err := s.ptCMConnect(ctx); err != nil {
			return err
		}
	}
	if err := s.ptConnect(ctx, sizes[0]); err != nil {
		return err
	}
	w, text := s.o.Stdout, !s.o.JSON
	if text {
		s.printBanner(w)
	}
	if err := s.ptRunSide(ctx, sizes); err != nil {
		if text {
			fmt.Fprintln(w, report.Line)
		}
		return err
	}
	if text {
		fmt.Fprintln(w, report.Line)
	}
	if s.p.Verify {
		s.json.Verified = len(s.pm.checked) > 0
		if text {
			for _, c := range s.pm.checked {
				fmt.Fprintf(w, " Verify          : %s\n", c)
			}
			if len(s.pm.checked) == 0 {
				fmt.Fprintf(w, " Verify          : nothing this side can check against a perftest peer\n")
			}
		}
	}
	if text {
		s.printODP(w, s.odpReport())
	}
	return nil
}

// ptParams takes the test parameters from this side's flags: perftest has
// no parameter exchange (before its 6.28's negotiation).
func (s *session) ptParams() error {
	o := s.o
	s.p = o.Params
	s.p.Defaults(s.test)
	s.p.FileSize = -1
	s.p.perftest = true
	if s.p.Seed == 0 {
		s.p.Seed = rand.Uint64() | 1
	}
	if err := s.p.Validate(s.test); err != nil {
		return err
	}
	switch {
	case o.File != "" || o.Out != "":
		return errors.New("--file and --out need a softrdma peer: perftest's exchange cannot carry them")
	case s.p.Duration > 0:
		return errors.New("-D: with a perftest peer softrdma runs iterations only (-n)")
	case s.p.All && s.test != WriteBW && s.test != ReadBW:
		return fmt.Errorf("%s -a: with a perftest peer, -a is supported by write-bw and read-bw only", s.test)
	}
	if s.server && s.o.Params.Size == 0 && s.o.Params.Iters == 0 {
		s.logf("softrdma: the peer speaks perftest's exchange, which carries no test parameters: " +
			"this side runs with its own -s and -n (give both sides the same)")
	}
	return nil
}

// ptPrepare readies the buffer: the atomic targets cleared (the checks
// count from 0), a read server's buffer filled.
func (s *session) ptPrepare() {
	switch {
	case s.test.verb() == verbAtomic:
		for q := range s.p.QPs {
			clear(s.local(q))
		}
	case s.server && (s.test == ReadBW || s.test == ReadLat):
		for q := range s.p.QPs {
			fillPattern(s.local(q), s.p.Seed, int64(q))
		}
	}
}

// ptLocalDests describes the round's QPs as perftest's keys. The GID
// index (carried over rdma_cm only, and read by nobody) is 1 for an IPv4
// device, rxe's index of its IPv4-mapped GID (-x 1).
func (s *session) ptLocalDests() []exchange.PerftestDest {
	gid := s.dev.GID()
	var gidIndex int32
	if s.dev.LocalAddr().Addr().Is4() {
		gidIndex = 1
	}
	d := make([]exchange.PerftestDest, len(s.qps))
	for i, qp := range s.qps {
		d[i] = exchange.PerftestDest{OutReads: uint16(s.outReads()), QPN: uint32(qp.QPN()), PSN: s.psns[i],
			RKey: s.mr.RKey(), VAddr: s.addr(i, 0), GID: gid, GIDIndex: gidIndex}
	}
	return d
}

// ptCMConnect is create_rdma_cm_connection with -R: a hand shake of zeros
// (perftest's my_dest is not filled in yet), the data connections through
// the CM, another hand shake of zeros.
func (s *session) ptCMConnect(ctx context.Context) error {
	var zero exchange.PerftestDest
	if _, err := s.pt.HandShake(&zero); err != nil {
		return err
	}
	if err := s.cmConnectQPs(ctx); err != nil {
		return err
	}
	_, err := s.pt.HandShake(&zero)
	return err
}

// ptHandShake is one ctx_hand_shake with QP i's keys; the peer must answer
// with its QP i's (the same as in the first exchange), or the two sides
// are out of step.
func (s *session) ptHandShake(i int) error {
	rem, err := s.pt.HandShake(&s.pm.my[i])
	if err != nil {
		return err
	}
	if rem.QPN != s.pm.rem[i].QPN {
		return fmt.Errorf("perftest exchange out of step: the peer sent QPN %#x, expected its QP %d's %#x "+
			"(is it the same tool, with the same -q?)", rem.QPN, i, s.pm.rem[i].QPN)
	}
	return nil
}

// ptConnect runs the hand shakes before the run and connects the QPs after
// the first ones, posting a SEND test's receives before the last.
func (s *session) ptConnect(ctx context.Context, size int64) error {
	s.pm.my = s.ptLocalDests()
	s.pm.rem = make([]exchange.PerftestDest, len(s.qps))
	n := len(s.qps)
	if s.test.IsLat() {
		n = 1
	}
	for i := range n {
		rem, err := s.pt.HandShake(&s.pm.my[i])
		if err != nil {
			return err
		}
		for j := range i {
			if s.pm.rem[j].QPN == rem.QPN {
				return fmt.Errorf("perftest exchange out of step: the peer described QPN %#x twice "+
					"(does it have fewer QPs? give both sides the same -q)", rem.QPN)
			}
		}
		s.pm.rem[i] = rem
	}
	if err := s.ptConnectQPs(); err != nil {
		return err
	}
	// The rest of the hand shakes before the run (see the top of the
	// file): QP indexes, and whether the receives go before the last.
	var rest []int
	recvs := false
	switch {
	case s.test.IsLat():
		rest = []int{0, 0, 0}
		recvs = s.test == SendLat
	case s.test == SendBW:
		// ib_send_bw -q 2 (4.5-0.17): QPs 0, 1, then 0, then 0, 1, then
		// 0, the receives posted before the last.
		rest = []int{0}
		for i := range len(s.qps) {
			rest = append(rest, i)
		}
		rest = append(rest, 0)
		recvs = s.server
	default:
		for i := range len(s.qps) {
			rest = append(rest, i)
		}
		rest = append(rest, 0)
	}
	for k, i := range rest {
		if recvs && k == len(rest)-1 {
			if err := s.ptPostRecvs(size); err != nil {
				return err
			}
		}
		if err := s.ptHandShake(i); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// ptPeerAddr returns the RoCEv2 address of a peer with this GID: the IP
// address it stands for (IPv4-mapped for IPv4), UDP port 4791; the TCP
// peer's address for the zero GID.
func (s *session) ptPeerAddr(gid [16]byte) (netip.AddrPort, error) {
	ip := netip.AddrFrom16(gid).Unmap()
	switch {
	case ip.IsUnspecified():
		s.logf("softrdma: the peer's GID is zero; addressing it at %v, its TCP address", s.tcpRemote)
		ip = s.tcpRemote
	case ip.Is6() && ip.IsLinkLocalUnicast():
		return netip.AddrPort{}, fmt.Errorf("the peer's GID %v is link-local, which needs an interface; "+
			"give the peer the -x index of a routable GID", ip)
	}
	if local := s.dev.LocalAddr().Addr(); ip.Is4() != local.Is4() {
		return netip.AddrPort{}, fmt.Errorf("the peer's GID %v and this device's address %v are of different IP families "+
			"(see -x on the peer, --bind here)", ip, local)
	}
	addr := netip.AddrPortFrom(ip, wire.RoCEv2Port)
	if addr == s.dev.LocalAddr() {
		// perftest's exchange carries a GID but no port: the peer is
		// taken to be on 4791, and here that is this very device (a
		// softrdma peer on another port, both on one host). Its WRITEs
		// would go to itself and time out as a dead peer.
		return netip.AddrPort{}, fmt.Errorf("the peer's device is taken to be at %v (perftest's exchange carries no port, "+
			"so UDP %d), which is this side's own device: start the peer's device on %d and this one elsewhere (--bind IP:PORT)",
			addr, wire.RoCEv2Port, wire.RoCEv2Port)
	}
	return addr, nil
}

// ptWarnPort warns, once a run speaks perftest's exchange over TCP, that
// this side's device is not on UDP 4791: the exchange carries no port,
// so a stock perftest peer sends to 4791 and reaches nothing.
func (s *session) ptWarnPort() {
	if p := s.dev.LocalAddr().Port(); p != wire.RoCEv2Port {
		s.logf("softrdma: warning: this device is on UDP %d, not %d: perftest's exchange carries no port, "+
			"so a perftest peer sends to %d", p, wire.RoCEv2Port, wire.RoCEv2Port)
	}
}

// ptConnectQPs moves every QP to RTS towards the peer's (ctx_connect):
// path MTU as negotiated, local ACK timeout -u, retry and RNR retry 7,
// max_rd_atomic the peer's out_reads.
func (s *session) ptConnectQPs() error {
	s.remote = make([]exchange.QPInfo, len(s.qps))
	if s.cm != nil {
		// -R: the CM connected them; the keys give the rkeys and buffers.
		for i := range s.qps {
			r := &s.pm.rem[i]
			s.remote[i] = exchange.QPInfo{RKey: r.RKey, VAddr: r.VAddr, Size: uint64(max(s.maxSize(), int64(s.pm.cycle)))}
		}
		s.cmRemoteFromQPs()
		s.cmUsedMTU()
		return nil
	}
	for i, qp := range s.qps {
		r := &s.pm.rem[i]
		addr, err := s.ptPeerAddr(r.GID)
		if err != nil {
			return err
		}
		s.remote[i] = exchange.QPInfo{GID: r.GID, Port: addr.Port(), QPN: r.QPN, PSN: r.PSN, RKey: r.RKey,
			VAddr: r.VAddr, Size: uint64(max(s.maxSize(), int64(s.pm.cycle)))}
		rd := uint8(min(max(int(r.OutReads), 1), s.outReads()))
		ep := softrdma.Endpoint{Addr: addr, QPN: softrdma.QPN(r.QPN), PSN: softrdma.PSN(r.PSN)}
		if err := softrdma.Connect(qp, ep, softrdma.PSN(s.psns[i]), softrdma.ConnectOptions{MTU: mtuCode(s.p.MTU),
			Timeout: uint8(s.p.QPTimeout), MaxRdAtomic: rd}); err != nil {
			return fmt.Errorf("connect QP %#x to %v QPN %#x: %w", qp.QPN(), ep.Addr, ep.QPN, err)
		}
	}
	return nil
}

// ptPostRecvs posts a SEND test's receives (ctx_set_recv_wqes).
func (s *session) ptPostRecvs(size int64) error {
	s.pm.preposted = true
	if s.test == SendLat {
		return s.latPostRecvs(size)
	}
	return s.sendBWPostRecvs(size)
}

// ptRunSide runs this side's part and the exchange after it, and prints
// the results.
func (s *session) ptRunSide(ctx context.Context, sizes []int64) error {
	w, text := s.o.Stdout, !s.o.JSON
	row := func(r *roundResult) { s.addRow(w, text, r, &roundResult{}) }
	none := func() (int64, bool) { return 0, false }
	// --idle-timeout, as in a round of softrdma's exchange; a passive side
	// (no completions) watches the packets it receives, and waits in
	// perftest's exchange, which the watch closes when it expires.
	ictx, idle := s.watchIdle(ctx)
	if s.passive() {
		ictx, idle = s.watchPassive(ctx)
		stop := context.AfterFunc(ictx, func() {
			if idle.Expired() {
				s.pt.Close(false)
			}
		})
		defer stop()
	}
	s.idle = idle
	if testHookRunSide != nil {
		testHookRunSide(s)
	}
	s.roundStart = s.clock() // (recvClock's start if every message came in one poll)
	asked := s.p.Iters
	if !s.test.IsLat() {
		asked *= int64(s.p.QPs)
	}
	// ran ends the watch once this side's part is done (the first call;
	// the next ones return err).
	stopped := false
	ran := func(err error) error {
		if stopped {
			return err
		}
		stopped = true
		idle.Stop()
		s.idle = nil
		switch {
		case err != nil && idle.Expired() && s.passive():
			return s.passiveIdleErr(idle)
		case err != nil && idle.Expired():
			return s.idleErr(idle, asked, 0) // (perftest's exchange carries no file)
		}
		return err
	}
	defer ran(nil)
	switch {
	case s.test == WriteLat || s.test == SendLat:
		lat, n, err := s.pingPong(ictx, sizes[0], none, nil)
		if err := ran(err); err != nil {
			return err
		}
		row(&roundResult{Lat: &lat, Counts: []int64{n}})
		if s.test == SendLat {
			if err := s.ptHandShake(0); err != nil {
				return err
			}
		}
		return s.ptClose(s.test == SendLat)
	case s.test == ReadLat:
		if !s.server {
			lat, n, err := s.readLat(ictx, sizes[0])
			if err := ran(err); err != nil {
				return err
			}
			row(&roundResult{Lat: &lat, Counts: []int64{n}})
		}
		if err := ran(s.ptHandShake(0)); err != nil { // the server: the client finished
			return err
		}
		return s.ptClose(true)
	case s.test == SendBW:
		var bw report.BW
		var err error
		if s.server {
			known := make(chan struct{})
			close(known)
			bw, err = s.sendBWServer(ictx, sizes[0], func() (int64, bool) { return asked, true }, known)
			if err == nil && s.p.Verify {
				s.pm.checked = append(s.pm.checked, fmt.Sprintf("%d messages of %d bytes received", bw.Iterations, sizes[0]))
			}
		} else {
			bw, _, err = s.bwClient(ictx, sizes[0])
		}
		if err := ran(err); err != nil {
			return err
		}
		row(&roundResult{BW: &bw})
		if err := s.ptHandShake(0); err != nil {
			return err
		}
		return s.ptClose(true)
	}
	// write-bw, read-bw, atomic-bw.
	var last report.BW
	if !s.server {
		for _, size := range sizes {
			bw, _, err := s.bwClient(ictx, size)
			if err != nil {
				return ran(err)
			}
			row(&roundResult{BW: &bw})
			last = bw
		}
		ran(nil)
	}
	if err := ran(s.ptHandShake(0)); err != nil { // the client finished (the server's part)
		return err
	}
	if s.server && s.test == AtomicBW && s.p.Verify {
		if err := s.ptCheckAtomicServer(); err != nil {
			return err
		}
	}
	var my exchange.PerftestReport
	if !s.server {
		u := s.unit.Factor()
		my = exchange.PerftestReport{Size: uint64(last.Bytes), Iters: uint64(last.Iterations),
			BWPeak: last.PeakBps / u, BWAvg: last.AvgBps() / u, MsgRate: last.MsgRate()}
	}
	rem, err := s.pt.Reports(my)
	if err != nil {
		return err
	}
	if s.server {
		bw := peerBW(&rem, s.unit)
		row(&roundResult{BW: &bw})
	}
	if err := s.ptHandShake(0); err != nil {
		return err
	}
	return s.ptClose(true)
}

// ptClose ends the exchange (see exchange.Perftest.Close) and lets the
// device linger.
func (s *session) ptClose(afterHandShake bool) error {
	if s.ch != nil {
		s.cmEnd(true) // the DREQs, as perftest's destroy_ctx
	}
	s.pt.Close(afterHandShake)
	time.Sleep(ptLinger)
	return nil
}

// peerBW turns the client's report, as xchg_bw_reports carries it, back
// into a result to print: the elapsed time is what its average implies.
func peerBW(r *exchange.PerftestReport, u report.Unit) report.BW {
	bw := report.BW{Bytes: int64(r.Size), Iterations: int64(r.Iters), PeakBps: r.BWPeak * u.Factor()}
	if avg := r.BWAvg * u.Factor(); avg > 0 && !math.IsInf(avg, 0) && !math.IsNaN(avg) {
		bw.Elapsed = time.Duration(float64(r.Size) * float64(r.Iters) / avg * float64(time.Second))
	}
	return bw
}

// ptVerify checks completed message idx of QP q of a bandwidth client
// (--verify): a READ against the first READ of the same remote slot, an
// atomic's fetched value against the first one fetched from the slot.
func (s *session) ptVerify(q int, idx, size int64) error {
	_, n := s.ptSlots(size)
	k := idx % n
	if s.pm.refs == nil {
		s.pm.refs = make([][][]byte, s.p.QPs)
	}
	if s.pm.refs[q] == nil {
		s.pm.refs[q] = make([][]byte, n)
	}
	switch s.test.verb() {
	case verbRead:
		off := s.ptLocalOff(idx, size)
		got := s.local(q)[off : off+int(size)]
		ref := s.pm.refs[q][k]
		if ref == nil {
			s.pm.refs[q][k] = bytes.Clone(got)
			return nil
		}
		if i := firstDiff(got, ref); i >= 0 {
			return &MismatchError{What: fmt.Sprintf("READ %d of QP %d (remote slot %d) against the first READ of the slot", idx, q, k),
				Offset: int64(i), Got: got[i], Want: ref[i], Message: idx}
		}
	case verbAtomic:
		got := binary.NativeEndian.Uint64(s.local(q)[int(idx%int64(s.p.TxDepth))*8:])
		ref := s.pm.refs[q][k]
		if ref == nil {
			s.pm.refs[q][k] = binary.NativeEndian.AppendUint64(nil, got)
			return nil
		}
		first := binary.NativeEndian.Uint64(ref)
		want := first
		if s.p.Atomic == FetchAndAdd {
			want += uint64(idx / n) // one more per FETCH_AND_ADD on the slot
		}
		if got != want {
			return fmt.Errorf("%w: %s %d on QP %d (remote slot %d) fetched %d, want %d (the slot's first fetch was %d)",
				ErrMismatch, s.p.Atomic, idx, q, k, got, want, first)
		}
	}
	return nil
}

// ptLocalOff is where READ idx lands locally: at the offset of its remote
// slot with --verify (so that the READs in flight do not share a slot), at
// 0 without.
func (s *session) ptLocalOff(idx, size int64) int {
	if !s.p.Verify {
		return 0
	}
	step, n := s.ptSlots(size)
	return int(idx % n * step)
}

// ptVerifyDone records what a bandwidth client's --verify checked.
func (s *session) ptVerifyDone(size int64, total int64) {
	if !s.p.Verify {
		return
	}
	_, n := s.ptSlots(size)
	switch s.test.verb() {
	case verbRead:
		s.pm.checked = append(s.pm.checked, fmt.Sprintf("%d READs of %d bytes equal the first READ of their remote slot (%d slots per QP)",
			total, size, n))
	case verbAtomic:
		what := "went up by one per FETCH_AND_ADD"
		if s.p.Atomic == CmpAndSwap {
			what = "stayed put under CMP_AND_SWAP 0 -> 0"
		}
		s.pm.checked = append(s.pm.checked, fmt.Sprintf("%d atomics: the values fetched from each of %d remote slots per QP %s",
			total, n, what))
	}
	s.pm.refs = nil
}

// ptCheckAtomicServer checks, once the client finished, what its atomics
// left in this side's slots: FETCH_AND_ADD 1 stepping through n slots of
// 64 bytes leaves slot k with the number of its -n iterations that hit it;
// CMP_AND_SWAP 0 -> 0 leaves zeros; nothing else changes.
func (s *session) ptCheckAtomicServer() error {
	step, n := s.ptSlots(8)
	iters := s.p.Iters
	for q := range s.p.QPs {
		mem := s.local(q)
		for off := 0; off+8 <= len(mem); off += 8 {
			got := binary.NativeEndian.Uint64(mem[off:])
			var want uint64
			if k := int64(off) / step; int64(off)%step == 0 && k < n && s.p.Atomic == FetchAndAdd {
				want = uint64(iters / n)
				if k < iters%n {
					want++
				}
			}
			if got != want {
				return fmt.Errorf("%w: QP %d offset %d holds %d after %d %s from the client, want %d",
					ErrMismatch, q, off, got, iters, s.p.Atomic, want)
			}
		}
	}
	s.pm.checked = append(s.pm.checked, fmt.Sprintf("%d slots per QP hold what %d %s left", n, iters, s.p.Atomic))
	return nil
}
