package pingpong

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/hostaddr"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/idlewatch"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/odpbuf"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
	"github.com/softrdma/softrdma/transport/pcaptap"
	"github.com/softrdma/softrdma/transport/wire"
)

// Work request IDs, rc_pingpong's (they double as bits of "pending").
const (
	recvWRID = 1
	sendWRID = 2
)

// rc_pingpong's defaults.
const (
	DefaultSize    = 4096
	DefaultIters   = 1000
	DefaultMTU     = 1024
	DefaultRxDepth = 500
	// MaxSize is the largest -s: an IBTA message is at most 2^31 bytes.
	MaxSize = 1 << 31
)

// The QP attributes pp_connect_ctx sets.
const (
	minRNRTimer = 12 // 0.64 ms
	qpTimeout   = 14 // 67 ms
	retryCnt    = 7  // forever, as rxe treats 7
	rnrRetry    = 7  // forever
	rdAtomic    = 1  // max_rd_atomic and max_dest_rd_atomic
)

// Implementation constants.
const (
	// spinFor is how long the polling mode busy-polls before it blocks: a
	// NIC in software needs a CPU too, and a poller that never blocks
	// starves it on a small machine (ibv_rc_pingpong spins without limit,
	// which suits a hardware NIC).
	spinFor = 50 * time.Microsecond
	// linger keeps the device up for a moment after the last completion
	// so that the ACK of the last SEND received, which the engine sends at
	// the end of its receive batch (after the receive completion is
	// visible), leaves before the socket closes, and a retransmission of
	// it would still be answered.
	linger = 50 * time.Millisecond
	// retryEvery is the pause between connection attempts of a client
	// with a ConnectTimeout.
	retryEvery = 200 * time.Millisecond
)

// Options are rc_pingpong's flags, plus softrdma's own.
type Options struct {
	// Type is the QP type: QPTypeRC (0 means RC) for ibv_rc_pingpong,
	// QPTypeUC for ibv_uc_pingpong, QPTypeUD for ibv_ud_pingpong. The TCP
	// exchange is the same; UD sends size bytes and receives size + 40
	// (the GRH) into the same buffer, with ud_pingpong's Q_Key.
	Type    softrdma.QPType
	Server  string // the server's host; empty: be the server
	Port    int    // TCP port of the exchange (-p)
	Size    int    // message size in bytes (-s)
	Iters   int    // exchanges (-n)
	MTU     int    // path MTU in bytes (-m)
	RxDepth int    // receives posted at a time (-r)
	SL      int    // service level (-l); RoCEv2 has no field for it
	Events  bool   // sleep on CQ events instead of polling (-e)
	// GIDIndex is -g: the GID index whose GID this side advertises; -1
	// (rc_pingpong's default) advertises the zero GID, which a RoCE peer
	// cannot address. softrdma's device has one GID, its IP address (IPv4
	// as ::ffff:a.b.c.d), at every index.
	GIDIndex int
	Check    bool // -c: the client zeroes the first byte of each page, the server checks it
	// Verify checks every message received: the client fills its buffer
	// with a random pattern (Seed) and checks that each echo equals it; the
	// server checks that each message equals the first it received.
	Verify bool
	Seed   uint64
	// ODP registers the buffer on demand, as ibv_rc_pingpong's -o (ODP.Explicit),
	// -O (ODP.Implicit: an implicit ODP MR over the whole address space) and
	// -P (ODP.Prefetch: ibv_advise_mr PREFETCH_WRITE of the message, which
	// needs -o or -O). RC and UC only; Budget and FaultPolicy are not
	// rc_pingpong's and must be zero.
	ODP odpbuf.Options

	Bind           string        // the device's IP[:port]; default the TCP connection's local IP, port 4791
	Pcap           string        // record the device's datagrams
	SourcePort     int           // UDP source port of the device's packets (softrdma.Config.SourcePort)
	Stat           bool          // print the device's non-zero counters at the end
	ConnectTimeout time.Duration // client: retry a refused connection for this long (0: one attempt, as rc_pingpong)
	// IdleTimeout ends the run with an error when no completion arrives
	// for this long while exchanges remain (0: wait for ever, as
	// rc_pingpong). The exchange carries no iteration count, so a peer
	// given a smaller -n stops early, and one that went away says
	// nothing: without a bound this side would wait for ever.
	IdleTimeout time.Duration
	// SetupTimeout bounds the TCP exchange of addresses, from the
	// connection to the last message: a peer that connects (or listens)
	// and says nothing fails the run after it instead of hanging it (0:
	// DefaultSetupTimeout). Not a flag: the exchange is three small
	// messages, which any rdma-core or softrdma peer sends at once.
	SetupTimeout time.Duration

	Listener net.Listener // server: accept on this instead of listening on Port (tests)
	Stdout   io.Writer
	Logf     func(format string, args ...any) // warnings; nil: silent
}

