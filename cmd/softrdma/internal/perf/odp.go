package perf

import (
	"fmt"
	"io"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/odpbuf"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
)

// setupODP allocates the n-byte buffer from the device's host address
// space and registers it on demand (odpbuf.New): as an explicit ODP MR
// over the buffer (--odp) or through an implicit ODP MR over the whole
// address space (--iodp), whose IOVAs are the buffer's addresses. Nothing
// is touched: every page is faulted in by the first transfer that reaches
// it, unless --prefetch makes it present first.
func (s *session) setupODP(n int) error {
	b, err := odpbuf.New(s.dev, s.pd, n, bufAccess, s.o.ODP)
	if err != nil {
		return fmt.Errorf("--odp: %w", err)
	}
	s.odp, s.mem, s.mr, s.base = b, b.Mem, b.MR, b.Base
	s.warnRNRBudget()
	if s.o.ODP.Prefetch {
		// The whole buffer, before the first round.
		if err := b.Prefetch(s.dev, s.pd, len(b.Mem)); err != nil {
			return fmt.Errorf("--prefetch: %w", err)
		}
	}
	return nil
}

// warnRNRBudget warns when the rnr fault policy meets messages with more
// pages than the ODP budget: the responder's background fault resolves at
// most half the budget ahead of the faulting packet (more would evict the
// range's first pages before the requester's retry reaches them), so such
// a message completes, but through an RNR NAK and a retry of the rest of
// the message every half budget: slowly.
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
			"a WRITE into this side is faulted in %d pages at a time, with an RNR NAK and a retry each: expect low bandwidth "+
			"(--fault-policy sync or a larger budget avoids it)", pages, b.Limit(), max(b.Limit()/2, 1))
	}
}

// freeMem releases the buffer: Free for memory of the address space (its
// MR must be deregistered first), munmap otherwise.
func (s *session) freeMem() {
	if s.odp == nil {
		freeBuffer(s.mem)
	} else if err := s.odp.Free(); err != nil {
		s.logf("softrdma: free the ODP buffer: %v", err)
	}
	s.mem = nil
}

// odpReport returns the ODP report of this side's buffer, or nil if it
// is pinned.
func (s *session) odpReport() *report.ODPJSON {
	if s.odp == nil || s.mr == nil {
		return nil
	}
	return s.odp.Report(s.dev)
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
