package interop

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rpingCase is one run of librdmacm's rping on rxe against softrdma rping:
// the connection is made by the two CMs (REQ, REP, RTU on QP1), then each
// iteration is two SENDs each way, an RDMA READ and an RDMA WRITE, and the
// client's DREQ ends it.
type rpingCase struct {
	name     string
	vmServer bool // the VM's rping is the server, softrdma the client
	count    int
	size     int
}

var rpingCases = []rpingCase{
	{name: "rping-vm_server", vmServer: true, count: 10, size: 64},
	{name: "rping-vm_client", vmServer: false, count: 10, size: 1000},
}

func (c rpingCase) step() step {
	s := step{name: c.name}
	common := fmt.Sprintf("-C %d -S %d -v", c.count, c.size)
	if c.vmServer {
		s.vm = "rping -s -a 0.0.0.0 " + common
		s.host = append([]string{"rping", "-c", "-a", vmIP, "-V", "--stat", "--connect-timeout", stepTimeout.String()},
			strings.Fields(common)...)
	} else {
		// softrdma's server must be up before rping's first REQ: one
		// that finds no device is lost and sent again only 4.3 s later,
		// and counted by rxe but not by softrdma (the check adds them up).
		s.vm = `sh -c "sleep 2; exec rxetb-retry rping -c -a ` + hostIP + " -V " + common + `"`
		s.host = append([]string{"rping", "-s", "-a", hostIP, "--stat"}, strings.Fields(common)...)
	}
	return s
}

// check checks one rping run: both sides succeeded; the server printed
// each iteration's ping data and the client (validating with -V) the same
// data after the echo; the packets and errors add up (checkCounters); and
// rxe counted the SENDs and receives of the ping-pong (2 SENDs per
// iteration each way; the CM's MADs are UD SENDs and receives too: REQ,
// REP, RTU, DREQ, DREP).
func (c rpingCase) check(t *testing.T, r *stepResult) {
	require.NoError(t, r.hostErr, "softrdma rping failed")
	require.Zero(t, r.vmRC, "rping failed in the VM")
	// rping prints "... DISCONNECT EVENT..." on stderr, which the console
	// may interleave with stdout mid-line.
	clean := strings.NewReplacer("client DISCONNECT EVENT...\n", "", "server DISCONNECT EVENT...\n", "")
	server, client := clean.Replace(r.vmOut), clean.Replace(r.hostOut)
	if !c.vmServer {
		server, client = client, server
	}
	for i := range c.count {
		// rping_test_client's data: "rdma-ping-N: ", then letters from
		// 'A'+N cycling through 'A'..'z', NUL at size-1.
		data := []byte(fmt.Sprintf("rdma-ping-%d: ", i))
		for ch := byte(65 + i%58); len(data) < c.size-1; ch++ {
			if ch > 122 {
				ch = 65
			}
			data = append(data, ch)
		}
		assert.Contains(t, server, "server ping data: "+string(data)+"\n", "iteration %d on the server", i)
		assert.Contains(t, client, "ping data: "+string(data)+"\n", "iteration %d on the client", i)
	}
	assert.NotContains(t, r.vmOut+r.hostOut, "data mismatch")
	checkCounters(t, r, false)
	// rxe counts in rdma_sends and rdma_recvs the SENDs of both QPs: 2
	// per iteration each way on the RC QP, and every MAD on QP1, which
	// softrdma's CM counts by message (--stat): REQs (more than one when
	// the server was not listening yet and answered REJ), REP, RTU,
	// DREQ, DREP.
	h := r.hostStat
	mads := func(dir string) uint64 {
		var n uint64
		for _, m := range []string{"req", "mra", "rej", "rep", "rtu", "dreq", "drep"} {
			n += h["cm_"+m+"_"+dir]
		}
		return n
	}
	require.NotZero(t, mads("sent"), "softrdma's CM counters (--stat)")
	assert.Equal(t, uint64(2*c.count)+mads("sent"), r.hwc["rdma_recvs"], "rxe rdma_recvs = our SENDs + our MADs")
	assert.Equal(t, uint64(2*c.count)+mads("rcvd"), r.hwc["rdma_sends"], "rxe rdma_sends = its SENDs + its MADs")
	assert.Zero(t, h["cm_retransmits"]+h["cm_duplicates"]+h["cm_unknown_comm_id"]+h["cm_unsupported"]+h["cm_malformed"],
		"CM retransmissions, duplicates or refusals in a run without loss")
}
