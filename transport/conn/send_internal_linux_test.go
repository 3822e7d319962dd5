//go:build linux

package conn

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/transport/wire"
)

// TestGSOEIOKeepsAnEarlierRefusal: in one sendmmsg batch the kernel
// refuses a plain datagram (EMSGSIZE, counted) and then fails a GSO
// super-buffer with EIO (GSO turned off, the run sent again without it).
// The refusal must still reach the caller as a SendError (Conn.Send: the
// first refusal is returned, Failed counts the datagrams refused): the
// device counts SentPkts and SendErr from it. The syscall results are
// injected through sendFn; the datagrams that do leave go through the
// real sendmmsg to a loopback peer.
func TestGSOEIOKeepsAnEarlierRefusal(t *testing.T) {
	c, peer := gsoSender(t, nil)
	calls := 0
	real := c.sendFn
	c.sendFn = func(fd uintptr) bool {
		calls++
		switch calls {
		case 1: // the first message, a plain datagram: refused
			require.Equal(t, 0, c.sOff)
			c.sN, c.sErr = 0, unix.EMSGSIZE
			return true
		case 2: // the second, a GSO super-buffer: the device cannot do it
			require.Equal(t, 1, c.sOff)
			require.Equal(t, 3, c.sruns[1].count)
			c.sN, c.sErr = 0, unix.EIO
			return true
		}
		return real(fd)
	}
	pkt := func(psn uint32, n int) []byte {
		b := make([]byte, n)
		wire.BTH(b).Encode(&wire.BTHFields{Opcode: wire.OpRDMAWriteMiddle, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: wire.PSN(psn)})
		return b
	}
	to := peer.LocalAddr()
	err := c.Send([]Packet{{Buf: pkt(0, 100), Addr: to}, {Buf: pkt(1, 200), Addr: to}, {Buf: pkt(2, 200), Addr: to}, {Buf: pkt(3, 100), Addr: to}})
	var se *SendError
	require.ErrorAs(t, err, &se, "the EMSGSIZE refusal is reported")
	require.Equal(t, 1, se.Failed)
	require.ErrorIs(t, err, unix.EMSGSIZE)
	require.Equal(t, uint64(1), c.Stats().SendErrors.Load())
	require.Equal(t, uint64(3), c.Stats().SentDatagrams.Load())
	gso, _ := c.Offload()
	require.False(t, gso, "GSO turned off after EIO")
	got := make([]Packet, 8)
	seen := 0
	for seen < 3 {
		n, err := peer.Receive(got)
		require.NoError(t, err)
		for _, p := range got[:n] {
			require.Equal(t, wire.PSN(seen+1), wire.BTH(p.Buf).PSN())
			seen++
		}
	}
}

// gsoSender returns a loopback conn with UDP GSO and tap (skipping the
// test without GSO), and a peer without GRO to send to, both closed at
// the end of the test.
func gsoSender(t *testing.T, tap Tap) (c, peer *UDPConn) {
	t.Helper()
	lo := netip.MustParseAddr("127.0.0.1")
	c, err := Listen(Config{Addr: netip.AddrPortFrom(lo, 0), Tap: tap})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	if gso, _ := c.Offload(); !gso {
		t.Skip("no UDP GSO")
	}
	peer, err = Listen(Config{Addr: netip.AddrPortFrom(lo, 0), DisableGRO: true})
	require.NoError(t, err)
	t.Cleanup(func() { peer.Close() })
	return c, peer
}

// countTap counts the datagrams a Tap saw sent, by PSN.
type countTap struct{ sent map[wire.PSN]int }

func (t *countTap) Packet(dir Direction, _, _ netip.AddrPort, _ uint16, roce []byte) {
	if dir == DirTx {
		t.sent[wire.BTH(roce).PSN()]++
	}
}

// TestRefusedGSORunIsTappedOnce: a GSO super-buffer that the kernel fails
// as a whole (EIO: GSO turned off; EMSGSIZE: its packets go again one per
// message) is sent again, with new IPv4 IDs and ICRCs; the tap (a pcap)
// records each datagram once, as it was first handed to the kernel. It
// used to record the run's packets twice.
func TestRefusedGSORunIsTappedOnce(t *testing.T) {
	for _, errno := range []unix.Errno{unix.EIO, unix.EMSGSIZE} {
		t.Run(errno.Error(), func(t *testing.T) {
			tap := &countTap{sent: map[wire.PSN]int{}}
			c, peer := gsoSender(t, tap)
			calls := 0
			real := c.sendFn
			c.sendFn = func(fd uintptr) bool {
				calls++
				if calls == 1 { // the super-buffer of all three
					require.Equal(t, 3, c.sruns[0].count)
					c.sN, c.sErr = 0, errno
					return true
				}
				return real(fd)
			}
			var pkts []Packet
			for psn := range 3 {
				b := make([]byte, 200-50*(psn/2)) // two of 200 bytes, a shorter last
				wire.BTH(b).Encode(&wire.BTHFields{Opcode: wire.OpRDMAWriteMiddle, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: wire.PSN(psn)})
				pkts = append(pkts, Packet{Buf: b, Addr: peer.LocalAddr()})
			}
			require.NoError(t, c.Send(pkts))
			require.Greater(t, calls, 1, "the run was sent again")
			require.Equal(t, map[wire.PSN]int{0: 1, 1: 1, 2: 1}, tap.sent)
		})
	}
}
