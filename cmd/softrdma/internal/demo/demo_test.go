package demo

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/perf"
	"github.com/softrdma/softrdma/transport"
)

// counters returns a device's snapshot with the named counters set.
func counters(set map[string]uint64) []transport.Counter {
	var c transport.Counters
	out := c.Snapshot()
	for i := range out {
		out[i].Value = set[out[i].Name]
	}
	return out
}

// TestLegendMatchesRxeMeanings: the legend of an --impair run (loss: PSN
// sequence error NAKs, go-back-N retries, no RNR NAK) explains each
// counter as Linux rxe counts it (rxe_hw_counters.c): rcvd_seq_err is
// the PSN sequence error NAKs received, not RNR NAKs; naks_sent is every
// NAK sent, not an RNR count; completer_retry_err, the retries the
// completer started (after a sequence NAK or the retransmit timer, as
// rxe_comp.c's COMPST_ERROR_RETRY), has a line of its own.
func TestLegendMatchesRxeMeanings(t *testing.T) {
	var b strings.Builder
	writeCounters(&b,
		counters(map[string]uint64{"rcvd_seq_err": 578, "completer_retry_err": 725, "retransmit_timeouts": 76, "naks_sent": 10}),
		counters(map[string]uint64{"naks_sent": 459, "out_of_seq_request": 97928, "duplicate_request": 4755}))
	out := b.String()
	assert.Contains(t, out, " rcvd_seq_err: PSN sequence error NAKs received")
	assert.Contains(t, out, " naks_sent: NAKs of every kind sent by a responder: PSN sequence error, RNR and the others")
	assert.Contains(t, out, " completer_retry_err: go-back-N retries started, after a PSN sequence error NAK or the retransmit timer")
	assert.Contains(t, out, "retransmit_timeouts: those the timer started")
	assert.Contains(t, out, " duplicate_request: requests received again")
	assert.Contains(t, out, " out_of_seq_request/drop_psn_out_of_window: requests past a gap in the PSNs")
	// No RNR NAK counter is non-zero: no line may call these RNR NAKs.
	assert.NotContains(t, out, "RNR NAKs sent by a responder")
	assert.NotContains(t, out, "naks_sent: RNR")
	// The RNR line comes with the RNR counters only.
	b.Reset()
	writeCounters(&b, counters(map[string]uint64{"rcvd_rnr_err": 2}), counters(map[string]uint64{"send_rnr_err": 2, "drop_rnr": 2}))
	assert.Contains(t, b.String(), " send_rnr_err/rcvd_rnr_err: RNR NAKs sent by a responder/received by a requester")
	assert.NotContains(t, b.String(), "rcvd_seq_err")
}

// TestCheckFileRefusesKernelFS: a --file of the kernel's procfs or sysfs
// is a usage error, as for the perftest tools: its size is not its
// content (a sysfs attribute has size 4096 and holds a few bytes, and
// the three transfers failed midway; a procfs file was called empty).
func TestCheckFileRefusesKernelFS(t *testing.T) {
	for _, tc := range []struct{ path, fs string }{
		{"/proc/self/status", "procfs"},
		{"/sys/kernel/mm/transparent_hugepage/enabled", "sysfs"},
	} {
		if _, err := os.Stat(tc.path); err != nil {
			t.Logf("%s: %v", tc.path, err)
			continue
		}
		err := checkFile(tc.path)
		require.ErrorIs(t, err, perf.ErrUsage, tc.path)
		assert.Contains(t, err.Error(), "--file "+tc.path+": a file of the kernel's "+tc.fs, tc.path)
	}
}
