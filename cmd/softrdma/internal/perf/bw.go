package perf

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
)

// bwClient is bwClientRun bounded by -D (session.bounded).
func (s *session) bwClient(ctx context.Context, size int64) (report.BW, []int64, error) {
	bctx, cancel := s.bounded(ctx)
	defer cancel()
	r0, r1, err := s.bwClientRun(bctx, size)
	return r0, r1, s.boundErr(ctx, bctx, err)
}

// bwClientRun runs the client side of write-bw, read-bw, send-bw and
// atomic-bw without a stream (perftest's run_iter_bw): every QP keeps up to
// tx-depth WRs outstanding, one in cq-mod of them signaled (the last one
// always), and a signaled completion retires every WR posted before it on
// its QP. It returns the result and the messages completed per QP.
//
// With --verify, READ targets a ring of slots the server filled with the
// pattern and checks every message; atomics fetch into a slot per WR and
// check the value returned (each QP has its own counter, so its n-th
// FETCH_AND_ADD of 1 returns n and its n-th CMP_AND_SWAP(n, n+1) returns
// n).
func (s *session) bwClientRun(ctx context.Context, size int64) (report.BW, []int64, error) {
	p := &s.p
	nqp := len(s.qps)
	verb := s.test.verb()
	depth, cqMod := int64(p.TxDepth), int64(p.CQMod)
	slots := int64(1)
	if p.Verify && (verb == verbRead || verb == verbAtomic) {
		cqMod = 1
		switch {
		case s.pt != nil && verb == verbRead:
			_, slots = s.ptSlots(size)
			depth = min(depth, slots)
		case verb == verbRead:
			slots = int64(ringSlots(p, size))
			depth = min(depth, slots)
		}
	}
	iters := p.Iters
	var deadline time.Time
	if p.Duration > 0 {
		iters = math.MaxInt64
	}
	posted := make([]int64, nqp)
	done := make([]int64, nqp)
	const batch = 32
	wrs := make([]softrdma.SendWR, 0, batch)
	sgls := make([]softrdma.SGE, batch)
	pl := s.newPoller()
	// The peak is measured over at least as many messages as can be in
	// flight on all QPs, or a burst of completions would count as a rate.
	peak := report.NewPeakTracker(size, peakWindow(max(cqMod, depth*int64(nqp)), p.Iters*int64(nqp), p.Duration))
	chk := checker{seed: p.Seed}
	var total int64
	stopping := false
	start := time.Now()
	last := start
	if p.Duration > 0 {
		deadline = start.Add(p.Duration)
	}
	for {
		if !deadline.IsZero() && !stopping && time.Now().After(deadline) {
			stopping = true
		}
		postedAny := false
		finished := true
		for q := range nqp {
			wrs = wrs[:0]
			for posted[q]-done[q] < depth && len(wrs) < batch {
				i := posted[q]
				// Duration: stop at the end of a moderation group, whose
				// last WR is signaled.
				if i >= iters || stopping && i%cqMod == 0 {
					break
				}
				signaled := (i+1)%cqMod == 0 || i+1 == iters
				wrs = append(wrs, s.bwWR(q, i, size, slots, signaled, sgls[len(wrs):len(wrs)+1]))
				posted[q]++
			}
			if len(wrs) > 0 {
				if _, err := s.qps[q].PostSend(wrs...); err != nil {
					return report.BW{}, nil, fmt.Errorf("post send: %w", err)
				}
				postedAny = true
			}
			more := posted[q] < iters && !(stopping && posted[q]%cqMod == 0)
			if more || done[q] < posted[q] {
				finished = false
			}
		}
		if finished {
			break
		}
		wcs, err := pl.poll(ctx, !postedAny)
		if err != nil {
			return report.BW{}, nil, err
		}
		if len(wcs) == 0 {
			continue
		}
		now := time.Now()
		for i := range wcs {
			wc := &wcs[i]
			if err := checkWC(wc); err != nil {
				return report.BW{}, nil, err
			}
			q, idx := wridQP(wc.WRID), wridIdx(wc.WRID)
			total += idx + 1 - done[q]
			done[q] = idx + 1
			if p.Verify && s.pt != nil {
				if err := s.ptVerify(q, idx, size); err != nil {
					return report.BW{}, nil, err
				}
			} else if p.Verify {
				if err := s.bwVerify(&chk, q, idx, size, slots); err != nil {
					return report.BW{}, nil, err
				}
			}
		}
		last = now
		peak.Add(now, total)
		s.idle.Done(total)
	}
	if s.pt != nil {
		s.ptVerifyDone(size, total)
	}
	r := report.BW{Bytes: size, Iterations: total, Elapsed: last.Sub(start)}
	r.PeakBps = durationPeak(&s.p, peak, r.AvgBps())
	return r, done, nil
}

