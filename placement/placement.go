package placement

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/internal/operr"
	"github.com/softrdma/softrdma/pagetable"
	"github.com/softrdma/softrdma/stag"
)

// Errors of the control path (registration).
var (
	// ErrInvalid is EINVAL: the arguments break a verbs rule.
	ErrInvalid error = unix.EINVAL
	// ErrNotSupported is EOPNOTSUPP: the request is valid but not
	// implemented yet.
	ErrNotSupported error = unix.EOPNOTSUPP
	// ErrDeregistered: the MR was already deregistered.
	ErrDeregistered = errors.New("placement: MR already deregistered")
)

// Config configures an Engine.
type Config struct {
	// PinLimit bounds the bytes the device may pin (whole pages; overlapping
	// registrations count twice, as the kernel's pinned_vm does). 0 applies
	// the kernel's rule instead: RLIMIT_MEMLOCK for the whole process,
	// unless the process has CAP_IPC_LOCK.
	PinLimit int64
	// MaxMRs bounds the key table (0: 2^24-1, every index an STag can name).
	MaxMRs uint32
	// AddressSpace is the host address space that ODP MRs are registered
	// on (nil: ODP registrations fail with ErrNoODP).
	AddressSpace *hostmem.AddressSpace
	// ODPBudget bounds the bytes that the ODP MRs of the device hold
	// present at once (rounded down to pages, at least
	// pagetable.MinBudgetPages); over it the least recently used pages
	// are evicted. 0: unlimited.
	ODPBudget int64
	// NoODP disables on-demand paging (a device profile without it).
	NoODP bool
}

// Engine is the placement engine of one device: its key table, pin
// account and address space.
type Engine struct {
	// mrs is embedded rather than pointed to: a lookup then starts with
	// the directory word, one dependent load less, which counts after a
	// large copy (see docs/memory.md, "Measured").
	mrs   stag.Table[*MR]
	pins  *hostmem.PinAccount
	space hostmem.Space

	// Demand paging.
	asSet    atomic.Pointer[hostmem.AddressSpace]
	reg      registry
	life     lifecycle // FRWR, windows, re-registration (mw.go)
	budget   *pagetable.Budget
	noODP    bool
	asyncSem chan struct{}
}

// New returns an engine.
func New(cfg Config) *Engine {
	e := &Engine{pins: hostmem.NewPinAccount(cfg.PinLimit), noODP: cfg.NoODP,
		budget: pagetable.NewBudget(cfg.ODPBudget), asyncSem: make(chan struct{}, maxAsyncFaults)}
	if cfg.AddressSpace != nil {
		e.asSet.Store(cfg.AddressSpace)
	}
	e.mrs.Init(cfg.MaxMRs)
	return e
}

// PinnedBytes returns the bytes the device has pinned.
func (e *Engine) PinnedBytes() int64 { return e.pins.Pinned() }

// Pins returns the device's pin account (its limit can be changed at run
// time).
func (e *Engine) Pins() *hostmem.PinAccount { return e.pins }

// PinLimit returns the pin limit in force (-1: none); see Config.PinLimit.
func (e *Engine) PinLimit() int64 { return e.pins.Limit() }

// Space returns the device's address space (the memfd buffers whose pages
// the NIC reaches through its own mapping).
func (e *Engine) Space() *hostmem.Space { return &e.space }

// HostAlloc allocates a memfd-backed buffer shared by the application and
// the device and registers it in the device's Space: MRs registered on its
// Bytes() are translated to its NIC mapping. Free it with Buffer.Free after
// deregistering its MRs.
func (e *Engine) HostAlloc(size int) (*hostmem.Buffer, error) {
	b, err := hostmem.Alloc(size)
	if err != nil {
		return nil, err
	}
	if err := e.space.Register(b); err != nil {
		_ = b.Free()
		return nil, err
	}
	return b, nil
}

// MR is a registered memory region (ibv_mr).
type MR struct {
	// key is entry's STag, kept here: one dependent load less. Both are
	// atomics: a REG_MR (on the send worker) or ReregMR changes them while
	// the application may read LKey, RKey, Addr... (ibv_mr's fields).
	key   atomic.Uint32                   // stag.STag
	entry atomic.Pointer[stag.Entry[*MR]] // key table entry; its Value is this MR
	table *pagetable.Table                // translation of a pinned region
	odp   *odpState                       // translation of an ODP region (then table is nil)
	buf   []byte                          // the registered bytes, kept referenced
	dead  atomic.Bool                     // DeregMR has started
	eng   *Engine
	adv   advertised // QPs the rkey was declared advertised to
	life  mrLife     // FRWR state, windows bound (mw.go); guarded by eng.life.mu
}

