package placement

import (
	"sync/atomic"
	"unsafe"

	"github.com/softrdma/softrdma/internal/memcopy"
	"github.com/softrdma/softrdma/pagetable"
	"github.com/softrdma/softrdma/stag"
)

// Cursor is the responder's progress through one remote access message
// (rxe: qp->resp.va/resid with the MR reference; siw: the tagged placement
// context). Begin resolves the R_Key and checks the whole DMA length; each
// MIDDLE/LAST packet then continues at the next byte; End releases the
// region. The zero value is idle. A Cursor is used by one goroutine.
type Cursor struct {
	// s references the region's key entry from Begin to End (nil Entry
	// when idle or for a zero-length message) and the message's range,
	// with its translation when the region is mapped linearly (a pinned
	// region with contiguous frames; otherwise each packet walks the
	// region's translation table). A packet checks with one load that the
	// key's slot has not changed since Begin (s.Current) and advances
	// s.Done, and nothing else: after a 4 KiB copy the store buffer is
	// full, so each store the data path adds costs about as much as a
	// store of the copy.
	s stag.Span[*MR]
}

// Reader is a goroutine that places bytes for many cursors, such as a
// device's receive loop, and lets a deregistration know when it is done
// with a region by declaring quiescent states instead of counting
// references per message (RCU in its quiescent-state-based flavour; see
// stag.Reader). Bind the loop's cursors to it (Cursor.Bind) and call
// Quiesce after each batch of packets and before blocking. Begin, Write,
// Read and End of a bound cursor then take no lock and make no atomic
// write; going online at the first use after Quiesce, and Quiesce, are one
// atomic store each.
//
// A Reader and its cursors are used by one goroutine.
type Reader struct{ r *stag.Reader }

// NewReader registers a reader. Close it when its goroutine stops.
func (e *Engine) NewReader() *Reader { return &Reader{e.mrs.NewReader()} }

// Quiesce declares that the reader's goroutine is between packets: it uses
// no region until its next Begin, Write or Read. A deregistration waits
// for every reader that was placing when it started to quiesce, so call
// it after each batch and always before blocking.
func (r *Reader) Quiesce() { r.r.Quiesce() }

// QuiesceIfWaited quiesces the reader if a deregistration, suspension or
// remap is waiting for it (stag.Reader.QuiesceIfWaited): a receive loop
// calls it after each packet, so that a grace period waits for one
// packet's placement instead of a batch's. One atomic load when nobody
// waits.
func (r *Reader) QuiesceIfWaited() { r.r.QuiesceIfWaited() }

// Close quiesces the reader and unregisters it. Its cursors must be idle
// (or never used again).
func (r *Reader) Close() { r.r.Close() }

// Bind makes the idle cursor c use reader r (nil: count a reference per
// message again). A bound cursor holds no reference between its packets:
// DeregMR does not wait for its message to end, and the next packet after
// an invalidation fails with RemoteAccessErr as for any cursor. Begin,
// Write and Read of a bound cursor run on r's goroutine; End touches no
// reader state and may run elsewhere when it is serialized with that
// goroutine (the transport's respMu).
func (c *Cursor) Bind(r *Reader) {
	if r == nil {
		c.s.Bind(nil)
		return
	}
	c.s.Bind(r.r)
}

// Busy reports whether the cursor holds a region (between a successful
// Begin of a non-empty message and End).
func (c *Cursor) Busy() bool { return c.s.Entry != nil }

// Resid returns the bytes left in the message.
func (c *Cursor) Resid() uint64 { return c.s.Len - c.s.Done }

// IOVA returns the address of the next byte.
func (c *Cursor) IOVA() uint64 { return c.s.IOVA + c.s.Done }

