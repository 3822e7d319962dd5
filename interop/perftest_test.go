package interop

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// perftestCase is one run of a perftest tool in the VM (ib_write_bw, ...)
// against the softrdma tool of the same name (write-bw, ...), which
// detects the stock peer and speaks perftest's exchange.
type perftestCase struct {
	name     string
	tool     string // perftest's: "ib_write_bw"
	vmServer bool   // the VM's tool is the server, softrdma the client
	args     string // flags both sides get: -s, -n, -A (perftest has no parameter exchange)
	size     int64  // message size the results must show
	iters    int64  // iterations (per QP, one QP here)
	host     string // softrdma's extra flags (--verify is always there)
	// verified is what softrdma's --verify line must say ("" when this
	// side can check nothing: perftest checks no data, so a WRITE or SEND
	// into the VM is checked only by rxe's counters).
	verified string
	// lossy runs have packet loss injected on softrdma's side (--impair);
	// rxeRetransmits and hostRetransmits say which stack must have
	// retransmitted.
	lossy                           bool
	rxeRetransmits, hostRetransmits bool
	// rdmacm runs connect with the RDMA CM (-R on both sides): the
	// exchange crosses as SENDs on a CM connection, which rxe counts
	// in rdma_sends and rdma_recvs with the data and QP1's MADs.
	rdmacm bool
}

// softrdma returns the softrdma subcommand for the perftest tool.
func (c perftestCase) softrdma() string {
	return strings.ReplaceAll(strings.TrimPrefix(c.tool, "ib_"), "_", "-")
}

// The runs: each tool each way (the latency tools too), small sizes and
// counts. Sizes are not all
// multiples of the path MTU (1024, rxe's active MTU for eth0's 1500 bytes,
// which both sides agree on in check_mtu). 100 atomics wrap around the 64
// slots perftest steps through, so the atomic server's check sees slots
// hit twice. The lossy runs drop 2% of the packets each way on softrdma's
// side with a fixed seed: ib_write_bw with the VM as the client (rxe
// retransmits WRITEs softrdma lost or whose ACKs it lost), ib_read_bw with
// softrdma as the client (softrdma retransmits READ requests, rxe answers
// them again).
var perftestCases = []perftestCase{
	{name: "ib_write_bw-vm_server", tool: "ib_write_bw", vmServer: true, args: "-s 10000 -n 50", size: 10000, iters: 50},
	{name: "ib_write_bw-vm_client", tool: "ib_write_bw", args: "-s 8192 -n 50", size: 8192, iters: 50},
	{name: "ib_read_bw-vm_server", tool: "ib_read_bw", vmServer: true, args: "-s 10000 -n 50", size: 10000, iters: 50,
		verified: "50 READs of 10000 bytes equal the first READ"},
	{name: "ib_read_bw-vm_client", tool: "ib_read_bw", args: "-s 300 -n 100", size: 300, iters: 100},
	{name: "ib_send_bw-vm_server", tool: "ib_send_bw", vmServer: true, args: "-s 4096 -n 50", size: 4096, iters: 50},
	{name: "ib_send_bw-vm_client", tool: "ib_send_bw", args: "-s 5000 -n 50", size: 5000, iters: 50,
		verified: "50 messages of 5000 bytes received"},
	{name: "ib_atomic_bw_fadd-vm_server", tool: "ib_atomic_bw", vmServer: true, args: "-A FETCH_AND_ADD -n 100", size: 8, iters: 100,
		verified: "went up by one per FETCH_AND_ADD"},
	{name: "ib_atomic_bw_fadd-vm_client", tool: "ib_atomic_bw", args: "-A FETCH_AND_ADD -n 100", size: 8, iters: 100,
		verified: "64 slots per QP hold what 100 FETCH_AND_ADD left"},
	{name: "ib_atomic_bw_cas-vm_server", tool: "ib_atomic_bw", vmServer: true, args: "-A CMP_AND_SWAP -n 100", size: 8, iters: 100,
		verified: "stayed put under CMP_AND_SWAP"},
	{name: "ib_atomic_bw_cas-vm_client", tool: "ib_atomic_bw", args: "-A CMP_AND_SWAP -n 100", size: 8, iters: 100,
		verified: "64 slots per QP hold what 100 CMP_AND_SWAP left"},
	{name: "ib_write_lat-vm_server", tool: "ib_write_lat", vmServer: true, args: "-s 64 -n 100", size: 64, iters: 100},
	{name: "ib_write_lat-vm_client", tool: "ib_write_lat", args: "-s 2000 -n 100", size: 2000, iters: 100},
	{name: "ib_read_lat-vm_server", tool: "ib_read_lat", vmServer: true, args: "-s 3000 -n 100", size: 3000, iters: 100,
		verified: "100 READs of 3000 bytes equal the first"},
	{name: "ib_read_lat-vm_client", tool: "ib_read_lat", args: "-s 64 -n 100", size: 64, iters: 100},
	{name: "ib_send_lat-vm_server", tool: "ib_send_lat", vmServer: true, args: "-s 64 -n 100", size: 64, iters: 100},
	{name: "ib_send_lat-vm_client", tool: "ib_send_lat", args: "-s 1500 -n 100", size: 1500, iters: 100},
	{name: "ib_write_bw_loss-vm_client", tool: "ib_write_bw", args: "-s 8192 -n 100", size: 8192, iters: 100,
		host: "--impair loss=0.02,seed=5", lossy: true, rxeRetransmits: true},
	{name: "ib_read_bw_loss-vm_server", tool: "ib_read_bw", vmServer: true, args: "-s 8192 -n 100", size: 8192, iters: 100,
		host: "--impair loss=0.02,seed=7", lossy: true, hostRetransmits: true,
		verified: "100 READs of 8192 bytes equal the first READ"},
	// -R: rdma_cm on both sides (send_bw_rdmacm.pcap is the same between
	// two VMs). softrdma's server device takes the netns's only address.
	{name: "ib_send_bw_rdmacm-vm_server", tool: "ib_send_bw", vmServer: true, args: "-R -s 4096 -n 50", size: 4096, iters: 50,
		rdmacm: true},
	{name: "ib_send_bw_rdmacm-vm_client", tool: "ib_send_bw", args: "-R -s 5000 -n 50", size: 5000, iters: 50,
		rdmacm: true, verified: "50 messages of 5000 bytes received"},
}

