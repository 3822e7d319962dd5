package perf

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/exchange"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/hostaddr"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/idlewatch"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
)

// Result is what a run produced: the report it printed (as JSON).
type Result struct {
	Report report.JSON
}

// reply is the server's answer to the client's hello.
type reply struct {
	// FileSize is the size of the server's --file (read-bw), -1 if none.
	FileSize int64 `json:"file_size"`
	// MTU is the path MTU both sides use (check_mtu): the smaller of the
	// client's in the hello and the server's own. 0 from a server that
	// predates it: the client keeps its own, which that server adopted.
	MTU int `json:"mtu,omitempty"`
}

// roundResult is what each side reports after running one size.
type roundResult struct {
	BW     *report.BW  `json:"bw,omitempty"`
	Lat    *report.Lat `json:"lat,omitempty"`
	Counts []int64     `json:"counts,omitempty"` // messages completed per QP
	SHA256 string      `json:"sha256,omitempty"` // of the file bytes sent or received
	Bytes  int64       `json:"bytes"`            // file bytes sent or received
	// ODP is the sender's ODP report after the round (nil: its buffer is
	// pinned), so that each side can print the other's.
	ODP *report.ODPJSON `json:"odp,omitempty"`
	Err string          `json:"err,omitempty"`
}

// verdict is the last word of a round: each side's checks of the other's
// result (file digests, atomic counters).
type verdict struct {
	Err string `json:"err,omitempty"`
}

// ErrUsage marks the errors of Run (and of the demo) that come from a bad
// command line: options that do not fit together, a --file that cannot be
// read, a bad --impair or --bind. The CLI exits with 2 for them.
var ErrUsage = errors.New("bad command line")

// usageError is an error of the command line: it reads as err and is
// ErrUsage for errors.Is.
type usageError struct{ err error }

func usage(err error) error               { return usageError{err} }
func (e usageError) Error() string        { return e.err.Error() }
func (e usageError) Unwrap() error        { return e.err }
func (e usageError) Is(target error) bool { return target == ErrUsage }

// Run runs one tool: the server when o.Server is "", else the client. It
// prints the report to o.Stdout and returns an error if the test could not
// run, a verification failed (errors.Is(err, ErrMismatch)) or the options
// do not fit together (errors.Is(err, ErrUsage)).
func Run(ctx context.Context, o *Options) (*Result, error) {
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if !o.Test.valid() {
		return nil, fmt.Errorf("unknown test %d", o.Test)
	}
	if _, err := ParseImpair(o.Impair); err != nil {
		return nil, usage(err)
	}
	if _, _, err := ParseBind(o.Bind); err != nil {
		return nil, usage(err)
	}
	if err := o.ODP.Validate(); err != nil {
		return nil, usage(err)
	}
	s := &session{o: o, test: o.Test, server: o.Server == "", fileSize: -1, runCtx: ctx}
	if o.ReportGbits {
		s.unit = report.Gbps
	}
	s.json = report.JSON{Tool: o.Test.String(), Side: "client", Unit: s.unit.JSONUnit(o.Test.IsLat())}
	if s.server {
		s.json.Side = "server"
	}
	defer s.close()
	err := s.openFiles()
	if err == nil && !s.server {
		err = s.checkMaxMem()
	}
	if err == nil {
		err = s.openBoundDevice()
	}
	if err == nil {
		switch {
		case o.RDMACM && s.server:
			err = s.runServerCM(ctx)
		case o.RDMACM:
			err = s.runClientCM(ctx)
		case s.server:
			err = s.runServer(ctx)
		default:
			err = s.runClient(ctx)
		}
	}
	if s.dev != nil {
		s.json.ODP = s.odpReport()
		// The counters are read once the device is closed: the ACKs of
		// the receive loop's last batch and the CM's last DREQ or DREP
		// may leave only then (a completion is visible before its ACK is
		// sent, as on rxe).
		peer := s.peerAddr()
		s.close()
		s.json.Counters = nonZeroCounters(s)
		if o.Stat && !o.JSON {
			s.printStat(o.Stdout, peer)
		}
	}
	s.close()
	err = s.finishOut(err)
	// A capture the user asked for that could not be written (a full
	// disk, /dev/full) fails a run that otherwise passed; after a
	// failure it is said on stderr.
	if s.tapErr != nil && err == nil {
		err = s.tapErr
	} else if s.tapErr != nil {
		s.logf("softrdma: %v", s.tapErr)
	}
	if err != nil {
		s.json.Error = err.Error()
	}
	s.json.PeerODP = s.peerODP
	if o.JSON {
		if werr := report.WriteJSON(o.Stdout, &s.json); werr != nil && err == nil {
			err = werr
		}
	}
	return &Result{Report: s.json}, err
}

// peerMsg is the peer's result of a round, or why it could not be read.
type peerMsg struct {
	r   roundResult
	err error
}

// deliverPeerResult hands the peer's result of a round (or why it could
// not be read) to the round: first into peerc (capacity 1), then it
// closes spoke, then it calls stop (which cancels the run when the peer
// failed). In that order: a run that ends because spoke closed or its
// context was cancelled finds the result already in peerc, so that
// peerResult with a limit of 0 (resultWait after the passive side's
// grace) cannot miss it. Closing spoke first once let a loaded machine
// end the passive side's run with a bare "context canceled" instead of
// the peer's story.
func deliverPeerResult(pm peerMsg, peerc chan<- peerMsg, spoke chan struct{}, stop func()) {
	peerc <- pm
	close(spoke)
	stop()
}

// peerResult waits for the peer's result of a round, after this side's
// run. It waits as long as it takes (as perftest, until TCP gives up)
// when this side's -n run succeeded: its peer's run is then over or
// about to be (a passive peer waits for this side's result). Otherwise at
// most limit (resultWait), so that a peer whose host or path died while
// the TCP connection stays open does not keep the run going; waited is
// false when that limit passed.
func (s *session) peerResult(peerc <-chan peerMsg, limit time.Duration) (pm peerMsg, waited bool) {
	if limit < 0 {
		return <-peerc, true
	}
	select {
	case pm = <-peerc: // already there: a limit of 0 must not lose it to the timer
		return pm, true
	default:
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case pm = <-peerc:
		return pm, true
	case <-t.C:
		return peerMsg{}, false
	}
}

