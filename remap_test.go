package softrdma_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/softrdmatest"
)

// link is one more RC connection between the devices of a pair: a QP on A
// (with its own CQ) and a QP on B in pdB.
type link struct {
	qa, qb *softrdma.QP
	cq     *softrdma.CQ // A's
	cqb    *softrdma.CQ // B's
}

func newLink(t *testing.T, p *softrdmatest.Pair, pdB *softrdma.PD) *link {
	t.Helper()
	return newLinkOpts(t, p, pdB, softrdma.ConnectOptions{MinRNRTimer: 1})
}

func newLinkOpts(t *testing.T, p *softrdmatest.Pair, pdB *softrdma.PD, o softrdma.ConnectOptions) *link {
	t.Helper()
	cqa, err := p.A.Dev.CreateCQ(256)
	require.NoError(t, err)
	cqb, err := p.B.Dev.CreateCQ(256)
	require.NoError(t, err)
	c := softrdma.Cap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}
	qa, err := p.A.Dev.CreateQP(p.A.PD, softrdma.QPInitAttr{SendCQ: cqa, RecvCQ: cqa, Cap: c, Type: softrdma.QPTypeRC})
	require.NoError(t, err)
	qb, err := p.B.Dev.CreateQP(pdB, softrdma.QPInitAttr{SendCQ: cqb, RecvCQ: cqb, Cap: c, Type: softrdma.QPTypeRC})
	require.NoError(t, err)
	require.NoError(t, softrdma.Connect(qa, softrdma.Endpoint{Addr: p.B.Dev.LocalAddr(), QPN: qb.QPN(), PSN: 100}, 200, o))
	require.NoError(t, softrdma.Connect(qb, softrdma.Endpoint{Addr: p.A.Dev.LocalAddr(), QPN: qa.QPN(), PSN: 200}, 100, o))
	return &link{qa: qa, qb: qb, cq: cqa, cqb: cqb}
}

// asMR allocates n bytes of B's address space and registers them pinned
// (frames of the address space, so that they can be remapped).
func asMR(t *testing.T, s *softrdmatest.Side, pd *softrdma.PD, n int) ([]byte, *softrdma.MR) {
	t.Helper()
	as := mustAS(t, s)
	buf, err := as.Alloc(n)
	require.NoError(t, err)
	mr, err := s.Dev.RegMR(pd, buf, rw)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, s.Dev.DeregMR(mr))
		require.NoError(t, as.Free(hostmem.AddrOf(buf), n))
	})
	return buf, mr
}

func postWrite(t *testing.T, qp *softrdma.QP, id uint64, src *softrdma.MR, off uint64, n int, dst *softrdma.MR, va uint64) {
	t.Helper()
	_, err := qp.PostSend(softrdma.SendWR{WRID: id, Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
		SGL:        []softrdma.SGE{{Addr: src.Addr() + off, Length: uint32(n), LKey: src.LKey()}},
		RemoteAddr: va, RKey: dst.RKey()})
	require.NoError(t, err)
}

// TestRemapLosesNoByte: a writer streams RDMA WRITEs (8 in flight, each a
// new pattern) into an MR while it is remapped 20 times, at every scope
// and under both policies, pinned and ODP. After the last completion the
// application reads, through its own mapping, exactly what was written in
// posting order: no byte lost or misplaced; every remap moved every page.
func TestRemapLosesNoByte(t *testing.T) {
	for _, odp := range []bool{false, true} {
		for _, pol := range []softrdma.PausePolicy{softrdma.PolicyHold, softrdma.PolicyNAK} {
			for _, sc := range []softrdma.Scope{softrdma.ScopeMR, softrdma.ScopeQPAllowed, softrdma.ScopePD, softrdma.ScopeDevice} {
				t.Run(fmt.Sprintf("odp=%v/%v/%v", odp, pol, sc), func(t *testing.T) {
					testRemapLosesNoByte(t, odp, pol, sc)
				})
			}
		}
	}
}

