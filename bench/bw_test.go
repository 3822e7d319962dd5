package bench_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// The scenarios below run two devices in this process over loopback UDP
// (softrdmatest.NewPair: 127.0.0.1, ephemeral ports, GSO and GRO on),
// with the perftest defaults that matter here: MTU 4096, every WR
// signaled, txDepth WRs outstanding (ib_write_bw -t). A bandwidth op is
// one message; MB/s is 10^6 bytes per second of message payload.
//
// The bandwidth loops use b.N rather than b.Loop: the messages still in
// flight when the last one is posted must be waited for inside the timed
// region, and b.Loop stops the timer as soon as it returns false.

const (
	// txDepth is the number of outstanding send WRs (ib_write_bw -t 64).
	// READ and atomics are further limited by max_rd_atomic (16).
	txDepth = 64
	// benchTimeout makes a benchmark that stalls (a lost peer, a bug)
	// fail instead of hanging a CI job.
	benchTimeout = 2 * time.Minute

	rw = softrdma.AccessLocalWrite | softrdma.AccessRemoteWrite |
		softrdma.AccessRemoteRead | softrdma.AccessRemoteAtomic
)

// bwSizes are the message sizes of the bandwidth scenarios.
var bwSizes = []int{4 << 10, 64 << 10, 1 << 20}

// queueCap sizes the QPs: room for txDepth signaled WRs and a deep receive
// queue, so that SEND never runs into an RNR NAK while the receiver
// reposts.
var queueCap = softrdma.Cap{MaxSendWR: 128, MaxRecvWR: 512, MaxSendSGE: 1, MaxRecvSGE: 1}

func newPair(b *testing.B) *softrdmatest.Pair {
	b.Helper()
	return softrdmatest.NewPair(b, softrdmatest.Options{NoPcap: true, Cap: queueCap, CQDepth: 1024})
}

func regMR(b *testing.B, dev *softrdma.Device, pd *softrdma.PD, size int) *softrdma.MR {
	b.Helper()
	mr, err := dev.RegMR(pd, make([]byte, size), rw)
	if err != nil {
		b.Fatal(err)
	}
	return mr
}

func benchContext(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(b.Context(), benchTimeout)
	b.Cleanup(cancel)
	return ctx
}

// sample is what a benchmark reads from one device before and after its
// timed part.
type sample struct {
	retransmits, rnrNAKs           uint64
	sentDgrams, sendCalls          uint64
	rcvdDgrams, recvCalls, badICRC uint64
}

func sampleOf(d *softrdma.Device) sample {
	if d == nil {
		return sample{}
	}
	c, s := d.Counters(), d.ConnStats()
	return sample{
		retransmits: c.Retransmits.Load(), rnrNAKs: c.RcvdRNRErr.Load(),
		sentDgrams: s.SentDatagrams.Load(), sendCalls: s.SendCalls.Load(),
		rcvdDgrams: s.RcvdDatagrams.Load(), recvCalls: s.RecvCalls.Load(), badICRC: s.BadICRC.Load(),
	}
}

// traffic names the devices of a bandwidth run by role: the requester
// (posts the WRs), the one that sends the data, the one that receives it
// (for READ the responder sends the data). A device in another process is
// nil: its metrics are not reported.
type traffic struct {
	req, dataTx, dataRx *softrdma.Device
	rnr                 bool // report rnr-naks/op (SEND)
	s0                  [3]sample
}

func (t *traffic) start() {
	t.s0 = [3]sample{sampleOf(t.req), sampleOf(t.dataTx), sampleOf(t.dataRx)}
}