// peerGrace is how long a side whose own idle watch (--idle-timeout)
// ended its run still waits for the peer's result, for the peer's side of
// the story: a peer whose exchange still works sends it at once (its own
// watch fired too, or it learns of this side's failure); a dead link
// would otherwise add drainLimit to a limit that said 10s. A variable
// for the tests.
var peerGrace = time.Second

// resultWait is the limit of peerResult after this side's run ended with
// runErr: none (-1) for a -n run that succeeded; peerGrace after this
// side's idle watch fired; nothing more (0) when the wait for the
// result is what failed (the -D bound of resultBound); else drainLimit,
// the time -D gives the peer's result (docs/cli.md).
func (s *session) resultWait(runErr error, idleFired bool) time.Duration {
	var nr *noResultError
	switch {
	case runErr == nil && s.p.Duration <= 0:
		return -1
	case errors.As(runErr, &nr):
		return 0
	case idleFired && s.passive() && s.resultCanCome():
		return 0 // runSide's passive wait gave it peerGrace already
	case idleFired:
		return min(peerGrace, drainLimit(s.p.Duration))
	}
	return drainLimit(s.p.Duration)
}

// resultBound returns ctx limited, in a -D run, to the time this side
// may wait for the end of the peer's run: the duration, then drainLimit
// for the peer's work requests still outstanding and as long again for
// its result to arrive over the exchange (docs/cli.md, -D). A side that
// only serves (write-bw, read-bw, atomic-bw, read-lat), the send-bw
// receiver and a stream's sink end their run on the peer's result or its
// last message, and a link that died takes the exchange's TCP connection
// with it: without this, they waited for TCP to give up (about 150 s).
// The sides that post the work are bounded sooner (session.bounded).
func (s *session) resultBound(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.p.Duration <= 0 {
		return ctx, func() {}
	}
	limit := s.p.Duration + 2*drainLimit(s.p.Duration)
	return context.WithTimeoutCause(ctx, limit, &noResultError{d: s.p.Duration, limit: limit, drain: drainLimit(s.p.Duration)})
}

// noResultError is the expiry of resultBound: the peer's -D run did not
// end in the time it had.
type noResultError struct {
	d, limit, drain time.Duration
}

func (e *noResultError) Error() string {
	return fmt.Sprintf("-D %v: the peer's run did not end and no result came from it within %v "+
		"(the duration, %v for its work requests still outstanding, and %v for its result): "+
		"the peer or the path to it is probably dead (a link that died takes the exchange's TCP connection with it)",
		e.d, e.limit, e.drain, e.drain)
}

// checkBindable tells a server with --bind IP[:PORT] at once, before it
// waits for a client, that the device could not bind there: an IP that is
// not this host's, or (with an explicit port) a UDP port in use. It binds
// a UDP socket there and closes it; the device binds again once a client
// came (and, without a port, falls back from 4791 to an ephemeral port).
func checkBindable(bind string) error {
	ap, hasPort, err := ParseBind(bind)
	if err != nil || !ap.Addr().IsValid() {
		return err
	}
	if !hasPort {
		ap = netip.AddrPortFrom(ap.Addr(), 0)
	}
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
	if err != nil {
		return fmt.Errorf("--bind %s: the device cannot bind there: %w", bind, err)
	}
	return c.Close()
}

