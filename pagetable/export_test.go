package pagetable

import "github.com/softrdma/softrdma/hostmem"

// RaceEnabled exports raceEnabled to the external tests.
const RaceEnabled = raceEnabled

// MirrorWord64 is mirrorWord64 with a mirror loaded earlier (m): what an
// atomic that raced SwitchFrames holds (it found its word with the mirror,
// before the switch).
func (t *Table) MirrorWord64(m *Mirror, iova uint64, op func(*uint64) uint64) (uint64, Result) {
	return t.mirrorWord64(m.pages, iova, op)
}

// EnterCopy starts a copy of [iova, iova+n) as CopyIn does (write) and
// stops after its check, so that a test holds a copy in flight; ExitCopy
// ends it. ok is false (and nothing is held) if the check failed.
func (t *ODP) EnterCopy(iova, n uint64, write bool) (ep uint32, ok bool) {
	first, count, in := t.pages(iova, n)
	if !in {
		return 0, false
	}
	need := Present
	if write {
		need |= Writable
	}
	ep = t.enter()
	if t.check(first, count, need) != OK {
		t.exit(ep)
		return 0, false
	}
	return ep, true
}

// ExitCopy ends a copy EnterCopy started.
func (t *ODP) ExitCopy(ep uint32) { t.exit(ep) }

// EvictRange clears [iova, iova+n) as the budget's eviction does (and
// waits for the copies in flight, as it does); it returns the pages
// cleared.
func (t *ODP) EvictRange(iova, n uint64) int {
	first, count, ok := t.pages(iova, n)
	if !ok {
		return 0
	}
	return t.clear(first, count, true)
}

// CopyInHeld is CopyIn of b at iova (pages present and writable) that
// calls held once its bytes are in the application's view, before the
// rest of the write (the mirror, the Dirty bits) and its exit from the
// copy section. It reports whether the check passed.
func (t *ODP) CopyInHeld(iova uint64, b []byte, held func()) bool {
	first, count, in := t.pages(iova, uint64(len(b)))
	if !in {
		return false
	}
	ep := t.enter()
	defer t.exit(ep)
	if t.check(first, count, Present|Writable) != OK {
		return false
	}
	t.write(first, count, iova-t.base, b, held)
	return true
}

// Mirroring reports whether a mirror is started (StartMirror) and not yet
// ended (SwitchMirrored).
func (t *ODP) Mirroring() bool { return t.mirror.Load() != nil }

// SwitchFramesHeld is SwitchFrames calling between once the entries point
// at the new frames, before the mirror ends.
func (t *Table) SwitchFramesHeld(frames []hostmem.Frame, between func()) error {
	return t.switchFrames(frames, between)
}

// SetResolvedHook makes f run in every fault batch between the host's
// resolve and the install (nil: none).
func (t *ODP) SetResolvedHook(f func()) { t.resolvedHook = f }

// EntryAt returns the flags of the entry of iova's page and the frame it
// names (meaningful only while Present); ok is false outside the table or
// before an implicit table's child exists.
func (t *ODP) EntryAt(iova uint64) (f hostmem.Frame, fl Flags, ok bool) {
	first, _, in := t.pages(iova, 1)
	if !in {
		return 0, 0, false
	}
	e := t.entry(first)
	if e == nil {
		return 0, 0, false
	}
	fl = Flags(e.flags.Load())
	return hostmem.Frame(e.frame.Load()), fl, true
}
