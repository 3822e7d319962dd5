package perf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/cmchan"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/exchange"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/hostaddr"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// -R (Options.RDMACM): the RDMA CM instead of TCP, as perftest's -R
// (src/perftest_communication.c; docs/interop.md has the sequence as
// captures/send_bw_rdmacm.pcap shows it).
//
//   - The exchange runs over an RC connection the CM makes to the
//     server's port -p (rdma_client_connect, rdma_server_connect): one
//     SEND per step and side (cmchan), perftest's steps and, with a
//     softrdma peer that answers the mark in the version, softrdma's own
//     exchange, as over TCP. Both sides offer retry_cnt 7 and rnr_retry 7,
//     no responder resources (the channel is SEND only).
//   - The data QPs are connected by the CM too, to the same port
//     (perftest's create_rdma_cm_connection): with perftest's exchange
//     between two hand shakes of zeros, right after check_mtu; with
//     softrdma's, in every round after the QP keys crossed. retry_cnt 7,
//     rnr_retry 7; for READ and atomics the client offers out_reads as
//     responder resources and initiator depth, the server the smaller of
//     its own and the client's (rdma_cm_connection_request_handler). The
//     client connects the QPs one at a time, in order, and tries again
//     100 ms later when it is rejected because the server does not listen
//     yet (perftest: ten times); the server accepts them in the order
//     they come.
//   - The QPs' attributes are the CM's (timeout 14, min_rnr_timer 12),
//     the path MTU the smaller of the ports' capped by the MTU the
//     exchange agreed on (check_mtu, or softrdma's hello and reply: each
//     side's setMTU, the smaller of the two); the banner shows the QPs'
//     (cmUsedMTU).
//   - At the end the server disconnects each data connection and waits for
//     the DREP, then the channel; the client waits for the server's DREQs
//     (rdma_cm_disconnect_nodes: only perftest's server calls
//     rdma_disconnect) and disconnects itself only if none came.
//   - The devices: UDP port 4791 on both sides unless --bind says
//     otherwise (a RoCE NIC sends its MADs and packets there); the client
//     reaches a server's device on another port with --roce-port. The IP:
//     --bind's, else the client's route to the server, the server's only
//     non-loopback address.

// RDMA CM constants, perftest's.
const (
	cmRetryCount = 7 // retry_count (DEF_RETRY_COUNT)
	cmRNRRetry   = 7
	// cmDataAttempts and cmDataRetryEvery: rdma_cm_client_connection
	// tries ten times, 100 ms apart.
	cmDataAttempts   = 10
	cmDataRetryEvery = 100 * time.Millisecond
	// cmDisconnectWait bounds the wait for a DREP, or for the server's
	// DREQ on the client.
	cmDisconnectWait = 5 * time.Second
	// cmBacklog is the listener's backlog (perftest: num_of_qps).
	cmBacklog = 16
)

// cmParam is what this side offers in a REQ or REP: perftest's conn_param.
func (s *session) cmParam() rdmacm.ConnParam {
	p := rdmacm.ConnParam{RetryCount: cmRetryCount, RNRRetryCount: cmRNRRetry, RoCEPort: uint16(s.o.RoCEPort),
		PathMTU: mtuCode(s.p.MTU)}
	if v := s.test.verb(); v == verbRead || v == verbAtomic {
		d := uint8(min(s.outReads(), 255))
		p.ResponderResources, p.InitiatorDepth = d, d
	}
	return p
}

// cmChannelParam is the channel's: SEND only, so no responder resources.
func (s *session) cmChannelParam() rdmacm.ConnParam {
	return rdmacm.ConnParam{RetryCount: cmRetryCount, RNRRetryCount: cmRNRRetry, RoCEPort: uint16(s.o.RoCEPort),
		PathMTU: mtuCode(s.o.Params.MTU)}
}

// cmPort is the CM port: -p, perftest's 18515 by default.
func (s *session) cmPort() uint16 {
	if s.o.Port == 0 {
		return exchange.DefaultPort
	}
	return uint16(s.o.Port)
}

