package conn_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

func TestUDPRoundTrip(t *testing.T) {
	for _, gso := range []bool{true, false} {
		for _, gro := range []bool{true, false} {
			t.Run(fmt.Sprintf("gso=%v,gro=%v", gso, gro), func(t *testing.T) {
				goroutineLeakCheck(t)
				a := listen(t, conn.Config{DisableGSO: !gso, DisableGRO: !gro})
				b := listen(t, conn.Config{DisableGSO: !gso, DisableGRO: !gro})
				agso, _ := a.Offload()
				_, bgro := b.Offload()
				rcv, snd := b.SocketBuffers()
				t.Logf("offload: sender GSO %v, receiver GRO %v; socket buffers: receive %d, send %d", agso, bgro, rcv, snd)
				r := rand.New(rand.NewPCG(1, 2))
				seq := uint32(0)
				for _, n := range []int{1, 2, 3, 17, 63, 64, 65, 128, 300} {
					sizes := mixedSizes(r, n)
					pkts := make([]conn.Packet, n)
					want := make([][]byte, n)
					for i, sz := range sizes {
						pkts[i] = conn.Packet{Buf: newPacket(seq, sz), Addr: b.LocalAddr()}
						seq++
					}
					require.NoError(t, a.Send(pkts))
					for i := range pkts {
						want[i] = pkts[i].Buf // ICRC filled in by Send
					}
					got := receiveN(t, b, n, 5*time.Second)
					require.Len(t, got, n, "batch of %d", n)
					for i := range got {
						require.Equal(t, a.LocalAddr(), got[i].from)
						require.Equal(t, want[i], got[i].buf, "batch of %d, packet %d", n, i)
					}
				}
				as, bs := a.Stats().Snapshot(), b.Stats().Snapshot()
				require.Zero(t, bs.BadICRC)
				require.Zero(t, bs.Short)
				require.Zero(t, as.SendErrors)
				require.Equal(t, uint64(seq), as.SentDatagrams)
				require.Equal(t, uint64(seq), bs.RcvdDatagrams)
				require.Equal(t, as.SentBytes, bs.RcvdBytes)
				if agso {
					require.NotZero(t, as.GSOBatches)
					require.Less(t, as.SendCalls, uint64(seq)/2)
				} else {
					require.Zero(t, as.GSOBatches)
				}
				if agso && bgro {
					require.NotZero(t, bs.GROBatches)
				} else {
					require.Zero(t, bs.GROBatches)
				}
				t.Logf("sender %+v", as)
				t.Logf("receiver %+v", bs)
			})
		}
	}
}

func TestUDPIPv6RoundTrip(t *testing.T) {
	a, err := conn.Listen(conn.Config{Addr: netip.MustParseAddrPort("[::1]:0"), Logf: t.Logf})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer a.Close()
	b := listen(t, conn.Config{Addr: netip.MustParseAddrPort("[::1]:0")})
	pkts := make([]conn.Packet, 40)
	for i := range pkts {
		pkts[i] = conn.Packet{Buf: newPacket(uint32(i), 1040), Addr: b.LocalAddr()}
	}
	pkts[39].Buf = newPacket(39, 100)
	require.NoError(t, a.Send(pkts))
	got := receiveN(t, b, len(pkts), 5*time.Second)
	require.Len(t, got, len(pkts))
	for i := range got {
		require.Equal(t, pkts[i].Buf, got[i].buf)
		require.Equal(t, a.LocalAddr(), got[i].from)
	}
	require.Zero(t, b.Stats().BadICRC.Load())
	// And from a held source port (its own socket, bound to ::1).
	sport := freePorts(t, 1)[0]
	require.NoError(t, a.AcquireSourcePort(sport))
	defer a.ReleaseSourcePort(sport)
	for i := range pkts {
		pkts[i].SrcPort = sport
	}
	require.NoError(t, a.Send(pkts))
	got = receiveN(t, b, len(pkts), 5*time.Second)
	require.Len(t, got, len(pkts))
	for i := range got {
		require.Equal(t, pkts[i].Buf, got[i].buf)
		require.Equal(t, netip.AddrPortFrom(a.LocalAddr().Addr(), sport), got[i].from)
	}
	require.Zero(t, b.Stats().BadICRC.Load())
	// An IPv4 destination is refused before anything is sent.
	require.ErrorIs(t, a.Send([]conn.Packet{{Buf: newPacket(0, 64), Addr: netip.MustParseAddrPort("127.0.0.1:4791")}}), conn.ErrAddressFamily)
}

