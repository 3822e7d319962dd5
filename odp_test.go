package softrdma_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/softrdmatest"
)

const pageSize = hostmem.PageSize

// odpAlloc allocates n bytes of the side's host address space and
// registers them as an ODP MR; both are undone when the test ends.
func odpAlloc(t *testing.T, s *softrdmatest.Side, n int, access softrdma.Access) ([]byte, *softrdma.MR) {
	t.Helper()
	as, err := s.Dev.AddressSpace()
	require.NoError(t, err)
	buf, err := as.Alloc(n)
	require.NoError(t, err)
	mr, err := s.Dev.RegMR(s.PD, buf, access|softrdma.AccessOnDemand)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, s.Dev.DeregMR(mr))
		require.NoError(t, as.Free(hostmem.AddrOf(buf), n))
	})
	return buf, mr
}

// odpPolicies runs fn once per fault policy, with a short RNR timer so
// that the rnr policy's back-off is quick (encoded 1: 0.01 ms).
func odpPolicies(t *testing.T, fn func(t *testing.T, o softrdmatest.Options)) {
	for _, pol := range []softrdma.FaultPolicy{softrdma.FaultSync, softrdma.FaultRNR} {
		t.Run(pol.String(), func(t *testing.T) {
			fn(t, softrdmatest.Options{FaultPolicy: pol, Connect: softrdma.ConnectOptions{MinRNRTimer: 1}})
		})
	}
}

func counter(d *softrdma.Device, name string) uint64 {
	for _, c := range d.Snapshot() {
		if c.Name == name {
			return c.Value
		}
	}
	panic("no counter " + name)
}

func write(t *testing.T, s *softrdmatest.Side, src *softrdma.MR, off uint64, n int, dst *softrdma.MR, va uint64) {
	t.Helper()
	_, err := s.QP.PostSend(softrdma.SendWR{WRID: 1, Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
		SGL:        []softrdma.SGE{{Addr: src.Addr() + off, Length: uint32(n), LKey: src.LKey()}},
		RemoteAddr: va, RKey: dst.RKey()})
	require.NoError(t, err)
	wc := waitWC(t, s.CQ, 1)[0]
	require.Equal(t, softrdma.WCSuccess, wc.Status, "write %d bytes at %#x", n, va)
}

func read(t *testing.T, s *softrdmatest.Side, dst *softrdma.MR, off uint64, n int, src *softrdma.MR, va uint64) {
	t.Helper()
	_, err := s.QP.PostSend(softrdma.SendWR{WRID: 2, Opcode: softrdma.WRRDMARead, Flags: softrdma.SendSignaled,
		SGL:        []softrdma.SGE{{Addr: dst.Addr() + off, Length: uint32(n), LKey: dst.LKey()}},
		RemoteAddr: va, RKey: src.RKey()})
	require.NoError(t, err)
	wc := waitWC(t, s.CQ, 1)[0]
	require.Equal(t, softrdma.WCSuccess, wc.Status, "read %d bytes at %#x", n, va)
}

