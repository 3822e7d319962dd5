package conn

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrdma/softrdma/transport/wire"
)

// item is one packet in a conn's pipeline.
type item struct {
	buf  []byte
	addr netip.AddrPort // send: destination; receive: source
	pb   *pbuf          // non-nil when buf is pb.b, a conn-owned copy
	// sport is the UDP source port to send from; 0: the conn's own.
	sport uint16

	id uint16 // receive: the IPv4 ID the ICRC verified with
	ip IPInfo // receive: the rest of the IP header that is known (TTL, TOS, flow label)
	// send: the trailer holds the ICRC for IPv4 ID icrcID (Packet.ICRCReady
	// with ID 0, or computed by finishTx), so a new ID only corrects it.
	icrc    bool
	icrcID  uint16
	corrupt bool // flip buf[pos] ^= mask: after the ICRC (send), before delivery (receive)
	flipped bool // send: the flip is applied (undo it before recomputing the ICRC)
	// tapped: send: the tap saw it. A GSO run the kernel refused as a
	// whole is finished again (new IPv4 IDs, ICRCs) and sent again; the
	// tap records each datagram once, as first handed to the kernel
	// (after the send would break the order of a tap shared with the
	// receiver, which sees the datagram during the sendmmsg).
	tapped bool
	pos    int32
	mask   byte
}

// rawDgram is a datagram read from the wire, not yet split or checked.
type rawDgram struct {
	buf  []byte
	from netip.AddrPort
	pb   *pbuf  // pipe: the queued copy, owned by the receiver now
	gso  int    // GRO super-buffer: the segment size; 0: one datagram
	ip   IPInfo // TTL, TOS and flow label (the same for every GRO segment)
}

type tapBox struct{ t Tap }

// srcPort is a source port held with AcquireSourcePort.
type srcPort struct {
	holds int       // AcquireSourcePort calls not yet released
	sock  io.Closer // UDPConn: the socket bound to the port; nil for a pipe
	fd    int       // UDPConn: the socket's descriptor, for sendmmsg
}

// core is the pipeline shared by UDPConn and PipeConn: impairment, ICRC,
// tap, stats and the delay timer. The backend provides emit (send a list
// of packets, with txMu held) and fills rxRaw (with rxMu held).
type core struct {
	local  netip.AddrPort
	is4    bool
	noICRC bool // Config.NoICRC: benchmark baselines only
	stats  Stats
	impair atomic.Pointer[Impairment]
	tap    atomic.Pointer[tapBox]
	logf   func(format string, args ...any)
	pool   *bufPool
	closed atomic.Bool

	// emit sends items in order (computing their ICRCs with finishTx) and
	// returns the first error. Called with txMu held.
	emit func(items []item) error
	// idTabs are the ICRC ID tables of the last two packet lengths moved
	// to another IPv4 ID (a message's MIDDLE/LAST length and one more),
	// idVictim the one to refill next. Guarded by txMu.
	idTabs   [2]wire.ICRCIDTable
	idVictim int
	// rxPrefixes caches the ICRC prefixes (the IP and UDP part, for IPv4
	// ID 0) of the last two (source, length) pairs received: a stream's
	// packets have one or two lengths (an RDMA WRITE's FIRST with its
	// RETH, then MIDDLEs and a LAST), so verify hashes the packet from its
	// BTH on instead of the five header words first. Guarded by rxMu.
	rxPrefixes [2]rxPrefix
	rxVictim   int
	// checkDst validates and normalizes a destination.
	checkDst func(netip.AddrPort) (netip.AddrPort, bool)

	// src holds the source ports packets may carry besides the conn's
	// own (AcquireSourcePort). It is written with srcMu and txMu held
	// and read with either: Send and emit hold txMu. Lock order: srcMu,
	// txMu.
	srcMu sync.Mutex
	src   map[uint16]*srcPort
	// srcLast caches srcPortOf's last lookup (a map lookup per packet
	// is measurable: one QP's packets all carry the same port). Guarded
	// by txMu; every write of src clears it.
	srcLast struct {
		port  uint16
		held  bool
		valid bool
	}
	// openSrc opens the backend's socket for a source port (nil: none is
	// needed, the pipe). Called with srcMu held.
	openSrc func(port uint16) (*srcPort, error)

	txMu  sync.Mutex
	tx    impairer // guarded by txMu
	txIn  []item   // scratch for Send, guarded by txMu
	txOut []item   // scratch for Send, guarded by txMu
	txDue []item   // scratch for the timer goroutine, guarded by txMu
	timer struct {
		started bool // guarded by txMu
		kick    chan struct{}
		done    chan struct{}
		wg      sync.WaitGroup
	}

	rxMu      sync.Mutex
	rx        impairer   // guarded by rxMu
	rxRaw     []rawDgram // read and not yet consumed, guarded by rxMu
	rxRawHead int        // next in rxRaw
	rxSegOff  int        // offset of the next segment in rxRaw[rxRawHead]
	rxSegIdx  int        // its index
	rxReady   []item     // impaired packets ready for delivery, guarded by rxMu
	rxHead    int        // next in rxReady
	rxOwned   []*pbuf    // conn-owned buffers handed out by the last Receive

	// woken is set by Wake and cleared by the Receive that returns for it;
	// wakeC wakes a PipeConn's Receive.
	woken atomic.Bool
	wakeC chan struct{}
}

