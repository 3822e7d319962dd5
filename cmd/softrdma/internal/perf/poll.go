package perf

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/idlewatch"
)

// Work request IDs carry what a completion is for: a kind, the QP's index
// and the message's index.
const (
	kindData   uint64 = iota // a data message (WRITE, READ, SEND, atomic)
	kindCredit               // a stream credit or notification SEND
	kindRecv                 // a receive
	kindEOS                  // a stream's end-of-stream message
)

const (
	wridIdxBits = 40
	wridQPBits  = 20
)

func wrid(kind uint64, qp int, idx int64) uint64 {
	return kind<<(wridIdxBits+wridQPBits) | uint64(qp)<<wridIdxBits | uint64(idx)&(1<<wridIdxBits-1)
}

func wridKind(w uint64) uint64 { return w >> (wridIdxBits + wridQPBits) }
func wridQP(w uint64) int      { return int(w >> wridIdxBits & (1<<wridQPBits - 1)) }
func wridIdx(w uint64) int64   { return int64(w & (1<<wridIdxBits - 1)) }

// poller polls a CQ into a reusable array.
type poller struct {
	cq   *softrdma.CQ
	wcs  []softrdma.WC
	idle *idlewatch.Watch // notified of every batch of completions (nil: none)
}

func newPoller(cq *softrdma.CQ) *poller { return &poller{cq: cq, wcs: make([]softrdma.WC, 64)} }

// newPoller returns a poller of the round's CQ that restarts the idle
// watch of the run (if any) on every completion.
func (s *session) newPoller() *poller {
	p := newPoller(s.cq)
	p.idle = s.idle
	return p
}

// poll returns the completions queued; with block it waits for at least
// one (ibv_req_notify_cq + ibv_get_cq_event).
func (p *poller) poll(ctx context.Context, block bool) ([]softrdma.WC, error) {
	n, err := p.cq.Poll(p.wcs)
	if n > 0 || err != nil || !block {
		if n > 0 {
			p.idle.Progress()
		}
		return p.wcs[:n], err
	}
	n, err = p.cq.Wait(ctx, p.wcs)
	if n > 0 {
		p.idle.Progress()
	}
	return p.wcs[:n], err
}

// spinFor is how long the latency tools busy-poll before they block. A
// NIC in software needs the CPU that a poller spins on: on a machine with
// few cores, a poller that never blocks delays the packet it waits for by
// a scheduler time slice (milliseconds), so the tools spin for about one
// loopback round trip and then block (perftest spins without limit, which
// suits a hardware NIC).
const spinFor = 50 * time.Microsecond

// spin busy-polls for up to spinFor, yielding the processor between
// polls, then waits for a completion.
func (p *poller) spin(ctx context.Context) ([]softrdma.WC, error) {
	var start time.Time
	for i := 0; ; i++ {
		n, err := p.cq.Poll(p.wcs)
		if n > 0 || err != nil {
			if n > 0 {
				p.idle.Progress()
			}
			return p.wcs[:n], err
		}
		if i&15 == 15 {
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > spinFor {
				return p.poll(ctx, true)
			}
		}
		runtime.Gosched()
	}
}

// backoff paces a loop that polls memory, which has no completion to
// block on: it yields the processor for spinFor, then sleeps a little
// longer each time, up to maxNap, so that the NIC's goroutines get a CPU.
type backoff struct {
	n     int
	start time.Time
	nap   time.Duration
}

const maxNap = 50 * time.Microsecond

func (b *backoff) wait() {
	b.n++
	if b.n&15 == 15 && b.nap == 0 {
		if b.start.IsZero() {
			b.start = time.Now()
		} else if time.Since(b.start) > spinFor {
			b.nap = time.Microsecond
		}
	}
	if b.nap == 0 {
		runtime.Gosched()
		return
	}
	time.Sleep(b.nap)
	b.nap = min(2*b.nap, maxNap)
}