// report adds the custom metrics of a run of n ops: the requester's
// retransmissions (and, for SEND, RNR NAKs received) per op, the
// acknowledgements it received per op when it sends the data, and how many
// datagrams each send syscall (sendmmsg) of the data sender and each
// receive syscall (recvmmsg, including ones that found nothing) of the
// data receiver carried. It fails the benchmark if any datagram failed
// its ICRC check.
func (t *traffic) report(b *testing.B, n int) {
	// The conns count a sendmmsg after it returns, which may be after the
	// peer has already acknowledged what it carried: let them settle.
	time.Sleep(5 * time.Millisecond)
	req, tx, rx := sampleOf(t.req), sampleOf(t.dataTx), sampleOf(t.dataRx)
	b.ReportMetric(float64(req.retransmits-t.s0[0].retransmits)/float64(n), "retransmits/op")
	if t.req != nil && t.req == t.dataTx {
		// WRITE and SEND: what the requester receives is ACKs (and NAKs).
		b.ReportMetric(float64(req.rcvdDgrams-t.s0[0].rcvdDgrams)/float64(n), "acks/op")
	}
	if t.rnr {
		b.ReportMetric(float64(req.rnrNAKs-t.s0[0].rnrNAKs)/float64(n), "rnr-naks/op")
	}
	if c := tx.sendCalls - t.s0[1].sendCalls; c > 0 {
		b.ReportMetric(float64(tx.sentDgrams-t.s0[1].sentDgrams)/float64(c), "tx-dgrams/syscall")
	}
	if c := rx.recvCalls - t.s0[2].recvCalls; c > 0 {
		b.ReportMetric(float64(rx.rcvdDgrams-t.s0[2].rcvdDgrams)/float64(c), "rx-dgrams/syscall")
	}
	if bad := rx.badICRC - t.s0[2].badICRC; bad > 0 {
		b.Errorf("%d datagrams failed the ICRC check", bad)
	}
}

// runBW posts b.N copies of wr on qp, keeping at most txDepth outstanding,
// and waits for all their completions on cq. It times exactly that.
func runBW(b *testing.B, ctx context.Context, qp *softrdma.QP, cq *softrdma.CQ, wr softrdma.SendWR, bytesPerOp int, t *traffic) {
	b.Helper()
	wcs := make([]softrdma.WC, txDepth)
	b.SetBytes(int64(bytesPerOp))
	b.ReportAllocs()
	t.start()
	b.ResetTimer()
	posted, done := 0, 0
	for done < b.N {
		for posted < b.N && posted-done < txDepth {
			if _, err := qp.PostSend(wr); err != nil {
				b.Fatalf("post send %d: %v", posted, err)
			}
			posted++
		}
		n, err := cq.Wait(ctx, wcs)
		if err != nil {
			b.Fatalf("after %d of %d completions: %v", done, b.N, err)
		}
		for i := range wcs[:n] {
			if wcs[i].Status != softrdma.WCSuccess {
				b.Fatalf("completion %d: %v", done+i, wcs[i].Status)
			}
		}
		done += n
	}
	b.StopTimer()
	t.report(b, b.N)
}

// BenchmarkWriteBW is ib_write_bw: RDMA WRITEs of one size into one remote
// buffer, 64 outstanding, MTU 4096, two devices in this process.
func BenchmarkWriteBW(b *testing.B) {
	for _, size := range bwSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			p := newPair(b)
			ctx := benchContext(b)
			src, dst := regMR(b, p.A.Dev, p.A.PD, size), regMR(b, p.B.Dev, p.B.PD, size)
			wr := softrdma.SendWR{Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
				SGL:        []softrdma.SGE{{Addr: src.Addr(), Length: uint32(size), LKey: src.LKey()}},
				RemoteAddr: dst.Addr(), RKey: dst.RKey()}
			runBW(b, ctx, p.A.QP, p.A.CQ, wr, size, &traffic{req: p.A.Dev, dataTx: p.A.Dev, dataRx: p.B.Dev})
		})
	}
}

// BenchmarkReadBW is ib_read_bw: RDMA READs of one size from one remote
// buffer into a local one. At most max_rd_atomic (16) READs are
// outstanding at a time whatever the send queue holds.
func BenchmarkReadBW(b *testing.B) {
	for _, size := range bwSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			p := newPair(b)
			ctx := benchContext(b)
			dst, src := regMR(b, p.A.Dev, p.A.PD, size), regMR(b, p.B.Dev, p.B.PD, size)
			wr := softrdma.SendWR{Opcode: softrdma.WRRDMARead, Flags: softrdma.SendSignaled,
				SGL:        []softrdma.SGE{{Addr: dst.Addr(), Length: uint32(size), LKey: dst.LKey()}},
				RemoteAddr: src.Addr(), RKey: src.RKey()}
			runBW(b, ctx, p.A.QP, p.A.CQ, wr, size, &traffic{req: p.A.Dev, dataTx: p.B.Dev, dataRx: p.A.Dev})
		})
	}
}