// TestODPFirstWriteFaultsEachPageOnce: a WRITE into an ODP MR the host has
// never touched faults each of its pages in exactly once and lands
// byte-exact; a second WRITE of the same range faults nothing. Under sync
// the faults make no system call (the copies' first touch populates the
// pages); under rnr the background fault populates each page once.
func TestODPFirstWriteFaultsEachPageOnce(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		p := softrdmatest.NewPair(t, o)
		const pages = 64
		src, srcMR := reg(t, p.A, pages*pageSize, rw)
		dst, dstMR := odpAlloc(t, p.B, pages*pageSize, rw)
		require.True(t, dstMR.ODP())
		require.Equal(t, 0, dstMR.ODPTable().Present(), "an ODP MR starts with no page present")
		asBefore := mustAS(t, p.B).Stats()

		fill(1, src)
		write(t, p.A, srcMR, 0, len(src), dstMR, dstMR.Addr())
		require.True(t, bytes.Equal(src, dst), "first write not byte-exact")
		st := dstMR.ODPStats()
		require.EqualValues(t, pages, st.PageFaultsHandled, "pages made present")
		require.EqualValues(t, pages, st.PageFaults, "each page faults exactly once")
		asAfter := mustAS(t, p.B).Stats()
		if o.FaultPolicy == softrdma.FaultRNR {
			require.EqualValues(t, pages, asAfter.Populated-asBefore.Populated,
				"the background fault populated each never-touched page once")
		} else {
			require.Zero(t, asAfter.Syscalls-asBefore.Syscalls, "inline faults make no system call")
			require.Zero(t, asAfter.Populated-asBefore.Populated, "the copies' first touch populated the pages")
		}
		require.Positive(t, st.Faults)
		require.Greater(t, st.FaultMaxus, 0.0)

		fill(2, src)
		write(t, p.A, srcMR, 0, len(src), dstMR, dstMR.Addr())
		require.True(t, bytes.Equal(src, dst))
		require.EqualValues(t, pages, dstMR.ODPStats().PageFaults, "present pages do not fault again")

		if o.FaultPolicy == softrdma.FaultRNR {
			require.Positive(t, counter(p.B.Dev, "odp_rnr_naks"), "the rnr policy answers faults with RNR NAKs")
			require.Positive(t, counter(p.A.Dev, "rcvd_rnr_err"))
			require.Zero(t, counter(p.B.Dev, "odp_sync_faults"))
		} else {
			require.Zero(t, counter(p.B.Dev, "odp_rnr_naks"))
			require.Positive(t, counter(p.B.Dev, "odp_sync_faults"))
		}
	})
}

func mustAS(t *testing.T, s *softrdmatest.Side) *hostmem.AddressSpace {
	t.Helper()
	as, err := s.Dev.AddressSpace()
	require.NoError(t, err)
	return as
}

// TestODPReadAtomicSendOnODP: every RC operation works on ODP memory on
// both sides (the requester's own ODP MRs fault inline).
func TestODPReadAtomicSendOnODP(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		p := softrdmatest.NewPair(t, o)
		const n = 3*pageSize + 100
		local, localMR := odpAlloc(t, p.A, 4*pageSize, rw)
		remote, remoteMR := odpAlloc(t, p.B, 4*pageSize, rw)
		fill(3, local[:n])
		write(t, p.A, localMR, 0, n, remoteMR, remoteMR.Addr()+50)
		require.True(t, bytes.Equal(local[:n], remote[50:50+n]))
		clear(local)
		// READ into never-touched-again pages after an invalidation of
		// the local MR.
		m, err := mustAS(t, p.A).Migrate(localMR.Addr(), 4)
		require.NoError(t, err)
		m.Release()
		read(t, p.A, localMR, 7, n, remoteMR, remoteMR.Addr()+50)
		require.True(t, bytes.Equal(remote[50:50+n], local[7:7+n]))

		// Atomics on an ODP word, and the result into an ODP MR.
		binary.NativeEndian.PutUint64(remote[3*pageSize+8:], 40)
		_, err = p.A.QP.PostSend(softrdma.SendWR{Opcode: softrdma.WRAtomicFetchAndAdd, Flags: softrdma.SendSignaled, CompareAdd: 2,
			SGL:        []softrdma.SGE{{Addr: localMR.Addr(), Length: 8, LKey: localMR.LKey()}},
			RemoteAddr: remoteMR.Addr() + 3*pageSize + 8, RKey: remoteMR.RKey()})
		require.NoError(t, err)
		require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
		require.EqualValues(t, 40, binary.NativeEndian.Uint64(local))
		require.EqualValues(t, 42, binary.NativeEndian.Uint64(remote[3*pageSize+8:]))

		// SEND from ODP into an ODP receive buffer.
		fill(4, local[:n])
		_, err = p.B.QP.PostRecv(softrdma.RecvWR{WRID: 9, SGL: []softrdma.SGE{{Addr: remoteMR.Addr(), Length: 4 * pageSize, LKey: remoteMR.LKey()}}})
		require.NoError(t, err)
		_, err = p.A.QP.PostSend(softrdma.SendWR{Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
			SGL: []softrdma.SGE{{Addr: localMR.Addr(), Length: n, LKey: localMR.LKey()}}})
		require.NoError(t, err)
		require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
		rwc := waitWC(t, p.B.CQ, 1)[0]
		require.Equal(t, softrdma.WCSuccess, rwc.Status)
		require.EqualValues(t, n, rwc.ByteLen)
		require.True(t, bytes.Equal(local[:n], remote[:n]))
	})
}

