package softrdma_test

import (
	"bytes"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
	"github.com/softrdma/softrdma/transport"
)

// End-to-end tests of the MR life-cycle operations over a connected pair:
// fast registration, LOCAL_INV, SEND with Invalidate, memory windows and
// re-registration, with the values the spec gives (WC opcodes and flags,
// the remote access error NAK for a stale or invalidated key).

// post posts one work request and fails the test if the post fails.
func post(t *testing.T, qp *softrdma.QP, wr softrdma.SendWR) {
	t.Helper()
	_, err := qp.PostSend(wr)
	require.NoError(t, err)
}

// writeWR is a signaled RDMA WRITE of src (registered as mr) to va/rkey.
func writeWR(id uint64, mr *softrdma.MR, src []byte, va uint64, rkey uint32) softrdma.SendWR {
	return softrdma.SendWR{WRID: id, Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
		SGL:        []softrdma.SGE{{Addr: uint64(addrOf(src)), Length: uint32(len(src)), LKey: mr.LKey()}},
		RemoteAddr: va, RKey: rkey}
}

// frwr allocates a fast-registration MR on s, maps buf and registers it
// with a REG_MR work request under the next key; it returns the MR and the
// key and checks the REG_MR completion (opcode WCRegMR).
func frwr(t *testing.T, s *softrdmatest.Side, buf []byte, access softrdma.Access) (*softrdma.MR, uint32) {
	t.Helper()
	mr, err := s.Dev.AllocMR(s.PD, (len(buf)+8191)/4096)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Dev.DeregMR(mr) })
	return mr, regAgain(t, s, mr, buf, access)
}

// regAgain maps buf onto the invalid FRWR MR mr and registers it (REG_MR)
// under the next key, which it returns.
func regAgain(t *testing.T, s *softrdmatest.Side, mr *softrdma.MR, buf []byte, access softrdma.Access) uint32 {
	t.Helper()
	require.NoError(t, s.Dev.MapMR(mr, buf))
	key := softrdma.IncRKey(mr.LKey())
	post(t, s.QP, softrdma.SendWR{WRID: 100, Opcode: softrdma.WRRegMR, Flags: softrdma.SendSignaled,
		Reg: softrdma.RegWR{MR: mr, Key: key, Access: access}})
	wc := waitWC(t, s.CQ, 1)[0]
	require.Equal(t, softrdma.WCSuccess, wc.Status, "REG_MR: %v", wc.Status)
	require.Equal(t, softrdma.WCRegMR, wc.Opcode)
	require.Equal(t, key, mr.RKey())
	return key
}

// localInv posts a signaled LOCAL_INV of key on s and waits for its
// completion (opcode WCLocalInv), returning its status.
func localInv(t *testing.T, s *softrdmatest.Side, key uint32) softrdma.WCStatus {
	t.Helper()
	post(t, s.QP, softrdma.SendWR{WRID: 200, Opcode: softrdma.WRLocalInv, Flags: softrdma.SendSignaled, InvRKey: key})
	wc := waitWC(t, s.CQ, 1)[0]
	require.Equal(t, softrdma.WCLocalInv, wc.Opcode)
	return wc.Status
}

// TestFRWREndToEnd: an FRWR MR registered by REG_MR takes RDMA WRITEs under
// its new key; after LOCAL_INV completes, a WRITE gets the remote access
// error NAK (IBV_WC_REM_ACCESS_ERR) and places nothing.
func TestFRWREndToEnd(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	src, srcMR := reg(t, p.A, 8192, rw)
	dst := make([]byte, 8192)
	mr, key := frwr(t, p.B, dst, rw)
	fill(1, src)
	post(t, p.A.QP, writeWR(1, srcMR, src, mr.Addr(), key))
	wc := waitWC(t, p.A.CQ, 1)[0]
	require.Equal(t, softrdma.WCSuccess, wc.Status)
	require.Equal(t, src, dst)

	require.Equal(t, softrdma.WCSuccess, localInv(t, p.B, key))
	clear(dst)
	post(t, p.A.QP, writeWR(2, srcMR, src, mr.Addr(), key))
	wc = waitWC(t, p.A.CQ, 1)[0]
	require.Equal(t, softrdma.WCRemAccessErr, wc.Status, "a WRITE through an invalidated key")
	require.Equal(t, make([]byte, 8192), dst, "nothing placed")
}