// DefaultSetupTimeout is the default Options.SetupTimeout.
const DefaultSetupTimeout = 10 * time.Second

// MinIdleTimeout is the least Options.IdleTimeout other than 0.
const MinIdleTimeout = 100 * time.Millisecond

// ErrData reports received data that failed -c or --verify.
var ErrData = errors.New("invalid data received")

// UsageError is an invalid option.
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &UsageError{fmt.Sprintf(format, args...)} }

// Validate checks the options and fills in defaults for zero values.
func (o *Options) Validate() error {
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.Port < 0 || o.Port > 65535 {
		return usagef("-p %d: not a TCP port", o.Port)
	}
	if o.Size < 0 || o.Size > MaxSize {
		return usagef("-s %d: must be 0 to 2^31 bytes", o.Size)
	}
	if o.Iters < 1 {
		return usagef("-n %d: need at least one exchange", o.Iters)
	}
	if o.RxDepth < 1 || o.RxDepth > softrdma.MaxCQE-1 {
		return usagef("-r %d: 1 to %d", o.RxDepth, softrdma.MaxCQE-1)
	}
	if mtuCode(o.MTU) == 0 {
		return usagef("-m %d: path MTU must be 256, 512, 1024, 2048 or 4096", o.MTU)
	}
	if o.IdleTimeout < 0 {
		return usagef("--idle-timeout %v: must be 0 or more", o.IdleTimeout)
	}
	if o.IdleTimeout > 0 && o.IdleTimeout < MinIdleTimeout {
		// A shorter bound cuts healthy runs (a scheduling pause, the
		// first ODP fault) and blames the peer.
		return usagef("--idle-timeout %v: must be 0 (wait for ever) or at least %v", o.IdleTimeout, MinIdleTimeout)
	}
	if o.SetupTimeout < 0 {
		return usagef("setup timeout %v: must be 0 or more", o.SetupTimeout)
	}
	if o.SetupTimeout == 0 {
		o.SetupTimeout = DefaultSetupTimeout
	}
	if o.SL < 0 || o.SL > 15 {
		return usagef("-l %d: service level is 0-15", o.SL)
	}
	if err := o.ODP.Validate(); err != nil {
		return usagef("%v", err)
	}
	if o.ODP.Budget != 0 || o.ODP.FaultPolicy != "" {
		return usagef("the ODP budget and fault policy are not options of ibv_rc_pingpong")
	}
	switch o.Type {
	case 0:
		o.Type = softrdma.QPTypeRC
	case softrdma.QPTypeRC, softrdma.QPTypeUC:
	case softrdma.QPTypeUD:
		if o.ODP.Enabled() {
			return usagef("-o, -O: ud-pingpong has no on-demand paging")
		}
		if o.Size > o.MTU {
			// ud_pingpong: "Requested size larger than port MTU".
			return usagef("-s %d: requested size larger than the MTU (%d)", o.Size, o.MTU)
		}
		if o.Check {
			return usagef("-c: ud-pingpong has no -c")
		}
	default:
		return usagef("QP type %v: RC, UC or UD", o.Type)
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	return nil
}

// udQKey is ud_pingpong's Q_Key.
const udQKey = 0x11111111

// name returns the command's name, for messages.
func (o *Options) name() string {
	switch o.Type {
	case softrdma.QPTypeUC:
		return "uc-pingpong"
	case softrdma.QPTypeUD:
		return "ud-pingpong"
	}
	return "rc-pingpong"
}

// grh is the room a UD receive needs before the message: the GRH.
func (o *Options) grh() int {
	if o.Type == softrdma.QPTypeUD {
		return softrdma.GRHSize
	}
	return 0
}

func mtuCode(bytes int) softrdma.MTU {
	for m := softrdma.MTU256; m <= softrdma.MTU4096; m++ {
		if m.Bytes() == bytes {
			return m
		}
	}
	return 0
}

// run is one rc-pingpong: the device, its resources and the loop state.
type run struct {
	o      *Options
	dev    *softrdma.Device
	tap    *pcaptap.Writer
	pd     *softrdma.PD
	buf    []byte // the registered buffer (page aligned); messages use buf[:o.Size]
	mr     *softrdma.MR
	base   uint64         // the IOVA of buf[0] through mr
	odp    *odpbuf.Buffer // -o, -O: buf registered on demand (nil: pinned)
	cq     *softrdma.CQ
	qp     *softrdma.QP
	my     Dest
	rem    Dest
	peer   netip.AddrPort // the peer's RoCEv2 address
	ah     *softrdma.AH   // UD: the address handle of the peer
	wcs    []softrdma.WC
	want   []byte // Verify: what the next message received must hold (nil: not known yet)
	checks int    // Verify: messages checked
}

// Run runs rc_pingpong as a client (o.Server set) or a server. It returns
// a *UsageError for bad options, ErrData (wrapped) for bad data, and other
// errors with the message rc_pingpong prints.
func Run(ctx context.Context, o Options) (err error) {
	if err := o.Validate(); err != nil {
		return err
	}
	bind, err := parseBind(o.Bind)
	if err != nil {
		return err
	}
	r := &run{o: &o, wcs: make([]softrdma.WC, 2)}
	defer r.close()
	if o.Pcap != "" { // before the wait for a peer, so that a bad path fails at once
		if r.tap, err = pcaptap.Create(o.Pcap); err != nil {
			return fmt.Errorf("--pcap: %w", err)
		}
	}
	// With --bind IP the device opens first, as pp_init_ctx runs before
	// the exchange: an address it cannot bind fails before the wait for a
	// peer. Without, its IP is the TCP connection's.
	early := bind.Addr().IsValid()
	if early {
		if err := r.setup(bind); err != nil {
			return err
		}
	}

	var c net.Conn
	if o.Server != "" {
		c, err = dial(ctx, o.Server, o.Port, o.ConnectTimeout)
	} else {
		c, err = accept(ctx, o.Listener, o.Port, bind.Addr())
	}
	if err != nil {
		return err
	}
	// The setup limit starts with the connection and bounds the whole
	// exchange, both ways.
	c.SetDeadline(time.Now().Add(o.SetupTimeout))
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer func() {
		stop()
		c.Close()
	}()

	if !early {
		bind = netip.AddrPortFrom(addrOf(c.LocalAddr()), wire.RoCEv2Port)
		if err := r.setup(bind); err != nil {
			return err
		}
	}
	fmt.Fprintf(o.Stdout, "  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n",
		r.my.LID, r.my.QPN, r.my.PSN, GIDString(r.my.GID))

	tcpPeer := addrOf(c.RemoteAddr())
	if o.Server != "" {
		r.rem, err = ClientExchange(c, &r.my)
	} else {
		r.rem, err = ServerExchange(c, &r.my, func(rem Dest) error { return r.connect(rem, tcpPeer) })
	}
	stop()
	c.Close()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return r.exchangeErr(err, c.RemoteAddr())
	}
	fmt.Fprintf(o.Stdout, "  remote address: LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n",
		r.rem.LID, r.rem.QPN, r.rem.PSN, GIDString(r.rem.GID))
	if o.Server != "" {
		if err := r.connect(r.rem, tcpPeer); err != nil {
			return err
		}
	}
	return r.pingpong(ctx)
}

