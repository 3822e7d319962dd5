package placement

import (
	"fmt"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/internal/operr"
	"github.com/softrdma/softrdma/stag"
)

// MR life cycle: fast registration, invalidation, memory windows and
// re-registration (issue 4, item 4), after IBTA Vol. 1 10.6 (memory
// management) and Linux rxe (rxe_mr.c, rxe_mw.c, rxe_req.c local
// operations, rxe_resp.c Send with Invalidate).
//
// Every change of a key's registration follows DeregMR's protocol:
// invalidate the slot (new accesses fail, and the next packet of a message
// in progress), wait for the placements in flight (a grace period of the
// readers, then the drain of the counted references), and only then change
// what the key names. The wait is an Invalidation, so that the transport
// can begin an invalidation under its send-queue lock and wait after
// releasing it. When an operation's error or completion is returned, no
// byte is placed through the old registration any more.

// Errors of the life-cycle operations. They wrap the errno the kernel
// returns for the same condition, so errors.Is(err, unix.EINVAL) works.
var (
	// ErrMWBound is EINVAL: the MR has memory windows bound to it, so it
	// cannot be invalidated, re-registered or deregistered. EINVAL is
	// what rxe returns for each (rxe_dereg_mr, IBA 10.6.7.2.6: "mr has
	// mw's bound"; rxe_invalidate_mr: "Attempt to invalidate an MR while
	// bound to MWs"); IBTA names no errno.
	ErrMWBound = fmt.Errorf("placement: memory windows are bound to the MR: %w", unix.EINVAL)
	// ErrBusy is EBUSY: another invalidation or re-registration of the
	// object is in progress, or its placement is suspended.
	ErrBusy = fmt.Errorf("placement: operation in progress on the key: %w", unix.EBUSY)
)

// lifecycle is the engine's state of MR and MW life-cycle operations
// (control path only). Its mutex is never held while waiting for
// placements in flight.
type lifecycle struct {
	mu sync.Mutex
	// mws maps a window's index to the window: it tells a window's key
	// from a region's for LOCAL_INV and Send with Invalidate.
	mws map[uint32]*MW // guarded by mu
}

// mrLife is an MR's life-cycle state, guarded by its engine's life.mu.
type mrLife struct {
	// frwr: allocated by AllocMR (ib_alloc_mr IB_MR_TYPE_MEM_REG),
	// registered by REG_MR work requests and invalidated by LOCAL_INV or
	// Send with Invalidate. Only such MRs can be invalidated (rxe).
	frwr     bool
	maxPages int  // FRWR: pages a mapping may touch (max_num_sg)
	mapped   bool // FRWR: MapMR gave it memory for the next REG_MR
	valid    bool // FRWR: registered by a REG_MR and not invalidated since
	// windows counts the memory windows bound to the MR (rxe num_mw);
	// while it is not zero the MR is not invalidated, re-registered or
	// deregistered.
	windows int
	// busy is non-nil while an invalidation or re-registration of the MR
	// waits for the placements in flight; it is closed when it ends.
	busy chan struct{}
	// remap is non-nil from PrepareRemap to the Remapping's Release or
	// Abort (closed then): DeregMR refuses meanwhile (ErrRemapInProgress),
	// since the remap moves the pin and switches the table that a
	// deregistration releases.
	remap chan struct{}
}

// Invalidation is an invalidation begun — the key no longer resolves, and
// the next packet of a message in progress through it fails — whose wait
// for the placements in flight has not run yet. Wait runs it (a grace
// period of the readers, the drain of the counted references) and then
// completes the operation. Call Wait exactly once, holding no lock that a
// receive loop may wait for, and never from a Reader that is online (the
// receive loop quiesces first).
type Invalidation struct {
	e     *Engine
	drain *stag.Entry[*MR] // entry whose counted references are waited for
	busy  chan struct{}    // closed when done
	other chan struct{}    // set instead: an invalidation already in progress to wait for
	// then, with other, is the operation that waited for other: it runs
	// (and may wait in turn) once other is closed.
	then func() error
	done func() // completes the operation, under e.life.mu
}