// Begin starts a remote access message: the R_Key rkey, presented by a QP of
// protection domain pd, must name a valid region of pd that grants need
// (stag.AccessRemoteWrite for RDMA WRITE, AccessRemoteRead for RDMA READ)
// and holds [va, va+length). On success the cursor holds the region until
// End. A failed Begin leaves the cursor idle and places nothing: the
// transport NAKs (RemoteAccessErr) without calling End. Begin on a busy
// cursor (without End) panics.
//
// A zero-length message succeeds without looking at rkey or va, as rxe's
// check_rkey ("A zero-byte op is not required to set an addr or rkey");
// the cursor then accepts only empty payloads.
//
// The IBTA limit of 2^31 bytes on the DMA length is the transport's check
// (rxe check_length), made before Begin.
func (e *Engine) Begin(c *Cursor, pd uint32, rkey uint32, va uint64, length uint64, need stag.Access) Status {
	// One read of the key's slot makes the four key checks and the bounds
	// check, counts the in-flight reference and, for a pinned region,
	// translates the whole message. Begin is inlined, so the transport's
	// call goes straight to Open: its cost is exactly the inliner's budget
	// (80, go build -gcflags=-m=2), which an if around the call, or a
	// costlier remoteStatus, exceeds.
	return remoteStatus(e.mrs.Open(&c.s, pd, stag.STag(rkey), need, va, length))
}

// remoteStatus maps the outcome of a key check to a Status: OK, Suspended,
// or an R_Key violation. It is written for the inliner's budget (see
// Begin): OK is 0 in both types, and every other Reason but Suspended is
// at least 1, which min turns into RemoteAccessErr (TestRemoteStatus).
func remoteStatus(r stag.Reason) Status {
	if r == stag.Suspended {
		return Suspended
	}
	return min(Status(r), RemoteAccessErr)
}

// Write places payload at the cursor's next byte (an RDMA WRITE packet) and
// advances the cursor. A payload longer than what is left of the message is
// InvalidRequest (rxe: RESPST_ERR_LENGTH) and places nothing. If the region
// was invalidated since Begin (LOCAL_INV, Send with Invalidate, DeregMR),
// Write fails with RemoteAccessErr and places nothing. On failure the cursor
// does not advance; the transport NAKs and calls End.
func (e *Engine) Write(c *Cursor, payload []byte) Status {
	// Fast path: a region mapped linearly whose key has not changed since
	// Begin (one load and compare), and a payload that fits.
	s := &c.s
	n, d := uint64(len(payload)), s.Done
	if n-1 < s.Len-d && s.Linear() && s.Write && s.Current() {
		memcopy.Copy(s.At(d, n), payload)
		s.Done = d + n
		return OK
	}
	return e.writeSlow(c, payload)
}

func (e *Engine) writeSlow(c *Cursor, payload []byte) Status {
	s := &c.s
	n := uint64(len(payload))
	if n > s.Len-s.Done {
		return InvalidRequest
	}
	if n == 0 {
		return OK
	}
	if !s.Write {
		panic("placement: Write on a cursor begun without a write right")
	}
	if !s.Current() {
		if r := s.RefreshReason(); r != stag.OK {
			return remoteStatus(r)
		}
	}
	if s.Linear() {
		memcopy.Copy(s.At(s.Done, n), payload)
	} else if r := s.Entry.Value.copyIn(s.IOVA+s.Done, payload); r != pagetable.OK {
		return tableStatus(r, true)
	}
	s.Done += n
	return OK
}

// Read copies the cursor's next len(dst) bytes into dst (the payload of an
// RDMA READ response packet) and advances the cursor, with the checks of
// Write.
func (e *Engine) Read(c *Cursor, dst []byte) Status {
	s := &c.s
	n, d := uint64(len(dst)), s.Done
	if n-1 < s.Len-d && s.Linear() && s.Current() {
		memcopy.Copy(dst, s.At(d, n))
		s.Done = d + n
		return OK
	}
	return e.readSlow(c, dst)
}

func (e *Engine) readSlow(c *Cursor, dst []byte) Status {
	s := &c.s
	n := uint64(len(dst))
	if n > s.Len-s.Done {
		return InvalidRequest
	}
	if n == 0 {
		return OK
	}
	if !s.Current() && !s.Refresh() {
		return RemoteAccessErr
	}
	if s.Linear() {
		memcopy.Copy(dst, s.At(s.Done, n))
	} else if r := s.Entry.Value.copyOut(s.IOVA+s.Done, dst); r != pagetable.OK {
		return tableStatus(r, true)
	}
	s.Done += n
	return OK
}