func (c *core) init(local netip.AddrPort, pool *bufPool, logf func(string, ...any)) {
	c.local = local
	c.is4 = local.Addr().Is4()
	c.pool = pool
	c.logf = logf
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	c.tx.init(DirTx, &c.stats.TxImpair, pool)
	c.rx.init(DirRx, &c.stats.RxImpair, pool)
	c.timer.kick = make(chan struct{}, 1)
	c.timer.done = make(chan struct{})
	c.wakeC = make(chan struct{}, 1)
	c.src = make(map[uint16]*srcPort)
}

// AcquireSourcePort implements Conn.
func (c *core) AcquireSourcePort(port uint16) error {
	if port == 0 || port == c.local.Port() {
		return nil
	}
	c.srcMu.Lock()
	defer c.srcMu.Unlock()
	if c.closed.Load() {
		return net.ErrClosed
	}
	if s := c.src[port]; s != nil {
		s.holds++
		return nil
	}
	s := &srcPort{}
	if c.openSrc != nil {
		var err error
		if s, err = c.openSrc(port); err != nil {
			return fmt.Errorf("conn: source port %d: %w", port, err)
		}
	}
	s.holds = 1
	c.txMu.Lock()
	c.src[port] = s
	c.srcLast.valid = false
	c.txMu.Unlock()
	return nil
}

// ReleaseSourcePort implements Conn.
func (c *core) ReleaseSourcePort(port uint16) {
	if port == 0 || port == c.local.Port() {
		return
	}
	c.srcMu.Lock()
	defer c.srcMu.Unlock()
	s := c.src[port]
	if s == nil {
		return // closed with the conn
	}
	if s.holds--; s.holds > 0 {
		return
	}
	c.txMu.Lock()
	delete(c.src, port)
	c.srcLast.valid = false
	c.txMu.Unlock()
	if s.sock != nil {
		_ = s.sock.Close()
	}
}

// SourcePorts returns the source ports held with AcquireSourcePort and
// the number of holds of each.
func (c *core) SourcePorts() map[uint16]int {
	c.srcMu.Lock()
	defer c.srcMu.Unlock()
	out := make(map[uint16]int, len(c.src))
	for p, s := range c.src {
		out[p] = s.holds
	}
	return out
}

// closeSourcePorts closes every source port's socket (Close).
func (c *core) closeSourcePorts() {
	c.srcMu.Lock()
	defer c.srcMu.Unlock()
	c.txMu.Lock()
	ports := c.src
	c.src = map[uint16]*srcPort{}
	c.srcLast.valid = false
	c.txMu.Unlock()
	for _, s := range ports {
		if s.sock != nil {
			_ = s.sock.Close()
		}
	}
}

