package placement_test

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
)

// TestType1RKeyChangesAtPost: a type 1 window's rkey (ibv_mw.rkey) is the
// key of the last bind posted, from the moment it is posted: rdma-core's
// ibv_bind_mw (providers/rxe rxe_bind_mw, mlx5_bind_mw) sets mw->rkey to
// ibv_inc_rkey of the old one as soon as the post succeeds, so that the
// application may send it to its peer at once. RKey returned the old key
// until the bind executed. A bind that completes in error gives the key
// back ("user has to undo this if he gets an error wc", rxe_bind_mw; the
// undo is done here, ibv_mw.rkey being read-only in this API).
func TestType1RKeyChangesAtPost(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	mr := reg(t, e, pd1, make([]byte, 8192), rw|stag.AccessMWBind)
	noBind := reg(t, e, pd1, make([]byte, 4096), rw) // no MW_BIND access
	w, err := e.AllocMW(pd1, placement.MWType1)
	require.NoError(t, err)
	k0 := w.RKey()

	p := w.PostRKey()
	require.Equal(t, incKey(k0), p.RKey, "ibv_inc_rkey of the window's key")
	require.Equal(t, p.RKey, w.RKey(), "ibv_mw.rkey is updated when the bind is posted")
	inv, err := e.BindPosted(pd1, 5, nil, w, p, placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 4096, Access: stag.AccessRemoteWrite})
	require.NoError(t, err)
	require.NoError(t, inv.Wait())
	w.Settle(p, true)
	require.Equal(t, p.RKey, w.RKey())
	require.Equal(t, placement.OK, write(e, pd1, 0, p.RKey, mr.Addr(), []byte{1}))

	// A bind that fails when it executes (C10-73: the MR lacks MW_BIND):
	// the key goes back to the window's.
	q := w.PostRKey()
	require.Equal(t, incKey(p.RKey), w.RKey())
	_, err = e.BindPosted(pd1, 5, nil, w, q, placement.BindInfo{MR: noBind, Addr: noBind.Addr(), Length: 64, Access: stag.AccessRemoteWrite})
	require.ErrorIs(t, err, unix.EINVAL)
	w.Settle(q, false)
	require.Equal(t, p.RKey, w.RKey(), "the failed bind's key is undone")
	require.Equal(t, placement.OK, write(e, pd1, 0, p.RKey, mr.Addr(), []byte{2}), "the binding is unchanged")

	// A bind posted after a bind that is still pending expects the
	// pending one's key (rxe: mw_rkey, the key at post); executed out of
	// order it fails (EINVAL, as rxe_bind_mw's mw->rkey != mw_rkey).
	a, b := w.PostRKey(), w.PostRKey()
	require.Equal(t, b.RKey, w.RKey())
	_, err = e.BindPosted(pd1, 6, nil, w, b, placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 64, Access: stag.AccessRemoteRead})
	require.ErrorIs(t, err, unix.EINVAL, "b executed before a")
	w.Settle(b, false)
	require.Equal(t, a.RKey, w.RKey(), "b's key undone, a's still pending")
	inv, err = e.BindPosted(pd1, 5, nil, w, a, placement.BindInfo{MR: mr, Addr: mr.Addr() + 4096, Length: 4096, Access: stag.AccessRemoteWrite})
	require.NoError(t, err)
	require.NoError(t, inv.Wait())
	w.Settle(a, true)
	require.Equal(t, a.RKey, w.RKey())
	require.Equal(t, placement.OK, write(e, pd1, 0, a.RKey, mr.Addr()+4096, []byte{3}))
	require.NoError(t, e.DeallocMW(w))
}

// TestRebindWaitsForRebindInProgress: two QPs rebind the same type 1
// window; the second bind executes while the first waits for the
// placements through the old binding. rxe serialises binds under the
// window's lock (rxe_bind_mw: spin_lock_bh(&mw->lock)), so the second one
// sees the first's result and succeeds (IBTA 10.6.7.2: a bind of a bound
// type 1 window rebinds it). It failed with ErrBusy, which completes the
// BIND_MW with IBV_WC_MW_BIND_ERR and moves the QP to ERR.
func TestRebindWaitsForRebindInProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := placement.New(placement.Config{PinLimit: 64 << 20})
		buf := make([]byte, 3*4096)
		mr := reg(t, e, pd1, buf, rw|stag.AccessMWBind)
		w, err := e.AllocMW(pd1, placement.MWType1)
		require.NoError(t, err)
		k1 := w.PostRKey()
		_, err = e.BindPosted(pd1, 5, nil, w, k1, placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 4096, Access: stag.AccessRemoteWrite})
		require.NoError(t, err)
		w.Settle(k1, true)

		var c placement.Cursor // unbound: holds the MR until End
		require.Equal(t, placement.OK, e.Begin(&c, pd1, k1.RKey, mr.Addr(), 8, stag.AccessRemoteWrite))
		k2, k3 := w.PostRKey(), w.PostRKey()
		inv2, err := e.BindPosted(pd1, 5, nil, w, k2, placement.BindInfo{MR: mr, Addr: mr.Addr() + 4096, Length: 4096, Access: stag.AccessRemoteWrite})
		require.NoError(t, err)
		require.NotNil(t, inv2, "a rebind waits for the placements through the old binding")
		inv3, err := e.BindPosted(pd1, 6, nil, w, k3, placement.BindInfo{MR: mr, Addr: mr.Addr() + 8192, Length: 4096, Access: stag.AccessRemoteWrite})
		require.NoError(t, err, "a bind of a window being rebound waits for it")
		require.NotNil(t, inv3)

		done2, done3 := make(chan error, 1), make(chan error, 1)
		go func() { done3 <- inv3.Wait() }()
		go func() { done2 <- inv2.Wait() }()
		synctest.Wait()
		select {
		case <-done2:
			t.Fatal("the first rebind finished while a placement holds the old binding")
		case <-done3:
			t.Fatal("the second rebind finished before the first")
		default:
		}
		e.End(&c)
		require.NoError(t, <-done2)
		w.Settle(k2, true)
		require.NoError(t, <-done3)
		w.Settle(k3, true)
		require.Equal(t, k3.RKey, w.RKey())
		require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 0, k2.RKey, mr.Addr()+4096, []byte{1}), "k2 is stale")
		require.Equal(t, placement.OK, write(e, pd1, 0, k3.RKey, mr.Addr()+8192, []byte{2}))
		require.Equal(t, byte(2), buf[8192])
		require.NoError(t, e.DeallocMW(w))
	})
}
