// Package rping is `softrdma rping`: librdmacm's rping example
// (rdma-core librdmacm/examples/rping.c), connected with the connection
// manager (package rdmacm), so that it runs against a stock rping on
// either side.
//
// The ping-pong, as rping does it, per iteration:
//
//	client: SEND {addr, rkey, size} of its source buffer (16 bytes, big-endian)
//	server: RDMA READ of size bytes from it; SEND "go ahead" (16 bytes)
//	client: SEND {addr, rkey, size} of its sink buffer
//	server: RDMA WRITE of strlen+1 bytes into it; SEND "go ahead"
//	client: compare source and sink (-V), print the sink (-v)
//
// The source holds "rdma-ping-N: " and then letters from 'A' + N (mod
// 58) cycling through 'A'..'z', NUL-terminated at size-1. The client ends
// with rdma_disconnect after -C iterations; the server ends at the
// disconnect.
package rping

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/hostaddr"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/idlewatch"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/transport/pcaptap"
	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/mad"
	"golang.org/x/sys/unix"
)

// Limits and defaults of rping.c.
const (
	DefaultPort = 7174
	DefaultSize = 64
	// MinSize is RPING_MIN_BUFSIZE: sizeof("2147483647") +
	// sizeof("rdma-ping-%d: ") = 11 + 15.
	MinSize = 26
	// MaxSize is RPING_BUFSIZE - 1.
	MaxSize = 64*1024 - 1

	infoSize = 16 // struct rping_rdma_info: be64 buf, be32 rkey, be32 size
	sqDepth  = 16 // RPING_SQ_DEPTH
)

// Options are rping's flags, then softrdma's.
type Options struct {
	Server   bool   // -s
	Client   bool   // -c
	Addr     string // -a: the server's address (client) or the address to bind (server; default: the host's only address)
	Source   string // -I: the client's source address
	Port     int    // -p (default 7174)
	Count    int    // -C: iterations; 0 runs until interrupted (client)
	Size     int    // -S: ping data size, MinSize..MaxSize (default 64)
	Verbose  bool   // -v: print the ping data
	Validate bool   // -V: compare what came back with what was sent
	Debug    bool   // -d

	// Bind is the RoCEv2 address of this side's device (IP[:PORT];
	// default: the -a address on the server, the -I address or the one
	// routed towards the server on the client; UDP port 4791).
	Bind string
	// RoCEPort is the UDP port of the server's device (client; default
	// 4791, every RoCE NIC's).
	RoCEPort int
	Pcap     string
	Stat     bool
	// Timeout bounds the connection set-up (default: the CM's retries,
	// about a minute).
	Timeout time.Duration
	// ConnectTimeout: the client tries again, for this long, while the
	// server refuses with REJ "invalid service ID" (nobody listens yet);
	// 0: one attempt, as rping.
	ConnectTimeout time.Duration
	// IdleTimeout ends a connected run (exit 1) once no completion came
	// and the device received no packet for this long (0: wait for
	// ever, as rping). A killed rping's kernel CM sends a DREQ, so the
	// real rping's peer sees the disconnection; softrdma's CM lives in
	// the process, and a peer killed with SIGKILL sends nothing, while
	// the QPs retry for ever (retry_cnt 7, as on rxe).
	IdleTimeout time.Duration

	Stdout, Stderr io.Writer
}

// UsageError is a bad flag: exit status 2.
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &UsageError{fmt.Sprintf(format, args...)} }

// Validate checks the flags as rping's getopt loop does.
func (o *Options) validate() error {
	if o.Server == o.Client {
		return usagef("give -s (server) or -c (client)")
	}
	if o.Size == 0 {
		o.Size = DefaultSize
	}
	if o.Size < MinSize || o.Size > MaxSize {
		return usagef("Invalid size %d (valid range is %d to %d)", o.Size, MinSize, MaxSize)
	}
	if o.Count < 0 {
		return usagef("Invalid count %d", o.Count)
	}
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.Port < 0 || o.Port > 65535 {
		return usagef("-p %d: not a port", o.Port)
	}
	if o.RoCEPort < 0 || o.RoCEPort > 65535 {
		return usagef("--roce-port %d: not a port", o.RoCEPort)
	}
	if o.Client && o.Addr == "" {
		return usagef("the client needs -a, the server's address")
	}
	return nil
}