// exchangeErr explains err, an error of the TCP exchange with the peer at
// addr: the peer's silence past the setup limit, a connection closed
// before the message, a message that is not an address.
func (r *run) exchangeErr(err error, addr net.Addr) error {
	var re *ExchangeReadError
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &SetupTimeoutError{fmt.Sprintf("the peer at %s connected but did not complete the exchange within %v: "+
			"is it a softrdma or %s peer?", addr, r.o.SetupTimeout, r.o.tool()), err}
	case errors.Is(err, ErrBadMsg):
		return fmt.Errorf("the peer at %s is not a softrdma or %s peer: %w", addr, r.o.tool(), err)
	case errors.As(err, &re) && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)):
		if re.Got > 0 {
			return fmt.Errorf("the peer at %s closed the connection before sending %s (%d of %d bytes received)",
				addr, re.What, re.Got, re.Want)
		}
		return fmt.Errorf("the peer at %s closed the connection before sending %s", addr, re.What)
	}
	return err
}

// SetupTimeoutError is an exchange that did not complete within
// Options.SetupTimeout; it reads as its message and unwraps to the
// timeout.
type SetupTimeoutError struct {
	msg string
	err error
}

func (e *SetupTimeoutError) Error() string { return e.msg }
func (e *SetupTimeoutError) Unwrap() error { return e.err }

