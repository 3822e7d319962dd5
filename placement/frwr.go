package placement

import (
	"fmt"
	"unsafe"

	"github.com/softrdma/softrdma/internal/operr"
	"github.com/softrdma/softrdma/pagetable"
	"github.com/softrdma/softrdma/stag"
)

// Fast registration (FRWR): the kernel's ib_alloc_mr(IB_MR_TYPE_MEM_REG),
// ib_map_mr_sg and the IB_WR_REG_MR work request, as rxe implements them
// (rxe_alloc_mr, rxe_map_mr_sg, rxe_reg_fast_mr). An MR is allocated once,
// without memory; for each use the consumer maps memory onto it, rolls the
// key byte (ibv_inc_rkey) and posts REG_MR on a send queue, which makes
// the new key valid; LOCAL_INV (or a peer's SEND with Invalidate) makes it
// invalid again, and the MR can be mapped and registered anew.

// MaxFastRegPages is the most pages an FRWR mapping may touch
// (ibv_device_attr's max_fast_reg_page_list_len; 1 GiB of 4 KiB pages).
const MaxFastRegPages = 1 << 18

// AllocMR allocates a fast-registration MR of protection domain pd whose
// mappings may touch up to maxPages pages (ib_alloc_mr with
// IB_MR_TYPE_MEM_REG and max_num_sg). It has a key (LKey, RKey) but no
// memory, and is invalid: map memory with MapMR and register it with a
// REG_MR work request. Errors: maxPages outside 1 to MaxFastRegPages
// (EINVAL), a full key table.
func (e *Engine) AllocMR(pd uint32, maxPages int) (*MR, error) {
	if maxPages < 1 || maxPages > MaxFastRegPages {
		return nil, fmt.Errorf("placement: alloc MR: max pages %d (1-%d): %w", maxPages, MaxFastRegPages, ErrInvalid)
	}
	mr := &MR{eng: e}
	mr.life.frwr, mr.life.maxPages = true, maxPages
	ent, err := e.mrs.Alloc(pd, 0, 0, 0, mr)
	if err != nil {
		return nil, operr.Wrap("placement", "alloc MR", err)
	}
	mr.setEntry(ent)
	return mr, nil
}

// FastReg reports whether the MR was allocated with AllocMR.
func (m *MR) FastReg() bool { return m.life.frwr }

// MapMR gives a fast-registration MR the memory buf for its next
// registration (ib_map_mr_sg with one contiguous scatter/gather element):
// the pages are pinned (charged to the pin limit) and the translation
// table built; the next REG_MR registers [IOVA, IOVA+len(buf)) with IOVA
// the address of buf[0]. The memory of an earlier mapping is unpinned. The
// MR must be invalid: never registered, or invalidated by LOCAL_INV or a
// SEND with Invalidate whose completion was seen (rxe changes the page
// list under a live MR; this refuses).
//
// Errors: not an MR of AllocMR, an empty buffer, more pages than the MR's
// maxPages (EINVAL); an MR that is registered, or whose invalidation is
// still waiting for placements in flight (ErrBusy); the pin limit
// (hostmem.ErrPinLimit).
func (e *Engine) MapMR(mr *MR, buf []byte) error {
	if err := e.checkMap(mr, len(buf)); err != nil {
		return err
	}
	iova := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	const pageMask = pagetable.PageSize - 1
	pages := int((iova&pageMask + uint64(len(buf)) + pageMask) >> pagetable.PageShift)
	if pages > mr.life.maxPages {
		return fmt.Errorf("placement: map MR: %d bytes at %#x touch %d pages, the MR maps %d: %w",
			len(buf), iova, pages, mr.life.maxPages, ErrInvalid)
	}
	table, err := e.pinTable(iova, buf, true)
	if err != nil {
		return operr.Wrap("placement", "map MR", err)
	}
	e.life.mu.Lock()
	if err := e.checkMapLocked(mr, len(buf)); err != nil {
		e.life.mu.Unlock()
		_ = table.Release()
		return err
	}
	// The MR is invalid and its invalidation has ended: nothing reads
	// its table.
	old := mr.table
	mr.table, mr.buf, mr.life.mapped = table, buf, true
	e.life.mu.Unlock()
	if old != nil {
		if err := old.Release(); err != nil {
			return operr.Wrap("placement", "map MR: releasing the old mapping", err)
		}
	}
	return nil
}