// srcPortOf returns the source port a packet given to Send leaves from:
// 0 (the conn's own) for 0, the conn's own port or a port not held.
// Called with txMu held.
func (c *core) srcPortOf(port uint16) uint16 {
	if port == 0 || port == c.local.Port() {
		return 0
	}
	if l := &c.srcLast; !l.valid || l.port != port {
		l.port, l.held, l.valid = port, c.src[port] != nil, true
	}
	if !c.srcLast.held {
		return 0
	}
	return port
}

func (c *core) LocalAddr() netip.AddrPort { return c.local }
func (c *core) BatchSize() int            { return IdealBatchSize }
func (c *core) Stats() *Stats             { return &c.stats }

// SetImpairment implements Conn.
func (c *core) SetImpairment(m *Impairment) error {
	if m != nil {
		if err := m.Validate(); err != nil {
			return err
		}
		cp := *m // the conn keeps its own copy: the caller may reuse m
		m = &cp
	}
	c.impair.Store(m)
	return nil
}

// Impairment returns the impairment in force (nil: none). It must not be
// modified.
func (c *core) Impairment() *Impairment { return c.impair.Load() }

// SetTap implements Conn.
func (c *core) SetTap(t Tap) {
	if t == nil {
		c.tap.Store(nil)
		return
	}
	c.tap.Store(&tapBox{t})
}

// send is Conn.Send for both backends.
func (c *core) send(pkts []Packet) error {
	if len(pkts) == 0 {
		return nil
	}
	c.txMu.Lock()
	defer c.txMu.Unlock()
	if c.closed.Load() {
		return net.ErrClosed
	}
	in := c.txIn[:0]
	for _, p := range pkts {
		if len(p.Buf) < MinPacketSize || len(p.Buf) > MaxPacketSize {
			clear(in)
			return ErrPacketSize
		}
		a, ok := c.checkDst(p.Addr)
		if !ok {
			clear(in)
			return ErrAddressFamily
		}
		sport := c.srcPortOf(p.SrcPort)
		// A ready ICRC holds for the port the caller meant.
		ready := p.ICRCReady && (sport != 0 || p.SrcPort == 0 || p.SrcPort == c.local.Port())
		in = append(in, item{buf: p.Buf, addr: a, sport: sport, icrc: ready})
	}
	c.tx.begin(c.impair.Load())
	if c.tx.idle() {
		err := c.emit(in)
		c.release(in)
		c.txIn = in[:0]
		return err
	}
	now := time.Now()
	out := c.tx.due(c.txOut[:0], now) // due packets go first
	for _, it := range in {
		out = c.tx.process(out, it, now)
	}
	c.tx.settle() // held packets must not alias the caller's buffers
	clear(in)
	c.txIn = in[:0]
	c.armTimer()
	err := c.emit(out)
	c.release(out)
	c.txOut = out[:0]
	return err
}

// release returns the conn-owned buffers of items to the pool and clears
// the references to callers' buffers.
func (c *core) release(items []item) {
	for i := range items {
		c.pool.put(items[i].pb)
	}
	clear(items)
}

// finishTx computes the ICRC of a packet about to be sent with IPv4 ID id
// (or corrects the one it has for another ID), applies a pending
// corruption and shows it to the tap.
func (c *core) finishTx(it *item, id uint16) {
	if !c.is4 {
		id = 0
	}
	if it.flipped { // the ICRC is being recomputed (GSO turned off): undo
		it.buf[it.pos] ^= it.mask
		it.flipped = false
	}
	src := c.local
	if it.sport != 0 {
		src = netip.AddrPortFrom(c.local.Addr(), it.sport)
	}
	switch {
	case c.noICRC:
	case it.icrc:
		if it.icrcID != id {
			c.idTable(len(it.buf)).SetID(it.buf, it.icrcID, id)
			it.icrcID = id
		}
	default:
		h := wire.IPHeader{Src: src.Addr(), Dst: it.addr.Addr(), ID: id, DF: true}
		wire.PutICRC(&h, src.Port(), it.addr.Port(), it.buf)
		it.icrc, it.icrcID = true, id
	}
	if it.corrupt {
		it.buf[it.pos] ^= it.mask
		it.flipped = true
	}
	if t := c.tap.Load(); t != nil && !it.tapped {
		t.t.Packet(DirTx, src, it.addr, id, it.buf)
		it.tapped = true
	}
}