// Wait waits for the placements in flight through the invalidated key and
// completes the operation. A nil Invalidation has nothing to wait for. The
// error is that of an operation that had to wait for another one on the
// same object before it could be checked and executed (a bind of a window
// or onto an MR being invalidated, re-registered or rebound: BindPosted);
// it is nil for every other Invalidation.
func (inv *Invalidation) Wait() error {
	if inv == nil {
		return nil
	}
	if inv.other != nil {
		<-inv.other
		if inv.then != nil {
			return inv.then()
		}
		return nil
	}
	inv.e.mrs.Synchronize()
	if inv.drain != nil {
		inv.drain.Drain()
	}
	inv.e.life.mu.Lock()
	if inv.done != nil {
		inv.done()
	}
	close(inv.busy)
	inv.e.life.mu.Unlock()
	return nil
}

// MWType is a memory window type (enum ibv_mw_type).
type MWType uint8

// Memory window types (IBTA 10.6.7.1). Type 2 is type 2B in IBTA's words:
// bound to one QP, invalidated remotely or locally (as rxe implements).
const (
	MWType1 MWType = 1 // IBV_MW_TYPE_1: bound to the PD; rebound or unbound by ibv_bind_mw
	MWType2 MWType = 2 // IBV_MW_TYPE_2: bound to a QP by a BIND_MW work request
)

func (t MWType) String() string {
	switch t {
	case MWType1:
		return "type 1"
	case MWType2:
		return "type 2"
	}
	return "MWType(" + strconv.Itoa(int(t)) + ")"
}

// MW is a memory window (struct ibv_mw): a remote-access window onto a
// range of an MR, with its own rkey and rights (IBTA 10.6.7). An access
// through the window's rkey is checked against the window (key, PD, the
// QP for a type 2 window, rights, state, the window's range) and then
// placed through the MR's key, whose state, suspension and translation
// govern it as for the MR's own rkey.
type MW struct {
	eng *Engine
	typ MWType
	pd  uint32

	// Guarded by eng.life.mu.
	key   stag.STag        // current rkey
	entry *stag.Entry[*MR] // current key table entry
	mr    *MR              // the MR bound to; nil: unbound
	qpn   uint32           // type 2: the QP bound to
	busy  chan struct{}    // an invalidation in progress (see mrLife.busy)
	dead  bool             // deallocated
	// posted is the type 1 window's ibv_mw.rkey: the key of the last
	// bind posted (PostRKey), which RKey returns; pending counts the
	// binds posted and not yet settled (Settle). With none pending,
	// posted is the window's key.
	posted  stag.STag
	pending int
}

// PostedBind is a type 1 bind posted and not yet executed: RKey is the new
// key it gives the window (ibv_inc_rkey of Prev), Prev the window's
// ibv_mw.rkey when it was posted (rxe's mw_rkey: the key the bind expects
// the window to have when it executes).
type PostedBind struct {
	RKey, Prev uint32
}

// PostRKey posts a bind of the type 1 window w: ibv_mw.rkey, which RKey
// returns from now on, becomes ibv_inc_rkey of itself, as rdma-core's
// ibv_bind_mw sets it as soon as its post succeeds (providers/rxe
// rxe_bind_mw, mlx5_bind_mw), so that the application may give the new
// key to its peer at once. Every PostRKey is followed by exactly one
// Settle, when the bind has executed or will never execute.
func (w *MW) PostRKey() PostedBind {
	w.eng.life.mu.Lock()
	defer w.eng.life.mu.Unlock()
	p := PostedBind{Prev: uint32(w.posted)}
	w.posted = stag.Make(w.posted.Index(), w.posted.Key()+1)
	p.RKey = uint32(w.posted)
	w.pending++
	return p
}

// NextRKey returns ibv_inc_rkey of the window's key, the rkey of a bind
// that the caller executes at once with BindMW (tests, direct users of the
// engine; the transport uses PostRKey and BindPosted). It is settled on
// return: until a bind executes, NextRKey returns the same key again.
func (w *MW) NextRKey() uint32 {
	p := w.PostRKey()
	w.Settle(p, true)
	return p.RKey
}

