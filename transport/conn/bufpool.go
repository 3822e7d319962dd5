package conn

import "sync"

// pbuf is a buffer owned by a conn: a copy of a datagram that outlives the
// caller's or the socket's buffer (a duplicate, a corrupted copy, a packet
// held by a delay or reorder impairment, a datagram queued in a pipe).
type pbuf struct {
	b     []byte // len = the datagram's length; cap = the size class
	class int8
}

// Size classes of pooled buffers: small packets (ACKs), an MTU-4096 RoCE
// packet with its headers, and anything up to the largest UDP payload.
var poolClasses = [...]struct{ size, keep int }{
	{2 << 10, 4096},
	{9 << 10, 2048},
	{64 << 10, 64},
}

// bufPool is a free list of pbufs per size class. Unlike sync.Pool it is
// never emptied by the garbage collector, so a conn in steady state does
// not allocate (the allocation tests rely on this); it keeps at most
// poolClasses[i].keep free buffers per class and lets the rest go. Safe for
// concurrent use.
type bufPool struct {
	mu   sync.Mutex
	free [len(poolClasses)][]*pbuf // guarded by mu
}

// get returns a buffer of length n (n <= MaxPacketSize).
func (p *bufPool) get(n int) *pbuf {
	c := 0
	for c < len(poolClasses)-1 && poolClasses[c].size < n {
		c++
	}
	p.mu.Lock()
	if f := p.free[c]; len(f) > 0 {
		b := f[len(f)-1]
		f[len(f)-1] = nil
		p.free[c] = f[:len(f)-1]
		p.mu.Unlock()
		b.b = b.b[:n]
		return b
	}
	p.mu.Unlock()
	return &pbuf{b: make([]byte, n, poolClasses[c].size), class: int8(c)}
}

// copyOf returns a pooled copy of b.
func (p *bufPool) copyOf(b []byte) *pbuf {
	pb := p.get(len(b))
	copy(pb.b, b)
	return pb
}

// put returns b to the pool. b must not be used afterwards.
func (p *bufPool) put(b *pbuf) {
	if b == nil {
		return
	}
	c := b.class
	p.mu.Lock()
	if len(p.free[c]) < poolClasses[c].keep {
		p.free[c] = append(p.free[c], b)
	}
	p.mu.Unlock()
}
