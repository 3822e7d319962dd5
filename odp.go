package softrdma

import (
	"fmt"
	"math"
	"sync"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/internal/operr"
	"github.com/softrdma/softrdma/pagetable"
	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/transport"
)

// Profile is a device profile: which memory-management features the
// emulated device has, after known hardware.
type Profile string

// Device profiles.
const (
	// ProfileODP is the default: on-demand paging (explicit and
	// implicit), as mlx5 offers it.
	ProfileODP Profile = "odp"
	// ProfileT3 emulates a NIC without on-demand paging that must pause a
	// whole PD to remap (Chelsio T3).
	ProfileT3 Profile = "t3"
	// ProfileCoarse emulates a NIC without on-demand paging that can only
	// pause all of its traffic.
	ProfileCoarse Profile = "coarse"
)

func (p Profile) valid() bool {
	return p == "" || p == ProfileODP || p == ProfileT3 || p == ProfileCoarse
}

func (p Profile) odp() bool { return p == "" || p == ProfileODP }

// FaultPolicy is how the responder handles a page fault on an ODP MR:
// FaultSync (inline, as rxe) or FaultRNR (an RNR NAK and a background
// fault, as mlx5). See transport.FaultPolicy.
type FaultPolicy = transport.FaultPolicy

// Fault policies.
const (
	FaultSync = transport.FaultSync
	FaultRNR  = transport.FaultRNR
)

// ParseFaultPolicy parses "sync" or "rnr".
func ParseFaultPolicy(s string) (FaultPolicy, error) {
	switch s {
	case "", "sync":
		return FaultSync, nil
	case "rnr":
		return FaultRNR, nil
	}
	return 0, fmt.Errorf("softrdma: fault policy %q: want sync or rnr", s)
}

// Advice is ibv_advise_mr's advice (placement.Advice).
type Advice = placement.Advice

// Advice values and flags (ibv_advise_mr(3)).
const (
	AdvisePrefetch        = placement.AdvisePrefetch
	AdvisePrefetchWrite   = placement.AdvisePrefetchWrite
	AdvisePrefetchNoFault = placement.AdvisePrefetchNoFault
	AdviseFlagFlush       = placement.AdviseFlagFlush
)

// ODPStats are an ODP MR's counters (mlx5's names) and fault latency.
type ODPStats = placement.ODPStats

// Errors of demand paging: ErrNoODP is EOPNOTSUPP (ODP registration on a
// device or profile without it), ErrFault is EFAULT (ibv_advise_mr(3)).
var (
	ErrNoODP = placement.ErrNoODP
	ErrFault = placement.ErrFault
)

// ODPGeneralCaps are ibv_odp_caps.general_caps bits.
type ODPGeneralCaps uint64

// General ODP capabilities (enum ibv_odp_general_caps).
const (
	ODPSupport         ODPGeneralCaps = 1 << 0 // IBV_ODP_SUPPORT
	ODPSupportImplicit ODPGeneralCaps = 1 << 1 // IBV_ODP_SUPPORT_IMPLICIT
)

// ODPTransportCaps are the per-transport bits of ibv_odp_caps
// (enum ibv_odp_transport_cap_bits).
type ODPTransportCaps uint32

// Per-transport ODP capabilities.
const (
	ODPSupportSend    ODPTransportCaps = 1 << 0 // IBV_ODP_SUPPORT_SEND
	ODPSupportRecv    ODPTransportCaps = 1 << 1 // IBV_ODP_SUPPORT_RECV
	ODPSupportWrite   ODPTransportCaps = 1 << 2 // IBV_ODP_SUPPORT_WRITE
	ODPSupportRead    ODPTransportCaps = 1 << 3 // IBV_ODP_SUPPORT_READ
	ODPSupportAtomic  ODPTransportCaps = 1 << 4 // IBV_ODP_SUPPORT_ATOMIC
	ODPSupportSRQRecv ODPTransportCaps = 1 << 5 // IBV_ODP_SUPPORT_SRQ_RECV
)

// ODPCaps is struct ibv_odp_caps (ibv_query_device_ex).
type ODPCaps struct {
	GeneralCaps ODPGeneralCaps
	RCODPCaps   ODPTransportCaps
	UCODPCaps   ODPTransportCaps
	UDODPCaps   ODPTransportCaps
}

