package placement_test

import (
	"bytes"
	"errors"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
)

// incKey is ibv_inc_rkey.
func incKey(k uint32) uint32 { return k&^0xff | (k+1)&0xff }

// write places payload at va through rkey as one WRITE ONLY message of a
// cursor serving QP qpn, and returns the status of Begin or Write.
func write(e *placement.Engine, pd, qpn, rkey uint32, va uint64, payload []byte) placement.Status {
	var c placement.Cursor
	c.SetQP(qpn)
	if st := e.Begin(&c, pd, rkey, va, uint64(len(payload)), stag.AccessRemoteWrite); st != placement.OK {
		return st
	}
	defer e.End(&c)
	return e.Write(&c, payload)
}

// TestFastRegLifecycle walks an FRWR MR through its life: allocated
// invalid, mapped, registered under a new key (the old key misses),
// invalidated (every key misses), mapped onto other memory and registered
// again, as ib_alloc_mr, ib_map_mr_sg, IB_WR_REG_MR and IB_WR_LOCAL_INV do.
func TestFastRegLifecycle(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	mr, err := e.AllocMR(pd1, 3)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.DeregMR(mr)) }()
	require.True(t, mr.FastReg())
	key0 := mr.RKey()
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 0, key0, 0, []byte{1}), "allocated invalid")
	require.ErrorIs(t, e.FastReg(pd1, mr, incKey(key0), rw), unix.EINVAL, "nothing mapped yet")

	buf1, check1 := guarded(t, 8000) // 3 pages: mid-page start and end
	require.ErrorIs(t, e.MapMR(mr, make([]byte, 3*4096+1)), unix.EINVAL, "4 pages > maxPages 3")
	require.NoError(t, e.MapMR(mr, buf1))
	key1 := incKey(key0)
	require.NoError(t, e.FastReg(pd1, mr, key1, rw))
	require.Equal(t, key1, mr.RKey())
	require.Equal(t, key1, mr.LKey())
	require.Equal(t, uint64(len(buf1)), mr.Length())
	require.Equal(t, placement.OK, write(e, pd1, 0, key1, mr.Addr()+10, []byte("frwr")))
	require.Equal(t, "frwr", string(buf1[10:14]))
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 0, key0, mr.Addr()+10, []byte("x")), "the old key misses")
	require.ErrorIs(t, e.FastReg(pd1, mr, incKey(key1), rw), unix.EINVAL, "registered: invalidate first (rxe: MR not free)")
	require.ErrorIs(t, e.MapMR(mr, buf1), placement.ErrBusy)

	inv, err := e.Invalidate(pd1, 0, key1, false)
	require.NoError(t, err)
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 0, key1, mr.Addr(), []byte("x")), "refused as soon as it begins")
	inv.Wait()
	inv, err = e.Invalidate(pd1, 0, key1, false)
	require.NoError(t, err, "invalidating an invalid MR is no error (rxe)")
	require.Nil(t, inv)

	buf2 := make([]byte, 4096)
	require.NoError(t, e.MapMR(mr, buf2))
	key2 := incKey(key1)
	require.NoError(t, e.FastReg(pd1, mr, key2, stag.AccessLocalWrite|stag.AccessRemoteWrite))
	require.Equal(t, placement.OK, write(e, pd1, 0, key2, mr.Addr(), []byte("two")))
	require.Equal(t, "two", string(buf2[:3]))
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 0, key1, mr.Addr(), []byte("x")), "the key of the previous registration misses")
	require.Equal(t, "frwr", string(buf1[10:14]), "the old memory is not written")
	check1()
	require.Equal(t, int64(4096), e.PinnedBytes(), "the first mapping was unpinned")
}