// idTable returns the ICRC ID table of packets of n bytes, filling one
// of the two cached tables if neither is n's. Called with txMu held.
func (c *core) idTable(n int) *wire.ICRCIDTable {
	for i := range c.idTabs {
		if c.idTabs[i].Len() == n {
			return &c.idTabs[i]
		}
	}
	t := &c.idTabs[c.idVictim]
	c.idVictim ^= 1
	t.Fill(n)
	return t
}

// armTimer makes sure the timer goroutine runs when packets are waiting in
// the send-side delay line or reorder hold. Called with txMu held.
func (c *core) armTimer() {
	if _, ok := c.tx.next(); !ok || c.closed.Load() {
		return // closed: shutdown has stopped the timer, or is about to wait for it
	}
	if !c.timer.started {
		c.timer.started = true
		c.timer.wg.Add(1)
		go c.timerLoop()
	}
	select {
	case c.timer.kick <- struct{}{}:
	default:
	}
}

// timerLoop sends delayed and held packets when they are due. It runs from
// the first delayed packet until Close.
func (c *core) timerLoop() {
	defer c.timer.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		c.txMu.Lock()
		if c.closed.Load() {
			c.txMu.Unlock()
			return
		}
		now := time.Now()
		if due := c.tx.due(c.txDue[:0], now); len(due) > 0 {
			_ = c.emit(due) // failures are counted in Stats
			c.release(due)
			c.txDue = due[:0]
		}
		next, ok := c.tx.next()
		c.txMu.Unlock()
		if ok {
			t.Reset(next.Sub(now))
		} else {
			t.Stop()
		}
		select {
		case <-t.C:
		case <-c.timer.kick:
		case <-c.timer.done:
			return
		}
	}
}

// shutdown stops the timer goroutine and discards held packets. The
// backend has already made Receive return.
func (c *core) shutdown() {
	// Under txMu, the lock armTimer starts the timer goroutine under: a
	// wg.Add (at a zero count) must happen before the Wait, and after
	// this no Send or armTimer starts one.
	c.txMu.Lock()
	c.closed.Store(true)
	close(c.timer.done)
	c.txMu.Unlock()
	c.timer.wg.Wait()
	c.closeSourcePorts()
	c.txMu.Lock()
	c.tx.discard()
	c.txMu.Unlock()
	c.rxMu.Lock()
	c.rx.discard()
	for _, r := range c.rxRaw[c.rxRawHead:] {
		c.pool.put(r.pb)
	}
	clear(c.rxRaw)
	c.rxRaw, c.rxRawHead = c.rxRaw[:0], 0
	c.release(c.rxReady[c.rxHead:])
	c.rxReady, c.rxHead = c.rxReady[:0], 0
	c.releaseOwned()
	c.rxMu.Unlock()
}

// Buffered reports whether packets already read from the network wait
// for the next Receive, which then returns without a system call (the
// rest of a recvmmsg batch, the segments of a GRO super-buffer, released
// impaired packets). A receive loop that coalesces acknowledgements sends
// them when nothing is buffered, as the next Receive may block. When
// Buffered was true the next Receive does not block: if every packet it
// held is dropped on delivery (a bad ICRC, the receive impairment), it
// returns 0 packets and no error.
func (c *core) Buffered() bool {
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	return c.buffered()
}

