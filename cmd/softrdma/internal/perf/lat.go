package perf

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
)

// maxSize is the largest message size of the run.
func (s *session) maxSize() int64 {
	var m int64
	for _, n := range s.p.Sizes() {
		m = max(m, n)
	}
	return m
}

// pingPong is pingPongRun bounded by -D (session.bounded).
func (s *session) pingPong(ctx context.Context, size int64, target func() (int64, bool), known <-chan struct{}) (report.Lat, int64, error) {
	bctx, cancel := s.bounded(ctx)
	defer cancel()
	r0, r1, err := s.pingPongRun(bctx, size, target, known)
	return r0, r1, s.boundErr(ctx, bctx, err)
}

// pingPongRun runs write-lat or send-lat on either side (perftest's
// run_iter_lat_write and run_iter_lat_send). Each side's region holds a
// receive slot, which the peer writes (or its receives point at), and a
// send slot. The client sends message i, then waits for the server's
// message i; the server waits, then sends. Every side records the time
// between its consecutive sends, halved (perftest's rtt_factor 2).
//
// write-lat waits by polling the last byte of the receive slot for the
// iteration number, as perftest does; with --verify it sends RDMA WRITE
// WITH IMMEDIATE and waits for the receive completion instead, because a
// changed last byte does not mean the rest of the message is in place,
// and then checks the whole message.
//
// The server of a duration run learns from target when the client
// stopped. It returns the latencies and the iterations run.
func (s *session) pingPongRun(ctx context.Context, size int64, target func() (int64, bool), known <-chan struct{}) (report.Lat, int64, error) {
	// wctx ends when a duration run's client stopped, to wake a wait.
	wctx, cancel := untilClosed(ctx, known)
	defer cancel()
	qp, rem := s.qps[0], &s.remote[0]
	stride := slotStride(s.maxSize())
	recvSlot := s.local(0)[:size]
	sendOff := stride
	sendSlot := s.local(0)[sendOff : sendOff+int(size)]
	write := s.test == WriteLat
	// A perftest peer writes plain WRITEs and checks nothing: the polled
	// last byte is all there is.
	verify := s.p.Verify && s.pt == nil
	byCompletion := !write || verify
	client := !s.server
	side, peerSide := int64(0), int64(1)
	if s.server {
		side, peerSide = 1, 0
	}
	postRecv := func(j int64) error { return s.latPostRecv(j, size) }
	if byCompletion && !s.pm.preposted {
		if err := s.latPostRecvs(size); err != nil {
			return report.Lat{}, 0, err
		}
	}
	sq, _ := s.queueDepths(size)
	sendsOut := 0
	pl := s.newPoller()
	chk := checker{seed: s.p.Seed}
	gotRecv := false
	// handle processes completions; a receive sets gotRecv.
	handle := func(wcs []softrdma.WC, i int64) error {
		for j := range wcs {
			wc := &wcs[j]
			if err := checkWC(wc); err != nil {
				return err
			}
			if wridKind(wc.WRID) != kindRecv {
				sendsOut--
				continue
			}
			if gotRecv {
				return fmt.Errorf("%w: two messages in one iteration", errProtocol)
			}
			gotRecv = true
			if write && wc.ImmData != uint32(i) {
				return fmt.Errorf("%w: WRITE WITH IMM %d arrived in iteration %d", errProtocol, wc.ImmData, i)
			}
			if !write && int64(wc.ByteLen) != size {
				return fmt.Errorf("%w: SEND of %d bytes arrived, want %d", errProtocol, wc.ByteLen, size)
			}
			if verify {
				if err := chk.check(recvSlot, 2*i+peerSide, fmt.Sprintf("message %d", i)); err != nil {
					return err
				}
			}
			if err := postRecv(wridIdx(wc.WRID)); err != nil {
				return fmt.Errorf("post recv: %w", err)
			}
		}
		return nil
	}
	sgl := []softrdma.SGE{s.sge(0, sendOff, int(size))}
	send := func(i int64) error {
		// Retire send completions so the send queue never fills.
		for sendsOut > 0 {
			wcs, err := pl.poll(ctx, sendsOut >= sq-2)
			if err != nil {
				return err
			}
			if len(wcs) == 0 {
				break
			}
			if err := handle(wcs, i); err != nil {
				return err
			}
		}
		if verify {
			fillPattern(sendSlot, s.p.Seed, 2*i+side)
		} else {
			sendSlot[size-1] = byte(i)
		}
		wr := softrdma.SendWR{WRID: wrid(kindData, 0, i), SGL: sgl, Flags: softrdma.SendSignaled, RemoteAddr: rem.VAddr, RKey: rem.RKey}
		switch {
		case !write:
			wr.Opcode = softrdma.WRSend
		case verify:
			wr.Opcode = softrdma.WRRDMAWriteWithImm
			wr.ImmData = uint32(i)
		default:
			wr.Opcode = softrdma.WRRDMAWrite
		}
		if size <= int64(s.p.Inline) {
			wr.Flags |= softrdma.SendInline
		}
		if _, err := qp.PostSend(wr); err != nil {
			return fmt.Errorf("post send: %w", err)
		}
		sendsOut++
		return nil
	}
	// wait waits for the peer's message i; errStopped when a duration
	// run's client stopped before it.
	wait := func(i int64) error {
		var b backoff
		for n := 0; ; n++ {
			if byCompletion {
				c := wctx
				if _, ok := target(); ok {
					c = ctx
				}
				wcs, err := pl.spin(c)
				if err != nil && (ctx.Err() != nil || c == ctx) {
					return err
				}
				if err := handle(wcs, i); err != nil {
					return err
				}
				if gotRecv {
					gotRecv = false
					return nil
				}
			} else if loadByte(recvSlot, int(size)-1) == byte(i) {
				s.idle.Progress()
				return nil
			} else {
				b.wait()
			}
			if n&15 == 15 || byCompletion {
				if err := ctx.Err(); err != nil {
					return err
				}
				if t, ok := target(); ok && i > t {
					return errStopped
				}
			}
		}
	}

	lat := report.NewLatRecorder()
	iters := s.p.Iters
	var deadline time.Time
	if s.p.Duration > 0 {
		deadline = time.Now().Add(s.p.Duration)
	}
	// The leader sends message i and then waits for the peer's; the other
	// side waits, then answers. The client leads, except with a perftest
	// peer in write-lat: ib_write_lat's server writes first (and
	// ib_send_lat's client sends first), as the captures show.
	leader := client
	if s.pt != nil && write {
		leader = s.server
	}
	var prev time.Time
	var i int64
	for i = 1; ; i++ {
		if client && (deadline.IsZero() && i > iters || !deadline.IsZero() && time.Now().After(deadline)) ||
			s.server && deadline.IsZero() && i > iters {
			break
		}
		if !leader {
			if err := wait(i); err == errStopped {
				break
			} else if err != nil {
				return report.Lat{}, 0, err
			}
		}
		now := time.Now()
		if err := send(i); err != nil {
			return report.Lat{}, 0, err
		}
		if i > 1 {
			lat.Record(now.Sub(prev) / 2)
		}
		prev = now
		if leader {
			if err := wait(i); err != nil {
				return report.Lat{}, 0, err
			}
		}
		s.idle.Done(i)
	}
	// Let the last sends complete before the round ends.
	for sendsOut > 0 {
		wcs, err := pl.poll(ctx, true)
		if err != nil {
			return report.Lat{}, 0, err
		}
		if err := handle(wcs, i); err != nil {
			return report.Lat{}, 0, err
		}
	}
	return lat.Result(size, i-1), i - 1, nil
}