// TestFastRegErrors has one row per refusal of a REG_MR (rxe_reg_fast_mr
// and RegMR's access rules).
func TestFastRegErrors(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	mr, err := e.AllocMR(pd1, 4)
	require.NoError(t, err)
	require.NoError(t, e.MapMR(mr, make([]byte, 4096)))
	plain := reg(t, e, pd1, make([]byte, 4096), rw)
	next := incKey(mr.LKey())
	for _, tc := range []struct {
		name   string
		pd     uint32
		mr     *placement.MR
		key    uint32
		access stag.Access
		is     error
	}{
		{"the QP's PD is not the MR's", pd2, mr, next, rw, unix.EINVAL},
		{"a key of another index", pd1, mr, next + 0x100, rw, unix.EINVAL},
		{"remote write without local write", pd1, mr, next, stag.AccessRemoteWrite, unix.EINVAL},
		{"unknown access bit", pd1, mr, next, rw | 1<<20, unix.EINVAL},
		{"on demand", pd1, mr, next, rw | stag.AccessOnDemand, unix.EINVAL},
		{"zero based", pd1, mr, next, rw | stag.AccessZeroBased, unix.EOPNOTSUPP},
		{"an MR of RegMR", pd1, plain, incKey(plain.LKey()), rw, unix.EINVAL},
		{"nil MR", pd1, nil, next, rw, unix.EINVAL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, e.FastReg(tc.pd, tc.mr, tc.key, tc.access), tc.is)
		})
	}
	_, err = e.AllocMR(pd1, 0)
	require.ErrorIs(t, err, unix.EINVAL)
	_, err = e.AllocMR(pd1, placement.MaxFastRegPages+1)
	require.ErrorIs(t, err, unix.EINVAL)
	require.ErrorIs(t, e.MapMR(plain, make([]byte, 64)), unix.EINVAL, "MapMR is for AllocMR's MRs")
	require.ErrorIs(t, e.MapMR(mr, nil), unix.EINVAL)
	require.NoError(t, e.DeregMR(mr))
}

// TestInvalidateErrors has one row per refusal of LOCAL_INV and of a SEND
// with Invalidate (rxe_invalidate_mr, rxe_invalidate_mw).
func TestInvalidateErrors(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	frwr := func(access stag.Access) *placement.MR {
		mr, err := e.AllocMR(pd1, 1)
		require.NoError(t, err)
		require.NoError(t, e.MapMR(mr, make([]byte, 4096)))
		require.NoError(t, e.FastReg(pd1, mr, incKey(mr.LKey()), access))
		t.Cleanup(func() { _ = e.DeregMR(mr) })
		return mr
	}
	remote := frwr(rw | stag.AccessMWBind)
	local := frwr(stag.AccessLocalWrite)
	plain := reg(t, e, pd1, make([]byte, 4096), rw|stag.AccessMWBind)
	t1, err := e.AllocMW(pd1, placement.MWType1)
	require.NoError(t, err)
	t2, err := e.AllocMW(pd1, placement.MWType2)
	require.NoError(t, err)
	unbound, err := e.AllocMW(pd1, placement.MWType2)
	require.NoError(t, err)
	_, err = e.BindMW(pd1, 5, t1, t1.NextRKey(), placement.BindInfo{MR: remote, Addr: remote.Addr(), Length: 64, Access: stag.AccessRemoteRead})
	require.NoError(t, err)
	_, err = e.BindMW(pd1, 5, t2, incKey(t2.RKey()), placement.BindInfo{MR: plain, Addr: plain.Addr(), Length: 64, Access: stag.AccessRemoteRead})
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		pd     uint32
		qpn    uint32
		key    uint32
		remote bool
		is     error
	}{
		{"unknown key", pd1, 5, 0x7fff01, false, unix.EINVAL},
		{"stale key", pd1, 5, remote.LKey() - 1, false, unix.EINVAL},
		{"another PD", pd2, 5, local.LKey(), false, unix.EINVAL},
		{"an MR of RegMR", pd1, 5, plain.LKey(), false, unix.EINVAL},
		{"remote invalidation of an MR without remote rights", pd1, 5, local.LKey(), true, unix.EINVAL},
		{"an MR with a window bound", pd1, 5, remote.LKey(), false, placement.ErrMWBound},
		{"a type 1 window (o10-37.2.26)", pd1, 5, t1.RKey(), false, unix.EINVAL},
		{"a type 1 window, remotely", pd1, 5, t1.RKey(), true, unix.EINVAL},
		{"an unbound type 2 window", pd1, 5, unbound.RKey(), false, unix.EINVAL},
		{"a type 2 window remotely through another QP", pd1, 6, t2.RKey(), true, unix.EINVAL},
		{"a type 2 window of another PD", pd2, 5, t2.RKey(), false, unix.EINVAL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := e.Invalidate(tc.pd, tc.qpn, tc.key, tc.remote)
			require.ErrorIs(t, err, tc.is)
			require.Nil(t, inv)
		})
	}
	// Nothing was lost: every key still works.
	require.Equal(t, placement.OK, write(e, pd1, 0, remote.RKey(), remote.Addr(), []byte{1}))
	var c placement.Cursor
	c.SetQP(5)
	require.Equal(t, placement.OK, e.Begin(&c, pd1, t2.RKey(), plain.Addr(), 8, stag.AccessRemoteRead))
	e.End(&c)
	require.Equal(t, placement.OK, e.Begin(&c, pd1, t1.RKey(), remote.Addr(), 8, stag.AccessRemoteRead))
	e.End(&c)
	err = e.DeregMR(remote)
	require.ErrorIs(t, err, placement.ErrMWBound, "windows are bound to it")
	require.EqualError(t, err, "placement: dereg MR: memory windows are bound to the MR: invalid argument", "one prefix")
	require.NoError(t, e.DeallocMW(t1))
	require.NoError(t, e.DeallocMW(t2))
	require.NoError(t, e.DeallocMW(unbound))
	require.ErrorIs(t, e.DeallocMW(t1), unix.EINVAL, "twice")
}

