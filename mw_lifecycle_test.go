package softrdma_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// TestMRFieldsReadDuringRegMR: the application reads an FRWR MR's keys
// and range (ibv_mr's fields) while the send worker executes its REG_MR,
// which changes them. Under -race this failed: FastReg wrote MR.key and
// MR.entry unsynchronized with LKey, RKey, Addr, Length.
func TestMRFieldsReadDuringRegMR(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	mr, err := p.B.Dev.AllocMR(p.B.PD, 1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.B.Dev.DeregMR(mr) })
	buf := make([]byte, 4096)
	require.NoError(t, p.B.Dev.MapMR(mr, buf))
	key := softrdma.IncRKey(mr.LKey())
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _, _, _ = mr.LKey(), mr.RKey(), mr.Addr(), mr.Length()
		}
	}()
	post(t, p.B.QP, softrdma.SendWR{WRID: 1, Opcode: softrdma.WRRegMR, Flags: softrdma.SendSignaled,
		Reg: softrdma.RegWR{MR: mr, Key: key, Access: rw}})
	wc := waitWC(t, p.B.CQ, 1)[0]
	close(stop)
	<-done
	require.Equal(t, softrdma.WCSuccess, wc.Status)
	require.Equal(t, key, mr.RKey())
	require.Equal(t, uint64(addrOf(buf)), mr.Addr())
}

// TestType1WindowBoundOnlyByBindMW: a BIND_MW work request posted for a
// type 1 window is refused (libibverbs binds type 1 windows with
// ibv_bind_mw only; mlx5 and ionic refuse IBV_WR_BIND_MW for them with
// EINVAL). Accepted, it bypassed MW.NextRKey: the next QP.BindMW handed
// out the key of the binding the work request had made, so that key —
// stale once rebound — reached the new binding.
func TestType1WindowBoundOnlyByBindMW(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	_, mr := reg(t, p.B, 8192, rw|softrdma.AccessMWBind)
	w, err := p.B.Dev.AllocMW(p.B.PD, softrdma.MWType1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.B.Dev.DeallocMW(w) })
	k1, err := p.B.QP.BindMW(w, 1, softrdma.SendSignaled, softrdma.MWBindInfo{MR: mr, Addr: mr.Addr(), Length: 4096, Access: softrdma.AccessRemoteWrite})
	require.NoError(t, err)
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.B.CQ, 1)[0].Status)
	k2 := softrdma.IncRKey(w.RKey())
	_, err = p.B.QP.PostSend(softrdma.SendWR{WRID: 2, Opcode: softrdma.WRBindMW, Flags: softrdma.SendSignaled,
		BindMW: softrdma.MWBind{MW: w, RKey: k2, Info: softrdma.MWBindInfo{MR: mr, Addr: mr.Addr(), Length: 4096, Access: softrdma.AccessRemoteWrite}}})
	require.ErrorIs(t, err, softrdma.ErrBadOpcode, "IBV_WR_BIND_MW of a type 1 window")
	k3, err := p.B.QP.BindMW(w, 3, softrdma.SendSignaled, softrdma.MWBindInfo{MR: mr, Addr: mr.Addr() + 4096, Length: 4096, Access: softrdma.AccessRemoteWrite})
	require.NoError(t, err)
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.B.CQ, 1)[0].Status)
	require.NotEqual(t, k1, k3)
	require.Equal(t, k3, w.RKey())
}

// TestWindowAtomicOnODPEndToEnd: an atomic through a memory window (type
// 1, and type 2 on its QP) onto a page of an ODP MR that is not present is
// faulted in and executed under both fault policies. It was NAKed with a
// remote access error: the atomic's fault resolved the rkey as an MR's.
func TestWindowAtomicOnODPEndToEnd(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		for _, typ := range []softrdma.MWType{softrdma.MWType1, softrdma.MWType2} {
			p := softrdmatest.NewPair(t, o)
			local, localMR := reg(t, p.A, 64, rw)
			remote, mr := odpAlloc(t, p.B, 2*pageSize, softrdma.AccessLocalWrite|softrdma.AccessMWBind)
			w, err := p.B.Dev.AllocMW(p.B.PD, typ)
			require.NoError(t, err)
			info := softrdma.MWBindInfo{MR: mr, Addr: mr.Addr(), Length: 2 * pageSize, Access: softrdma.AccessRemoteAtomic}
			k := bindOnB(t, p, w, typ, info)
			post(t, p.A.QP, softrdma.SendWR{WRID: 2, Opcode: softrdma.WRAtomicFetchAndAdd, Flags: softrdma.SendSignaled, CompareAdd: 7,
				SGL:        []softrdma.SGE{{Addr: localMR.Addr(), Length: 8, LKey: localMR.LKey()}},
				RemoteAddr: mr.Addr() + pageSize + 8, RKey: k})
			wc := waitWC(t, p.A.CQ, 1)[0]
			require.Equal(t, softrdma.WCSuccess, wc.Status, "%v", typ)
			require.Zero(t, binary.NativeEndian.Uint64(local))
			require.EqualValues(t, 7, binary.NativeEndian.Uint64(remote[pageSize+8:]))
			require.NoError(t, p.B.Dev.DeallocMW(w))
		}
	})
}

