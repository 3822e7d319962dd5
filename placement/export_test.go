package placement

// SetRemapDrainedHook makes PrepareRemap of a pinned MR call f once it has
// waited for the copies in flight (before the pre-copy); it returns the
// undo.
func SetRemapDrainedHook(f func(mr *MR)) (undo func()) {
	testHookRemapDrained = f
	return func() { testHookRemapDrained = nil }
}

// DirectBytes is what a pinned table's CopyIn checks before it copies
// without walking the entries (pagetable.Table.CopyIn's direct path): the
// region's NIC-side bytes if the table is direct and writable now, nil
// otherwise. A test that holds them holds a copy past that check.
func (m *MR) DirectBytes() []byte {
	if m.table == nil {
		return nil
	}
	if flat, writable := m.table.Linear(); writable {
		return flat
	}
	return nil
}

// OccupyAsyncFaults takes every slot of the background faults (as
// maxAsyncFaults faults in flight would), waiting for those running to
// end; release gives the slots back.
func (e *Engine) OccupyAsyncFaults() (release func()) {
	for range cap(e.asyncSem) {
		e.asyncSem <- struct{}{}
	}
	return func() {
		for range cap(e.asyncSem) {
			<-e.asyncSem
		}
	}
}
