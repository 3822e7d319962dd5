package softrdma

import (
	"fmt"
	"time"

	"github.com/softrdma/softrdma/internal/operr"
	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/transport"
)

// Scope is how much traffic a pause of placement stops (placement.Scope):
// ScopeMR, ScopeQPAllowed, ScopePD, ScopeDevice, narrowest first.
type Scope = placement.Scope

// Suspension scopes.
const (
	ScopeMR        = placement.ScopeMR
	ScopeQPAllowed = placement.ScopeQPAllowed
	ScopePD        = placement.ScopePD
	ScopeDevice    = placement.ScopeDevice
)

// ParseScope parses "mr", "qp-allowed", "pd" or "device".
func ParseScope(s string) (Scope, error) { return placement.ParseScope(s) }

// PausePolicy is what happens to packets whose placement is paused:
// PolicyHold (queued, replayed in order) or PolicyNAK (RNR NAK, the
// requester backs off). See transport.PausePolicy.
type PausePolicy = transport.PausePolicy

// Pause policies.
const (
	PolicyHold = transport.PolicyHold
	PolicyNAK  = transport.PolicyNAK
)

// ParsePausePolicy parses "hold" or "nak".
func ParsePausePolicy(s string) (PausePolicy, error) { return transport.ParsePausePolicy(s) }

// FinestScope returns the finest scope a profile can pause placement at:
// ProfileODP pauses one MR (ScopeMR), as an ODP-capable NIC can by
// invalidating one key's translations; ProfileT3 pauses a whole PD, as the
// Chelsio T3 had to; ProfileCoarse pauses the device.
func (p Profile) FinestScope() Scope {
	switch p {
	case ProfileT3:
		return ScopePD
	case ProfileCoarse:
		return ScopeDevice
	}
	return ScopeMR
}

// widen returns the scope a request at s gets on this device, and whether
// it was widened.
func (d *Device) widen(s Scope) (Scope, bool) {
	if f := d.profile.FinestScope(); s < f {
		return f, true
	}
	return s, false
}

// Suspension is placement paused at a scope (Device.Suspend).
type Suspension struct {
	s         *transport.Suspension
	Requested Scope // the scope asked for
	Scope     Scope // the scope in force (wider when the device cannot express the request)
	Widened   bool
}

// Suspend pauses placement at scope for mr, with policy for the paused
// packets, and returns once no placement it covers is in flight. A scope
// finer than the profile's FinestScope is widened to it and reported as
// widened. Every scope pauses writes into mr itself; ScopeQPAllowed also
// pauses the QPs the rkey was declared advertised to (AdvertiseRKey; none
// declared: every QP of mr's PD), ScopePD every QP of mr's PD, ScopeDevice
// every QP (mr may then be nil). Errors (EINVAL): an invalid scope or
// policy, a nil MR at a requested scope other than ScopeDevice (whatever
// the profile widens it to), an MR already suspended, deregistered or of
// another device; a refused Suspend leaves the active suspensions and
// their policy as they were.
func (d *Device) Suspend(scope Scope, mr *MR, policy PausePolicy) (*Suspension, error) {
	if !scope.Valid() {
		return nil, fmt.Errorf("softrdma: suspend: scope %v: %w", scope, placement.ErrInvalid)
	}
	eff, widened := d.widen(scope)
	// The scope asked for decides, not the one in force: the same call
	// is refused on every profile (a coarse device widens every scope to
	// ScopeDevice, where a nil MR would otherwise pass).
	if mr == nil && scope != ScopeDevice {
		return nil, fmt.Errorf("softrdma: suspend at scope %v: nil MR: %w", scope, placement.ErrInvalid)
	}
	s, err := d.t.Suspend(eff, mr, policy)
	if err != nil {
		return nil, operr.Wrap("softrdma", "suspend", err)
	}
	return &Suspension{s: s, Requested: scope, Scope: eff, Widened: widened}, nil
}

// Resume ends a suspension; the held packets are replayed in order. It
// reports the packets held, NAKed and dropped, the bytes delayed and the
// QPs paused. Errors (EINVAL): a nil suspension, one already resumed, one
// of another device (which stays active: its own device resumes it); the
// suspended MR deregistered meanwhile (the suspension ends all the same).
func (d *Device) Resume(s *Suspension) (transport.SuspendReport, error) {
	if s == nil || s.s == nil {
		return transport.SuspendReport{}, fmt.Errorf("softrdma: resume: nil suspension: %w", placement.ErrInvalid)
	}
	rep, err := d.t.Resume(s.s)
	if err != nil {
		return rep, operr.Wrap("softrdma", "resume", err)
	}
	return rep, nil
}

// AdvertiseRKey declares that mr's rkey was given to the peer of qp: the
// QPs so declared are what ScopeQPAllowed pauses.
func (d *Device) AdvertiseRKey(mr *MR, qp *QP) { mr.Advertise(uint32(qp.QPN())) }

// RemapReport is what one remap cost (Device.Remap).
type RemapReport struct {
	Requested, Scope Scope
	Widened          bool
	Policy           PausePolicy
	PrecopyUs        float64 // pre-copy of every page, traffic flowing (µs)
	CriticalUs       float64 // from the pause to the resume (µs)
	ViewSwitchUs     float64 // time after the resume while the NIC writes old and new frames: the application's mapping switches, then (pinned MRs) the NIC's table, and the copies in flight are waited for (µs)
	PagesMoved       int     // pages switched to new frames
	PagesRecopied    int     // pages written during the pre-copy, copied again in the critical section
	QPsPaused        int     // QPs that had a packet held or NAKed
	PacketsHeld      uint64
	PacketsNAKed     uint64
	PacketsDropped   uint64
	BytesDelayed     uint64 // payload bytes of the packets held or NAKed
}

