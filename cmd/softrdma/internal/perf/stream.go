package perf

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
)

// Streams: --file and --verify move messages through a ring of N slots
// (ringSlots) on QP 0, with flow control over the RDMA connection itself,
// so that any number of bytes crosses a registered buffer of a fixed size
// and the receiving side can look at each message before its slot is
// reused.
//
// WRITE and SEND (the client is the source): message k goes from the
// client's slot k%N to the server's slot k%N, by RDMA WRITE WITH IMMEDIATE
// (the immediate completes a receive on the server, which tells it the
// message was placed) or by SEND WITH IMMEDIATE into a receive posted on
// the slot. The immediate carries k (31 bits); a zero-length message with
// the top bit set ends the stream. After consuming messages, the server
// returns a credit: a zero-length SEND WITH IMMEDIATE carrying the count
// consumed so far (cumulative, so credits may be coalesced). The client
// sends message k only when k - consumed < N (the slot is free) and its own
// WR k-N has completed (its local slot is free).
//
// READ (the server is the source, --file on the server): the server fills
// slots and announces them with a SEND WITH IMMEDIATE carrying the count
// published; the client READs each published slot into its own slot k%N,
// consumes it, and credits the server as above.
//
// Every stream WR is signaled. A stream ends with the result exchange over
// TCP (see round), which a side only sends once all its WRs completed, so
// neither side tears down a QP its peer still needs.
const (
	immEOS  = 1 << 31
	immMask = immEOS - 1
)

// advance returns the 64-bit count that a 32-bit cumulative count imm
// names, given the last one seen (counts only grow, by less than 2^31).
func advance(cur int64, imm uint32) int64 { return cur + int64(imm-uint32(cur)) }

var errProtocol = errors.New("stream protocol error")

// testCorrupt, if set (tests only), may change a received message before
// the sink looks at it.
var testCorrupt func(k int64, data []byte)

// push is pushRun bounded by -D (session.bounded).
func (s *session) push(ctx context.Context, size int64, src source, count int64, deadline time.Time) (report.BW, error) {
	bctx, cancel := s.bounded(ctx)
	defer cancel()
	r0, err := s.pushRun(bctx, size, src, count, deadline)
	return r0, s.boundErr(ctx, bctx, err)
}

