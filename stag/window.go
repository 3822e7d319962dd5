package stag

import (
	"math"
	"runtime"
)

// Re-registration and memory windows.
//
// A fast registration (FRWR's REG_MR work request), a re-registration
// (ibv_rereg_mr) and a window bind all give an index a new registration
// whose key byte the consumer chooses (ibv_inc_rkey): Rekey replaces the
// entry of an index, which Alloc cannot do.
//
// A memory window (IBTA 10.6.7) is an entry of its own index, key, PD,
// range and rights, whose Target is the region it is bound to. Its slot
// lacks rightRegion, so every access through it takes the slow path
// (openWindow): the window's checks (key, PD, remote only, its QP for a
// type 2 window, rights, state, bounds), then the region's slot, which the
// Span then holds as if it had been opened on the region, with the
// window's slot kept aside (Span.via) and the Span's ctl marked (it lacks
// rightRegion, so its Current check fails at each packet, whose Refresh
// then checks the window too). The region's state, suspension,
// linear mapping and reference count therefore govern window accesses too:
// whatever pauses, remaps or drains the region covers them. Invalidating a
// window invalidates its slot and bumps the region's count (Touch); a Span
// opened through the window fails its next Refresh (the window's ctl has
// changed), and Spans on the region refresh once.

// Rekey replaces the entry that old names with a new registration of the
// same index under key, whose key byte is the caller's choice (the
// consumer key of a fast registration or a window bind: IBTA 10.6.3.5,
// ibv_inc_rkey), and publishes it in state Invalid, as Alloc does; the
// caller installs a linear mapping if any and validates it. The old entry
// must not be valid (Invalidate it and wait for its users first): it
// becomes Free, so holders of the old *Entry fail their state check and
// Spans on it fail Refresh. A suspension (Suspend) carries over to the new
// entry. A key byte equal to the old one is allowed (the
// old key then names the new registration, as on hardware).
//
// target, when not nil, makes the new entry a memory window bound to that
// region entry, whose range must hold [iova, iova+length); qp, when not 0,
// restricts the window to that QP (type 2). Errors: ErrNoEntry (old is not
// the live entry of its index, or key names another index), ErrState (old
// is valid), ErrRange (a wrapping range, or a window outside its region).
func (t *Table[V]) Rekey(old, key STag, pd uint32, iova, length uint64, access Access, value V, target *Entry[V], qp uint32) (*Entry[V], error) {
	if length > 0 && length-1 > math.MaxUint64-iova {
		return nil, ErrRange
	}
	if target != nil && target.CheckRange(iova, length) != OK {
		return nil, ErrRange
	}
	if key.Index() != old.Index() {
		return nil, ErrNoEntry
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, s, err := t.entry(old)
	if err != nil {
		return nil, err
	}
	if e.State() == StateValid {
		return nil, ErrState
	}
	// A suspension of the index outlives the registration (SuspendMR
	// promises that nothing is written until ResumeMR, and ResumeMR names
	// the MR, whatever key it has by then).
	suspended := s.ctl.Load() & ctlSuspended
	e.state.Store(uint32(StateFree))
	n := &Entry[V]{
		STag:   key,
		PD:     pd,
		IOVA:   iova,
		Length: length,
		Access: access,
		Value:  value,
		Target: target,
		QP:     qp,
	}
	t.publish(n)
	if suspended != 0 {
		s.setFlags(s.ctl.Load()&ctlFlagsMask | suspended)
	}
	t.mu.keys[key.Index()] = key.Key()
	return n, nil
}

// Touch bumps the sequence count of key's slot without changing it, so that
// every Span on the entry fails its next Current check and calls Refresh.
// The invalidation of a window touches its region: the Spans opened
// through the window hold the region's slot.
func (t *Table[V]) Touch(key STag) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, s, err := t.entry(key)
	if err != nil {
		return err
	}
	s.setFlags(s.ctl.Load() & ctlFlagsMask)
	return nil
}

