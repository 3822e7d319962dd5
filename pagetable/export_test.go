package pagetable

// RaceEnabled exports raceEnabled to the external tests.
const RaceEnabled = raceEnabled

// MirrorWord64 is mirrorWord64 with a mirror loaded earlier (m) and the
// word w found with it: what an atomic that raced SwitchFrames holds.
func (t *Table) MirrorWord64(m *Mirror, iova uint64, w *uint64, op func(*uint64) uint64) (uint64, Result) {
	return t.mirrorWord64(m.pages, iova, w, op)
}