// pushRun is the source side of a WRITE or SEND stream: count messages, or
// with count < 0 as many as fit before deadline. It returns the messages
// sent.
func (s *session) pushRun(ctx context.Context, size int64, src source, count int64, deadline time.Time) (report.BW, error) {
	qp, rem := s.qps[0], &s.remote[0]
	n := int64(ringSlots(&s.p, size))
	write := s.test.verb() == verbWrite
	for j := range n + 4 {
		if _, err := qp.PostRecv(softrdma.RecvWR{WRID: wrid(kindRecv, 0, j)}); err != nil {
			return report.BW{}, fmt.Errorf("post recv: %w", err)
		}
	}
	var k, acked, consumed int64 // k: data messages posted; acked: WRs completed
	eos := false
	sgl := make([]softrdma.SGE, 1)
	pl := s.newPoller()
	peak := report.NewPeakTracker(size, peakWindow(n, count, 0))
	start := time.Now()
	last := start
	post := func(wr softrdma.SendWR) error {
		if write {
			wr.Opcode = softrdma.WRRDMAWriteWithImm
			wr.RKey = rem.RKey
		} else {
			wr.Opcode = softrdma.WRSendWithImm
		}
		_, err := qp.PostSend(wr)
		if err != nil {
			return fmt.Errorf("post send: %w", err)
		}
		return nil
	}
	for {
		postedAny := false
		for !eos && k-consumed < n && k-acked < n {
			if count >= 0 && k == count || count < 0 && time.Now().After(deadline) {
				if err := post(softrdma.SendWR{WRID: wrid(kindEOS, 0, k), Flags: softrdma.SendSignaled,
					ImmData: immEOS | uint32(k)&immMask, RemoteAddr: rem.VAddr}); err != nil {
					return report.BW{}, err
				}
				eos, postedAny = true, true
				break
			}
			off := int(k%n) * int(size)
			m, err := src.fill(k, s.local(0)[off:off+int(size)])
			if err != nil {
				return report.BW{}, err
			}
			wr := softrdma.SendWR{WRID: wrid(kindData, 0, k), Flags: softrdma.SendSignaled,
				ImmData: uint32(k) & immMask, RemoteAddr: rem.VAddr + uint64(off)}
			if m > 0 {
				sgl[0] = s.sge(0, off, m)
				wr.SGL = sgl
			}
			if m <= s.p.Inline {
				wr.Flags |= softrdma.SendInline
			}
			if err := post(wr); err != nil {
				return report.BW{}, err
			}
			k++
			postedAny = true
		}
		if eos && acked == k+1 {
			break
		}
		wcs, err := pl.poll(ctx, !postedAny)
		if err != nil {
			return report.BW{}, err
		}
		now := time.Now()
		for i := range wcs {
			wc := &wcs[i]
			if err := checkWC(wc); err != nil {
				return report.BW{}, err
			}
			switch wridKind(wc.WRID) {
			case kindRecv: // a credit
				consumed = advance(consumed, wc.ImmData)
				if _, err := qp.PostRecv(softrdma.RecvWR{WRID: wc.WRID}); err != nil {
					return report.BW{}, fmt.Errorf("post recv: %w", err)
				}
			case kindData:
				acked = wridIdx(wc.WRID) + 1
				last = now
				peak.Add(now, acked)
				s.idle.Done(acked)
			case kindEOS:
				acked = wridIdx(wc.WRID) + 1
			}
		}
	}
	r := report.BW{Bytes: size, Iterations: k, Elapsed: last.Sub(start)}
	r.PeakBps = streamPeak(count < 0, peak, r.AvgBps())
	return r, nil
}

// pull is the sink side of a WRITE or SEND stream. lenOf gives the length
// of message k of a WRITE stream (a SEND's is the receive's byte count).
func (s *session) pull(ctx context.Context, size int64, snk sink, lenOf func(k int64) int, count int64) (report.BW, error) {
	qp := s.qps[0]
	n := int64(ringSlots(&s.p, size))
	send := s.test.verb() == verbSend
	recv := func(j int64) error {
		wr := softrdma.RecvWR{WRID: wrid(kindRecv, 0, j)}
		if send {
			wr.SGL = []softrdma.SGE{s.sge(0, int(j)*int(size), int(size))}
		}
		if _, err := qp.PostRecv(wr); err != nil {
			return fmt.Errorf("post recv: %w", err)
		}
		return nil
	}
	for j := range n {
		if err := recv(j); err != nil {
			return report.BW{}, err
		}
	}
	sq, _ := s.queueDepths(size)
	var consumed, credited int64
	creditsOut := 0
	pl := s.newPoller()
	peak := report.NewPeakTracker(size, n)
	rc := recvClock{s: s}
	// The loop ends at the end of stream once the credits sent have
	// completed too (their ACKs came), as readFetch's: a run that
	// returned before destroyed the QP under a credit whose ACK, or whose
	// retransmission on a loaded machine, then met no QP (the demo's
	// drop_unknown_qpn). The source acknowledges them: its QP stays until
	// this side's result.
	for done := false; !done || creditsOut > 0; {
		wcs, err := pl.poll(ctx, true)
		if err != nil {
			return report.BW{}, err
		}
		now := s.clock()
		for i := range wcs {
			wc := &wcs[i]
			if err := checkWC(wc); err != nil {
				return report.BW{}, err
			}
			if wridKind(wc.WRID) != kindRecv {
				creditsOut--
				continue
			}
			if wc.Flags&softrdma.WCWithImm == 0 {
				return report.BW{}, fmt.Errorf("%w: message %d has no immediate", errProtocol, consumed)
			}
			imm := wc.ImmData
			if imm&immMask != uint32(consumed)&immMask {
				return report.BW{}, fmt.Errorf("%w: message %d arrived, expected %d", errProtocol, imm&immMask, consumed)
			}
			if imm&immEOS != 0 {
				done = true
				continue
			}
			var data []byte
			if send {
				off := int(wridIdx(wc.WRID)) * int(size)
				data = s.local(0)[off : off+int(wc.ByteLen)]
			} else {
				off := int(consumed%n) * int(size)
				data = s.local(0)[off : off+lenOf(consumed)]
			}
			if testCorrupt != nil {
				testCorrupt(consumed, data)
			}
			if err := snk.consume(consumed, data); err != nil {
				return report.BW{}, err
			}
			consumed++
			if err := recv(wridIdx(wc.WRID)); err != nil {
				return report.BW{}, err
			}
			rc.tick(now)
			peak.Add(now, consumed)
			s.idle.Done(consumed)
		}
		// One credit per batch of completions; the end of stream is not
		// credited, and neither is a message once the source can send the
		// rest and its end of stream without more (credited+n > count): a
		// credit the source no longer waits for can reach it after its
		// run ended and its QP is gone (dropped there as for an unknown
		// QPN). With -D the count is not known (-1) and the last credits
		// may still arrive late.
		if !done && consumed > credited && creditsOut < sq-1 && (count < 0 || credited+n <= count) {
			if err := s.credit(qp, consumed); err != nil {
				return report.BW{}, err
			}
			credited = consumed
			creditsOut++
		}
	}
	r := report.BW{Bytes: size, Iterations: consumed, Elapsed: rc.elapsed()}
	r.PeakBps = streamPeak(count < 0, peak, r.AvgBps())
	return r, nil
}