// stag returns the MR's current key.
func (m *MR) stag() stag.STag { return stag.STag(m.key.Load()) }

// ent returns the MR's current key table entry.
func (m *MR) ent() *stag.Entry[*MR] { return m.entry.Load() }

// setEntry makes ent the MR's registration (entry and key).
func (m *MR) setEntry(ent *stag.Entry[*MR]) {
	m.entry.Store(ent)
	m.key.Store(uint32(ent.STag))
}

// LKey returns the local key (ibv_mr.lkey).
func (m *MR) LKey() uint32 { return m.key.Load() }

// RKey returns the remote key (ibv_mr.rkey). It equals the local key, as on
// mlx5; a region without remote rights fails every remote access on the
// access check.
func (m *MR) RKey() uint32 { return m.key.Load() }

// Addr returns the region's I/O virtual address: the address of its first
// byte (ibv_mr.addr).
func (m *MR) Addr() uint64 { return m.ent().IOVA }

// Len returns the region's length in bytes (ibv_mr.length), at most
// math.MaxInt (an implicit ODP MR's length is 2^64-1; see Length).
func (m *MR) Len() int { return int(min(m.ent().Length, math.MaxInt)) }

// Length returns the region's length in bytes as ibv_mr.length holds it
// (SIZE_MAX for an implicit ODP MR).
func (m *MR) Length() uint64 { return m.ent().Length }

// Access returns the rights the region was registered with.
func (m *MR) Access() stag.Access { return m.ent().Access }

// PD returns the protection domain the region belongs to.
func (m *MR) PD() uint32 { return m.ent().PD }

// Bytes returns the registered memory (the application's view).
func (m *MR) Bytes() []byte { return m.buf }

// RegMR registers buf for protection domain pd with the given rights, as
// ibv_reg_mr: the pages are prefaulted and pinned (charged to the pin
// limit), the translation table is filled, and a fresh key is published.
// The region's IOVA is the address of buf[0].
//
// It fails with ErrInvalid for an empty buffer, unknown access bits, or
// REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE (IBTA 10.6.3.1; the
// kernel's ib_check_mr_access returns EINVAL), with ErrNotSupported for
// ZERO_BASED, and with an error wrapping hostmem.ErrPinLimit when the pin
// limit would be exceeded.
//
// With AccessOnDemand nothing is pinned or populated: buf must lie in the
// device's host address space (Config.AddressSpace; ErrInvalid otherwise,
// ErrNoODP when there is none or ODP is disabled) and its pages are
// faulted in at their first use (see RegMRAddr).
func (e *Engine) RegMR(pd uint32, buf []byte, access stag.Access) (*MR, error) {
	if err := checkAccess(len(buf) == 0, access); err != nil {
		return nil, err
	}
	if access&stag.AccessOnDemand != 0 {
		return e.regODP(pd, hostmem.AddrOf(buf), uint64(len(buf)), buf, access)
	}
	iova := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	var (
		table *pagetable.Table
		err   error
	)
	if as := e.asSet.Load(); as != nil && as.Bounds().Start <= iova && iova+uint64(len(buf)) <= as.Bounds().End {
		// Memory of the host address space: pin its frames, so that the
		// region can be remapped.
		table, err = pagetable.NewPinnedFrames(as, e.pins, buf, access&stag.AccessLocalWrite != 0)
	} else {
		table, err = pagetable.NewPinned(iova, buf, &e.space, e.pins, access&stag.AccessLocalWrite != 0)
	}
	if err != nil {
		return nil, operr.Wrap("placement", "reg MR", err)
	}
	mr := &MR{table: table, buf: buf, eng: e}
	ent, err := e.mrs.Alloc(pd, iova, uint64(len(buf)), access, mr)
	if err != nil {
		_ = table.Release()
		return nil, operr.Wrap("placement", "reg MR", err)
	}
	mr.setEntry(ent)
	// A pinned region with contiguous frames (always, for a Go slice or a
	// memfd buffer) is mapped linearly by its key, so that the data path
	// translates without reading the table.
	if flat, writable := table.Linear(); flat != nil {
		if err := e.mrs.SetLinear(ent.STag, &flat[0], writable); err != nil {
			panic("placement: the key of a new MR is missing: " + err.Error())
		}
	}
	// The entry was published invalid; it becomes usable only now that the
	// MR is complete.
	if err := e.mrs.Validate(ent.STag); err != nil {
		panic("placement: a new key cannot be validated: " + err.Error())
	}
	e.reg.add(mr)
	return mr, nil
}

