package conn

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// PipeConfig configures NewPipeWith.
type PipeConfig struct {
	// AddrA and AddrB are the two ends' addresses; the zero values mean
	// 127.0.0.1:4791 and 127.0.0.2:4791. They must be of one IP family.
	AddrA, AddrB netip.AddrPort
	// QueueLen is the number of datagrams each end can hold unreceived;
	// further ones are dropped and counted in Stats.RecvQueueFull (the
	// analogue of a full socket buffer). 0 means 4096.
	QueueLen int
	// Logf, if not nil, receives warnings.
	Logf func(format string, args ...any)
}

// PipeConn is one end of an in-memory pipe (see NewPipe). It has the same
// Packet semantics as a UDP conn: ICRCs are computed with IPv4 ID 0 and
// checked, impairments and taps work the same way. It does not batch into
// GSO super-buffers. Source ports (AcquireSourcePort) need no socket: a
// packet sent from one arrives from it.
type PipeConn struct {
	core
	peer   *PipeConn
	q      chan rawDgram // datagrams sent to this end
	closed chan struct{}
	once   sync.Once

	timer *time.Timer // rx delay wake-up, created on first use; guarded by rxMu
}

var _ Conn = (*PipeConn)(nil)

// NewPipe returns two cross-wired in-memory conns, at 127.0.0.1:4791 and
// 127.0.0.2:4791, for engine tests (the counterpart of wireguard-go's
// bindtest.NewChannelBinds). What a sends to b's address, b receives from
// a's, and the other way round.
func NewPipe() (a, b *PipeConn) {
	a, b, err := NewPipeWith(PipeConfig{})
	if err != nil {
		panic(err) // the defaults are valid
	}
	return a, b
}

// NewPipeWith is NewPipe with a configuration.
func NewPipeWith(cfg PipeConfig) (a, b *PipeConn, err error) {
	if !cfg.AddrA.IsValid() {
		cfg.AddrA = DefaultAddr(netip.AddrFrom4([4]byte{127, 0, 0, 1}))
	}
	if !cfg.AddrB.IsValid() {
		cfg.AddrB = DefaultAddr(netip.AddrFrom4([4]byte{127, 0, 0, 2}))
	}
	cfg.AddrA = netip.AddrPortFrom(cfg.AddrA.Addr().Unmap(), cfg.AddrA.Port())
	cfg.AddrB = netip.AddrPortFrom(cfg.AddrB.Addr().Unmap(), cfg.AddrB.Port())
	if cfg.AddrA.Addr().Is4() != cfg.AddrB.Addr().Is4() || cfg.AddrA == cfg.AddrB {
		return nil, nil, ErrAddressFamily
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 4096
	}
	pool := new(bufPool)
	a = newPipeEnd(cfg.AddrA, cfg.QueueLen, pool, cfg.Logf)
	b = newPipeEnd(cfg.AddrB, cfg.QueueLen, pool, cfg.Logf)
	a.peer, b.peer = b, a
	return a, b, nil
}

func newPipeEnd(addr netip.AddrPort, qlen int, pool *bufPool, logf func(string, ...any)) *PipeConn {
	p := &PipeConn{q: make(chan rawDgram, qlen), closed: make(chan struct{})}
	p.core.init(addr, pool, logf)
	p.core.emit = p.emit
	p.core.checkDst = p.checkDst
	return p
}

func (p *PipeConn) checkDst(a netip.AddrPort) (netip.AddrPort, bool) {
	a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	return a, a == p.peer.local
}

// Send implements Conn.
func (p *PipeConn) Send(pkts []Packet) error {
	p.stats.SendCalls.Add(1)
	return p.send(pkts)
}

// emit copies each packet into the peer's queue. Called with txMu held.
func (p *PipeConn) emit(items []item) error {
	peer := p.peer
	for i := range items {
		it := &items[i]
		if it.sport != 0 && p.src[it.sport] == nil {
			// Released while the packet waited (a delay impairment): it
			// leaves from the conn's own port, its ready ICRC hashed
			// again (UDPConn.emitFrom).
			it.sport, it.icrc = 0, false
		}
		p.finishTx(it, 0)
		p.stats.SentDatagrams.Add(1)
		p.stats.SentBytes.Add(uint64(len(it.buf)))
		if peer.core.closed.Load() {
			continue // like UDP to a closed port: gone
		}
		from := p.local
		if it.sport != 0 {
			from = netip.AddrPortFrom(from.Addr(), it.sport)
		}
		pb := p.pool.copyOf(it.buf)
		select {
		case peer.q <- rawDgram{buf: pb.b, from: from, pb: pb, ip: IPInfo{TTL: DefaultTTL, TOS: DefaultTOS}}:
		default:
			peer.stats.RecvQueueFull.Add(1)
			p.pool.put(pb)
		}
	}
	return nil
}

// Receive implements Conn.
// Wake implements Conn.
func (p *PipeConn) Wake() {
	p.woken.Store(true)
	select {
	case p.wakeC <- struct{}{}:
	default:
	}
}

func (p *PipeConn) Receive(pkts []Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	p.rxMu.Lock()
	defer p.rxMu.Unlock()
	p.beginReceive()
	held := p.buffered()
	for {
		if p.core.closed.Load() {
			return 0, net.ErrClosed
		}
		if n := p.deliver(pkts); n > 0 {
			return n, nil
		}
		if held {
			return 0, nil // what Buffered promised was all dropped (see Conn.Receive)
		}
		if p.woken.Swap(false) {
			return 0, nil
		}
		p.beforeRead()
		var wake <-chan time.Time
		if next, ok := p.rx.next(); ok {
			if p.timer == nil {
				p.timer = time.NewTimer(time.Until(next))
			} else {
				p.timer.Reset(time.Until(next))
			}
			wake = p.timer.C
		}
		select {
		case d := <-p.q:
			p.rxRaw = append(p.rxRaw, d)
			// Take what else is queued, up to a batch.
			for len(p.rxRaw) < max(len(pkts), IdealBatchSize) {
				select {
				case d := <-p.q:
					p.rxRaw = append(p.rxRaw, d)
					continue
				default:
				}
				break
			}
		case <-p.closed:
			return 0, net.ErrClosed
		case <-wake:
		case <-p.wakeC:
		}
		if p.timer != nil {
			p.timer.Stop()
		}
		p.stats.RecvCalls.Add(1)
	}
}

// Close implements Conn. The peer stays open; what it sends is dropped.
func (p *PipeConn) Close() error {
	p.once.Do(func() {
		p.core.closed.Store(true)
		close(p.closed)
		p.shutdown()
		for {
			select {
			case d := <-p.q:
				p.pool.put(d.pb)
				continue
			default:
			}
			break
		}
	})
	return nil
}