// TestODPInvalidationDuringWrites migrates the target pages over and over
// while a stream of WRITEs lands in them: after each migration no byte is
// placed in the old frames, and the last write is what the application
// reads (no byte written after the fault that followed an invalidation is
// lost).
func TestODPInvalidationDuringWrites(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		p := softrdmatest.NewPair(t, o)
		const pages = 8
		src, srcMR := reg(t, p.A, pages*pageSize, rw)
		dst, dstMR := odpAlloc(t, p.B, pages*pageSize, rw)
		as := mustAS(t, p.B)
		addr := hostmem.AddrOf(dst)

		var writes atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var migErr error
		var migrations atomic.Int64
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				m, err := as.Migrate(addr, pages)
				if err != nil {
					migErr = err
					return
				}
				migrations.Add(1)
				// The old frames must not change any more: snapshot them,
				// let a few writes land, compare.
				old := make([][]byte, len(m.Old))
				for i, f := range m.Old {
					old[i] = bytes.Clone(as.FrameBytes(f))
				}
				w0 := writes.Load()
				for writes.Load() < w0+3 {
					select {
					case <-stop:
						m.Release()
						return
					default:
						runtime.Gosched()
					}
				}
				for i, f := range m.Old {
					if !bytes.Equal(old[i], as.FrameBytes(f)) {
						migErr = errors.New("a byte landed in a frame after its invalidation returned")
					}
				}
				m.Release()
				if migErr != nil {
					return
				}
			}
		}()
		// At least 200 writes, and on until 10 migrations have raced them
		// (a loaded machine may starve the migrator for a while).
		const rounds, minMigrations = 200, 10
		i := 0
		for ; (i < rounds || migrations.Load() < minMigrations) && i < 100*rounds; i++ {
			fill(uint64(100+i), src)
			write(t, p.A, srcMR, 0, len(src), dstMR, dstMR.Addr())
			writes.Add(1)
		}
		close(stop)
		wg.Wait()
		require.NoError(t, migErr)
		require.GreaterOrEqual(t, migrations.Load(), int64(minMigrations), "the migrations raced the writes")
		require.True(t, bytes.Equal(src, dst), "the last write is what the application sees")
		st := dstMR.ODPStats()
		require.Positive(t, st.PageInvalidations)
		require.Equal(t, st.PageInvalidations, st.PageInvalidationsHandled)
		require.Greater(t, st.PageFaultsHandled, int64(pages), "pages faulted in again after invalidations")
		t.Logf("%d writes, %d migrations, %+v", i, migrations.Load(), st.ODPStats)
	})
}

// TestODPFreeThenAllocSeesNewPages: after Free and AllocAt of the same
// address, the ODP MR reaches the new (zeroed) pages, not the old ones.
func TestODPFreeThenAllocSeesNewPages(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		p := softrdmatest.NewPair(t, o)
		const n = 4 * pageSize
		as := mustAS(t, p.B)
		buf, err := as.Alloc(n)
		require.NoError(t, err)
		addr := hostmem.AddrOf(buf)
		// The MR covers the range; the memory under it changes.
		mr, err := p.B.Dev.RegMRAddr(p.B.PD, addr, n, rw|softrdma.AccessOnDemand)
		require.NoError(t, err)
		src, srcMR := reg(t, p.A, n, rw)
		back, backMR := reg(t, p.A, n, rw)

		fill(5, src)
		write(t, p.A, srcMR, 0, n, mr, addr)
		require.True(t, bytes.Equal(src, buf))
		oldFrame, ok := as.FrameOf(addr)
		require.True(t, ok)

		require.NoError(t, as.Free(addr, n))
		buf2, err := as.AllocAt(addr, n)
		require.NoError(t, err)
		// A READ now returns the new pages: zeros.
		fill(6, back)
		read(t, p.A, backMR, 0, n, mr, addr)
		require.True(t, bytes.Equal(make([]byte, n), back), "the MR still reaches the freed pages")
		fill(7, src)
		write(t, p.A, srcMR, 0, n, mr, addr)
		require.True(t, bytes.Equal(src, buf2), "the write did not reach the new pages")
		newFrame, _ := as.FrameOf(addr)
		t.Logf("frame %d -> %d", oldFrame, newFrame)
		require.Positive(t, mr.ODPStats().PageInvalidations)

		// Freed and not reallocated: a peer's access is a remote access
		// error, and nothing is written.
		require.NoError(t, as.Free(addr, n))
		_, err = p.A.QP.PostSend(softrdma.SendWR{Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
			SGL:        []softrdma.SGE{{Addr: srcMR.Addr(), Length: 64, LKey: srcMR.LKey()}},
			RemoteAddr: addr, RKey: mr.RKey()})
		require.NoError(t, err)
		require.Equal(t, softrdma.WCRemAccessErr, waitWC(t, p.A.CQ, 1)[0].Status)
		require.Positive(t, counter(p.B.Dev, "odp_fault_errors"))
		require.NoError(t, p.B.Dev.DeregMR(mr))
	})
}