// bwWR builds message i of QP q.
func (s *session) bwWR(q int, i, size, slots int64, signaled bool, sgl []softrdma.SGE) softrdma.SendWR {
	rem := &s.remote[q]
	wr := softrdma.SendWR{WRID: wrid(kindData, q, i), SGL: sgl, RemoteAddr: rem.VAddr, RKey: rem.RKey}
	if signaled {
		wr.Flags |= softrdma.SendSignaled
	}
	if s.pt != nil {
		s.ptWR(&wr, q, i, size)
		return wr
	}
	switch s.test.verb() {
	case verbWrite, verbSend:
		wr.Opcode = softrdma.WRRDMAWrite
		if s.test.verb() == verbSend {
			wr.Opcode = softrdma.WRSend
		}
		sgl[0] = s.sge(q, 0, int(size))
		if size <= int64(s.p.Inline) {
			wr.Flags |= softrdma.SendInline
		}
	case verbRead:
		off := int(i%slots) * int(size)
		wr.Opcode = softrdma.WRRDMARead
		sgl[0] = s.sge(q, off, int(size))
		wr.RemoteAddr += uint64(off)
	case verbAtomic:
		sgl[0] = s.sge(q, int(i%int64(s.p.TxDepth))*8, 8)
		if s.p.Atomic == CmpAndSwap {
			wr.Opcode = softrdma.WRAtomicCmpAndSwp
			wr.CompareAdd, wr.Swap = uint64(i), uint64(i+1)
		} else {
			wr.Opcode = softrdma.WRAtomicFetchAndAdd
			wr.CompareAdd = 1
		}
	}
	return wr
}

// bwVerify checks the data of completed message idx of QP q.
func (s *session) bwVerify(chk *checker, q int, idx, size, slots int64) error {
	switch s.test.verb() {
	case verbRead:
		off := int(idx%slots) * int(size)
		return chk.check(s.local(q)[off:off+int(size)], idx%slots, fmt.Sprintf("READ %d (QP %d, slot %d)", idx, q, idx%slots))
	case verbAtomic:
		off := int(idx%int64(s.p.TxDepth)) * 8
		if got := binary.NativeEndian.Uint64(s.local(q)[off:]); got != uint64(idx) {
			return fmt.Errorf("%w: %s %d on QP %d returned %d, want %d", ErrMismatch, s.p.Atomic, idx, q, got, idx)
		}
	}
	return nil
}

// fillReadSlots writes the pattern into the ring slots read-bw --verify
// reads: slot j of every QP holds message j's pattern.
func (s *session) fillReadSlots(size int64) {
	slots := ringSlots(&s.p, size)
	for q := range s.p.QPs {
		for j := range slots {
			off := j * int(size)
			fillPattern(s.local(q)[off:off+int(size)], s.p.Seed, int64(j))
		}
	}
}

// checkAtomicCounters checks, on the server after atomic-bw --verify, that
// every QP's counter holds the number of atomics the client completed on
// it.
func (s *session) checkAtomicCounters(counts []int64) error {
	if len(counts) != s.p.QPs {
		return fmt.Errorf("client reported %d QP counts, want %d", len(counts), s.p.QPs)
	}
	for q, n := range counts {
		if got := binary.NativeEndian.Uint64(s.local(q)); got != uint64(n) {
			return fmt.Errorf("%w: QP %d counter is %d after %d %s, want %d", ErrMismatch, q, got, n, s.p.Atomic, n)
		}
	}
	return nil
}

// sendBWServer receives for send-bw: rx-depth receives per QP, reposted
// as they complete, until target() messages arrived. target reports false
// until the client said how many it sent (duration runs); known is closed
// then.
func (s *session) sendBWServer(ctx context.Context, size int64, target func() (int64, bool), known <-chan struct{}) (report.BW, error) {
	if !s.pm.preposted {
		if err := s.sendBWPostRecvs(size); err != nil {
			return report.BW{}, err
		}
	}
	// wctx ends when the target becomes known, to wake a blocked Wait.
	wctx, cancel := untilClosed(ctx, known)
	defer cancel()
	pl := s.newPoller()
	peak := report.NewPeakTracker(size, recvPeakWindow(&s.p))
	var total int64
	rc := recvClock{s: s}
	for {
		t, ok := target()
		if ok && total >= t {
			break
		}
		c := wctx
		if ok {
			c = ctx
		}
		wcs, err := pl.poll(c, true)
		if err != nil {
			if ctx.Err() == nil && wctx.Err() != nil {
				continue // the target just became known
			}
			return report.BW{}, err
		}
		now := s.clock()
		for i := range wcs {
			wc := &wcs[i]
			if err := checkWC(wc); err != nil {
				return report.BW{}, err
			}
			if wridKind(wc.WRID) != kindRecv {
				continue
			}
			if s.pt != nil && s.p.Verify && int64(wc.ByteLen) != size {
				return report.BW{}, fmt.Errorf("%w: message %d is %d bytes, want %d", ErrMismatch, total, wc.ByteLen, size)
			}
			total++
			q := wridQP(wc.WRID)
			if _, err := s.qps[q].PostRecv(softrdma.RecvWR{WRID: wc.WRID, SGL: []softrdma.SGE{s.sge(q, 0, int(size))}}); err != nil {
				return report.BW{}, fmt.Errorf("post recv: %w", err)
			}
		}
		if len(wcs) > 0 {
			rc.tick(now)
			peak.Add(now, total)
			s.idle.Done(total)
		}
	}
	r := report.BW{Bytes: size, Iterations: total, Elapsed: rc.elapsed()}
	r.PeakBps = durationPeak(&s.p, peak, r.AvgBps())
	return r, nil
}