// ErrMismatch is -V finding the echo different from the source.
var ErrMismatch = errors.New("data mismatch!")

type side struct {
	o      *Options
	dev    *softrdma.Device
	cm     *rdmacm.CM
	tap    *pcaptap.Writer
	pd     *softrdma.PD
	cq     *softrdma.CQ
	qp     *softrdma.QP
	conn   *rdmacm.Conn
	recv   []byte // rping_rdma_info received
	send   []byte // rping_rdma_info sent
	rdma   []byte // the server's READ sink and WRITE source; the client's WRITE sink
	start  []byte // the client's READ source
	mrRecv *softrdma.MR
	mrSend *softrdma.MR
	mrRDMA *softrdma.MR
	mrSrc  *softrdma.MR
	wcs    [4]softrdma.WC
	maps   [][]byte         // the buffers' mappings, unmapped at close
	idle   *idlewatch.Watch // of the connected run (Options.IdleTimeout)
	pings  int              // the client's pings done, the server's served
}

// Run runs rping as o says.
func Run(ctx context.Context, o Options) (err error) {
	if err := o.validate(); err != nil {
		return err
	}
	s := &side{o: &o}
	defer s.close()
	ip, err := resolve(o.Addr)
	if err != nil {
		return err
	}
	bind, err := s.bindAddr(ip)
	if err != nil {
		return err
	}
	if err := s.open(bind); err != nil {
		return err
	}
	if o.Server {
		return s.server(ctx)
	}
	return s.client(ctx, netip.AddrPortFrom(ip, uint16(o.Port)))
}

// resolve returns the address -a names (getaddrinfo: a name or an IP);
// "" is the IPv4 any address, as rping's default sockaddr.
func resolve(a string) (netip.Addr, error) {
	if a == "" {
		return netip.IPv4Unspecified(), nil
	}
	if ip, err := netip.ParseAddr(a); err == nil {
		return ip.Unmap(), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", a)
	if err != nil || len(ips) == 0 {
		return netip.Addr{}, usagef("getaddrinfo failed - invalid hostname or IP address: %s", a)
	}
	return ips[0].Unmap(), nil
}

// bindAddr picks the device's UDP address.
func (s *side) bindAddr(ip netip.Addr) (netip.AddrPort, error) {
	o := s.o
	if o.Bind != "" {
		if ap, err := netip.ParseAddrPort(o.Bind); err == nil {
			return ap, nil
		}
		a, err := netip.ParseAddr(o.Bind)
		if err != nil {
			return netip.AddrPort{}, usagef("--bind %q: want IP or IP:PORT", o.Bind)
		}
		return netip.AddrPortFrom(a, wire.RoCEv2Port), nil
	}
	if o.Server {
		if ip.IsUnspecified() {
			// rping's server binds every address; a softrdma device has
			// one: the host's only usable address.
			sole, err := hostaddr.Sole()
			if err != nil {
				return netip.AddrPort{}, usagef("the server's device needs an address: %v: give one with -a or --bind", err)
			}
			ip = sole
		}
		return netip.AddrPortFrom(ip, wire.RoCEv2Port), nil
	}
	if o.Source != "" {
		src, err := resolve(o.Source)
		if err != nil {
			return netip.AddrPort{}, err
		}
		return netip.AddrPortFrom(src, wire.RoCEv2Port), nil
	}
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, wire.RoCEv2Port)))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("no route to %v: %w", ip, err)
	}
	defer c.Close()
	return netip.AddrPortFrom(c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), wire.RoCEv2Port), nil
}

