package softrdma

import (
	"fmt"

	"github.com/softrdma/softrdma/internal/operr"
	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport"
)

// MR life-cycle operations: fast registration (FRWR), invalidation, memory
// windows and re-registration. See docs/memory.md, "MR life cycle".

// MW is a memory window (struct ibv_mw): a remote-access window with its
// own rkey onto a range of an MR (IBTA 10.6.7). RKey() is its rkey, Type()
// its type.
type MW = placement.MW

// MWType is a memory window type (enum ibv_mw_type).
type MWType = placement.MWType

// Memory window types.
const (
	MWType1 = placement.MWType1 // bound to the PD; bound, rebound and unbound with QP.BindMW
	MWType2 = placement.MWType2 // bound to one QP by a BIND_MW work request; invalidated by LOCAL_INV or SEND with Invalidate
)

// MWBindInfo is what a bind gives a window (struct ibv_mw_bind_info): MR,
// Addr (the IOVA of the window's first byte, inside the MR), Length in
// bytes (0 unbinds a type 1 window) and Access (AccessRemoteRead,
// AccessRemoteWrite, AccessRemoteAtomic).
type MWBindInfo = placement.BindInfo

// RegWR and MWBind are the fields of REG_MR and BIND_MW work requests
// (SendWR.Reg, SendWR.BindMW).
type (
	RegWR  = transport.RegWR
	MWBind = transport.MWBind
)

// Access flags for memory windows (enum ibv_access_flags).
const (
	AccessMWBind    = stag.AccessMWBind    // an MR that windows may be bound to (C10-73)
	AccessZeroBased = stag.AccessZeroBased // not supported (EOPNOTSUPP)
)

// Work request opcodes of the life-cycle operations (enum ibv_wr_opcode;
// WRRegMR is the kernel's IB_WR_REG_MR: rdma-core has no userspace FRWR).
const (
	WRLocalInv = transport.WRLocalInv // invalidate SendWR.InvRKey (an MR of AllocMR, a type 2 window)
	WRBindMW   = transport.WRBindMW   // bind SendWR.BindMW
	WRRegMR    = transport.WRRegMR    // register SendWR.Reg (FRWR)
)

// Work completion opcodes and status of the life-cycle operations.
const (
	WCLocalInv  = transport.WCLocalInv
	WCBindMW    = transport.WCBindMW
	WCRegMR     = transport.WCRegMR // kernel IB_WC_REG_MR
	WCMWBindErr = transport.WCMWBindErr
)

// Errors of the life-cycle operations, for errors.Is. ErrMWBound (EINVAL,
// the errno rxe returns):
// windows are bound to the MR, which therefore cannot be deregistered,
// re-registered or invalidated. ErrBusy (EBUSY): an invalidation or
// re-registration of the same object is in progress, or its placement is
// suspended (a bind waits for such an operation instead of failing).
var (
	ErrMWBound = placement.ErrMWBound
	ErrBusy    = placement.ErrBusy
	// ErrBadOpcode: a work request's opcode or its fields are not
	// acceptable (e.g. REG_MR without an MR, QP.BindMW of a type 2 window).
	ErrBadOpcode = transport.ErrBadOpcode
)

// IncRKey returns rkey with its key byte (the low 8 bits) incremented and
// its index kept (ibv_inc_rkey): the new key of a REG_MR or of a window
// bind, which makes keys of the earlier registration miss.
func IncRKey(rkey uint32) uint32 {
	return rkey&^0xff | (rkey+1)&0xff
}

// AllocMR allocates a fast-registration MR in pd whose mappings may touch
// up to maxPages 4 KiB pages (the kernel's ib_alloc_mr with
// IB_MR_TYPE_MEM_REG; rdma-core has no userspace equivalent). It has a key
// but no memory and is invalid. For each use: MapMR gives it memory,
// a REG_MR work request (SendWR{Opcode: WRRegMR, Reg: RegWR{MR, Key:
// IncRKey(mr.LKey()), Access}}) registers it under the new key, and
// LOCAL_INV (or a peer's SEND with Invalidate naming its rkey) invalidates
// it again. Errors: ErrBadPD, maxPages outside 1 to
// placement.MaxFastRegPages (EINVAL).
func (d *Device) AllocMR(pd *PD, maxPages int) (*MR, error) {
	release, err := d.usePD(pd)
	if err != nil {
		return nil, err
	}
	defer release()
	mr, err := d.place.AllocMR(pd.id, maxPages)
	if err != nil {
		return nil, operr.Wrap("softrdma", "alloc MR", err)
	}
	return mr, nil
}