// checkWindow makes the checks of a window access (rxe_lookup_mw's, in its
// order: key, PD, QP, rights, state) and the bounds check against the
// window's range, for QP qp.
func (w *snapshot[V]) checkWindow(pd uint32, key STag, need Access, iova, n uint64, qp uint32) Reason {
	switch {
	case w.entry == nil:
		return NoEntry
	case STag(w.keyPD) != key:
		return KeyMismatch
	case uint32(w.keyPD>>32) != pd:
		return PDMismatch
	case need&AccessRemote == 0:
		return AccessDenied // remote only: a window is never an L_Key
	case w.entry.QP != 0 && w.entry.QP != qp:
		return QPMismatch
	case Access(w.ctl)&need != need:
		return AccessDenied
	case w.ctl&ctlValid == 0:
		return Invalid
	case iova < w.iova || n > w.length || iova-w.iova > w.length-n:
		return OutOfBounds
	}
	return OK
}

// openWindow is Open through the window in slot s (n > 0; sp holds
// nothing; a bound Span's reader is online): the window's checks, then the
// region's slot, whose entry sp then references as Open on the region
// would (a count, unless bound), with the window's slot kept in sp.via.
// The count is raised before both slots are read again, so an Open that
// races the invalidation of the window (window slot, then region Touch,
// then Synchronize and Drain of the region) either fails or is waited for.
func (t *Table[V]) openWindow(sp *Span[V], s *slot[V], pd uint32, key STag, need Access, iova, n uint64) Reason {
	for spins := 0; ; spins++ {
		var w snapshot[V]
		s.read(&w)
		if r := w.checkWindow(pd, key, need, iova, n, sp.QP); r != OK {
			return r
		}
		mr := w.entry.Target
		if mr == nil {
			// The index holds a region now under the same key (reused
			// 256 registrations later, between two loads): refuse
			// rather than resolve it twice.
			return Invalid
		}
		ms := t.slot(mr.STag)
		var m snapshot[V]
		ms.read(&m)
		switch {
		case m.entry != mr || m.ctl&ctlValid == 0:
			return Invalid // the region went away under a bound window
		case m.ctl&ctlSuspended != 0 && need&writeRights != 0:
			return Suspended
		}
		if sp.rd == nil {
			mr.refs.Add(1)
		}
		if ms.ctl.Load() == m.ctl && s.ctl.Load() == w.ctl {
			// ctl without rightRegion never equals the region's slot
			// (which always has it): Current fails at every packet and
			// Refresh checks the window too (refreshWindow).
			sp.Entry, sp.slot, sp.ctl = mr, ms, m.ctl&^rightRegion
			sp.via, sp.viaCtl = s, w.ctl
			sp.base = m.base(iova, n, sp.Write)
			sp.IOVA, sp.Len = iova, n
			return OK
		}
		if sp.rd == nil {
			mr.Release()
		}
		if spins > 100 {
			runtime.Gosched()
		}
	}
}

// refreshWindow is RefreshReason for a Span opened through a window. Its
// Current check fails at every packet (its ctl lacks rightRegion), so that
// each packet checks the window as well as the region: in the common case
// two loads, the region's ctl unchanged since the last full check and the
// window's ctl unchanged since Open. The caller's reader is online.
func (sp *Span[V]) refreshWindow() Reason {
	if sp.via.ctl.Load() != sp.viaCtl {
		return Invalid // the window was invalidated or rebound
	}
	if sp.slot.ctl.Load() == sp.ctl|rightRegion {
		return OK
	}
	var sn snapshot[V]
	sp.slot.read(&sn)
	if sn.entry != sp.Entry || sn.ctl&ctlValid == 0 || STag(sn.keyPD) != sp.Entry.STag {
		return Invalid
	}
	if sp.Write && sn.ctl&ctlSuspended != 0 {
		return Suspended
	}
	if sp.via.ctl.Load() != sp.viaCtl {
		return Invalid
	}
	sp.ctl = sn.ctl &^ rightRegion
	sp.base = sn.base(sp.IOVA, sp.Len, sp.Write)
	return OK
}

// Window reports whether the Span holds a range opened through a memory
// window.
func (sp *Span[V]) Window() bool { return sp.Entry != nil && sp.ctl&rightRegion == 0 }

// Suspended reports whether placement through key is suspended now
// (Suspend). False for an unknown key.
func (t *Table[V]) Suspended(key STag) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, s, err := t.entry(key)
	return err == nil && s.ctl.Load()&ctlSuspended != 0
}
