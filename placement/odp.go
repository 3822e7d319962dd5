package placement

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/internal/operr"
	"github.com/softrdma/softrdma/pagetable"
	"github.com/softrdma/softrdma/stag"
)

// Errors of demand paging. They wrap the errno that libibverbs returns for
// the same condition, so errors.Is(err, unix.EFAULT) works.
var (
	// ErrFault is EFAULT (ibv_advise_mr(3)): a range outside the MR, an
	// lkey that is invalid, not an ODP MR's, or without the write access
	// PREFETCH_WRITE needs.
	ErrFault error = unix.EFAULT
	// ErrNoODP is EOPNOTSUPP (the kernel's ib_check_mr_access for
	// IB_ACCESS_ON_DEMAND on a device without IBK_ON_DEMAND_PAGING): the
	// device, as configured, does not support on-demand paging.
	ErrNoODP = fmt.Errorf("on-demand paging not supported by this device: %w", unix.EOPNOTSUPP)
)

// Advice is the advice of AdviseMR (enum ibv_advise_mr_advice).
type Advice uint8

// Advice values, as ibv_advise_mr(3) defines them.
const (
	// AdvisePrefetch makes the pages present, readable (IBV_ADVISE_MR_ADVICE_PREFETCH).
	AdvisePrefetch Advice = iota
	// AdvisePrefetchWrite makes them present and writable (..._PREFETCH_WRITE).
	AdvisePrefetchWrite
	// AdvisePrefetchNoFault maps only pages the host already holds,
	// without faulting the others in (..._PREFETCH_NO_FAULT).
	AdvisePrefetchNoFault
)

func (a Advice) String() string {
	switch a {
	case AdvisePrefetch:
		return "PREFETCH"
	case AdvisePrefetchWrite:
		return "PREFETCH_WRITE"
	case AdvisePrefetchNoFault:
		return "PREFETCH_NO_FAULT"
	}
	return fmt.Sprintf("Advice(%d)", uint8(a))
}

// AdviseFlagFlush makes AdviseMR synchronous (IBV_ADVISE_MR_FLAG_FLUSH):
// it returns after the translations are in the table.
const AdviseFlagFlush uint32 = 1 << 0

// ODPStats are an ODP MR's counters with mlx5's names (in pages) and the
// latency of the page faults the data path waited for.
type ODPStats struct {
	pagetable.ODPStats
	// Faults is how many faults (calls of the fault handler, each for a
	// run of pages) the latency figures describe.
	Faults int64
	// Fault latency in µs: the time from the handler's start to the
	// entries' install, as the data path waits for it.
	FaultP50us, FaultP99us, FaultMaxus float64
}

// odpState is what an ODP MR adds to an MR.
type odpState struct {
	t    *pagetable.ODP
	mu   sync.Mutex
	hist *hdrhistogram.Histogram // fault latency, ns
}

// maxFaultNs bounds the histogram: 10 s.
const maxFaultNs = 10_000_000_000

// ODP reports whether the MR is an on-demand one.
func (m *MR) ODP() bool { return m.odp != nil }

// Implicit reports whether the MR is an implicit ODP MR (the whole address
// space).
func (m *MR) Implicit() bool { return m.odp != nil && m.odp.t.Implicit() }

// ODPTable returns the translation table of an ODP MR (nil otherwise), for
// tests and reports.
func (m *MR) ODPTable() *pagetable.ODP {
	if m.odp == nil {
		return nil
	}
	return m.odp.t
}

// ODPStats returns the MR's demand-paging counters (zero for a pinned MR).
func (m *MR) ODPStats() ODPStats {
	if m.odp == nil {
		return ODPStats{}
	}
	s := ODPStats{ODPStats: m.odp.t.Stats()}
	m.odp.mu.Lock()
	h := m.odp.hist
	s.Faults = h.TotalCount()
	if s.Faults > 0 {
		s.FaultP50us = float64(h.ValueAtQuantile(50)) / 1e3
		s.FaultP99us = float64(h.ValueAtQuantile(99)) / 1e3
		s.FaultMaxus = float64(h.Max()) / 1e3
	}
	m.odp.mu.Unlock()
	return s
}