// TestFRWRStaleKey: after the MR is invalidated, mapped onto other memory
// and registered again under the next key, a WRITE with the old key misses
// (remote access error) and touches neither buffer.
func TestFRWRStaleKey(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	src, srcMR := reg(t, p.A, 4096, rw)
	fill(2, src)
	old, cur := make([]byte, 4096), make([]byte, 4096)
	mr, key1 := frwr(t, p.B, old, rw)
	require.Equal(t, softrdma.WCSuccess, localInv(t, p.B, key1))
	key2 := regAgain(t, p.B, mr, cur, rw)
	require.NotEqual(t, key1, key2)
	post(t, p.A.QP, writeWR(1, srcMR, src, mr.Addr(), key2))
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
	require.Equal(t, src, cur)
	clear(cur)
	post(t, p.A.QP, writeWR(2, srcMR, src, mr.Addr(), key1))
	require.Equal(t, softrdma.WCRemAccessErr, waitWC(t, p.A.CQ, 1)[0].Status, "the key of the earlier registration")
	require.Equal(t, make([]byte, 4096), cur)
	require.Equal(t, make([]byte, 4096), old)
}

// TestSendWithInvalidate: the receiver invalidates the rkey the IETH names
// before the receive completes; its WC carries IBV_WC_WITH_INV and the key
// (ibv_wc.invalidated_rkey); a WRITE with the key is then NAKed.
func TestSendWithInvalidate(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	src, srcMR := reg(t, p.A, 4096, rw)
	recv, recvMR := reg(t, p.B, 4096, rw)
	dst := make([]byte, 4096)
	mr, key := frwr(t, p.B, dst, rw)
	fill(3, src)
	post(t, p.A.QP, writeWR(1, srcMR, src, mr.Addr(), key))
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)

	_, err := p.B.QP.PostRecv(softrdma.RecvWR{WRID: 7, SGL: []softrdma.SGE{{Addr: recvMR.Addr(), Length: 4096, LKey: recvMR.LKey()}}})
	require.NoError(t, err)
	post(t, p.A.QP, softrdma.SendWR{WRID: 2, Opcode: softrdma.WRSendWithInv, Flags: softrdma.SendSignaled, InvRKey: key,
		SGL: []softrdma.SGE{{Addr: srcMR.Addr(), Length: 100, LKey: srcMR.LKey()}}})
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
	wc := waitWC(t, p.B.CQ, 1)[0]
	require.Equal(t, softrdma.WCSuccess, wc.Status)
	require.Equal(t, softrdma.WCRecv, wc.Opcode)
	require.NotZero(t, wc.Flags&softrdma.WCWithInv, "the receive WC says with invalidate")
	require.Equal(t, key, wc.InvRKey)
	require.Equal(t, uint32(100), wc.ByteLen)
	require.Equal(t, src[:100], recv[:100])

	post(t, p.A.QP, writeWR(3, srcMR, src, mr.Addr(), key))
	require.Equal(t, softrdma.WCRemAccessErr, waitWC(t, p.A.CQ, 1)[0].Status, "invalidated by the SEND")
	// The MR can be registered again by its owner (after the completion).
	require.NoError(t, p.B.Dev.MapMR(mr, dst))
}

