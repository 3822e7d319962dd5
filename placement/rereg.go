package placement

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unsafe"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/internal/operr"
	"github.com/softrdma/softrdma/pagetable"
	"github.com/softrdma/softrdma/stag"
)

// ReregFlags select what ReregMR changes (enum ibv_rereg_mr_flags).
type ReregFlags uint32

// Re-registration flags, libibverbs values.
const (
	ReregChangeTranslation ReregFlags = 1 << 0 // IBV_REREG_MR_CHANGE_TRANSLATION: new memory (address and length)
	ReregChangePD          ReregFlags = 1 << 1 // IBV_REREG_MR_CHANGE_PD
	ReregChangeAccess      ReregFlags = 1 << 2 // IBV_REREG_MR_CHANGE_ACCESS

	reregFlagsSupported = ReregChangeTranslation | ReregChangePD | ReregChangeAccess
)

// ReregErrCode says in which state a failed re-registration left the MR
// (enum ibv_rereg_mr_err_code, the codes that apply here: there is no fork
// protection to fail).
type ReregErrCode int

// Re-registration error codes, libibverbs values.
const (
	// ReregErrInput: the MR is valid and unchanged (IBV_REREG_MR_ERR_INPUT).
	// Every check is made, and the new memory pinned, before the old
	// registration is touched, so every failure but an internal one is
	// of this kind (where the kernel would answer IBV_REREG_MR_ERR_CMD
	// for some).
	ReregErrInput ReregErrCode = -1
	// ReregErrCmd: the MR must not be used any more; deregister it
	// (IBV_REREG_MR_ERR_CMD).
	ReregErrCmd ReregErrCode = -4
)

// ReregError is a failed ReregMR: Code says whether the MR is still
// usable, Err why it failed (it wraps the errno: EINVAL, EOPNOTSUPP,
// EBUSY, or the pin limit's error).
type ReregError struct {
	Code ReregErrCode
	Err  error
}

func (e *ReregError) Error() string {
	what := "the MR is unchanged"
	if e.Code == ReregErrCmd {
		what = "the MR must be deregistered"
	}
	// One prefix: the reason's own package prefixes (ErrBadPD's
	// "softrdma: ", ErrMWBound's "placement: ") would repeat it.
	reason := e.Err.Error()
	for _, p := range []string{"softrdma: ", "placement: "} {
		reason = strings.TrimPrefix(reason, p)
	}
	return fmt.Sprintf("rereg MR: %s (%s)", reason, what)
}

func (e *ReregError) Unwrap() error { return e.Err }