// fault runs the table's fault handler on [iova, iova+n) and records its
// latency.
func (m *MR) fault(iova, n uint64, fl pagetable.FaultFlags) error {
	start := time.Now()
	_, err := m.odp.t.Fault(iova, n, fl)
	d := time.Since(start).Nanoseconds()
	if fl&pagetable.FaultPrefetch == 0 {
		m.odp.mu.Lock()
		_ = m.odp.hist.RecordValue(min(max(d, 1), maxFaultNs))
		m.odp.mu.Unlock()
	}
	return err
}

// copyIn and copyOut translate through the MR's table, pinned or ODP.
func (m *MR) copyIn(iova uint64, src []byte) pagetable.Result {
	if m.odp != nil {
		_, r := m.odp.t.CopyIn(iova, src)
		return odpResult(r)
	}
	_, r := m.table.CopyIn(iova, src)
	return r
}

func (m *MR) copyOut(iova uint64, dst []byte) pagetable.Result {
	if m.odp != nil {
		_, r := m.odp.t.CopyOut(iova, dst)
		return odpResult(r)
	}
	_, r := m.table.CopyOut(iova, dst)
	return r
}

// odpResult maps an ODP table's NoPermission (present, but not writable
// yet: faulted in for reading) to NotPresent: a write fault upgrades it.
func odpResult(r pagetable.Result) pagetable.Result {
	if r == pagetable.NoPermission {
		return pagetable.NotPresent
	}
	return r
}

// RegMRAddr registers the host address-space range [addr, addr+length)
// for protection domain pd (ibv_reg_mr with an address and a length). It
// needs AccessOnDemand and Config.AddressSpace: with addr 0 and length
// math.MaxUint64 (ibv_reg_mr's NULL, SIZE_MAX) it registers an implicit
// ODP MR over the whole address space, whose table grows 1 GiB at a time at
// the first fault in each; otherwise an explicit ODP MR over the range,
// which must lie inside the address space (it need not be mapped: a page
// that is not mapped when a peer touches it fails with a remote access
// error). Errors: as RegMR, and ErrInvalid without AccessOnDemand, ErrNoODP
// when the device has no address space or ODP is disabled.
func (e *Engine) RegMRAddr(pd uint32, addr, length uint64, access stag.Access) (*MR, error) {
	if access&stag.AccessOnDemand == 0 {
		return nil, fmt.Errorf("placement: reg MR by address needs ON_DEMAND: %w", ErrInvalid)
	}
	if err := checkAccess(length == 0, access); err != nil {
		return nil, err
	}
	return e.regODP(pd, addr, length, nil, access)
}

// checkAccess makes RegMR's argument checks.
func checkAccess(empty bool, access stag.Access) error {
	switch {
	case empty:
		return fmt.Errorf("placement: reg MR: empty buffer: %w", ErrInvalid)
	case access&^stag.AccessAll != 0:
		return fmt.Errorf("placement: reg MR: unknown access flags %#x: %w", uint32(access&^stag.AccessAll), ErrInvalid)
	case access&(stag.AccessRemoteWrite|stag.AccessRemoteAtomic) != 0 && access&stag.AccessLocalWrite == 0:
		return fmt.Errorf("placement: reg MR: %v without LOCAL_WRITE: %w", access, ErrInvalid)
	case access&stag.AccessZeroBased != 0:
		return fmt.Errorf("placement: reg MR: ZERO_BASED: %w", ErrNotSupported)
	}
	return nil
}