func (s *side) debugf(format string, args ...any) {
	if s.o.Debug {
		fmt.Fprintf(s.o.Stdout, format+"\n", args...)
	}
}

// open opens the device and its CM.
func (s *side) open(bind netip.AddrPort) error {
	o := s.o
	cfg := softrdma.Config{Addr: bind, Logf: func(f string, a ...any) { fmt.Fprintf(o.Stderr, f+"\n", a...) }}
	if o.Pcap != "" {
		var err error
		if s.tap, err = pcaptap.Create(o.Pcap); err != nil {
			return fmt.Errorf("--pcap: %w", err)
		}
		cfg.Tap = s.tap
	}
	var err error
	if s.dev, err = softrdma.Open(cfg); err != nil {
		return fmt.Errorf("couldn't open the device on %v: %w", bind, err)
	}
	if s.cm, err = rdmacm.Open(s.dev, rdmacm.Options{Logf: cfg.Logf}); err != nil {
		return err
	}
	s.debugf("device on %v, CM on QP1", s.dev.LocalAddr())
	return nil
}

// setup creates what rping_setup_qp and rping_setup_buffers create.
func (s *side) setup() error {
	var err error
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return err
	}
	if s.cq, err = s.dev.CreateCQ(sqDepth * 2); err != nil {
		return err
	}
	if s.qp, err = s.dev.CreateQP(s.pd, softrdma.QPInitAttr{Type: softrdma.QPTypeRC, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: softrdma.Cap{MaxSendWR: sqDepth, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return err
	}
	// INIT, as rdma_create_qp leaves it, so that the receive can be
	// posted before the connection.
	if err = s.qp.Modify(&softrdma.QPAttr{State: softrdma.QPStateInit, Port: 1},
		softrdma.QPAttrState|softrdma.QPAttrPKeyIndex|softrdma.QPAttrPort|softrdma.QPAttrAccessFlags); err != nil {
		return err
	}
	rw := softrdma.AccessLocalWrite | softrdma.AccessRemoteRead | softrdma.AccessRemoteWrite
	// Outside the Go heap (mmap), like memory a NIC reads and writes by
	// DMA: the application's and the NIC's accesses are ordered by the
	// protocol's messages, which the race detector cannot see.
	reg := func(n int, access softrdma.Access) ([]byte, *softrdma.MR, error) {
		b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			return nil, nil, fmt.Errorf("couldn't allocate %d bytes: %w", n, err)
		}
		s.maps = append(s.maps, b)
		mr, err := s.dev.RegMR(s.pd, b, access)
		return b, mr, err
	}
	if s.recv, s.mrRecv, err = reg(infoSize, softrdma.AccessLocalWrite); err != nil {
		return err
	}
	if s.send, s.mrSend, err = reg(infoSize, 0); err != nil {
		return err
	}
	if s.rdma, s.mrRDMA, err = reg(s.o.Size, rw); err != nil {
		return err
	}
	if s.o.Client {
		if s.start, s.mrSrc, err = reg(s.o.Size, rw); err != nil {
			return err
		}
	}
	return s.postRecv()
}

func (s *side) postRecv() error {
	_, err := s.qp.PostRecv(softrdma.RecvWR{SGL: []softrdma.SGE{{Addr: s.mrRecv.Addr(), Length: infoSize, LKey: s.mrRecv.LKey()}}})
	return err
}

// connParam is rping_init_conn_param.
func connParam() rdmacm.ConnParam {
	return rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}
}

func (s *side) setupCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.o.Timeout > 0 {
		return context.WithTimeout(ctx, s.o.Timeout)
	}
	return context.WithCancel(ctx)
}

// connectErr is rping's "connect error" for err; when the --timeout of
// setupCtx ended the set-up (and not ctx, Ctrl-C), it says what did not
// happen in time (what) instead of Go's "context deadline exceeded".
func (s *side) connectErr(ctx context.Context, err error, what string) error {
	if s.o.Timeout > 0 && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return fmt.Errorf("connect error: %s within --timeout %v", what, s.o.Timeout)
	}
	return fmt.Errorf("connect error: %w", err)
}