// TestSendWithInvalidateRefused: a SEND with Invalidate naming a key that
// cannot be invalidated — an MR of ibv_reg_mr, an MR with a window bound —
// is rxe's class J error: the receive completes with REM_INV_REQ_ERR, the
// sender's WR with REM_INV_REQ_ERR (NAK invalid request), and the key
// stays valid: nothing is lost.
func TestSendWithInvalidateRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  func(t *testing.T, b *softrdmatest.Side) (uint32, func() bool)
	}{
		{"an MR of ibv_reg_mr", func(t *testing.T, b *softrdmatest.Side) (uint32, func() bool) {
			_, mr := reg(t, b, 4096, rw)
			return mr.RKey(), func() bool { return mr.RKey() != 0 }
		}},
		{"an MR with a window bound", func(t *testing.T, b *softrdmatest.Side) (uint32, func() bool) {
			mr, key := frwr(t, b, make([]byte, 4096), rw|softrdma.AccessMWBind)
			w, err := b.Dev.AllocMW(b.PD, softrdma.MWType1)
			require.NoError(t, err)
			_, err = b.QP.BindMW(w, 9, softrdma.SendSignaled, softrdma.MWBindInfo{MR: mr, Addr: mr.Addr(), Length: 64, Access: softrdma.AccessRemoteRead})
			require.NoError(t, err)
			require.Equal(t, softrdma.WCSuccess, waitWC(t, b.CQ, 1)[0].Status)
			return key, func() bool { m, _, _, _ := w.Binding(); return m == mr && mr.RKey() == key }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
			_, srcMR := reg(t, p.A, 4096, rw)
			_, recvMR := reg(t, p.B, 4096, rw)
			key, intact := tc.key(t, p.B)
			_, err := p.B.QP.PostRecv(softrdma.RecvWR{WRID: 7, SGL: []softrdma.SGE{{Addr: recvMR.Addr(), Length: 4096, LKey: recvMR.LKey()}}})
			require.NoError(t, err)
			post(t, p.A.QP, softrdma.SendWR{WRID: 2, Opcode: softrdma.WRSendWithInv, Flags: softrdma.SendSignaled, InvRKey: key,
				SGL: []softrdma.SGE{{Addr: srcMR.Addr(), Length: 10, LKey: srcMR.LKey()}}})
			require.Equal(t, softrdma.WCRemInvReqErr, waitWC(t, p.A.CQ, 1)[0].Status)
			wc := waitWC(t, p.B.CQ, 1)[0]
			require.Equal(t, softrdma.WCRemInvReqErr, wc.Status)
			require.Zero(t, wc.Flags&softrdma.WCWithInv)
			require.True(t, intact(), "the key and its window are untouched")
		})
	}
}