func testRemapLosesNoByte(t *testing.T, odp bool, pol softrdma.PausePolicy, sc softrdma.Scope) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Connect: softrdma.ConnectOptions{MinRNRTimer: 1}})
	const pages = 16
	const size = pages * pageSize
	var dst []byte
	var dstMR *softrdma.MR
	if odp {
		dst, dstMR = odpAlloc(t, p.B, size, rw)
	} else {
		dst, dstMR = asMR(t, p.B, p.B.PD, size)
	}
	const window, chunk = 8, 3000
	src, srcMR := reg(t, p.A, window*chunk, rw)
	shadow := make([]byte, size)

	done := make(chan error, 1)
	stop := make(chan struct{})
	go func() {
		var reports []softrdma.RemapReport
		for range 20 {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			rep, err := p.B.Dev.Remap(dstMR, sc, pol)
			if err != nil {
				done <- err
				return
			}
			if rep.PagesMoved != pages || rep.Scope != sc || rep.Widened {
				done <- fmt.Errorf("report %+v", rep)
				return
			}
			reports = append(reports, rep)
		}
		t.Logf("last remap: %+v", reports[len(reports)-1])
		done <- nil
	}()
	const writes = 400
	inflight := 0
	for i := range writes {
		if inflight == window {
			wc := waitWC(t, p.A.CQ, 1)[0]
			require.Equal(t, softrdma.WCSuccess, wc.Status)
			inflight--
		}
		slot := uint64(i%window) * chunk
		fill(uint64(i)+77, src[slot:slot+chunk])
		off := (i * 1237) % (size - chunk)
		copy(shadow[off:], src[slot:slot+chunk])
		postWrite(t, p.A.QP, uint64(i), srcMR, slot, chunk, dstMR, dstMR.Addr()+uint64(off))
		inflight++
	}
	for range inflight {
		wc := waitWC(t, p.A.CQ, 1)[0]
		require.Equal(t, softrdma.WCSuccess, wc.Status)
	}
	close(stop)
	require.NoError(t, <-done)
	require.True(t, bytes.Equal(shadow, dst), "the application's view after the remaps differs from what was written")
}

// TestSuspendScopes: which QPs each scope pauses. B has three QPs: b1 and
// b2 in PD1, b3 in PD2; the suspended MR m1 is in PD1 and only b1 writes it
// (b2 writes m2 of PD1, b3 writes m3 of PD2). While suspended (hold), a
// QP that is not paused completes its WRITE; a paused one completes only
// after Resume, and the report counts the paused QPs.
func TestSuspendScopes(t *testing.T) {
	for _, tc := range []struct {
		scope     softrdma.Scope
		advertise bool // declare m1 advertised to b1 only
		paused    [3]bool
	}{
		{softrdma.ScopeMR, false, [3]bool{true, false, false}},
		{softrdma.ScopeQPAllowed, true, [3]bool{true, false, false}},
		{softrdma.ScopeQPAllowed, false, [3]bool{true, true, false}},
		{softrdma.ScopePD, false, [3]bool{true, true, false}},
		{softrdma.ScopeDevice, false, [3]bool{true, true, true}},
	} {
		t.Run(fmt.Sprintf("%v/advertised=%v", tc.scope, tc.advertise), func(t *testing.T) {
			p := softrdmatest.NewPair(t, softrdmatest.Options{})
			pd2, err := p.B.Dev.AllocPD()
			require.NoError(t, err)
			links := []*link{newLink(t, p, p.B.PD), newLink(t, p, p.B.PD), newLink(t, p, pd2)}
			_, m1 := asMR(t, p.B, p.B.PD, pageSize)
			_, m2 := asMR(t, p.B, p.B.PD, pageSize)
			_, m3 := asMR(t, p.B, pd2, pageSize)
			targets := []*softrdma.MR{m1, m2, m3}
			_, src := reg(t, p.A, pageSize, rw)
			if tc.advertise {
				p.B.Dev.AdvertiseRKey(m1, links[0].qb)
			}
			s, err := p.B.Dev.Suspend(tc.scope, m1, softrdma.PolicyHold)
			require.NoError(t, err)
			require.False(t, s.Widened)
			for i, l := range links {
				postWrite(t, l.qa, uint64(i), src, 0, 100, targets[i], targets[i].Addr())
			}
			// The QPs that are not paused complete while the others wait.
			for i, l := range links {
				if !tc.paused[i] {
					require.Equal(t, softrdma.WCSuccess, waitWC(t, l.cq, 1)[0].Status, "QP %d", i)
				}
			}
			want := 0
			for _, x := range tc.paused {
				if x {
					want++
				}
			}
			// Every paused QP's WRITE has reached B and is held.
			require.Eventually(t, func() bool { return p.B.Dev.SuspendCounters().Held >= uint64(want) },
				20*time.Second, 100*time.Microsecond, "the paused QPs' WRITEs reach B")
			for i, l := range links {
				if tc.paused[i] {
					n, err := l.cq.Poll(make([]softrdma.WC, 1))
					require.NoError(t, err)
					require.Zero(t, n, "QP %d completed while paused", i)
				}
			}
			rep, err := p.B.Dev.Resume(s)
			require.NoError(t, err)
			for i, l := range links {
				if tc.paused[i] {
					require.Equal(t, softrdma.WCSuccess, waitWC(t, l.cq, 1)[0].Status, "QP %d after resume", i)
				}
			}
			require.Equal(t, want, rep.QPsPaused)
			require.GreaterOrEqual(t, rep.Held, uint64(want))
			require.Equal(t, uint64(100*want), rep.BytesDelayed, "each paused WRITE's 100 bytes, once")
		})
	}
}