// BenchmarkSendBW is ib_send_bw: SENDs of one size into receive buffers
// that the receiver reposts as their completions arrive (a goroutine
// polling the receiver's CQ, as ib_send_bw's server loop does).
func BenchmarkSendBW(b *testing.B) {
	for _, size := range bwSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			p := newPair(b)
			ctx := benchContext(b)
			src, dst := regMR(b, p.A.Dev, p.A.PD, size), regMR(b, p.B.Dev, p.B.PD, size)
			stop := repostReceives(b, ctx, p.B, softrdma.RecvWR{
				SGL: []softrdma.SGE{{Addr: dst.Addr(), Length: uint32(size), LKey: dst.LKey()}}})
			wr := softrdma.SendWR{Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
				SGL: []softrdma.SGE{{Addr: src.Addr(), Length: uint32(size), LKey: src.LKey()}}}
			runBW(b, ctx, p.A.QP, p.A.CQ, wr, size, &traffic{req: p.A.Dev, dataTx: p.A.Dev, dataRx: p.B.Dev, rnr: true})
			if err := stop(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// repostReceives fills s's receive queue with copies of wr and starts a
// goroutine that reposts one for every receive completion on s.CQ. stop
// ends it and returns the first bad completion it saw.
func repostReceives(b *testing.B, ctx context.Context, s *softrdmatest.Side, wr softrdma.RecvWR) (stop func() error) {
	b.Helper()
	wrs := make([]softrdma.RecvWR, queueCap.MaxRecvWR)
	for i := range wrs {
		wrs[i] = wr
	}
	if _, err := s.QP.PostRecv(wrs...); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		wcs := make([]softrdma.WC, 64)
		for {
			n, err := s.CQ.Wait(ctx, wcs)
			if err != nil {
				errc <- nil
				return
			}
			for i := range wcs[:n] {
				if wcs[i].Status != softrdma.WCSuccess {
					errc <- fmt.Errorf("receive completion: %v", wcs[i].Status)
					return
				}
			}
			if _, err := s.QP.PostRecv(wrs[:n]...); err != nil {
				errc <- fmt.Errorf("repost: %w", err)
				return
			}
		}
	}()
	return func() error {
		cancel()
		return <-errc
	}
}

// BenchmarkAtomicBW is ib_atomic_bw: 8-byte FETCH_AND_ADDs on one remote
// word, as many outstanding as max_rd_atomic (16) allows. MB/s counts the
// 8 bytes of each atomic; ns/op is the time per atomic.
func BenchmarkAtomicBW(b *testing.B) {
	p := newPair(b)
	ctx := benchContext(b)
	local, remote := regMR(b, p.A.Dev, p.A.PD, 4096), regMR(b, p.B.Dev, p.B.PD, 4096)
	wr := softrdma.SendWR{Opcode: softrdma.WRAtomicFetchAndAdd, Flags: softrdma.SendSignaled,
		SGL:        []softrdma.SGE{{Addr: local.Addr(), Length: 8, LKey: local.LKey()}},
		RemoteAddr: remote.Addr(), RKey: remote.RKey(), CompareAdd: 1}
	runBW(b, ctx, p.A.QP, p.A.CQ, wr, 8, &traffic{req: p.A.Dev, dataTx: p.A.Dev, dataRx: p.B.Dev})
}

// BenchmarkWriteLat is ib_write_lat: a ping-pong of RDMA WRITEs of one
// size between the two devices. ib_write_lat has each side spin on the
// last byte of its buffer; here each WRITE carries an immediate
// (WRITE_WITH_IMM) and each side blocks on its CQ for the receive
// completion instead, because two goroutines spinning on memory would
// starve the devices' own goroutines on a 2-core machine. ns/op is one
// round trip; p50-µs and p99-µs are percentiles of half the round trip,
// the figure ib_write_lat reports (t_typical, 99%).
func BenchmarkWriteLat(b *testing.B) {
	for _, size := range []int{2, 4096} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			p := newPair(b)
			ctx := benchContext(b)
			amr, bmr := regMR(b, p.A.Dev, p.A.PD, size), regMR(b, p.B.Dev, p.B.PD, size)
			ping := softrdma.SendWR{Opcode: softrdma.WRRDMAWriteWithImm,
				SGL:        []softrdma.SGE{{Addr: amr.Addr(), Length: uint32(size), LKey: amr.LKey()}},
				RemoteAddr: bmr.Addr(), RKey: bmr.RKey()}
			pong := softrdma.SendWR{Opcode: softrdma.WRRDMAWriteWithImm,
				SGL:        []softrdma.SGE{{Addr: bmr.Addr(), Length: uint32(size), LKey: bmr.LKey()}},
				RemoteAddr: amr.Addr(), RKey: amr.RKey()}
			recv := softrdma.RecvWR{} // WRITE_WITH_IMM consumes a receive WQE but places nothing through it
			if _, err := p.A.QP.PostRecv(recv, recv, recv, recv); err != nil {
				b.Fatal(err)
			}
			stop := answer(b, ctx, p.B, recv, pong)

			lat := make([]time.Duration, b.N)
			wcs := make([]softrdma.WC, 4)
			tr := traffic{req: p.A.Dev, dataTx: p.A.Dev, dataRx: p.B.Dev}
			b.ReportAllocs()
			tr.start()
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				if _, err := p.A.QP.PostSend(ping); err != nil {
					b.Fatal(err)
				}
				if err := waitImm(ctx, p.A.CQ, wcs); err != nil {
					b.Fatalf("ping %d: %v", i, err)
				}
				lat[i] = time.Since(t0)
				if _, err := p.A.QP.PostRecv(recv); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if err := stop(); err != nil {
				b.Fatal(err)
			}
			tr.report(b, b.N)
			slices.Sort(lat)
			pct := func(q float64) float64 {
				return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / 2 / 1e3
			}
			b.ReportMetric(pct(0.50), "p50-µs")
			b.ReportMetric(pct(0.99), "p99-µs")
		})
	}
}

