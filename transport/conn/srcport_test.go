package conn_test

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// freePorts returns n UDP ports that were free on the loopback address a
// moment ago (bound and closed again).
func freePorts(t testing.TB, n int) []uint16 {
	t.Helper()
	var ports []uint16
	var socks []*net.UDPConn
	for range n {
		s, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback, 0)))
		require.NoError(t, err)
		socks = append(socks, s)
		ports = append(ports, uint16(s.LocalAddr().(*net.UDPAddr).Port))
	}
	for _, s := range socks {
		s.Close()
	}
	return ports
}

type sourcePorter interface {
	SourcePorts() map[uint16]int
}

// A batch whose packets come from several source ports leaves through one
// socket per port: each packet arrives from its port, with an ICRC
// computed for that port, and the packets of each port keep their order.
func TestUDPSourcePortsSplitABatch(t *testing.T) {
	for _, gso := range []bool{true, false} {
		t.Run(fmt.Sprintf("gso=%v", gso), func(t *testing.T) {
			goroutineLeakCheck(t)
			a := listen(t, conn.Config{DisableGSO: !gso})
			b := listen(t, conn.Config{})
			ports := freePorts(t, 2)
			for _, p := range ports {
				require.NoError(t, a.AcquireSourcePort(p))
			}
			require.NoError(t, a.AcquireSourcePort(0)) // nothing to hold
			require.NoError(t, a.AcquireSourcePort(a.LocalAddr().Port()))
			require.Equal(t, map[uint16]int{ports[0]: 1, ports[1]: 1}, a.SourcePorts())

			// Runs of one port (GSO-able) interleaved with single packets
			// of the others, and the conn's own port written both ways.
			from := []uint16{0, ports[0], ports[0], ports[0], ports[1], 0, ports[0], a.LocalAddr().Port(),
				ports[1], ports[1], ports[1], ports[1], 0, ports[0]}
			pkts := make([]conn.Packet, len(from))
			for i, p := range from {
				pkts[i] = conn.Packet{Buf: newPacket(uint32(i), 1040), Addr: b.LocalAddr(), SrcPort: p}
			}
			require.NoError(t, a.Send(pkts))
			got := receiveN(t, b, len(from), 5*time.Second)
			require.Len(t, got, len(from))
			last := map[uint16]int{}
			for _, g := range got {
				i := int(seqOf(g.buf))
				want := from[i]
				if want == 0 {
					want = a.LocalAddr().Port()
				}
				require.Equal(t, netip.AddrPortFrom(loopback, want), g.from, "packet %d", i)
				require.Equal(t, pkts[i].Buf, g.buf, "packet %d", i)
				if prev, ok := last[want]; ok {
					require.Greater(t, i, prev, "packets of port %d out of order", want)
				}
				last[want] = i
			}
			require.Zero(t, b.Stats().BadICRC.Load())
			require.Equal(t, uint64(len(from)), a.Stats().SentDatagrams.Load())
		})
	}
}

// Holds are counted; the last release closes the socket (the port can be
// bound again), and a packet that names a port nobody holds goes from the
// conn's own port.
func TestUDPSourcePortHolds(t *testing.T) {
	a := listen(t, conn.Config{})
	b := listen(t, conn.Config{})
	p := freePorts(t, 1)[0]
	require.NoError(t, a.AcquireSourcePort(p))
	require.NoError(t, a.AcquireSourcePort(p))
	require.Equal(t, map[uint16]int{p: 2}, a.SourcePorts())
	bindable := func() error {
		s, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback, p)))
		if err == nil {
			s.Close()
		}
		return err
	}
	require.ErrorIs(t, bindable(), syscall.EADDRINUSE, "the source port's socket holds the port")

	a.ReleaseSourcePort(p)
	require.Equal(t, map[uint16]int{p: 1}, a.SourcePorts())
	require.ErrorIs(t, bindable(), syscall.EADDRINUSE)
	a.ReleaseSourcePort(p)
	require.Empty(t, a.SourcePorts())
	require.NoError(t, bindable(), "the last release closes the socket")
	a.ReleaseSourcePort(p) // not held: nothing

	require.NoError(t, a.Send([]conn.Packet{{Buf: newPacket(1, 64), Addr: b.LocalAddr(), SrcPort: p}}))
	got := receiveN(t, b, 1, 5*time.Second)
	require.Len(t, got, 1)
	require.Equal(t, a.LocalAddr(), got[0].from)

	// Close closes what is still held.
	require.NoError(t, a.AcquireSourcePort(p))
	require.NoError(t, a.Close())
	require.Empty(t, a.SourcePorts())
	require.NoError(t, bindable())
	require.ErrorIs(t, a.AcquireSourcePort(p), net.ErrClosed)
}

