//go:build linux

package conn_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// tunNetns is a network namespace with a TUN device at 10.201.0.1/24 and
// fd00:201::1/64. A TUN device without IFF_VNET_HDR has no offloads, so
// the kernel segments UDP GSO super-buffers in software before handing the
// packets to the reader: what the test reads is what would go on the wire
// of a NIC without USO, IP headers included.
type tunNetns struct {
	name string
	tun  *os.File
}

const tunName = "srtun0"

var (
	tunLocal4 = netip.MustParseAddr("10.201.0.1")
	tunPeer4  = netip.MustParseAddr("10.201.0.2")
	tunLocal6 = netip.MustParseAddr("fd00:201::1")
	tunPeer6  = netip.MustParseAddr("fd00:201::2")
)

func newTunNetns(t *testing.T) *tunNetns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces and TUN)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("needs /dev/net/tun")
	}
	n := &tunNetns{name: fmt.Sprintf("srconn%d", os.Getpid())}
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
	if err := exec.Command("ip", "netns", "add", n.name).Run(); err != nil {
		t.Skipf("cannot create a network namespace: %v", err)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", n.name).Run() })
	run("-n", n.name, "link", "set", "lo", "up")
	run("-n", n.name, "tuntap", "add", "dev", tunName, "mode", "tun")
	run("-n", n.name, "addr", "add", "10.201.0.1/24", "dev", tunName)
	run("-n", n.name, "addr", "add", "fd00:201::1/64", "dev", tunName, "nodad")
	// Attach before bringing the link up: with the carrier already on,
	// the device's qdisc is activated at once, not later by linkwatch
	// (until then packets are dropped).
	var terr error
	n.in(t, func() { n.tun, terr = openTun(tunName) })
	require.NoError(t, terr)
	run("-n", n.name, "link", "set", tunName, "up")
	t.Cleanup(func() { n.tun.Close() })
	return n
}

// openTun attaches to the TUN device name. It attaches first and then
// makes the fd non-blocking and pollable (as wireguard-go's tun does), so
// that reads can have deadlines.
func openTun(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err == nil {
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun"), nil
}

// in runs f (which must not call t.FailNow) on an OS thread that has entered the namespace; sockets
// created by f belong to it. The thread goes back to its own namespace
// afterwards (or, if it cannot, exits with the goroutine): a thread left in
// the test's namespace could be the main thread, whose namespace is the
// one /proc/net shows for the whole process.
func (n *tunNetns) in(t *testing.T, f func()) {
	t.Helper()
	var wg sync.WaitGroup
	var err error
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		orig, oerr := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if oerr != nil {
			err = oerr
			runtime.UnlockOSThread()
			return
		}
		defer unix.Close(orig)
		var fd int
		if fd, err = unix.Open("/var/run/netns/"+n.name, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			runtime.UnlockOSThread()
			return
		}
		defer unix.Close(fd)
		if err = unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			return
		}
		f()
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and exits with the goroutine
	}()
	wg.Wait()
	require.NoError(t, err)
}