// errDisconnected ends a wait when the peer disconnected.
var errDisconnected = errors.New("disconnected")

// await waits for the next completion of opcode, skipping SEND
// completions (rping's CQ handler only logs them). A flushed WC or the
// connection's end is errDisconnected.
func (s *side) await(ctx context.Context, op softrdma.WCOpcode) (softrdma.WC, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.conn.Done():
			cancel()
		case <-wctx.Done():
		}
	}()
	for {
		n, err := s.cq.Wait(wctx, s.wcs[:1])
		if err != nil {
			select {
			case <-s.conn.Done():
				return softrdma.WC{}, errDisconnected
			default:
			}
			return softrdma.WC{}, err
		}
		if n == 0 {
			continue
		}
		s.idle.Progress()
		wc := s.wcs[0]
		if wc.Status == softrdma.WCWRFlushErr {
			return wc, errDisconnected
		}
		if wc.Status != softrdma.WCSuccess {
			return wc, fmt.Errorf("cq completion failed status %d (%v)", int(wc.Status), wc.Status)
		}
		if wc.Opcode == softrdma.WCSend {
			s.debugf("send completion")
			continue
		}
		if wc.Opcode != op {
			return wc, fmt.Errorf("unexpected completion %v (waiting for %v)", wc.Opcode, op)
		}
		if op == softrdma.WCRecv {
			if wc.ByteLen != infoSize {
				return wc, fmt.Errorf("Received bogus data, size %d", wc.ByteLen)
			}
			if err := s.postRecv(); err != nil {
				return wc, fmt.Errorf("post recv error: %w", err)
			}
		}
		return wc, nil
	}
}

func (s *side) postSendInfo() error {
	_, err := s.qp.PostSend(softrdma.SendWR{Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
		SGL: []softrdma.SGE{{Addr: s.mrSend.Addr(), Length: infoSize, LKey: s.mrSend.LKey()}}})
	if err != nil {
		return fmt.Errorf("post send error: %w", err)
	}
	return nil
}

// formatSend is rping_format_send: the address, rkey and size of buf.
func (s *side) formatSend(mr *softrdma.MR) {
	binary.BigEndian.PutUint64(s.send[0:], mr.Addr())
	binary.BigEndian.PutUint32(s.send[8:], mr.RKey())
	binary.BigEndian.PutUint32(s.send[12:], uint32(s.o.Size))
	s.debugf("RDMA addr %x rkey %x len %d", mr.Addr(), mr.RKey(), s.o.Size)
}

// server is rping_run_server and rping_test_server.
func (s *side) server(ctx context.Context) error {
	o := s.o
	l, err := s.cm.Listen(uint16(o.Port), 3)
	if err != nil {
		return fmt.Errorf("rdma_listen: %w", err)
	}
	defer l.Close()
	s.debugf("rdma_listen on port %d", o.Port)
	req, err := l.GetRequest(ctx)
	if err != nil {
		return err
	}
	s.debugf("connect request from %v (QPN %d)", req.RemoteAddr(), req.RemoteQPN())
	if err := s.setup(); err != nil {
		return fmt.Errorf("setup_qp failed: %w", err)
	}
	actx, cancel := s.setupCtx(ctx)
	s.conn, err = req.Accept(actx, s.qp, connParam())
	cancel()
	if err != nil {
		return s.connectErr(ctx, err, fmt.Sprintf("the client at %v did not complete the connection (no RTU)", req.RemoteAddr()))
	}
	err = s.watched(ctx, s.testServer)
	if errors.Is(err, errDisconnected) {
		fmt.Fprintln(o.Stderr, "server DISCONNECT EVENT...")
		err = nil
	}
	_ = s.conn.Disconnect()
	return err
}

