package conn

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

// TestWakeDeadlineAfterItsFlagWasConsumed: Wake stores its flag and then
// moves the read deadline; a busy Receive may consume the flag in between
// and return, and the deadline that Wake sets afterwards is then left in
// the past with no flag to explain it. Every later recvmmsg failed on it
// at once, Receive looped without ever reading, and the device received
// nothing until the next Wake (after a scope run's last Resume: never).
// The hook runs the interleaving exactly: the flag is consumed before the
// deadline moves; the next datagram must still be received.
func TestWakeDeadlineAfterItsFlagWasConsumed(t *testing.T) {
	u, err := Listen(Config{Addr: netip.MustParseAddrPort("127.0.0.1:0")})
	require.NoError(t, err)
	defer u.Close()
	peer, err := Listen(Config{Addr: netip.MustParseAddrPort("127.0.0.1:0")})
	require.NoError(t, err)
	defer peer.Close()
	send := func() {
		// An RC WRITE MIDDLE with a 4-byte payload; Send adds the ICRC.
		b := make([]byte, wire.BTHSize+4+wire.ICRCSize)
		wire.BTH(b).Encode(&wire.BTHFields{Opcode: wire.OpRDMAWriteMiddle, PKey: wire.DefaultPKey, DestQP: 0x11})
		require.NoError(t, peer.Send([]Packet{{Buf: b, Addr: u.LocalAddr()}}))
	}

	returns := make(chan int, 16)
	go func() {
		pkts := make([]Packet, 4)
		for {
			n, err := u.Receive(pkts)
			if err != nil {
				close(returns)
				return
			}
			returns <- n
		}
	}()
	next := func(what string) int {
		select {
		case n, ok := <-returns:
			require.True(t, ok, "Receive failed while waiting for %s", what)
			return n
		case <-time.After(10 * time.Second): // a hang detector, not a measurement
			t.Fatalf("Receive did not return %s within 10 s: it is not reading", what)
			return 0
		}
	}

	defer func() { wakeHook = nil }()
	// Not every round meets the stale deadline without the fix (about one
	// in two did): eight rounds.
	for range 8 {
		wakeHook = func() {
			// Between Wake's two steps: a datagram makes the blocked
			// Receive return, and the next Receive finds the flag and
			// consumes it. (The Receive may also find the flag before
			// the datagram.)
			send()
			got := []int{next("the first datagram or the wake-up"), next("the wake-up or the first datagram")}
			require.ElementsMatch(t, []int{0, 1}, got)
		}
		u.Wake()
		wakeHook = nil

		send()
		require.Equal(t, 1, next("the datagram sent after the wake-up"))
	}
}