// TestInvalidationWaitsForPlacementsInFlight: an invalidation refuses new
// accesses at once, makes the next packet of a message in progress fail
// without placing it, and its Wait returns only when the placements that
// hold the region (here an unbound cursor's message) have ended.
func TestInvalidationWaitsForPlacementsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := placement.New(placement.Config{PinLimit: 64 << 20})
		mr, err := e.AllocMR(pd1, 1)
		require.NoError(t, err)
		buf := make([]byte, 4096)
		require.NoError(t, e.MapMR(mr, buf))
		key := incKey(mr.LKey())
		require.NoError(t, e.FastReg(pd1, mr, key, rw))

		var c placement.Cursor // unbound: counts a reference from Begin to End
		require.Equal(t, placement.OK, e.Begin(&c, pd1, key, mr.Addr(), 200, stag.AccessRemoteWrite))
		require.Equal(t, placement.OK, e.Write(&c, bytes.Repeat([]byte{1}, 100)), "placed before the invalidation")
		inv, err := e.Invalidate(pd1, 0, key, false)
		require.NoError(t, err)
		require.Equal(t, placement.RemoteAccessErr, e.Write(&c, bytes.Repeat([]byte{2}, 100)), "NAKed after it")
		done := make(chan struct{})
		go func() { inv.Wait(); close(done) }()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("Wait returned while a message holds the MR")
		default:
		}
		require.ErrorIs(t, e.MapMR(mr, buf), placement.ErrBusy, "not remapped while placements are in flight")
		e.End(&c)
		<-done
		require.Equal(t, bytes.Repeat([]byte{1}, 100), buf[:100])
		require.Equal(t, make([]byte, 100), buf[100:200], "nothing of the second packet")
		require.NoError(t, e.MapMR(mr, buf))
		require.NoError(t, e.DeregMR(mr))
	})
}