// TestODPImplicitOverBudget: an implicit ODP MR with random WRITEs and
// READs over 4x the device's page budget completes byte-exact, with
// evictions, and never holds more pages present than the budget.
func TestODPImplicitOverBudget(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		const budget = 512 << 10 // 128 pages
		o.ODPBudget = budget
		p := softrdmatest.NewPair(t, o)
		const n = 4 * budget
		as := mustAS(t, p.B)
		mem, err := as.Alloc(n)
		require.NoError(t, err)
		imr, err := p.B.Dev.RegMRImplicit(p.B.PD, rw|softrdma.AccessOnDemand)
		require.NoError(t, err)
		require.True(t, imr.Implicit())
		require.EqualValues(t, 0, imr.Addr())
		require.Equal(t, ^uint64(0), imr.Length())
		require.Equal(t, 0, imr.ODPTable().Children(), "children are built lazily")

		const maxIO = 16 << 10
		src, srcMR := reg(t, p.A, maxIO, rw)
		back, backMR := reg(t, p.A, maxIO, rw)
		shadow := make([]byte, n)
		base := hostmem.AddrOf(mem)
		rng := rand.New(rand.NewPCG(8, 9))
		for i := range 300 {
			off := rng.IntN(n - maxIO)
			sz := 1 + rng.IntN(maxIO)
			if rng.IntN(3) > 0 {
				fill(uint64(1000+i), src[:sz])
				write(t, p.A, srcMR, 0, sz, imr, base+uint64(off))
				copy(shadow[off:], src[:sz])
			} else {
				read(t, p.A, backMR, 0, sz, imr, base+uint64(off))
				require.True(t, bytes.Equal(shadow[off:off+sz], back[:sz]), "read %d at %d", sz, off)
			}
		}
		require.True(t, bytes.Equal(shadow, mem), "final contents")
		st := imr.ODPStats()
		b := p.B.Dev.ODPBudget()
		require.Positive(t, st.Evictions, "evictions")
		require.Positive(t, b.Evictions())
		require.LessOrEqual(t, b.Peak(), int64(budget/pageSize), "pages present never exceed the budget")
		require.Equal(t, 1, imr.ODPTable().Children(), "one 1 GiB child covers the allocation")
		t.Logf("%+v peak %d pages", st.ODPStats, b.Peak())
		require.NoError(t, p.B.Dev.DeregMR(imr))
		require.Zero(t, b.Present(), "deregistration returns every page to the budget")
		require.NoError(t, as.Free(base, n))
	})
}

// TestODPRNRRetryZero: under the rnr policy with rnr_retry 0, the first
// fault completes the WRITE with RNR_RETRY_EXC_ERR (why ODP users set
// rnr_retry).
func TestODPRNRRetryZero(t *testing.T) {
	o := softrdmatest.Options{FaultPolicy: softrdma.FaultRNR}
	o.Connect = softrdma.ConnectOptions{MTU: softrdma.MTU4096, Access: rw, Timeout: 14, RetryCnt: 7, RNRRetry: 0,
		MinRNRTimer: 1, MaxRdAtomic: 16, Exact: true}
	p := softrdmatest.NewPair(t, o)
	_, srcMR := reg(t, p.A, pageSize, rw)
	_, dstMR := odpAlloc(t, p.B, pageSize, rw)
	_, err := p.A.QP.PostSend(softrdma.SendWR{Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
		SGL:        []softrdma.SGE{{Addr: srcMR.Addr(), Length: 100, LKey: srcMR.LKey()}},
		RemoteAddr: dstMR.Addr(), RKey: dstMR.RKey()})
	require.NoError(t, err)
	require.Equal(t, softrdma.WCRNRRetryExcErr, waitWC(t, p.A.CQ, 1)[0].Status)
	require.EqualValues(t, 1, counter(p.A.Dev, "retry_rnr_exceeded_err"))
}

