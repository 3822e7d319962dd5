package conn_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// TestDatagramOrdersSenderBeforeReceiver: what a goroutine wrote before it
// sent a datagram happens before what the goroutine that received the
// datagram does next (the kernel copies it in sendmmsg and out in
// recvmmsg), and the race detector must know it: two devices of one
// process talk over loopback UDP, and an RDMA WRITE's bytes, placed by the
// responder's receive loop before it sends the ACK, are read by the
// requester's application after the ACK's completion. Without the conn's
// annotations the detector reported that read as a race (it showed when
// softrdmatest.Options.NoPcap took away the pcap writer, whose lock every
// datagram passes and which ordered them by accident). Under -race this
// test fails with "race detected during execution of test" without them.
func TestDatagramOrdersSenderBeforeReceiver(t *testing.T) {
	for _, gro := range []bool{false, true} {
		a, err := conn.Listen(conn.Config{Addr: netip.MustParseAddrPort("127.0.0.1:0")})
		require.NoError(t, err)
		defer a.Close()
		b, err := conn.Listen(conn.Config{Addr: netip.MustParseAddrPort("127.0.0.1:0"), DisableGRO: !gro})
		require.NoError(t, err)
		defer b.Close()

		shared := make([]byte, 64) // plain memory, no lock
		go func() {
			for i := range shared {
				shared[i] = byte(i + 1)
			}
			// An RC WRITE MIDDLE with a 4-byte payload; Send adds the ICRC.
			p := make([]byte, wire.BTHSize+4+wire.ICRCSize)
			wire.BTH(p).Encode(&wire.BTHFields{Opcode: wire.OpRDMAWriteMiddle, PKey: wire.DefaultPKey, DestQP: 0x11})
			if err := a.Send([]conn.Packet{{Buf: p, Addr: b.LocalAddr()}}); err != nil {
				t.Error(err)
			}
		}()
		pkts := make([]conn.Packet, 4)
		n := 0
		for n == 0 {
			n, err = b.Receive(pkts)
			require.NoError(t, err)
		}
		require.Equal(t, a.LocalAddr(), pkts[0].Addr)
		for i, v := range shared {
			require.Equal(t, byte(i+1), v)
		}
	}
}