// buffered is Buffered with rxMu held.
func (c *core) buffered() bool { return c.rxHead < len(c.rxReady) || c.rxRawHead < len(c.rxRaw) }

// beginReceive starts a Receive call: the previous call's buffers go back
// to the pool. Called with rxMu held.
func (c *core) beginReceive() {
	c.releaseOwned()
}

func (c *core) releaseOwned() {
	for i, b := range c.rxOwned {
		c.pool.put(b)
		c.rxOwned[i] = nil
	}
	c.rxOwned = c.rxOwned[:0]
}

// beforeRead is called before the backend reads more datagrams (which
// overwrites the buffers of the previous ones). Called with rxMu held.
func (c *core) beforeRead() {
	c.rx.settle()
	clear(c.rxRaw)
	c.rxRaw, c.rxRawHead, c.rxSegOff, c.rxSegIdx = c.rxRaw[:0], 0, 0, 0
}

// deliver fills pkts with what is ready: due delayed packets, packets the
// impairment let through, and datagrams read but not yet consumed. It
// returns the number of packets filled. Called with rxMu held.
func (c *core) deliver(pkts []Packet) int {
	n := 0
	var now time.Time
	c.rx.begin(c.impair.Load())
	if !c.rx.idle() {
		now = time.Now()
		c.rxReady = c.rx.due(c.rxReady, now)
	}
	for n < len(pkts) {
		if c.rxHead < len(c.rxReady) {
			it := c.rxReady[c.rxHead]
			c.rxReady[c.rxHead] = item{}
			c.rxHead++
			if it.corrupt {
				// The ID is known (the packet verified on arrival), so the
				// check is exact: no ID is solved for.
				it.buf[it.pos] ^= it.mask
				h := wire.IPHeader{Src: it.addr.Addr(), Dst: c.local.Addr(), ID: it.id, DF: true}
				body := it.buf[:len(it.buf)-wire.ICRCSize]
				if wire.ComputeICRC(&h, it.addr.Port(), c.local.Port(), body) != wire.PacketICRC(it.buf) {
					c.stats.BadICRC.Add(1)
					c.pool.put(it.pb)
					continue
				}
			}
			pkts[n] = Packet{Buf: it.buf, Addr: it.addr, IP: it.ipInfo()}
			if it.pb != nil {
				c.rxOwned = append(c.rxOwned, it.pb)
			}
			n++
			continue
		}
		c.rxReady, c.rxHead = c.rxReady[:0], 0
		it, ok, more := c.nextArrival()
		if !more {
			break
		}
		if !ok {
			continue
		}
		if c.rx.idle() {
			pkts[n] = Packet{Buf: it.buf, Addr: it.addr, IP: it.ipInfo()}
			if it.pb != nil {
				c.rxOwned = append(c.rxOwned, it.pb)
			}
			n++
			continue
		}
		if now.IsZero() {
			now = time.Now()
		}
		c.rxReady = c.rx.process(c.rxReady, it, now)
	}
	return n
}