// TestMemoryWindowsEndToEnd: a type 1 window bound with ibv_bind_mw and a
// type 2 window bound with a BIND_MW work request give a peer access to a
// range of an MR that has no remote rights of its own; each completion
// carries IBV_WC_BIND_MW; a type 2 window is invalidated by a SEND with
// Invalidate.
func TestMemoryWindowsEndToEnd(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	src, srcMR := reg(t, p.A, 8192, rw)
	back, backMR := reg(t, p.A, 4096, rw)
	_, recvMR := reg(t, p.B, 4096, rw)
	mem, mr := reg(t, p.B, 3*4096, softrdma.AccessLocalWrite|softrdma.AccessMWBind)
	fill(4, src)

	w1, err := p.B.Dev.AllocMW(p.B.PD, softrdma.MWType1)
	require.NoError(t, err)
	k1, err := p.B.QP.BindMW(w1, 1, softrdma.SendSignaled, softrdma.MWBindInfo{MR: mr, Addr: mr.Addr() + 4096, Length: 4096,
		Access: softrdma.AccessRemoteWrite | softrdma.AccessRemoteRead})
	require.NoError(t, err)
	wc := waitWC(t, p.B.CQ, 1)[0]
	require.Equal(t, softrdma.WCSuccess, wc.Status)
	require.Equal(t, softrdma.WCBindMW, wc.Opcode)
	require.Equal(t, k1, w1.RKey())

	post(t, p.A.QP, writeWR(1, srcMR, src[:4096], mr.Addr()+4096, k1))
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
	require.Equal(t, src[:4096], mem[4096:8192])
	post(t, p.A.QP, softrdma.SendWR{WRID: 2, Opcode: softrdma.WRRDMARead, Flags: softrdma.SendSignaled,
		SGL: []softrdma.SGE{{Addr: backMR.Addr(), Length: 4096, LKey: backMR.LKey()}}, RemoteAddr: mr.Addr() + 4096, RKey: k1})
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
	require.Equal(t, src[:4096], back)

	w2, err := p.B.Dev.AllocMW(p.B.PD, softrdma.MWType2)
	require.NoError(t, err)
	k2 := softrdma.IncRKey(w2.RKey())
	post(t, p.B.QP, softrdma.SendWR{WRID: 3, Opcode: softrdma.WRBindMW, Flags: softrdma.SendSignaled,
		BindMW: softrdma.MWBind{MW: w2, RKey: k2, Info: softrdma.MWBindInfo{MR: mr, Addr: mr.Addr() + 8192, Length: 4096,
			Access: softrdma.AccessRemoteWrite}}})
	wc = waitWC(t, p.B.CQ, 1)[0]
	require.Equal(t, softrdma.WCSuccess, wc.Status)
	require.Equal(t, softrdma.WCBindMW, wc.Opcode)
	post(t, p.A.QP, writeWR(4, srcMR, src[4096:], mr.Addr()+8192, k2))
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
	require.Equal(t, src[4096:], mem[8192:])

	_, err = p.B.QP.PostRecv(softrdma.RecvWR{WRID: 5, SGL: []softrdma.SGE{{Addr: recvMR.Addr(), Length: 4096, LKey: recvMR.LKey()}}})
	require.NoError(t, err)
	post(t, p.A.QP, softrdma.SendWR{WRID: 6, Opcode: softrdma.WRSendWithInv, Flags: softrdma.SendSignaled, InvRKey: k2,
		SGL: []softrdma.SGE{{Addr: srcMR.Addr(), Length: 8, LKey: srcMR.LKey()}}})
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
	wc = waitWC(t, p.B.CQ, 1)[0]
	require.Equal(t, softrdma.WCSuccess, wc.Status)
	require.Equal(t, k2, wc.InvRKey)
	require.NotZero(t, wc.Flags&softrdma.WCWithInv)
	m, _, _, _ := w2.Binding()
	require.Nil(t, m, "the type 2 window is free again")
	err = p.B.Dev.DeregMR(mr)
	require.ErrorIs(t, err, softrdma.ErrMWBound, "the type 1 window is still bound")
	require.ErrorIs(t, err, unix.EINVAL, "rxe_dereg_mr's errno")
	// One prefix, the operation named once (not "softrdma: dereg MR:
	// placement: dereg MR: placement: memory windows …").
	require.EqualError(t, err, "softrdma: dereg MR: memory windows are bound to the MR: invalid argument")
	clear(mem[8192:])
	post(t, p.A.QP, writeWR(7, srcMR, src[4096:], mr.Addr()+8192, k2))
	require.Equal(t, softrdma.WCRemAccessErr, waitWC(t, p.A.CQ, 1)[0].Status)
	require.Equal(t, make([]byte, 4096), mem[8192:], "nothing placed through the invalidated window")
	require.NoError(t, p.B.Dev.DeallocMW(w1))
	require.NoError(t, p.B.Dev.DeallocMW(w2))
}

// secondQP connects one more QP between the pair's devices (same PDs and
// CQs).
func secondQP(t *testing.T, p *softrdmatest.Pair) (a, b *softrdma.QP) {
	t.Helper()
	c := softrdma.Cap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 4, MaxRecvSGE: 4}
	a, err := p.A.Dev.CreateQP(p.A.PD, softrdma.QPInitAttr{SendCQ: p.A.CQ, RecvCQ: p.A.CQ, Cap: c, Type: softrdma.QPTypeRC})
	require.NoError(t, err)
	b, err = p.B.Dev.CreateQP(p.B.PD, softrdma.QPInitAttr{SendCQ: p.B.CQ, RecvCQ: p.B.CQ, Cap: c, Type: softrdma.QPTypeRC})
	require.NoError(t, err)
	require.NoError(t, softrdma.Connect(a, softrdma.Endpoint{Addr: p.B.Dev.LocalAddr(), QPN: b.QPN(), PSN: 100}, 200, softrdma.ConnectOptions{}))
	require.NoError(t, softrdma.Connect(b, softrdma.Endpoint{Addr: p.A.Dev.LocalAddr(), QPN: a.QPN(), PSN: 200}, 100, softrdma.ConnectOptions{}))
	return a, b
}