// listen opens a conn inside the namespace.
func (n *tunNetns) listen(t *testing.T, cfg conn.Config) *conn.UDPConn {
	var c *conn.UDPConn
	var err error
	n.in(t, func() { c, err = conn.Listen(cfg) })
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// capturedPacket is an IP/UDP packet read from the TUN device.
type capturedPacket struct {
	src, dst netip.AddrPort
	id       uint16
	df       bool
	roce     []byte
}

// read reads n packets from the TUN device.
func (n *tunNetns) read(t *testing.T, count int) []capturedPacket {
	t.Helper()
	var out []capturedPacket
	buf := make([]byte, 65536)
	require.NoError(t, n.tun.SetReadDeadline(time.Now().Add(5*time.Second)))
	for len(out) < count {
		k, err := n.tun.Read(buf)
		if err != nil {
			diag, _ := exec.Command("ip", "-n", n.name, "-s", "-d", "link", "show", tunName).CombinedOutput()
			addrs, _ := exec.Command("ip", "-n", n.name, "addr").CombinedOutput()
			routes, _ := exec.Command("ip", "-n", n.name, "-6", "route").CombinedOutput()
			t.Logf("%s\n%s\n%s", diag, addrs, routes)
		}
		require.NoError(t, err, "read %d of %d packets", len(out), count)
		p := buf[:k]
		var c capturedPacket
		var udp []byte
		switch p[0] >> 4 {
		case 4:
			ihl := int(p[0]&0x0f) * 4
			if p[9] != unix.IPPROTO_UDP {
				continue
			}
			c.id = binary.BigEndian.Uint16(p[4:])
			c.df = p[6]&0x40 != 0
			require.Zero(t, binary.BigEndian.Uint16(p[6:])&0x3fff, "not a fragment")
			udp = p[ihl:binary.BigEndian.Uint16(p[2:])]
			c.src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[12:16])), binary.BigEndian.Uint16(udp[0:]))
			c.dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[16:20])), binary.BigEndian.Uint16(udp[2:]))
		case 6:
			if p[6] != unix.IPPROTO_UDP { // ignore router solicitations and such
				continue
			}
			udp = p[40 : 40+binary.BigEndian.Uint16(p[4:])]
			c.src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(p[8:24])), binary.BigEndian.Uint16(udp[0:]))
			c.dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(p[24:40])), binary.BigEndian.Uint16(udp[2:]))
		default:
			continue
		}
		c.roce = append([]byte(nil), udp[8:binary.BigEndian.Uint16(udp[4:])]...)
		out = append(out, c)
	}
	return out
}

// TestGSOIPv4IDOnTheWire sends batches that the conn coalesces into UDP
// GSO super-buffers, reads what the kernel puts on the wire, and checks
// that segment i of each super-buffer carries IPv4 ID i, with DF, and that
// every ICRC verifies exactly with the ID on the wire.
func TestGSOIPv4IDOnTheWire(t *testing.T) {
	n := newTunNetns(t)
	for _, gso := range []bool{true, false} {
		t.Run(fmt.Sprintf("gso=%v", gso), func(t *testing.T) {
			c := n.listen(t, conn.Config{Addr: conn.DefaultAddr(tunLocal4), DisableGSO: !gso})
			if g, _ := c.Offload(); g != gso {
				t.Skip("no UDP GSO in this kernel")
			}
			peer := conn.DefaultAddr(tunPeer4)
			other := netip.AddrPortFrom(tunPeer4, 5000)
			// Batches and the IDs expected on the wire, with GSO: a run
			// of equal sizes with a shorter tail is one super-buffer; a
			// longer packet, another destination, or a second tail start
			// a new one.
			type pkt struct {
				size int
				dst  netip.AddrPort
			}
			var batch []pkt
			var wantIDs []uint16
			add := func(size, count int, dst netip.AddrPort, firstID uint16) {
				for i := range count {
					batch = append(batch, pkt{size, dst})
					id := firstID + uint16(i)
					if !gso {
						id = 0
					}
					wantIDs = append(wantIDs, id)
				}
			}
			add(1016, 5, peer, 0)  // one super-buffer: IDs 0-4 ...
			add(500, 1, peer, 5)   // ... and its shorter tail: 5
			add(1216, 20, peer, 0) // 20 more
			add(1216, 3, other, 0) // another destination
			add(1400, 1, peer, 0)  // longer than the run before it: a new one,
			add(64, 1, peer, 1)    // whose shorter tail this is
			add(1016, 64, peer, 0) // a full super-buffer of 64 segments
			add(1016, 2, peer, 0)  // and the rest
			pkts := make([]conn.Packet, len(batch))
			for i, p := range batch {
				pkts[i] = conn.Packet{Buf: newPacket(uint32(i), p.size), Addr: p.dst}
			}
			require.NoError(t, c.Send(pkts))
			got := n.read(t, len(pkts))
			ids := make([]uint16, len(got))
			for i, g := range got {
				ids[i] = g.id
				require.True(t, g.df, "packet %d: DF", i)
				require.Equal(t, c.LocalAddr(), g.src)
				require.Equal(t, batch[i].dst, g.dst)
				require.Equal(t, pkts[i].Buf, g.roce, "packet %d", i)
				h := wire.IPHeader{Src: g.src.Addr(), Dst: g.dst.Addr(), ID: g.id, DF: true}
				require.Equal(t, wire.PacketICRC(g.roce), wire.ComputeICRC(&h, g.src.Port(), g.dst.Port(), g.roce[:len(g.roce)-4]),
					"packet %d: ICRC with the IPv4 ID on the wire (%d)", i, g.id)
			}
			require.Equal(t, wantIDs, ids)
			if gso {
				require.Equal(t, uint64(6), c.Stats().GSOBatches.Load())
			}
			t.Logf("IPv4 IDs on the wire: %v", ids)
		})
	}
}