// untilClosed returns a context that ends with ctx or when ch is closed.
func untilClosed(ctx context.Context, ch <-chan struct{}) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-ch:
			cancel()
		case <-c.Done():
		}
	}()
	return c, cancel
}

// peakWindow is the number of messages over which the peak bandwidth is
// measured: at least least, and a sixteenth of a run of known length, so
// that a burst of completions read in one poll does not pass for a rate.
func peakWindow(least, count int64, duration time.Duration) int64 {
	if duration > 0 || count < 0 {
		return least
	}
	return max(least, count/16)
}

// drainLimit is how long a -D run waits, after its duration, for the work
// requests still outstanding: at least drainMin, and at least the
// duration. The QPs retry for ever (retry_cnt 7 as on rxe), so without a
// bound a peer that died or a path that lost everything would keep the
// run going.
func drainLimit(d time.Duration) time.Duration { return max(drainMin, d) }

// drainMin is the least drainLimit (a variable for the tests).
var drainMin = 10 * time.Second

// bounded returns ctx limited to the -D duration plus drainLimit, or ctx
// itself without -D (an -n run waits as long as perftest does).
func (s *session) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.p.Duration <= 0 {
		return ctx, func() {}
	}
	d := s.p.Duration + drainLimit(s.p.Duration)
	s.boundUsed = true
	s.boundEnd.Store(time.Now().Add(d).UnixNano())
	bctx, cancel := context.WithTimeout(ctx, d)
	s.rcvdAtDrain.Store(-1)
	var atDrain *time.Timer
	if s.dev != nil {
		rx := &s.dev.Counters().RcvdPkts
		atDrain = time.AfterFunc(s.p.Duration, func() { s.rcvdAtDrain.Store(int64(rx.Load())) })
	}
	return bctx, func() {
		if atDrain != nil {
			atDrain.Stop()
		}
		s.boundEnd.Store(0)
		cancel()
	}
}

// draining reports whether this side's run is bounded (-D) and its
// duration has passed: it is waiting, for at most the rest of drainLimit,
// for its work requests still outstanding.
func (s *session) draining() bool {
	end := s.boundEnd.Load()
	return end != 0 && time.Now().UnixNano() >= end-int64(drainLimit(s.p.Duration))
}

// boundErr explains the expiry of bctx, the bounded context of parent
// (not of the parent's own deadline; the parent may have been cancelled
// since, when the peer gave up at the same time); any other error is
// returned as it is.
func (s *session) boundErr(parent, bctx context.Context, err error) error {
	if s.p.Duration > 0 && errors.Is(err, context.DeadlineExceeded) && boundFirst(parent, bctx) {
		return s.drainError()
	}
	return err
}

// boundFirst reports whether bctx's own deadline, not its parent's,
// ended it. Both may have passed by the time the run returns (a loaded
// machine kept it from the CPU past the parent's later one,
// resultBound's): the earlier deadline is the one that expired.
func boundFirst(parent, bctx context.Context) bool {
	if !errors.Is(bctx.Err(), context.DeadlineExceeded) {
		return false
	}
	if !errors.Is(parent.Err(), context.DeadlineExceeded) {
		return true
	}
	pd, ok := parent.Deadline()
	bd, _ := bctx.Deadline() // (the parent's when it is the earlier)
	return !ok || bd.Before(pd)
}

// drainError describes the expiry of this side's -D drain limit, with the
// packets received from the peer while it drained.
func (s *session) drainError() *drainError {
	e := &drainError{d: s.p.Duration, drain: drainLimit(s.p.Duration), role: "server", peer: s.peerLabel(), start: s.roundStart}
	if s.server {
		e.role = "client"
	}
	if v := s.rcvdAtDrain.Load(); v >= 0 && s.dev != nil {
		e.rcvdDuring = int64(s.dev.Counters().RcvdPkts.Load()) - v
	}
	return e
}