// TestODPBadInput: the errors ibv_reg_mr(3) and ibv_advise_mr(3) name.
func TestODPBadInput(t *testing.T) {
	t.Run("profile without ODP", func(t *testing.T) {
		p := softrdmatest.NewPair(t, softrdmatest.Options{Profile: softrdma.ProfileT3, NoPcap: true})
		require.Zero(t, p.A.Dev.Attr().ODPCaps)
		_, err := p.A.Dev.RegMRImplicit(p.A.PD, rw|softrdma.AccessOnDemand)
		require.ErrorIs(t, err, unix.EOPNOTSUPP)
		_, err = p.A.Dev.RegMR(p.A.PD, make([]byte, 4096), rw|softrdma.AccessOnDemand)
		require.ErrorIs(t, err, unix.EOPNOTSUPP)
	})
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	caps := p.A.Dev.Attr().ODPCaps
	require.Equal(t, softrdma.ODPSupport|softrdma.ODPSupportImplicit, caps.GeneralCaps)
	require.Equal(t, softrdma.ODPSupportSend|softrdma.ODPSupportRecv|softrdma.ODPSupportWrite|
		softrdma.ODPSupportRead|softrdma.ODPSupportAtomic, caps.RCODPCaps)

	t.Run("ODP on memory outside the address space", func(t *testing.T) {
		_, err := p.A.Dev.RegMR(p.A.PD, make([]byte, 4096), rw|softrdma.AccessOnDemand)
		require.ErrorIs(t, err, unix.EINVAL)
	})
	_, pinned := reg(t, p.A, 4096, rw)
	_, ro := odpAlloc(t, p.A, 4*pageSize, softrdma.AccessRemoteRead)
	_, odp := odpAlloc(t, p.A, 4*pageSize, rw)
	for _, tc := range []struct {
		name   string
		advice softrdma.Advice
		flags  uint32
		sge    softrdma.SGE
		errno  unix.Errno
	}{
		{"advice on a pinned MR", softrdma.AdvisePrefetch, softrdma.AdviseFlagFlush, softrdma.SGE{Addr: pinned.Addr(), Length: 4096, LKey: pinned.LKey()}, unix.EFAULT},
		{"PREFETCH_WRITE on a read-only MR", softrdma.AdvisePrefetchWrite, softrdma.AdviseFlagFlush, softrdma.SGE{Addr: ro.Addr(), Length: 4096, LKey: ro.LKey()}, unix.EFAULT},
		{"range past the MR", softrdma.AdvisePrefetch, softrdma.AdviseFlagFlush, softrdma.SGE{Addr: odp.Addr() + 3*pageSize, Length: 4097, LKey: odp.LKey()}, unix.EFAULT},
		{"range before the MR", softrdma.AdvisePrefetch, 0, softrdma.SGE{Addr: odp.Addr() - 1, Length: 16, LKey: odp.LKey()}, unix.EFAULT},
		{"unknown lkey", softrdma.AdvisePrefetch, 0, softrdma.SGE{Addr: odp.Addr(), Length: 16, LKey: odp.LKey() ^ 0xff}, unix.EFAULT},
		{"unknown flags", softrdma.AdvisePrefetch, 1 << 5, softrdma.SGE{Addr: odp.Addr(), Length: 16, LKey: odp.LKey()}, unix.EINVAL},
		{"unknown advice", 9, 0, softrdma.SGE{Addr: odp.Addr(), Length: 16, LKey: odp.LKey()}, unix.EINVAL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := p.A.Dev.AdviseMR(p.A.PD, tc.advice, tc.flags, []softrdma.SGE{tc.sge})
			require.ErrorIs(t, err, tc.errno)
			require.Regexp(t, `^softrdma: advise MR: [^:]`, err.Error(), "one prefix")
			require.NotContains(t, err.Error(), "placement: ", "one prefix")
		})
	}
	// Another PD's lkey.
	pd2, err := p.A.Dev.AllocPD()
	require.NoError(t, err)
	require.ErrorIs(t, p.A.Dev.AdviseMR(pd2, softrdma.AdvisePrefetch, 0, []softrdma.SGE{{Addr: odp.Addr(), Length: 16, LKey: odp.LKey()}}), unix.EFAULT)
	require.Zero(t, odp.ODPTable().Present(), "failed advice made nothing present")
	// A nil PD: ErrBadPD and EINVAL, "softrdma:" once.
	err = p.A.Dev.AdviseMR(nil, softrdma.AdvisePrefetch, 0, []softrdma.SGE{{Addr: odp.Addr(), Length: 16, LKey: odp.LKey()}})
	require.ErrorIs(t, err, softrdma.ErrBadPD)
	require.ErrorIs(t, err, unix.EINVAL)
	require.EqualError(t, err, "softrdma: advise MR: nil PD, a PD of another device, or a deallocated PD: invalid argument")
}

