package report

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPrintODP(t *testing.T) {
	var w bytes.Buffer
	PrintODP(&w, "local", &ODPJSON{FaultPolicy: "sync", Bytes: 65536, Pages: 16, PageFaults: 16, PageFaultsHandled: 16,
		Faults: 4, FaultP50us: 7.391, FaultP99us: 64.7, FaultMaxus: 99.2})
	PrintODP(&w, "remote", &ODPJSON{Implicit: true, Prefetch: true, FaultPolicy: "rnr", Bytes: 1 << 20, Pages: 256,
		BudgetPages: 128, PeakPresent: 128, PageInvalidations: 128, PageInvalidationsHandled: 128, PagePrefetch: 256, Evictions: 128})
	assert.Equal(t, ""+
		" ODP local MR    : explicit, 16 pages (65536 bytes), fault policy sync, no budget\n"+
		"                   page_faults 16  page_faults_handled 16  page_invalidations 0  page_invalidations_handled 0  page_prefetch 0  evictions 0\n"+
		"                   fault latency: 4 faults, p50 7.39 usec, p99 64.70 usec, max 99.20 usec\n"+
		" ODP remote MR   : implicit, prefetched, 256 pages (1048576 bytes), fault policy rnr, budget 128 pages (peak 128 present)\n"+
		"                   page_faults 0  page_faults_handled 0  page_invalidations 128  page_invalidations_handled 128  page_prefetch 256  evictions 128\n"+
		"                   fault latency: no faults\n", w.String())
}

func TestODPJSONNames(t *testing.T) {
	b, err := json.Marshal(&JSON{ODP: &ODPJSON{PageFaults: 3}})
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	odp := m["odp"].(map[string]any)
	for _, k := range []string{"page_faults", "page_faults_handled", "page_invalidations", "page_invalidations_handled",
		"page_prefetch", "evictions", "faults", "fault_p50_usec", "fault_p99_usec", "fault_max_usec", "implicit",
		"prefetch", "fault_policy", "bytes", "pages", "budget_pages", "peak_present_pages"} {
		assert.Contains(t, odp, k)
	}
	assert.NotContains(t, m, "peer_odp", "omitted for a pinned peer buffer")
}
