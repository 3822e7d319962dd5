//go:build linux

package conn_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
)

// TestListenRefusesBroadcast: a device needs its own unicast IP (it is
// the GID, and the ICRC covers it), so Listen refuses the limited
// broadcast address and the directed broadcast address of a subnet of
// the host's (lo's 127.0.0.1/8: 127.255.255.255), as it refuses
// 0.0.0.0 and multicast. Bound there, a device sent packets to which no
// answer ever came back, and an RC run only ended at --idle-timeout.
func TestListenRefusesBroadcast(t *testing.T) {
	for _, a := range []string{"255.255.255.255:0", "127.255.255.255:0"} {
		c, err := conn.Listen(conn.Config{Addr: netip.MustParseAddrPort(a)})
		if c != nil {
			c.Close()
		}
		require.Error(t, err, a)
		assert.Contains(t, err.Error(), "need a specific local IP address, not a broadcast one", a)
	}
	// A unicast address of the same subnet is taken.
	c, err := conn.Listen(conn.Config{Addr: netip.MustParseAddrPort("127.0.0.1:0")})
	require.NoError(t, err)
	c.Close()
}
