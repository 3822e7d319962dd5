package placement

import (
	"sync/atomic"

	"github.com/softrdma/softrdma/pagetable"
	"github.com/softrdma/softrdma/stag"
)

// Cursor is the responder's progress through one remote access message
// (rxe: qp->resp.va/resid with the MR reference; siw: the tagged placement
// context). Begin resolves the R_Key and checks the whole DMA length; each
// MIDDLE/LAST packet then continues at the next byte; End releases the
// region. The zero value is idle. A Cursor is used by one goroutine.
type Cursor struct {
	entry *stag.Entry[*MR] // nil when idle or for a zero-length message
	table *pagetable.Table // entry.Value.table, cached
	iova  uint64           // IOVA of the next byte
	resid uint64           // bytes left in the message (RETH DMA length at Begin)
	write bool             // begun with a write right: Write allowed, Read not

	// span is the NIC-side bytes of the rest of the message when the table
	// allowed direct access at Begin (pagetable.Table.Span), valid while the
	// table's sequence count is still seq; nil: walk the table per packet.
	span []byte
	seq  uint64
}

// Busy reports whether the cursor holds a region (between a successful
// Begin of a non-empty message and End).
func (c *Cursor) Busy() bool { return c.entry != nil }

// Resid returns the bytes left in the message.
func (c *Cursor) Resid() uint64 { return c.resid }

// IOVA returns the address of the next byte.
func (c *Cursor) IOVA() uint64 { return c.iova }

// Begin starts a remote access message: the R_Key rkey, presented by a QP of
// protection domain pd, must name a valid region of pd that grants need
// (stag.AccessRemoteWrite for RDMA WRITE, AccessRemoteRead for RDMA READ)
// and holds [va, va+length). On success the cursor holds the region until
// End. A failed Begin leaves the cursor idle and places nothing: the
// transport NAKs (RemoteAccessErr) without calling End.
//
// A zero-length message succeeds without looking at rkey or va, as rxe's
// check_rkey ("A zero-byte op is not required to set an addr or rkey");
// the cursor then accepts only empty payloads.
//
// The IBTA limit of 2^31 bytes on the DMA length is the transport's check
// (rxe check_length), made before Begin.
func (e *Engine) Begin(c *Cursor, pd uint32, rkey uint32, va uint64, length uint64, need stag.Access) Status {
	if c.entry != nil {
		panic("placement: Begin on a busy cursor (missing End)")
	}
	*c = Cursor{write: need&(stag.AccessRemoteWrite|stag.AccessLocalWrite) != 0}
	if length == 0 {
		return OK
	}
	ent, r := e.mrs.Acquire(pd, stag.STag(rkey), need)
	if r != stag.OK {
		return RemoteAccessErr
	}
	if ent.CheckRange(va, length) != stag.OK {
		ent.Release()
		return RemoteAccessErr
	}
	c.entry, c.table, c.iova, c.resid = ent, ent.Value.table, va, length
	c.span, c.seq, _ = c.table.Span(va, length, c.write)
	return OK
}

// Write places payload at the cursor's next byte (an RDMA WRITE packet) and
// advances the cursor. A payload longer than what is left of the message is
// InvalidRequest (rxe: RESPST_ERR_LENGTH) and places nothing. If the region
// was invalidated since Begin (LOCAL_INV, Send with Invalidate, DeregMR),
// Write fails with RemoteAccessErr and places nothing. On failure the cursor
// does not advance; the transport NAKs and calls End.
func (e *Engine) Write(c *Cursor, payload []byte) Status {
	n := uint64(len(payload))
	if n > c.resid {
		return InvalidRequest
	}
	if n == 0 {
		return OK
	}
	if !c.write {
		panic("placement: Write on a cursor begun without a write right")
	}
	if c.entry.State() != stag.StateValid {
		return RemoteAccessErr
	}
	if c.span != nil && !c.table.ReadRetry(c.seq) {
		c.span = c.span[copy(c.span, payload):]
	} else {
		c.span = nil
		if _, r := c.table.CopyIn(c.iova, payload); r != pagetable.OK {
			return tableStatus(r, true)
		}
	}
	c.iova += n
	c.resid -= n
	return OK
}

// Read copies the cursor's next len(dst) bytes into dst (the payload of an
// RDMA READ response packet) and advances the cursor, with the checks of
// Write.
func (e *Engine) Read(c *Cursor, dst []byte) Status {
	n := uint64(len(dst))
	if n > c.resid {
		return InvalidRequest
	}
	if n == 0 {
		return OK
	}
	if c.entry.State() != stag.StateValid {
		return RemoteAccessErr
	}
	if c.span != nil && !c.table.ReadRetry(c.seq) {
		c.span = c.span[copy(dst, c.span):]
	} else {
		c.span = nil
		if _, r := c.table.CopyOut(c.iova, dst); r != pagetable.OK {
			return tableStatus(r, true)
		}
	}
	c.iova += n
	c.resid -= n
	return OK
}

// End finishes the message: it releases the region and makes the cursor
// idle. Ending an idle cursor does nothing.
func (e *Engine) End(c *Cursor) {
	if c.entry != nil {
		c.entry.Release()
	}
	*c = Cursor{}
}

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
	ent, r := e.mrs.Acquire(pd, stag.STag(rkey), stag.AccessRemoteAtomic)
	if r != stag.OK {
		return 0, RemoteAccessErr
	}
	defer ent.Release()
	if ent.CheckRange(va, 8) != stag.OK {
		return 0, RemoteAccessErr
	}
	p, tr := ent.Value.table.Word64(va, true)
	if tr != pagetable.OK {
		return 0, tableStatus(tr, true)
	}
	switch op {
	case CmpSwap:
		for {
			old := atomic.LoadUint64(p)
			if old != compare || atomic.CompareAndSwapUint64(p, old, swapAdd) {
				return old, OK
			}
		}
	case FetchAdd:
		return atomic.AddUint64(p, swapAdd) - swapAdd, OK
	}
	return 0, InvalidRequest
}