// drainError is the expiry of a -D run's drain limit (session.bounded):
// the work requests still outstanding drain after the duration did not
// complete. round fills in what followed: whether the peer's result then
// came (resultWait, noResult) and how long this side waited in all
// (waited, measured from the round's start, not computed from the
// limits). It reads without Go's "context deadline exceeded".
type drainError struct {
	d, drain time.Duration
	// role and peer name the other side: "server" or "client" (the
	// message is also printed by the other side after "peer: ", where
	// "the peer" would name the side printing it), and its exchange's
	// "IP:PORT", or the -R peer's IP.
	role, peer string
	start      time.Time // the round's start (its run, after the barrier)
	// rcvdDuring is the packets the device received while it drained:
	// the path was delivering, only not fast enough (0: none, or unknown).
	rcvdDuring int64
	// Set by round once the wait for the peer's result is over.
	noResult   bool          // the peer's result did not come either
	resultWait time.Duration // how long it was waited for
	waited     time.Duration // from start to the end of that wait
}

func (e *drainError) Error() string {
	total := ""
	if e.waited > 0 {
		total = fmt.Sprintf(", %.1fs waited in all", e.waited.Seconds())
	}
	role := cmp.Or(e.role, "peer")
	if e.noResult {
		return fmt.Sprintf("-D %v: the work requests still outstanding did not complete within %v after the run, "+
			"and no result came from the %s at %s in the %v after that (%v + %v + %v allowed%s): "+
			"the %s or the path to it is probably dead (the QPs retry for ever, retry_cnt 7 as on rxe; "+
			"each wait is max(10s, -D))", e.d, e.drain, role, e.peer, e.resultWait, e.d, e.drain, e.resultWait, total, role)
	}
	if e.rcvdDuring > 0 {
		return fmt.Sprintf("-D %v: the work requests still outstanding did not all complete within %v after the run "+
			"(%v + %v allowed%s), though the %s at %s was still sending (%d packets received during the wait): "+
			"the path is slow, not dead (loss, --impair, a -u close to the round trip); "+
			"fewer outstanding (-t) or smaller messages (-s) drain sooner (the wait is max(10s, -D))",
			e.d, e.drain, e.d, e.drain, total, role, e.peer, e.rcvdDuring)
	}
	return fmt.Sprintf("-D %v: the work requests still outstanding did not complete within %v after the run "+
		"(%v + %v allowed%s): is the %s at %s alive? (the QPs retry for ever, retry_cnt 7 as on rxe; "+
		"the wait is max(10s, -D))", e.d, e.drain, e.d, e.drain, total, role, e.peer)
}

// Unwrap returns context.DeadlineExceeded: the drain limit expired
// (errors.Is works; the text does not say it).
func (e *drainError) Unwrap() error { return context.DeadlineExceeded }

// peerLabel names the peer in messages: the exchange's "IP:PORT" over
// TCP, else (-R) the peer's IP.
func (s *session) peerLabel() string {
	if s.peerTCP != "" {
		return s.peerTCP
	}
	if s.tcpRemote.IsValid() {
		return s.tcpRemote.String()
	}
	return "?"
}

// watchIdle returns ctx, cancelled once o.IdleTimeout passes without
// progress, and the watch (idlewatch); without an idle timeout, or in a -D
// run (bounded by its drain limit instead), ctx itself and a nil watch.
// Progress is a completion the run's loops note, or a packet the device
// received (rcvd_pkts): a side posting the work sees ACKs long before a
// completion when few WRs are signaled (-Q) and messages are large
// (write-bw -s 1G -n 5 signals only its last WRITE: 5 GiB, about 20 s at
// 250 MB/s, with ACKs all along), and such a run is slow, not dead; a
// dead peer or path sends nothing.
func (s *session) watchIdle(ctx context.Context) (context.Context, *idlewatch.Watch) {
	if s.p.Duration > 0 {
		return ctx, nil
	}
	var rcvd func() uint64
	if s.dev != nil {
		rx := &s.dev.Counters().RcvdPkts
		rcvd = rx.Load
	}
	return idlewatch.StartWith(ctx, s.o.IdleTimeout, rcvd)
}