// Settle ends the bind p of PostRKey: ok, it executed; otherwise it failed,
// was flushed, discarded by a reset or never posted. A failed bind's key
// is undone when no later bind was posted (rdma-core leaves this undo to
// the application: "user has to undo this if he gets an error wc",
// rxe_bind_mw; ibv_mw.rkey is read-only here). Once no bind is pending,
// RKey is the window's key again, whatever order the binds of several QPs
// ended in.
func (w *MW) Settle(p PostedBind, ok bool) {
	w.eng.life.mu.Lock()
	defer w.eng.life.mu.Unlock()
	if w.pending > 0 {
		w.pending--
	}
	if !ok && uint32(w.posted) == p.RKey {
		w.posted = stag.STag(p.Prev)
	}
	if w.pending == 0 && w.busy == nil {
		w.posted = w.key
	}
}

// Type returns the window's type.
func (w *MW) Type() MWType { return w.typ }

// PD returns the protection domain the window belongs to.
func (w *MW) PD() uint32 { return w.pd }

// RKey returns the window's rkey (ibv_mw.rkey), the key it was allocated
// with until a bind changes its key byte (ibv_inc_rkey), so that an rkey of
// an earlier binding misses. For a type 1 window it is the key of the last
// bind posted (QP.BindMW), from the moment of the post, as rdma-core's
// ibv_bind_mw sets ibv_mw.rkey (see PostRKey; a bind that fails gives it
// back, see Settle). For a type 2 window the application chose the key in
// its BIND_MW work request (libibverbs leaves ibv_mw.rkey alone then), and
// RKey is the window's key as the device holds it (rxe's mw->rkey): the
// new key once the bind has executed.
func (w *MW) RKey() uint32 {
	w.eng.life.mu.Lock()
	defer w.eng.life.mu.Unlock()
	if w.typ == MWType1 {
		return uint32(w.posted)
	}
	return uint32(w.key)
}

// Binding returns the MR the window is bound to and the window's range
// and rights; mr is nil for an unbound window.
func (w *MW) Binding() (mr *MR, addr, length uint64, access stag.Access) {
	w.eng.life.mu.Lock()
	defer w.eng.life.mu.Unlock()
	if w.mr == nil {
		return nil, 0, 0, 0
	}
	return w.mr, w.entry.IOVA, w.entry.Length, w.entry.Access
}

// BindInfo is what a bind gives a window (struct ibv_mw_bind_info): the
// range [Addr, Addr+Length) of MR, with the rights Access (REMOTE_READ,
// REMOTE_WRITE, REMOTE_ATOMIC). Length 0 unbinds a type 1 window.
type BindInfo struct {
	MR     *MR
	Addr   uint64 // IOVA of the window's first byte, inside the MR
	Length uint64 // bytes
	Access stag.Access
}

// windowAccess are the rights a bind may grant.
const windowAccess = stag.AccessRemote | stag.AccessZeroBased

// AllocMW allocates a memory window of type typ in protection domain pd
// (ibv_alloc_mw). It is unbound: its rkey resolves nothing until a bind.
// Errors: an unknown type (EINVAL), a full key table.
func (e *Engine) AllocMW(pd uint32, typ MWType) (*MW, error) {
	if typ != MWType1 && typ != MWType2 {
		return nil, fmt.Errorf("placement: alloc MW: %v: %w", typ, ErrInvalid)
	}
	ent, err := e.mrs.Alloc(pd, 0, 0, 0, nil)
	if err != nil {
		return nil, operr.Wrap("placement", "alloc MW", err)
	}
	w := &MW{eng: e, typ: typ, pd: pd, key: ent.STag, entry: ent, posted: ent.STag}
	e.life.mu.Lock()
	if e.life.mws == nil {
		e.life.mws = make(map[uint32]*MW)
	}
	e.life.mws[ent.STag.Index()] = w
	e.life.mu.Unlock()
	return w, nil
}

// DeallocMW deallocates a window (ibv_dealloc_mw). A bound window is
// invalidated first, and DeallocMW returns when no byte is placed through
// it any more. Errors: a window of another device or already deallocated
// (EINVAL).
func (e *Engine) DeallocMW(w *MW) error {
	if w == nil || w.eng != e {
		return fmt.Errorf("placement: dealloc MW: not a window of this device: %w", ErrInvalid)
	}
	for {
		e.life.mu.Lock()
		if w.dead {
			e.life.mu.Unlock()
			return fmt.Errorf("placement: dealloc MW: already deallocated: %w", ErrInvalid)
		}
		if b := w.busy; b != nil {
			e.life.mu.Unlock()
			<-b
			continue
		}
		break
	}
	// Locked, nothing in progress.
	w.dead = true
	inv := e.invalidateWindowLocked(w)
	e.life.mu.Unlock()
	inv.Wait()
	e.life.mu.Lock()
	delete(e.life.mws, w.key.Index())
	err := e.mrs.Free(w.key)
	e.life.mu.Unlock()
	if err != nil {
		panic("placement: the key of a live window is missing: " + err.Error())
	}
	return nil
}