// setup opens the device on bind and creates what pp_init_ctx does, posts
// rx_depth receives and picks the PSN.
func (r *run) setup(bind netip.AddrPort) error {
	o := r.o
	cfg := softrdma.Config{Addr: bind, Logf: o.Logf, SourcePort: o.SourcePort}
	if r.tap != nil {
		cfg.Tap = r.tap
	}
	var err error
	if r.dev, err = softrdma.Open(cfg); err != nil {
		return fmt.Errorf("couldn't open the device: %w", err)
	}
	if port := r.dev.LocalAddr().Port(); port != wire.RoCEv2Port {
		// The port bound, not the one asked for (--bind IP:0).
		r.logf("%s: the device binds UDP port %d; a stock peer sends to %d (the exchange has no port)",
			o.name(), port, wire.RoCEv2Port)
	}
	if mtu := r.dev.Attr().ActiveMTU.Bytes(); o.Type == softrdma.QPTypeUD && o.Size > mtu {
		// ud_pingpong: "Requested size larger than port MTU (%d)".
		return usagef("-s %d: requested size larger than the port's MTU (%d)", o.Size, mtu)
	}
	if r.pd, err = r.dev.AllocPD(); err != nil {
		return fmt.Errorf("couldn't allocate PD: %w", err)
	}
	page := os.Getpagesize()
	n := (max(o.Size+o.grh(), 1) + page - 1) / page * page
	if o.ODP.Enabled() {
		// -o: ibv_reg_mr(buf, size) with IBV_ACCESS_ON_DEMAND; -O:
		// ibv_reg_mr(NULL, SIZE_MAX), the buffer reached at its own
		// address. The buffer is memory of the device's address space,
		// which the NIC faults in page by page.
		if r.odp, err = odpbuf.New(r.dev, r.pd, n, softrdma.AccessLocalWrite, o.ODP); err != nil {
			return fmt.Errorf("couldn't register MR: %w", err)
		}
		r.buf, r.mr, r.base = r.odp.Mem, r.odp.MR, r.odp.Base
	} else {
		// memalign(page_size, size), as pp_init_ctx; outside the Go heap,
		// like memory a NIC writes by DMA.
		if r.buf, err = unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
			return fmt.Errorf("couldn't allocate work buf: %w", err)
		}
		if r.mr, err = r.dev.RegMR(r.pd, r.buf, softrdma.AccessLocalWrite); err != nil {
			return fmt.Errorf("couldn't register MR: %w", err)
		}
		r.base = r.mr.Addr()
	}
	// memset 0x7b, as pp_init_ctx. On an ODP buffer this is the
	// application's write: the NIC still faults the pages in.
	for i := range r.buf[:o.Size+o.grh()] {
		r.buf[i] = 0x7b
	}
	if o.ODP.Prefetch {
		// ibv_advise_mr(PREFETCH_WRITE, FLUSH) of the message through the
		// MR, as pp_init_ctx does with -P; a failure is not fatal there.
		if err := r.odp.Prefetch(r.dev, r.pd, o.Size+o.grh()); err != nil {
			r.logf("%s: couldn't prefetch MR (%v); continuing anyway", o.name(), err)
		}
	}
	if r.cq, err = r.dev.CreateCQ(o.RxDepth + 1); err != nil {
		return fmt.Errorf("couldn't create CQ: %w", err)
	}
	r.qp, err = r.dev.CreateQP(r.pd, softrdma.QPInitAttr{
		SendCQ: r.cq, RecvCQ: r.cq, Type: o.Type,
		Cap: softrdma.Cap{MaxSendWR: 1, MaxRecvWR: o.RxDepth, MaxSendSGE: 1, MaxRecvSGE: 1},
	})
	if err != nil {
		return fmt.Errorf("couldn't create QP: %w", err)
	}
	// RESET -> INIT with qp_access_flags 0, as pp_init_ctx (UD: the
	// Q_Key instead).
	init, mask := &softrdma.QPAttr{State: softrdma.QPStateInit, PKeyIndex: 0, Port: 1},
		softrdma.QPAttrState|softrdma.QPAttrPKeyIndex|softrdma.QPAttrPort|softrdma.QPAttrAccessFlags
	if o.Type == softrdma.QPTypeUD {
		init.QKey, mask = udQKey, mask&^softrdma.QPAttrAccessFlags|softrdma.QPAttrQKey
	}
	if err := r.qp.Modify(init, mask); err != nil {
		return fmt.Errorf("failed to modify QP to INIT: %w", err)
	}
	if routs := r.postRecv(o.RxDepth); routs < o.RxDepth {
		return fmt.Errorf("couldn't post receive (%d)", routs)
	}
	r.my = Dest{LID: 0, QPN: uint32(r.qp.QPN()), PSN: randPSN()}
	if o.GIDIndex >= 0 {
		r.my.GID = r.dev.GID()
	} else {
		r.logf("%s: without -g this side advertises the zero GID, which a RoCE peer cannot address (use -g 1 with rxe)", o.name())
	}
	return nil
}