// cmOpen opens the device on s.tcpLocal (or --bind), its CM and the PD.
func (s *session) cmOpen() error {
	if err := s.openDevice(); err != nil {
		return err
	}
	var err error
	if s.cm, err = rdmacm.Open(s.dev, rdmacm.Options{Logf: s.logf}); err != nil {
		return err
	}
	s.pd, err = s.dev.AllocPD()
	return err
}

// runClientCM is runClient with -R.
func (s *session) runClientCM(ctx context.Context) error {
	o := s.o
	server, err := resolveIP(ctx, o.Server)
	if err != nil {
		return fmt.Errorf("connect to the server: %w", err)
	}
	s.tcpRemote = server
	if bind, _, _ := ParseBind(o.Bind); bind.Addr().IsValid() {
		s.tcpLocal = bind.Addr()
	} else if s.tcpLocal, err = routeIP(server); err != nil {
		return fmt.Errorf("connect to the server: %w", err)
	}
	if err := s.cmOpen(); err != nil {
		return err
	}
	if err := s.cmDialChannel(ctx, netip.AddrPortFrom(server, s.cmPort())); err != nil {
		return err
	}
	return s.cmSession(ctx)
}

// cmProgressEvery is how often a -R client looks at its CM's
// retransmissions while it waits for the server's first answer.
const cmProgressEvery = 100 * time.Millisecond