// A port another socket has cannot be held.
func TestUDPSourcePortInUse(t *testing.T) {
	a := listen(t, conn.Config{})
	other := listen(t, conn.Config{})
	err := a.AcquireSourcePort(other.LocalAddr().Port())
	require.ErrorIs(t, err, syscall.EADDRINUSE)
	require.Empty(t, a.SourcePorts())
}

// Sending from source ports allocates nothing, split batches included.
func TestUDPSourcePortSendDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful with -race")
	}
	a := listen(t, conn.Config{})
	b := listen(t, conn.Config{})
	ports := freePorts(t, 2)
	for _, p := range ports {
		require.NoError(t, a.AcquireSourcePort(p))
	}
	one := batchTo(b, conn.IdealBatchSize, 1040)
	mixed := batchTo(b, conn.IdealBatchSize, 1040)
	for i := range one {
		one[i].SrcPort = ports[0]
		mixed[i].SrcPort = []uint16{0, ports[0], ports[1]}[i%3]
	}
	for name, pkts := range map[string][]conn.Packet{"one port": one, "three ports": mixed} {
		f := sendReceiveBatch(t, a, b, pkts)
		f() // warm up
		require.Zero(t, testing.AllocsPerRun(100, f), name)
	}
}

// On the pipe a packet sent from a source port arrives from it, with an
// ICRC computed for it.
func TestPipeSourcePort(t *testing.T) {
	a, b := newPipe(t, 0)
	var _ sourcePorter = a
	require.NoError(t, a.AcquireSourcePort(0xC123))
	require.Equal(t, map[uint16]int{0xC123: 1}, a.SourcePorts())
	require.NoError(t, a.Send([]conn.Packet{
		{Buf: newPacket(1, 64), Addr: b.LocalAddr(), SrcPort: 0xC123},
		{Buf: newPacket(2, 64), Addr: b.LocalAddr(), SrcPort: 0xC124}, // not held
		{Buf: newPacket(3, 64), Addr: b.LocalAddr()},
	}))
	got := receiveN(t, b, 3, 5*time.Second)
	require.Len(t, got, 3)
	require.Equal(t, netip.AddrPortFrom(a.LocalAddr().Addr(), 0xC123), got[0].from)
	require.Equal(t, a.LocalAddr(), got[1].from)
	require.Equal(t, a.LocalAddr(), got[2].from)
	h := wire.IPHeader{Src: a.LocalAddr().Addr(), Dst: b.LocalAddr().Addr(), DF: true}
	require.True(t, wire.VerifyICRCExact(&h, 0xC123, b.LocalAddr().Port(), got[0].buf))
	a.ReleaseSourcePort(0xC123)
	require.Empty(t, a.SourcePorts())
}

// A batch the impairment drops whole leaves nothing to send (emitBatch
// with no packets), from a source port or not.
func TestUDPSendAllDropped(t *testing.T) {
	a := listen(t, conn.Config{Impair: &conn.Impairment{Loss: 1, Dir: conn.DirTx}})
	b := listen(t, conn.Config{})
	p := freePorts(t, 1)[0]
	require.NoError(t, a.AcquireSourcePort(p))
	require.NoError(t, a.Send([]conn.Packet{{Buf: newPacket(1, 64), Addr: b.LocalAddr(), SrcPort: p}}))
	require.NoError(t, a.Send([]conn.Packet{{Buf: newPacket(2, 64), Addr: b.LocalAddr()}}))
	require.Zero(t, a.Stats().SentDatagrams.Load())
	require.Equal(t, uint64(2), a.Stats().TxImpair.Dropped.Load())
}