// TestODPAdvise: PREFETCH_WRITE with FLUSH makes the pages present and
// writable before it returns, counted as prefetch; PREFETCH_NO_FAULT maps
// only the pages the host holds.
func TestODPAdvise(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	buf, mr := odpAlloc(t, p.B, 8*pageSize, rw)
	// The host touches pages 0 and 5 only.
	buf[0], buf[5*pageSize] = 1, 1
	err := p.B.Dev.AdviseMR(p.B.PD, softrdma.AdvisePrefetchNoFault, softrdma.AdviseFlagFlush,
		[]softrdma.SGE{{Addr: mr.Addr(), Length: 8 * pageSize, LKey: mr.LKey()}})
	require.NoError(t, err)
	require.Equal(t, 2, mr.ODPTable().Present(), "NO_FAULT maps only the pages the host holds")
	require.EqualValues(t, 2, mr.ODPStats().PagePrefetch)

	err = p.B.Dev.AdviseMR(p.B.PD, softrdma.AdvisePrefetchWrite, softrdma.AdviseFlagFlush,
		[]softrdma.SGE{{Addr: mr.Addr(), Length: 8 * pageSize, LKey: mr.LKey()}})
	require.NoError(t, err)
	require.Equal(t, 8, mr.ODPTable().Present())
	st := mr.ODPStats()
	require.EqualValues(t, 8, st.PagePrefetch)
	require.Zero(t, st.PageFaults, "prefetch is not counted as faults")

	// A write from the peer now faults nothing.
	src, srcMR := reg(t, p.A, 8*pageSize, rw)
	fill(11, src)
	write(t, p.A, srcMR, 0, len(src), mr, mr.Addr())
	require.True(t, bytes.Equal(src, buf))
	require.Zero(t, mr.ODPStats().PageFaults)
}

// TestODPRNRMessageOverBudget: under the rnr policy a WRITE of more pages
// than the device's page budget completes (the background fault ahead is
// capped at half the budget, so it does not evict its own pages before the
// retry places them), byte-exact, with the budget respected.
func TestODPRNRMessageOverBudget(t *testing.T) {
	const budget = 128 << 10 // 32 pages
	p := softrdmatest.NewPair(t, softrdmatest.Options{FaultPolicy: softrdma.FaultRNR, ODPBudget: budget,
		Connect: softrdma.ConnectOptions{MinRNRTimer: 1}})
	const n = 2 * budget
	src, srcMR := reg(t, p.A, n, rw)
	_, dstMR := odpAlloc(t, p.B, n, rw)
	back, backMR := reg(t, p.A, n, rw)
	fill(21, src)
	write(t, p.A, srcMR, 0, n, dstMR, dstMR.Addr())
	read(t, p.A, backMR, 0, n, dstMR, dstMR.Addr())
	require.True(t, bytes.Equal(src, back))
	require.LessOrEqual(t, p.B.Dev.ODPBudget().Peak(), int64(budget/pageSize))
	require.Positive(t, counter(p.B.Dev, "odp_rnr_naks"))
}