// MapMR gives a fast-registration MR the memory buf for its next REG_MR
// (ib_map_mr_sg with one scatter/gather element): its pages are pinned
// (charged to the pin limit) and the MR's IOVA will be the address of
// buf[0]. The MR must be invalid (never registered, or invalidated and the
// invalidation's completion seen). Errors: not an MR of AllocMR, an empty
// buffer, more pages than maxPages (EINVAL); a registered MR (ErrBusy);
// the pin limit.
func (d *Device) MapMR(mr *MR, buf []byte) error {
	if err := d.place.MapMR(mr, buf); err != nil {
		return operr.Wrap("softrdma", "map MR", err)
	}
	return nil
}

// AllocMW allocates an unbound memory window of type typ in pd
// (ibv_alloc_mw). Errors: ErrBadPD, an unknown type (EINVAL).
func (d *Device) AllocMW(pd *PD, typ MWType) (*MW, error) {
	release, err := d.usePD(pd)
	if err != nil {
		return nil, err
	}
	defer release()
	mw, err := d.place.AllocMW(pd.id, typ)
	if err != nil {
		return nil, operr.Wrap("softrdma", "alloc MW", err)
	}
	return mw, nil
}

// DeallocMW deallocates a window (ibv_dealloc_mw); a bound window is
// invalidated first, and DeallocMW returns when no byte is placed through
// it any more. Errors: a window of another device or deallocated (EINVAL).
func (d *Device) DeallocMW(mw *MW) error {
	if err := d.place.DeallocMW(mw); err != nil {
		return operr.Wrap("softrdma", "dealloc MW", err)
	}
	return nil
}

// ReregFlags select what ReregMR changes (enum ibv_rereg_mr_flags).
type ReregFlags = placement.ReregFlags

// Re-registration flags.
const (
	ReregChangeTranslation = placement.ReregChangeTranslation // new memory: buf
	ReregChangePD          = placement.ReregChangePD          // new protection domain: pd
	ReregChangeAccess      = placement.ReregChangeAccess      // new rights: access
)

// ReregError is a failed ReregMR; its Code (ReregErrInput: the MR is
// valid and unchanged; ReregErrCmd: deregister it) is enum
// ibv_rereg_mr_err_code.
type ReregError = placement.ReregError

// Re-registration error codes (libibverbs values).
const (
	ReregErrInput = placement.ReregErrInput
	ReregErrCmd   = placement.ReregErrCmd
)

// ReregMR re-registers mr (ibv_rereg_mr), changing what flags select: its
// memory (ReregChangeTranslation, buf; the IOVA becomes the address of
// buf[0]), its protection domain (ReregChangePD, pd) and its rights
// (ReregChangeAccess, access; without the flag access must be 0). The MR
// gets a new key (same index, next key byte): LKey and RKey return it, and
// the old key misses — an RDMA access with it gets the remote access error
// NAK — from the moment the call starts. When ReregMR returns, no byte is
// placed through the old registration any more.
//
// Errors are *ReregError (errors.As), which wraps the reason: ErrBadPD (or
// a PD of another device), flags, access flags, buffer or MR kinds that
// ibv_rereg_mr refuses (EINVAL), ErrMWBound, ErrBusy, the pin limit. With
// Code ReregErrInput the MR is still valid and unchanged.
func (d *Device) ReregMR(mr *MR, flags ReregFlags, pd *PD, buf []byte, access Access) error {
	var pdID uint32
	if flags&ReregChangePD != 0 {
		release, err := d.usePD(pd)
		if err != nil {
			return fmt.Errorf("softrdma: %w", &ReregError{Code: ReregErrInput, Err: err})
		}
		defer release()
		pdID = pd.id
	}
	// A remap of the same MR works on its key and table: one at a time.
	d.remapMu.Lock()
	defer d.remapMu.Unlock()
	if err := d.place.ReregMR(mr, flags, pdID, buf, access); err != nil {
		return fmt.Errorf("softrdma: %w", err)
	}
	return nil
}