// credit sends a zero-length SEND WITH IMMEDIATE carrying count: a credit
// (sink to source) or an announcement (READ source to sink).
func (s *session) credit(qp *softrdma.QP, count int64) error {
	_, err := qp.PostSend(softrdma.SendWR{WRID: wrid(kindCredit, 0, count), Opcode: softrdma.WRSendWithImm,
		Flags: softrdma.SendSignaled, ImmData: uint32(count)})
	if err != nil {
		return fmt.Errorf("post credit: %w", err)
	}
	return nil
}

// readServe is the source side of a READ stream (read-bw --file on the
// server): it fills slots with the count messages of src, announces them
// and waits until the client consumed them all.
func (s *session) readServe(ctx context.Context, size int64, src source, count int64) error {
	qp := s.qps[0]
	n := int64(ringSlots(&s.p, size))
	for j := range n + 4 {
		if _, err := qp.PostRecv(softrdma.RecvWR{WRID: wrid(kindRecv, 0, j)}); err != nil {
			return fmt.Errorf("post recv: %w", err)
		}
	}
	sq, _ := s.queueDepths(size)
	var filled, published, consumed int64
	notesOut := 0
	pl := s.newPoller()
	for consumed < count {
		for filled < count && filled-consumed < n {
			off := int(filled%n) * int(size)
			if _, err := src.fill(filled, s.local(0)[off:off+int(size)]); err != nil {
				return err
			}
			filled++
		}
		if filled > published && notesOut < sq-1 {
			if err := s.credit(qp, filled); err != nil {
				return err
			}
			published = filled
			notesOut++
		}
		wcs, err := pl.poll(ctx, true)
		if err != nil {
			return err
		}
		for i := range wcs {
			wc := &wcs[i]
			if err := checkWC(wc); err != nil {
				return err
			}
			if wridKind(wc.WRID) != kindRecv {
				notesOut--
				continue
			}
			consumed = advance(consumed, wc.ImmData)
			if _, err := qp.PostRecv(softrdma.RecvWR{WRID: wc.WRID}); err != nil {
				return fmt.Errorf("post recv: %w", err)
			}
		}
	}
	return nil
}

