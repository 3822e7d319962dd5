package placement_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
)

// TestSuspensionSurvivesFastReg: a suspended FRWR MR invalidated by
// LOCAL_INV and registered again by REG_MR stays suspended ("no byte is
// written into mr until ResumeMR"), and ResumeMR ends the suspension.
func TestSuspensionSurvivesFastReg(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	mr, err := e.AllocMR(pd1, 1)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.DeregMR(mr)) }()
	buf := make([]byte, 4096)
	require.NoError(t, e.MapMR(mr, buf))
	k1 := incKey(mr.LKey())
	require.NoError(t, e.FastReg(pd1, mr, k1, rw))
	require.NoError(t, e.SuspendMR(mr))
	require.Equal(t, placement.Suspended, write(e, pd1, 0, k1, mr.Addr(), []byte{1}))

	inv, err := e.Invalidate(pd1, 0, k1, false)
	require.NoError(t, err)
	inv.Wait()
	require.NoError(t, e.MapMR(mr, buf))
	k2 := incKey(k1)
	require.NoError(t, e.FastReg(pd1, mr, k2, rw))
	require.Equal(t, placement.Suspended, write(e, pd1, 0, k2, mr.Addr(), []byte{2}),
		"placed into a suspended MR")
	require.Zero(t, buf[0])
	require.NoError(t, e.ResumeMR(mr))
	require.Equal(t, placement.OK, write(e, pd1, 0, k2, mr.Addr(), []byte{3}))
	require.Equal(t, byte(3), buf[0])
}

// TestRemoteInvalidateOfBusyWindowChecksQP: a SEND with Invalidate naming
// a type 2 window bound to another QP is refused (class J) even while a
// LOCAL_INV of the window waits for the placements in flight.
func TestRemoteInvalidateOfBusyWindowChecksQP(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	mr := reg(t, e, pd1, make([]byte, 4096), rw|stag.AccessMWBind)
	w, err := e.AllocMW(pd1, placement.MWType2)
	require.NoError(t, err)
	k := incKey(w.RKey())
	_, err = e.BindMW(pd1, 5, w, k, placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: 4096, Access: stag.AccessRemoteWrite})
	require.NoError(t, err)

	var c placement.Cursor // unbound: holds the MR until End
	c.SetQP(5)
	require.Equal(t, placement.OK, e.Begin(&c, pd1, k, mr.Addr(), 8, stag.AccessRemoteWrite))
	inv, err := e.Invalidate(pd1, 5, k, false) // LOCAL_INV on QP 5: waits for c
	require.NoError(t, err)

	other, err := e.Invalidate(pd1, 6, k, true) // SEND with Invalidate received on QP 6
	require.ErrorIs(t, err, unix.EINVAL, "the window is bound to QP 5")
	require.Nil(t, other)
	e.End(&c)
	inv.Wait()
	require.NoError(t, e.DeallocMW(w))
}

// newODPWindow registers a 2-page ODP MR (LOCAL_WRITE, MW_BIND) on a new
// address space and allocates a window of type typ in its PD, all torn
// down at the end of the test.
func newODPWindow(t *testing.T, typ placement.MWType) (*placement.Engine, *placement.MR, *placement.MW, []byte) {
	t.Helper()
	as, err := hostmem.NewAddressSpace(hostmem.Config{Size: 16 << 20})
	require.NoError(t, err)
	e := placement.New(placement.Config{AddressSpace: as})
	buf, err := as.Alloc(2 * 4096)
	require.NoError(t, err)
	mr, err := e.RegMR(pd1, buf, stag.AccessLocalWrite|stag.AccessMWBind|stag.AccessOnDemand)
	require.NoError(t, err)
	w, err := e.AllocMW(pd1, typ)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, e.DeallocMW(w))
		require.NoError(t, e.DeregMR(mr))
		require.NoError(t, as.Free(hostmem.AddrOf(buf), len(buf)))
		require.NoError(t, as.Close())
	})
	return e, mr, w, buf
}

// TestWindowAtomicOnODPFaults: an atomic through a type 1 window onto a
// page of an ODP MR that is not present faults the page in (FaultRemote,
// ResolvableRemote: the transport's sync and rnr policies) and executes,
// as it does through the MR's own rkey.
func TestWindowAtomicOnODPFaults(t *testing.T) {
	e, mr, w, buf := newODPWindow(t, placement.MWType1)
	k := w.NextRKey()
	_, err := e.BindMW(pd1, 5, w, k, placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: uint64(len(buf)), Access: stag.AccessRemoteAtomic})
	require.NoError(t, err)
	va := mr.Addr() + 4096 + 64
	_, st := e.AtomicQP(pd1, 7, k, va, placement.FetchAdd, 5, 0)
	require.Equal(t, placement.WouldFault, st, "the page is not present yet")
	require.True(t, e.ResolvableRemote(pd1, k, va, 8, true), "rnr policy: the window's page can be faulted in")
	require.Equal(t, placement.OK, e.FaultRemote(pd1, k, va, 8, true), "sync policy: fault the window's page in")
	orig, st := e.AtomicQP(pd1, 7, k, va, placement.FetchAdd, 5, 0)
	require.Equal(t, placement.OK, st)
	require.Zero(t, orig)
	require.Equal(t, byte(5), buf[4096+64])
}