// TestResumeReplaysHeldPackets: a WRITE held by a suspension completes
// after Resume with no other traffic to wake B's receive loop and no
// retransmission to bring it back: the requester's ACK timeout is
// 4.096 µs × 2^25 (137 s), beyond waitWC's 20 s. Resume wakes the loop when
// packets are queued, or the loop replays at the end of the batch it is in.
func TestResumeReplaysHeldPackets(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{})
	l := newLinkOpts(t, p, p.B.PD, softrdma.ConnectOptions{MinRNRTimer: 1, Timeout: 25})
	_, m := asMR(t, p.B, p.B.PD, pageSize)
	_, src := reg(t, p.A, pageSize, rw)
	for round := range 3 {
		s, err := p.B.Dev.Suspend(softrdma.ScopeMR, m, softrdma.PolicyHold)
		require.NoError(t, err)
		before := p.B.Dev.SuspendCounters().Held
		postWrite(t, l.qa, uint64(round), src, 0, 100, m, m.Addr())
		require.Eventually(t, func() bool { return p.B.Dev.SuspendCounters().Held > before },
			20*time.Second, 100*time.Microsecond, "the WRITE reaches B and is held")
		rep, err := p.B.Dev.Resume(s)
		require.NoError(t, err)
		require.Equal(t, uint64(1), rep.Held)
		require.Equal(t, softrdma.WCSuccess, waitWC(t, l.cq, 1)[0].Status, "round %d", round)
	}
	require.Zero(t, p.A.Dev.Counters().Retransmits.Load(), "nothing was sent again")
}