// TestWindows binds type 1 and type 2 windows and accesses memory through
// them: the window's range and rights, not the MR's; a type 2 window only
// through its QP; invalidation, rebinding and deallocation.
func TestWindows(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	buf := make([]byte, 3*4096)
	mr := reg(t, e, pd1, buf, stag.AccessLocalWrite|stag.AccessMWBind) // no remote rights of its own
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 0, mr.RKey(), mr.Addr(), []byte{1}))

	// Type 1: any QP of the PD.
	w1, err := e.AllocMW(pd1, placement.MWType1)
	require.NoError(t, err)
	require.Equal(t, placement.MWType1, w1.Type())
	k1 := w1.NextRKey()
	inv, err := e.BindMW(pd1, 5, w1, k1, placement.BindInfo{MR: mr, Addr: mr.Addr() + 4096, Length: 4096, Access: stag.AccessRemoteWrite})
	require.NoError(t, err)
	require.Nil(t, inv, "a first bind waits for nothing")
	require.Equal(t, k1, w1.RKey())
	require.Equal(t, placement.OK, write(e, pd1, 77, k1, mr.Addr()+4096+5, []byte("win1")))
	require.Equal(t, "win1", string(buf[4096+5:4096+9]))
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 77, k1, mr.Addr()+4095, []byte("xx")), "one byte before the window")
	var c placement.Cursor
	require.Equal(t, placement.RemoteAccessErr, e.Begin(&c, pd1, k1, mr.Addr()+4096, 8, stag.AccessRemoteRead), "a right the window lacks")
	_, st := e.Atomic(pd1, k1, mr.Addr()+4096, placement.FetchAdd, 1, 0)
	require.Equal(t, placement.RemoteAccessErr, st)
	got, _, n, a := w1.Binding()
	require.Same(t, mr, got)
	require.Equal(t, uint64(4096), n)
	require.Equal(t, stag.AccessRemoteWrite, a)

	// Rebinding a type 1 window: the old key misses at once; the new
	// binding takes effect when the old one's placements have ended.
	k1b := w1.NextRKey()
	inv, err = e.BindMW(pd1, 5, w1, k1b, placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 100,
		Access: stag.AccessRemoteWrite | stag.AccessRemoteRead})
	require.NoError(t, err)
	require.NotNil(t, inv)
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 77, k1, mr.Addr()+4096, []byte{1}))
	inv.Wait()
	require.Equal(t, placement.OK, write(e, pd1, 77, k1b, mr.Addr(), []byte("re")))
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 77, k1, mr.Addr()+4096, []byte{1}), "the first key still misses")

	// Type 2: its QP only; invalidated by LOCAL_INV or a SEND with
	// Invalidate on its QP; bound again under a new key.
	w2, err := e.AllocMW(pd1, placement.MWType2)
	require.NoError(t, err)
	k2 := incKey(w2.RKey())
	_, err = e.BindMW(pd1, 5, w2, k2, placement.BindInfo{MR: mr, Addr: mr.Addr() + 8192, Length: 4096,
		Access: stag.AccessRemoteWrite | stag.AccessRemoteAtomic})
	require.NoError(t, err)
	require.Equal(t, placement.OK, write(e, pd1, 5, k2, mr.Addr()+8192, []byte("qp5")))
	require.Equal(t, "qp5", string(buf[8192:8195]))
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 6, k2, mr.Addr()+8192, []byte("qp6")), "another QP")
	orig, st := e.AtomicQP(pd1, 5, k2, mr.Addr()+8192+8, placement.FetchAdd, 3, 0)
	require.Equal(t, placement.OK, st)
	require.Zero(t, orig)
	_, st = e.AtomicQP(pd1, 6, k2, mr.Addr()+8192+8, placement.FetchAdd, 3, 0)
	require.Equal(t, placement.RemoteAccessErr, st)
	_, err = e.BindMW(pd1, 5, w2, incKey(k2), placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 8, Access: stag.AccessRemoteRead})
	require.ErrorIs(t, err, unix.EINVAL, "a bound type 2 window is invalidated before it is bound again")
	inv, err = e.Invalidate(pd1, 5, k2, true)
	require.NoError(t, err)
	inv.Wait()
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 5, k2, mr.Addr()+8192, []byte{1}))
	k2b := incKey(k2)
	_, err = e.BindMW(pd1, 6, w2, k2b, placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 8, Access: stag.AccessRemoteWrite})
	require.NoError(t, err)
	require.Equal(t, placement.OK, write(e, pd1, 6, k2b, mr.Addr(), []byte{9}))
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 5, k2b, mr.Addr(), []byte{9}), "bound to QP 6 now")

	// A destroyed QP takes its type 2 windows with it.
	e.ReleaseQPWindows(6)
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 6, k2b, mr.Addr(), []byte{9}))
	mrb, _, _, _ := w2.Binding()
	require.Nil(t, mrb)

	// The MR cannot go while a window is bound; it can once none is.
	require.ErrorIs(t, e.DeregMR(mr), placement.ErrMWBound)
	require.NoError(t, e.DeallocMW(w1))
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 77, k1b, mr.Addr(), []byte{1}))
	require.NoError(t, e.DeallocMW(w2))
	require.NoError(t, e.DeregMR(mr))
}