// invalidateWindowLocked begins the invalidation of w's binding (nil: w is
// not bound): the window's slot is invalidated and its MR's slot touched,
// so that Spans opened through the window fail at their next packet. The
// Invalidation unbinds it when the placements in flight have ended. Called
// with e.life.mu held and w not busy.
func (e *Engine) invalidateWindowLocked(w *MW) *Invalidation {
	if w.mr == nil {
		return nil
	}
	mr := w.mr
	if err := e.mrs.Invalidate(w.key); err != nil {
		panic("placement: the key of a bound window is missing: " + err.Error())
	}
	if err := e.mrs.Touch(mr.stag()); err != nil {
		panic("placement: the MR of a bound window is missing: " + err.Error())
	}
	w.busy = make(chan struct{})
	return &Invalidation{e: e, drain: mr.ent(), busy: w.busy, done: func() {
		w.busy = nil
		w.mr = nil
		w.qpn = 0
		mr.life.windows--
	}}
}

// checkBind makes the checks of a bind of w by a QP of protection domain
// pd with the new rkey rkey, in rxe_check_bind_mw's order, citing the IBTA
// rule each one enforces. A type 1 bind posted by QP.BindMW (p non-nil)
// must find the window with the key it was posted against (rxe_bind_mw:
// mw->rkey != mw_rkey is EINVAL). When the window or the MR is being
// invalidated, re-registered or rebound, the checks stop and wait is
// what to wait for before checking again (rxe makes binds wait for each
// other under the window's lock). Called with e.life.mu held.
func (e *Engine) checkBind(pd uint32, w *MW, p *PostedBind, rkey uint32, b *BindInfo) (wait chan struct{}, err error) {
	bad := func(why string) error { return fmt.Errorf("placement: bind MW: %s: %w", why, ErrInvalid) }
	switch {
	case w == nil || w.eng != e || w.dead:
		return nil, bad("not a live window of this device")
	case stag.STag(rkey).Index() != w.key.Index():
		return nil, bad("the new rkey names another index (only the key byte may change)")
	case w.busy != nil:
		return w.busy, nil
	case p != nil && uint32(w.key) != p.Prev:
		return nil, bad(fmt.Sprintf("the window's key is %v, not %v as when the bind was posted (a bind posted before it has not executed, or failed)",
			w.key, stag.STag(p.Prev)))
	case b.Access&^windowAccess != 0:
		return nil, bad(fmt.Sprintf("access %v (only REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC, ZERO_BASED)", b.Access))
	case w.pd != pd:
		return nil, bad("the QP's PD is not the window's (C10-72)")
	case w.typ == MWType1 && b.Access&stag.AccessZeroBased != 0:
		return nil, bad("a type 1 window cannot be zero based (o10-36.2.2)")
	case w.typ == MWType2 && w.mr != nil:
		return nil, bad("a type 2 window must be invalidated before it is bound again (o10-37.2.30)")
	case w.typ == MWType2 && (b.MR == nil || b.Length == 0):
		return nil, bad("a type 2 window cannot be bound to no memory (o10-37.2.40)")
	case b.Access&stag.AccessZeroBased != 0:
		return nil, fmt.Errorf("placement: bind MW: zero-based windows: %w", ErrNotSupported)
	}
	if b.Length == 0 {
		return nil, nil // a type 1 unbind
	}
	mr := b.MR
	switch {
	case mr == nil || mr.eng != e || mr.dead.Load():
		return nil, bad("not a live MR of this device")
	case mr.PD() != w.pd:
		return nil, bad("the MR's PD is not the window's")
	case mr.life.busy != nil:
		return mr.life.busy, nil
	case mr.life.frwr && !mr.life.valid:
		return nil, bad("the MR is not registered (invalidated fast-registration MR)")
	case mr.Access()&stag.AccessZeroBased != 0:
		return nil, bad("the MR is zero based")
	case mr.Access()&stag.AccessMWBind == 0:
		return nil, bad("the MR lacks MW_BIND access (C10-73)")
	case b.Access&(stag.AccessRemoteWrite|stag.AccessRemoteAtomic) != 0 && mr.Access()&stag.AccessLocalWrite == 0:
		return nil, bad("a writable window needs an MR with LOCAL_WRITE (C10-74)")
	case mr.ent().CheckRange(b.Addr, b.Length) != stag.OK:
		return nil, bad(fmt.Sprintf("[%#x, +%d) is not inside the MR [%#x, +%d) (C10-75)",
			b.Addr, b.Length, mr.ent().IOVA, mr.ent().Length))
	}
	return nil, nil
}