// watched runs test (testServer or testClient) under Options.IdleTimeout:
// a completion or a packet the device received is progress.
func (s *side) watched(ctx context.Context, test func(context.Context) error) error {
	rx := &s.dev.Counters().RcvdPkts
	ictx, w := idlewatch.StartWith(ctx, s.o.IdleTimeout, rx.Load)
	s.idle = w
	err := test(ictx)
	w.Stop()
	if err != nil && w.Expired() && ctx.Err() == nil {
		what := "pings done"
		if s.o.Server {
			what = "pings served"
		}
		return fmt.Errorf("no completion and no packet from the peer for %v (--idle-timeout), %d %s: "+
			"the peer or the path to it is probably dead (a killed softrdma rping sends no DREQ: its CM lives in "+
			"its process; the QP retries for ever, retry_cnt 7 as on rxe; --idle-timeout 0 waits for ever)",
			w.Limit(), s.pings, what)
	}
	return err
}

func (s *side) testServer(ctx context.Context) error {
	o := s.o
	for {
		// Wait for the client's source address, rkey and size.
		if _, err := s.await(ctx, softrdma.WCRecv); err != nil {
			return err
		}
		addr, rkey, n := binary.BigEndian.Uint64(s.recv[0:]), binary.BigEndian.Uint32(s.recv[8:]), binary.BigEndian.Uint32(s.recv[12:])
		s.debugf("Received rkey %x addr %x len %d from peer", rkey, addr, n)
		if int(n) > len(s.rdma) {
			return fmt.Errorf("the client's buffer is %d bytes, ours %d (use the same -S)", n, len(s.rdma))
		}
		if _, err := s.qp.PostSend(softrdma.SendWR{Opcode: softrdma.WRRDMARead, Flags: softrdma.SendSignaled,
			SGL:        []softrdma.SGE{{Addr: s.mrRDMA.Addr(), Length: n, LKey: s.mrRDMA.LKey()}},
			RemoteAddr: addr, RKey: rkey}); err != nil {
			return fmt.Errorf("post send error: %w", err)
		}
		if _, err := s.await(ctx, softrdma.WCRDMARead); err != nil {
			return err
		}
		if o.Verbose {
			fmt.Fprintf(o.Stdout, "server ping data: %s\n", cString(s.rdma))
		}
		if err := s.postSendInfo(); err != nil { // go ahead
			return err
		}
		// Wait for the client's sink address, rkey and size.
		if _, err := s.await(ctx, softrdma.WCRecv); err != nil {
			return err
		}
		addr, rkey = binary.BigEndian.Uint64(s.recv[0:]), binary.BigEndian.Uint32(s.recv[8:])
		wlen := uint32(len(cString(s.rdma)) + 1)
		if _, err := s.qp.PostSend(softrdma.SendWR{Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
			SGL:        []softrdma.SGE{{Addr: s.mrRDMA.Addr(), Length: min(wlen, uint32(len(s.rdma))), LKey: s.mrRDMA.LKey()}},
			RemoteAddr: addr, RKey: rkey}); err != nil {
			return fmt.Errorf("post send error: %w", err)
		}
		if _, err := s.await(ctx, softrdma.WCRDMAWrite); err != nil {
			return err
		}
		if err := s.postSendInfo(); err != nil { // go ahead
			return err
		}
		s.pings++
	}
}