// Two conns on one IP share a source port (SO_REUSEPORT): two devices on
// 127.0.0.1 whose QPs 0x11 connect to each other both send from rxe's
// 49441. Each one's datagrams still leave from the port and arrive.
func TestUDPSourcePortSharedBetweenConns(t *testing.T) {
	a := listen(t, conn.Config{})
	b := listen(t, conn.Config{})
	p := freePorts(t, 1)[0]
	require.NoError(t, a.AcquireSourcePort(p))
	require.NoError(t, b.AcquireSourcePort(p))
	require.NoError(t, a.Send([]conn.Packet{{Buf: newPacket(1, 64), Addr: b.LocalAddr(), SrcPort: p}}))
	require.NoError(t, b.Send([]conn.Packet{{Buf: newPacket(2, 64), Addr: a.LocalAddr(), SrcPort: p}}))
	for _, c := range []*conn.UDPConn{a, b} {
		got := receiveN(t, c, 1, 5*time.Second)
		require.Len(t, got, 1)
		require.Equal(t, netip.AddrPortFrom(loopback, p), got[0].from)
	}
	require.Zero(t, a.Stats().BadICRC.Load()+b.Stats().BadICRC.Load())
	// A conn cannot listen on a port held as a source port, nor the other
	// way round: only the source ports' sockets share.
	_, err := conn.Listen(conn.Config{Addr: netip.AddrPortFrom(loopback, p)})
	require.ErrorIs(t, err, syscall.EADDRINUSE)
}

// TestUDPReleasedPortRehashesAReadyICRC: a packet given to Send with
// SrcPort held and its ICRC ready for that port waits in a delay
// impairment; the port is released meanwhile, so the packet leaves from
// the conn's own port (Packet.SrcPort), and its ICRC must then be hashed
// again for that port (Packet.ICRCReady: "a packet that would leave from
// another port than SrcPort (no longer held) is hashed again"), or the
// peer drops it as a bad ICRC.
func TestUDPReleasedPortRehashesAReadyICRC(t *testing.T) {
	tap := &exactICRCTap{}
	a := listen(t, conn.Config{Tap: tap})
	b := listen(t, conn.Config{})
	const held = 49443
	if err := a.AcquireSourcePort(held); err != nil {
		t.Skipf("source port %d: %v", held, err)
	}
	require.NoError(t, a.SetImpairment(&conn.Impairment{Delay: 20 * time.Millisecond, Dir: conn.DirTx}))
	buf := newPacket(7, 1000)
	h := wire.IPHeader{Src: a.LocalAddr().Addr(), Dst: b.LocalAddr().Addr(), DF: true}
	wire.PutICRC(&h, held, b.LocalAddr().Port(), buf)
	require.NoError(t, a.Send([]conn.Packet{{Buf: buf, Addr: b.LocalAddr(), SrcPort: held, ICRCReady: true}}))
	a.ReleaseSourcePort(held) // before the delay ends
	got := receiveN(t, b, 1, 5*time.Second)
	require.Zero(t, b.Stats().BadICRC.Load(), "the ICRC was not hashed again for the conn's own port")
	require.Len(t, got, 1)
	require.Equal(t, a.LocalAddr(), got[0].from, "sent from the conn's own port")
	tap.mu.Lock()
	defer tap.mu.Unlock()
	require.Equal(t, 1, tap.n)
	require.Zero(t, tap.bad)
}

// TestPipeReleasedPortLeavesFromOwnPort: the pipe's counterpart of
// TestUDPReleasedPortRehashesAReadyICRC: a packet whose source port is
// released while it waits in a delay impairment arrives from the conn's
// own port (Packet.SrcPort), with an ICRC for that port.
func TestPipeReleasedPortLeavesFromOwnPort(t *testing.T) {
	a, b := newPipe(t, 0)
	const held = 0xC125
	require.NoError(t, a.AcquireSourcePort(held))
	require.NoError(t, a.SetImpairment(&conn.Impairment{Delay: 20 * time.Millisecond, Dir: conn.DirTx}))
	buf := newPacket(7, 64)
	h := wire.IPHeader{Src: a.LocalAddr().Addr(), Dst: b.LocalAddr().Addr(), DF: true}
	wire.PutICRC(&h, held, b.LocalAddr().Port(), buf)
	require.NoError(t, a.Send([]conn.Packet{{Buf: buf, Addr: b.LocalAddr(), SrcPort: held, ICRCReady: true}}))
	a.ReleaseSourcePort(held)
	got := receiveN(t, b, 1, 5*time.Second)
	require.Len(t, got, 1)
	require.Equal(t, a.LocalAddr(), got[0].from)
	require.True(t, wire.VerifyICRCExact(&h, a.LocalAddr().Port(), b.LocalAddr().Port(), got[0].buf))
	require.Zero(t, b.Stats().BadICRC.Load())
}