// regODP registers an ODP MR; buf is the application's view when the
// caller has one (RegMR).
func (e *Engine) regODP(pd uint32, addr, length uint64, buf []byte, access stag.Access) (*MR, error) {
	as := e.asSet.Load()
	if as == nil || e.noODP {
		return nil, fmt.Errorf("placement: reg MR: ON_DEMAND: %w", ErrNoODP)
	}
	writable := access&stag.AccessLocalWrite != 0
	var (
		t   *pagetable.ODP
		err error
	)
	if addr == 0 && length == math.MaxUint64 {
		t, err = pagetable.NewImplicit(as, writable, e.budget)
	} else {
		t, err = pagetable.NewODP(as, addr, length, writable, e.budget)
	}
	if err != nil {
		return nil, fmt.Errorf("placement: reg MR: %w: %w", err, ErrInvalid)
	}
	mr := &MR{buf: buf, eng: e, odp: &odpState{t: t, hist: hdrhistogram.New(1, maxFaultNs, 3)}}
	ent, err := e.mrs.Alloc(pd, addr, length, access, mr)
	if err != nil {
		_ = t.Release()
		return nil, operr.Wrap("placement", "reg MR", err)
	}
	mr.setEntry(ent)
	if err := e.mrs.Validate(ent.STag); err != nil {
		panic("placement: a new key cannot be validated: " + err.Error())
	}
	e.reg.add(mr)
	return mr, nil
}

// FaultCursor resolves the page faults of the cursor's next n bytes (the
// packet that Write or Read just refused with WouldFault), inline. It
// returns RemoteAccessErr when a page cannot be faulted in (not mapped in
// the host, or a write to a read-only page) or the key was invalidated
// since the cursor's last packet, OK otherwise; the caller then
// repeats the Write or Read. It holds no copy section while it runs (an
// invalidation of the same pages can proceed) and may block for the
// fault's duration: the `sync` fault policy.
func (e *Engine) FaultCursor(c *Cursor, n uint64) Status {
	s := &c.s
	if s.Entry == nil {
		return OK
	}
	// The caller's reader is quiescent (a bound cursor holds nothing): a
	// counted reference keeps the registration, and so the MR's
	// translation, from changing under the fault (ReregMR, DeregMR).
	if !s.Hold() {
		return RemoteAccessErr // invalidated since the last packet
	}
	defer s.Entry.Release()
	mr := s.Entry.Value
	if mr.odp == nil {
		return OK
	}
	fl := pagetable.FaultFlags(0)
	if s.Write {
		fl = pagetable.FaultWrite
	}
	if n > s.Len-s.Done {
		n = s.Len - s.Done
	}
	if n == 0 {
		return OK
	}
	if err := mr.fault(s.IOVA+s.Done, n, fl); err != nil {
		return RemoteAccessErr
	}
	return OK
}

// FaultRemote resolves, inline, the page faults of [va, va+n) in the ODP MR
// named by rkey (an atomic's word). A key or bounds failure is
// RemoteAccessErr, as is a page that cannot be faulted in; a pinned MR is
// OK at once. Like FaultCursor it makes no system call for the pages: one
// nobody has touched is populated by the kernel in the copy that follows.
func (e *Engine) FaultRemote(pd, rkey uint32, va, n uint64, write bool) Status {
	return e.faultRemote(pd, 0, rkey, va, n, write, 0)
}

// FaultRemoteQP is FaultRemote for a request received by QP qpn: a type 2
// memory window's rkey resolves only for the QP it is bound to (AtomicQP).
func (e *Engine) FaultRemoteQP(pd, qpn, rkey uint32, va, n uint64, write bool) Status {
	return e.faultRemote(pd, qpn, rkey, va, n, write, 0)
}

