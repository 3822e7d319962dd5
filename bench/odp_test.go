package bench_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/softrdmatest"
)

// odpBatchBytes bounds the fresh ODP memory one first-touch batch writes
// into: the messages of a batch go to consecutive never-touched ranges of
// one MR, which is replaced (untimed) when the batch is done.
const odpBatchBytes = 32 << 20

// BenchmarkWriteBWODP is ib_write_bw --odp on the responder: RDMA WRITEs
// of one size, 64 outstanding, into a target registered on demand, against
// a pinned target measured in the same run.
//
//   - pinned: the target is a pinned MR (BenchmarkWriteBW).
//   - odp-first-touch/sync, odp-first-touch/rnr: every message lands on
//     pages neither the host nor the NIC has touched, so the responder
//     faults each of them in (populating the page) under the device's fault
//     policy: inline (sync, rxe) or by an RNR NAK, a background fault and
//     the requester's retry after min_rnr_timer (rnr, mlx5; the timer is
//     perftest's 12, 0.64 ms). The messages of a batch go to consecutive
//     ranges of one fresh ODP MR of up to 32 MiB; registering and
//     releasing the MRs is not timed, the transfers and their faults are.
//   - odp-steady: an ODP MR whose pages a first WRITE already faulted in.
//
// Metrics besides MB/s: pinned-MB/s, the same transfer into a pinned
// target of the message's size on the same pair of devices, measured
// before and after the timed part (the mean), and ratio-vs-pinned (this
// run's MB/s ÷ pinned-MB/s); page-faults/op and, when there were faults,
// fault-p50-µs and fault-p99-µs (the responder's fault handler; over
// several batches, the fault-weighted mean of each batch's percentile);
// rnr-naks/op and retransmits/op of the requester. The ratios mean
// something only for runs of some length: use -benchtime 1s or more.
func BenchmarkWriteBWODP(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			b.Run("pinned", func(b *testing.B) { benchWriteODP(b, size, odpPinned, softrdma.FaultSync) })
			b.Run("odp-first-touch", func(b *testing.B) {
				for _, pol := range []softrdma.FaultPolicy{softrdma.FaultSync, softrdma.FaultRNR} {
					b.Run(pol.String(), func(b *testing.B) { benchWriteODP(b, size, odpFirstTouch, pol) })
				}
			})
			b.Run("odp-steady", func(b *testing.B) { benchWriteODP(b, size, odpSteady, softrdma.FaultSync) })
		})
	}
}

type odpMode uint8

const (
	odpPinned odpMode = iota
	odpFirstTouch
	odpSteady
)

// odpTarget is the responder's ODP memory of a run: a buffer of its
// device's address space registered on demand.
type odpTarget struct {
	side *softrdmatest.Side
	as   *hostmem.AddressSpace
	buf  []byte
	mr   *softrdma.MR
}

func newODPTarget(b *testing.B, s *softrdmatest.Side, n int) *odpTarget {
	b.Helper()
	as, err := s.Dev.AddressSpace()
	if err != nil {
		b.Fatal(err)
	}
	buf, err := as.Alloc(n)
	if err != nil {
		b.Fatal(err)
	}
	mr, err := s.Dev.RegMR(s.PD, buf, rw|softrdma.AccessOnDemand)
	if err != nil {
		b.Fatal(err)
	}
	return &odpTarget{side: s, as: as, buf: buf, mr: mr}
}

// release deregisters the MR and frees its memory, returning its counters.
func (t *odpTarget) release(b *testing.B) softrdma.ODPStats {
	b.Helper()
	st := t.mr.ODPStats()
	if err := t.side.Dev.DeregMR(t.mr); err != nil {
		b.Fatal(err)
	}
	if err := t.as.Free(hostmem.AddrOf(t.buf), len(t.buf)); err != nil {
		b.Fatal(err)
	}
	return st
}

// faultStats sums the ODP counters of the MRs of a run.
type faultStats struct {
	pageFaults, faults int64
	p50, p99           float64 // fault-weighted sums of the MRs' percentiles
}

func (f *faultStats) add(st softrdma.ODPStats) {
	f.pageFaults += st.PageFaults
	f.faults += st.Faults
	f.p50 += st.FaultP50us * float64(st.Faults)
	f.p99 += st.FaultP99us * float64(st.Faults)
}

func (f *faultStats) report(b *testing.B, n int) {
	b.ReportMetric(float64(f.pageFaults)/float64(n), "page-faults/op")
	if f.faults > 0 {
		b.ReportMetric(f.p50/float64(f.faults), "fault-p50-µs")
		b.ReportMetric(f.p99/float64(f.faults), "fault-p99-µs")
	}
}

