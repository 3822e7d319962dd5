package softrdma_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/softrdmatest"
	"github.com/softrdma/softrdma/stag"
)

// TestBindMWRKeyAtPost: QP.BindMW changes the type 1 window's rkey
// (MW.RKey, ibv_mw.rkey) when it posts the bind, not when the bind
// executes: rdma-core's ibv_bind_mw sets mw->rkey to ibv_inc_rkey of the
// old key as soon as its post succeeds (providers/rxe rxe_bind_mw,
// mlx5_bind_mw), so that the application may send it to its peer at once.
// Here the bind is fenced behind a SEND that waits for a receive (RNR
// NAKs, retried for ever) and has not executed when RKey is read. A bind
// that fails when it executes gives the previous key back (the undo rxe
// leaves to the application: "user has to undo this if he gets an error
// wc").
func TestBindMWRKeyAtPost(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	msg, msgMR := reg(t, p.B, 64, rw)
	recv, recvMR := reg(t, p.A, 64, rw)
	src, srcMR := reg(t, p.A, 64, rw)
	mem, mr := reg(t, p.B, 4096, rw|softrdma.AccessMWBind)
	_, noBind := reg(t, p.B, 4096, rw) // no MW_BIND access (C10-73)
	w, err := p.B.Dev.AllocMW(p.B.PD, softrdma.MWType1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.B.Dev.DeallocMW(w) })
	k0 := w.RKey()

	fill(3, msg)
	post(t, p.B.QP, softrdma.SendWR{WRID: 1, Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
		SGL: []softrdma.SGE{{Addr: msgMR.Addr(), Length: 64, LKey: msgMR.LKey()}}})
	k, err := p.B.QP.BindMW(w, 2, softrdma.SendSignaled|softrdma.SendFence,
		softrdma.MWBindInfo{MR: mr, Addr: mr.Addr(), Length: 4096, Access: softrdma.AccessRemoteWrite})
	require.NoError(t, err)
	require.Equal(t, softrdma.IncRKey(k0), k, "ibv_inc_rkey of the window's key")
	require.Equal(t, k, w.RKey(), "ibv_mw.rkey changes when ibv_bind_mw posts")
	bound, _, _, _ := w.Binding()
	require.Nil(t, bound, "the bind waits behind the SEND")

	_, err = p.A.QP.PostRecv(softrdma.RecvWR{WRID: 9, SGL: []softrdma.SGE{{Addr: recvMR.Addr(), Length: 64, LKey: recvMR.LKey()}}})
	require.NoError(t, err)
	wcs := waitWC(t, p.B.CQ, 2)
	require.Equal(t, softrdma.WCSuccess, wcs[0].Status)
	require.Equal(t, softrdma.WCSuccess, wcs[1].Status)
	require.Equal(t, softrdma.WCBindMW, wcs[1].Opcode)
	require.Equal(t, softrdma.WCRecv, waitWC(t, p.A.CQ, 1)[0].Opcode)
	require.Equal(t, msg, recv)
	require.Equal(t, k, w.RKey())
	fill(4, src)
	post(t, p.A.QP, writeWR(3, srcMR, src, mr.Addr(), k))
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
	require.Equal(t, src, mem[:64])

	k2, err := p.B.QP.BindMW(w, 4, softrdma.SendSignaled,
		softrdma.MWBindInfo{MR: noBind, Addr: noBind.Addr(), Length: 64, Access: softrdma.AccessRemoteWrite})
	require.NoError(t, err)
	require.Equal(t, softrdma.IncRKey(k), k2)
	wc := waitWC(t, p.B.CQ, 1)[0]
	require.Equal(t, softrdma.WCMWBindErr, wc.Status)
	require.Equal(t, k, w.RKey(), "the failed bind's key is undone")
	bound, _, _, _ = w.Binding()
	require.Equal(t, mr, bound, "the binding is unchanged")
}

// TestBindWaitsForReregMR: a bind that executes while the application
// re-registers its MR (ReregMR waiting for a placement in flight through
// the old registration) waits for the re-registration and then binds the
// window onto the MR as re-registered. It completed with
// IBV_WC_MW_BIND_ERR (the MR was busy: ErrBusy) and moved the QP to ERR,
// although nothing was wrong with the bind: rxe makes binds wait for each
// other under the window's lock (rxe_bind_mw), and its re-registration
// keeps the MR usable for binds once it returns. Through the transport
// this is the reachable case of a bind meeting a busy object (the
// rebinds of one window by two QPs of a device run one after the other
// on its send worker; TestRebindWaitsForRebindInProgress in placement
// checks them at the engine).
func TestBindWaitsForReregMR(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	src, srcMR := reg(t, p.A, 64, rw)
	mem, mr := reg(t, p.B, 4096, rw|softrdma.AccessMWBind)
	w, err := p.B.Dev.AllocMW(p.B.PD, softrdma.MWType1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.B.Dev.DeallocMW(w) })

	// A placement in flight through the MR (an unbound cursor holds it
	// from Begin to End), as a WRITE being placed would.
	e, pd, old := p.B.Dev.Engine(), p.B.PD.Num(), mr.RKey()
	endPlacement, rereg := reregUnderPlacement(t, p, e, pd, old, mr)
	k, err := p.B.QP.BindMW(w, 1, softrdma.SendSignaled, softrdma.MWBindInfo{MR: mr, Addr: mr.Addr(), Length: 4096, Access: softrdma.AccessRemoteWrite})
	require.NoError(t, err)
	until(t, "the bind to execute", func() bool {
		s := p.B.QP.RequesterState()
		return s.NextWQE == s.Posted || s.State == softrdma.QPStateErr
	})
	endPlacement()
	require.NoError(t, <-rereg)

	wc := waitWC(t, p.B.CQ, 1)[0]
	require.Equal(t, softrdma.WCSuccess, wc.Status, "the bind")
	require.Equal(t, softrdma.WCBindMW, wc.Opcode)
	require.Equal(t, softrdma.QPStateRTS, p.B.QP.State())
	require.Equal(t, k, w.RKey())
	fill(6, src)
	post(t, p.A.QP, writeWR(2, srcMR, src, mr.Addr(), k))
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
	require.Equal(t, src, mem[:64])
}