func TestUDPBadICRCDroppedAndCounted(t *testing.T) {
	a := listen(t, conn.Config{})
	tap := &rxTap{}
	b := listen(t, conn.Config{Tap: tap})
	// A plain socket sends packets with wrong and right ICRCs.
	raw, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback, 0)))
	require.NoError(t, err)
	defer raw.Close()
	src := raw.LocalAddr().(*net.UDPAddr).AddrPort()
	good := newPacket(1, 200)
	wire.PutICRC(&wire.IPHeader{Src: src.Addr(), Dst: b.LocalAddr().Addr(), DF: true}, src.Port(), b.LocalAddr().Port(), good)
	bad := append([]byte(nil), good...)
	bad[100] ^= 0x20
	short := good[:conn.MinPacketSize-1]
	for _, p := range [][]byte{bad, short, good} {
		_, err := raw.WriteToUDPAddrPort(p, b.LocalAddr())
		require.NoError(t, err)
	}
	// And a conn sends one more, good.
	require.NoError(t, a.Send([]conn.Packet{{Buf: newPacket(2, 64), Addr: b.LocalAddr()}}))
	got := receiveN(t, b, 2, 5*time.Second)
	require.Len(t, got, 2)
	require.Equal(t, good, got[0].buf)
	require.Equal(t, src, got[0].from)
	require.Equal(t, uint32(2), seqOf(got[1].buf))
	s := b.Stats().Snapshot()
	require.Equal(t, uint64(1), s.BadICRC)
	require.Equal(t, uint64(1), s.Short)
	require.Equal(t, uint64(4), s.RcvdDatagrams)
	// The tap (a --pcap) saw every datagram received, the dropped ones
	// too, as they arrived.
	tap.mu.Lock()
	defer tap.mu.Unlock()
	require.Equal(t, [][]byte{bad, short, good}, tap.got[:3])
	require.Len(t, tap.got, 4)
}

// rxTap keeps a copy of every datagram received.
type rxTap struct {
	mu  sync.Mutex
	got [][]byte
}

func (r *rxTap) Packet(dir conn.Direction, src, dst netip.AddrPort, id uint16, roce []byte) {
	if dir != conn.DirRx {
		return
	}
	r.mu.Lock()
	r.got = append(r.got, bytes.Clone(roce))
	r.mu.Unlock()
}

func TestUDPSendRejectsBadPackets(t *testing.T) {
	a := listen(t, conn.Config{})
	dst := netip.MustParseAddrPort("127.0.0.1:4791")
	require.ErrorIs(t, a.Send([]conn.Packet{{Buf: make([]byte, conn.MinPacketSize-1), Addr: dst}}), conn.ErrPacketSize)
	require.ErrorIs(t, a.Send([]conn.Packet{{Buf: make([]byte, conn.MaxPacketSize+1), Addr: dst}}), conn.ErrPacketSize)
	require.ErrorIs(t, a.Send([]conn.Packet{{Buf: newPacket(0, 64), Addr: netip.MustParseAddrPort("[::1]:4791")}}), conn.ErrAddressFamily)
	require.Zero(t, a.Stats().SentDatagrams.Load())
	// An IPv4-mapped destination is the IPv4 address.
	b := listen(t, conn.Config{})
	mapped := netip.AddrPortFrom(netip.AddrFrom16(b.LocalAddr().Addr().As16()), b.LocalAddr().Port())
	require.NoError(t, a.Send([]conn.Packet{{Buf: newPacket(0, 64), Addr: mapped}}))
	got := receiveN(t, b, 1, 5*time.Second)
	require.Len(t, got, 1)
}