// TestODPWriteAfterMigrateLandsInNewFrame: ODP MRs reach memory through the
// application's view, which a migration remaps. A WRITE after Migrate
// lands in the new frames (the application reads it), and the old frames
// keep what they held at the switch.
func TestODPWriteAfterMigrateLandsInNewFrame(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		p := softrdmatest.NewPair(t, o)
		const pages = 4
		src, srcMR := reg(t, p.A, pages*pageSize, rw)
		dst, dstMR := odpAlloc(t, p.B, pages*pageSize, rw)
		as := mustAS(t, p.B)
		addr := hostmem.AddrOf(dst)
		fill(31, src)
		write(t, p.A, srcMR, 0, len(src), dstMR, addr)

		m, err := as.Migrate(addr, pages)
		require.NoError(t, err)
		defer m.Release()
		require.Zero(t, dstMR.ODPTable().Present(), "the migration invalidated the MR")
		old := make([][]byte, pages)
		for i, f := range m.Old {
			old[i] = bytes.Clone(as.FrameBytes(f))
			require.Equal(t, src[i*pageSize:(i+1)*pageSize], old[i])
		}

		fill(32, src)
		write(t, p.A, srcMR, 0, len(src), dstMR, addr)
		require.True(t, bytes.Equal(src, dst), "the application reads the WRITE after the migration")
		for i := range pages {
			f, _ := as.FrameOf(addr + uint64(i)*pageSize)
			require.Equal(t, m.New[i], f)
			require.Equal(t, src[i*pageSize:(i+1)*pageSize], as.FrameBytes(m.New[i]), "page %d: new frame", i)
			require.Equal(t, old[i], as.FrameBytes(m.Old[i]), "page %d: old frame changed", i)
		}
	})
}

// TestODPFreedMemoryIsRemoteAccessError: a READ and an atomic naming memory
// the application freed get a remote access error (as a WRITE does, in
// TestODPFreeThenAllocSeesNewPages): nothing touches the unmapped view.
func TestODPFreedMemoryIsRemoteAccessError(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		for _, op := range []softrdma.WROpcode{softrdma.WRRDMARead, softrdma.WRAtomicFetchAndAdd} {
			t.Run(op.String(), func(t *testing.T) {
				p := softrdmatest.NewPair(t, o)
				as := mustAS(t, p.B)
				buf, err := as.Alloc(2 * pageSize)
				require.NoError(t, err)
				addr := hostmem.AddrOf(buf)
				mr, err := p.B.Dev.RegMRAddr(p.B.PD, addr, 2*pageSize, rw|softrdma.AccessRemoteAtomic|softrdma.AccessOnDemand)
				require.NoError(t, err)
				defer func() { require.NoError(t, p.B.Dev.DeregMR(mr)) }()
				local, localMR := reg(t, p.A, pageSize, rw)
				// Present first, so that the Free has entries to invalidate.
				read(t, p.A, localMR, 0, 64, mr, addr+pageSize-32)
				require.Equal(t, 2, mr.ODPTable().Present())

				require.NoError(t, as.Free(addr, 2*pageSize))
				fill(9, local)
				_, err = p.A.QP.PostSend(softrdma.SendWR{Opcode: op, Flags: softrdma.SendSignaled, CompareAdd: 1,
					SGL:        []softrdma.SGE{{Addr: localMR.Addr(), Length: 8, LKey: localMR.LKey()}},
					RemoteAddr: addr + pageSize, RKey: mr.RKey()})
				require.NoError(t, err)
				require.Equal(t, softrdma.WCRemAccessErr, waitWC(t, p.A.CQ, 1)[0].Status)
				require.Positive(t, counter(p.B.Dev, "odp_fault_errors"))
			})
		}
	})
}

// TestODPReadOfAppTouchedPagesMakesNoSyscall: pages the application wrote
// and the NIC never mapped are faulted in with no system call in the host
// (the copies use the application's own mapping), under both policies
// (a READ's responses fault inline).
func TestODPReadOfAppTouchedPagesMakesNoSyscall(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		p := softrdmatest.NewPair(t, o)
		const pages = 16
		buf, mr := odpAlloc(t, p.B, pages*pageSize, rw)
		back, backMR := reg(t, p.A, pages*pageSize, rw)
		fill(41, buf) // the application writes every page
		st0 := mustAS(t, p.B).Stats()
		read(t, p.A, backMR, 0, len(back), mr, mr.Addr())
		require.True(t, bytes.Equal(buf, back))
		st := mustAS(t, p.B).Stats()
		require.Zero(t, st.Syscalls-st0.Syscalls, "no system call to fault in pages the application holds")
		require.EqualValues(t, pages, mr.ODPStats().PageFaultsHandled)
	})
}
