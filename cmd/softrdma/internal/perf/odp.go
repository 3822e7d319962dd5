package perf

import (
	"fmt"
	"io"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
	"github.com/softrdma/softrdma/hostmem"
)

// setupODP allocates the n-byte buffer from the device's host address
// space and registers it on demand: as an explicit ODP MR over the buffer
// (--odp) or through an implicit ODP MR over the whole address space
// (--iodp), whose IOVAs are the buffer's addresses. Nothing is touched:
// every page is faulted in by the first transfer that reaches it, unless
// --prefetch makes it present first.
func (s *session) setupODP(n int) error {
	as, err := s.dev.AddressSpace()
	if err != nil {
		return fmt.Errorf("--odp: %w", err)
	}
	if s.mem, err = as.Alloc(n); err != nil {
		return fmt.Errorf("--odp: %w", err)
	}
	s.as = as
	access := bufAccess | softrdma.AccessOnDemand
	if s.o.ODP.Implicit {
		s.mr, err = s.dev.RegMRImplicit(s.pd, access)
	} else {
		s.mr, err = s.dev.RegMR(s.pd, s.mem, access)
	}
	if err != nil {
		return err
	}
	s.base = hostmem.AddrOf(s.mem)
	s.warnRNRBudget()
	if s.o.ODP.Prefetch {
		return s.prefetch()
	}
	return nil
}

// warnRNRBudget warns when the rnr fault policy meets messages with more
// pages than the ODP budget: the responder's background fault of such a
// message's range evicts the range's first pages before the requester's
// retry reaches them, so the message is NAKed again and again.
func (s *session) warnRNRBudget() {
	b := s.dev.ODPBudget()
	if s.o.ODP.FaultPolicy != "rnr" || b == nil || b.Limit() == 0 {
		return
	}
	var maxSize int64
	for _, n := range s.p.Sizes() {
		maxSize = max(maxSize, n)
	}
	if pages := (maxSize + pageSize - 1) / pageSize; pages > b.Limit() {
		s.logf("softrdma: warning: --fault-policy rnr with messages of %d pages over an --odp-budget of %d pages: "+
			"WRITEs into this side may never complete (use --fault-policy sync or a larger budget)", pages, b.Limit())
	}
}

// maxAdviseSGE is the most bytes one SGE of the prefetch advice names
// (an SGE's length is 32 bits).
const maxAdviseSGE = 1 << 30

// prefetch makes the whole buffer present and writable through the MR
// before the run: ibv_advise_mr(IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
// IBV_ADVISE_MR_FLAG_FLUSH), which returns once the pages are mapped.
func (s *session) prefetch() error {
	var sgl []softrdma.SGE
	for off := 0; off < len(s.mem); off += maxAdviseSGE {
		n := min(len(s.mem)-off, maxAdviseSGE)
		sgl = append(sgl, softrdma.SGE{Addr: s.base + uint64(off), Length: uint32(n), LKey: s.mr.LKey()})
	}
	if err := s.dev.AdviseMR(s.pd, softrdma.AdvisePrefetchWrite, softrdma.AdviseFlagFlush, sgl); err != nil {
		return fmt.Errorf("--prefetch: %w", err)
	}
	return nil
}

// freeMem releases the buffer: Free for memory of the address space (its
// MR must be deregistered first), munmap otherwise.
func (s *session) freeMem() {
	if s.as == nil {
		freeBuffer(s.mem)
	} else if s.mem != nil {
		if err := s.as.Free(hostmem.AddrOf(s.mem), len(s.mem)); err != nil {
			s.logf("softrdma: free the ODP buffer: %v", err)
		}
	}
	s.mem = nil
}

// odpReport returns the ODP report of this side's buffer, or nil if it
// is pinned.
func (s *session) odpReport() *report.ODPJSON {
	if s.as == nil || s.mr == nil || !s.mr.ODP() {
		return nil
	}
	st := s.mr.ODPStats()
	r := &report.ODPJSON{
		Implicit: s.mr.Implicit(), Prefetch: s.o.ODP.Prefetch,
		FaultPolicy: s.o.ODP.FaultPolicy,
		Bytes:       int64(len(s.mem)), Pages: int64((len(s.mem) + pageSize - 1) / pageSize),

		PageFaults: st.PageFaults, PageFaultsHandled: st.PageFaultsHandled,
		PageInvalidations: st.PageInvalidations, PageInvalidationsHandled: st.PageInvalidationsHandled,
		PagePrefetch: st.PagePrefetch, Evictions: st.Evictions,

		Faults: st.Faults, FaultP50us: st.FaultP50us, FaultP99us: st.FaultP99us, FaultMaxus: st.FaultMaxus,
	}
	if r.FaultPolicy == "" {
		r.FaultPolicy = softrdma.FaultSync.String()
	}
	if b := s.dev.ODPBudget(); b != nil {
		r.BudgetPages, r.PeakPresent = b.Limit(), b.Peak()
	}
	return r
}

// printODP prints the ODP reports of both sides' buffers, where they are
// registered on demand.
func (s *session) printODP(w io.Writer, mine *report.ODPJSON) {
	if mine != nil {
		report.PrintODP(w, "local", mine)
	}
	if s.peerODP != nil {
		report.PrintODP(w, "remote", s.peerODP)
	}
}