// BindMW executes a bind of window w (a BIND_MW work request) by a QP of
// protection domain pd numbered qpn: the window's rkey becomes rkey (same
// index, the consumer's key byte: ibv_inc_rkey) and it grants b.Access to
// [b.Addr, b.Addr+b.Length) of b.MR — to every QP of the PD (type 1) or to
// QP qpn only (type 2). A type 1 window bound before is rebound (or, with
// length 0, unbound): its old binding is invalidated first, and the
// returned Invalidation's Wait finishes the bind once the placements
// through the old binding have ended. A window or MR that another
// operation is invalidating, re-registering or rebinding is waited for
// (rxe serialises binds under the window's lock): the returned
// Invalidation's Wait waits for it, then checks and executes the bind, and
// returns the bind's error. Otherwise the bind is done on return and the
// Invalidation is nil.
//
// Errors (the work request completes with IBV_WC_MW_BIND_ERR, as in rxe):
// EINVAL for each rule checkBind names, EOPNOTSUPP for zero-based windows.
func (e *Engine) BindMW(pd, qpn uint32, w *MW, rkey uint32, b BindInfo) (*Invalidation, error) {
	return e.bind(pd, qpn, nil, w, nil, rkey, b)
}

// BindMWLive is BindMW for the transport: live reports whether QP qpn
// still exists, and is called under the lock ReleaseQPWindows takes. A
// bind that had to wait executes only if it still does (EINVAL
// otherwise), so that a type 2 window is never bound to a QP whose
// windows DestroyQP has already released (a later QP of the same number
// would open it).
func (e *Engine) BindMWLive(pd, qpn uint32, live func() bool, w *MW, rkey uint32, b BindInfo) (*Invalidation, error) {
	return e.bind(pd, qpn, live, w, nil, rkey, b)
}

// BindPosted executes the type 1 bind p that QP.BindMW posted (PostRKey),
// as BindMWLive with rkey p.RKey; it also fails (EINVAL) if the window's
// key is not p.Prev when it executes, as rxe_bind_mw refuses a bind whose
// mw_rkey is not the window's: a bind posted after another one, on another
// QP, that executes first.
func (e *Engine) BindPosted(pd, qpn uint32, live func() bool, w *MW, p PostedBind, b BindInfo) (*Invalidation, error) {
	return e.bind(pd, qpn, live, w, &p, p.RKey, b)
}

func (e *Engine) bind(pd, qpn uint32, live func() bool, w *MW, p *PostedBind, rkey uint32, b BindInfo) (*Invalidation, error) {
	e.life.mu.Lock()
	defer e.life.mu.Unlock()
	if live != nil && !live() {
		return nil, fmt.Errorf("placement: bind MW: QP %d was destroyed: %w", qpn, ErrInvalid)
	}
	wait, err := e.checkBind(pd, w, p, rkey, &b)
	if err != nil {
		return nil, err
	}
	if wait != nil {
		return &Invalidation{other: wait, then: func() error {
			inv, err := e.bind(pd, qpn, live, w, p, rkey, b)
			if err != nil {
				return err
			}
			return inv.Wait()
		}}, nil
	}
	if b.Length > 0 {
		b.MR.life.windows++ // counted now: the MR cannot go while the bind waits
	}
	if w.mr == nil {
		e.bindLocked(w, qpn, rkey, &b)
		return nil, nil
	}
	// A type 1 rebind: invalidate the old binding, bind after the wait.
	inv := e.invalidateWindowLocked(w)
	unbind := inv.done
	inv.done = func() {
		unbind()
		e.bindLocked(w, qpn, rkey, &b)
	}
	return inv, nil
}

