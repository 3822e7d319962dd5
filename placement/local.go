package placement

import (
	"github.com/softrdma/softrdma/internal/memcopy"
	"github.com/softrdma/softrdma/pagetable"
	"github.com/softrdma/softrdma/stag"
)

// SGE is a scatter/gather element (ibv_sge): Length bytes at Addr in the
// region whose local key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// CheckSGL validates an SGL when a work request is posted: every non-empty
// element's L_Key must name a valid region of pd granting need (0 to read,
// stag.AccessLocalWrite to write) that holds the element. It returns the
// SGL's total length. Elements of length 0 are not checked: they name no
// memory. A failure is LocalProtErr; a suspended region passes (the work
// request waits when it places).
func (e *Engine) CheckSGL(pd uint32, sgl []SGE, need stag.Access) (total uint64, st Status) {
	for i := range sgl {
		s := &sgl[i]
		total += uint64(s.Length)
		if s.Length == 0 {
			continue
		}
		if _, _, r := e.mrs.LookupRange(pd, stag.STag(s.LKey), need, s.Addr, uint64(s.Length)); r != stag.OK && r != stag.Suspended {
			return 0, LocalProtErr
		}
	}
	return total, OK
}

// sglTotal returns the SGL's total length.
func sglTotal(sgl []SGE) uint64 {
	var t uint64
	for i := range sgl {
		t += uint64(sgl[i].Length)
	}
	return t
}

// Gather copies len(dst) bytes of the SGL, starting at byte offset of the
// SGL, into dst: the requester's payload of a SEND or RDMA WRITE packet
// (a local read: no right is needed). Bytes beyond
// the SGL's total are LocalLenErr; a key, PD or bounds failure is
// LocalProtErr. Keys are checked again at each call because the region may
// have been deregistered since the work request was posted.
func (e *Engine) Gather(pd uint32, sgl []SGE, offset uint64, dst []byte) Status {
	return e.sgl(pd, sgl, offset, dst, false)
}

// A Copier copies what GatherWith gathers: the transport's computes the
// packet's ICRC over the payload while it copies it, so that the payload
// is read once for both.
type Copier interface {
	// Copy copies src into dst, which is as long: the bytes of a region
	// whose memory is one linear range.
	Copy(dst, src []byte)
	// Copied is told of bytes that the region's page table copied into
	// the destination itself (memory that is not one linear range). It is
	// called once the bytes are all there: a page fault that interrupts
	// the copy and retries it does not show.
	Copied(p []byte)
}

// GatherWith is Gather, with the copy done by c. c sees the bytes in
// order, each byte once (when the result is OK).
//
// It is sgl's read half written out again: dst escapes into the Copier's
// interface call, and in a shared function the buffers of Gather's and
// Scatter's callers would escape with it (a UD receive's GRH on the stack
// became an allocation per datagram).
func (e *Engine) GatherWith(pd uint32, sgl []SGE, offset uint64, dst []byte, c Copier) Status {
	n := uint64(len(dst))
	if total := sglTotal(sgl); offset > total || n > total-offset {
		return LocalLenErr
	}
	done := uint64(0)
	for i := 0; done < n; i++ {
		s := &sgl[i]
		l := uint64(s.Length)
		if offset >= l {
			offset -= l
			continue
		}
		k := min(l-offset, n-done)
		var sp stag.Span[*MR]
	again:
		if r := e.mrs.Open(&sp, pd, stag.STag(s.LKey), 0, s.Addr, l); r != stag.OK {
			if r == stag.Suspended {
				return Suspended
			}
			return LocalProtErr
		}
		tr := pagetable.OK
		linear := sp.Linear()
		if linear {
			c.Copy(dst[done:done+k], sp.At(offset, k))
		} else {
			tr = sp.Entry.Value.copyOut(s.Addr+offset, dst[done:done+k])
		}
		mr := sp.Entry.Value
		sp.Close()
		if (tr == pagetable.NotPresent || tr == pagetable.NoPermission) && mr.odp != nil {
			// As sgl: the requester's own ODP memory faults inline.
			if mr.fault(s.Addr+offset, k, 0) != nil {
				return LocalProtErr
			}
			goto again
		}
		if tr != pagetable.OK {
			return tableStatus(tr, false)
		}
		if !linear {
			c.Copied(dst[done : done+k])
		}
		done += k
		offset = 0
	}
	return OK
}

// Scatter copies src into the SGL starting at byte offset of the SGL: a
// received SEND payload into the receive WQE's SGL, an RDMA READ response
// or an atomic's original value into the requester's SGL. The elements need
// LOCAL_WRITE. src beyond the SGL's total is LocalLenErr and places
// nothing; a key, PD or bounds failure is LocalProtErr, in which case
// elements before the failing one may have been written (the WQE completes
// in error and its buffer's contents are undefined).
func (e *Engine) Scatter(pd uint32, sgl []SGE, offset uint64, src []byte) Status {
	return e.sgl(pd, sgl, offset, src, true)
}

func (e *Engine) sgl(pd uint32, sgl []SGE, offset uint64, b []byte, write bool) Status {
	n := uint64(len(b))
	if total := sglTotal(sgl); offset > total || n > total-offset {
		return LocalLenErr
	}
	need := stag.Access(0)
	if write {
		need = stag.AccessLocalWrite
	}
	done := uint64(0)
	for i := 0; done < n; i++ {
		s := &sgl[i]
		l := uint64(s.Length)
		if offset >= l {
			offset -= l
			continue
		}
		k := min(l-offset, n-done)
		var sp stag.Span[*MR]
	again:
		if r := e.mrs.Open(&sp, pd, stag.STag(s.LKey), need, s.Addr, l); r != stag.OK {
			if r == stag.Suspended {
				return Suspended
			}
			return LocalProtErr
		}
		tr := pagetable.OK
		switch {
		case sp.Linear() && write:
			memcopy.Copy(sp.At(offset, k), b[done:done+k])
		case sp.Linear():
			memcopy.Copy(b[done:done+k], sp.At(offset, k))
		case write:
			tr = sp.Entry.Value.copyIn(s.Addr+offset, b[done:done+k])
		default:
			tr = sp.Entry.Value.copyOut(s.Addr+offset, b[done:done+k])
		}
		mr := sp.Entry.Value
		sp.Close()
		if (tr == pagetable.NotPresent || tr == pagetable.NoPermission) && mr.odp != nil {
			// The requester's own ODP memory: fault inline and retry
			// (a page that cannot be faulted in is a protection error).
			fl := pagetable.FaultFlags(0)
			if write {
				fl = pagetable.FaultWrite
			}
			if mr.fault(s.Addr+offset, k, fl) != nil {
				return LocalProtErr
			}
			goto again
		}
		if tr != pagetable.OK {
			return tableStatus(tr, false)
		}
		done += k
		offset = 0
	}
	return OK
}