// cmDialChannel connects the channel to the server's rdma_cm port dst
// (rdma_client_connect). A server that does not answer at all is retried
// by the CM itself (a REQ every 4.4 s, 15 times: 71 s); after its first
// retry this side says so, once, on stderr. With --connect-timeout, a REQ
// rejected because the server does not listen yet is tried again, as a
// refused TCP connection is, and a server that does not answer is waited
// for at most that long (the CM's own attempt is cut short, or made again
// once its retries are used up): the run then fails naming the address.
func (s *session) cmDialChannel(ctx context.Context, dst netip.AddrPort) error {
	o := s.o
	device := s.cmPeerDevice(dst.Addr())
	retries, every := s.cm.Retries()
	deadline := time.Now().Add(o.ConnectTimeout)
	progress := make(chan struct{}) // closed once the line is printed
	var told sync.Once
	tell := func() {
		told.Do(func() {
			until := fmt.Sprintf("up to %d times, %.0fs", retries, (time.Duration(retries+1) * every).Seconds())
			if o.ConnectTimeout > 0 {
				until = fmt.Sprintf("until --connect-timeout %v", o.ConnectTimeout)
			}
			s.logf("softrdma: no CM reply from %v (device %v) yet; retrying (%s)", dst, device, until)
			close(progress)
		})
	}
	base := s.cm.Counters().Retransmits.Load()
	answered := false // a REJ came: the server's device is up
	for {
		dctx, cancel := context.WithCancel(ctx) // also ends the watch below
		if o.ConnectTimeout > 0 {
			dctx, cancel = context.WithDeadline(ctx, deadline)
		}
		watchDone := make(chan struct{})
		go func() { // the CM's first retransmission of the REQ
			defer close(watchDone)
			tick := time.NewTicker(cmProgressEvery)
			defer tick.Stop()
			for {
				select {
				case <-dctx.Done():
					return
				case <-progress:
					return
				case <-tick.C:
					if s.cm.Counters().Retransmits.Load() != base {
						tell()
						return
					}
				}
			}
		}()
		var err error
		s.ch, err = cmchan.Dial(dctx, s.cm, s.dev, s.pd, dst, s.cmChannelParam())
		cancel()
		<-watchDone
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var rej *rdmacm.RejectError
		rejected := errors.As(err, &rej)
		answered = answered || rejected
		late := time.Now().Add(retryEvery).After(deadline)
		switch {
		case o.ConnectTimeout > 0 && !answered && (errors.Is(err, context.DeadlineExceeded) ||
			errors.Is(err, rdmacm.ErrTimeout) && late):
			return fmt.Errorf("connect to the server: no CM reply from rdma_cm %v (device %v) within --connect-timeout %v: "+
				"is a server running there with -R?", dst, device, o.ConnectTimeout)
		case o.ConnectTimeout > 0 && errors.Is(err, rdmacm.ErrTimeout) && !late:
			// The CM's retries are used up and time is left: try again.
			base = s.cm.Counters().Retransmits.Load()
			continue
		case !rejected || rej.Reason != mad.RejInvalidServiceID || late:
			// A server whose device is up but that does not listen yet
			// rejects the REQ ("invalid service ID"): that alone is
			// tried again, as --connect-timeout does for a refused TCP
			// connection.
			return fmt.Errorf("connect to the server: rdma_cm %v (device %v): %w", dst, device, err)
		}
		select {
		case <-time.After(retryEvery):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// cmPeerDevice is the UDP address where the CM sends its MADs.
func (s *session) cmPeerDevice(ip netip.Addr) netip.AddrPort {
	port := uint16(s.o.RoCEPort)
	if port == 0 {
		port = DefServerPort
	}
	return netip.AddrPortFrom(ip, port)
}

// runServerCM is runServer with -R.
func (s *session) runServerCM(ctx context.Context) error {
	o := s.o
	if bind, _, _ := ParseBind(o.Bind); bind.Addr().IsValid() {
		s.tcpLocal = bind.Addr()
	} else {
		var err error
		if s.tcpLocal, err = defaultIP(); err != nil {
			return err
		}
	}
	if err := s.cmOpen(); err != nil {
		return err
	}
	var err error
	if s.lst, err = s.cm.Listen(s.cmPort(), cmBacklog); err != nil {
		return fmt.Errorf("rdma_listen: %w", err)
	}
	if o.Ready != nil {
		o.Ready(cmchan.Addr(netip.AddrPortFrom(s.tcpLocal, s.cmPort())))
	}
	if !o.JSON {
		fmt.Fprintf(o.Stdout, "\n************************************\n* Waiting for client to connect... *\n************************************\n")
	}
	req, err := s.lst.GetRequest(ctx)
	if err != nil {
		return ctxErr(ctx, err)
	}
	s.tcpRemote = req.RemoteAddr().Addr()
	if s.ch, err = cmchan.Accept(ctx, req, s.dev, s.pd, s.cmChannelParam()); err != nil {
		return ctxErr(ctx, fmt.Errorf("accept: %w", err))
	}
	return s.cmSession(ctx)
}

// cmSession runs the exchange over the channel: perftest's, or softrdma's
// when both offer it, as over TCP.
func (s *session) cmSession(ctx context.Context) error {
	var c net.Conn = s.ch
	if s.o.IdleTimeout > 0 {
		c = boundWrites{s.ch, s.o.IdleTimeout}
	}
	pt := exchange.NewPerftest(c, !s.server)
	pt.RDMACM = true
	// Closing the channel ends any read or write of it: Ctrl-C ends the
	// run at any point (a dead peer would otherwise be waited for as long
	// as the QP retries, for ever with retry count 7).
	stop := context.AfterFunc(ctx, func() { s.ch.Close() })
	defer stop()
	// The setup time limit starts now, as at a TCP connection: a peer
	// that connected its channel and then says nothing (its version, its
	// hello or reply) fails the run instead of holding it.
	s.startSetupLimit()
	s.ch.SetDeadline(s.setupEnd)
	native, err := pt.ExchangeVersions(!s.o.Perftest)
	s.ch.SetDeadline(time.Time{})
	if err != nil {
		return ctxErr(ctx, s.setupErr(ctx, "version", err))
	}
	if !native {
		s.pt = pt
		return s.runPerftest(ctx)
	}
	if s.ctrl, err = exchange.New(c); err != nil {
		return err
	}
	if s.server {
		err = s.serverHello(ctx)
	} else {
		s.clientParams()
		err = s.clientHello(ctx)
	}
	if err == nil {
		err = s.run(ctx)
	}
	err = s.tellPeer(err)
	s.cmEnd(err == nil)
	return err
}

// boundWrites is the -R channel with each Write bounded by limit
// (--idle-timeout): the channel is an RC connection over the path the data
// QPs take, retrying for ever (retry_cnt 7) as they do, so a message the
// peer does not acknowledge within the limit means a dead peer or path, as
// a missing completion does. (A Write that fails so leaves the channel
// unusable: cmchan moves its QP to ERR.)
type boundWrites struct {
	*cmchan.Conn
	limit time.Duration
}

func (c boundWrites) Write(b []byte) (int, error) {
	c.SetWriteDeadline(time.Now().Add(c.limit))
	n, err := c.Conn.Write(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = &unackedError{c.limit, err}
	}
	return n, err
}

// unackedError is a message of the -R exchange that the peer did not
// acknowledge within --idle-timeout (boundWrites).
type unackedError struct {
	limit time.Duration
	err   error
}

func (e *unackedError) Error() string {
	return fmt.Sprintf("the peer did not acknowledge a message of the exchange (over rdma_cm) within %v (--idle-timeout): "+
		"the peer or the path to it is probably dead (--idle-timeout 0 waits for ever)", e.limit)
}

func (e *unackedError) Unwrap() error { return e.err }

// cmConnectQPs connects the round's QPs through the CM, in order (the
// client connects, the server accepts), and takes their addresses, QPNs
// and PSNs from the QPs: the CM chose the PSNs.
func (s *session) cmConnectQPs(ctx context.Context) error {
	s.conns = make([]*rdmacm.Conn, len(s.qps))
	for i, qp := range s.qps {
		var err error
		if s.server {
			s.conns[i], err = s.cmAccept(ctx, qp)
		} else {
			s.conns[i], err = s.cmDial(ctx, qp)
		}
		if err != nil {
			return fmt.Errorf("RDMA CM connection of QP %d (QPN %#x): %w", i, qp.QPN(), err)
		}
		s.psns[i] = uint32(qp.Attr().SQPSN)
	}
	return nil
}

// cmRemoteFromQPs fills the QPN, PSN and address of s.remote from the
// connected QPs.
func (s *session) cmRemoteFromQPs() {
	for i, qp := range s.qps {
		a := qp.Attr()
		r := &s.remote[i]
		r.QPN, r.PSN = uint32(a.DestQPN), uint32(a.RQPSN)
		r.GID, r.Port = a.Dest.Addr().As16(), a.Dest.Port()
	}
}

// cmDial connects qp to the server (rdma_cm_route_handler's
// rdma_connect), trying again while the server does not listen.
func (s *session) cmDial(ctx context.Context, qp *softrdma.QP) (*rdmacm.Conn, error) {
	dst := netip.AddrPortFrom(s.tcpRemote, s.cmPort())
	for attempt := 1; ; attempt++ {
		c, err := s.cm.Connect(ctx, qp, dst, s.cmParam())
		var rej *rdmacm.RejectError
		if err == nil || !errors.As(err, &rej) || rej.Reason != mad.RejInvalidServiceID || attempt == cmDataAttempts {
			return c, err
		}
		// perftest's server listens for the data connections only after
		// the hand shake before them. The REJ moved the QP to ERR.
		if err := qp.Modify(&softrdma.QPAttr{State: softrdma.QPStateReset}, softrdma.QPAttrState); err != nil {
			return nil, err
		}
		select {
		case <-time.After(cmDataRetryEvery):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// cmAccept accepts the next request on qp
// (rdma_cm_connection_request_handler): READ and atomic depths clamped to
// what the client offered.
func (s *session) cmAccept(ctx context.Context, qp *softrdma.QP) (*rdmacm.Conn, error) {
	// A client that disconnected the channel ends the wait.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gone := s.ch.CM().Done()
	go func() {
		select {
		case <-gone:
			cancel()
		case <-ctx.Done():
		}
	}()
	req, err := s.lst.GetRequest(ctx)
	if err != nil {
		select {
		case <-gone:
			return nil, errors.New("the client disconnected")
		default:
		}
		return nil, err
	}
	p := s.cmParam()
	rp := req.Param()
	p.ResponderResources = min(p.ResponderResources, rp.InitiatorDepth)
	p.InitiatorDepth = min(p.InitiatorDepth, rp.ResponderResources)
	return req.Accept(ctx, qp, p)
}

// cmDisconnectData ends the data connections (perftest's destroy_ctx,
// rdma_cm_disconnect_nodes): orderly, the server disconnects and waits
// for each DREP, the client waits for the server's DREQs and disconnects
// itself only after cmDisconnectWait; otherwise (a failed run) both
// disconnect at once.
func (s *session) cmDisconnectData(orderly bool) {
	conns := s.conns
	s.conns = nil
	for _, c := range conns {
		if c != nil && (s.server || !orderly) {
			_ = c.Disconnect()
		}
	}
	if !orderly {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmDisconnectWait)
	defer cancel()
	for _, c := range conns {
		if c == nil {
			continue
		}
		select {
		case <-c.Done():
		case <-ctx.Done():
			s.logf("softrdma: the %s did not disconnect its QP %#x within %v", s.peerName(), c.QP().QPN(), cmDisconnectWait)
			_ = c.Disconnect()
		}
	}
}

func (s *session) peerName() string {
	if s.server {
		return "client"
	}
	return "server"
}

// cmEnd ends the connections: the data connections, then the channel,
// each as cmDisconnectData does (the capture shows perftest's server
// disconnecting both), then lingers so that the last DREP and ACKs leave.
func (s *session) cmEnd(orderly bool) {
	s.cmDisconnectData(orderly)
	if s.ch == nil {
		return
	}
	c := s.ch.CM()
	if orderly {
		if s.server {
			_ = c.Disconnect()
		}
		select {
		case <-c.Done():
		case <-time.After(cmDisconnectWait):
		}
	}
	s.ch.Close()
	time.Sleep(ptLinger)
}

// cmClose releases what -R opened (after a failure: nothing orderly).
func (s *session) cmClose() {
	s.cmDisconnectData(false)
	if s.ch != nil {
		s.ch.Close()
	}
	if s.lst != nil {
		s.lst.Close()
	}
	if s.cm != nil {
		s.cm.Close()
	}
}

// cmCounters returns the CM's non-zero counters: MADs sent and received
// by message, retransmissions, duplicates, rejects; and the messages of
// the exchange the channel carried.
func (s *session) cmCounters() []namedCount {
	if s.cm == nil {
		return nil
	}
	ctr := s.cm.Counters()
	var out []namedCount
	add := func(name string, v uint64) {
		if v != 0 {
			out = append(out, namedCount{name, v})
		}
	}
	for _, c := range ctr.Snapshot() {
		add(c.Name, c.Value)
	}
	if s.ch != nil { // the exchange's SENDs over the channel
		sent, rcvd := s.ch.Messages()
		add("cm_channel_sent", sent)
		add("cm_channel_rcvd", rcvd)
	}
	return out
}

type namedCount struct {
	name string
	v    uint64
}

// resolveIP returns the IP host names (a name or an IP).
func resolveIP(ctx context.Context, host string) (netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap(), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.Addr{}, err
	}
	if len(ips) == 0 {
		return netip.Addr{}, fmt.Errorf("%s: no address", host)
	}
	return ips[0].Unmap(), nil
}

// routeIP returns the local IP the kernel routes towards dst from.
func routeIP(dst netip.Addr) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, DefServerPort)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %v: %w", dst, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// defaultIP is the -R server's device IP without --bind: the host's only
// non-loopback, non-link-local address, IPv4 preferred (perftest's server
// listens on every address; a softrdma device has one).
func defaultIP() (netip.Addr, error) {
	ip, err := hostaddr.Sole()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("-R: the device's address: %w: give one with --bind", err)
	}
	return ip, nil
}