func (c perftestCase) step() step {
	s := step{name: c.name}
	host := append([]string{c.softrdma()}, strings.Fields(c.args)...)
	host = append(host, "--verify", "--stat")
	host = append(host, strings.Fields(c.host)...)
	// -x 1: GID index 1, ::ffff:192.168.77.10; -F: no CPU frequency
	// check (the VM has no cpufreq).
	vm := fmt.Sprintf("%s -d rxe0 -x 1 -F %s", c.tool, c.args)
	switch {
	case c.vmServer:
		s.vm = vm
		s.host = append(host, "--connect-timeout", stepTimeout.String(), vmIP)
	case c.rdmacm:
		// The VM starts its step as soon as the previous one ended, maybe
		// before softrdma's device is up; a TCP connection would be
		// refused and retried, but a REQ would be lost (counted by rxe,
		// never seen by softrdma) and sent again only 4.3 s later. The
		// VM's client waits 2 s.
		s.vm = `sh -c "sleep 2; exec rxetb-retry ` + vm + " " + hostIP + `"`
		s.host = host
	default:
		s.vm = "rxetb-retry " + vm + " " + hostIP
		s.host = host
	}
	return s
}

// check checks one perftest run: both tools succeeded and printed the
// run's size and iterations (the server of write, read and atomic prints
// the client's report, which crossed the exchange), softrdma's --verify
// checked what it can, and the counters account for every packet.
func (c perftestCase) check(t *testing.T, r *stepResult) {
	require.NoError(t, r.hostErr, "softrdma %s failed", c.softrdma())
	require.Zero(t, r.vmRC, "%s failed in the VM", c.tool)
	row := regexp.MustCompile(fmt.Sprintf(`(?m)^ *%d +%d +\d`, c.size, c.iters))
	// ib_read_lat's server only serves: it prints no result, nor does
	// softrdma's.
	if c.tool != "ib_read_lat" || !c.vmServer {
		assert.Regexp(t, row, r.vmOut, "%s's result row", c.tool)
	}
	if c.tool != "ib_read_lat" || c.vmServer {
		assert.Regexp(t, row, r.hostOut, "softrdma's result row")
	}
	assert.Contains(t, r.hostOut, "peer perftest ", "softrdma detected a perftest peer")
	if c.verified != "" {
		assert.Regexp(t, `(?m)^ Verify          : .*`+regexp.QuoteMeta(c.verified), r.hostOut)
	}
	assert.NotContains(t, r.hostOut, "softrdma: ", "softrdma's warnings and errors")
	checkCounters(t, r, c.lossy)
	switch {
	case c.rdmacm:
		checkRDMACM(t, r, c.vmServer, uint64(c.iters))
	case c.tool == "ib_send_bw" && c.vmServer:
		assert.Equal(t, uint64(c.iters), r.hwc["rdma_recvs"], "rxe rdma_recvs (receives consumed)")
	case c.tool == "ib_send_bw":
		assert.Equal(t, uint64(c.iters), r.hwc["rdma_sends"], "rxe rdma_sends")
	case c.tool == "ib_send_lat":
		assert.Equal(t, uint64(c.iters), r.hwc["rdma_sends"], "rxe rdma_sends")
		assert.Equal(t, uint64(c.iters), r.hwc["rdma_recvs"], "rxe rdma_recvs")
	}
	if c.lossy {
		assert.NotZero(t, r.hostStat["impair_tx_dropped"]+r.hostStat["impair_rx_dropped"], "--impair dropped nothing")
		t.Logf("--impair dropped %d packets softrdma sent and %d rxe sent", r.hostStat["impair_tx_dropped"],
			r.hostStat["impair_rx_dropped"])
	}
	if c.rxeRetransmits {
		assert.NotZero(t, r.hwc["completer_retry_err"]+r.hwc["rcvd_seq_err"],
			"rxe did not retransmit (no timeout, no NAK received)")
		assert.NotZero(t, r.hostStat["out_of_seq_request"]+r.hostStat["duplicate_request"],
			"softrdma saw no retransmitted request from rxe")
	}
	if c.hostRetransmits {
		assert.NotZero(t, r.hostStat["retransmits"], "softrdma did not retransmit")
		assert.NotZero(t, r.hwc["duplicate_request"]+r.hwc["out_of_seq_request"], "rxe saw no retransmitted request")
	}
}

