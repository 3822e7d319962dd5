package hostmem

import "sync/atomic"

// atomicRanges holds an immutable sorted slice, replaced as a whole.
type atomicRanges struct{ p atomic.Pointer[[]spaceRange] }

func (a *atomicRanges) load() []spaceRange {
	if p := a.p.Load(); p != nil {
		return *p
	}
	return nil
}

func (a *atomicRanges) store(r []spaceRange) { a.p.Store(&r) }