func TestUDPCloseUnblocksReceive(t *testing.T) {
	goroutineLeakCheck(t)
	a := listen(t, conn.Config{})
	errc := make(chan error, 1)
	go func() {
		_, err := a.Receive(make([]conn.Packet, 8))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // let Receive block (the test passes either way)
	require.NoError(t, a.Close())
	require.ErrorIs(t, <-errc, net.ErrClosed)
	_, err := a.Receive(make([]conn.Packet, 8))
	require.ErrorIs(t, err, net.ErrClosed)
	require.ErrorIs(t, a.Send([]conn.Packet{{Buf: newPacket(0, 64), Addr: a.LocalAddr()}}), net.ErrClosed)
}

func TestListenRejectsUnspecifiedAddress(t *testing.T) {
	_, err := conn.Listen(conn.Config{Addr: netip.MustParseAddrPort("0.0.0.0:0")})
	require.Error(t, err)
	_, err = conn.Listen(conn.Config{})
	require.Error(t, err)
}

func TestReadUDPSNMP(t *testing.T) {
	s, err := conn.ReadUDPSNMP(false)
	if err != nil {
		t.Skipf("no /proc/net/snmp: %v", err)
	}
	a := listen(t, conn.Config{})
	require.NoError(t, a.Send([]conn.Packet{{Buf: newPacket(0, 64), Addr: a.LocalAddr()}}))
	receiveN(t, a, 1, 5*time.Second)
	s2, err := conn.ReadUDPSNMP(false)
	require.NoError(t, err)
	require.Greater(t, s2.OutDatagrams, s.OutDatagrams)
	require.Greater(t, s2.InDatagrams, s.InDatagrams)
	if _, err := conn.ReadUDPSNMP(true); err != nil {
		t.Logf("no /proc/net/snmp6: %v", err)
	}
}

// TestUDPImpairment runs every impairment at once, in both directions,
// over real sockets with GSO and GRO, and checks that the counters
// account for every packet and that what arrives is intact.
func TestUDPImpairment(t *testing.T) {
	goroutineLeakCheck(t)
	imp, err := conn.ParseImpairment("loss=0.05,reorder=0.05,dup=0.05,corrupt=0.02,delay=1ms,jitter=1ms,delay-prob=0.1,seed=11")
	require.NoError(t, err)
	a := listen(t, conn.Config{Impair: imp})
	b := listen(t, conn.Config{Impair: imp})
	const n = 3000
	r := rand.New(rand.NewPCG(7, 7))
	sizes := mixedSizes(r, n)

	var mu sync.Mutex
	count := map[uint32]int{}
	delivered := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		pkts := make([]conn.Packet, b.BatchSize())
		for {
			k, err := b.Receive(pkts)
			if err != nil {
				return
			}
			mu.Lock()
			for _, p := range pkts[:k] {
				s := seqOf(p.Buf)
				if !assert.Equal(t, newPacket(s, sizes[s])[:sizes[s]-4], p.Buf[:len(p.Buf)-4]) {
					break
				}
				count[s]++
				delivered++
			}
			mu.Unlock()
		}
	}()
	for i := 0; i < n; {
		k := min(1+r.IntN(64), n-i)
		pkts := make([]conn.Packet, k)
		for j := range pkts {
			pkts[j] = conn.Packet{Buf: newPacket(uint32(i+j), sizes[i+j]), Addr: b.LocalAddr()}
		}
		require.NoError(t, a.Send(pkts))
		i += k
	}
	as := a.Stats()
	onWire := n - as.TxImpair.Dropped.Load() + as.TxImpair.Duplicated.Load()
	require.Eventually(t, func() bool { return as.SentDatagrams.Load() == onWire }, 5*time.Second, time.Millisecond, "delayed and held packets are sent")
	bs := b.Stats()
	require.Eventually(t, func() bool { return bs.RcvdDatagrams.Load() == onWire }, 5*time.Second, time.Millisecond, "no loss on loopback")
	want := func() uint64 {
		return onWire - as.TxImpair.Corrupted.Load() - bs.RxImpair.Dropped.Load() + bs.RxImpair.Duplicated.Load() - bs.RxImpair.Corrupted.Load()
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return uint64(delivered) == want()
	}, 5*time.Second, time.Millisecond)
	b.Close()
	<-done
	require.Equal(t, as.TxImpair.Corrupted.Load()+bs.RxImpair.Corrupted.Load(), bs.BadICRC.Load())
	for _, s := range []*conn.ImpairStats{&as.TxImpair, &bs.RxImpair} {
		require.NotZero(t, s.Dropped.Load())
		require.NotZero(t, s.Reordered.Load())
		require.NotZero(t, s.Duplicated.Load())
		require.NotZero(t, s.Corrupted.Load())
		require.NotZero(t, s.Delayed.Load())
	}
	t.Logf("sender %+v", as.Snapshot())
	t.Logf("receiver %+v", bs.Snapshot())
}