// TestType2WindowOnlyThroughItsQP: a type 2 window bound on one QP answers
// a WRITE arriving on another QP of the same PD with the remote access
// error NAK, and keeps working on its own QP.
func TestType2WindowOnlyThroughItsQP(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	a2, _ := secondQP(t, p)
	src, srcMR := reg(t, p.A, 64, rw)
	mem, mr := reg(t, p.B, 4096, rw|softrdma.AccessMWBind)
	w, err := p.B.Dev.AllocMW(p.B.PD, softrdma.MWType2)
	require.NoError(t, err)
	k := softrdma.IncRKey(w.RKey())
	post(t, p.B.QP, softrdma.SendWR{WRID: 1, Opcode: softrdma.WRBindMW, Flags: softrdma.SendSignaled,
		BindMW: softrdma.MWBind{MW: w, RKey: k, Info: softrdma.MWBindInfo{MR: mr, Addr: mr.Addr(), Length: 4096, Access: softrdma.AccessRemoteWrite}}})
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.B.CQ, 1)[0].Status)
	fill(5, src)
	post(t, a2, writeWR(2, srcMR, src, mr.Addr(), k))
	require.Equal(t, softrdma.WCRemAccessErr, waitWC(t, p.A.CQ, 1)[0].Status, "another QP")
	require.Equal(t, make([]byte, 64), mem[:64])
	post(t, p.A.QP, writeWR(3, srcMR, src, mr.Addr(), k))
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status, "its QP")
	require.Equal(t, src, mem[:64])
	// Destroying the QP frees the window.
	require.NoError(t, p.B.Dev.DestroyQP(p.B.QP))
	m, _, _, _ := w.Binding()
	require.Nil(t, m)
	require.NoError(t, p.B.Dev.DeallocMW(w))
}

// TestLocalOpsRefused: local operations that break a rule complete in
// error (BIND_MW: IBV_WC_MW_BIND_ERR; LOCAL_INV: IBV_WC_LOC_QP_OP_ERR, as
// rxe) and change nothing: a window beyond its MR is not bound, an MR with
// a window bound stays valid.
func TestLocalOpsRefused(t *testing.T) {
	t.Run("a window beyond its MR", func(t *testing.T) {
		p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
		_, mr := reg(t, p.B, 4096, rw|softrdma.AccessMWBind)
		w, err := p.B.Dev.AllocMW(p.B.PD, softrdma.MWType2)
		require.NoError(t, err)
		post(t, p.B.QP, softrdma.SendWR{WRID: 1, Opcode: softrdma.WRBindMW, Flags: softrdma.SendSignaled,
			BindMW: softrdma.MWBind{MW: w, RKey: softrdma.IncRKey(w.RKey()), Info: softrdma.MWBindInfo{MR: mr, Addr: mr.Addr() + 1, Length: 4096,
				Access: softrdma.AccessRemoteRead}}})
		wc := waitWC(t, p.B.CQ, 1)[0]
		require.Equal(t, softrdma.WCMWBindErr, wc.Status)
		require.Equal(t, softrdma.WCBindMW, wc.Opcode)
		m, _, _, _ := w.Binding()
		require.Nil(t, m)
		require.Equal(t, softrdma.QPStateErr, p.B.QP.State(), "an error completion moves the QP to ERR")
	})
	t.Run("an invalidation of an MR with a window bound", func(t *testing.T) {
		p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
		mr, key := frwr(t, p.B, make([]byte, 4096), rw|softrdma.AccessMWBind)
		w, err := p.B.Dev.AllocMW(p.B.PD, softrdma.MWType1)
		require.NoError(t, err)
		_, err = p.B.QP.BindMW(w, 1, 0, softrdma.MWBindInfo{MR: mr, Addr: mr.Addr(), Length: 64, Access: softrdma.AccessRemoteRead})
		require.NoError(t, err)
		require.Equal(t, softrdma.WCLocQPOpErr, localInv(t, p.B, key))
		m, _, _, _ := w.Binding()
		require.Same(t, mr, m, "the window is still bound")
		require.Equal(t, key, mr.RKey())
		_, err = p.B.QP.BindMW(nil, 2, 0, softrdma.MWBindInfo{})
		require.ErrorIs(t, err, softrdma.ErrBadOpcode)
	})
	t.Run("a type 2 window through ibv_bind_mw", func(t *testing.T) {
		p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
		w, err := p.B.Dev.AllocMW(p.B.PD, softrdma.MWType2)
		require.NoError(t, err)
		_, err = p.B.QP.BindMW(w, 1, 0, softrdma.MWBindInfo{})
		require.ErrorIs(t, err, softrdma.ErrBadOpcode)
		_, err = p.B.QP.PostSend(softrdma.SendWR{Opcode: softrdma.WRRegMR})
		require.ErrorIs(t, err, softrdma.ErrBadOpcode, "REG_MR without an MR")
	})
}