// connect is pp_connect_ctx: INIT -> RTR -> RTS towards rem. The peer's
// RoCEv2 address is the IP its GID stands for (UDP port 4791); a peer that
// sent the zero GID (no -g) is reached at the address of its TCP
// connection, since softrdma has no path without a GRH.
func (r *run) connect(rem Dest, tcpPeer netip.Addr) error {
	ip := GIDAddr(rem.GID)
	switch {
	case !HasGRH(rem.GID):
		r.logf("%s: the peer's GID is zero (no -g on its side); addressing it at %v, its TCP address", r.o.name(), tcpPeer)
		ip = tcpPeer
	case ip.Is6() && ip.IsLinkLocalUnicast():
		return fmt.Errorf("the peer's GID %v is link-local, which needs an interface; give the peer the -g index of a routable GID", ip)
	}
	local := r.dev.LocalAddr().Addr()
	if ip.Is4() != local.Is4() {
		return fmt.Errorf("the peer's address %v and this device's %v are of different IP families (see -g on the peer, --bind here)", ip, local)
	}
	r.peer = netip.AddrPortFrom(ip, wire.RoCEv2Port)
	switch r.o.Type {
	case softrdma.QPTypeUC:
		return r.connectUC(rem)
	case softrdma.QPTypeUD:
		return r.connectUD(rem)
	}
	if err := r.qp.Modify(&softrdma.QPAttr{
		State: softrdma.QPStateRTR, Dest: r.peer, PathMTU: mtuCode(r.o.MTU), DestQPN: softrdma.QPN(rem.QPN),
		RQPSN: softrdma.PSN(rem.PSN), MaxDestRdAtomic: rdAtomic, MinRNRTimer: minRNRTimer,
	}, softrdma.QPAttrState|softrdma.QPAttrAV|softrdma.QPAttrPathMTU|softrdma.QPAttrDestQPN|
		softrdma.QPAttrRQPSN|softrdma.QPAttrMaxDestRdAtomic|softrdma.QPAttrMinRNRTimer); err != nil {
		return fmt.Errorf("failed to modify QP to RTR: %w", err)
	}
	if err := r.qp.Modify(&softrdma.QPAttr{
		State: softrdma.QPStateRTS, Timeout: qpTimeout, RetryCnt: retryCnt, RNRRetry: rnrRetry,
		SQPSN: softrdma.PSN(r.my.PSN), MaxRdAtomic: rdAtomic,
	}, softrdma.QPAttrState|softrdma.QPAttrTimeout|softrdma.QPAttrRetryCnt|softrdma.QPAttrRNRRetry|
		softrdma.QPAttrSQPSN|softrdma.QPAttrMaxQPRdAtomic); err != nil {
		return fmt.Errorf("failed to modify QP to RTS: %w", err)
	}
	return nil
}

// connectUC is uc_pingpong's pp_connect_ctx: RTR with the path (no
// READ/atomic credits or RNR timer) and RTS with the SQ PSN only.
func (r *run) connectUC(rem Dest) error {
	if err := r.qp.Modify(&softrdma.QPAttr{
		State: softrdma.QPStateRTR, Dest: r.peer, PathMTU: mtuCode(r.o.MTU), DestQPN: softrdma.QPN(rem.QPN),
		RQPSN: softrdma.PSN(rem.PSN),
	}, softrdma.QPAttrState|softrdma.QPAttrAV|softrdma.QPAttrPathMTU|softrdma.QPAttrDestQPN|softrdma.QPAttrRQPSN); err != nil {
		return fmt.Errorf("failed to modify QP to RTR: %w", err)
	}
	if err := r.qp.Modify(&softrdma.QPAttr{State: softrdma.QPStateRTS, SQPSN: softrdma.PSN(r.my.PSN)},
		softrdma.QPAttrState|softrdma.QPAttrSQPSN); err != nil {
		return fmt.Errorf("failed to modify QP to RTS: %w", err)
	}
	return nil
}

