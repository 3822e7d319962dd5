package interop

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// interopCase is one run of a stock tool in the VM against softrdma.
type interopCase interface {
	step() step
	check(t *testing.T, r *stepResult)
}

// cases returns every run of the suite, in the order the VM runs them.
func cases() []interopCase {
	var cs []interopCase
	for _, c := range pingpongCases {
		cs = append(cs, c)
	}
	for _, c := range perftestCases {
		cs = append(cs, c)
	}
	for _, c := range unreliableCases {
		cs = append(cs, c)
	}
	for _, c := range rpingCases {
		cs = append(cs, c)
	}
	return cs
}

// TestRxe boots one VM with Linux rxe (the test bed's, see docs/interop.md)
// and runs every case in it in turn, each a stock tool against softrdma on
// the host: ibv_rc_pingpong, then ib_write_bw, ib_read_bw, ib_send_bw and
// ib_atomic_bw (both atomics), each side as the server, the two runs
// with packet loss on softrdma's side, ib_send_bw -R (the RDMA CM) each
// side as the server, and ibv_uc_pingpong and
// ibv_ud_pingpong each side as the server. After each run the VM prints rxe's
// hw_counters and softrdma its own (--stat); each case is a subtest that
// checks its run, and a last one recomputes the ICRC of every packet
// captured on the bridge.
//
// RXETB_STEPS=REGEXP runs only the cases whose names match (one VM boot
// still), e.g. RXETB_STEPS=ib_atomic.
func TestRxe(t *testing.T) {
	all := cases()
	var cs []interopCase
	var steps []step
	re := regexp.MustCompile(os.Getenv("RXETB_STEPS"))
	for _, c := range all {
		if st := c.step(); re.MatchString(st.name) {
			cs, steps = append(cs, c), append(steps, st)
		}
	}
	if len(steps) == 0 {
		t.Skipf("RXETB_STEPS=%q matches none of the %d cases", re, len(all))
	}
	tb := openTestbed(t)
	s := tb.run(t, steps)
	t.Logf("VM: %s", s.versions)

	var wire uint64 // RoCEv2 packets on the bridge, by the counters
	for i, c := range cs {
		r := &s.steps[i]
		t.Run(steps[i].name, func(t *testing.T) {
			t.Logf("%s: %v (VM: %s; host: softrdma %s)", r.name, r.dur.Round(time.Millisecond),
				steps[i].vm, strings.Join(steps[i].host, " "))
			t.Logf("VM output:\n%s", r.vmOut)
			t.Logf("softrdma output:\n%s", r.hostOut)
			t.Logf("rxe hw_counters (change): %v", r.hwc)
			c.check(t, r)
		})
		wire += hostWireSent(r) + r.hwc["sent_pkts"]
	}
	t.Run("icrc", func(t *testing.T) {
		ok, bad := tb.icrcCheck(t, s.pcap)
		assert.Zero(t, bad, "packets on the bridge with a bad ICRC")
		assert.Equal(t, int(wire), ok, "RoCEv2 packets captured = what softrdma's socket sent + what rxe sent")
	})
	t.Logf("timing: VM boot to rxe0 ACTIVE %v, whole session %v (%d runs)",
		s.boot.Round(100*time.Millisecond), s.total.Round(100*time.Millisecond), len(s.steps))
}

// hostWireSent is the number of RoCEv2 packets softrdma's socket put on
// the wire: its conn_sent_datagrams where the tool prints them (the perftest
// tools), else the engine's sent_pkts (rc-pingpong; the same without
// --impair).
func hostWireSent(r *stepResult) uint64 {
	if v, ok := r.hostStat["conn_sent_datagrams"]; ok {
		return v
	}
	return r.hostStat["sent_pkts"]
}