// faultRemote is FaultRemote with extra fault flags (FaultPopulate for the
// background).
func (e *Engine) faultRemote(pd, qpn, rkey uint32, va, n uint64, write bool, fl pagetable.FaultFlags) Status {
	if write {
		fl |= pagetable.FaultWrite
	}
	ent, suspended := e.remoteEntry(pd, qpn, rkey, va, n, write)
	if ent == nil {
		if suspended {
			return OK // nothing to fault now: the operation itself finds the suspension
		}
		return RemoteAccessErr
	}
	defer ent.Release()
	mr := ent.Value
	if mr.odp == nil || n == 0 {
		return OK
	}
	if err := mr.fault(va, n, fl); err != nil {
		return RemoteAccessErr
	}
	return OK
}

// FaultAsync is FaultRemote in the background, best effort: the
// responder's `rnr` policy answers an RNR NAK and lets the fault run while
// the requester backs off (the rest of a message after an RNR NAK). It
// populates the pages nobody has touched yet (FaultPopulate), so that the
// retried packet's copy does not take the kernel's page fault on the
// receive loop. At most maxAsyncFaults run at once; beyond that the
// request is not started (the retried packet faults again) and false is
// returned, for the caller to count (odp_async_faults_busy).
func (e *Engine) FaultAsync(pd, rkey uint32, va, n uint64, write bool) bool {
	return e.FaultAsyncQP(pd, 0, rkey, va, n, write)
}

// FaultAsyncQP is FaultAsync for a request received by QP qpn (see
// FaultRemoteQP).
func (e *Engine) FaultAsyncQP(pd, qpn, rkey uint32, va, n uint64, write bool) bool {
	select {
	case e.asyncSem <- struct{}{}:
	default:
		return false
	}
	go func() {
		defer func() { <-e.asyncSem }()
		e.faultRemote(pd, qpn, rkey, va, n, write, pagetable.FaultPopulate)
	}()
	return true
}

// faultHeldAsync faults [va, va+n) of the ODP MR of ent in the background
// (FaultPopulate, FaultWrite for a write) and then releases ent, a counted
// reference the caller took for it; false, with ent still held, when
// maxAsyncFaults faults are running already.
func (e *Engine) faultHeldAsync(ent *stag.Entry[*MR], va, n uint64, write bool) bool {
	select {
	case e.asyncSem <- struct{}{}:
	default:
		return false
	}
	fl := pagetable.FaultPopulate
	if write {
		fl |= pagetable.FaultWrite
	}
	go func() {
		defer func() { <-e.asyncSem }()
		defer ent.Release()
		_ = ent.Value.fault(va, n, fl)
	}()
	return true
}

// FaultCursorAsync starts, in the background, the fault of the next n
// bytes of the cursor's message (at most what is left of it) in the MR the
// cursor holds — a message through a memory window included; pd, the QP's
// protection domain, is not needed for it. It returns WouldFault when the
// fault was started, or when maxAsyncFaults faults are running already
// (busy true: none was started, and the retried packet faults again), and
// RemoteAccessErr when the pages of the packet (the next pkt bytes) cannot
// be faulted in at all (not mapped in the host, or read-only for a write),
// checked without blocking.
func (e *Engine) FaultCursorAsync(c *Cursor, pkt, n uint64, pd uint32) (st Status, busy bool) {
	s := &c.s
	if s.Entry == nil || s.Entry.Value.odp == nil {
		return RemoteAccessErr, false
	}
	pkt, n = min(pkt, s.Len-s.Done), min(max(n, pkt), s.Len-s.Done)
	if pkt > 0 && !s.Entry.Value.odp.t.Resolvable(s.IOVA+s.Done, pkt, s.Write) {
		return RemoteAccessErr, false
	}
	// The fault goes to the MR the cursor holds, under a counted
	// reference (Hold, as FaultCursor): resolving the MR's own key as an
	// R_Key again would refuse a message through a memory window, whose
	// MR needs no remote rights of its own, and no page would ever be
	// faulted in for its retries.
	if n > 0 && s.Hold() && !e.faultHeldAsync(s.Entry, s.IOVA+s.Done, n, s.Write) {
		s.Entry.Release()
		return WouldFault, true
	}
	return WouldFault, false
}