func (e *Engine) checkMap(mr *MR, n int) error {
	e.life.mu.Lock()
	defer e.life.mu.Unlock()
	return e.checkMapLocked(mr, n)
}

func (e *Engine) checkMapLocked(mr *MR, n int) error {
	switch {
	case mr == nil || mr.eng != e || mr.dead.Load():
		return fmt.Errorf("placement: map MR: not a live MR of this device: %w", ErrInvalid)
	case !mr.life.frwr:
		return fmt.Errorf("placement: map MR: not a fast-registration MR (AllocMR): %w", ErrInvalid)
	case n == 0:
		return fmt.Errorf("placement: map MR: empty buffer: %w", ErrInvalid)
	case mr.life.valid || mr.life.busy != nil:
		return operr.Wrap("placement", "map MR: the MR is registered (invalidate it first)", ErrBusy)
	}
	return nil
}

// pinTable builds the pinned translation table of buf at iova, as RegMR
// does: on the host address space's frames when buf lies in it (so that it
// can be remapped), else through the device's Space.
func (e *Engine) pinTable(iova uint64, buf []byte, writable bool) (*pagetable.Table, error) {
	if as := e.asSet.Load(); as != nil && as.Bounds().Start <= iova && iova+uint64(len(buf)) <= as.Bounds().End {
		return pagetable.NewPinnedFrames(as, e.pins, buf, writable)
	}
	return pagetable.NewPinned(iova, buf, &e.space, e.pins, writable)
}

// FastReg executes a REG_MR work request of a QP of protection domain pd
// (rxe_reg_fast_mr): the MR's key becomes key — the same index, the
// consumer's key byte (ibv_inc_rkey of the old key) — and it is valid with
// the rights access over the memory of its last MapMR. Its LKey and RKey
// return the new key from then on; the old key misses (KeyMismatch: a
// remote access error).
//
// Errors (the work request completes with IBV_WC_LOC_QP_OP_ERR, as in
// rxe): EINVAL for an MR not of AllocMR, an MR already registered (it must
// be invalid: rxe's "MR not free"), the QP's PD not the MR's, a key of
// another index, an MR never mapped, access flags RegMR refuses
// (REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE, unknown bits,
// ON_DEMAND); EOPNOTSUPP for ZERO_BASED; ErrBusy while the MR's
// invalidation waits for placements in flight.
func (e *Engine) FastReg(pd uint32, mr *MR, key uint32, access stag.Access) error {
	bad := func(why string) error { return fmt.Errorf("placement: REG_MR: %s: %w", why, ErrInvalid) }
	if err := checkAccess(false, access); err != nil {
		return operr.Wrap("placement", "REG_MR", err)
	}
	if access&stag.AccessOnDemand != 0 {
		return bad("ON_DEMAND")
	}
	e.life.mu.Lock()
	defer e.life.mu.Unlock()
	switch {
	case mr == nil || mr.eng != e || mr.dead.Load():
		return bad("not a live MR of this device")
	case !mr.life.frwr:
		return bad("not a fast-registration MR (AllocMR)")
	case mr.life.busy != nil:
		return operr.Wrap("placement", "REG_MR", ErrBusy)
	case mr.life.valid:
		return bad("the MR is registered (invalidate it first)")
	case mr.ent().PD != pd:
		return bad("the QP's PD is not the MR's")
	case stag.STag(key).Index() != mr.stag().Index():
		return bad(fmt.Sprintf("key %v names another index than the MR's %v", stag.STag(key), mr.stag()))
	case !mr.life.mapped:
		return bad("no memory mapped (MapMR)")
	}
	t := mr.table
	ent, err := e.mrs.Rekey(mr.stag(), stag.STag(key), pd, t.IOVA(), t.Len(), access, mr, nil, 0)
	if err != nil {
		panic("placement: a checked REG_MR failed: " + err.Error())
	}
	mr.setEntry(ent)
	if flat, writable := t.Linear(); flat != nil {
		if err := e.mrs.SetLinear(ent.STag, &flat[0], writable && access&stag.AccessLocalWrite != 0); err != nil {
			panic("placement: the key of a registered MR is missing: " + err.Error())
		}
	}
	if err := e.mrs.Validate(ent.STag); err != nil {
		panic("placement: a new key cannot be validated: " + err.Error())
	}
	mr.life.valid = true
	return nil
}