// connectUD is ud_pingpong's pp_connect_ctx: RTR, RTS with the SQ PSN,
// and an address handle for the peer (GRH with hop limit 1).
func (r *run) connectUD(rem Dest) error {
	if err := r.qp.Modify(&softrdma.QPAttr{State: softrdma.QPStateRTR}, softrdma.QPAttrState); err != nil {
		return fmt.Errorf("failed to modify QP to RTR: %w", err)
	}
	if err := r.qp.Modify(&softrdma.QPAttr{State: softrdma.QPStateRTS, SQPSN: softrdma.PSN(r.my.PSN)},
		softrdma.QPAttrState|softrdma.QPAttrSQPSN); err != nil {
		return fmt.Errorf("failed to modify QP to RTS: %w", err)
	}
	attr := softrdma.AHAttrFor(r.peer)
	attr.GRH.HopLimit, attr.SL = 1, uint8(r.o.SL)
	var err error
	if r.ah, err = r.dev.CreateAH(r.pd, attr); err != nil {
		return fmt.Errorf("failed to create AH: %w", err)
	}
	return nil
}

// sge is the message: the buffer, after the GRH on UD.
func (r *run) sge() softrdma.SGE {
	return softrdma.SGE{Addr: r.base + uint64(r.o.grh()), Length: uint32(r.o.Size), LKey: r.mr.LKey()}
}

// postRecv posts up to n receives of the whole message into the buffer
// and returns how many it posted (pp_post_recv; UD: the GRH and the
// message).
func (r *run) postRecv(n int) int {
	sge := r.sge()
	sge.Addr, sge.Length = r.base, sge.Length+uint32(r.o.grh())
	wr := softrdma.RecvWR{WRID: recvWRID, SGL: []softrdma.SGE{sge}}
	for i := range n {
		if _, err := r.qp.PostRecv(wr); err != nil {
			return i
		}
	}
	return n
}

func (r *run) postSend() error {
	wr := softrdma.SendWR{WRID: sendWRID, Opcode: softrdma.WRSend,
		SGL: []softrdma.SGE{r.sge()}, Flags: softrdma.SendSignaled}
	if r.ah != nil {
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = r.ah, softrdma.QPN(r.rem.QPN), udQKey
	}
	_, err := r.qp.PostSend(wr)
	if err != nil {
		return fmt.Errorf("couldn't post send: %w", err)
	}
	return nil
}