// openFiles checks that --file and --out are on the right side and opens
// the file to send. Its refusals are ErrUsage.
func (s *session) openFiles() error {
	o := s.o
	if (o.File != "" || o.Out != "") && s.test.IsLat() {
		return usage(errors.New("--file and --out are for the BW tools (write-bw, read-bw, send-bw)"))
	}
	if (o.File != "" || o.Out != "") && s.test == AtomicBW {
		return usage(errors.New("--file and --out do not apply to atomic-bw"))
	}
	sourceIsServer := s.test.fileFromServer()
	where := func(server bool) string {
		if server {
			return "the server"
		}
		return "the client"
	}
	if o.File != "" && s.server != sourceIsServer {
		return usage(fmt.Errorf("--file goes on %s (the side whose bytes move); --out on %s writes them",
			where(sourceIsServer), where(!sourceIsServer)))
	}
	if o.Out != "" && s.server == sourceIsServer {
		return usage(fmt.Errorf("--out goes on %s (the receiving side); --file on %s",
			where(!sourceIsServer), where(sourceIsServer)))
	}
	if o.File == "" {
		return nil
	}
	// O_NONBLOCK: opening a FIFO would block until a writer came (for
	// ever, and the blocked open ignores Ctrl-C); it has no effect on the
	// reads of a regular file.
	f, err := os.OpenFile(o.File, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return usage(fmt.Errorf("--file: %w", err))
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("--file: %w", err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return usage(fmt.Errorf("--file %s: not a regular file", o.File))
	}
	if kfs := KernelFS(o.File); kfs != "" {
		// A procfs file has size 0, a sysfs attribute 4096 bytes, and
		// neither is its content: the run would move a wrong count.
		f.Close()
		return usage(fmt.Errorf("--file %s: a file of the kernel's %s, whose size (%d bytes) is not its content; copy it to a regular file first",
			o.File, kfs, st.Size()))
	}
	if st.Size() == 0 {
		// As the demo: an empty file would post nothing and report 0
		// iterations as if it had measured something.
		f.Close()
		return usage(fmt.Errorf("--file %s: empty, %s needs bytes to move", o.File, s.test))
	}
	s.file, s.fileSize = f, st.Size()
	return nil
}

// KernelFS names the kernel's pseudo file system path is on ("procfs",
// "sysfs"), or returns "" for any other: their files' sizes are not their
// contents, and they keep nothing written to them.
func KernelFS(path string) string {
	var st unix.Statfs_t
	if unix.Statfs(path, &st) != nil {
		return ""
	}
	switch st.Type {
	case unix.PROC_SUPER_MAGIC:
		return "procfs"
	case unix.SYSFS_MAGIC:
		return "sysfs"
	}
	return ""
}

func (s *session) runClient(ctx context.Context) error {
	o := s.o
	port := o.Port
	if port == 0 {
		port = exchange.DefaultPort
	}
	c, err := dial(ctx, net.JoinHostPort(o.Server, strconv.Itoa(port)), o.ConnectTimeout)
	if err != nil {
		return fmt.Errorf("connect to the server: %w", err)
	}
	s.tcpLocal, s.tcpRemote = tcpAddrs(c)
	// Every run starts as perftest does (exchange_versions); a softrdma
	// server answers the mark in this side's version and the two switch to
	// softrdma's exchange, a perftest server does not.
	pt := exchange.NewPerftest(c, true)
	native, err := s.exchangeVersions(ctx, c, pt)
	if err != nil {
		return err
	}
	if !native {
		s.pt = pt
		return s.runPerftest(ctx)
	}
	if s.ctrl, err = exchange.New(c); err != nil {
		return err
	}
	s.clientParams()
	err = s.clientHello(ctx)
	if err == nil {
		err = s.run(ctx)
	}
	return s.tellPeer(err)
}

// DefaultSetupTimeout is the default Options.SetupTimeout.
const DefaultSetupTimeout = 10 * time.Second

// exchangeVersions starts the exchange on c (perftest's
// exchange_versions) within the setup time limit, which starts now, and
// returns whether both sides speak softrdma's exchange. On failure it
// closes c and explains a peer that is not a softrdma or perftest tool.
func (s *session) exchangeVersions(ctx context.Context, c net.Conn, pt *exchange.Perftest) (bool, error) {
	s.startSetupLimit()
	s.peerTCP = c.RemoteAddr().String()
	c.SetDeadline(s.setupEnd)
	stop := context.AfterFunc(ctx, func() { c.Close() })
	native, err := pt.ExchangeVersions(!s.o.Perftest)
	stop()
	c.SetDeadline(time.Time{})
	if err != nil {
		c.Close()
		return false, ctxErr(ctx, s.setupErr(ctx, "version", err))
	}
	return native, nil
}

// setupTimeout is the setup time limit: Options.SetupTimeout, else
// DefaultSetupTimeout.
func (s *session) setupTimeout() time.Duration {
	if s.o.SetupTimeout > 0 {
		return s.o.SetupTimeout
	}
	return DefaultSetupTimeout
}

// startSetupLimit starts the setup time limit (setupCtx): at the TCP
// connection, or (-R) once the CM connected the exchange's channel.
func (s *session) startSetupLimit() {
	s.setupLimit = s.setupTimeout()
	s.setupEnd = time.Now().Add(s.setupLimit)
}

// setupCtx returns ctx ending when the setup's time limit does (if this
// side set one: over TCP, exchangeVersions).
func (s *session) setupCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.setupEnd.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, s.setupEnd)
}

// setupErr explains err, an error of the exchange's setup step that
// waits for what (the peer's "version", "hello", ...), when the peer is
// not a softrdma or perftest tool: it sent something else, or nothing
// within the setup time limit (not ctx's own end); or when it closed the
// connection before that step.
func (s *session) setupErr(ctx context.Context, what string, err error) error {
	var np *exchange.NotPeerError
	switch {
	case errors.As(err, new(*unackedError)):
		// (-R: a message the peer did not acknowledge within
		// --idle-timeout; it unwraps to os.ErrDeadlineExceeded, but the
		// setup time limit did not expire.)
		return err
	case errors.As(err, &np):
		return fmt.Errorf("the peer at %s is not a softrdma or perftest peer: it sent %q", s.peerLabel(), np.Got)
	case ctx.Err() == nil && (errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)):
		return &setupError{fmt.Sprintf("the peer at %s connected but did not complete the exchange within %v: "+
			"is it a softrdma or perftest peer?", s.peerLabel(), s.setupLimit), err}
	case ctx.Err() == nil && s.peerTCP != "" && peerClosed(err):
		// (With -R there is no TCP peer: the channel's own error says it.)
		return &setupError{fmt.Sprintf("the peer at %s closed the connection before sending its %s", s.peerTCP, what), err}
	}
	return err
}

// peerClosed reports whether err is a connection the peer closed or reset.
func peerClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// setupError is a setup that did not complete (in time, or at all: the
// peer closed the connection); it reads as its message and unwraps to the
// cause.
type setupError struct {
	msg string
	err error
}

func (e *setupError) Error() string { return e.msg }
func (e *setupError) Unwrap() error { return e.err }

// clientParams sets the test parameters a client sends in its hello: its
// flags, perftest's defaults, a pattern seed, its --file's size.
func (s *session) clientParams() {
	s.p = s.o.Params
	s.p.Defaults(s.test)
	if s.p.Seed == 0 {
		s.p.Seed = rand.Uint64() | 1
	}
	s.p.FileSize = -1
	if s.file != nil {
		s.p.FileSize = s.fileSize
	}
}

func (s *session) clientHello(ctx context.Context) error {
	if err := s.p.Validate(s.test); err != nil {
		return err
	}
	var err error
	if s.p.MTU, err = s.localMTU(); err != nil {
		return err
	}
	if err := s.ctrl.SendJSON(exchange.MsgHello, &s.p); err != nil {
		return err
	}
	var r reply
	hctx, cancel := s.setupCtx(ctx)
	defer cancel()
	if err := s.ctrl.RecvJSON(hctx, exchange.MsgReply, &r); err != nil {
		return s.setupErr(ctx, "reply", err)
	}
	s.p.MTU = agreeMTU(s.p.MTU, r.MTU)
	if r.FileSize >= 0 {
		s.fileSize = r.FileSize
	}
	s.noteFileIgnores()
	s.noteDurationIgnoresIters()
	s.noteAllIgnoresSize()
	return s.openOut()
}