// TestReregMREndToEnd: after ibv_rereg_mr the old rkey misses (remote
// access error) and the new one reaches the new memory.
func TestReregMREndToEnd(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	src, srcMR := reg(t, p.A, 4096, rw)
	fill(6, src)
	old, mr := reg(t, p.B, 4096, rw)
	k0 := mr.RKey()
	cur := make([]byte, 4096)
	require.NoError(t, p.B.Dev.ReregMR(mr, softrdma.ReregChangeTranslation, nil, cur, 0))
	require.NotEqual(t, k0, mr.RKey())
	post(t, p.A.QP, writeWR(1, srcMR, src, mr.Addr(), mr.RKey()))
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
	require.Equal(t, src, cur)
	post(t, p.A.QP, writeWR(2, srcMR, src, uint64(addrOf(old)), k0))
	require.Equal(t, softrdma.WCRemAccessErr, waitWC(t, p.A.CQ, 1)[0].Status, "the key before the re-registration")
	require.Equal(t, make([]byte, 4096), old)

	err := p.B.Dev.ReregMR(mr, softrdma.ReregChangePD, nil, nil, 0)
	var re *softrdma.ReregError
	require.ErrorAs(t, err, &re)
	require.Equal(t, softrdma.ReregErrInput, re.Code)
	require.ErrorIs(t, err, softrdma.ErrBadPD)
	// One prefix, not "placement: rereg MR: softrdma: nil PD…".
	require.EqualError(t, err, "softrdma: rereg MR: nil PD, a PD of another device, or a deallocated PD (the MR is unchanged)")
	err = p.B.Dev.ReregMR(mr, 0, nil, nil, 0)
	require.ErrorIs(t, err, unix.EINVAL)
	require.EqualError(t, err, "softrdma: rereg MR: flags 0x0: invalid argument (the MR is unchanged)")
}