func TestListenWarnsWhenBufferNotObtained(t *testing.T) {
	var mu sync.Mutex
	var logs []string
	logf := func(format string, args ...any) {
		mu.Lock()
		logs = append(logs, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	// More than the kernel grants even with SO_RCVBUFFORCE (it doubles
	// at most INT_MAX/2).
	c := listen(t, conn.Config{RcvBuf: math.MaxInt32, SndBuf: -1, Logf: logf})
	rcv, _ := c.SocketBuffers()
	require.Less(t, rcv, math.MaxInt32)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, logs, 1)
	require.Contains(t, logs[0], "socket receive buffer is")
	require.Contains(t, logs[0], "net.core.rmem_max")
	t.Log(logs[0])
}

// A buffer asked for above math.MaxInt32 (the C int setsockopt takes)
// gets what math.MaxInt32 gets, the kernel's most: 8 GiB wrapped to 0,
// the kernel's smallest buffer.
func TestListenBufferAboveMaxInt32(t *testing.T) {
	quiet := func(string, ...any) {}
	most, _ := listen(t, conn.Config{RcvBuf: math.MaxInt32, SndBuf: -1, Logf: quiet}).SocketBuffers()
	huge, _ := listen(t, conn.Config{RcvBuf: 8 << 30, SndBuf: -1, Logf: quiet}).SocketBuffers()
	require.Equal(t, most, huge)
	require.Greater(t, huge, conn.DefaultSocketBuffer/4)
}

// A packet whose ICRC the caller computed for IPv4 ID 0 (Packet.ICRCReady)
// leaves with the ICRC of the ID it is sent with, in GSO batches and
// without, from the conn's own port and from a held source port; a ready
// ICRC for a port that is not held is computed again for the port used.
func TestUDPICRCReady(t *testing.T) {
	for _, gso := range []bool{true, false} {
		t.Run(fmt.Sprintf("gso=%v", gso), func(t *testing.T) {
			goroutineLeakCheck(t)
			tap := &exactICRCTap{}
			a := listen(t, conn.Config{DisableGSO: !gso, Tap: tap})
			b := listen(t, conn.Config{})
			const held = 49441
			if err := a.AcquireSourcePort(held); err != nil {
				t.Skipf("source port %d: %v", held, err)
			}
			defer a.ReleaseSourcePort(held)
			ready := func(seq uint32, size int, sport uint16) conn.Packet {
				buf := newPacket(seq, size)
				from := sport
				if from == 0 {
					from = a.LocalAddr().Port()
				}
				h := wire.IPHeader{Src: a.LocalAddr().Addr(), Dst: b.LocalAddr().Addr(), DF: true}
				wire.PutICRC(&h, from, b.LocalAddr().Port(), buf)
				return conn.Packet{Buf: buf, Addr: b.LocalAddr(), SrcPort: sport, ICRCReady: true}
			}
			var pkts []conn.Packet
			seq := uint32(0)
			for _, sport := range []uint16{0, held, 49442} { // 49442 is not held
				for range 20 {
					pkts = append(pkts, ready(seq, 1000, sport))
					seq++
				}
			}
			require.NoError(t, a.Send(pkts))
			got := receiveN(t, b, len(pkts), 5*time.Second)
			require.Len(t, got, len(pkts))
			require.Zero(t, b.Stats().BadICRC.Load())
			tap.mu.Lock()
			defer tap.mu.Unlock()
			require.Equal(t, len(pkts), tap.n)
			require.Zero(t, tap.bad, "datagrams whose ICRC is not the one of the IPv4 ID and port they left with")
			if gso {
				require.NotZero(t, a.Stats().GSOBatches.Load())
				require.NotZero(t, tap.nonZeroID, "no datagram left with an ID other than 0")
			}
		})
	}
}

// exactICRCTap checks the ICRC of every datagram sent with the exact IPv4
// ID and ports it leaves with.
type exactICRCTap struct {
	mu                sync.Mutex
	n, bad, nonZeroID int
}

func (e *exactICRCTap) Packet(dir conn.Direction, src, dst netip.AddrPort, id uint16, roce []byte) {
	if dir != conn.DirTx {
		return
	}
	h := wire.IPHeader{Src: src.Addr(), Dst: dst.Addr(), ID: id, DF: true}
	ok := wire.VerifyICRCExact(&h, src.Port(), dst.Port(), roce)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if !ok {
		e.bad++
	}
	if id != 0 {
		e.nonZeroID++
	}
}

// TestRecvQueueCountsOverflow fills a small receive buffer that nobody
// reads: the kernel drops what does not fit, and RecvQueue tells how many
// (sk_drops) and how many bytes wait, so that every datagram sent is
// either read or counted as dropped. This is the loss no other counter
// of the conn sees: it happens in the kernel before the conn reads.
func TestRecvQueueCountsOverflow(t *testing.T) {
	rx := listen(t, conn.Config{RcvBuf: 64 << 10, DisableGRO: true, Logf: func(string, ...any) {}})
	tx := listen(t, conn.Config{DisableGSO: true})
	q, err := rx.RecvQueue()
	if errors.Is(err, syscall.ENOPROTOOPT) {
		t.Skip("no SK_MEMINFO_DROPS before Linux 4.7")
	}
	require.NoError(t, err)
	require.Equal(t, conn.RecvQueue{}, q, "a new socket has dropped and queued nothing")

	// 256 datagrams of 4 KiB: far more than 64 KiB of buffer holds. On
	// loopback the kernel delivers (or drops) each one in the sender's
	// sendmmsg, so they are all accounted for when Send returns.
	const n = 256
	pkts := make([]conn.Packet, 0, 64)
	for i := 0; i < n; i += 64 {
		pkts = pkts[:0]
		for j := range 64 {
			pkts = append(pkts, conn.Packet{Buf: newPacket(uint32(i+j), 4096+wire.BTHSize+wire.ICRCSize), Addr: rx.LocalAddr()})
		}
		require.NoError(t, tx.Send(pkts))
	}
	full, err := rx.RecvQueue()
	require.NoError(t, err)
	require.NotZero(t, full.Drops, "a 64 KiB buffer cannot hold 1 MiB")
	require.Less(t, full.Drops, uint64(n), "the first datagrams fit")
	require.NotZero(t, full.Queued)

	got := receiveN(t, rx, n-int(full.Drops), 10*time.Second)
	require.Len(t, got, n-int(full.Drops), "every datagram sent is read or counted as dropped")
	for i, p := range got {
		require.Equal(t, uint32(i), seqOf(p.buf), "the ones kept are the first, in order")
	}
	after, err := rx.RecvQueue()
	require.NoError(t, err)
	require.Equal(t, conn.RecvQueue{Drops: full.Drops}, after, "the queue is empty, the drops stay counted")
}