// noteFileIgnores tells a client that moves a file (its own --file, or
// the server's with read-bw) that its -D and -n do not apply: the file's
// size decides the messages.
func (s *session) noteFileIgnores() {
	if s.fileSize < 0 {
		return
	}
	var flags []string
	if s.o.Params.Duration != 0 {
		flags = append(flags, fmt.Sprintf("-D %v", s.o.Params.Duration))
	}
	if s.o.Params.Iters != 0 {
		flags = append(flags, fmt.Sprintf("-n %d", s.o.Params.Iters))
	}
	if len(flags) > 0 {
		s.logf("softrdma: %s ignored: a --file run moves the whole file, %s of -s %d bytes",
			strings.Join(flags, " and "), plural(chunks(s.fileSize, s.p.Size), "message"), s.p.Size)
	}
}

// noteDurationIgnoresIters tells a client given both -D and -n that -n
// does not apply: perftest's -D sets iters to 0 (force_dependecies in
// perftest_parameters.c) and runs for the time alone, silently; softrdma
// says so, as for --file (noteFileIgnores, which covers a --file run).
func (s *session) noteDurationIgnoresIters() {
	if s.fileSize >= 0 || s.o.Params.Duration == 0 || s.o.Params.Iters == 0 {
		return
	}
	s.logf("softrdma: -n %d ignored: -D %v runs for the time, however many iterations fit", s.o.Params.Iters, s.o.Params.Duration)
}

// noteAllIgnoresSize tells a client given both -a and -s that -s does
// not apply: perftest's RUN_ALL sets size to MAX_SIZE
// (force_dependecies) and loops over every size, silently; softrdma says
// so, as for -n under -D.
func (s *session) noteAllIgnoresSize() {
	if s.fileSize >= 0 || !s.o.Params.All || s.o.Params.Size == 0 {
		return
	}
	s.logf("softrdma: -s %d ignored: -a runs every size from 2 to %d bytes", s.o.Params.Size, MaxSize)
}

// plural is "1 message", "5 messages": n and noun, with an s unless n is 1.
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// openOut creates --out when this side receives a file.
func (s *session) openOut() error {
	if s.o.Out == "" {
		return nil
	}
	if s.fileSize < 0 {
		return fmt.Errorf("--out %s: the peer sends no file (--file)", s.o.Out)
	}
	// The bytes go to a temporary file beside --out, renamed over it only
	// when the run passed (finishOut): a failed run leaves an existing
	// --out as it was, and a --file of the same path on this host is not
	// truncated before the client reads it. A symlink stays a symlink (its
	// target is replaced); a device (--out /dev/null) or any other file
	// that is not a regular one, or a symlink that leads nowhere yet, is
	// written in place: a rename would put a regular file in its stead.
	path := s.o.Out
	if p, err := filepath.EvalSymlinks(path); err == nil {
		path = p
	} else if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return s.openOutDirect(path, os.O_CREATE)
	}
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		if !st.Mode().IsRegular() {
			return s.openOutDirect(path, 0)
		}
		mode = st.Mode().Perm()
	}
	s.outPath = path
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".softrdma-*")
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	s.out = f
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	return nil
}

// openOutDirect opens --out (path, its symlink resolved if it could be)
// to be written in place, as a device is.
func (s *session) openOutDirect(path string, flag int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC|flag, 0o644)
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	s.out, s.outDirect = f, true
	return nil
}

// finishOut ends --out once the run is over (and s.out closed): on
// success the temporary file becomes --out; on failure it is removed, and
// the error says that --out was not written. An --out written in place
// (openOutDirect) is left as the run left it.
func (s *session) finishOut(err error) error {
	if s.out == nil {
		return err
	}
	if s.outDirect {
		if err = cmp.Or(err, s.outErr); err != nil {
			return fmt.Errorf("%w (--out %s was written in place and may hold part of the file)", err, s.o.Out)
		}
		return nil
	}
	tmp := s.out.Name()
	if err == nil && s.outErr == nil {
		if rerr := os.Rename(tmp, s.outPath); rerr == nil {
			return nil
		} else {
			err = fmt.Errorf("--out: %w", rerr)
		}
	}
	err = cmp.Or(err, s.outErr)
	os.Remove(tmp)
	return fmt.Errorf("%w (--out %s was not written)", err, s.o.Out)
}

// retryEvery is the pause between a client's connection attempts.
const retryEvery = 200 * time.Millisecond

// dial connects to addr, retrying a refused or unreachable connection
// (the server not listening yet) until timeout has passed. A timeout also
// bounds each attempt: a SYN that nothing answers (a host that is down, a
// firewall that drops it) would otherwise be retried by the kernel for
// about 2 minutes (tcp_syn_retries 6); the error then names the address
// and the flag. Without a timeout, one attempt, as perftest's.
func dial(ctx context.Context, addr string, timeout time.Duration) (net.Conn, error) {
	var d net.Dialer
	return dialWith(ctx, d.DialContext, addr, timeout)
}