// recvPeakWindow is the send-bw receiver's peak window, in messages: as
// the sender's (cq-mod, tx-depth, a sixteenth of the run), and at least 4
// times the receives it keeps posted (rx-depth × QPs). Its completion
// times are those of its polls, and a backlog of up to rx-depth × QPs
// completions, drained in a few polls microseconds apart, inside a window
// of that size counted as a rate of tens of GB/s (one -n 5000 run in three
// printed 14 GB/s against 288 MB/s); with 4 backlogs to a window, a burst
// overstates the rate by a third at most.
func recvPeakWindow(p *Params) int64 {
	least := max(int64(p.CQMod), int64(p.TxDepth)*int64(p.QPs), 4*int64(p.RxDepth)*int64(p.QPs))
	return peakWindow(least, p.Iters*int64(p.QPs), p.Duration)
}

// durationPeak is the BW peak a side reports, given its tracker and the
// run's average rate. A -D run reports none (0.00) on either side, as
// perftest does: its -D forces -N (noPeak), so print_report_bw's peak is
// 0. (On the send-bw receiver it was also wrong: the times the tracker
// sees are those of its polls, and a -D run's window, tx-depth messages,
// is shorter than the backlog rx-depth lets queue in the CQ, so a backlog
// drained in a burst of polls a few microseconds apart counted as a rate
// of tens of GB/s.)
func durationPeak(p *Params, peak *report.PeakTracker, avg float64) float64 {
	if p.Duration > 0 {
		return 0
	}
	return peak.Peak(avg)
}

// sendBWPostRecvs posts send-bw's rx-depth receives on every QP.
func (s *session) sendBWPostRecvs(size int64) error {
	for q, qp := range s.qps {
		for j := range s.p.RxDepth {
			if _, err := qp.PostRecv(softrdma.RecvWR{WRID: wrid(kindRecv, q, int64(j)),
				SGL: []softrdma.SGE{s.sge(q, 0, int(size))}}); err != nil {
				return fmt.Errorf("post recv: %w", err)
			}
		}
	}
	return nil
}

// ptWR fills message i of QP q as perftest's bandwidth client does
// (ctx_set_send_wqes, increase_rem_addr): the remote address steps through
// the peer's buffer; FETCH_AND_ADD adds 1, CMP_AND_SWAP compares with 0
// and swaps in 0. A READ lands at the offset of its remote slot with
// --verify (see ptLocalOff), everything else is sent from offset 0.
func (s *session) ptWR(wr *softrdma.SendWR, q int, i, size int64) {
	step, n := s.ptSlots(size)
	wr.RemoteAddr += uint64(i % n * step)
	switch s.test.verb() {
	case verbWrite, verbSend:
		wr.Opcode = softrdma.WRRDMAWrite
		if s.test.verb() == verbSend {
			wr.Opcode = softrdma.WRSend
		}
		wr.SGL[0] = s.sge(q, 0, int(size))
		if size <= int64(s.p.Inline) {
			wr.Flags |= softrdma.SendInline
		}
	case verbRead:
		wr.Opcode = softrdma.WRRDMARead
		wr.SGL[0] = s.sge(q, s.ptLocalOff(i, size), int(size))
	case verbAtomic:
		wr.SGL[0] = s.sge(q, int(i%int64(s.p.TxDepth))*8, 8)
		if s.p.Atomic == CmpAndSwap {
			wr.Opcode = softrdma.WRAtomicCmpAndSwp
		} else {
			wr.Opcode = softrdma.WRAtomicFetchAndAdd
			wr.CompareAdd = 1
		}
	}
}
