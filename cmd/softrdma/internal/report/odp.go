package report

import (
	"fmt"
	"io"
)

// ODPJSON is the demand-paging report of one side's registered buffer
// (--odp, --iodp): how it was registered, the MR's counters under mlx5's
// names (in pages, as /sys/class/infiniband/<dev>/ports/1/hw_counters and
// the per-MR rdma statistic show them), and the latency of the faults the
// data path waited for.
type ODPJSON struct {
	Implicit    bool   `json:"implicit"`     // an implicit ODP MR (--iodp) rather than an explicit one (--odp)
	Prefetch    bool   `json:"prefetch"`     // the buffer was prefetched before the run (--prefetch)
	FaultPolicy string `json:"fault_policy"` // the device's responder fault policy: "sync" or "rnr"
	Bytes       int64  `json:"bytes"`        // the buffer
	Pages       int64  `json:"pages"`        // the buffer's pages
	// BudgetPages is the device's ODP page budget (0: unlimited) and
	// PeakPresent the most pages its ODP MRs held present at once.
	BudgetPages int64 `json:"budget_pages"`
	PeakPresent int64 `json:"peak_present_pages"`

	PageFaults               int64 `json:"page_faults"`
	PageFaultsHandled        int64 `json:"page_faults_handled"`
	PageInvalidations        int64 `json:"page_invalidations"`
	PageInvalidationsHandled int64 `json:"page_invalidations_handled"`
	PagePrefetch             int64 `json:"page_prefetch"`
	Evictions                int64 `json:"evictions"` // pages the budget evicted (included in page_invalidations)

	// Faults is how many fault-handler runs (each for a run of pages) the
	// latency percentiles describe; the latencies are in microseconds.
	Faults     int64   `json:"faults"`
	FaultP50us float64 `json:"fault_p50_usec"`
	FaultP99us float64 `json:"fault_p99_usec"`
	FaultMaxus float64 `json:"fault_max_usec"`
}

// PrintODP prints the ODP report of a buffer, labelled by whose it is
// ("local", "remote"), after the results table:
//
//	ODP local MR    : explicit, 16 pages (65536 bytes), fault policy sync, no budget
//	                   page_faults 16  page_faults_handled 16  page_invalidations 0  page_invalidations_handled 0  page_prefetch 0  evictions 0
//	                   fault latency: 3 faults, p50 12.03 usec, p99 40.96 usec, max 40.96 usec
func PrintODP(w io.Writer, whose string, o *ODPJSON) {
	kind := "explicit"
	if o.Implicit {
		kind = "implicit"
	}
	if o.Prefetch {
		kind += ", prefetched"
	}
	budget := "no budget"
	if o.BudgetPages > 0 {
		budget = fmt.Sprintf("budget %d pages (peak %d present)", o.BudgetPages, o.PeakPresent)
	}
	const indent = "                   "
	fmt.Fprintf(w, " %-16s: %s, %d pages (%d bytes), fault policy %s, %s\n", "ODP "+whose+" MR", kind, o.Pages, o.Bytes,
		o.FaultPolicy, budget)
	fmt.Fprintf(w, "%spage_faults %d  page_faults_handled %d  page_invalidations %d  page_invalidations_handled %d  page_prefetch %d  evictions %d\n",
		indent, o.PageFaults, o.PageFaultsHandled, o.PageInvalidations, o.PageInvalidationsHandled, o.PagePrefetch, o.Evictions)
	if o.Faults == 0 {
		fmt.Fprintf(w, "%sfault latency: no faults\n", indent)
		return
	}
	fmt.Fprintf(w, "%sfault latency: %d faults, p50 %.2f usec, p99 %.2f usec, max %.2f usec\n",
		indent, o.Faults, o.FaultP50us, o.FaultP99us, o.FaultMaxus)
}