// TestRemapRefusesSharedPages: a remap tracks the writes of the remapped
// MR's own table only; another ODP MR over the same pages (a second MR on
// the buffer, or an implicit MR) writes them through the application's
// view unseen, and its writes during the pre-copy would be lost. Such a
// remap is refused (hostmem.ErrShared), for an ODP MR and for a pinned
// one, with the MR's bytes untouched; once the other MR is gone the remap
// runs.
func TestRemapRefusesSharedPages(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	d := p.B.Dev

	buf, mr := odpAlloc(t, p.B, 2*pageSize, rw)
	copy(buf, "kept")
	other, err := d.RegMR(p.B.PD, buf, rw|softrdma.AccessOnDemand)
	require.NoError(t, err)
	_, err = d.Remap(mr, softrdma.ScopeMR, softrdma.PolicyHold)
	require.ErrorIs(t, err, hostmem.ErrShared, "a second ODP MR over the pages")
	require.Equal(t, "kept", string(buf[:4]))
	require.NoError(t, d.DeregMR(other))
	implicit, err := d.RegMRImplicit(p.B.PD, rw|softrdma.AccessOnDemand)
	require.NoError(t, err)
	_, err = d.Remap(mr, softrdma.ScopeMR, softrdma.PolicyHold)
	require.ErrorIs(t, err, hostmem.ErrShared, "an implicit ODP MR")
	require.NoError(t, d.DeregMR(implicit))
	rep, err := d.Remap(mr, softrdma.ScopeMR, softrdma.PolicyHold)
	require.NoError(t, err)
	require.Equal(t, 2, rep.PagesMoved)
	require.Equal(t, "kept", string(buf[:4]))

	pbuf, pmr := asMR(t, p.B, p.B.PD, pageSize)
	copy(pbuf, "pinned")
	odp, err := d.RegMR(p.B.PD, pbuf, rw|softrdma.AccessOnDemand)
	require.NoError(t, err)
	_, err = d.Remap(pmr, softrdma.ScopeMR, softrdma.PolicyHold)
	require.ErrorIs(t, err, hostmem.ErrShared, "an ODP MR over a pinned MR's pages")
	require.Equal(t, "pinned", string(pbuf[:6]))
	require.NoError(t, d.DeregMR(odp))
	_, err = d.Remap(pmr, softrdma.ScopeMR, softrdma.PolicyHold)
	require.NoError(t, err)
	require.Equal(t, "pinned", string(pbuf[:6]))
}

// TestSuspendWidened: a device that cannot pause one MR widens the scope
// and says so.
func TestSuspendWidened(t *testing.T) {
	for _, tc := range []struct {
		profile softrdma.Profile
		finest  softrdma.Scope
	}{{softrdma.ProfileODP, softrdma.ScopeMR}, {softrdma.ProfileT3, softrdma.ScopePD}, {softrdma.ProfileCoarse, softrdma.ScopeDevice}} {
		t.Run(string(tc.profile), func(t *testing.T) {
			p := softrdmatest.NewPair(t, softrdmatest.Options{Profile: tc.profile, NoPcap: true})
			require.Equal(t, tc.finest, p.B.Dev.Attr().FinestScope)
			_, m := asMR(t, p.B, p.B.PD, pageSize)
			s, err := p.B.Dev.Suspend(softrdma.ScopeMR, m, softrdma.PolicyHold)
			require.NoError(t, err)
			require.Equal(t, tc.finest, s.Scope)
			require.Equal(t, softrdma.ScopeMR, s.Requested)
			require.Equal(t, tc.finest != softrdma.ScopeMR, s.Widened)
			_, err = p.B.Dev.Resume(s)
			require.NoError(t, err)
			rep, err := p.B.Dev.Remap(m, softrdma.ScopeMR, softrdma.PolicyHold)
			require.NoError(t, err)
			require.Equal(t, tc.finest, rep.Scope)
			require.Equal(t, tc.finest != softrdma.ScopeMR, rep.Widened)
		})
	}
}

// TestRemapBadInput: the errors of item 7.
func TestRemapBadInput(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	_, goMR := reg(t, p.B, pageSize, rw)
	_, err := p.B.Dev.Remap(goMR, softrdma.ScopeMR, softrdma.PolicyHold)
	require.ErrorIs(t, err, unix.EOPNOTSUPP, "memory outside the address space cannot be remapped")
	_, err = p.B.Dev.RemapRange(0x1000, 4096, softrdma.ScopeMR, softrdma.PolicyHold)
	require.ErrorIs(t, err, unix.EINVAL, "a range no MR covers")
	_, m := asMR(t, p.B, p.B.PD, pageSize)
	_, err = p.B.Dev.Suspend(softrdma.Scope(9), m, softrdma.PolicyHold)
	require.ErrorIs(t, err, unix.EINVAL, "a scope that does not exist")
	_, err = p.B.Dev.Suspend(softrdma.ScopePD, nil, softrdma.PolicyHold)
	require.ErrorIs(t, err, unix.EINVAL)
	s, err := p.B.Dev.Suspend(softrdma.ScopeMR, m, softrdma.PolicyHold)
	require.NoError(t, err)
	_, err = p.B.Dev.Suspend(softrdma.ScopeMR, m, softrdma.PolicyHold)
	require.ErrorIs(t, err, unix.EINVAL, "an MR suspended twice")
	_, err = p.B.Dev.Resume(s)
	require.NoError(t, err)
	_, err = p.B.Dev.Resume(s)
	require.Error(t, err, "resumed twice")
	rep, err := p.B.Dev.RemapRange(m.Addr(), 16, softrdma.ScopeMR, softrdma.PolicyHold)
	require.NoError(t, err)
	require.Equal(t, 1, rep.PagesMoved)
}