// odpCaps returns the ODP capabilities of a profile: RC supports every
// operation on ODP MRs; UC and UD QPs do not exist yet.
func (p Profile) odpCaps() ODPCaps {
	if !p.odp() {
		return ODPCaps{}
	}
	return ODPCaps{
		GeneralCaps: ODPSupport | ODPSupportImplicit,
		RCODPCaps:   ODPSupportSend | ODPSupportRecv | ODPSupportWrite | ODPSupportRead | ODPSupportAtomic,
	}
}

// odpState is the device's lazily created host address space.
type odpState struct {
	mu  sync.Mutex
	as  *hostmem.AddressSpace
	own bool // created by the device: closed by Close
}

// AddressSpace returns the host address space that the device's ODP MRs
// are registered on: Config.AddressSpace, or one the device creates at the
// first call (hostmem.DefaultSize of address space, reserved, not
// committed) and closes with the device. Allocate ODP memory from it
// (Alloc, AllocAt) and register it with RegMR and AccessOnDemand (or
// pinned: such MRs can be remapped). Errors: the reservation fails.
func (d *Device) AddressSpace() (*hostmem.AddressSpace, error) {
	d.odp.mu.Lock()
	defer d.odp.mu.Unlock()
	if d.odp.as != nil {
		return d.odp.as, nil
	}
	as, err := hostmem.NewAddressSpace(hostmem.Config{})
	if err != nil {
		return nil, operr.Wrap("softrdma", "address space", err)
	}
	if err := d.place.SetAddressSpace(as); err != nil {
		_ = as.Close()
		return nil, operr.Wrap("softrdma", "address space", err)
	}
	d.odp.as, d.odp.own = as, true
	return as, nil
}

// ODPBudget returns the device's ODP page budget (Config.ODPBudget): its
// limit, the pages present, their peak and the evictions.
func (d *Device) ODPBudget() *pagetable.Budget { return d.place.Budget() }

// RegMRImplicit registers an implicit ODP MR in pd: the whole address
// space (ibv_reg_mr(pd, NULL, SIZE_MAX, access | IBV_ACCESS_ON_DEMAND)),
// its Addr 0 and Length 2^64-1; any address of the device's address space
// may be named through its keys, and its table grows 1 GiB at a time as
// pages are first touched. access must include AccessOnDemand. Errors: as
// RegMR; ErrNoODP on a profile without ODP.
func (d *Device) RegMRImplicit(pd *PD, access Access) (*MR, error) {
	return d.RegMRAddr(pd, 0, math.MaxUint64, access)
}

// RegMRAddr registers [addr, addr+length) of the device's address space
// as an ODP MR (ibv_reg_mr with an address): access must include
// AccessOnDemand; addr 0 with length math.MaxUint64 is an implicit MR.
// The range need not be allocated yet. Errors: as RegMR; ErrNoODP on a
// profile without ODP; an invalid-argument error for a range outside the
// address space.
func (d *Device) RegMRAddr(pd *PD, addr, length uint64, access Access) (*MR, error) {
	release, err := d.usePD(pd)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := d.checkReg(pd, access); err != nil {
		return nil, err
	}
	if _, err := d.AddressSpace(); err != nil {
		return nil, operr.Wrap("softrdma", "reg MR", err)
	}
	mr, err := d.place.RegMRAddr(pd.id, addr, length, access)
	if err != nil {
		return nil, operr.Wrap("softrdma", "reg MR", err)
	}
	return mr, nil
}

// AdviseMR gives advice about ranges of ODP MRs (ibv_advise_mr): each SGE
// names a range of the ODP MR of pd whose lkey it carries. advice is
// AdvisePrefetch, AdvisePrefetchWrite or AdvisePrefetchNoFault; flags 0
// or AdviseFlagFlush (synchronous). Errors, as ibv_advise_mr(3): EINVAL
// for a bad PD, flags or advice; EFAULT (ErrFault) for an invalid lkey, a
// pinned MR, PREFETCH_WRITE on an MR without LOCAL_WRITE, or a range
// outside the MR.
func (d *Device) AdviseMR(pd *PD, advice Advice, flags uint32, sgl []SGE) error {
	release, err := d.usePD(pd)
	if err != nil {
		return operr.Wrap("softrdma", "advise MR", fmt.Errorf("%w: %w", err, placement.ErrInvalid))
	}
	defer release()
	if err := d.place.AdviseMR(pd.id, advice, flags, sgl); err != nil {
		return operr.Wrap("softrdma", "advise MR", err)
	}
	return nil
}