// TestBindErrors has one row per refusal of a bind, each a rule of
// rxe_check_bind_mw (with the IBTA rule it cites) or of the MR.
func TestBindErrors(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	mr := reg(t, e, pd1, make([]byte, 8192), rw|stag.AccessMWBind)
	noBind := reg(t, e, pd1, make([]byte, 4096), rw)
	readOnly := reg(t, e, pd1, make([]byte, 4096), stag.AccessRemoteRead|stag.AccessMWBind)
	otherPD := reg(t, e, pd2, make([]byte, 4096), rw|stag.AccessMWBind)
	w1, err := e.AllocMW(pd1, placement.MWType1)
	require.NoError(t, err)
	w2, err := e.AllocMW(pd1, placement.MWType2)
	require.NoError(t, err)
	bound, err := e.AllocMW(pd1, placement.MWType2)
	require.NoError(t, err)
	_, err = e.BindMW(pd1, 5, bound, incKey(bound.RKey()), placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 8, Access: stag.AccessRemoteRead})
	require.NoError(t, err)
	in := placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 4096, Access: stag.AccessRemoteWrite}
	with := func(f func(b *placement.BindInfo)) placement.BindInfo { b := in; f(&b); return b }
	for _, tc := range []struct {
		name string
		pd   uint32
		w    *placement.MW
		rkey uint32
		b    placement.BindInfo
		is   error
	}{
		{"a window beyond its MR (C10-75)", pd1, w1, 0, with(func(b *placement.BindInfo) { b.Addr = mr.Addr() + 4097 }), unix.EINVAL},
		{"a window before its MR (C10-75)", pd1, w1, 0, with(func(b *placement.BindInfo) { b.Addr = mr.Addr() - 1 }), unix.EINVAL},
		{"a length that wraps", pd1, w1, 0, with(func(b *placement.BindInfo) { b.Length = ^uint64(0) }), unix.EINVAL},
		{"an MR without MW_BIND (C10-73)", pd1, w1, 0, with(func(b *placement.BindInfo) { b.MR, b.Addr = noBind, noBind.Addr() }), unix.EINVAL},
		{"a writable window on an MR without LOCAL_WRITE (C10-74)", pd1, w1, 0,
			with(func(b *placement.BindInfo) { b.MR, b.Addr = readOnly, readOnly.Addr() }), unix.EINVAL},
		{"an MR of another PD", pd1, w1, 0, with(func(b *placement.BindInfo) { b.MR, b.Addr = otherPD, otherPD.Addr() }), unix.EINVAL},
		{"a QP of another PD (C10-72)", pd2, w2, 0, in, unix.EINVAL},
		{"a zero-based type 1 window (o10-36.2.2)", pd1, w1, 0,
			with(func(b *placement.BindInfo) { b.Access |= stag.AccessZeroBased }), unix.EINVAL},
		{"a zero-based type 2 window", pd1, w2, 0, with(func(b *placement.BindInfo) { b.Access |= stag.AccessZeroBased }), unix.EOPNOTSUPP},
		{"a local right", pd1, w1, 0, with(func(b *placement.BindInfo) { b.Access |= stag.AccessLocalWrite }), unix.EINVAL},
		{"a type 2 window of length 0 (o10-37.2.40)", pd1, w2, 0, with(func(b *placement.BindInfo) { b.Length = 0 }), unix.EINVAL},
		{"a type 2 window without an MR (o10-37.2.40)", pd1, w2, 0, with(func(b *placement.BindInfo) { b.MR = nil }), unix.EINVAL},
		{"a bound type 2 window (o10-37.2.30)", pd1, bound, 0, in, unix.EINVAL},
		{"a new rkey of another index", pd1, w1, w1.RKey() + 0x100, in, unix.EINVAL},
		{"nil window", pd1, nil, 1, in, unix.EINVAL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rkey := tc.rkey
			if rkey == 0 {
				rkey = incKey(tc.w.RKey())
			}
			inv, err := e.BindMW(tc.pd, 5, tc.w, rkey, tc.b)
			require.ErrorIs(t, err, tc.is)
			require.Nil(t, inv)
		})
	}
	// Nothing bound by the refused binds: every MR can go but mr.
	for _, m := range []*placement.MR{noBind, readOnly, otherPD} {
		require.NoError(t, e.DeregMR(m))
	}
	require.NoError(t, e.DeallocMW(bound))
	require.NoError(t, e.DeregMR(mr))
}

