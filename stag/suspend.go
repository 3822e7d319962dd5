package stag

// Suspend pauses placement through key: from now on every access that
// writes memory (a right in AccessLocalWrite, AccessRemoteWrite,
// AccessRemoteAtomic) fails with Suspended — Open, Acquire, Lookup and
// LookupRange of a new access, and Span.Refresh of a Span opened before
// (every Span on the entry stops being Current) — while accesses that only
// read go on. The linear mapping's write bit is withdrawn and restored by
// Resume. Placements already past their check are not waited for: the
// caller follows with Synchronize (bound readers) and Drain (counted
// references), after which no byte is written through the entry until
// Resume. Suspending a suspended entry is an error (ErrState), as are an
// unknown key (ErrNoEntry) and an entry that is not valid.
func (t *Table[V]) Suspend(key STag) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, s, err := t.entry(key)
	if err != nil {
		return err
	}
	c := s.ctl.Load()
	if c&ctlSuspended != 0 || e.State() != StateValid {
		return ErrState
	}
	flags := c&ctlFlagsMask | ctlSuspended
	if flags&ctlLinearWrite != 0 {
		flags = flags&^ctlLinearWrite | ctlResumeWrite
	}
	seq := s.beginWrite()
	s.endWrite(seq, flags)
	return nil
}

// Resume ends a suspension: writes are placed again, and the linear
// mapping is writable again if it was (or was set writable meanwhile).
// Resuming an entry that is not suspended is ErrState.
func (t *Table[V]) Resume(key STag) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, s, err := t.entry(key)
	if err != nil {
		return err
	}
	c := s.ctl.Load()
	if c&ctlSuspended == 0 {
		return ErrState
	}
	flags := c & ctlFlagsMask &^ ctlSuspended
	if flags&ctlResumeWrite != 0 {
		flags = flags&^ctlResumeWrite | ctlLinearWrite
	}
	seq := s.beginWrite()
	s.endWrite(seq, flags)
	return nil
}
