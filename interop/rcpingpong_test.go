package interop

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pingpongCase is one ibv_rc_pingpong run against softrdma rc-pingpong.
type pingpongCase struct {
	name     string
	vmServer bool   // the VM's tool is the server, softrdma the client
	args     string // rc_pingpong flags both sides get (-g 1 is added)
	iters    int
	host     string // softrdma's extra flags
}

// The runs: each side as the server; multi-packet SENDs (SEND_FIRST,
// MIDDLE, LAST) and SEND_ONLY; a size that is not a multiple of the MTU
// with a smaller path MTU; polling and -e. -c makes ibv_rc_pingpong check
// the data in newer rdma-core; softrdma's --verify checks every message.
var pingpongCases = []pingpongCase{
	{name: "rc_pingpong-vm_server", vmServer: true, args: "-s 4096 -c", iters: 50},
	{name: "rc_pingpong-vm_client", vmServer: false, args: "-s 4096 -c", iters: 50},
	{name: "rc_pingpong_small-vm_server", vmServer: true, args: "-s 64", iters: 20, host: "-e"},
	{name: "rc_pingpong_mtu512-vm_client", vmServer: false, args: "-s 10000 -m 512 -c", iters: 20, host: "-e"},
}

func (c pingpongCase) step() step {
	flags := fmt.Sprintf("-g 1 -n %d %s", c.iters, c.args)
	s := step{name: c.name}
	host := append([]string{"rc-pingpong"}, strings.Fields(flags)...)
	host = append(host, "--verify", "--stat")
	host = append(host, strings.Fields(c.host)...)
	if c.vmServer {
		s.vm = "ibv_rc_pingpong -d rxe0 " + flags
		s.host = append(host, "--connect-timeout", stepTimeout.String(), vmIP)
	} else {
		s.vm = "rxetb-retry ibv_rc_pingpong -d rxe0 " + flags + " " + hostIP
		s.host = host
	}
	return s
}

// check checks one rc_pingpong run: both tools succeeded and printed
// their results, softrdma verified every message, and the counters (see
// checkCounters) account for every packet. rxe's rdma_sends and rdma_recvs
// count SENDs sent and receives consumed: one per iteration each.
func (c pingpongCase) check(t *testing.T, r *stepResult) {
	require.NoError(t, r.hostErr, "softrdma rc-pingpong failed")
	require.Zero(t, r.vmRC, "ibv_rc_pingpong failed in the VM")
	assert.Contains(t, r.vmOut, fmt.Sprintf("%d iters in", c.iters))
	assert.NotContains(t, r.vmOut, "invalid data")
	assert.Contains(t, r.hostOut, fmt.Sprintf("verified %d messages", c.iters))
	checkCounters(t, r, false)
	assert.Equal(t, uint64(c.iters), r.hwc["rdma_sends"], "rxe rdma_sends")
	assert.Equal(t, uint64(c.iters), r.hwc["rdma_recvs"], "rxe rdma_recvs")
}
