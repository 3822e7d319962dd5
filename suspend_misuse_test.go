package softrdma_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// TestFailedSuspendKeepsPolicy: a Suspend that fails (the MR is suspended
// already, under hold) must not change what happens to the packets of the
// suspension still active: a WRITE into the MR is held and replayed (the
// hold policy, transport.PolicyHold), not RNR NAKed under the failed
// call's nak policy.
func TestFailedSuspendKeepsPolicy(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{})
	l := newLink(t, p, p.B.PD)
	_, m := asMR(t, p.B, p.B.PD, pageSize)
	_, src := reg(t, p.A, pageSize, rw)
	s, err := p.B.Dev.Suspend(softrdma.ScopeMR, m, softrdma.PolicyHold)
	require.NoError(t, err)
	for _, sc := range []softrdma.Scope{softrdma.ScopeMR, softrdma.ScopePD} {
		_, err = p.B.Dev.Suspend(sc, m, softrdma.PolicyNAK)
		require.ErrorIs(t, err, unix.EINVAL, "%v: the MR is suspended already", sc)
	}
	postWrite(t, l.qa, 1, src, 0, 100, m, m.Addr())
	require.Eventually(t, func() bool { c := p.B.Dev.SuspendCounters(); return c.Held+c.NAKed+c.Dropped >= 1 },
		20*time.Second, 100*time.Microsecond, "the WRITE reaches B")
	rep, err := p.B.Dev.Resume(s)
	require.NoError(t, err)
	require.Equal(t, softrdma.WCSuccess, waitWC(t, l.cq, 1)[0].Status)
	require.EqualValues(t, 1, rep.Held, "held, as the active suspension's policy says")
	require.Zero(t, rep.NAKed, "not NAKed under the refused suspension's policy")
	require.EqualValues(t, 100, rep.BytesDelayed)
}

// TestResumeOnAnotherDevice: resuming a suspension on a device that did
// not make it is EINVAL and leaves it active; its own device then resumes
// it (before the fix the wrong device marked it done, and the MR stayed
// suspended for good: no call could resume it).
func TestResumeOnAnotherDevice(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	_, m := asMR(t, p.B, p.B.PD, pageSize)
	for _, sc := range []softrdma.Scope{softrdma.ScopeMR, softrdma.ScopeDevice} {
		s, err := p.B.Dev.Suspend(sc, m, softrdma.PolicyHold)
		require.NoError(t, err)
		_, err = p.A.Dev.Resume(s)
		require.ErrorIs(t, err, unix.EINVAL, "%v: a suspension of another device", sc)
		require.Regexp(t, `^softrdma: resume: [^:]`, err.Error())
		require.NotContains(t, err.Error(), "transport: ")
		_, err = p.B.Dev.Resume(s)
		require.NoError(t, err, "%v: still active on its own device", sc)
		_, err = p.B.Dev.Resume(s)
		require.ErrorIs(t, err, unix.EINVAL, "%v: resumed twice", sc)
	}
	_, err := p.B.Dev.Resume(&softrdma.Suspension{})
	require.ErrorIs(t, err, unix.EINVAL, "a zero Suspension")
	// The MR is writable again: a remap (which suspends it) succeeds.
	_, err = p.B.Dev.Remap(m, softrdma.ScopeMR, softrdma.PolicyHold)
	require.NoError(t, err)
}