// TestBindMWChecksAtPost: ibv_bind_mw checks what it can when it posts
// (rdma-core's rxe provider: an MR of another PD is EPERM; ZERO_BASED, or
// an address or length without an MR, EINVAL) and posts nothing, so the
// QP stays usable. QP.BindMW posted such binds, which then completed with
// IBV_WC_MW_BIND_ERR and moved the QP to ERR.
func TestBindMWChecksAtPost(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	_, mr := reg(t, p.B, 4096, rw|softrdma.AccessMWBind)
	pd2, err := p.B.Dev.AllocPD()
	require.NoError(t, err)
	other, err := p.B.Dev.RegMR(pd2, make([]byte, 4096), rw|softrdma.AccessMWBind)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.B.Dev.DeregMR(other) })
	w, err := p.B.Dev.AllocMW(p.B.PD, softrdma.MWType1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.B.Dev.DeallocMW(w) })
	for _, tc := range []struct {
		name string
		info softrdma.MWBindInfo
		is   error
	}{
		{"an MR of another PD", softrdma.MWBindInfo{MR: other, Addr: other.Addr(), Length: 64, Access: softrdma.AccessRemoteRead}, unix.EPERM},
		{"zero based", softrdma.MWBindInfo{MR: mr, Addr: 0, Length: 64, Access: softrdma.AccessRemoteRead | softrdma.AccessZeroBased}, unix.EINVAL},
		{"a length without an MR", softrdma.MWBindInfo{Length: 64, Access: softrdma.AccessRemoteRead}, unix.EINVAL},
	} {
		_, err := p.B.QP.BindMW(w, 1, softrdma.SendSignaled, tc.info)
		require.ErrorIs(t, err, tc.is, tc.name)
		require.Equal(t, softrdma.QPStateRTS, p.B.QP.State(), tc.name)
	}
	k, err := p.B.QP.BindMW(w, 2, softrdma.SendSignaled, softrdma.MWBindInfo{MR: mr, Addr: mr.Addr(), Length: 64, Access: softrdma.AccessRemoteRead})
	require.NoError(t, err)
	wc := waitWC(t, p.B.CQ, 1)[0]
	require.Equal(t, uint64(2), wc.WRID, "nothing was posted by the refused binds")
	require.Equal(t, softrdma.WCSuccess, wc.Status)
	require.Equal(t, k, w.RKey())
}

// TestWindowWriteReadOnODPEndToEnd: an RDMA WRITE and an RDMA READ through
// a memory window (type 1, and type 2 on its QP) onto pages of an ODP MR
// that are not present, where the MR has no remote rights of its own (the
// window grants them), complete under both fault policies. Under the rnr
// policy the WRITE was RNR-NAKed for ever: the background fault resolved
// the MR's own key as an R_Key, which its missing remote rights refuse, so
// no page was ever faulted in.
func TestWindowWriteReadOnODPEndToEnd(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		for _, typ := range []softrdma.MWType{softrdma.MWType1, softrdma.MWType2} {
			p := softrdmatest.NewPair(t, o)
			src, srcMR := reg(t, p.A, 3*pageSize, rw)
			back, backMR := reg(t, p.A, 3*pageSize, rw)
			remote, mr := odpAlloc(t, p.B, 4*pageSize, softrdma.AccessLocalWrite|softrdma.AccessMWBind)
			w, err := p.B.Dev.AllocMW(p.B.PD, typ)
			require.NoError(t, err)
			info := softrdma.MWBindInfo{MR: mr, Addr: mr.Addr() + pageSize, Length: 3 * pageSize,
				Access: softrdma.AccessRemoteWrite | softrdma.AccessRemoteRead}
			k := bindOnB(t, p, w, typ, info)
			fill(9, src)
			post(t, p.A.QP, writeWR(2, srcMR, src, mr.Addr()+pageSize, k))
			require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status, "WRITE through a %v window", typ)
			require.Equal(t, src, remote[pageSize:])
			post(t, p.A.QP, softrdma.SendWR{WRID: 3, Opcode: softrdma.WRRDMARead, Flags: softrdma.SendSignaled,
				SGL:        []softrdma.SGE{{Addr: backMR.Addr(), Length: uint32(len(back)), LKey: backMR.LKey()}},
				RemoteAddr: mr.Addr() + pageSize, RKey: k})
			require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status, "READ through a %v window", typ)
			require.Equal(t, src, back)
			require.NoError(t, p.B.Dev.DeallocMW(w))
		}
	})
}

// bindOnB binds w on the pair's B side as its type is bound (type 1 with
// ibv_bind_mw, type 2 with a bind WR and the next rkey), waits for the
// bind's completion, and returns the window's new rkey.
func bindOnB(t *testing.T, p *softrdmatest.Pair, w *softrdma.MW, typ softrdma.MWType, info softrdma.MWBindInfo) uint32 {
	t.Helper()
	var k uint32
	if typ == softrdma.MWType1 {
		var err error
		k, err = p.B.QP.BindMW(w, 1, softrdma.SendSignaled, info)
		require.NoError(t, err)
	} else {
		k = softrdma.IncRKey(w.RKey())
		post(t, p.B.QP, softrdma.SendWR{WRID: 1, Opcode: softrdma.WRBindMW, Flags: softrdma.SendSignaled,
			BindMW: softrdma.MWBind{MW: w, RKey: k, Info: info}})
	}
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.B.CQ, 1)[0].Status)
	return k
}