// dialWith is dial with the function that makes one attempt (a
// net.Dialer's DialContext). A refusal is reported as one even when the
// deadline passed meanwhile (a loaded host), and an attempt that the
// deadline cut after earlier ones were refused reports the refusal: the
// server's host answered, so "no answer" would blame a host or firewall.
func dialWith(ctx context.Context, dialContext func(context.Context, string, string) (net.Conn, error), addr string, timeout time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	var refused error // the last attempt's refusal
	for {
		dctx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			dctx, cancel = context.WithDeadline(ctx, deadline)
		}
		c, err := dialContext(dctx, "tcp", addr)
		// (The dialer ends at the deadline itself, "i/o timeout",
		// which can come before dctx's own timer.)
		expired := timeout > 0 && (dctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded))
		cancel()
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			refused = err
		}
		if expired && refused != nil {
			return nil, refusedHint(refused, addr, timeout)
		}
		if expired {
			return nil, &noAnswerError{addr: addr, timeout: timeout}
		}
		retry := errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH)
		if !retry || time.Now().Add(retryEvery).After(deadline) {
			if errors.Is(err, syscall.ECONNREFUSED) {
				return nil, refusedHint(err, addr, timeout)
			}
			return nil, err
		}
		select {
		case <-time.After(retryEvery):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// refusedHint adds to a refused connection to addr what a new user most
// likely missed: no server listens on that port (yet). Without
// --connect-timeout (0) it names the flag that retries; with it, that the
// connection was retried for that long.
func refusedHint(err error, addr string, timeout time.Duration) error {
	_, port, _ := net.SplitHostPort(addr)
	if timeout > 0 {
		return fmt.Errorf("%w (still, after retrying for --connect-timeout %v: is the server running on port %s?)", err, timeout, port)
	}
	return fmt.Errorf("%w (is the server running on port %s? --connect-timeout retries until it is)", err, port)
}

// noAnswerError is a connection attempt that --connect-timeout ended
// while its SYN was unanswered, no attempt before it refused.
type noAnswerError struct {
	addr    string
	timeout time.Duration
}

func (e *noAnswerError) Error() string {
	return fmt.Sprintf("no answer from %s within --connect-timeout %v (its host is down, or a firewall drops the connection)",
		e.addr, e.timeout)
}

// tcpAddrs returns the local and remote IPs of a TCP connection.
func tcpAddrs(c net.Conn) (local, remote netip.Addr) {
	ip := func(a net.Addr) netip.Addr {
		if t, ok := a.(*net.TCPAddr); ok {
			return t.AddrPort().Addr().Unmap()
		}
		ap, _ := netip.ParseAddrPort(a.String())
		return ap.Addr().Unmap()
	}
	return ip(c.LocalAddr()), ip(c.RemoteAddr())
}

// ctxErr returns ctx's error if it ended, else err.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// tellPeer sends err to the peer unless it came from the peer, and returns
// it.
func (s *session) tellPeer(err error) error {
	var pe *exchange.PeerError
	if err != nil && s.ctrl != nil && !errors.As(err, &pe) {
		s.ctrl.SendError(errors.New(s.reasonForPeer(err)))
	}
	return err
}

// peerInterrupted is what a side tells its peer when it was interrupted
// (Ctrl-C or SIGTERM cancel Run's context): the peer prints "peer:
// interrupted", not Go's "context canceled".
const peerInterrupted = "interrupted (SIGINT or SIGTERM)"

// reasonForPeer is err as this side tells its peer, in its result or an
// error message.
func (s *session) reasonForPeer(err error) string {
	if s.interrupted(err) {
		return peerInterrupted
	}
	// Without softrdma.Open's "softrdma: ", as the CLI prints this side's
	// own message: the peer prints it after its own prefix and "peer: ".
	return strings.TrimPrefix(err.Error(), "softrdma: ")
}

// interrupted says whether err is the end of Run's own context (Ctrl-C,
// SIGTERM), not of a context that this side cancelled itself.
func (s *session) interrupted(err error) bool {
	return s.runCtx != nil && s.runCtx.Err() != nil && errors.Is(err, context.Canceled)
}

func (s *session) runServer(ctx context.Context) error {
	o := s.o
	// A --bind IP:PORT opened the device at startup (openBoundDevice):
	// probing its address again would find it taken by the device itself.
	if s.dev == nil {
		if err := checkBindable(o.Bind); err != nil && o.Device == nil {
			return err
		}
	}
	ln := o.Listener
	if ln == nil {
		port := o.Port
		if port == 0 {
			port = exchange.DefaultPort
		}
		bind, _, _ := ParseBind(o.Bind) // checked above
		var err error
		if ln, err = hostaddr.ListenAll(port, bind.Addr()); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
	}
	defer ln.Close()
	if o.Ready != nil {
		o.Ready(ln.Addr())
	}
	if !o.JSON {
		fmt.Fprintf(o.Stdout, "\n************************************\n* Waiting for client to connect... *\n************************************\n")
	}
	accepted := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			ln.Close()
		case <-accepted:
		}
	}()
	c, err := ln.Accept()
	close(accepted)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("accept: %w", err)
	}
	ln.Close() // one client, as perftest
	s.tcpLocal, s.tcpRemote = tcpAddrs(c)
	pt := exchange.NewPerftest(c, false)
	native, err := s.exchangeVersions(ctx, c, pt)
	if err != nil {
		return err
	}
	if !native {
		s.pt = pt
		return s.runPerftest(ctx)
	}
	if s.ctrl, err = exchange.New(c); err != nil {
		return err
	}
	err = s.serverHello(ctx)
	if err == nil {
		err = s.run(ctx)
	}
	return s.tellPeer(err)
}

func (s *session) serverHello(ctx context.Context) error {
	hctx, cancel := s.setupCtx(ctx)
	defer cancel()
	if err := s.ctrl.RecvJSON(hctx, exchange.MsgHello, &s.p); err != nil {
		return s.setupErr(ctx, "hello", err)
	}
	if err := s.p.Validate(s.test); err != nil {
		return err
	}
	s.noteOverrides()
	// The MTU is not the client's alone: each side offers what its port
	// carries and both use the smaller (perftest's check_mtu).
	mine, err := s.localMTU()
	if err != nil {
		return err
	}
	s.p.MTU = agreeMTU(mine, s.p.MTU)
	r := reply{FileSize: -1, MTU: s.p.MTU}
	if s.file != nil {
		if s.p.QPs != 1 {
			return fmt.Errorf("--file streams over one QP (-q 1); the client asked for -q %d", s.p.QPs)
		}
		r.FileSize = s.fileSize
	} else {
		s.fileSize = s.p.FileSize
	}
	if err := s.openOut(); err != nil {
		return err
	}
	return s.ctrl.SendJSON(exchange.MsgReply, &r)
}