func benchWriteODP(b *testing.B, size int, mode odpMode, pol softrdma.FaultPolicy) {
	p := softrdmatest.NewPair(b, softrdmatest.Options{NoPcap: true, Cap: queueCap, CQDepth: 1024, FaultPolicy: pol})
	ctx := benchContext(b)
	src, pinned := regMR(b, p.A.Dev, p.A.PD, size), regMR(b, p.B.Dev, p.B.PD, size)
	write := func(dst *softrdma.MR, off int) softrdma.SendWR {
		return softrdma.SendWR{Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
			SGL:        []softrdma.SGE{{Addr: src.Addr(), Length: uint32(size), LKey: src.LKey()}},
			RemoteAddr: dst.Addr() + uint64(off), RKey: dst.RKey()}
	}
	wcs := make([]softrdma.WC, txDepth)
	pump := func(n int, wrAt func(i int) softrdma.SendWR) {
		if err := pumpWRs(ctx, p.A.QP, p.A.CQ, n, wrAt, wcs); err != nil {
			logPairState(b, p)
			b.Fatal(err)
		}
	}
	// The baseline: the same transfer into the pinned target, untimed.
	pinnedRun := func() time.Duration {
		wr := write(pinned, 0)
		t0 := time.Now()
		pump(b.N, func(int) softrdma.SendWR { return wr })
		return time.Since(t0)
	}

	var fs faultStats
	var steady *odpTarget
	var baseline time.Duration
	if mode != odpPinned {
		baseline = pinnedRun()
	}
	if mode == odpSteady {
		steady = newODPTarget(b, p.B, size)
		b.Cleanup(func() { steady.release(b) })
		pump(1, func(int) softrdma.SendWR { return write(steady.mr, 0) }) // fault every page in
		fs.pageFaults -= steady.mr.ODPStats().PageFaults
	}

	tr := traffic{req: p.A.Dev, dataTx: p.A.Dev, dataRx: p.B.Dev, rnr: true}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	tr.start()
	b.ResetTimer()
	switch mode {
	case odpPinned:
		wr := write(pinned, 0)
		pump(b.N, func(int) softrdma.SendWR { return wr })
	case odpSteady:
		wr := write(steady.mr, 0)
		pump(b.N, func(int) softrdma.SendWR { return wr })
	case odpFirstTouch:
		perBatch := max(1, odpBatchBytes/size)
		for done := 0; done < b.N; {
			n := min(perBatch, b.N-done)
			b.StopTimer()
			t := newODPTarget(b, p.B, n*size)
			b.StartTimer()
			pump(n, func(i int) softrdma.SendWR { return write(t.mr, i*size) })
			b.StopTimer()
			fs.add(t.release(b))
			b.StartTimer()
			done += n
		}
	}
	b.StopTimer()
	elapsed := b.Elapsed()
	tr.report(b, b.N)
	if mode == odpPinned {
		return
	}
	if mode == odpSteady {
		st := steady.mr.ODPStats()
		fs.pageFaults += st.PageFaults
	}
	fs.report(b, b.N)
	baseline = (baseline + pinnedRun()) / 2
	bytes := float64(size) * float64(b.N)
	mbps, pinnedMBps := bytes/elapsed.Seconds()/1e6, bytes/baseline.Seconds()/1e6
	b.ReportMetric(pinnedMBps, "pinned-MB/s")
	b.ReportMetric(mbps/pinnedMBps, "ratio-vs-pinned")
}

// pumpWRs posts n WRs (wrAt(i) for the i-th) on qp, keeping at most
// txDepth outstanding, and waits for all their completions on cq.
func pumpWRs(ctx context.Context, qp *softrdma.QP, cq *softrdma.CQ, n int, wrAt func(i int) softrdma.SendWR, wcs []softrdma.WC) error {
	posted, done := 0, 0
	for done < n {
		for posted < n && posted-done < txDepth {
			if _, err := qp.PostSend(wrAt(posted)); err != nil {
				return fmt.Errorf("post send %d: %w", posted, err)
			}
			posted++
		}
		k, err := cq.Wait(ctx, wcs)
		if err != nil {
			return fmt.Errorf("after %d of %d completions: %w", done, n, err)
		}
		for i := range wcs[:k] {
			if wcs[i].Status != softrdma.WCSuccess {
				return fmt.Errorf("completion %d: %v", done+i, wcs[i].Status)
			}
		}
		done += k
	}
	return nil
}

// logPairState logs what a stalled run leaves behind: both devices'
// non-zero counters and the QPs' requester and responder state.
func logPairState(b *testing.B, p *softrdmatest.Pair) {
	for _, s := range []*softrdmatest.Side{p.A, p.B} {
		var nz []string
		for _, c := range s.Dev.Snapshot() {
			if c.Value != 0 {
				nz = append(nz, fmt.Sprintf("%s=%d", c.Name, c.Value))
			}
		}
		b.Logf("%v: %s", s.Dev.LocalAddr(), strings.Join(nz, " "))
		b.Logf("QP %d requester: %+v", s.QP.QPN(), s.QP.RequesterState())
		b.Logf("QP %d responder: %+v", s.QP.QPN(), s.QP.ResponderState())
	}
}