func TestGSOIPv6OnTheWire(t *testing.T) {
	n := newTunNetns(t)
	c := n.listen(t, conn.Config{Addr: conn.DefaultAddr(tunLocal6)})
	pkts := make([]conn.Packet, 12)
	for i := range pkts {
		pkts[i] = conn.Packet{Buf: newPacket(uint32(i), 1200), Addr: conn.DefaultAddr(tunPeer6)}
	}
	pkts[11].Buf = newPacket(11, 300)
	require.NoError(t, c.Send(pkts))
	for i, g := range n.read(t, len(pkts)) {
		require.Equal(t, pkts[i].Buf, g.roce)
		h := wire.IPHeader{Src: g.src.Addr(), Dst: g.dst.Addr()}
		require.Equal(t, wire.PacketICRC(g.roce), wire.ComputeICRC(&h, g.src.Port(), g.dst.Port(), g.roce[:len(g.roce)-4]))
	}
	if gso, _ := c.Offload(); gso {
		require.Equal(t, uint64(1), c.Stats().GSOBatches.Load())
	}
}

// TestReceiveFromPeerWithIPv4IDs injects datagrams with the IPv4 IDs a
// peer like Linux rxe uses (from a per-destination generator, not 0) into
// the TUN device and checks that the conn accepts those whose ICRC covers
// the ID they carry, tells the tap that ID, and drops a corrupted one.
func TestReceiveFromPeerWithIPv4IDs(t *testing.T) {
	probe := newPacket(0, 64)
	ph := wire.IPHeader{Src: tunPeer4, Dst: tunLocal4, ID: 0x1234, DF: true}
	wire.PutICRC(&ph, 1, 2, probe)
	ph.ID = 0
	if ok, _ := wire.VerifyICRC(&ph, 1, 2, probe); !ok {
		t.Skip("wire.VerifyICRC does not recover IPv4 IDs")
	}
	n := newTunNetns(t)
	tap := &recordingTap{}
	c := n.listen(t, conn.Config{Addr: conn.DefaultAddr(tunLocal4), Tap: tap})
	from := netip.AddrPortFrom(tunPeer4, 49441)
	ids := []uint16{0x1234, 0x1235, 0x1237, 0, 0xffff}
	for i, id := range ids {
		roce := newPacket(uint32(i), 200)
		wire.PutICRC(&wire.IPHeader{Src: from.Addr(), Dst: tunLocal4, ID: id, DF: true}, from.Port(), 4791, roce)
		_, err := n.tun.Write(ipv4UDP(from, c.LocalAddr(), id, roce))
		require.NoError(t, err)
	}
	bad := newPacket(99, 200)
	wire.PutICRC(&wire.IPHeader{Src: from.Addr(), Dst: tunLocal4, ID: 7, DF: true}, from.Port(), 4791, bad)
	bad[50] ^= 1
	_, err := n.tun.Write(ipv4UDP(from, c.LocalAddr(), 7, bad))
	require.NoError(t, err)

	got := receiveN(t, c, len(ids), 5*time.Second)
	require.Len(t, got, len(ids))
	for i, g := range got {
		require.Equal(t, uint32(i), seqOf(g.buf))
		require.Equal(t, from, g.from)
	}
	require.Eventually(t, func() bool { return c.Stats().BadICRC.Load() == 1 }, 5*time.Second, time.Millisecond)
	tap.mu.Lock()
	defer tap.mu.Unlock()
	require.Equal(t, ids, tap.ids[:len(ids)])
}

type recordingTap struct {
	mu  sync.Mutex
	ids []uint16
}

func (r *recordingTap) Packet(dir conn.Direction, src, dst netip.AddrPort, id uint16, roce []byte) {
	r.mu.Lock()
	r.ids = append(r.ids, id)
	r.mu.Unlock()
}