// run runs every round once the hello is done.
func (s *session) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.ctrl.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	s.ctx = ctx
	s.xch = exchange.Native{C: s.ctrl}
	s.json.MTU, s.json.QPs = s.p.MTU, s.p.QPs
	if err := s.setup(); err != nil {
		return err
	}
	w := s.o.Stdout
	text := !s.o.JSON
	var fileRes [2]roundResult // mine, peer's, of the (single) file round
	for i, size := range s.p.Sizes() {
		if err := s.createRound(size); err != nil {
			return err
		}
		// The peer's QP data of the first round is the last step of the
		// setup: a peer that said hello and then nothing (stopped, or
		// not a tool that goes on) fails the run after the setup time
		// limit, counted afresh from here, instead of holding it.
		xctx, xcancel := ctx, context.CancelFunc(func() {})
		if i == 0 {
			xctx, xcancel = context.WithTimeout(ctx, s.setupTimeout())
		}
		err := s.connect(ctx, xctx)
		// Read before xcancel, which would make any error of the
		// connection look like the setup limit's expiry.
		setupExpired := xctx.Err() != nil
		xcancel()
		if err != nil {
			if ctx.Err() == nil && setupExpired {
				return &setupError{fmt.Sprintf("the peer at %s said hello but sent no QP data within %v (the setup time limit): "+
					"is it stopped, or its host or the path down?", s.peerLabel(), s.setupTimeout()), err}
			}
			return err
		}
		if i == 0 && text {
			s.printBanner(w)
		}
		mine, peer, err := s.round(ctx, size)
		if err != nil {
			if text {
				fmt.Fprintln(w, report.Line)
			}
			if s.fileSize >= 0 && mine.SHA256 != "" && peer.SHA256 != "" {
				s.reportFile(w, text, &mine, &peer) // what each side saw
			}
			return err
		}
		s.cmDisconnectData(true) // -R
		s.destroyRound()
		s.addRow(w, text, &mine, &peer)
		if s.fileSize >= 0 {
			fileRes = [2]roundResult{mine, peer}
		}
		if s.p.Duration > 0 && iterations(&mine) == 0 && iterations(&peer) == 0 {
			if text {
				fmt.Fprintln(w, report.Line)
			}
			return fmt.Errorf("-D %v: no iteration of %d bytes completed in that time", s.p.Duration, size)
		}
	}
	if text {
		fmt.Fprintln(w, report.Line)
	}
	if s.p.Verify {
		s.json.Verified = true
		if text {
			fmt.Fprintf(w, " Verify          : %s\n", s.verified())
		}
	}
	if s.fileSize >= 0 {
		s.reportFile(w, text, &fileRes[0], &fileRes[1])
	}
	if text {
		s.printODP(w, s.odpReport())
	}
	return nil
}

// verified says what --verify checked, once every check passed.
func (s *session) verified() string {
	if s.test == AtomicBW {
		// No bytes are compared: each QP's counter is a chain (the
		// client checks each atomic's fetched value, the server the
		// counters' final values).
		op := "FETCH_AND_ADD(1)"
		if s.p.Atomic == CmpAndSwap {
			op = "CMP_AND_SWAP(n, n+1)"
		}
		return fmt.Sprintf("every counter chain held (the n-th %s of each QP fetched n, "+
			"and each QP's counter ended at the count of its atomics)", op)
	}
	return fmt.Sprintf("every byte matched (pattern seed %#x)", s.p.Seed)
}

// prepare readies the buffer before a round's start barrier.
func (s *session) prepare(size int64) {
	switch {
	case s.test == WriteLat || s.test == SendLat:
		clear(s.local(0)[:size]) // the receive slot, whose last byte write-lat polls
	case s.server && s.test == ReadBW && s.p.Verify && s.fileSize < 0:
		s.fillReadSlots(size)
	case s.server && s.test == ReadLat && s.p.Verify:
		fillPattern(s.local(0)[:size], s.p.Seed, 0)
	case s.server && s.test == AtomicBW:
		for q := range s.p.QPs {
			clear(s.local(q)[:8])
		}
	}
}