// End finishes the message: it releases the region and makes the cursor
// idle. Ending an idle cursor does nothing.
func (e *Engine) End(c *Cursor) { c.s.Close() }

// AtomicOp is the operation of an atomic request.
type AtomicOp uint8

// Atomic operations, as carried by the opcode of a request with an
// AtomicETH (IBTA 9.3.4): COMPARE SWAP and FETCH ADD.
const (
	CmpSwap AtomicOp = iota + 1
	FetchAdd
)

func (o AtomicOp) String() string {
	switch o {
	case CmpSwap:
		return "CMP_SWAP"
	case FetchAdd:
		return "FETCH_ADD"
	}
	return "AtomicOp(?)"
}

// Atomic executes an atomic request on the 8 bytes at va of the region named
// by rkey and returns the original value (for the AtomicAckETH). CmpSwap
// stores swapAdd if the original equals compare; FetchAdd adds swapAdd. The
// operands and the result are 64-bit integers in the responder's host byte
// order (the transport converts from and to the big-endian AtomicETH); the
// memory word is read and written as a host-order uint64, with sync/atomic,
// so atomics are atomic with respect to each other and to the
// application's own atomic operations.
//
// Checks, in rxe's order: the key (need REMOTE_ATOMIC) and the range
// [va, va+8) (RemoteAccessErr), then 8-byte alignment (InvalidRequest, rxe
// RESPST_ERR_MISALIGNED_ATOMIC). Replays of duplicate atomics are the
// transport's (responder resources); Atomic always executes.
func (e *Engine) Atomic(pd, rkey uint32, va uint64, op AtomicOp, swapAdd, compare uint64) (orig uint64, st Status) {
	return e.AtomicQP(pd, 0, rkey, va, op, swapAdd, compare)
}

// AtomicQP is Atomic for a request received by QP qpn: a type 2 memory
// window's rkey is accepted only from the QP it is bound to.
func (e *Engine) AtomicQP(pd, qpn, rkey uint32, va uint64, op AtomicOp, swapAdd, compare uint64) (orig uint64, st Status) {
	var sp stag.Span[*MR]
	sp.QP = qpn
	if r := e.mrs.Open(&sp, pd, stag.STag(rkey), stag.AccessRemoteAtomic, va, 8); r != stag.OK {
		return 0, remoteStatus(r)
	}
	defer sp.Close()
	var p *uint64
	if sp.Linear() && va&7 == 0 {
		if b := sp.At(0, 8); uintptr(unsafe.Pointer(&b[0]))&7 == 0 {
			p = (*uint64)(unsafe.Pointer(&b[0]))
		}
	}
	if p == nil {
		if t := sp.Entry.Value.odp; t != nil && (op == CmpSwap || op == FetchAdd) {
			// An ODP word: run the operation inside the table's copy
			// section. WouldFault: nothing was executed.
			orig, tr := atomicODP(t.t, va, op, swapAdd, compare)
			return orig, tableStatus(tr, true)
		}
		// Misaligned (InvalidRequest), or a region that is not mapped
		// linearly: the table says which, and runs the operation (on
		// both frames while a remap switches them: AtomicWord).
		t := sp.Entry.Value.table
		if op != CmpSwap && op != FetchAdd {
			if _, tr := t.Word64(va, true); tr != pagetable.OK {
				return 0, tableStatus(tr, true)
			}
			return 0, InvalidRequest
		}
		orig, tr := t.AtomicWord(va, func(w *uint64) uint64 { return atomicOn(w, op, swapAdd, compare) })
		return orig, tableStatus(tr, true)
	}
	if op != CmpSwap && op != FetchAdd {
		return 0, InvalidRequest
	}
	return atomicOn(p, op, swapAdd, compare), OK
}

// atomicOn executes op on the word at p and returns its original value.
func atomicOn(p *uint64, op AtomicOp, swapAdd, compare uint64) uint64 {
	if op == CmpSwap {
		for {
			old := atomic.LoadUint64(p)
			if old != compare || atomic.CompareAndSwapUint64(p, old, swapAdd) {
				return old
			}
		}
	}
	return atomic.AddUint64(p, swapAdd) - swapAdd
}