// checkRDMACM checks an ib_send_bw -R run's connections and rxe's SEND
// counters: two connections (the exchange's channel, then the data QP's)
// set up by REQ, REP and RTU and ended by the server's DREQs, which the
// client answers; 11 exchange messages each way (send_bw_rdmacm.pcap:
// version, cycle buffer, cache line, MTU, two hand shakes of zeros around
// the data connection, four hand shakes before the run, one after it);
// and rxe's rdma_sends and rdma_recvs, which count every SEND and receive
// on all its QPs, equal to what softrdma's side accounts for: the -n data
// SENDs, the exchange's messages and the MADs of QP1.
func checkRDMACM(t *testing.T, r *stepResult, vmServer bool, iters uint64) {
	t.Helper()
	hs := r.hostStat
	var madSent, madRcvd uint64
	for name, v := range hs {
		switch {
		case strings.HasPrefix(name, "cm_channel_"):
		case strings.HasPrefix(name, "cm_") && strings.HasSuffix(name, "_sent"):
			madSent += v
		case strings.HasPrefix(name, "cm_") && strings.HasSuffix(name, "_rcvd"):
			madRcvd += v
		}
	}
	assert.Equal(t, uint64(11), hs["cm_channel_sent"], "exchange messages softrdma sent")
	assert.Equal(t, uint64(11), hs["cm_channel_rcvd"], "exchange messages softrdma received")
	assert.Zero(t, hs["cm_retransmits"], "MADs softrdma sent again")
	if vmServer {
		// softrdma is the active side, twice; rxe's server disconnects.
		// A data REQ that arrives before rxe listens again is rejected
		// and sent again 100 ms later, as perftest's client does.
		assert.Equal(t, 2+hs["cm_rej_rcvd"], hs["cm_req_sent"], "REQs: one per connection, plus one per REJ")
		assert.Equal(t, uint64(2), hs["cm_rep_rcvd"])
		assert.Equal(t, uint64(2), hs["cm_rtu_sent"])
		assert.Equal(t, uint64(2), hs["cm_dreq_rcvd"], "rxe's server disconnected both")
		assert.Equal(t, uint64(2), hs["cm_drep_sent"])
		assert.Zero(t, hs["cm_dreq_sent"], "softrdma's client waits for the server's DREQs")
		assert.Equal(t, iters+hs["cm_channel_sent"]+madSent, r.hwc["rdma_recvs"],
			"rxe rdma_recvs: the data SENDs, the exchange's, softrdma's MADs")
		assert.Equal(t, hs["cm_channel_rcvd"]+madRcvd, r.hwc["rdma_sends"], "rxe rdma_sends: the exchange's, its MADs")
		return
	}
	assert.Equal(t, uint64(2), hs["cm_req_rcvd"])
	assert.Equal(t, uint64(2), hs["cm_rep_sent"])
	assert.Equal(t, uint64(2), hs["cm_rtu_rcvd"])
	// softrdma's server disconnects both connections when the run ends,
	// but rxe's client disconnects too (perftest's client calls
	// rdma_disconnect when it is done), and whichever DREQ leaves first
	// ends the connection; the other side answers it with a DREP
	// (IBTA ch. 12 CM state machine: a DREQ received in ESTABLISHED or
	// DREQ_SENT is answered by a DREP; rdmacm.Conn.onDREQ). CI once
	// saw one of each: dreq_sent 1, dreq_rcvd 1, drep_sent 1, drep_rcvd 1.
	assert.GreaterOrEqual(t, hs["cm_dreq_sent"]+hs["cm_dreq_rcvd"], uint64(2), "each connection ended by a DREQ")
	assert.LessOrEqual(t, hs["cm_dreq_sent"], uint64(2), "at most one DREQ per connection from softrdma")
	assert.Equal(t, hs["cm_dreq_rcvd"], hs["cm_drep_sent"], "softrdma answered every DREQ rxe sent")
	assert.GreaterOrEqual(t, hs["cm_drep_rcvd"]+hs["cm_dreq_rcvd"], hs["cm_dreq_sent"],
		"each DREQ softrdma sent was answered, or crossed rxe's")
	assert.Equal(t, iters+hs["cm_channel_rcvd"]+madRcvd, r.hwc["rdma_sends"],
		"rxe rdma_sends: the data SENDs, the exchange's, its MADs")
	assert.Equal(t, hs["cm_channel_sent"]+madSent, r.hwc["rdma_recvs"], "rxe rdma_recvs: the exchange's, softrdma's MADs")
}