// Where --idle-timeout applies: the part of a round (-n) that waits for
// completions, over TCP or -R, with softrdma's or perftest's exchange
// (watchIdle); a passive side's wait for its peer's result (watchPassive),
// and, with -R, every message this side sends over the exchange
// (boundWrites). Where it does not, and why:
//   - -D runs: bounded by their drain limit (drainLimit, session.bounded)
//     and, on the side that waits for the peer's run to end, by
//     resultBound instead.
//   - With -R, a wait to receive a message of the exchange outside a
//     round's run (the server's wait for the hello, the client's for the
//     reply, a barrier) is not bounded: there are no completions or data
//     packets to watch and the channel has no keep-alive. (At a barrier
//     each side sends first, and that send is bounded.)

// watchPassive is watchIdle for a side with no completions of its own
// (passive: the server of write-bw, read-bw, atomic-bw and read-lat),
// which waits for its peer's result to end the round. Its progress is a
// packet received by its device (the peer's requests, retried for ever
// while the peer lives and the path carries them). The peer's result
// does not always come: with -R the exchange runs over the same path as
// the data; perftest's exchange has no message for a failure; and over
// TCP a link that died takes the exchange's connection with it, which
// TCP gives up on only after its retransmission timeout (about 150 s).
// (This was once left to the peer's result over TCP, on the grounds that
// TCP does not take the RoCEv2 path: when the whole link dies, it does.)
//
// A healthy run is not cut: the peer's packets keep coming until its
// last completion, and its result follows at once; the result ends the
// wait whenever it arrives, even as the watch expires (runSide). The
// peer's checks (--verify) happen per completion, during the run.
func (s *session) watchPassive(ctx context.Context) (context.Context, *idlewatch.Watch) {
	// (watchIdle's watch counts the device's received packets as
	// progress, on every side.)
	return s.watchIdle(ctx)
}

// passiveIdleErr is the error of a passive side's run that watchPassive
// ended.
func (s *session) passiveIdleErr(w *idlewatch.Watch) error {
	var what, why string
	switch {
	case s.ch != nil:
		why = "with -R the exchange runs over that path too, so the peer cannot say it"
	case s.pt != nil:
		why = "perftest's exchange cannot say that the peer's run failed"
	default:
		what = " and no result from it over the exchange"
		why = "a link that died takes the exchange's TCP connection with it"
	}
	return fmt.Errorf("nothing received from the peer for %v (--idle-timeout) during the run%s: "+
		"the peer or the path to it is probably dead (%s; --idle-timeout 0 waits for ever)", w.Limit(), what, why)
}

// idleErr is the error of a run that the watch ended: asked is the
// number of iterations the run was to do (all QPs').
// The count is what the user asked for (session.asked): -n (× -q), or,
// for a file stream, the file's messages: "(--file disk.iso: 1048576
// bytes in 65536-byte messages)", never an -n the user did not give.
func (s *session) idleErr(w *idlewatch.Watch, asked int64, size int64) error {
	what, n := "iterations", fmt.Sprintf("-n %d", s.p.Iters)
	switch {
	case s.streams() && s.fileSize >= 0:
		what = "messages"
		file := "the peer's --file"
		if s.o.File != "" {
			file = "--file " + s.o.File
		}
		n = fmt.Sprintf("%s: %d bytes in %d-byte messages", file, s.fileSize, size)
	case asked != s.p.Iters && s.p.QPs > 1:
		n += fmt.Sprintf(" × -q %d", s.p.QPs)
	}
	return fmt.Errorf("no completion for %v (--idle-timeout) after %d of %d %s (%s): "+
		"the peer or the path to it is probably dead (the QPs retry for ever, retry_cnt 7 as on rxe; "+
		"--idle-timeout 0 waits for ever)", w.Limit(), w.Count(), asked, what, n)
}
