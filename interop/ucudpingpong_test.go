package interop

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unreliableCase is one run of ibv_uc_pingpong or ibv_ud_pingpong on rxe
// against softrdma uc-pingpong or ud-pingpong. It has the interopCase
// methods (step, check), so the suite may take these runs too.
type unreliableCase struct {
	name     string
	tool     string // "uc" or "ud"
	vmServer bool   // the VM's tool is the server, softrdma the client
	size     int
	iters    int
}

// The runs: each tool, each side as the server. UC at rxe's path MTU 1024
// and 4096-byte messages: UC SEND_FIRST, MIDDLE, MIDDLE, LAST
// (captures/uc_pingpong); UD with ud_pingpong's size 512 and with a full
// 1024-byte datagram (rxe's active MTU on the bridge).
var unreliableCases = []unreliableCase{
	{name: "uc_pingpong-vm_server", tool: "uc", vmServer: true, size: 4096, iters: 50},
	{name: "uc_pingpong-vm_client", tool: "uc", vmServer: false, size: 4096, iters: 50},
	{name: "ud_pingpong-vm_server", tool: "ud", vmServer: true, size: 512, iters: 50},
	{name: "ud_pingpong-vm_client", tool: "ud", vmServer: false, size: 1024, iters: 50},
}

// packetsPerMessage is the packets one message takes at rxe's MTU (1024).
func (c unreliableCase) packetsPerMessage() uint64 { return uint64(max(1, (c.size+1023)/1024)) }

func (c unreliableCase) step() step {
	flags := fmt.Sprintf("-g 1 -n %d -s %d", c.iters, c.size)
	s := step{name: c.name}
	host := append([]string{c.tool + "-pingpong"}, strings.Fields(flags)...)
	host = append(host, "--verify", "--stat")
	vmTool := "ibv_" + c.tool + "_pingpong -d rxe0 " + flags
	if c.vmServer {
		s.vm = vmTool
		s.host = append(host, "--connect-timeout", stepTimeout.String(), vmIP)
	} else {
		s.vm = "rxetb-retry " + vmTool + " " + hostIP
		s.host = host
	}
	return s
}

// check checks one run: both tools succeeded, softrdma verified every
// message, every packet each side sent was accepted by the other (rxe
// drops a bad ICRC, a wrong Q_Key or a bad header silently: its rcvd_pkts
// would fall short), the packet counts are the pingpong's (iters messages
// each way, of packetsPerMessage packets; no ACK on either side), and no
// drop or error counter moved.
func (c unreliableCase) check(t *testing.T, r *stepResult) {
	require.NoError(t, r.hostErr, "softrdma %s-pingpong failed", c.tool)
	require.Zero(t, r.vmRC, "ibv_%s_pingpong failed in the VM", c.tool)
	assert.Contains(t, r.vmOut, fmt.Sprintf("%d iters in", c.iters))
	assert.Contains(t, r.hostOut, fmt.Sprintf("verified %d messages", c.iters))
	hs, hw := r.hostStat, r.hwc
	want := uint64(c.iters) * c.packetsPerMessage()
	assert.Equal(t, want, hs["sent_pkts"], "softrdma sent iters messages and nothing else (no ACK)")
	assert.Equal(t, want, hw["sent_pkts"], "rxe sent iters messages and nothing else (no ACK)")
	assert.Equal(t, hs["sent_pkts"], hw["rcvd_pkts"], "rxe accepted every packet softrdma sent")
	assert.Equal(t, hw["sent_pkts"], hs["rcvd_pkts"], "softrdma accepted every packet rxe sent")
	assert.Equal(t, uint64(c.iters), hw["rdma_recvs"], "rxe completed a receive per message")
	for name, v := range hs {
		if strings.HasPrefix(name, "drop_") || strings.HasPrefix(name, "impair_") {
			assert.Zero(t, v, "softrdma counter %s", name)
		}
	}
	for _, name := range []string{"naks_sent", "retransmits", "send_err", "rcvd_seq_err", "out_of_seq_request"} {
		assert.Zero(t, hs[name], "softrdma counter %s", name)
	}
	for _, name := range []string{"rcvd_seq_err", "out_of_seq_request", "duplicate_request", "completer_retry_err",
		"retry_exceeded_err", "rcvd_rnr_err", "send_rnr_err", "send_err", "link_downed"} {
		assert.Zero(t, hw[name], "rxe hw_counter %s", name)
	}
}