// bindLocked installs w's new binding (the window is unbound and its slot
// invalid); b.MR already counts the window. Called with e.life.mu held.
func (e *Engine) bindLocked(w *MW, qpn, rkey uint32, b *BindInfo) {
	var (
		target *stag.Entry[*MR]
		owner  uint32
		mr     *MR
	)
	if b.Length > 0 {
		mr, target = b.MR, b.MR.ent()
		if w.typ == MWType2 {
			owner = qpn
		}
	}
	ent, err := e.mrs.Rekey(w.key, stag.STag(rkey), w.pd, b.Addr, b.Length, b.Access, mr, target, owner)
	if err != nil {
		panic("placement: a checked bind failed: " + err.Error())
	}
	w.key, w.entry, w.mr, w.qpn = ent.STag, ent, mr, owner
	if w.pending == 0 {
		w.posted = w.key
	}
	if mr == nil {
		return // unbound: the slot stays invalid under the new key
	}
	if err := e.mrs.Validate(ent.STag); err != nil {
		panic("placement: a new window key cannot be validated: " + err.Error())
	}
}

// ReleaseQPWindows invalidates the type 2 windows bound to QP qpn (a QP
// being destroyed: its windows must not open for a later QP of the same
// number) and returns when no byte is placed through them any more.
func (e *Engine) ReleaseQPWindows(qpn uint32) {
	var invs []*Invalidation
	e.life.mu.Lock()
	for _, w := range e.life.mws {
		if w.typ != MWType2 || w.mr == nil || w.qpn != qpn {
			continue
		}
		if b := w.busy; b != nil {
			invs = append(invs, &Invalidation{other: b})
			continue
		}
		invs = append(invs, e.invalidateWindowLocked(w))
	}
	e.life.mu.Unlock()
	for _, inv := range invs {
		inv.Wait()
	}
}

// SetQP sets the number of the QP whose requests the cursor serves (once,
// while idle): a type 2 window opens only for the QP it is bound to.
func (c *Cursor) SetQP(qpn uint32) { c.s.QP = qpn }