// ResolvableRemote is Resolvable for the ODP MR named by rkey (an atomic's
// word): false when the key, the range or the host mapping fails.
func (e *Engine) ResolvableRemote(pd, rkey uint32, va, n uint64, write bool) bool {
	return e.ResolvableRemoteQP(pd, 0, rkey, va, n, write)
}

// ResolvableRemoteQP is ResolvableRemote for a request received by QP qpn
// (see FaultRemoteQP).
func (e *Engine) ResolvableRemoteQP(pd, qpn, rkey uint32, va, n uint64, write bool) bool {
	ent, suspended := e.remoteEntry(pd, qpn, rkey, va, n, write)
	if ent == nil {
		return suspended // the retry finds the suspension
	}
	defer ent.Release()
	if ent.Value.odp == nil {
		return false
	}
	return ent.Value.odp.t.Resolvable(va, n, write)
}

// remoteEntry resolves rkey for a fault of [va, va+n) (n > 0) by a remote
// access that writes (an RDMA WRITE or an atomic) or reads, and returns
// the entry of the MR it places into with a counted reference (Release
// it), or nil: a remote access error, or (suspended) a memory window onto
// an MR whose placement is suspended. An MR's own key is checked for the
// rights and the range, not for a suspension; a memory window's key gets
// the checks of an access through it (Open: the window's key, PD, rights,
// state and range, and for a type 2 window that qpn is its QP) and
// yields its MR's entry.
func (e *Engine) remoteEntry(pd, qpn, rkey uint32, va, n uint64, write bool) (ent *stag.Entry[*MR], suspended bool) {
	ent, r := e.mrs.Acquire(pd, stag.STag(rkey), 0)
	if r == stag.OK {
		need := stag.AccessRemoteRead
		if write {
			need = stag.AccessRemoteWrite
		}
		if ent.Target == nil && (ent.Access&need != 0 || write && ent.Access&stag.AccessRemoteAtomic != 0) &&
			ent.CheckRange(va, n) == stag.OK {
			return ent, false
		}
		ent.Release()
		return nil, false
	}
	if r != stag.AccessDenied && r != stag.QPMismatch || n == 0 {
		return nil, false
	}
	// Acquire refuses a window's key for an access without remote rights:
	// make the checks of an access through it.
	needs := [2]stag.Access{stag.AccessRemoteRead}
	if write {
		needs = [2]stag.Access{stag.AccessRemoteWrite, stag.AccessRemoteAtomic}
	}
	for _, need := range needs {
		if need == 0 {
			break
		}
		var sp stag.Span[*MR]
		sp.QP = qpn
		switch e.mrs.Open(&sp, pd, stag.STag(rkey), need, va, n) {
		case stag.OK:
			return sp.Entry, false // the Span's counted reference, released by the caller
		case stag.Suspended:
			return nil, true
		}
	}
	return nil, false
}

// maxAsyncFaults bounds the background faults in flight.
const maxAsyncFaults = 16