// client is rping_run_client and rping_test_client.
func (s *side) client(ctx context.Context, dst netip.AddrPort) error {
	o := s.o
	if err := s.setup(); err != nil {
		return fmt.Errorf("setup_qp failed: %w", err)
	}
	p := connParam()
	p.RoCEPort = uint16(o.RoCEPort)
	deadline := time.Now().Add(o.ConnectTimeout)
	for {
		cctx, cancel := s.setupCtx(ctx)
		var err error
		s.conn, err = s.cm.Connect(cctx, s.qp, dst, p)
		cancel()
		if err == nil {
			break
		}
		var rej *rdmacm.RejectError
		if !errors.As(err, &rej) || rej.Reason != mad.RejInvalidServiceID || time.Now().After(deadline) {
			return s.connectErr(ctx, err, fmt.Sprintf("no server answered at %v", dst))
		}
		s.debugf("%v; trying again", err)
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.debugf("rdma_connect successful")
	err := s.watched(ctx, s.testClient)
	if errors.Is(err, errDisconnected) {
		fmt.Fprintln(o.Stderr, "client DISCONNECT EVENT...")
		err = nil
	}
	_ = s.conn.Disconnect()
	select { // the DREP, briefly (rping's disconnect does not wait either)
	case <-s.conn.Done():
	case <-time.After(time.Second):
	case <-ctx.Done():
	}
	return err
}

func (s *side) testClient(ctx context.Context) error {
	o := s.o
	start := byte(65)
	for ping := 0; o.Count == 0 || ping < o.Count; ping++ {
		FillPing(s.start, ping, start)
		start++
		if start > 122 {
			start = 65
		}
		s.formatSend(s.mrSrc)
		if err := s.postSendInfo(); err != nil {
			return err
		}
		if _, err := s.await(ctx, softrdma.WCRecv); err != nil { // the server read it
			return err
		}
		s.formatSend(s.mrRDMA)
		if err := s.postSendInfo(); err != nil {
			return err
		}
		if _, err := s.await(ctx, softrdma.WCRecv); err != nil { // the server wrote it back
			return err
		}
		if o.Validate && !bytes.Equal(s.start, s.rdma) {
			return ErrMismatch
		}
		if o.Verbose {
			fmt.Fprintf(o.Stdout, "ping data: %s\n", cString(s.rdma))
		}
		clear(s.rdma)
		s.pings++
	}
	return nil
}

// FillPing writes rping's ping data for iteration ping into buf:
// "rdma-ping-N: ", then letters from first cycling through 'A' (65) to
// 'z' (122), and a NUL in the last byte (rping_test_client).
func FillPing(buf []byte, ping int, first byte) {
	n := copy(buf, fmt.Sprintf("rdma-ping-%d: ", ping))
	c := first
	for i := n; i < len(buf); i++ {
		buf[i] = c
		c++
		if c > 122 {
			c = 65
		}
	}
	buf[len(buf)-1] = 0
}

// cString returns b up to its first NUL, as printf("%s").
func cString(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

// close releases everything and then prints the counters (--stat): the
// CM's last DREQ or DREP and the ACKs of the last batch leave while the
// CM and the device close, so counters read before would miss them.
func (s *side) close() {
	if s.qp != nil {
		_ = s.dev.DestroyQP(s.qp)
	}
	for _, mr := range []*softrdma.MR{s.mrRecv, s.mrSend, s.mrRDMA, s.mrSrc} {
		if mr != nil {
			_ = s.dev.DeregMR(mr)
		}
	}
	if s.cm != nil {
		_ = s.cm.Close()
	}
	if s.dev != nil {
		_ = s.dev.Close()
	}
	if s.o.Stat && s.dev != nil {
		fmt.Fprintf(s.o.Stdout, "softrdma counters (%v):\n", s.dev.LocalAddr())
		for _, c := range s.dev.Snapshot() {
			if c.Value != 0 {
				fmt.Fprintf(s.o.Stdout, "  %s = %d\n", c.Name, c.Value)
			}
		}
		if s.cm != nil {
			for _, c := range s.cm.Counters().Snapshot() {
				if c.Value != 0 {
					fmt.Fprintf(s.o.Stdout, "  %s = %d\n", c.Name, c.Value)
				}
			}
		}
	}
	for _, b := range s.maps {
		_ = unix.Munmap(b)
	}
	if s.tap != nil {
		if err := s.tap.Close(); err != nil {
			fmt.Fprintf(s.o.Stderr, "rping: --pcap: %v\n", err)
		}
	}
}