// hostWireRcvd is the number of RoCEv2 packets that reached softrdma's
// socket (before --impair's receive side).
func hostWireRcvd(r *stepResult) uint64 {
	if v, ok := r.hostStat["conn_rcvd_datagrams"]; ok {
		return v
	}
	return r.hostStat["rcvd_pkts"]
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

// lossCounters are the error counters that packet loss explains (see
// checkCounters); the rest of errorCounters must not move even then.
var lossCounters = map[string]bool{"rcvd_seq_err": true, "out_of_seq_request": true}

// lossDrops are softrdma's drop reasons that follow from lost packets:
// a request after a gap, a response to a request already retransmitted,
// a response that arrives after its request completed. Any other drop
// (ICRC, malformed, access, length, ...) is an error in every run.
var lossDrops = map[string]bool{
	"drop_psn_out_of_window": true, "drop_duplicate_response": true, "drop_stale_duplicate": true,
	"drop_ghost_response": true, "drop_opcode_out_of_seq": true,
}

// checkCounters checks rxe's hw_counters and softrdma's counters over one
// run.
//
// No ICRC error: rxe drops a packet with a bad ICRC silently (no counter
// moves, test bed README finding 3), so rxe's rcvd_pkts must equal the
// packets softrdma's socket sent, every packet rxe sent must have reached
// softrdma's socket, and softrdma must have dropped none for its ICRC; at
// the end TestRxe's icrc subtest recomputes every ICRC on the bridge.
//
// No unexpected sequence error: without loss, none of errorCounters moves
// on either side, and each duplicate one side saw has a retransmission of
// the other behind it. With loss (--impair on softrdma's side), the
// sequence errors must have a lost packet behind them: rxe's
// out_of_seq_request (one per gap it NAKs) at most the packets softrdma's
// impairment dropped on send; softrdma's NAKs at most those dropped on
// receive; the sequence errors each side received at most the NAKs the
// other sent plus the losses; the rest of errorCounters still must not
// move.
func checkCounters(t *testing.T, r *stepResult, lossy bool) {
	t.Helper()
	hs, hw := r.hostStat, r.hwc
	require.NotZero(t, hs["sent_pkts"], "softrdma --stat output")
	txDropped, rxDropped := hs["impair_tx_dropped"], hs["impair_rx_dropped"]
	if !lossy {
		assert.Zero(t, txDropped+rxDropped, "packets dropped by an impairment in a run without one")
	}
	for _, name := range []string{"impair_duplicated", "impair_corrupted", "impair_reordered", "conn_send_errors"} {
		assert.Zero(t, hs[name], "softrdma counter %s (the suite injects loss only)", name)
	}

	// Every packet accounted for: no silent drop on either side.
	assert.Equal(t, hostWireSent(r), hw["rcvd_pkts"],
		"rxe accepted (rcvd_pkts) every packet softrdma's socket sent; a shortfall is a silent drop (ICRC, header check)")
	assert.Equal(t, hostWireSent(r), hs["sent_pkts"]-txDropped, "softrdma sent_pkts = on the wire + dropped by --impair")
	assert.Equal(t, hw["sent_pkts"], hostWireRcvd(r), "every packet rxe sent reached softrdma's socket")
	assert.Equal(t, hostWireRcvd(r)-rxDropped, hs["rcvd_pkts"], "softrdma accepted every packet that arrived and was not dropped by --impair")
	for name, v := range hs {
		switch {
		case name == "drop_duplicate_response" && !lossy:
			// rxe ACKs each duplicate request it gets, so each packet
			// softrdma retransmitted may come back as a duplicate ACK.
			assert.LessOrEqual(t, v, hs["retransmits"], "softrdma counter %s", name)
		case strings.HasPrefix(name, "drop_") && !(lossy && lossDrops[name]):
			assert.Zero(t, v, "softrdma counter %s", name)
		}
	}

	for _, name := range errorCounters {
		if lossy && lossCounters[name] {
			continue
		}
		assert.Zero(t, hw[name], "rxe hw_counter %s", name)
		assert.Zero(t, hs[name], "softrdma counter %s", name)
	}
	if lossy {
		assert.LessOrEqual(t, hw["out_of_seq_request"], txDropped,
			"rxe saw request gaps (out_of_seq_request) without a packet softrdma dropped behind them")
		// softrdma counts every request packet that arrives after a gap
		// in out_of_seq_request (and drop_psn_out_of_window), rxe one per
		// gap; softrdma's NAKs are one per gap.
		assert.LessOrEqual(t, hs["naks_sent"], rxDropped,
			"softrdma NAKed request gaps (naks_sent) without a packet its impairment dropped behind them")
		assert.LessOrEqual(t, hs["out_of_seq_request"], hs["drop_psn_out_of_window"],
			"softrdma's out-of-sequence requests are packets it dropped after a gap")
		assert.LessOrEqual(t, hw["rcvd_seq_err"], hs["naks_sent"]+txDropped,
			"rxe received sequence errors (NAKs, response gaps) softrdma's NAKs and losses do not explain")
		assert.LessOrEqual(t, hs["rcvd_seq_err"], hw["out_of_seq_request"]+rxDropped,
			"softrdma received sequence errors rxe's NAKs and the losses do not explain")
	} else {
		assert.LessOrEqual(t, hw["duplicate_request"], hs["retransmits"],
			"rxe saw duplicates softrdma did not retransmit")
		if hs["duplicate_request"] > 0 {
			assert.NotZero(t, hw["completer_retry_err"], "softrdma saw duplicates rxe did not retransmit")
		}
	}
	if n := hw["completer_retry_err"]; n > 0 {
		t.Logf("rxe retransmitted after %d timeouts (its retransmit timer; see errorCounters)", n)
	}
	if n := hs["retransmits"]; n > 0 {
		t.Logf("softrdma retransmitted %d packets (%d timeouts, %d NAKs received)", n,
			hs["retransmit_timeouts"], hs["rcvd_seq_err"])
	}
}