// waitImm waits for the next receive completion of a WRITE_WITH_IMM on cq.
func waitImm(ctx context.Context, cq *softrdma.CQ, wcs []softrdma.WC) error {
	for {
		n, err := cq.Wait(ctx, wcs[:1])
		if err != nil {
			return err
		}
		if n == 0 {
			continue
		}
		if wcs[0].Status != softrdma.WCSuccess {
			return fmt.Errorf("completion: %v (opcode %v)", wcs[0].Status, wcs[0].Opcode)
		}
		if wcs[0].Opcode == softrdma.WCRecvRDMAWithImm {
			return nil
		}
	}
}

// answer posts receives on s and starts a goroutine that answers every
// WRITE_WITH_IMM received on s with pong (the passive side of
// ib_write_lat). stop ends it and returns the first error it saw.
func answer(b *testing.B, ctx context.Context, s *softrdmatest.Side, recv softrdma.RecvWR, pong softrdma.SendWR) (stop func() error) {
	b.Helper()
	if _, err := s.QP.PostRecv(recv, recv, recv, recv); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		wcs := make([]softrdma.WC, 4)
		for {
			if err := waitImm(ctx, s.CQ, wcs); err != nil {
				if ctx.Err() != nil {
					err = nil
				}
				errc <- err
				return
			}
			if _, err := s.QP.PostRecv(recv); err != nil {
				errc <- err
				return
			}
			if _, err := s.QP.PostSend(pong); err != nil {
				errc <- err
				return
			}
		}
	}()
	return func() error {
		cancel()
		return <-errc
	}
}
