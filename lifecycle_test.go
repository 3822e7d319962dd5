package softrdma_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// TestDeallocPD: ibv_dealloc_pd(3) fails with EBUSY while anything of the
// PD exists (an MR, a fast-registration MR, a memory window, a QP, an
// address handle), and succeeds once each is gone; afterwards the PD is
// refused everywhere, and a second DeallocPD, a nil PD and another
// device's PD are ErrBadPD.
func TestDeallocPD(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	d := p.A.Dev
	busy := func(pd *softrdma.PD, what string) {
		t.Helper()
		err := d.DeallocPD(pd)
		require.ErrorIs(t, err, unix.EBUSY, what)
		require.ErrorContains(t, err, what)
	}
	qpAttr := func(cq *softrdma.CQ) softrdma.QPInitAttr {
		return softrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: softrdma.QPTypeRC,
			Cap: softrdma.Cap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}
	}

	pd, err := d.AllocPD()
	require.NoError(t, err)
	mr, err := d.RegMR(pd, make([]byte, 4096), rw)
	require.NoError(t, err)
	busy(pd, "an MR or a memory window")
	require.NoError(t, d.DeregMR(mr))
	fr, err := d.AllocMR(pd, 1)
	require.NoError(t, err)
	busy(pd, "an MR or a memory window")
	require.NoError(t, d.DeregMR(fr))
	mw, err := d.AllocMW(pd, softrdma.MWType1)
	require.NoError(t, err)
	busy(pd, "an MR or a memory window")
	require.NoError(t, d.DeallocMW(mw))
	cq, err := d.CreateCQ(4)
	require.NoError(t, err)
	qp, err := d.CreateQP(pd, qpAttr(cq))
	require.NoError(t, err)
	busy(pd, "QP")
	require.NoError(t, d.DestroyQP(qp))
	ah, err := d.CreateAH(pd, softrdma.AHAttrFor(p.B.Dev.LocalAddr()))
	require.NoError(t, err)
	busy(pd, "an address handle")
	require.NoError(t, d.DestroyAH(ah))

	require.NoError(t, d.DeallocPD(pd))
	require.ErrorIs(t, d.DeallocPD(pd), softrdma.ErrBadPD, "deallocated twice")
	_, err = d.RegMR(pd, make([]byte, 4096), rw)
	require.ErrorIs(t, err, softrdma.ErrBadPD)
	_, err = d.AllocMR(pd, 1)
	require.ErrorIs(t, err, softrdma.ErrBadPD)
	_, err = d.AllocMW(pd, softrdma.MWType1)
	require.ErrorIs(t, err, softrdma.ErrBadPD)
	_, err = d.CreateQP(pd, qpAttr(cq))
	require.ErrorIs(t, err, softrdma.ErrBadPD)
	_, err = d.CreateAH(pd, softrdma.AHAttrFor(p.B.Dev.LocalAddr()))
	require.ErrorIs(t, err, softrdma.ErrBadPD)

	require.ErrorIs(t, d.DeallocPD(nil), softrdma.ErrBadPD)
	require.ErrorIs(t, d.DeallocPD(p.B.PD), softrdma.ErrBadPD, "another device's PD")
	// The pair's own PD is in use (its QP and MRs): EBUSY, and it still works.
	busy(p.A.PD, "")
	_, err = d.RegMR(p.A.PD, make([]byte, 64), rw)
	require.NoError(t, err)
}

// TestDestroyCQ: ibv_destroy_cq(3) fails with EBUSY while a QP uses the CQ
// (as its send or its receive CQ) and succeeds once the QP is destroyed; a
// waiter blocked on the CQ then returns ErrBadCQ, as Poll does, CreateQP
// refuses the CQ, and a second DestroyCQ, nil and another device's CQ are
// ErrBadCQ.
func TestDestroyCQ(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	d := p.A.Dev
	scq, err := d.CreateCQ(4)
	require.NoError(t, err)
	rcq, err := d.CreateCQ(4)
	require.NoError(t, err)
	capQP := softrdma.Cap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}
	qp, err := d.CreateQP(p.A.PD, softrdma.QPInitAttr{SendCQ: scq, RecvCQ: rcq, Type: softrdma.QPTypeRC, Cap: capQP})
	require.NoError(t, err)
	require.ErrorIs(t, d.DestroyCQ(scq), unix.EBUSY, "the QP's send CQ")
	require.ErrorIs(t, d.DestroyCQ(rcq), unix.EBUSY, "the QP's receive CQ")
	require.NoError(t, d.DestroyQP(qp))

	const waiters = 4
	waited := make(chan error, waiters)
	for range waiters {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := rcq.Wait(ctx, make([]softrdma.WC, 1))
			waited <- err
		}()
	}
	require.NoError(t, d.DestroyCQ(rcq))
	for range waiters {
		require.ErrorIs(t, <-waited, softrdma.ErrBadCQ, "every waiter wakes with ErrBadCQ, not at its deadline")
	}
	_, err = rcq.Poll(make([]softrdma.WC, 1))
	require.ErrorIs(t, err, softrdma.ErrBadCQ)
	_, err = d.CreateQP(p.A.PD, softrdma.QPInitAttr{SendCQ: scq, RecvCQ: rcq, Type: softrdma.QPTypeRC, Cap: capQP})
	require.ErrorIs(t, err, softrdma.ErrBadAttr)
	require.ErrorIs(t, d.DestroyCQ(rcq), softrdma.ErrBadCQ, "destroyed twice")
	require.ErrorIs(t, d.DestroyCQ(nil), softrdma.ErrBadCQ)
	require.ErrorIs(t, d.DestroyCQ(p.B.CQ), softrdma.ErrBadCQ, "another device's CQ")
	require.NoError(t, d.DestroyCQ(scq))
	require.False(t, errors.Is(d.DestroyCQ(p.A.CQ), softrdma.ErrBadCQ), "the pair's CQ is in use, not bad")
}

// The errors docs/api.md names are the root package's, for errors.Is
// without importing transport: RESET -> ERR, a misaligned atomic, an
// atomic with a longer local SGE.
func TestRootErrorsForModifyAndAtomics(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{})
	mr, err := p.A.Dev.RegMR(p.A.PD, make([]byte, 64), softrdma.AccessLocalWrite)
	require.NoError(t, err)
	_, err = p.A.QP.PostSend(softrdma.SendWR{Opcode: softrdma.WRAtomicFetchAndAdd, RemoteAddr: 0x1004, RKey: 1,
		SGL: []softrdma.SGE{{Addr: mr.Addr(), Length: 8, LKey: mr.LKey()}}})
	require.ErrorIs(t, err, softrdma.ErrAtomicAlign)
	_, err = p.A.QP.PostSend(softrdma.SendWR{Opcode: softrdma.WRAtomicFetchAndAdd, RemoteAddr: 0x1000, RKey: 1,
		SGL: []softrdma.SGE{{Addr: mr.Addr(), Length: 16, LKey: mr.LKey()}}})
	require.ErrorIs(t, err, softrdma.ErrAtomicLength)
	require.NoError(t, p.A.QP.Modify(&softrdma.QPAttr{State: softrdma.QPStateReset}, softrdma.QPAttrState))
	require.ErrorIs(t, p.A.QP.Modify(&softrdma.QPAttr{State: softrdma.QPStateErr}, softrdma.QPAttrState), softrdma.ErrBadTransition)
}