// readFetch is the sink side of a READ stream: it READs every announced
// slot of the server's file of fileSize bytes and consumes it.
func (s *session) readFetch(ctx context.Context, size int64, snk sink, fileSize int64) (report.BW, error) {
	qp, rem := s.qps[0], &s.remote[0]
	n := int64(ringSlots(&s.p, size))
	count := chunks(fileSize, size)
	for j := range n + 4 {
		if _, err := qp.PostRecv(softrdma.RecvWR{WRID: wrid(kindRecv, 0, j)}); err != nil {
			return report.BW{}, fmt.Errorf("post recv: %w", err)
		}
	}
	sq, _ := s.queueDepths(size)
	var published, posted, consumed, credited int64
	creditsOut := 0
	sgl := make([]softrdma.SGE, 1)
	pl := s.newPoller()
	peak := report.NewPeakTracker(size, peakWindow(n, count, 0))
	start := time.Now()
	last := start
	// The loop ends once the last credit has completed too: a run that
	// returned before its ACK came destroyed the QP under it, and the ACK
	// was dropped at this side as for an unknown QPN (the demo's
	// drop_unknown_qpn). The peer waits for that credit, so it comes.
	for consumed < count || credited < consumed || creditsOut > 0 {
		for posted < published {
			off := int(posted%n) * int(size)
			sgl[0] = s.sge(0, off, chunkLen(posted, fileSize, size))
			if _, err := qp.PostSend(softrdma.SendWR{WRID: wrid(kindData, 0, posted), Opcode: softrdma.WRRDMARead,
				Flags: softrdma.SendSignaled, SGL: sgl, RemoteAddr: rem.VAddr + uint64(off), RKey: rem.RKey}); err != nil {
				return report.BW{}, fmt.Errorf("post READ: %w", err)
			}
			posted++
		}
		if consumed > credited && creditsOut < sq-1-int(n) {
			if err := s.credit(qp, consumed); err != nil {
				return report.BW{}, err
			}
			credited = consumed
			creditsOut++
		}
		wcs, err := pl.poll(ctx, true)
		if err != nil {
			return report.BW{}, err
		}
		now := time.Now()
		for i := range wcs {
			wc := &wcs[i]
			if err := checkWC(wc); err != nil {
				return report.BW{}, err
			}
			switch wridKind(wc.WRID) {
			case kindRecv: // an announcement
				published = advance(published, wc.ImmData)
				if published > count {
					return report.BW{}, fmt.Errorf("%w: %d messages announced, the file has %d", errProtocol, published, count)
				}
				if _, err := qp.PostRecv(softrdma.RecvWR{WRID: wc.WRID}); err != nil {
					return report.BW{}, fmt.Errorf("post recv: %w", err)
				}
			case kindData:
				k := wridIdx(wc.WRID)
				if k != consumed {
					return report.BW{}, fmt.Errorf("%w: READ %d completed, expected %d", errProtocol, k, consumed)
				}
				off := int(k%n) * int(size)
				data := s.local(0)[off : off+chunkLen(k, fileSize, size)]
				if testCorrupt != nil {
					testCorrupt(k, data)
				}
				if err := snk.consume(k, data); err != nil {
					return report.BW{}, err
				}
				consumed++
				last = now
				peak.Add(now, consumed)
				s.idle.Done(consumed)
			case kindCredit:
				creditsOut--
			}
		}
	}
	r := report.BW{Bytes: size, Iterations: consumed, Elapsed: last.Sub(start)}
	r.PeakBps = peak.Peak(r.AvgBps())
	return r, nil
}

// streamPeak is the BW peak a stream side reports: none (0.00) in a -D
// run (duration: the source sends until -D ends, count < 0), as
// durationPeak for the other BW runs and as perftest, whose -D sets
// noPeak (force_dependecies in perftest_parameters.c). A --file run moves
// a counted file even when -D was given, and reports its peak.
func streamPeak(duration bool, peak *report.PeakTracker, avg float64) float64 {
	if duration {
		return 0
	}
	return peak.Peak(avg)
}