// TestWriteAcrossInvalidation: RDMA WRITEs stream into an FRWR MR while
// its owner posts LOCAL_INV. Every WRITE is either placed completely and
// completes successfully, or is NAKed (remote access error; those after it
// are flushed); and once the LOCAL_INV has completed no byte of the MR
// changes any more.
func TestWriteAcrossInvalidation(t *testing.T) {
	const (
		n    = 192
		size = 16 << 10 // four packets each
	)
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true,
		Cap: softrdma.Cap{MaxSendWR: 256, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	src, srcMR := reg(t, p.A, n*size, rw)
	fill(7, src)
	dst := make([]byte, n*size)
	mr, key := frwr(t, p.B, dst, rw)
	for i := range n {
		wr := writeWR(uint64(i), srcMR, src[i*size:(i+1)*size], mr.Addr()+uint64(i*size), key)
		post(t, p.A.QP, wr)
	}
	// Invalidate once some WRITEs have landed.
	got := waitWC(t, p.A.CQ, 4)
	require.Equal(t, softrdma.WCLocalInv, func() softrdma.WCOpcode {
		post(t, p.B.QP, softrdma.SendWR{WRID: 200, Opcode: softrdma.WRLocalInv, Flags: softrdma.SendSignaled, InvRKey: key})
		wc := waitWC(t, p.B.CQ, 1)[0]
		require.Equal(t, softrdma.WCSuccess, wc.Status)
		return wc.Opcode
	}())
	snapshot := bytes.Clone(dst)
	got = append(got, waitWC(t, p.A.CQ, n-len(got))...)
	time.Sleep(20 * time.Millisecond) // let anything late arrive (it must not be placed)
	require.Equal(t, snapshot, dst, "a byte was placed after the invalidation completed")
	ok, nak, flushed := 0, 0, 0
	for _, wc := range got {
		i := int(wc.WRID)
		switch wc.Status {
		case softrdma.WCSuccess:
			ok++
			require.Zero(t, nak+flushed, "successes come first (RC order)")
			require.Equal(t, src[i*size:(i+1)*size], dst[i*size:(i+1)*size], "WRITE %d completed but not placed completely", i)
		case softrdma.WCRemAccessErr:
			nak++
		case softrdma.WCWRFlushErr:
			flushed++
		default:
			t.Fatalf("WRITE %d: %v", i, wc.Status)
		}
	}
	t.Logf("%d placed, %d NAKed, %d flushed", ok, nak, flushed)
	require.GreaterOrEqual(t, ok, 4)
	require.LessOrEqual(t, nak, 1, "one NAK ends the stream")
	require.Equal(t, n, ok+nak+flushed)
}

// addrOf is the address of b's first byte (the IOVA of an MR on b).
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// TestReadThenFencedLocalInv is what stands in for "RDMA READ with
// invalidate", which RoCE has no opcode for: a READ into an FRWR MR and a
// LOCAL_INV of it with the fence flag posted together. The fenced local
// operation waits until the READ has completed, so the completions come
// in order and the data is all there.
func TestReadThenFencedLocalInv(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	remote, remoteMR := reg(t, p.B, 64<<10, rw)
	fill(8, remote)
	sink := make([]byte, 64<<10)
	mr, key := frwr(t, p.A, sink, rw)
	_, err := p.A.QP.PostSend(
		softrdma.SendWR{WRID: 1, Opcode: softrdma.WRRDMARead, Flags: softrdma.SendSignaled,
			SGL: []softrdma.SGE{{Addr: mr.Addr(), Length: uint32(len(sink)), LKey: key}}, RemoteAddr: remoteMR.Addr(), RKey: remoteMR.RKey()},
		softrdma.SendWR{WRID: 2, Opcode: softrdma.WRLocalInv, Flags: softrdma.SendSignaled | softrdma.SendFence, InvRKey: key})
	require.NoError(t, err)
	wcs := waitWC(t, p.A.CQ, 2)
	require.Equal(t, softrdma.WCRDMARead, wcs[0].Opcode)
	require.Equal(t, softrdma.WCSuccess, wcs[0].Status)
	require.Equal(t, softrdma.WCLocalInv, wcs[1].Opcode)
	require.Equal(t, softrdma.WCSuccess, wcs[1].Status)
	require.Equal(t, remote, sink)
	require.NoError(t, p.A.Dev.MapMR(mr, sink), "invalid again: it can be mapped")
}

// TestLocalOpsCompleteInOrder: a local operation executes when the
// requester reaches it but completes in send-queue order: behind the WRITE
// posted before it (which waits for its ACK) and before the WRITE after it.
func TestLocalOpsCompleteInOrder(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	src, srcMR := reg(t, p.A, 64<<10, rw)
	dst, dstMR := reg(t, p.B, 64<<10, rw)
	fill(9, src)
	_, key := frwr(t, p.A, make([]byte, 4096), rw)
	_, err := p.A.QP.PostSend(
		writeWR(1, srcMR, src, dstMR.Addr(), dstMR.RKey()),
		softrdma.SendWR{WRID: 2, Opcode: softrdma.WRLocalInv, Flags: softrdma.SendSignaled, InvRKey: key},
		writeWR(3, srcMR, src[:100], dstMR.Addr(), dstMR.RKey()))
	require.NoError(t, err)
	wcs := waitWC(t, p.A.CQ, 3)
	for i, want := range []softrdma.WCOpcode{softrdma.WCRDMAWrite, softrdma.WCLocalInv, softrdma.WCRDMAWrite} {
		require.Equal(t, softrdma.WCSuccess, wcs[i].Status)
		require.Equal(t, uint64(i+1), wcs[i].WRID)
		require.Equal(t, want, wcs[i].Opcode)
	}
	require.Equal(t, src, dst)
}

// TestSendWithInvalidateWrongWindow: a SEND with Invalidate naming a type 1
// window (IBTA o10-37.2.26: only a bind invalidates one; rxe_invalidate_mw
// refuses it) or a type 2 window bound to another QP of the PD is the
// responder's class J error: the receive completes with REM_INV_REQ_ERR,
// the SEND is NAKed (invalid request: WCRemInvReqErr at the sender), the
// refusal is counted (DropAccess, an R_Key failure), and the window stays
// bound and usable.
func TestSendWithInvalidateWrongWindow(t *testing.T) {
	for _, typ := range []softrdma.MWType{softrdma.MWType1, softrdma.MWType2} {
		t.Run(typ.String(), func(t *testing.T) {
			p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
			_, srcMR := reg(t, p.A, 4096, rw)
			_, recvMR := reg(t, p.B, 4096, rw)
			mem, mr := reg(t, p.B, 4096, rw|softrdma.AccessMWBind)
			w, err := p.B.Dev.AllocMW(p.B.PD, typ)
			require.NoError(t, err)
			info := softrdma.MWBindInfo{MR: mr, Addr: mr.Addr(), Length: 4096, Access: softrdma.AccessRemoteWrite}
			var key uint32
			sender := p.A.QP
			if typ == softrdma.MWType1 {
				key, err = p.B.QP.BindMW(w, 1, softrdma.SendSignaled, info)
				require.NoError(t, err)
			} else {
				// Bound on a second QP: the pair's QP is not its own.
				_, b2 := secondQP(t, p)
				key = softrdma.IncRKey(w.RKey())
				post(t, b2, softrdma.SendWR{WRID: 1, Opcode: softrdma.WRBindMW, Flags: softrdma.SendSignaled,
					BindMW: softrdma.MWBind{MW: w, RKey: key, Info: info}})
			}
			require.Equal(t, softrdma.WCSuccess, waitWC(t, p.B.CQ, 1)[0].Status)
			drops := p.B.Dev.Counters().Drops[transport.DropAccess].Load()

			_, err = p.B.QP.PostRecv(softrdma.RecvWR{WRID: 7, SGL: []softrdma.SGE{{Addr: recvMR.Addr(), Length: 4096, LKey: recvMR.LKey()}}})
			require.NoError(t, err)
			post(t, sender, softrdma.SendWR{WRID: 2, Opcode: softrdma.WRSendWithInv, Flags: softrdma.SendSignaled, InvRKey: key,
				SGL: []softrdma.SGE{{Addr: srcMR.Addr(), Length: 10, LKey: srcMR.LKey()}}})
			require.Equal(t, softrdma.WCRemInvReqErr, waitWC(t, p.A.CQ, 1)[0].Status)
			wc := waitWC(t, p.B.CQ, 1)[0]
			require.Equal(t, softrdma.WCRemInvReqErr, wc.Status)
			require.Equal(t, uint64(7), wc.WRID)
			require.Zero(t, wc.Flags&softrdma.WCWithInv)
			require.Equal(t, drops+1, p.B.Dev.Counters().Drops[transport.DropAccess].Load(), "counted")
			m, _, _, _ := w.Binding()
			require.Equal(t, mr, m, "still bound")
			require.Equal(t, key, w.RKey())
			require.Equal(t, make([]byte, 10), mem[:10])
		})
	}
}