// pingpong is rc_pingpong's main loop and report.
func (r *run) pingpong(ctx context.Context) error {
	o := r.o
	page := os.Getpagesize()
	msg := r.buf[o.grh() : o.grh()+o.Size]
	pending := recvWRID
	if o.Server != "" {
		if o.Verify {
			seed := o.Seed
			if seed == 0 {
				seed = randSeed()
			}
			fill(msg, seed)
		}
		if o.Check {
			for i := 0; i < o.Size; i += page {
				msg[i] = 0 // i / page_size % sizeof(char)
			}
		}
		if o.Verify {
			r.want = bytes.Clone(msg)
		}
		if err := r.postSend(); err != nil {
			return err
		}
		pending |= sendWRID
	}
	start := time.Now()
	ctx, idle := r.watchIdle(ctx)
	defer idle.Stop()
	routs, rcnt, scnt := o.RxDepth, 0, 0
	for rcnt < o.Iters || scnt < o.Iters {
		wcs, err := r.poll(ctx)
		if err != nil {
			if idle.Expired() {
				if port := r.dev.LocalAddr().Port(); min(rcnt, scnt) == 0 && port != wire.RoCEv2Port {
					// Nothing ever came back: the peer, told no port,
					// sends to this side's IP at 4791, where this
					// device is not.
					return fmt.Errorf("no completion for %v (--idle-timeout) after 0 of %d exchanges (-n %d): "+
						"this side's device is on UDP %d, not %d, and %s's exchange carries no port: the peer sends to %d "+
						"(give each side its own IP with --bind IP, both on UDP %d)",
						o.IdleTimeout, o.Iters, o.Iters, port, wire.RoCEv2Port, o.tool(), wire.RoCEv2Port, wire.RoCEv2Port)
				}
				return fmt.Errorf("no completion for %v (--idle-timeout) after %d of %d exchanges (-n %d): "+
					"the peer stopped or went away (was it given a smaller -n? %s's exchange does not carry it)",
					o.IdleTimeout, min(rcnt, scnt), o.Iters, o.Iters, o.tool())
			}
			return err
		}
		if len(wcs) > 0 {
			idle.Progress()
		}
		for i := range wcs {
			wc := &wcs[i]
			if wc.Status != softrdma.WCSuccess {
				hint := ""
				if wc.Status == softrdma.WCLocLenErr || wc.Status == softrdma.WCRemInvReqErr {
					// A message longer than the receiver's buffer: the
					// receive fails with a local length error, the send
					// with a remote invalid request (as on rxe).
					hint = fmt.Sprintf(" (did the peer run with another -s? both sides need the same -s, here %d; %s's exchange does not carry it)",
						o.Size, o.tool())
				}
				return fmt.Errorf("failed status %s (%d) for wr_id %d%s", wc.Status, wc.Status, wc.WRID, hint)
			}
			switch wc.WRID {
			case sendWRID:
				scnt++
			case recvWRID:
				if routs--; routs <= 1 {
					routs += r.postRecv(o.RxDepth - routs)
					if routs < o.RxDepth {
						return fmt.Errorf("couldn't post receive (%d)", routs)
					}
				}
				rcnt++
				if err := r.verify(wc, msg, rcnt); err != nil {
					return err
				}
			default:
				return fmt.Errorf("completion for unknown wr_id %d", wc.WRID)
			}
			pending &^= int(wc.WRID)
			if scnt < o.Iters && pending == 0 {
				if err := r.postSend(); err != nil {
					return err
				}
				pending = recvWRID | sendWRID
			}
		}
	}
	usec := float64(time.Since(start).Microseconds())
	bytes := int64(o.Size) * int64(o.Iters) * 2
	fmt.Fprintf(o.Stdout, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, usec/1e6, float64(bytes)*8/usec)
	fmt.Fprintf(o.Stdout, "%d iters in %.2f seconds = %.2f usec/iter\n", o.Iters, usec/1e6, usec/float64(o.Iters))
	var bad error
	if o.Server == "" && o.Check {
		for i := 0; i < o.Size; i += page {
			if msg[i] != 0 {
				fmt.Fprintf(o.Stdout, "invalid data in page %d\n", i/page)
				bad = fmt.Errorf("%w: -c: page %d starts with 0x%02x", ErrData, i/page, msg[i])
			}
		}
	}
	if o.Verify {
		fmt.Fprintf(o.Stdout, "verified %d messages of %d bytes\n", r.checks, o.Size)
	}
	if r.odp != nil {
		// The buffer's ODP counters and fault latency, as the perftest-
		// style tools print them (docs/cli.md).
		report.PrintODP(o.Stdout, "local", r.odp.Report(r.dev))
	}
	time.Sleep(linger)
	return bad
}

// watchIdle returns ctx, cancelled once o.IdleTimeout passes without a
// completion (if o.IdleTimeout is set), and its watch (idlewatch; nil
// without a limit).
func (r *run) watchIdle(ctx context.Context) (context.Context, *idlewatch.Watch) {
	return idlewatch.Start(ctx, r.o.IdleTimeout)
}

// tool is the rdma-core tool this run stands in for.
func (o *Options) tool() string {
	return "ibv_" + strings.ReplaceAll(o.name(), "-", "_")
}

// verify checks the message a receive completion reports (Verify).
func (r *run) verify(wc *softrdma.WC, msg []byte, n int) error {
	if !r.o.Verify {
		return nil
	}
	if int(wc.ByteLen) != len(msg)+r.o.grh() {
		return fmt.Errorf("%w: message %d is %d bytes, expected %d", ErrData, n, wc.ByteLen, len(msg)+r.o.grh())
	}
	if r.want == nil { // server: the first message is the reference
		r.want = bytes.Clone(msg)
	} else if !bytes.Equal(msg, r.want) {
		i := 0
		for msg[i] == r.want[i] {
			i++
		}
		return fmt.Errorf("%w: message %d differs at byte %d: 0x%02x, expected 0x%02x", ErrData, n, i, msg[i], r.want[i])
	}
	r.checks++
	return nil
}