// Invalidate begins the invalidation of key (the rkey or lkey of an MR
// allocated with AllocMR, or the rkey of a type 2 window) for a QP of
// protection domain pd numbered qpn: a LOCAL_INV work request (remote
// false) or a SEND with Invalidate received (remote true: the R_Key its
// IETH carries; rxe_resp.c invalidate_rkey). On success every later access through
// the key fails with a remote access error (or local protection error),
// including the next packet of a message in progress; the Invalidation's
// Wait returns when no placement through it is in flight any more, and the
// MR can then be mapped and registered again (or the window bound again).
// An MR that is already invalid is invalidated again without error, as in
// rxe (the Invalidation is nil).
//
// Errors (LOCAL_INV completes with IBV_WC_LOC_QP_OP_ERR, as in rxe; a Send
// with Invalidate is a class J error: the receive completes with
// IBV_WC_REM_INV_REQ_ERR): EINVAL for an unknown or stale key, a key of
// another PD, a type 1 window (o10-37.2.26: only unbinding invalidates it),
// an unbound window (or one whose invalidation has begun and waits for
// its placements), a type 2 window remotely invalidated through a QP
// other than its own, an MR not allocated with AllocMR (rxe invalidates
// only IB_MR_TYPE_MEM_REG MRs), an MR without remote rights remotely
// invalidated (its key is no R_Key); ErrMWBound for an MR with windows
// bound to it.
func (e *Engine) Invalidate(pd, qpn, key uint32, remote bool) (*Invalidation, error) {
	bad := func(why string) error {
		return fmt.Errorf("placement: invalidate %v: %s: %w", stag.STag(key), why, ErrInvalid)
	}
	e.life.mu.Lock()
	defer e.life.mu.Unlock()
	if w := e.life.mws[stag.STag(key).Index()]; w != nil {
		switch {
		case uint32(w.key) != key:
			return nil, bad("stale or forged window key")
		case w.pd != pd:
			return nil, bad("the window belongs to another PD")
		case w.typ == MWType1:
			return nil, bad("a type 1 window cannot be invalidated (o10-37.2.26)")
		case remote && w.mr != nil && w.qpn != qpn:
			// Checked before busy: an invalidation in progress (w.mr
			// and w.qpn are kept until it ends) does not make a SEND
			// with Invalidate on another QP acceptable.
			return nil, bad("the type 2 window is bound to another QP")
		case w.busy != nil:
			// A type 2 window is busy only while an invalidation
			// (LOCAL_INV, SEND with Invalidate, DeallocMW, the
			// destruction of its QP) waits for its placements: its
			// key resolves nothing any more, and it ends unbound. It
			// is not bound now, whatever the timing of that wait.
			return nil, bad("the window is being invalidated (not bound)")
		case w.mr == nil:
			return nil, bad("the window is not bound")
		}
		return e.invalidateWindowLocked(w), nil
	}
	ent := e.mrs.Get(stag.STag(key))
	if ent == nil || ent.Value == nil || ent.Value.ent() != ent {
		return nil, bad("no MR has this key")
	}
	mr := ent.Value
	switch {
	case ent.PD != pd:
		return nil, bad("the MR belongs to another PD")
	case !mr.life.frwr:
		return nil, bad("only MRs allocated with AllocMR (fast registration) can be invalidated")
	case mr.dead.Load():
		return nil, bad("the MR is being deregistered")
	case remote && ent.Access&stag.AccessRemote == 0:
		return nil, bad("the MR grants no remote access: its key is no R_Key")
	case mr.life.windows > 0:
		return nil, operr.Wrap("placement", fmt.Sprintf("invalidate %v", stag.STag(key)), ErrMWBound)
	case mr.life.busy != nil:
		return &Invalidation{other: mr.life.busy}, nil
	case !mr.life.valid:
		return nil, nil
	}
	if err := e.mrs.Invalidate(mr.stag()); err != nil {
		panic("placement: the key of a registered MR is missing: " + err.Error())
	}
	mr.life.valid = false
	mr.life.busy = make(chan struct{})
	return &Invalidation{e: e, drain: mr.ent(), busy: mr.life.busy, done: func() { mr.life.busy = nil }}, nil
}

// beginDereg marks mr deregistered, after waiting for an invalidation or
// re-registration of it in progress. It refuses while windows are bound to
// it (ErrMWBound, EINVAL as rxe_dereg_mr, IBTA 10.6.7: the
// windows must be invalidated or deallocated first), while a remap of it
// is in progress (ErrRemapInProgress, EBUSY: PrepareRemap until the
// Remapping's Release or Abort, which is the caller's to call, so that
// waiting for it could wait for ever; ReregMR refuses the same way) and a
// second time (ErrDeregistered). Binds check the mark under the same lock,
// so none begins after it.
func (e *Engine) beginDereg(mr *MR) error {
	e.life.mu.Lock()
	defer e.life.mu.Unlock()
	for mr.life.busy != nil {
		b := mr.life.busy
		e.life.mu.Unlock()
		<-b
		e.life.mu.Lock()
	}
	if mr.life.remap != nil && !mr.dead.Load() {
		return fmt.Errorf("placement: dereg MR: Release or Abort the remap of the MR first: %w", ErrRemapInProgress)
	}
	if mr.life.windows > 0 {
		return operr.Wrap("placement", "dereg MR", ErrMWBound)
	}
	if !mr.dead.CompareAndSwap(false, true) {
		return ErrDeregistered
	}
	return nil
}

// WindowQPs describes who may use mr through memory windows, for the
// qp-allowed suspension scope: the QPs that type 2 windows bound to mr are
// bound to, and whether a type 1 window (usable by every QP of the PD) is
// bound to it.
func (e *Engine) WindowQPs(mr *MR) (qpns []uint32, type1 bool) {
	e.life.mu.Lock()
	defer e.life.mu.Unlock()
	if mr.life.windows == 0 {
		return nil, false
	}
	for _, w := range e.life.mws {
		switch {
		case w.mr != mr:
		case w.typ == MWType1:
			type1 = true
		default:
			qpns = append(qpns, w.qpn)
		}
	}
	return qpns, type1
}