// nextArrival takes the next datagram (or GRO segment) from rxRaw and
// checks its ICRC. more is false when rxRaw is used up; ok is false when
// the datagram was dropped.
func (c *core) nextArrival() (it item, ok, more bool) {
	if c.rxRawHead >= len(c.rxRaw) {
		return item{}, false, false
	}
	r := &c.rxRaw[c.rxRawHead]
	b, seg := r.buf, -1
	if r.gso > 0 && r.gso < len(r.buf) {
		off := c.rxSegOff
		end := min(off+r.gso, len(r.buf))
		b, seg = r.buf[off:end], c.rxSegIdx
		if seg == 0 {
			c.stats.GROBatches.Add(1)
		}
		c.rxSegOff, c.rxSegIdx = end, seg+1
		if end == len(r.buf) {
			c.rxRawHead++
			c.rxSegOff, c.rxSegIdx = 0, 0
		}
	} else {
		c.rxRawHead++
	}
	from, pb := r.from, r.pb
	c.stats.RcvdDatagrams.Add(1)
	c.stats.RcvdBytes.Add(uint64(len(b)))
	if len(b) < MinPacketSize {
		c.stats.Short.Add(1)
		if t := c.tap.Load(); t != nil {
			t.t.Packet(DirRx, from, c.local, 0, b) // what arrived, though it is dropped
		}
		c.pool.put(pb)
		return item{}, false, true
	}
	// Linux sends ID 0 on our unconnected DF socket, except that segment i
	// of a UDP GSO super-buffer gets ID i (see UDPConn.emitBatch); a GRO
	// super-buffer built from separate datagrams has ID 0 everywhere, and
	// a peer such as rxe uses IDs we cannot predict. VerifyICRC tries the
	// hint first and otherwise solves for the ID.
	var hint uint16
	if c.is4 && seg > 0 {
		hint = uint16(seg)
	}
	ok, id := c.verify(b, from, hint)
	if t := c.tap.Load(); t != nil {
		t.t.Packet(DirRx, from, c.local, id, b)
	}
	if !ok {
		c.stats.BadICRC.Add(1)
		c.pool.put(pb)
		return item{}, false, true
	}
	return item{buf: b, addr: from, pb: pb, id: id, ip: r.ip}, true, true
}

// ipInfo returns what is known of the packet's IP header.
func (it *item) ipInfo() IPInfo {
	ip := it.ip
	ip.ID = it.id
	return ip
}

// verify checks the ICRC of a packet received from from, with IPv4 ID
// hint as the first guess. It returns the ID that verified, or hint. It
// is wire.VerifyICRC's check (the same packets pass, with the same ID),
// from a cached prefix: the packet is hashed for ID 0 once, the hint is
// tried by the table of ID changes (a GSO segment's ID is its position,
// under 64), and otherwise the ID is solved for. Called with rxMu held.
func (c *core) verify(b []byte, from netip.AddrPort, hint uint16) (bool, uint16) {
	if c.noICRC {
		return true, hint
	}
	if len(b) < wire.BTHSize+wire.ICRCSize {
		return false, hint
	}
	e := c.rxPrefix(from, len(b))
	got := e.p.BeginCached(b).Update(b[wire.BTHSize : len(b)-wire.ICRCSize]).Sum() // for ID 0
	if hint != 0 && hint < 64 {
		if e.ids.Len() != len(b) {
			e.ids.Fill(len(b)) // once per entry, at its first hint
		}
		if got^e.ids.Delta(hint) == wire.PacketICRC(b) {
			return true, hint
		}
	}
	h := wire.IPHeader{Src: from.Addr(), Dst: c.local.Addr(), DF: true}
	if ok, id := wire.CheckICRC(&h, got, b); ok {
		return true, id
	}
	return false, hint
}

// rxPrefix is a cached ICRC prefix of received packets (core.rxPrefixes).
type rxPrefix struct {
	from   netip.AddrPort // the zero value: empty
	pktLen int
	p      wire.ICRCPrefix  // for IPv4 ID 0 and DF, to the conn's address
	ids    wire.ICRCIDTable // filled at the entry's first hint (IPv4)
}

// rxPrefix returns the cache entry of packets of pktLen bytes from from,
// filling the older entry on a miss. Called with rxMu held.
func (c *core) rxPrefix(from netip.AddrPort, pktLen int) *rxPrefix {
	for i := range c.rxPrefixes {
		if e := &c.rxPrefixes[i]; e.from == from && e.pktLen == pktLen {
			return e
		}
	}
	e := &c.rxPrefixes[c.rxVictim]
	c.rxVictim ^= 1
	h := wire.IPHeader{Src: from.Addr(), Dst: c.local.Addr(), DF: true}
	*e = rxPrefix{from: from, pktLen: pktLen, p: wire.NewICRCPrefix(&h, from.Port(), c.local.Port(), pktLen)}
	return e
}
