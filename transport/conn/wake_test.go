package conn_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
)

// TestWake: Wake makes a blocked Receive return no packet and no error,
// once; the next Receive blocks again and still gets what is sent.
func TestWake(t *testing.T) {
	a, b := conn.NewPipe()
	u, err := conn.Listen(conn.Config{Addr: netip.MustParseAddrPort("127.0.0.1:0")})
	require.NoError(t, err)
	defer u.Close()
	defer a.Close()
	defer b.Close()
	for name, c := range map[string]conn.Conn{"pipe": b, "udp": u} {
		t.Run(name, func(t *testing.T) {
			pkts := make([]conn.Packet, 4)
			got := make(chan int)
			go func() {
				n, err := c.Receive(pkts)
				require.NoError(t, err)
				got <- n
			}()
			// Wake after the Receive has (most likely) blocked; a Wake
			// that comes first is kept for it.
			time.Sleep(10 * time.Millisecond)
			c.Wake()
			require.Equal(t, 0, <-got)
			// Consumed: the next Receive blocks until a packet comes.
			go func() {
				n, _ := c.Receive(pkts)
				got <- n
			}()
			select {
			case n := <-got:
				t.Fatalf("Receive returned %d without a packet or a Wake", n)
			case <-time.After(50 * time.Millisecond):
			}
			c.Wake()
			require.Equal(t, 0, <-got)
		})
	}
}