// round runs one message size: a barrier, each side's part, then the
// exchange of results and verdicts. It returns both sides' results.
func (s *session) round(ctx context.Context, size int64) (mine, peer roundResult, err error) {
	s.prepare(size)
	if err := s.ctrl.Sync(ctx); err != nil {
		return mine, peer, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	peerc := make(chan peerMsg, 1)
	spoke := make(chan struct{})
	s.peerSpoke = spoke
	var target atomic.Int64
	known := make(chan struct{})
	go func() {
		var r roundResult
		err := s.ctrl.RecvJSON(ctx, exchange.MsgResult, &r)
		stop := err != nil || r.Err != ""
		if !stop {
			var n int64
			for _, c := range r.Counts {
				n += c
			}
			target.Store(n)
			close(known)
		}
		// A peer that failed while this side drains its -D run (its
		// duration over, work requests outstanding) most likely failed
		// the same way at about the same time (a dead path bounds both
		// sides alike): this side's own bound ends its run within
		// drainLimit, and its own failure is the one reported, the
		// peer's mentioned after it, whichever side's bound expired
		// first.
		deliverPeerResult(peerMsg{r, err}, peerc, spoke, func() {
			if stop && !s.draining() {
				cancel() // the peer failed: stop waiting for it
			}
		})
	}()
	targetFn := func() (int64, bool) {
		select {
		case <-known:
			return target.Load(), true
		default:
			return 0, false
		}
	}
	// An -n run whose completions stop (a dead peer or path: the QPs
	// retry for ever) ends after --idle-timeout; the passive side, which
	// has no completions, learns of it from the active side's result,
	// except with -R, where that result takes the dead path too: there it
	// watches the packets it receives.
	// A -D run is bounded instead: the side posting the work by its
	// drain limit (session.bounded), the other by resultBound.
	// The round starts before its bounds do: the time a drainError says
	// was waited in all is at least the limits that expired, however
	// long a loaded machine kept this goroutine from the run.
	s.roundStart, s.boundUsed = s.clock(), false
	bctx, bcancel := s.resultBound(rctx)
	defer bcancel()
	ictx, idle := bctx, (*idlewatch.Watch)(nil)
	if s.passive() {
		ictx, idle = s.watchPassive(bctx)
	} else {
		ictx, idle = s.watchIdle(bctx)
	}
	s.idle = idle
	if testHookRunSide != nil {
		testHookRunSide(s)
	}
	mine, runErr := s.runSide(ictx, size, targetFn, known)
	if testHookRunEnd != nil {
		testHookRunEnd(s, runErr)
	}
	idle.Stop()
	s.idle = nil
	var nr *noResultError
	switch {
	case runErr != nil && idle.Expired() && s.passive():
		if !closed(spoke) { // (a peer that spoke explains the run's end itself)
			runErr = s.passiveIdleErr(idle)
		}
	case runErr != nil && idle.Expired():
		runErr = s.idleErr(idle, s.asked(size), size)
	case runErr != nil && rctx.Err() == nil && errors.As(context.Cause(bctx), &nr) && s.boundUsed:
		// A side that posts the work had its own bound (the duration
		// and drainLimit) expire first; a loaded machine can let
		// resultBound's, later, end its run before it saw that.
		if !errors.As(runErr, new(*drainError)) {
			runErr = s.drainError()
		}
	case runErr != nil && rctx.Err() == nil && errors.As(context.Cause(bctx), &nr):
		runErr = nr
	}
	if runErr != nil {
		mine.Err = s.reasonForPeer(runErr)
	}
	mine.ODP = s.odpReport()
	sendErr := s.ctrl.SendJSON(exchange.MsgResult, &mine)
	var unacked *unackedError
	if errors.As(sendErr, &unacked) {
		// -R: the peer did not acknowledge the result (boundWrites): its
		// own result will not cross the dead path either.
		return mine, peer, cmp.Or(runErr, sendErr)
	}
	wait := s.resultWait(runErr, idle.Expired())
	pm, waited := s.peerResult(peerc, wait)
	var ce *exchange.ClosedError
	if waited && errors.As(pm.err, &ce) {
		// A run cut short by the close (its context cancelled) was
		// still going; one that ended otherwise was over.
		ce.Doing = s.closedDuring(runErr == nil || !errors.Is(runErr, context.Canceled))
	}
	var de *drainError
	if errors.As(runErr, &de) {
		de.noResult, de.resultWait, de.waited = !waited, wait, time.Since(de.start)
	}
	if !waited {
		if runErr != nil {
			return mine, peer, runErr
		}
		return mine, peer, fmt.Errorf("-D %v: the peer sent no result within %v after this side's run ended "+
			"(its host or the path may be down while the TCP connection stays open)", s.p.Duration, drainLimit(s.p.Duration))
	}
	if err := s.roundErr(runErr, sendErr, pm); err != nil {
		return mine, peer, err
	}
	peer = pm.r
	s.peerODP = peer.ODP
	// Verdicts: the checks that need the other side's result.
	check := s.check(&mine, &peer)
	var v verdict
	if check != nil {
		v.Err = check.Error()
	}
	if err := s.ctrl.SendJSON(exchange.MsgSync, &v); err != nil {
		return mine, peer, err
	}
	var pv verdict
	if err := s.ctrl.RecvJSON(ctx, exchange.MsgSync, &pv); err != nil {
		return mine, peer, err
	}
	if check != nil {
		return mine, peer, check
	}
	if pv.Err != "" {
		return mine, peer, &exchange.PeerError{Reason: pv.Err}
	}
	return mine, peer, nil
}

// roundErr is the error of a round whose run ended with runErr (this
// side's), whose result went to the peer with sendErr, and whose peer's
// result (or the error of reading it) is pm; nil when both sides' runs
// succeeded.
func (s *session) roundErr(runErr, sendErr error, pm peerMsg) error {
	ownErr := runErr != nil && !errors.Is(runErr, context.Canceled)
	switch {
	case s.interrupted(runErr):
		// This side was interrupted (Run's context ended): the peer's
		// result, when it came before the read of it saw the end of the
		// context, only says that it stopped because this side did
		// ("context canceled").
		return runErr
	case ownErr && (pm.err != nil || pm.r.Err != "" && pm.r.Err != context.Canceled.Error()):
		// (A peer that only stopped because this side failed, the
		// passive side of WRITE and READ, adds nothing.)
		// Both sides failed: this side's failure first, then the peer's.
		return fmt.Errorf("%w; the peer: %s", runErr, peerFailure(pm))
	case pm.err != nil:
		return pm.err
	case pm.r.Err != "" && !ownErr:
		return &exchange.PeerError{Reason: pm.r.Err}
	case runErr != nil:
		return runErr
	case sendErr != nil:
		return sendErr
	}
	return nil
}

// closedDuring says what this side was doing when the peer closed the
// exchange's connection before sending its round's result (its process
// killed, mid-run): still running the test, serving the peer's run
// (passive), or waiting for the result after its own run ended.
func (s *session) closedDuring(runEnded bool) string {
	switch {
	case runEnded:
		return "after this side's run ended, before sending its result (was its process killed?)"
	case s.passive():
		return "during the run, which this side was serving; no result came from it (was its process killed?)"
	}
	return "while this side was still running the test; no result came from it (was its process killed?)"
}

// testHookRunSide, if set (by tests), is called when a round's run starts
// (after the barrier, with the idle watch running).
var testHookRunSide func(s *session)

// testHookRunEnd, if set (by tests), is called when this side's part of a
// round's run returned, before its result goes to the peer.
var testHookRunEnd func(s *session, runErr error)

// iterations is the number of messages a round's result reports.
func iterations(r *roundResult) int64 {
	switch {
	case r.BW != nil:
		return r.BW.Iterations
	case r.Lat != nil:
		return r.Lat.Iterations
	}
	return 0
}

// peerFailure is why the peer failed, from its result or from the error
// of reading it.
func peerFailure(pm peerMsg) string {
	var pe *exchange.PeerError
	switch {
	case pm.r.Err != "":
		return pm.r.Err
	case errors.As(pm.err, &pe):
		return pe.Reason
	}
	return pm.err.Error()
}

// runSide runs this side's part of one round.
func (s *session) runSide(ctx context.Context, size int64, target func() (int64, bool), known <-chan struct{}) (roundResult, error) {
	var res roundResult
	passive := func() error {
		select {
		case <-known:
			return nil
		case <-ctx.Done():
		}
		select {
		case <-known: // the result came as the watch or bound expired
			return nil
		default:
		}
		if s.idle.Expired() && s.resultCanCome() {
			// The active peer's watch fires about when this one does
			// (no packets, no completions): give its result, which
			// says more, the time to arrive before failing on its own.
			t := time.NewTimer(peerGrace)
			defer t.Stop()
			select {
			case <-known:
				return nil
			case <-s.peerSpoke:
			case <-t.C:
			}
		}
		return ctx.Err()
	}
	sourceIsServer := s.test.fileFromServer()
	switch {
	case s.streams() && s.server == sourceIsServer: // the source of a stream
		var src source = patternSource{seed: s.p.Seed}
		var fsrc *fileSource
		count := s.p.Iters
		if s.fileSize >= 0 {
			fsrc = newFileSource(s.file, s.fileSize)
			src, count = fsrc, chunks(s.fileSize, size)
		} else if s.p.Duration > 0 {
			count = -1
		}
		if s.server {
			if err := s.readServe(ctx, size, src, count); err != nil {
				return res, err
			}
		} else {
			bw, err := s.push(ctx, size, src, count, time.Now().Add(s.p.Duration))
			if err != nil {
				return res, err
			}
			res.BW = &bw
			res.Counts = []int64{bw.Iterations}
		}
		if fsrc != nil {
			res.SHA256, res.Bytes = fsrc.sum(), s.fileSize
		}
	case s.streams(): // the sink of a stream
		var snk sink = &patternSink{c: checker{seed: s.p.Seed}}
		var fsnk *fileSink
		lenOf := func(int64) int { return int(size) }
		count := s.p.Iters // messages the source sends (-1: until -D ends)
		if s.p.Duration > 0 {
			count = -1
		}
		if s.fileSize >= 0 {
			count = chunks(s.fileSize, size)
			var w io.Writer
			if s.out != nil {
				w = s.out
			}
			fsnk = newFileSink(w)
			snk = fsnk
			lenOf = func(k int64) int { return chunkLen(k, s.fileSize, size) }
		}
		var bw report.BW
		var err error
		if s.server {
			bw, err = s.pull(ctx, size, snk, lenOf, count)
		} else {
			bw, err = s.readFetch(ctx, size, snk, s.fileSize)
		}
		if err != nil {
			return res, err
		}
		res.BW = &bw
		if fsnk != nil {
			if err := fsnk.flush(); err != nil {
				return res, err
			}
			res.SHA256, res.Bytes = fsnk.sum(), fsnk.n
		}
	case s.test == WriteLat || s.test == SendLat:
		lat, n, err := s.pingPong(ctx, size, target, known)
		if err != nil {
			return res, err
		}
		res.Lat, res.Counts = &lat, []int64{n}
	case s.test == ReadLat && !s.server:
		lat, n, err := s.readLat(ctx, size)
		if err != nil {
			return res, err
		}
		res.Lat, res.Counts = &lat, []int64{n}
	case s.test == SendBW && s.server:
		bw, err := s.sendBWServer(ctx, size, target, known)
		if err != nil {
			return res, err
		}
		res.BW = &bw
	case s.server: // write-bw, read-bw, atomic-bw, read-lat: the client does the work
		return res, passive()
	default:
		bw, counts, err := s.bwClient(ctx, size)
		if err != nil {
			return res, err
		}
		res.BW, res.Counts = &bw, counts
	}
	return res, nil
}

// resultCanCome reports whether the peer can send its result, or its
// failure, over an exchange that does not take the RoCEv2 path: softrdma's
// over TCP (not -R, not perftest's exchange, which has no such message).
func (s *session) resultCanCome() bool { return s.ch == nil && s.pt == nil }

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// passive reports whether this side has no part in the round but to wait
// for the peer's result (the server of write-bw, read-bw, atomic-bw and
// read-lat without a stream), as runSide decides.
func (s *session) passive() bool {
	switch {
	case s.streams(), s.test == WriteLat || s.test == SendLat, s.test == ReadLat && !s.server,
		s.test == SendBW && s.server:
		return false
	}
	return s.server
}

// asked is the number of iterations of a round of size bytes (all QPs'),
// as the idle watch counts them.
func (s *session) asked(size int64) int64 {
	switch {
	case s.streams() && s.fileSize >= 0:
		return chunks(s.fileSize, size)
	case s.test.IsLat():
		return s.p.Iters
	}
	return s.p.Iters * int64(s.p.QPs)
}

// check compares this side's result with the peer's once both are done.
func (s *session) check(mine, peer *roundResult) error {
	if s.fileSize >= 0 && s.server != s.test.fileFromServer() { // the receiver of a file
		if mine.SHA256 != peer.SHA256 || mine.Bytes != peer.Bytes {
			return fmt.Errorf("%w: received %d bytes with SHA-256 %s; the sender sent %d bytes with SHA-256 %s",
				ErrMismatch, mine.Bytes, mine.SHA256, peer.Bytes, peer.SHA256)
		}
	}
	if s.server && s.test == AtomicBW && s.p.Verify {
		return s.checkAtomicCounters(peer.Counts)
	}
	return nil
}

// noteOverrides tells the server's user which of its own test flags the
// client's parameters replaced.
func (s *session) noteOverrides() {
	mine, theirs := &s.o.Params, &s.p
	var diffs []string
	add := func(flag string, m, t any, set bool) {
		if set && m != t {
			diffs = append(diffs, fmt.Sprintf("%s %v (this side: %v)", flag, t, m))
		}
	}
	add("-s", mine.Size, theirs.Size, mine.Size != 0)
	add("-n", mine.Iters, theirs.Iters, mine.Iters != 0)
	add("-D", mine.Duration, theirs.Duration, mine.Duration != 0)
	add("-a", mine.All, theirs.All, mine.All)
	add("-q", mine.QPs, theirs.QPs, mine.QPs != 0)
	add("-t", mine.TxDepth, theirs.TxDepth, mine.TxDepth != 0)
	add("--verify", mine.Verify, theirs.Verify, mine.Verify)
	if len(diffs) > 0 {
		s.logf("softrdma: the test parameters are the client's: %s", strings.Join(diffs, ", "))
	}
}