// DeregMR deregisters mr (ibv_dereg_mr): it invalidates the key, so that no
// new access starts and the next packet of every message in progress fails,
// then waits until the placements in flight have ended, frees the key's
// index for reuse under a new key, and unpins the pages. In flight are: the
// copies of every Reader that was placing when the key was invalidated
// (DeregMR waits until each has quiesced), the Gather, Scatter and Atomic
// calls in progress, and the messages of cursors not bound to a Reader,
// from Begin to End. The transport must End the unbound cursors of QPs that
// stop (error state, destroy), or DeregMR waits for them. An invalidation
// or re-registration of the MR in progress is waited for first. Errors:
// an MR of another engine (EINVAL); ErrMWBound (EINVAL) while memory
// windows are bound to it; ErrRemapInProgress (ErrBusy, EBUSY) from
// PrepareRemap to the Remapping's Release or Abort (the remap is the
// caller's to end: DeregMR does not wait for it, ReregMR refuses too);
// ErrDeregistered a second time. On these errors the MR stays registered.
func (e *Engine) DeregMR(mr *MR) error {
	if mr == nil || mr.eng != e {
		return fmt.Errorf("placement: dereg MR: not a region of this device: %w", ErrInvalid)
	}
	if err := e.beginDereg(mr); err != nil {
		return err
	}
	key := mr.ent().STag
	e.reg.remove(mr)
	if err := e.mrs.Invalidate(key); err != nil {
		panic("placement: the key of a live MR is missing: " + err.Error())
	}
	// Readers first (a grace period), then the counted references.
	e.mrs.Synchronize()
	mr.ent().Drain()
	if err := e.mrs.Free(key); err != nil {
		panic("placement: the key of a live MR is missing: " + err.Error())
	}
	var err error
	if mr.odp != nil {
		err = mr.odp.t.Release()
	} else if mr.table != nil { // nil: a fast-registration MR never mapped
		err = mr.table.Release()
	}
	if err != nil {
		return operr.Wrap("placement", "dereg MR", err)
	}
	return nil
}

// Status is the outcome of a data-path call. See the package documentation
// for what the transport sends and completes with for each.
type Status uint8

// Outcomes.
const (
	OK Status = iota
	// RemoteAccessErr: an R_Key violation — unknown, stale or forged key,
	// another PD's key, missing right, invalidated region, or a range outside
	// the region. NAK "remote access error".
	RemoteAccessErr
	// InvalidRequest: a payload longer than the RETH's DMA length, a
	// misaligned atomic, an unknown atomic operation. NAK "invalid request".
	InvalidRequest
	// RemoteOpErr: NAK "remote operational error". Not produced by the
	// calls of this package today: a protection error on the responder's
	// own receive SGL is reported as LocalProtErr and sent as this NAK.
	RemoteOpErr
	// LocalProtErr: an L_Key check failed (key, PD, LOCAL_WRITE, bounds).
	// IBV_WC_LOC_PROT_ERR.
	LocalProtErr
	// LocalLenErr: the data does not fit the SGL. IBV_WC_LOC_LEN_ERR.
	LocalLenErr
	// WouldFault: a page is not present (demand-paged regions, issue 3).
	// Nothing was placed; retry the same call after the fault is served.
	// Pinned regions never return it.
	WouldFault
	// Suspended: placement into the region is paused (Suspend, a remap's
	// critical section). Nothing was placed; hold the packet and retry
	// after Resume, or answer an RNR NAK.
	Suspended
)

var statusNames = [...]string{
	OK:              "ok",
	RemoteAccessErr: "remote access error",
	InvalidRequest:  "invalid request",
	RemoteOpErr:     "remote operational error",
	LocalProtErr:    "local protection error",
	LocalLenErr:     "local length error",
	WouldFault:      "would fault",
	Suspended:       "suspended",
}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "Status(" + strconv.Itoa(int(s)) + ")"
}

// tableStatus maps a translation failure (which a pinned region only meets
// if it is used after release) to a Status, for a remote or a local access.
func tableStatus(r pagetable.Result, remote bool) Status {
	switch r {
	case pagetable.OK:
		return OK
	case pagetable.NotPresent:
		return WouldFault
	case pagetable.Misaligned:
		return InvalidRequest
	}
	if remote {
		return RemoteAccessErr
	}
	return LocalProtErr
}