// ipv4UDP builds an IPv4/UDP packet (DF, TTL 64, UDP checksum 0, as rxe
// sends them).
func ipv4UDP(src, dst netip.AddrPort, id uint16, payload []byte) []byte {
	p := make([]byte, 28+len(payload))
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	binary.BigEndian.PutUint16(p[4:], id)
	p[6] = 0x40
	p[8] = 64
	p[9] = unix.IPPROTO_UDP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(p[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(p[10:], ^uint16(sum))
	binary.BigEndian.PutUint16(p[20:], src.Port())
	binary.BigEndian.PutUint16(p[22:], dst.Port())
	binary.BigEndian.PutUint16(p[24:], uint16(8+len(payload)))
	copy(p[28:], payload)
	return p
}

// TestSendSkipsRefusedDatagrams sends a datagram larger than the TUN
// device's MTU (1500) in the middle of a batch: with DF the kernel refuses
// it (EMSGSIZE), Send counts it, sends the rest and returns a *SendError
// that says one was refused.
func TestSendSkipsRefusedDatagrams(t *testing.T) {
	n := newTunNetns(t)
	c := n.listen(t, conn.Config{Addr: conn.DefaultAddr(tunLocal4), DisableGSO: true})
	peer := conn.DefaultAddr(tunPeer4)
	pkts := []conn.Packet{
		{Buf: newPacket(0, 1000), Addr: peer},
		{Buf: newPacket(1, 3000), Addr: peer},
		{Buf: newPacket(2, 1000), Addr: peer},
	}
	err := c.Send(pkts)
	require.ErrorIs(t, err, unix.EMSGSIZE)
	var se *conn.SendError
	require.ErrorAs(t, err, &se)
	require.Equal(t, 1, se.Failed, "one datagram refused, two sent")
	require.Equal(t, uint64(1), c.Stats().SendErrors.Load())
	require.Equal(t, uint64(2), c.Stats().SentDatagrams.Load())
	got := n.read(t, 2)
	require.Equal(t, pkts[0].Buf, got[0].roce)
	require.Equal(t, pkts[2].Buf, got[1].roce)
}

// TestGSORunWithOversizedSegments: a GSO run whose segment size exceeds
// the path MTU is refused by the kernel as a whole (EMSGSIZE here; EINVAL
// where udp_send_skb finds gso_size + headers > fragsize), its short last
// packet included, which alone would fit. The conn sends such a run's packets
// one by one instead, so that each gets its own verdict, as without
// GSO (TestSendSkipsRefusedDatagrams): the two 3000-byte packets are
// refused (EMSGSIZE, the TUN device's MTU is 1500) and counted, the
// 1000-byte one leaves, with an ICRC for the IPv4 ID it leaves with.
func TestGSORunWithOversizedSegments(t *testing.T) {
	n := newTunNetns(t)
	c := n.listen(t, conn.Config{Addr: conn.DefaultAddr(tunLocal4)})
	if gso, _ := c.Offload(); !gso {
		t.Skip("no UDP GSO")
	}
	peer := conn.DefaultAddr(tunPeer4)
	pkts := []conn.Packet{
		{Buf: newPacket(0, 3000), Addr: peer},
		{Buf: newPacket(1, 3000), Addr: peer},
		{Buf: newPacket(2, 1000), Addr: peer},
	}
	err := c.Send(pkts)
	require.ErrorIs(t, err, unix.EMSGSIZE)
	var se *conn.SendError
	require.ErrorAs(t, err, &se)
	require.Equal(t, 2, se.Failed, "two datagrams refused, one sent")
	require.Equal(t, uint64(2), c.Stats().SendErrors.Load())
	require.Equal(t, uint64(1), c.Stats().SentDatagrams.Load())
	got := n.read(t, 1)
	require.Equal(t, pkts[2].Buf, got[0].roce)
	h := wire.IPHeader{Src: tunLocal4, Dst: tunPeer4, ID: got[0].id, DF: got[0].df}
	require.True(t, wire.VerifyICRCExact(&h, got[0].src.Port(), got[0].dst.Port(), got[0].roce))
	gso, _ := c.Offload()
	require.True(t, gso, "GSO stays on: the kernel has it")
}