// TestRereg re-registers an MR (ibv_rereg_mr): each change gives a new key,
// the old key misses, and refused re-registrations leave the MR valid and
// unchanged (IBV_REREG_MR_ERR_INPUT).
func TestRereg(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	buf1, buf2 := make([]byte, 4096), make([]byte, 8192)
	mr, err := e.RegMR(pd1, buf1, rw)
	require.NoError(t, err)
	k0 := mr.RKey()

	require.NoError(t, e.ReregMR(mr, placement.ReregChangeTranslation, 0, buf2, 0))
	k1 := mr.RKey()
	require.NotEqual(t, k0, k1)
	require.Equal(t, k0>>8, k1>>8, "the same index")
	require.Equal(t, uint64(len(buf2)), mr.Length())
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 0, k0, mr.Addr(), []byte{1}), "the old key misses")
	require.Equal(t, placement.OK, write(e, pd1, 0, k1, mr.Addr()+8000, []byte("new")))
	require.Equal(t, "new", string(buf2[8000:8003]))
	require.Equal(t, make([]byte, 4096), buf1, "the old memory is not written")
	require.Equal(t, int64(8192), e.PinnedBytes(), "the old memory is unpinned")

	require.NoError(t, e.ReregMR(mr, placement.ReregChangePD, pd2, nil, 0))
	k2 := mr.RKey()
	require.Equal(t, pd2, int(mr.PD()))
	require.Equal(t, placement.RemoteAccessErr, write(e, pd1, 0, k2, mr.Addr(), []byte{1}), "the old PD")
	require.Equal(t, placement.OK, write(e, pd2, 0, k2, mr.Addr(), []byte{1}))

	require.NoError(t, e.ReregMR(mr, placement.ReregChangeAccess, 0, nil, stag.AccessRemoteRead))
	k3 := mr.RKey()
	require.Equal(t, placement.RemoteAccessErr, write(e, pd2, 0, k3, mr.Addr(), []byte{1}), "no remote write any more")
	var c placement.Cursor
	require.Equal(t, placement.OK, e.Begin(&c, pd2, k3, mr.Addr(), 8, stag.AccessRemoteRead))
	e.End(&c)

	require.NoError(t, e.ReregMR(mr, placement.ReregChangeAccess, 0, nil, rw|stag.AccessMWBind))
	frwr, err := e.AllocMR(pd1, 1)
	require.NoError(t, err)
	k := mr.RKey()
	for _, tc := range []struct {
		name   string
		mr     *placement.MR
		flags  placement.ReregFlags
		buf    []byte
		access stag.Access
		is     error
	}{
		{"no flag", mr, 0, nil, 0, unix.EINVAL},
		{"an unknown flag", mr, 1 << 3, nil, 0, unix.EINVAL},
		{"translation without memory", mr, placement.ReregChangeTranslation, nil, 0, unix.EINVAL},
		{"access without CHANGE_ACCESS", mr, placement.ReregChangePD, nil, rw, unix.EINVAL},
		{"remote write without local write", mr, placement.ReregChangeAccess, nil, stag.AccessRemoteWrite, unix.EINVAL},
		{"ON_DEMAND cannot change", mr, placement.ReregChangeAccess, nil, rw | stag.AccessOnDemand, unix.EINVAL},
		{"a fast-registration MR", frwr, placement.ReregChangePD, nil, 0, unix.EINVAL},
		{"over the pin limit", mr, placement.ReregChangeTranslation, make([]byte, 128<<20), 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := e.ReregMR(tc.mr, tc.flags, pd1, tc.buf, tc.access)
			var re *placement.ReregError
			require.True(t, errors.As(err, &re), "%v", err)
			require.Equal(t, placement.ReregErrInput, re.Code)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
			require.Equal(t, k, mr.RKey(), "unchanged")
		})
	}
	require.Equal(t, placement.OK, e.Begin(&c, pd2, k, mr.Addr(), 8, stag.AccessRemoteRead), "still valid")
	e.End(&c)

	// A window bound to the MR keeps it as it is.
	w, err := e.AllocMW(pd2, placement.MWType1)
	require.NoError(t, err)
	_, err = e.BindMW(pd2, 5, w, w.NextRKey(), placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 8, Access: stag.AccessRemoteRead})
	require.NoError(t, err)
	err = e.ReregMR(mr, placement.ReregChangePD, pd1, nil, 0)
	var re *placement.ReregError
	require.ErrorAs(t, err, &re)
	require.Equal(t, placement.ReregErrInput, re.Code)
	require.ErrorIs(t, err, placement.ErrMWBound)
	require.EqualError(t, err, "rereg MR: memory windows are bound to the MR: invalid argument (the MR is unchanged)")
	require.Equal(t, k, mr.RKey())
	require.NoError(t, e.DeallocMW(w))
	require.NoError(t, e.DeregMR(frwr))
	require.NoError(t, e.DeregMR(mr))
	require.Zero(t, e.PinnedBytes())
}

