package interop

import (
	"fmt"
	"strings"
	"testing"
	"time"

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

// errorCounters are the counters (rxe's hw_counters, and softrdma's of
// the same names) that must not move in a run without loss: the
// unexpected sequence errors (rcvd_seq_err: a NAK PSN sequence error or an
// out-of-sequence response received; out_of_seq_request: a request PSN
// ahead of the expected one, i.e. a packet went missing), exhausted
// retries, RNR and send errors.
//
// completer_retry_err and duplicate_request are not among them: rxe arms
// its retransmit timer when it sends with no timer pending and ACKs do not
// restart it, so 68 ms (timeout 14 at HZ=250) after it started, a WQE that
// happens to be outstanding is retransmitted although nothing was lost.
// rxe does it to rxe as well (ibv_rc_pingpong -n 200 between two VMs:
// completer_retry_err=11, duplicate_request=36-40 on each side). The test
// checks instead that each duplicate has a retransmission behind it.
var errorCounters = []string{
	"rcvd_seq_err", "out_of_seq_request",
	"retry_exceeded_err", "retry_rnr_exceeded_err",
	"rcvd_rnr_err", "send_rnr_err", "send_err", "link_downed",
}

// TestRCPingpong runs ibv_rc_pingpong on rxe in a VM against softrdma
// rc-pingpong on the host, each side as the server, and checks the data,
// rxe's hw_counters and the ICRC of every packet on the bridge. rxe drops
// a packet with a bad ICRC silently (no counter moves, README finding 3),
// so "no ICRC error" is checked as: rxe's rcvd_pkts equals the packets
// softrdma sent, softrdma dropped nothing (drop_bad_icrc and the others),
// and roce_pcap.py finds every captured ICRC good.
func TestRCPingpong(t *testing.T) {
	tb := openTestbed(t)
	steps := make([]step, len(pingpongCases))
	for i, c := range pingpongCases {
		steps[i] = c.step()
	}
	s := tb.run(t, steps)
	t.Logf("VM: %s", s.versions)

	var sent, rcvd uint64
	for i, c := range pingpongCases {
		r := s.steps[i]
		t.Run(c.name, func(t *testing.T) {
			t.Logf("%s: %v (VM: %s; host: softrdma %s)", c.name, r.dur.Round(time.Millisecond),
				steps[i].vm, strings.Join(steps[i].host, " "))
			t.Logf("VM output:\n%s", r.vmOut)
			t.Logf("softrdma output:\n%s", r.hostOut)
			t.Logf("rxe hw_counters (change): %v", r.hwc)
			require.NoError(t, r.hostErr, "softrdma rc-pingpong failed")
			require.Zero(t, r.vmRC, "ibv_rc_pingpong failed in the VM")
			assert.Contains(t, r.vmOut, fmt.Sprintf("%d iters in", c.iters))
			assert.NotContains(t, r.vmOut, "invalid data")
			assert.Contains(t, r.hostOut, fmt.Sprintf("verified %d messages", c.iters))

			for _, name := range errorCounters {
				assert.Zero(t, r.hwc[name], "rxe hw_counter %s", name)
				assert.Zero(t, r.hostStat[name], "softrdma counter %s", name)
			}
			assert.LessOrEqual(t, r.hwc["duplicate_request"], r.hostStat["retransmits"],
				"rxe saw duplicates softrdma did not retransmit")
			if r.hostStat["duplicate_request"] > 0 {
				assert.NotZero(t, r.hwc["completer_retry_err"], "softrdma saw duplicates rxe did not retransmit")
			}
			if n := r.hwc["completer_retry_err"]; n > 0 {
				t.Logf("rxe retransmitted %d times (its retransmit timer; see errorCounters)", n)
			}
			assert.Equal(t, uint64(c.iters), r.hwc["rdma_sends"], "rxe rdma_sends")
			assert.Equal(t, uint64(c.iters), r.hwc["rdma_recvs"], "rxe rdma_recvs")
			require.NotZero(t, r.hostStat["sent_pkts"], "softrdma --stat output")
			assert.Equal(t, r.hostStat["sent_pkts"], r.hwc["rcvd_pkts"],
				"rxe accepted (rcvd_pkts) every packet softrdma sent; a shortfall is a silent drop (ICRC, header check)")
			assert.Equal(t, r.hwc["sent_pkts"], r.hostStat["rcvd_pkts"], "softrdma accepted every packet rxe sent")
			for name, v := range r.hostStat {
				switch {
				case name == "drop_duplicate_response":
					// rxe ACKs each duplicate request it gets, so each packet
					// softrdma retransmitted may come back as a duplicate ACK.
					assert.LessOrEqual(t, v, r.hostStat["retransmits"], "softrdma counter %s", name)
				case strings.HasPrefix(name, "drop_"):
					assert.Zero(t, v, "softrdma counter %s", name)
				}
			}
			if n := r.hostStat["retransmits"]; n > 0 {
				t.Logf("softrdma retransmitted %d packets (%d timeouts): rxe acknowledged late (a loaded host slows the VM)",
					n, r.hostStat["retransmit_timeouts"])
			}
		})
		sent += r.hostStat["sent_pkts"]
		rcvd += r.hostStat["rcvd_pkts"]
	}

	ok, bad := tb.icrcCheck(t, s.pcap)
	assert.Zero(t, bad, "packets on the bridge with a bad ICRC")
	assert.Equal(t, int(sent+rcvd), ok, "RoCEv2 packets captured = sent + received by softrdma")
	t.Logf("timing: VM boot to rxe0 ACTIVE %v, whole session %v (%d runs)",
		s.boot.Round(100*time.Millisecond), s.total.Round(100*time.Millisecond), len(s.steps))
}