// poll returns completions: with -e it blocks (ibv_get_cq_event), else it
// polls, yielding, and blocks after spinFor.
func (r *run) poll(ctx context.Context) ([]softrdma.WC, error) {
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	var start time.Time
	for i := 0; !r.o.Events; i++ {
		n, err := r.cq.Poll(r.wcs)
		if n > 0 || err != nil {
			return r.wcs[:n], pollErr(err)
		}
		if i&15 == 15 {
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > spinFor {
				break
			}
		}
		runtime.Gosched()
	}
	n, err := r.cq.Wait(ctx, r.wcs)
	return r.wcs[:n], pollErr(err)
}

func pollErr(err error) error {
	switch {
	case err == nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return fmt.Errorf("poll CQ failed: %w", err)
}

// close releases everything and then prints the counters (Stat), also
// after a failure; it is safe on a partly set up run. The counters come
// last: the ACKs of the receive loop's last batch may leave only while
// the device closes (a completion is visible before its ACK is sent, as
// on rxe), and counters read before would miss them.
func (r *run) close() {
	if r.qp != nil {
		r.dev.DestroyQP(r.qp)
	}
	if r.ah != nil {
		r.dev.DestroyAH(r.ah)
	}
	if r.mr != nil {
		r.dev.DeregMR(r.mr)
	}
	// An ODP buffer goes back to the address space before the device
	// closes it.
	if r.odp != nil {
		if err := r.odp.Free(); err != nil {
			r.logf("%s: free the ODP buffer: %v", r.o.name(), err)
		}
	} else if r.buf != nil {
		unix.Munmap(r.buf)
	}
	if r.dev != nil {
		r.dev.Close()
	}
	if r.o.Stat && r.dev != nil {
		fmt.Fprintf(r.o.Stdout, "softrdma counters (%v <-> %v):\n", r.dev.LocalAddr(), r.peer)
		for _, c := range r.dev.Snapshot() {
			if c.Value != 0 {
				fmt.Fprintf(r.o.Stdout, "  %s = %d\n", c.Name, c.Value)
			}
		}
	}
	if r.tap != nil {
		if err := r.tap.Close(); err != nil {
			r.logf("%s: --pcap: %v", r.o.name(), err)
		}
	}
}

func (r *run) logf(format string, args ...any) {
	if r.o.Logf != nil {
		r.o.Logf(format, args...)
	}
}

// dial connects to the server, retrying refused connections for up to
// timeout.
func dial(ctx context.Context, host string, port int, timeout time.Duration) (net.Conn, error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	deadline := time.Now().Add(timeout)
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Now().Add(retryEvery).After(deadline) {
			return nil, fmt.Errorf("couldn't connect to %s:%d: %w", host, port, err)
		}
		select {
		case <-time.After(retryEvery):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// accept waits for one client on ln, or on a listener of port (all
// addresses, as AI_PASSIVE; IPv6 too when the device's address, if
// known, is IPv6: hostaddr.ListenAll).
func accept(ctx context.Context, ln net.Listener, port int, device netip.Addr) (net.Conn, error) {
	if ln == nil {
		var err error
		if ln, err = hostaddr.ListenAll(port, device); err != nil {
			return nil, fmt.Errorf("couldn't listen to port %d: %w", port, err)
		}
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	c, err := ln.Accept()
	ln.Close() // rc_pingpong serves one client
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("accept() failed: %w", err)
	}
	return c, nil
}

func addrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(t.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

// parseBind parses --bind: "IP" or "IP:port" (IPv6 as "[IP]:port"); the
// port defaults to 4791.
func parseBind(s string) (netip.AddrPort, error) {
	if s == "" {
		return netip.AddrPort{}, nil
	}
	var ap netip.AddrPort
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		ap = netip.AddrPortFrom(a.Unmap(), wire.RoCEv2Port)
	} else if ap, err = netip.ParseAddrPort(s); err != nil {
		return ap, usagef("--bind %q: want IP or IP:port", s)
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if ap.Addr().IsUnspecified() {
		return ap, usagef("--bind %v: the RoCE device needs a specific IP (it is the device's GID)", ap.Addr())
	}
	return ap, nil
}

// fill writes a pseudo-random pattern of seed into b.
func fill(b []byte, seed uint64) {
	g := mrand.NewPCG(seed, 18515)
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(w[:], g.Uint64())
		copy(b[i:], w[:])
	}
}

// randPSN is lrand48() & 0xffffff.
func randPSN() uint32 { return uint32(randSeed()) & 0xffffff }

func randSeed() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}
