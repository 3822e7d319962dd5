package placement

import (
	"fmt"
	"slices"
	"sync"
)

// Scope is how much traffic a suspension of placement pauses, narrowest
// first. A device reports the finest scope it can pause at; a suspension
// asked at a finer one is widened to it.
type Scope uint8

// Suspension scopes.
const (
	// ScopeMR pauses only the traffic that places into the MR: a QP whose
	// next packet targets it stalls (RC places in PSN order), other QPs go
	// on.
	ScopeMR Scope = iota + 1
	// ScopeQPAllowed pauses every QP allowed to use the MR: those the
	// application declared it advertised the rkey to (MR.Advertise), or
	// else every QP of the MR's PD.
	ScopeQPAllowed
	// ScopePD pauses every QP of the MR's protection domain.
	ScopePD
	// ScopeDevice pauses all traffic of the device.
	ScopeDevice
)

var scopeNames = [...]string{ScopeMR: "mr", ScopeQPAllowed: "qp-allowed", ScopePD: "pd", ScopeDevice: "device"}

func (s Scope) String() string {
	if s >= ScopeMR && s <= ScopeDevice {
		return scopeNames[s]
	}
	return fmt.Sprintf("Scope(%d)", uint8(s))
}

// Valid reports whether s is one of the four scopes.
func (s Scope) Valid() bool { return s >= ScopeMR && s <= ScopeDevice }

// ParseScope parses "mr", "qp-allowed", "pd" or "device".
func ParseScope(v string) (Scope, error) {
	for s := ScopeMR; s <= ScopeDevice; s++ {
		if scopeNames[s] == v {
			return s, nil
		}
	}
	return 0, fmt.Errorf("placement: scope %q: want mr, qp-allowed, pd or device: %w", v, ErrInvalid)
}

// Scopes lists the scopes, narrowest first.
var Scopes = []Scope{ScopeMR, ScopeQPAllowed, ScopePD, ScopeDevice}

// SuspendMR pauses placement into mr (its key's slot refuses every access
// that writes: RDMA WRITE, atomics, and SEND or READ-response data scattered
// into it; reads go on) and waits until the placements already past the
// check have finished: a grace period of the readers (the receive loops)
// and the drain of the counted references. Afterwards no byte is written
// into mr until ResumeMR. A re-registration or invalidation of mr in
// progress is waited for first; the suspension outlives later ones (the
// key changes, the suspension stays). Errors: a deregistered MR, an MR
// already suspended, an invalid (invalidated FRWR) MR (EINVAL).
func (e *Engine) SuspendMR(mr *MR) error {
	if mr == nil || mr.eng != e {
		return fmt.Errorf("placement: suspend: not a live MR of this device: %w", ErrInvalid)
	}
	// A re-registration or invalidation in progress changes the MR's key
	// and entry: wait for it, and read them under the lock it changes
	// them under.
	e.life.mu.Lock()
	for mr.life.busy != nil {
		b := mr.life.busy
		e.life.mu.Unlock()
		<-b
		e.life.mu.Lock()
	}
	if mr.dead.Load() {
		e.life.mu.Unlock()
		return fmt.Errorf("placement: suspend: not a live MR of this device: %w", ErrInvalid)
	}
	key, ent := mr.stag(), mr.ent()
	err := e.mrs.Suspend(key)
	e.life.mu.Unlock()
	if err != nil {
		return fmt.Errorf("placement: suspend MR %v: already suspended, or not valid (%v): %w", key, err, ErrInvalid)
	}
	e.mrs.Synchronize()
	ent.Drain()
	return nil
}

// ResumeMR ends SuspendMR: placement into mr goes on. Errors: an MR that
// is not suspended (EINVAL).
func (e *Engine) ResumeMR(mr *MR) error {
	if mr == nil || mr.eng != e {
		return fmt.Errorf("placement: resume: not an MR of this device: %w", ErrInvalid)
	}
	e.life.mu.Lock() // the key may have changed (REG_MR of an FRWR MR)
	key := mr.stag()
	err := e.mrs.Resume(key)
	e.life.mu.Unlock()
	if err != nil {
		return fmt.Errorf("placement: resume %v: %w: %w", key, err, ErrInvalid)
	}
	return nil
}

// Synchronize waits until every reader (receive loop) that was placing when
// it was called has quiesced: after a gate that readers check while online
// was closed, no placement that passed it is still running.
func (e *Engine) Synchronize() { e.mrs.Synchronize() }

// Enter puts the reader online (if it is not). A receive loop calls it
// before it checks a suspension gate, so that Synchronize waits for it.
func (r *Reader) Enter() { r.r.Enter() }

// advertised is the set of QPs an MR's rkey was declared advertised to.
type advertised struct {
	mu   sync.Mutex
	qpns []uint32
}

// Advertise declares that the MR's rkey was given to the peer of the QP
// whose number is qpn (the application's declaration that defines the
// qp-allowed scope). Repeated declarations are kept once.
func (m *MR) Advertise(qpn uint32) {
	m.adv.mu.Lock()
	defer m.adv.mu.Unlock()
	if !slices.Contains(m.adv.qpns, qpn) {
		m.adv.qpns = append(m.adv.qpns, qpn)
	}
}

// AdvertisedTo returns the QPNs declared with Advertise (nil: none, and
// the qp-allowed scope means every QP of the MR's PD).
func (m *MR) AdvertisedTo() []uint32 {
	m.adv.mu.Lock()
	defer m.adv.mu.Unlock()
	return slices.Clone(m.adv.qpns)
}

// registry lists an engine's live MRs, for the remap of an address range.
type registry struct {
	mu  sync.Mutex
	mrs map[*MR]struct{}
}

func (r *registry) add(m *MR) {
	r.mu.Lock()
	if r.mrs == nil {
		r.mrs = make(map[*MR]struct{})
	}
	r.mrs[m] = struct{}{}
	r.mu.Unlock()
}

func (r *registry) remove(m *MR) {
	r.mu.Lock()
	delete(r.mrs, m)
	r.mu.Unlock()
}

// PDInUse names what keeps protection domain pd in use ("an MR or a
// memory window"), or returns "" when nothing registered or allocated on
// the device is in it (ibv_dealloc_pd's EBUSY check, placement's half).
func (e *Engine) PDInUse(pd uint32) string {
	if e.mrs.InPD(pd) {
		return "an MR or a memory window"
	}
	return ""
}

// MRsCovering returns the live MRs (pinned or explicit ODP, not implicit)
// whose range holds all of [addr, addr+n).
func (e *Engine) MRsCovering(addr, n uint64) []*MR {
	e.reg.mu.Lock()
	defer e.reg.mu.Unlock()
	var out []*MR
	for m := range e.reg.mrs {
		if m.Implicit() || m.dead.Load() {
			continue
		}
		if m.ent().CheckRange(addr, n) == 0 {
			out = append(out, m)
		}
	}
	return out
}