// BenchmarkWriteWindow is BenchmarkWrite through a type 2 memory window:
// Begin takes the window's slow path (the window's checks, then the MR's
// slot), Write and End are the MR's.
func BenchmarkWriteWindow(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			e := placement.New(placement.Config{})
			mr := reg(b, e, pd1, make([]byte, 2<<20), rw|stag.AccessMWBind)
			w, err := e.AllocMW(pd1, placement.MWType2)
			require.NoError(b, err)
			key := incKey(w.RKey())
			_, err = e.BindMW(pd1, 5, w, key, placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 2 << 20, Access: stag.AccessRemoteWrite})
			require.NoError(b, err)
			b.Cleanup(func() { _ = e.DeallocMW(w) })
			src := make([]byte, sz.n)
			va := mr.Addr() + 100
			rd := e.NewReader()
			defer rd.Close()
			var c placement.Cursor
			c.Bind(rd)
			c.SetQP(5)
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if e.Begin(&c, pd1, key, va, uint64(sz.n), stag.AccessRemoteWrite) != placement.OK ||
					e.Write(&c, src) != placement.OK {
					b.Fatal("placement failed")
				}
				e.End(&c)
				if i++; i == batch {
					rd.Quiesce()
					i = 0
				}
			}
		})
	}
}