// latRecvs is the number of receives a latency test keeps posted.
const latRecvs = 16

// latPostRecv posts receive j of a latency test: into the receive slot for
// send-lat, without buffer for write-lat's WRITE WITH IMMEDIATE.
func (s *session) latPostRecv(j, size int64) error {
	wr := softrdma.RecvWR{WRID: wrid(kindRecv, 0, j)}
	if s.test != WriteLat {
		wr.SGL = []softrdma.SGE{s.sge(0, 0, int(size))}
	}
	_, err := s.qps[0].PostRecv(wr)
	return err
}

// latPostRecvs posts a latency test's receives.
func (s *session) latPostRecvs(size int64) error {
	for j := range int64(latRecvs) {
		if err := s.latPostRecv(j, size); err != nil {
			return fmt.Errorf("post recv: %w", err)
		}
	}
	return nil
}

// readLat is readLatRun bounded by -D (session.bounded).
func (s *session) readLat(ctx context.Context, size int64) (report.Lat, int64, error) {
	bctx, cancel := s.bounded(ctx)
	defer cancel()
	r0, r1, err := s.readLatRun(bctx, size)
	return r0, r1, s.boundErr(ctx, bctx, err)
}

// readLatRun runs read-lat on the client (perftest's run_iter_lat for READ):
// one READ at a time, timing each round trip (rtt_factor 1). With
// --verify each READ is checked against the pattern the server wrote.
func (s *session) readLatRun(ctx context.Context, size int64) (report.Lat, int64, error) {
	qp, rem := s.qps[0], &s.remote[0]
	pl := s.newPoller()
	chk := checker{seed: s.p.Seed}
	sgl := []softrdma.SGE{s.sge(0, 0, int(size))}
	lat := report.NewLatRecorder()
	var deadline time.Time
	if s.p.Duration > 0 {
		deadline = time.Now().Add(s.p.Duration)
	}
	var ref []byte // perftest peer, --verify: the first READ
	var i int64
	for ; deadline.IsZero() && i < s.p.Iters || !deadline.IsZero() && time.Now().Before(deadline); i++ {
		t0 := time.Now()
		if _, err := qp.PostSend(softrdma.SendWR{WRID: wrid(kindData, 0, i), Opcode: softrdma.WRRDMARead, SGL: sgl,
			Flags: softrdma.SendSignaled, RemoteAddr: rem.VAddr, RKey: rem.RKey}); err != nil {
			return report.Lat{}, 0, fmt.Errorf("post READ: %w", err)
		}
		wcs, err := pl.spin(ctx)
		if err != nil {
			return report.Lat{}, 0, err
		}
		lat.Record(time.Since(t0))
		s.idle.Done(i + 1)
		if err := checkWC(&wcs[0]); err != nil {
			return report.Lat{}, 0, err
		}
		switch {
		case s.p.Verify && s.pt != nil: // against the first READ (see perftest.go)
			got := s.local(0)[:size]
			if ref == nil {
				ref = bytes.Clone(got)
			} else if k := firstDiff(got, ref); k >= 0 {
				return report.Lat{}, 0, &MismatchError{What: fmt.Sprintf("READ %d against the first READ", i),
					Offset: int64(k), Got: got[k], Want: ref[k], Message: i}
			}
		case s.p.Verify:
			if err := chk.check(s.local(0)[:size], 0, fmt.Sprintf("READ %d", i)); err != nil {
				return report.Lat{}, 0, err
			}
		}
	}
	if s.p.Verify && s.pt != nil {
		s.pm.checked = append(s.pm.checked, fmt.Sprintf("%d READs of %d bytes equal the first", i, size))
	}
	return lat.Result(size, i), i, nil
}