// TestType2WindowAtomicOnODPFaults: the same through a type 2 window, for
// the QP it is bound to (FaultRemoteQP, ResolvableRemoteQP: the responder
// knows the QP), and not for another QP.
func TestType2WindowAtomicOnODPFaults(t *testing.T) {
	e, mr, w, buf := newODPWindow(t, placement.MWType2)
	k := incKey(w.RKey())
	_, err := e.BindMW(pd1, 5, w, k, placement.BindInfo{MR: mr, Addr: mr.Addr(), Length: uint64(len(buf)), Access: stag.AccessRemoteAtomic})
	require.NoError(t, err)
	va := mr.Addr() + 4096 + 64
	_, st := e.AtomicQP(pd1, 5, k, va, placement.FetchAdd, 5, 0)
	require.Equal(t, placement.WouldFault, st, "the page is not present yet")
	require.False(t, e.ResolvableRemoteQP(pd1, 6, k, va, 8, true), "another QP")
	require.Equal(t, placement.RemoteAccessErr, e.FaultRemoteQP(pd1, 6, k, va, 8, true), "another QP")
	require.True(t, e.ResolvableRemoteQP(pd1, 5, k, va, 8, true), "rnr policy")
	require.Equal(t, placement.OK, e.FaultRemoteQP(pd1, 5, k, va, 8, true), "sync policy")
	orig, st := e.AtomicQP(pd1, 5, k, va, placement.FetchAdd, 5, 0)
	require.Equal(t, placement.OK, st)
	require.Zero(t, orig)
	require.Equal(t, byte(5), buf[4096+64])
}

// TestSuspendDuringRereg suspends and resumes an MR while it is being
// re-registered: every suspension that succeeds can be resumed, writes
// through the last key work at the end, and (under -race) SuspendMR and
// ResumeMR read the MR's key and entry in order with ReregMR's change of
// them (they read them unsynchronized: a data race).
func TestSuspendDuringRereg(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 64 << 20})
	buf := make([]byte, 4096)
	mr, err := e.RegMR(pd1, buf, rw)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			_ = e.ReregMR(mr, placement.ReregChangeAccess, 0, nil, rw)
		}
	}()
	for range 200 {
		if e.SuspendMR(mr) == nil {
			require.NoError(t, e.ResumeMR(mr))
		}
	}
	<-done
	require.Equal(t, placement.OK, write(e, pd1, 0, mr.RKey(), mr.Addr(), []byte{1}))
	require.NoError(t, e.DeregMR(mr))
}

// TestFaultCursorDuringRereg: the receive loop faults the pages of a
// WRITE's next packet with its reader quiesced (FaultCursor after
// Quiesce, as the transport's sync policy does) while the ODP MR is
// re-registered with other rights. The re-registration must not swap the
// MR's translation under the fault (under -race: unsynchronized accesses
// to the MR's table), and the packet placed after the fault must not land
// through the old registration.
func TestFaultCursorDuringRereg(t *testing.T) {
	_, e, buf, mr := newODPEngine(t, 4)
	rd := e.NewReader()
	defer rd.Close()
	var c placement.Cursor
	c.Bind(rd)
	k := mr.RKey()
	require.Equal(t, placement.OK, e.Begin(&c, pd1, k, mr.Addr(), 2*4096, stag.AccessRemoteWrite))
	require.Equal(t, placement.WouldFault, e.Write(&c, make([]byte, 4096)), "not present yet")
	rd.Quiesce() // the transport quiesces before it faults
	done := make(chan error)
	go func() {
		done <- e.ReregMR(mr, placement.ReregChangeAccess, 0, nil, stag.AccessRemoteRead|stag.AccessOnDemand)
	}()
	st := e.FaultCursor(&c, 4096)
	require.NoError(t, <-done)
	if st == placement.OK {
		st = e.Write(&c, bytes.Repeat([]byte{1}, 4096))
	}
	e.End(&c)
	rd.Quiesce()
	require.Equal(t, placement.RemoteAccessErr, st, "the key was re-registered: the message is NAKed")
	require.Equal(t, make([]byte, 4096), buf[:4096])
}