// until waits, yielding, for cond, up to a deadline.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

// TestDeferredType2BindOfDestroyedQP: a type 2 bind that waits for its MR
// (being re-registered) while its QP is destroyed must not bind the window
// once the wait ends: DestroyQP has already released the QP's type 2
// windows (ReleaseQPWindows), and a window bound to the destroyed QP's
// number would open for a later QP of the same number. The deferred bind
// bound it.
func TestDeferredType2BindOfDestroyedQP(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	_, mr := reg(t, p.B, 4096, rw|softrdma.AccessMWBind)
	w, err := p.B.Dev.AllocMW(p.B.PD, softrdma.MWType2)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.B.Dev.DeallocMW(w) })

	e, pd, old := p.B.Dev.Engine(), p.B.PD.Num(), mr.RKey()
	endPlacement, rereg := reregUnderPlacement(t, p, e, pd, old, mr)
	post(t, p.B.QP, softrdma.SendWR{WRID: 1, Opcode: softrdma.WRBindMW, Flags: softrdma.SendSignaled,
		BindMW: softrdma.MWBind{MW: w, RKey: softrdma.IncRKey(w.RKey()), Info: softrdma.MWBindInfo{MR: mr, Addr: mr.Addr(), Length: 4096, Access: softrdma.AccessRemoteWrite}}})
	until(t, "the bind to execute", func() bool {
		s := p.B.QP.RequesterState()
		return s.NextWQE == s.Posted || s.State == softrdma.QPStateErr
	})
	require.NoError(t, p.B.Dev.DestroyQP(p.B.QP))
	endPlacement()
	require.NoError(t, <-rereg)
	// The deferred bind has run once the send worker is free again: a
	// new QP's first work request completes after it.
	c := softrdma.Cap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}
	a2, err := p.A.Dev.CreateQP(p.A.PD, softrdma.QPInitAttr{SendCQ: p.A.CQ, RecvCQ: p.A.CQ, Cap: c, Type: softrdma.QPTypeRC})
	require.NoError(t, err)
	b2, err := p.B.Dev.CreateQP(p.B.PD, softrdma.QPInitAttr{SendCQ: p.B.CQ, RecvCQ: p.B.CQ, Cap: c, Type: softrdma.QPTypeRC})
	require.NoError(t, err)
	require.NoError(t, softrdma.Connect(a2, softrdma.Endpoint{Addr: p.B.Dev.LocalAddr(), QPN: b2.QPN(), PSN: 100}, 200, softrdma.ConnectOptions{}))
	require.NoError(t, softrdma.Connect(b2, softrdma.Endpoint{Addr: p.A.Dev.LocalAddr(), QPN: a2.QPN(), PSN: 200}, 100, softrdma.ConnectOptions{}))
	src, srcMR := reg(t, p.B, 8, rw)
	_, dstMR := reg(t, p.A, 8, rw)
	post(t, b2, writeWR(2, srcMR, src, dstMR.Addr(), dstMR.RKey()))
	for {
		wc := waitWC(t, p.B.CQ, 1)[0]
		if wc.WRID == 2 {
			require.Equal(t, softrdma.WCSuccess, wc.Status)
			break
		}
	}
	bound, _, _, _ := w.Binding()
	require.True(t, bound == nil, "a window bound to a destroyed QP")
}

// reregUnderPlacement holds a placement in flight through mr's key old
// (an unbound cursor holds it from Begin to End, as a WRITE being placed
// would), starts a ReregMR of mr, which waits for it, and returns once the
// rereg has invalidated old. endPlacement ends the placement (once; the
// test's cleanup ends it too), after which rereg gives ReregMR's result.
func reregUnderPlacement(t *testing.T, p *softrdmatest.Pair, e *placement.Engine, pd, old uint32, mr *softrdma.MR) (endPlacement func(), rereg chan error) {
	t.Helper()
	var cur placement.Cursor
	require.Equal(t, placement.OK, e.Begin(&cur, pd, old, mr.Addr(), 8, stag.AccessRemoteWrite))
	ended := false
	endPlacement = func() {
		if !ended {
			ended = true
			e.End(&cur)
		}
	}
	t.Cleanup(endPlacement)
	rereg = make(chan error, 1)
	go func() {
		rereg <- p.B.Dev.ReregMR(mr, softrdma.ReregChangeAccess, nil, nil, rw|softrdma.AccessMWBind)
	}()
	until(t, "ReregMR to invalidate the old key", func() bool {
		var c placement.Cursor
		st := e.Begin(&c, pd, old, mr.Addr(), 8, stag.AccessRemoteWrite)
		if st == placement.OK {
			e.End(&c)
		}
		return st != placement.OK
	})
	return endPlacement, rereg
}