// Remap moves mr's pages to new frames while traffic runs (the remap
// protocol, docs/scopes.md): dirty tracking and a pre-copy of every page
// with traffic flowing; then the critical section — placement paused at
// scope (widened to the device's finest, and always including mr itself),
// the placements in flight waited for, the pages dirtied meanwhile copied
// again — and resume; the held packets are replayed. The switch to the new
// frames the critical section only prepares: the NIC writes every byte to
// the old and the new frames from then on (an ODP MR's table into the
// frames its entries name and into the new frames), and after the resume
// the application's mapping switches (mmap MAP_FIXED onto the new frames),
// then the NIC's table (which ends the double writes; an ODP MR's entries
// are pointed at the new frames), the copies still writing the old frames are
// waited for, and a pinned MR's linear mapping comes back (ViewSwitchUs). The application reads the old
// frames until its mapping switches and the new ones after; both hold
// every write completed before, so a write whose completion it has seen is
// never missing. (Writes of the same bytes by different QPs at the same
// moment are unordered, as IBTA leaves them, and may then differ between
// the old and the new frames.) It works for pinned MRs and explicit ODP
// MRs on the device's AddressSpace. The application must not itself write
// mr's pages during the remap.
//
// Errors: placement.ErrNotRemappable (memory not of the address space, an
// implicit ODP MR), an invalid scope or policy, a deregistered MR;
// hostmem.ErrShared when another ODP MR (a second MR on the same pages, or
// an implicit ODP MR) covers the pages, since its writes would escape the
// remap's dirty tracking; the host's (frame pool exhausted, pages freed).
// On error the MR keeps its frames and its data.
func (d *Device) Remap(mr *MR, scope Scope, policy PausePolicy) (RemapReport, error) {
	if !scope.Valid() {
		return RemapReport{}, fmt.Errorf("softrdma: remap: scope %v: %w", scope, placement.ErrInvalid)
	}
	if policy > PolicyNAK {
		return RemapReport{}, fmt.Errorf("softrdma: remap: policy %d: %w", policy, placement.ErrInvalid)
	}
	d.remapMu.Lock()
	defer d.remapMu.Unlock()
	rm, err := d.place.PrepareRemap(mr)
	if err != nil {
		return RemapReport{}, operr.Wrap("softrdma", "remap", err)
	}
	start := time.Now()
	s, err := d.Suspend(scope, mr, policy)
	if err != nil {
		rm.Abort()
		return RemapReport{}, operr.Wrap("softrdma", "remap", err)
	}
	cerr := rm.Commit()
	sr, rerr := d.Resume(s)
	crit := time.Since(start)
	if cerr != nil {
		rm.Abort()
		return RemapReport{}, fmt.Errorf("softrdma: remap: %w", cerr)
	}
	ferr := rm.Finish()
	rm.Release()
	if ferr != nil {
		return RemapReport{}, fmt.Errorf("softrdma: remap: %w", ferr)
	}
	rep := RemapReport{
		Requested: scope, Scope: s.Scope, Widened: s.Widened, Policy: policy,
		PrecopyUs: float64(rm.Precopy.Nanoseconds()) / 1e3, CriticalUs: float64(crit.Nanoseconds()) / 1e3,
		ViewSwitchUs: float64(rm.ViewSwitch.Nanoseconds()) / 1e3,
		PagesMoved:   rm.Pages, PagesRecopied: rm.Recopied, QPsPaused: sr.QPsPaused,
		PacketsHeld: sr.Held, PacketsNAKed: sr.NAKed, PacketsDropped: sr.Dropped, BytesDelayed: sr.BytesDelayed,
	}
	if rerr != nil {
		return rep, operr.Wrap("softrdma", "remap", rerr)
	}
	return rep, nil
}

// RemapRange remaps the MR that covers [addr, addr+length) (Remap of the
// whole MR). Errors: an empty range (length 0: it names no page; EINVAL),
// no MR of the device covers the whole range (EINVAL; one that covers
// part of it is not chosen), more than one does
// (EINVAL: remap each), and those of Remap.
func (d *Device) RemapRange(addr, length uint64, scope Scope, policy PausePolicy) (RemapReport, error) {
	if length == 0 {
		return RemapReport{}, fmt.Errorf("softrdma: remap [%#x, +0): empty range: %w", addr, placement.ErrInvalid)
	}
	mrs := d.place.MRsCovering(addr, length)
	switch len(mrs) {
	case 0:
		return RemapReport{}, fmt.Errorf("softrdma: remap [%#x, +%d): no MR covers the whole range: %w", addr, length, placement.ErrInvalid)
	case 1:
		return d.Remap(mrs[0], scope, policy)
	}
	return RemapReport{}, fmt.Errorf("softrdma: remap [%#x, +%d): %d MRs cover the range: %w", addr, length, len(mrs), placement.ErrInvalid)
}

// SuspendCounters returns the device's counts of paused packets (held,
// NAKed, dropped, bytes delayed) since it was opened.
func (d *Device) SuspendCounters() transport.SuspendCounters { return d.t.SuspendCounters() }