// ReregMR re-registers mr (ibv_rereg_mr): conceptually DeregMR then RegMR
// of the same MR object, changing what flags select — the memory
// (ReregChangeTranslation: buf, whose first byte's address is the new
// IOVA), the protection domain (ReregChangePD: pd) and the rights
// (ReregChangeAccess: access; otherwise access must be 0, as libibverbs
// requires). The MR gets a new key (the same index, the next key byte):
// LKey and RKey return it, and the old key misses from the moment the
// re-registration starts (a remote access error; the next packet of a
// message in progress fails). When ReregMR returns, no byte is placed
// through the old registration any more and the old memory is unpinned.
//
// Errors are *ReregError. Code ReregErrInput (the MR is valid and
// unchanged): no flag or an unknown one, ChangeTranslation with an empty
// buffer, access without ChangeAccess, access flags RegMR refuses, a
// change of ON_DEMAND, a translation change of an implicit ODP MR, an MR
// of AllocMR (fast registration re-registers with REG_MR), a deregistered
// MR (EINVAL); windows bound to the MR (ErrMWBound, EINVAL); another
// re-registration or invalidation in progress, or placement suspended
// (ErrBusy); the pin limit. Code ReregErrCmd is not produced by today's
// implementation but is part of the contract.
func (e *Engine) ReregMR(mr *MR, flags ReregFlags, pd uint32, buf []byte, access stag.Access) error {
	input := func(err error) error { return &ReregError{Code: ReregErrInput, Err: err} }
	bad := func(why string) error { return input(fmt.Errorf("%s: %w", why, ErrInvalid)) }
	switch {
	case flags == 0 || flags&^reregFlagsSupported != 0:
		return bad(fmt.Sprintf("flags %#x", uint32(flags)))
	case flags&ReregChangeTranslation != 0 && len(buf) == 0:
		return bad("CHANGE_TRANSLATION with an empty buffer")
	case flags&ReregChangeAccess == 0 && access != 0:
		return bad("access flags without CHANGE_ACCESS")
	case mr == nil || mr.eng != e:
		return bad("not an MR of this device")
	}
	if flags&ReregChangeAccess != 0 {
		if err := checkAccess(false, access); err != nil {
			return input(err)
		}
	}

	// Mark the MR busy: invalidations, binds, suspensions by this package
	// and a second ReregMR refuse or wait meanwhile.
	e.life.mu.Lock()
	old := mr.ent()
	switch {
	case mr.dead.Load():
		e.life.mu.Unlock()
		return bad("the MR is deregistered")
	case mr.life.frwr:
		e.life.mu.Unlock()
		return bad("a fast-registration MR is registered again by REG_MR")
	case flags&ReregChangeAccess != 0 && (access^old.Access)&stag.AccessOnDemand != 0:
		e.life.mu.Unlock()
		return bad("ON_DEMAND cannot change")
	case mr.life.windows > 0:
		e.life.mu.Unlock()
		return input(ErrMWBound)
	case mr.life.busy != nil || mr.life.remap != nil || e.mrs.Suspended(mr.stag()):
		e.life.mu.Unlock()
		return input(ErrBusy)
	}
	busy := make(chan struct{})
	mr.life.busy = busy
	e.life.mu.Unlock()
	done := func() {
		e.life.mu.Lock()
		mr.life.busy = nil
		close(busy)
		e.life.mu.Unlock()
	}

	newPD, newAccess := old.PD, old.Access
	if flags&ReregChangePD != 0 {
		newPD = pd
	}
	if flags&ReregChangeAccess != 0 {
		newAccess = access
	}
	nr, err := e.newTranslation(mr, flags, buf, newAccess)
	if err != nil {
		done()
		return input(err)
	}

	// The protocol of DeregMR on the old registration.
	if err := e.mrs.Invalidate(old.STag); err != nil {
		panic("placement: the key of a live MR is missing: " + err.Error())
	}
	e.mrs.Synchronize()
	old.Drain()

	key := stag.Make(old.STag.Index(), old.STag.Key()+1)
	ent, err := e.mrs.Rekey(old.STag, key, newPD, nr.iova, nr.length, newAccess, mr, nil, 0)
	if err != nil {
		panic("placement: a checked re-registration failed: " + err.Error())
	}
	oldTable, oldODP := mr.table, mr.odp
	e.life.mu.Lock() // SuspendMR and ResumeMR read the key under it
	e.reg.mu.Lock()  // MRsCovering reads entry under it
	mr.setEntry(ent)
	e.reg.mu.Unlock()
	e.life.mu.Unlock()
	if nr.changed {
		mr.table, mr.odp, mr.buf = nr.table, nr.odp, nr.buf
	}
	if mr.table != nil {
		if flat, writable := mr.table.Linear(); flat != nil {
			if err := e.mrs.SetLinear(ent.STag, &flat[0], writable); err != nil {
				panic("placement: the key of a live MR is missing: " + err.Error())
			}
		}
	}
	if err := e.mrs.Validate(ent.STag); err != nil {
		panic("placement: a new key cannot be validated: " + err.Error())
	}
	done()
	if nr.changed {
		if oldTable != nil {
			err = oldTable.Release()
		} else if oldODP != nil {
			err = oldODP.t.Release()
		}
		if err != nil {
			// The new registration is in place; only the old
			// memory's release failed.
			return operr.Wrap("placement", "rereg MR: releasing the old memory", err)
		}
	}
	return nil
}

// translation is the memory of a re-registration.
type translation struct {
	changed      bool // a new table (else the MR keeps its own)
	iova, length uint64
	table        *pagetable.Table
	odp          *odpState
	buf          []byte
}

// newTranslation builds the translation a re-registration needs: new
// memory, or the same memory pinned again when LOCAL_WRITE changes (a
// pinned table is built writable or not), else the MR's own.
func (e *Engine) newTranslation(mr *MR, flags ReregFlags, buf []byte, access stag.Access) (translation, error) {
	old := mr.ent()
	nr := translation{iova: old.IOVA, length: old.Length}
	if err := checkAccess(false, access); err != nil {
		return nr, err
	}
	if (access^old.Access)&stag.AccessOnDemand != 0 {
		return nr, fmt.Errorf("ON_DEMAND cannot change: %w", ErrInvalid)
	}
	newMem := flags&ReregChangeTranslation != 0
	writable := access&stag.AccessLocalWrite != 0
	if !newMem && (access^old.Access)&stag.AccessLocalWrite == 0 {
		return nr, nil
	}
	nr.changed = true
	if !newMem {
		buf = mr.buf
	}
	if mr.odp != nil {
		as := e.asSet.Load()
		var (
			t   *pagetable.ODP
			err error
		)
		switch {
		case mr.odp.t.Implicit() && newMem:
			return nr, fmt.Errorf("an implicit ODP MR covers the whole address space: %w", ErrInvalid)
		case mr.odp.t.Implicit():
			t, err = pagetable.NewImplicit(as, writable, e.budget)
			nr.iova, nr.length = 0, math.MaxUint64
		default:
			if newMem {
				nr.iova, nr.length = hostmem.AddrOf(buf), uint64(len(buf))
			}
			t, err = pagetable.NewODP(as, nr.iova, nr.length, writable, e.budget)
		}
		if err != nil {
			return nr, fmt.Errorf("%w: %w", err, ErrInvalid)
		}
		nr.odp, nr.buf = &odpState{t: t, hist: hdrhistogram.New(1, maxFaultNs, 3)}, buf
		return nr, nil
	}
	if buf == nil {
		return nr, errors.New("placement: rereg MR: the MR's memory is unknown")
	}
	nr.iova, nr.length = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))), uint64(len(buf))
	t, err := e.pinTable(nr.iova, buf, writable)
	if err != nil {
		return nr, err
	}
	nr.table, nr.buf = t, buf
	return nr, nil
}