// AdviseMR gives advice about ranges of ODP MRs of pd (ibv_advise_mr): each
// SGE names a range of the MR whose lkey it carries. PREFETCH and
// PREFETCH_WRITE make the pages present (readable, or writable),
// populating those the host has never touched (FaultPopulate);
// PREFETCH_NO_FAULT maps only the pages the host holds. With
// AdviseFlagFlush the call returns when the translations are installed;
// without it the work runs in the background
// and AdviseMR returns at once (best effort: a page that cannot be faulted
// in is skipped). Prefetched pages count as page_prefetch.
//
// Errors, as ibv_advise_mr(3): EINVAL (ErrInvalid) for unknown flags or
// advice, or an empty SGL; EFAULT (ErrFault) for an lkey that is invalid,
// of another PD, of an MR that is not ODP, without LOCAL_WRITE for
// PREFETCH_WRITE, or a range outside the MR; and, with the flush flag, the
// fault's own failure (a range not mapped in the host) as EFAULT.
func (e *Engine) AdviseMR(pd uint32, advice Advice, flags uint32, sgl []SGE) error {
	if flags&^AdviseFlagFlush != 0 {
		return fmt.Errorf("placement: advise MR: flags %#x: %w", flags, ErrInvalid)
	}
	if advice > AdvisePrefetchNoFault {
		return fmt.Errorf("placement: advise MR: advice %d: %w", advice, ErrInvalid)
	}
	if len(sgl) == 0 {
		return fmt.Errorf("placement: advise MR: empty SG list: %w", ErrInvalid)
	}
	fl := pagetable.FaultPrefetch
	switch advice {
	case AdvisePrefetch:
		fl |= pagetable.FaultPopulate
	case AdvisePrefetchWrite:
		fl |= pagetable.FaultWrite | pagetable.FaultPopulate
	case AdvisePrefetchNoFault:
		fl |= pagetable.FaultNoPopulate
	}
	type job struct {
		mr      *MR
		ent     *stag.Entry[*MR]
		va, len uint64
	}
	jobs := make([]job, 0, len(sgl))
	release := func() {
		for _, j := range jobs {
			j.ent.Release()
		}
	}
	for i, s := range sgl {
		ent, r := e.mrs.Acquire(pd, stag.STag(s.LKey), 0)
		if r != stag.OK {
			release()
			return fmt.Errorf("placement: advise MR: SGE %d: lkey %#x: %v: %w", i, s.LKey, r, ErrFault)
		}
		jobs = append(jobs, job{ent.Value, ent, s.Addr, uint64(s.Length)})
		switch {
		case ent.Value.odp == nil:
			release()
			return fmt.Errorf("placement: advise MR: SGE %d: lkey %#x is not an ODP MR: %w", i, s.LKey, ErrFault)
		case advice == AdvisePrefetchWrite && ent.Access&stag.AccessLocalWrite == 0:
			release()
			return fmt.Errorf("placement: advise MR: SGE %d: PREFETCH_WRITE on an MR without LOCAL_WRITE: %w", i, ErrFault)
		case s.Length == 0 || ent.CheckRange(s.Addr, uint64(s.Length)) != stag.OK:
			release()
			return fmt.Errorf("placement: advise MR: SGE %d: [%#x, +%d) outside the MR: %w", i, s.Addr, s.Length, ErrFault)
		}
	}
	run := func() error {
		defer release()
		var errs []error
		for _, j := range jobs {
			if _, err := j.mr.odp.t.Fault(j.va, j.len, fl); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("placement: advise MR: %w: %w", err, ErrFault)
		}
		return nil
	}
	if flags&AdviseFlagFlush != 0 {
		return run()
	}
	go func() { _ = run() }()
	return nil
}

// SetAddressSpace sets the host address space ODP MRs are registered on,
// once (an error if one is set already).
func (e *Engine) SetAddressSpace(as *hostmem.AddressSpace) error {
	if !e.asSet.CompareAndSwap(nil, as) {
		return errors.New("placement: the address space is already set")
	}
	return nil
}

// AddressSpace returns the host address space ODP MRs are registered on
// (nil: none configured).
func (e *Engine) AddressSpace() *hostmem.AddressSpace { return e.asSet.Load() }

// Budget returns the ODP page budget shared by the device's ODP MRs.
func (e *Engine) Budget() *pagetable.Budget { return e.budget }

// atomicODP executes an atomic on an ODP MR's word (in the copy section, so
// that an invalidation waits for it).
func atomicODP(t *pagetable.ODP, va uint64, op AtomicOp, swapAdd, compare uint64) (uint64, pagetable.Result) {
	v, r := t.Atomic64(va, func(p *uint64) uint64 { return atomicOn(p, op, swapAdd, compare) })
	return v, odpResult(r)
}
