// Package odpbuf is the demand-paging side of the tools' registered
// buffers, shared by the perftest-style tools (--odp, --iodp, --prefetch,
// --odp-budget, --fault-policy) and rc-pingpong (ibv_rc_pingpong's -o, -O,
// -P): the options, a buffer allocated from the device's host address
// space and registered on demand, its prefetch, and its report.
package odpbuf

import (
	"errors"
	"fmt"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/pagetable"
)

// MinBudget is the smallest --odp-budget other than 0 (unlimited):
// pagetable.MinBudgetPages pages, which the device would raise a smaller
// budget to.
const MinBudget = pagetable.MinBudgetPages * pagetable.PageSize

// Options choose how a side registers its buffer: pinned (the zero
// value), on demand, or through an implicit ODP MR.
type Options struct {
	// Explicit allocates the buffer from the device's host address space
	// and registers it with AccessOnDemand (perftest's --odp,
	// ibv_rc_pingpong -o).
	Explicit bool
	// Implicit allocates the buffer from the address space and reaches it
	// through an implicit ODP MR, the whole address space
	// (ibv_rc_pingpong -O, which implies -o).
	Implicit bool
	// Prefetch makes the buffer present before the first round with
	// ibv_advise_mr(PREFETCH_WRITE, FLUSH) (ibv_rc_pingpong -P). It needs
	// Explicit or Implicit.
	Prefetch bool
	// Budget bounds the bytes the device's ODP MRs hold present
	// (softrdma.Config.ODPBudget; 0: unlimited).
	Budget int64
	// FaultPolicy is the responder's fault policy, "sync" or "rnr" ("":
	// sync); see softrdma.ParseFaultPolicy.
	FaultPolicy string
}

// Enabled reports whether the buffer is registered on demand.
func (o *Options) Enabled() bool { return o.Explicit || o.Implicit }

// Validate checks that the options fit together.
func (o *Options) Validate() error {
	if _, err := softrdma.ParseFaultPolicy(o.FaultPolicy); err != nil {
		return fmt.Errorf("--fault-policy %q: want sync or rnr", o.FaultPolicy)
	}
	switch {
	case o.Budget < 0:
		return fmt.Errorf("--odp-budget %d: must be 0 or more bytes", o.Budget)
	case o.Budget > 0 && o.Budget < MinBudget:
		return fmt.Errorf("--odp-budget %s: must be at least %s (%d pages), or 0 for no limit",
			sizeString(o.Budget), sizeString(MinBudget), pagetable.MinBudgetPages)
	case o.Enabled():
		return nil
	case o.Prefetch:
		return errors.New("--prefetch advises ODP MRs: add --odp or --iodp (ibv_advise_mr(3) fails with EFAULT on a pinned MR)")
	case o.Budget != 0:
		return errors.New("--odp-budget bounds ODP MRs: add --odp or --iodp")
	case o.FaultPolicy != "":
		return errors.New("--fault-policy applies to faults on ODP MRs: add --odp or --iodp")
	}
	return nil
}

// sizeString writes n as the flag's syntax does: a multiple of 1 KiB or
// 1 MiB with its suffix, or else in bytes.
func sizeString(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return fmt.Sprint(n)
}

// Configure sets the device options that follow from o: the ODP budget
// and the fault policy.
func (o *Options) Configure(cfg *softrdma.Config) error {
	policy, err := softrdma.ParseFaultPolicy(o.FaultPolicy)
	if err != nil {
		return err
	}
	cfg.ODPBudget, cfg.FaultPolicy = o.Budget, policy
	return nil
}

// Buffer is a buffer of the device's host address space registered on
// demand (o.Enabled()).
type Buffer struct {
	// Mem is the application's view of the buffer.
	Mem []byte
	// MR is the MR that reaches it: an explicit ODP MR over Mem, or an
	// implicit one over the whole address space.
	MR *softrdma.MR
	// Base is the IOVA of Mem[0] through MR (its address in the address
	// space, for both kinds).
	Base uint64

	o  Options
	as *hostmem.AddressSpace
}

// New allocates n bytes from dev's host address space and registers them
// on demand with access (AccessOnDemand is added) as o says: an explicit
// ODP MR over the buffer, or an implicit one over the whole address space
// (ibv_reg_mr(pd, NULL, SIZE_MAX, …)). Nothing is touched: every page is
// faulted in by the first transfer that reaches it, unless Prefetch makes
// it present first. Release it with DeregMR of MR, then Free.
func New(dev *softrdma.Device, pd *softrdma.PD, n int, access softrdma.Access, o Options) (*Buffer, error) {
	as, err := dev.AddressSpace()
	if err != nil {
		return nil, err
	}
	mem, err := as.Alloc(n)
	if err != nil {
		return nil, err
	}
	b := &Buffer{Mem: mem, Base: hostmem.AddrOf(mem), o: o, as: as}
	access |= softrdma.AccessOnDemand
	if o.Implicit {
		b.MR, err = dev.RegMRImplicit(pd, access)
	} else {
		b.MR, err = dev.RegMR(pd, mem, access)
	}
	if err != nil {
		b.Free()
		return nil, err
	}
	return b, nil
}

// maxAdviseSGE is the most bytes one SGE of the prefetch advice names
// (an SGE's length is 32 bits).
const maxAdviseSGE = 1 << 30

// Prefetch makes the first n bytes of the buffer present and writable
// through the MR: ibv_advise_mr(IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
// IBV_ADVISE_MR_FLAG_FLUSH), which returns once the pages are mapped.
func (b *Buffer) Prefetch(dev *softrdma.Device, pd *softrdma.PD, n int) error {
	var sgl []softrdma.SGE
	for off := 0; off < n; off += maxAdviseSGE {
		k := min(n-off, maxAdviseSGE)
		sgl = append(sgl, softrdma.SGE{Addr: b.Base + uint64(off), Length: uint32(k), LKey: b.MR.LKey()})
	}
	return dev.AdviseMR(pd, softrdma.AdvisePrefetchWrite, softrdma.AdviseFlagFlush, sgl)
}

// Free returns the buffer to the address space; its MR must be
// deregistered first.
func (b *Buffer) Free() error {
	if b == nil || b.Mem == nil {
		return nil
	}
	err := b.as.Free(hostmem.AddrOf(b.Mem), len(b.Mem))
	b.Mem = nil
	return err
}

// Report returns the ODP report of the buffer: how it is registered, its
// MR's counters and fault latency, and dev's budget.
func (b *Buffer) Report(dev *softrdma.Device) *report.ODPJSON {
	st := b.MR.ODPStats()
	r := &report.ODPJSON{
		Implicit: b.MR.Implicit(), Prefetch: b.o.Prefetch,
		FaultPolicy: b.o.FaultPolicy,
		Bytes:       int64(len(b.Mem)), Pages: int64((len(b.Mem) + hostmem.PageSize - 1) / hostmem.PageSize),

		PageFaults: st.PageFaults, PageFaultsHandled: st.PageFaultsHandled,
		PageInvalidations: st.PageInvalidations, PageInvalidationsHandled: st.PageInvalidationsHandled,
		PagePrefetch: st.PagePrefetch, Evictions: st.Evictions,

		Faults: st.Faults, FaultP50us: st.FaultP50us, FaultP99us: st.FaultP99us, FaultMaxus: st.FaultMaxus,
	}
	if r.FaultPolicy == "" {
		r.FaultPolicy = softrdma.FaultSync.String()
	}
	if bg := dev.ODPBudget(); bg != nil {
		r.BudgetPages, r.PeakPresent = bg.Limit(), bg.Peak()
	}
	return r
}