// TestSuspendQPAllowedWindow: the qp-allowed scope includes the QP a type 2
// window on the MR is bound to (and not the other QPs of the PD): b1
// writes m1 itself (paused by the MR's own gate), b2 holds the window on m1
// (paused by the scope) but writes m2, b3 in the same PD and b4 in another
// PD go on.
func TestSuspendQPAllowedWindow(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{})
	pd2, err := p.B.Dev.AllocPD()
	require.NoError(t, err)
	links := []*link{newLink(t, p, p.B.PD), newLink(t, p, p.B.PD), newLink(t, p, p.B.PD), newLink(t, p, pd2)}
	as := mustAS(t, p.B)
	mem, err := as.Alloc(2 * pageSize)
	require.NoError(t, err)
	m1, err := p.B.Dev.RegMR(p.B.PD, mem, rw|softrdma.AccessMWBind)
	require.NoError(t, err)
	w, err := p.B.Dev.AllocMW(p.B.PD, softrdma.MWType2)
	require.NoError(t, err)
	_, err = links[1].qb.PostSend(softrdma.SendWR{WRID: 9, Opcode: softrdma.WRBindMW, Flags: softrdma.SendSignaled,
		BindMW: softrdma.MWBind{MW: w, RKey: softrdma.IncRKey(w.RKey()), Info: softrdma.MWBindInfo{MR: m1, Addr: m1.Addr() + pageSize,
			Length: pageSize, Access: softrdma.AccessRemoteWrite}}})
	require.NoError(t, err)
	require.Equal(t, softrdma.WCSuccess, waitWC(t, links[1].cqb, 1)[0].Status)
	_, m2 := asMR(t, p.B, p.B.PD, pageSize)
	_, m3 := asMR(t, p.B, p.B.PD, pageSize)
	_, m4 := asMR(t, p.B, pd2, pageSize)
	targets := []*softrdma.MR{m1, m2, m3, m4}
	_, src := reg(t, p.A, pageSize, rw)
	s, err := p.B.Dev.Suspend(softrdma.ScopeQPAllowed, m1, softrdma.PolicyHold)
	require.NoError(t, err)
	paused := []bool{true, true, false, false}
	for i, l := range links {
		postWrite(t, l.qa, uint64(i), src, 0, 100, targets[i], targets[i].Addr())
	}
	for i, l := range links {
		if !paused[i] {
			require.Equal(t, softrdma.WCSuccess, waitWC(t, l.cq, 1)[0].Status, "QP %d", i)
		}
	}
	require.Eventually(t, func() bool { return p.B.Dev.SuspendCounters().Held >= 2 },
		20*time.Second, 100*time.Microsecond, "the paused QPs' WRITEs reach B")
	rep, err := p.B.Dev.Resume(s)
	require.NoError(t, err)
	for i, l := range links {
		if paused[i] {
			require.Equal(t, softrdma.WCSuccess, waitWC(t, l.cq, 1)[0].Status, "QP %d after resume", i)
		}
	}
	require.Equal(t, 2, rep.QPsPaused)
	require.NoError(t, p.B.Dev.DeallocMW(w))
	require.NoError(t, p.B.Dev.DeregMR(m1))
}