// TestRemapRangeEdges: RemapRange names pages by an address range; an
// empty range names none and is EINVAL (it used to remap the MR holding
// addr, or, at the boundary of two adjacent MRs, report two covering it);
// a range past an MR's end, straddling two MRs, or wrapping past 2^64 is
// EINVAL; nothing is remapped by a refusal.
func TestRemapRangeEdges(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	as := mustAS(t, p.B)
	buf, err := as.Alloc(2 * pageSize)
	require.NoError(t, err)
	m1, err := p.B.Dev.RegMR(p.B.PD, buf[:pageSize], rw)
	require.NoError(t, err)
	m2, err := p.B.Dev.RegMR(p.B.PD, buf[pageSize:], rw)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, p.B.Dev.DeregMR(m1))
		require.NoError(t, p.B.Dev.DeregMR(m2))
	})
	for _, tc := range []struct {
		name       string
		addr, size uint64
	}{
		{"empty, inside an MR", m1.Addr() + 10, 0},
		{"empty, at the boundary of two MRs", m2.Addr(), 0},
		{"past the end", m2.Addr() + pageSize - 1, 2},
		{"straddling two MRs", m1.Addr() + pageSize - 1, 2},
		{"wrapping past 2^64", ^uint64(0) - 5, 100},
		{"length 2^64-1", m1.Addr(), ^uint64(0)},
	} {
		_, err := p.B.Dev.RemapRange(tc.addr, tc.size, softrdma.ScopeMR, softrdma.PolicyHold)
		require.ErrorIs(t, err, unix.EINVAL, tc.name)
	}
	rep, err := p.B.Dev.RemapRange(m2.Addr()+pageSize-1, 1, softrdma.ScopeMR, softrdma.PolicyHold)
	require.NoError(t, err, "the last byte of m2")
	require.Equal(t, 1, rep.PagesMoved)
}

// TestSuspendNilMRSameOnEveryProfile: a suspension at a scope that names
// an MR (every scope but ScopeDevice) with a nil MR is EINVAL on every
// profile; the coarse profile, which widens every scope to ScopeDevice,
// used to accept it as a device-wide pause.
func TestSuspendNilMRSameOnEveryProfile(t *testing.T) {
	for _, pr := range []softrdma.Profile{softrdma.ProfileODP, softrdma.ProfileT3, softrdma.ProfileCoarse} {
		p := softrdmatest.NewPair(t, softrdmatest.Options{Profile: pr, NoPcap: true})
		for _, sc := range []softrdma.Scope{softrdma.ScopeMR, softrdma.ScopeQPAllowed, softrdma.ScopePD} {
			s, err := p.B.Dev.Suspend(sc, nil, softrdma.PolicyHold)
			require.ErrorIs(t, err, unix.EINVAL, "%v: %v with a nil MR", pr, sc)
			require.Nil(t, s)
		}
		s, err := p.B.Dev.Suspend(softrdma.ScopeDevice, nil, softrdma.PolicyHold)
		require.NoError(t, err, "%v: a device-wide pause needs no MR", pr)
		_, err = p.B.Dev.Resume(s)
		require.NoError(t, err)
	}
}

// TestPressureBadInput: a negative pin limit and a request of no bytes
// are EINVAL, and change nothing (no upcall).
func TestPressureBadInput(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	d := p.B.Dev
	calls := 0
	d.SetPressureHandler(func(softrdma.PressureRequest) softrdma.PressureAnswer { calls++; return softrdma.PressureAnswer{} })
	_, err := d.SetPinLimit(-1)
	require.ErrorIs(t, err, unix.EINVAL)
	for _, n := range []int64{0, -4096} {
		_, err = d.RequestPinnedBytes(n)
		require.ErrorIs(t, err, unix.EINVAL)
	}
	require.Zero(t, calls)
}

// TestSuspendForeignMR: an MR of another device is EINVAL at every scope,
// for Suspend and Remap; a deregistered MR is EINVAL for Suspend.
func TestSuspendForeignMR(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	_, ma := reg(t, p.A, pageSize, rw)
	for _, sc := range []softrdma.Scope{softrdma.ScopeMR, softrdma.ScopeQPAllowed, softrdma.ScopePD, softrdma.ScopeDevice} {
		_, err := p.B.Dev.Suspend(sc, ma, softrdma.PolicyHold)
		require.ErrorIs(t, err, unix.EINVAL, "%v", sc)
		_, err = p.B.Dev.Remap(ma, sc, softrdma.PolicyHold)
		require.ErrorIs(t, err, unix.EINVAL, "%v", sc)
	}
	require.NoError(t, p.A.Dev.DeregMR(ma))
	_, err := p.A.Dev.Suspend(softrdma.ScopeMR, ma, softrdma.PolicyHold)
	require.ErrorIs(t, err, unix.EINVAL, "a deregistered MR")
}