// TestMWBoundIsEINVAL: deregistering, re-registering or invalidating an MR
// that windows are bound to fails with EINVAL, the errno rxe returns for
// each (rxe_dereg_mr: "mr has mw's bound", IBA 10.6.7.2.6;
// rxe_invalidate_mr: "Attempt to invalidate an MR while bound to MWs"),
// as this package's errors wrap the kernel's errno for the same condition.
func TestMWBoundIsEINVAL(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	mr := reg(t, e, pd1, make([]byte, 4096), rw|stag.AccessMWBind)
	fr, err := e.AllocMR(pd1, 1)
	require.NoError(t, err)
	require.NoError(t, e.MapMR(fr, make([]byte, 4096)))
	require.NoError(t, e.FastReg(pd1, fr, incKey(fr.LKey()), rw|stag.AccessMWBind))
	w, err := e.AllocMW(pd1, placement.MWType1)
	require.NoError(t, err)
	_, err = e.BindMW(pd1, 5, w, w.NextRKey(), placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 8, Access: stag.AccessRemoteRead})
	require.NoError(t, err)
	w2, err := e.AllocMW(pd1, placement.MWType2)
	require.NoError(t, err)
	_, err = e.BindMW(pd1, 5, w2, incKey(w2.RKey()), placement.BindInfo{MR: fr, Addr: fr.Addr(), Length: 8, Access: stag.AccessRemoteRead})
	require.NoError(t, err)

	for name, err := range map[string]error{
		"dereg":      e.DeregMR(mr),
		"rereg":      e.ReregMR(mr, placement.ReregChangeAccess, 0, nil, rw),
		"invalidate": func() error { _, err := e.Invalidate(pd1, 5, fr.LKey(), false); return err }(),
	} {
		require.ErrorIs(t, err, placement.ErrMWBound, name)
		require.ErrorIs(t, err, unix.EINVAL, name)
		require.NotErrorIs(t, err, unix.EBUSY, name)
	}
	require.NoError(t, e.DeallocMW(w))
	require.NoError(t, e.DeallocMW(w2))
	require.NoError(t, e.DeregMR(mr))
	require.NoError(t, e.DeregMR(fr))
}

// TestInvalidateWindowBeingInvalidated: a type 2 window whose invalidation
// has begun (its key no longer resolves; the wait for the placements in
// flight has not ended) is invalidated already: a second LOCAL_INV or SEND
// with Invalidate of its key fails with EINVAL, as it does once the first
// has ended (an unbound window), instead of succeeding or failing by the
// timing of the first one's grace period.
func TestInvalidateWindowBeingInvalidated(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	mr := reg(t, e, pd1, make([]byte, 4096), rw|stag.AccessMWBind)
	w, err := e.AllocMW(pd1, placement.MWType2)
	require.NoError(t, err)
	for _, remote := range []bool{false, true} {
		key := incKey(w.RKey())
		_, err = e.BindMW(pd1, 5, w, key, placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 64, Access: stag.AccessRemoteRead})
		require.NoError(t, err)
		first, err := e.Invalidate(pd1, 5, key, false)
		require.NoError(t, err)
		require.NotNil(t, first)
		inv, err := e.Invalidate(pd1, 5, key, remote)
		require.ErrorIs(t, err, unix.EINVAL, "remote %v: while the first invalidation waits", remote)
		require.Nil(t, inv)
		require.NoError(t, first.Wait())
		inv, err = e.Invalidate(pd1, 5, key, remote)
		require.ErrorIs(t, err, unix.EINVAL, "remote %v: after it", remote)
		require.Nil(t, inv)
	}
	require.NoError(t, e.DeallocMW(w))
	require.NoError(t, e.DeregMR(mr))
}
