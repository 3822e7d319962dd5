//go:build linux

package conn

import (
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"math"

	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The batch syscalls are issued directly (syscall.RawConn + unix.Mmsghdr),
// the way golang.org/x/net/ipv4's ReadBatch and WriteBatch issue them:
// ReadBatch allocates a *net.UDPAddr and its IP for every datagram it
// returns (x/net internal/socket parseInetAddr), and the conn must not
// allocate per packet. Addresses go straight between sockaddrs and
// netip.AddrPort here.
//
// They go through unix.RawSyscall6, not Syscall6: the socket is
// non-blocking (the RawConn's poller waits on EAGAIN), so sendmmsg and
// recvmmsg never sleep, and the scheduler's bookkeeping for a call that
// might (entersyscall, and sysmon handing the P to another thread when the
// call runs past 20 µs, which a 64-datagram GSO sendmmsg does) only adds
// thread wake-ups. gVisor's fdbased endpoint issues its non-blocking
// batch calls the same way. Measured with the two-process write-bw at 64
// KiB (perf stat, 4 alternating pairs under load): 20 % less CPU per
// message, 35 % fewer context switches. A raw call keeps its P for its
// length (up to about 1 ms for 64 GRO super-buffers), which delays the
// goroutines queued on that P and a stop-the-world by as much. In one
// process (bench's BenchmarkWriteLat, two devices) the mean ping-pong grew
// from 36.5 to 43 µs, p50 unchanged: a goroutine readied just before a
// raw call (a CQ waiter in the P's runnext) waits for it. Between two
// processes (softrdma write-lat) t_typical, t_avg and the 99th percentile
// did not change. Sending raw only from 16 datagrams up restored the
// in-process mean and cost write-bw 8 %.

const (
	sendMsgs   = 256        // messages per sendmmsg (the kernel takes up to UIO_MAXIOV = 1024)
	sendIovecs = 1024       // iovecs per sendmmsg: one per packet
	rxSlotSize = 64 << 10   // a receive slot holds the largest datagram or GRO super-buffer
	rxCtlSize  = 128        // control buffer per receive slot: UDP_GRO and the IP header fields, 24 bytes each
	maxGSO4    = 65535 - 28 // largest UDP payload of a GSO super-buffer, IPv4
	maxGSO6    = 65535 - 8  // and IPv6 (the payload length excludes the IPv6 header)
)

// UDPConn is a Conn over a UDP socket (Linux: sendmmsg/recvmmsg with UDP
// GSO and GRO where the kernel has them). Create it with Listen.
type UDPConn struct {
	core
	pc        *net.UDPConn
	rc        syscall.RawConn
	gso       atomic.Bool // UDP_SEGMENT is used (turned off on EIO)
	gro       bool        // UDP_GRO is on
	maxGSO    int
	scopeID   uint32     // of the local address, for link-local IPv6 destinations
	bindIP    netip.Addr // the address bound, with its zone: source ports bind it too
	cfgSndBuf int        // Config.SndBuf, for the source ports' sockets
	rcvBuf    int
	sndBuf    int
	closeOnce sync.Once
	closeErr  error

	// Send state, guarded by txMu.
	sh     []unix.Mmsghdr
	siov   []unix.Iovec
	sname  []unix.RawSockaddrInet6
	sctl   []byte // unix.CmsgSpace(2) bytes per message
	sruns  []sendRun
	sOff   int // first message of the sendmmsg call
	sCnt   int // messages in it
	sN     int // messages sent
	sErr   unix.Errno
	sendFn func(fd uintptr) bool
	sRC    syscall.RawConn // the socket of the sendmmsg call (sFd < 0)
	sFd    int             // or a source port's blocking socket
	// sorted and sports are emitBatch's scratch for a batch from several
	// source ports.
	sorted []item
	sports []uint16

	// Receive state, guarded by rxMu.
	rh       []unix.Mmsghdr
	riov     []unix.Iovec
	rname    []unix.RawSockaddrInet6
	rctl     []byte
	rbuf     []byte
	rCnt     int
	rN       int
	rErr     unix.Errno
	recvFn   func(fd uintptr) bool
	deadline bool // a read deadline is set
}

// sendRun is the packets of one sendmmsg message: items[first:first+count].
type sendRun struct{ first, count int }

var _ Conn = (*UDPConn)(nil)

var sendCtlSize = unix.CmsgSpace(2)

// isBroadcast reports whether ip is the limited broadcast address
// (255.255.255.255) or the directed broadcast address of a subnet of one
// of the host's interfaces (10.0.0.255 for 10.0.0.1/24; not for /31 and
// /32, which have none). Linux binds a socket there, but a device so
// bound sends packets to which no answer ever comes back.
func isBroadcast(ip netip.Addr) bool {
	if !ip.Is4() {
		return false
	}
	if ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.To4() == nil {
			continue
		}
		ones, bits := n.Mask.Size()
		if bits != 32 || ones >= 31 {
			continue
		}
		var b [4]byte
		for i, x := range n.IP.To4() {
			b[i] = x | ^n.Mask[len(n.Mask)-4+i]
		}
		if netip.AddrFrom4(b) == ip {
			return true
		}
	}
	return false
}

// Listen opens a UDP conn bound to cfg.Addr.
func Listen(cfg Config) (*UDPConn, error) {
	ip := cfg.Addr.Addr().Unmap()
	if !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() {
		return nil, fmt.Errorf("conn: listen %v: need a specific local IP address (the ICRC covers it)", cfg.Addr)
	}
	if isBroadcast(ip) {
		return nil, fmt.Errorf("conn: listen %v: need a specific local IP address, not a broadcast one (the ICRC covers it)", cfg.Addr)
	}
	if cfg.Impair != nil {
		if err := cfg.Impair.Validate(); err != nil {
			return nil, err
		}
	}
	network := "udp4"
	if ip.Is6() {
		network = "udp6"
	}
	pc, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, cfg.Addr.Port())))
	if err != nil {
		return nil, fmt.Errorf("conn: %w", err) // net says "listen udp4 ADDR: ..."
	}
	la := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	local := netip.AddrPortFrom(la.Addr().Unmap(), la.Port())
	c := &UDPConn{pc: pc, bindIP: ip, cfgSndBuf: cfg.SndBuf}
	c.core.init(local, new(bufPool), cfg.Logf)
	c.core.noICRC = cfg.NoICRC
	c.core.emit = c.emitBatch
	c.core.checkDst = c.checkDst
	c.core.openSrc = c.openSourcePort
	c.maxGSO = maxGSO4
	if !c.is4 {
		c.maxGSO = maxGSO6
		if z := ip.Zone(); z != "" {
			if ifi, err := net.InterfaceByName(z); err == nil {
				c.scopeID = uint32(ifi.Index)
			}
		}
	}
	if c.rc, err = pc.SyscallConn(); err == nil {
		err = c.setup(cfg)
	}
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("conn: listen %v: %w", local, err)
	}
	c.alloc()
	if cfg.Impair != nil {
		_ = c.SetImpairment(cfg.Impair)
	}
	if cfg.Tap != nil {
		c.SetTap(cfg.Tap)
	}
	return c, nil
}

// setup sets the socket options: DF (and so IPv4 ID 0), buffer sizes, GSO
// and GRO.
func (c *UDPConn) setup(cfg Config) error {
	var err error
	var gso bool
	cerr := c.rc.Control(func(fd uintptr) {
		s := int(fd)
		if err = c.setDF(s); err != nil {
			return
		}
		if !c.is4 {
			// RoCEv2 over IPv6 may carry a zero UDP checksum (Linux rxe
			// sends it so; the ICRC protects the packet): RFC 6935/6936
			// let a receiver accept it, and Linux does with
			// UDP_NO_CHECK6_RX, else it drops every such datagram as a
			// checksum error (Udp6InCsumErrors).
			if err = unix.SetsockoptInt(s, unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1); err != nil {
				err = fmt.Errorf("set UDP_NO_CHECK6_RX: %w", err)
				return
			}
		}
		// The IP header fields a UD receive places in its GRH (TTL or hop
		// limit, TOS or traffic class, flow label) come as control
		// messages with every datagram.
		if err = c.setRecvIPOpts(s); err != nil {
			return
		}
		c.rcvBuf = c.setBuffer(s, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, cfg.RcvBuf, "receive", "SO_RCVBUFFORCE", "rmem_max")
		c.sndBuf = c.setBuffer(s, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, cfg.SndBuf, "send", "SO_SNDBUFFORCE", "wmem_max")
		// UDP_SEGMENT is readable where the kernel implements UDP GSO
		// (Linux 4.18+); UDP_GRO is settable where it implements UDP GRO
		// for sockets (Linux 5.0+).
		if _, e := unix.GetsockoptInt(s, unix.SOL_UDP, unix.UDP_SEGMENT); e == nil {
			gso = true
		}
		if !cfg.DisableGRO && unix.SetsockoptInt(s, unix.SOL_UDP, unix.UDP_GRO, 1) == nil {
			c.gro = true
		}
	})
	if cerr != nil {
		return cerr
	}
	if err != nil {
		return err
	}
	if err := c.setTTLTOS(c.pc); err != nil {
		return err
	}
	c.gso.Store(gso && !cfg.DisableGSO)
	return nil
}

// setDF sets IP_MTU_DISCOVER to IP_PMTUDISC_DO (IPv6: IPV6_PMTUDISC_DO):
// every datagram leaves with DF set and, from an unconnected socket, IPv4
// ID 0 (see emitBatch), the ID our ICRCs are computed with.
func (c *UDPConn) setDF(fd int) error {
	var err error
	if c.is4 {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	} else {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
	}
	if err != nil {
		return fmt.Errorf("set IP_MTU_DISCOVER: %w", err)
	}
	return nil
}

// setTTLTOS sets the IP header fields RoCEv2 peers see from Linux rxe:
// TTL (hop limit) 64 and TOS (traffic class) 0, set explicitly rather than
// inherited from sysctls. The ICRC masks them, so they matter only to
// captures and to the network.
func (c *UDPConn) setTTLTOS(pc *net.UDPConn) error {
	if c.is4 {
		p := ipv4.NewConn(pc)
		if err := p.SetTTL(64); err != nil {
			return fmt.Errorf("set IP_TTL: %w", err)
		}
		if err := p.SetTOS(0); err != nil {
			return fmt.Errorf("set IP_TOS: %w", err)
		}
		return nil
	}
	p := ipv6.NewConn(pc)
	if err := p.SetHopLimit(64); err != nil {
		return fmt.Errorf("set IPV6_UNICAST_HOPS: %w", err)
	}
	if err := p.SetTrafficClass(0); err != nil {
		return fmt.Errorf("set IPV6_TCLASS: %w", err)
	}
	return nil
}

// srcRcvBuf is the receive buffer a source port's socket asks for: the
// kernel's minimum. Nothing is read from it (peers send to the conn's own
// port), so whatever arrives there is dropped at once.
const srcRcvBuf = 0

// openSourcePort opens the socket a source port sends from: bound to the
// conn's IP and port, unconnected, with the conn's DF, TTL, TOS and send
// buffer, so that its datagrams differ from the conn's own only in the
// source port (IPv4 ID 0 included). It is only written to, by emitBatch's
// sendmmsg with the same messages, GSO included. (AcquireSourcePort)
//
// The socket is a plain blocking one, outside Go's netpoller: nothing
// ever waits on it. A socket in the netpoller's epoll set has a waiter
// (the epoll entry), and the kernel wakes it for EPOLLOUT each time it
// frees a datagram the socket sent (sock_wfree -> sock_def_write_space:
// a wait-queue lock with interrupts saved and restored, per datagram, in
// the sender's sendmmsg on loopback, and a wake-up of the netpoller's
// thread if it sleeps in epoll_wait) for no goroutine. A send that finds
// this socket's buffer full blocks its thread instead, which the runtime
// replaces while it waits (the buffer is as large as the conn's; on
// loopback it never fills).
func (c *UDPConn) openSourcePort(port uint16) (*srcPort, error) {
	var family int
	var sa unix.Sockaddr
	if c.is4 {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(port), Addr: c.bindIP.As4()}
	} else {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(port), Addr: c.bindIP.As16(), ZoneId: c.scopeID}
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	// SO_REUSEPORT: conns of this host that send from the same IP and
	// port share it (two devices on 127.0.0.1 whose QPs 0x11 connect to
	// each other both want rxe's 49441, the perftest-style tools' server
	// and client in two shells of one machine say). Only sockets that all
	// set it share a port, so no conn's own (receiving) port, which is
	// bound without it, can be taken, nor can a port another program
	// holds. Nothing is read from these sockets: that the kernel would
	// spread datagrams sent to the port among them does not matter.
	if err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		err = os.NewSyscallError("setsockopt SO_REUSEPORT", err)
	} else if err = unix.Bind(fd, sa); err != nil {
		err = os.NewSyscallError("bind", err)
	} else if err = c.setDF(fd); err == nil {
		err = c.setTTLTOSFd(fd)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, srcRcvBuf)
	// The send buffer as the conn's, without the warnings (the conn's
	// socket has given them).
	want := c.cfgSndBuf
	if want == 0 {
		want = DefaultSocketBuffer
	}
	if want > 0 && unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, want/2) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, want/2)
	}
	return &srcPort{sock: fdCloser(fd), fd: fd}, nil
}

// fdCloser closes a file descriptor.
type fdCloser int

func (f fdCloser) Close() error { return unix.Close(int(f)) }

// setTTLTOSFd is setTTLTOS for a socket outside the netpoller.
func (c *UDPConn) setTTLTOSFd(fd int) error {
	if c.is4 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TTL, 64); err != nil {
			return fmt.Errorf("set IP_TTL: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TOS, 0); err != nil {
			return fmt.Errorf("set IP_TOS: %w", err)
		}
		return nil
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, 64); err != nil {
		return fmt.Errorf("set IPV6_UNICAST_HOPS: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_TCLASS, 0); err != nil {
		return fmt.Errorf("set IPV6_TCLASS: %w", err)
	}
	return nil
}

// ipv6FlowInfo is IPV6_FLOWINFO (linux/in6.h), which golang.org/x/sys
// does not name: set to 1, it delivers the received flow information
// (traffic class and flow label) as a control message.
const ipv6FlowInfo = 11

// setRecvIPOpts asks for the received IP header fields as control
// messages: IP_RECVTTL and IP_RECVTOS, or IPV6_RECVHOPLIMIT,
// IPV6_RECVTCLASS and IPV6_FLOWINFO.
func (c *UDPConn) setRecvIPOpts(fd int) error {
	type opt struct {
		level, name int
		what        string
	}
	opts := []opt{{unix.IPPROTO_IP, unix.IP_RECVTTL, "IP_RECVTTL"}, {unix.IPPROTO_IP, unix.IP_RECVTOS, "IP_RECVTOS"}}
	if !c.is4 {
		opts = []opt{{unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, "IPV6_RECVHOPLIMIT"},
			{unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, "IPV6_RECVTCLASS"},
			{unix.IPPROTO_IPV6, ipv6FlowInfo, "IPV6_FLOWINFO"}}
	}
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.name, 1); err != nil {
			return fmt.Errorf("set %s: %w", o.what, err)
		}
	}
	return nil
}

// setBuffer sets a socket buffer to want bytes (as read back; the kernel
// doubles what is set), with the FORCE option if allowed, and warns when
// it got less. It returns the size obtained.
func (c *UDPConn) setBuffer(fd, force, opt, want int, what, forceName, sysctl string) int {
	if want < 0 {
		got, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, opt)
		return got
	}
	if want == 0 {
		want = DefaultSocketBuffer
	}
	// setsockopt takes a C int: more than math.MaxInt32 would wrap (to 0
	// for 8 GiB, the kernel's smallest buffer). The kernel grants at most
	// about that anyway.
	want = min(want, math.MaxInt32)
	forced := unix.SetsockoptInt(fd, unix.SOL_SOCKET, force, want/2) == nil
	if !forced {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, opt, want/2)
	}
	got, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, opt)
	if got < want {
		how := forceName + " was refused: it needs CAP_NET_ADMIN"
		if forced {
			how = "even with " + forceName
		}
		c.logf("conn: %v: socket %s buffer is %d bytes, wanted %d (%s); datagrams will be lost under load: run with CAP_NET_ADMIN or raise the limit with sysctl -w net.core.%s=%d",
			c.local, what, got, want, how, sysctl, want/2)
	}
	return got
}

// alloc preallocates everything the batch syscalls use.
func (c *UDPConn) alloc() {
	c.sh = make([]unix.Mmsghdr, sendMsgs)
	c.siov = make([]unix.Iovec, sendIovecs)
	c.sname = make([]unix.RawSockaddrInet6, sendMsgs)
	c.sctl = make([]byte, sendMsgs*sendCtlSize)
	c.sruns = make([]sendRun, sendMsgs)
	for m := range sendMsgs {
		ctl := c.sctl[m*sendCtlSize:]
		h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		h.Level = unix.SOL_UDP
		h.Type = unix.UDP_SEGMENT
		h.SetLen(unix.CmsgLen(2))
	}
	c.sendFn = c.sendmmsg

	n := IdealBatchSize
	c.rh = make([]unix.Mmsghdr, n)
	c.riov = make([]unix.Iovec, n)
	c.rname = make([]unix.RawSockaddrInet6, n)
	c.rctl = make([]byte, n*rxCtlSize)
	c.rbuf = make([]byte, n*rxSlotSize)
	for k := range n {
		c.riov[k].Base = &c.rbuf[k*rxSlotSize]
		c.riov[k].SetLen(rxSlotSize)
		h := &c.rh[k].Hdr
		h.Name = (*byte)(unsafe.Pointer(&c.rname[k]))
		h.Iov = &c.riov[k]
		h.SetIovlen(1)
		h.Control = &c.rctl[k*rxCtlSize]
	}
	c.recvFn = c.recvmmsg
}

// Offload reports whether UDP GSO (send) and UDP GRO (receive) are in use.
func (c *UDPConn) Offload() (gso, gro bool) { return c.gso.Load(), c.gro }

// SocketBuffers returns the socket's receive and send buffer sizes, as the
// kernel reports them.
func (c *UDPConn) SocketBuffers() (rcv, snd int) { return c.rcvBuf, c.sndBuf }

// The indices of the u32 array getsockopt(SO_MEMINFO) fills
// (include/uapi/linux/sock_diag.h, enum SK_MEMINFO_*; DROPS since Linux
// 4.7).
const (
	skMeminfoRmemAlloc = 0
	skMeminfoDrops     = 8
	skMeminfoVars      = 9
)

// RecvQueue reports the kernel's view of the receive socket, read with
// getsockopt(SO_MEMINFO) (the numbers ss -m shows): Drops is the number
// of datagrams the kernel dropped at this socket since it was opened
// (sk_drops: a full receive buffer, the case that matters on loopback, or
// memory pressure), Queued the bytes of received datagrams waiting in its
// receive queue (sk_rmem_alloc, in the kernel's accounting, which counts
// each datagram's buffer overhead too). A full queue means the conn's
// reader is as far behind the wire as the socket buffer holds: with the
// 64 MiB default, seconds when the reader is slow. Errors: the
// getsockopt's (ENOPROTOOPT before Linux 4.7; os.ErrClosed after Close).
func (c *UDPConn) RecvQueue() (RecvQueue, error) {
	var info [skMeminfoVars]uint32
	var serr error
	err := c.rc.Control(func(fd uintptr) {
		n := uint32(unsafe.Sizeof(info))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case e != 0:
			serr = os.NewSyscallError("getsockopt SO_MEMINFO", e)
		case n <= skMeminfoDrops*4:
			serr = os.NewSyscallError("getsockopt SO_MEMINFO", unix.ENOPROTOOPT) // no DROPS: before 4.7
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return RecvQueue{}, err
	}
	return RecvQueue{Drops: uint64(info[skMeminfoDrops]), Queued: uint64(info[skMeminfoRmemAlloc])}, nil
}

func (c *UDPConn) checkDst(a netip.AddrPort) (netip.AddrPort, bool) {
	ip := a.Addr()
	if c.is4 {
		ip = ip.Unmap()
		return netip.AddrPortFrom(ip, a.Port()), ip.Is4()
	}
	return a, ip.Is6() && !ip.Is4In6()
}

// Send implements Conn.
func (c *UDPConn) Send(pkts []Packet) error { return c.send(pkts) }

// emitBatch sends items with sendmmsg, one message per GSO run (or per
// packet without GSO). Called with txMu held.
//
// IPv4 IDs. Our socket is unconnected and has IP_MTU_DISCOVER =
// IP_PMTUDISC_DO, so every datagram has DF set and ip_select_ident_segs()
// gives it ID 0 (a connected socket would draw a per-socket ID, which a
// receiver cannot predict). A UDP_SEGMENT super-buffer gets ID 0 too, and
// when it is segmented (in software by inet_gso_segment() when the device
// lacks UDP segmentation offload, or by the receiving kernel for a socket
// without UDP_GRO) segment i gets ID 0+i. So the ICRC of the packet at
// position j of a run is computed with ID j. Observed on this host (Linux
// 6.18) over a veth pair between two network namespaces, with tcpdump on
// the far end: with tx-udp-segmentation off, a 5-segment super-buffer
// (4 x 1000 + 500 bytes) went out as IDs 0, 1, 2, 3, 4, all DF, and a
// plain datagram after it as ID 0; with tx-udp-segmentation on, veth
// carried the super-buffer whole (one 4528-byte packet, ID 0).
// TestGSOIPv4IDOnTheWire checks the same through a TUN device (no
// offloads, so the kernel segments before handing packets over) and
// verifies every captured ICRC exactly with the captured ID. A NIC with
// USO is expected to number the segments the same way (as TSO does
// without SKB_GSO_TCP_FIXEDID); not checked here.
//
// Source ports. A socket sends from its own port only, so the packets of
// each source port go through that port's socket (AcquireSourcePort):
// a batch from one port, the common case (one QP's requester, or QPs that
// share a port), goes as it is; a batch from several is split by port,
// keeping the order of each port's packets (and so of each QP's), and
// each part is sent, batched and GSO-grouped, through its socket.
func (c *UDPConn) emitBatch(items []item) error {
	if len(items) == 0 {
		return nil // all dropped or held by an impairment
	}
	port, mixed := items[0].sport, false
	for i := 1; i < len(items) && !mixed; i++ {
		mixed = items[i].sport != port
	}
	if !mixed {
		return c.emitFrom(port, items)
	}
	c.sports = c.sports[:0]
	for i := range items {
		if !slices.Contains(c.sports, items[i].sport) {
			c.sports = append(c.sports, items[i].sport)
		}
	}
	var first *SendError
	for _, p := range c.sports {
		c.sorted = c.sorted[:0]
		for i := range items {
			if items[i].sport == p {
				c.sorted = append(c.sorted, items[i])
			}
		}
		err := c.emitFrom(p, c.sorted)
		clear(c.sorted) // do not keep the callers' buffers reachable
		if errors.Is(err, net.ErrClosed) {
			return err
		}
		if se, ok := err.(*SendError); ok {
			if first == nil {
				first = se
			} else {
				first.Failed += se.Failed
			}
		}
	}
	if first == nil {
		return nil
	}
	return first
}

// emitFrom sends items, whose source port is port, through the socket of
// that port (the conn's own for 0, or if the port is no longer held).
func (c *UDPConn) emitFrom(port uint16, items []item) error {
	if raceEnabled {
		for i := range items {
			raceReleaseTo(items[i].addr)
		}
	}
	c.sRC, c.sFd = c.rc, -1
	if port != 0 {
		if s := c.src[port]; s != nil {
			c.sFd = s.fd
		} else {
			// Released while the packets waited (a delay impairment):
			// they leave from the conn's own port, and a ready ICRC,
			// computed for the other port, is hashed again.
			for i := range items {
				items[i].sport = 0
				items[i].icrc = false
			}
		}
	}
	var first error
	failed := 0
	gso := c.gso.Load()
	single := 0 // items before this one go one per message (a GSO run refused whole)
	for i := 0; i < len(items); {
		nm, ni := 0, 0
		for i < len(items) && nm < len(c.sh) && ni < len(c.siov) {
			k := 1
			if gso && i >= single {
				k = c.runLen(items[i:], len(c.siov)-ni)
			}
			for j := range k {
				it := &items[i+j]
				c.finishTx(it, uint16(j)) // IPv4 ID j, see above
				v := &c.siov[ni+j]
				v.Base = &it.buf[0]
				v.SetLen(len(it.buf))
			}
			h := &c.sh[nm].Hdr
			h.Name = (*byte)(unsafe.Pointer(&c.sname[nm]))
			h.Namelen = c.putName(&c.sname[nm], items[i].addr)
			h.Iov = &c.siov[ni]
			h.SetIovlen(k)
			if k > 1 {
				ctl := c.sctl[nm*sendCtlSize : (nm+1)*sendCtlSize]
				*(*uint16)(unsafe.Pointer(&ctl[unix.CmsgLen(0)])) = uint16(len(items[i].buf))
				h.Control = &ctl[0]
				h.SetControllen(len(ctl))
			} else {
				h.Control = nil
				h.SetControllen(0)
			}
			h.Flags = 0
			c.sruns[nm] = sendRun{first: i, count: k}
			nm++
			ni += k
			i += k
		}
		resume, f, err := c.sendMessages(nm)
		clear(c.siov[:ni]) // do not keep the callers' buffers reachable
		for m := range nm {
			c.sh[m].Hdr.Iov = nil
		}
		if errors.Is(err, net.ErrClosed) {
			return err
		}
		failed += f
		if err != nil && first == nil {
			first = err
		}
		if resume.first >= 0 {
			i = resume.first
			if resume.gsoOff {
				gso = false
			} else {
				single = resume.first + resume.count
			}
		}
	}
	if first == nil {
		return nil
	}
	if failed == 0 {
		return first // the socket failed as a whole (not a refusal)
	}
	return &SendError{Failed: failed, Err: first}
}

// runLen returns how many of items, from the first, one GSO super-buffer
// can carry: same destination, all but the last of the first one's length,
// the last no longer, at most maxGSOSegments and maxIov, and at most
// c.maxGSO bytes in all.
func (c *UDPConn) runLen(items []item, maxIov int) int {
	seg, dst := len(items[0].buf), items[0].addr
	total, k := seg, 1
	for limit := min(len(items), maxGSOSegments, maxIov); k < limit; {
		n := len(items[k].buf)
		if n > seg || items[k].addr != dst || total+n > c.maxGSO {
			break
		}
		total += n
		k++
		if n < seg {
			break
		}
	}
	return k
}

// putName writes a as a sockaddr into sa and returns its length.
func (c *UDPConn) putName(sa *unix.RawSockaddrInet6, a netip.AddrPort) uint32 {
	port := a.Port()
	if c.is4 {
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		s4.Family = unix.AF_INET
		p := (*[2]byte)(unsafe.Pointer(&s4.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		s4.Addr = a.Addr().As4()
		s4.Zero = [8]byte{}
		return unix.SizeofSockaddrInet4
	}
	sa.Family = unix.AF_INET6
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(port>>8), byte(port)
	sa.Flowinfo = 0
	sa.Addr = a.Addr().As16()
	sa.Scope_id = 0
	if a.Addr().IsLinkLocalUnicast() {
		sa.Scope_id = c.scopeID
	}
	return unix.SizeofSockaddrInet6
}

// sendMessages sends messages sh[:nm], skipping (and counting) the ones the
// kernel refuses. If GSO fails with EIO (a device that cannot checksum
// segments) it turns GSO off and returns the items still to send from
// resume.first on, with resume.gsoOff. If the kernel refuses a GSO
// super-buffer with EMSGSIZE or EINVAL (its segment size is larger than
// the path MTU allows: ip_append_data, udp_send_skb), which refuses its
// every packet, a short last one that fits included, it returns that
// run (resume.first, resume.count) for the caller to send one packet per
// message, so that each gets its own verdict as without GSO. Otherwise
// resume.first is -1. failed is the datagrams refused.
func (c *UDPConn) sendMessages(nm int) (resume sendResume, failed int, err error) {
	resume.first = -1
	for sent := 0; sent < nm; {
		c.sOff, c.sCnt = sent, nm-sent
		if c.sFd >= 0 {
			// A blocking socket: sendmmsg waits for room itself.
			for !c.sendmmsg(uintptr(c.sFd)) {
			}
		} else if werr := c.sRC.Write(c.sendFn); werr != nil {
			return resume, failed, werr
		}
		for _, r := range c.sruns[sent : sent+c.sN] {
			c.stats.SentDatagrams.Add(uint64(r.count))
			if r.count > 1 {
				c.stats.GSOBatches.Add(1)
			}
		}
		for m := sent; m < sent+c.sN; m++ {
			c.stats.SentBytes.Add(uint64(c.sh[m].Len))
		}
		sent += c.sN
		if c.sErr == 0 {
			continue
		}
		r := c.sruns[sent]
		if c.sErr == unix.EIO && r.count > 1 {
			c.gso.Store(false)
			c.logf("conn: %v: UDP GSO send failed (%v); GSO turned off", c.local, c.sErr)
			return sendResume{first: r.first, gsoOff: true}, failed, err // err: an earlier refusal
		}
		if (c.sErr == unix.EMSGSIZE || c.sErr == unix.EINVAL) && r.count > 1 {
			return sendResume{first: r.first, count: r.count}, failed, err
		}
		c.stats.SendErrors.Add(uint64(r.count))
		failed += r.count
		if err == nil {
			err = os.NewSyscallError("sendmmsg", c.sErr)
		}
		sent++
	}
	return resume, failed, err
}

// sendResume is where emitFrom resumes after sendMessages stopped at a
// GSO super-buffer the kernel refused (first < 0: it did not stop).
type sendResume struct {
	first, count int  // the refused run's items, to send again
	gsoOff       bool // GSO is off for good (EIO): send the rest without it
}

// sendmmsg is the RawConn.Write callback; its arguments and results are
// in c.s*. It is a method value built once, so calling it allocates nothing.
func (c *UDPConn) sendmmsg(fd uintptr) bool {
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&c.sh[c.sOff])), uintptr(c.sCnt), 0, 0, 0)
		c.stats.SendCalls.Add(1)
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			return false // wait until writable
		case e != 0:
			c.sN, c.sErr = 0, e
		case n == 0:
			c.sN, c.sErr = 0, unix.ENOBUFS // cannot happen for sCnt > 0
		default:
			c.sN, c.sErr = int(n), 0
		}
		return true
	}
}

// wakeHook, when set by a test, runs between Wake's two steps.
var wakeHook func()

// Wake implements Conn.
func (c *UDPConn) Wake() {
	c.woken.Store(true)
	if wakeHook != nil {
		wakeHook()
	}
	c.pc.SetReadDeadline(time.Now())
}

// Receive implements Conn.
func (c *UDPConn) Receive(pkts []Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	c.beginReceive()
	held := c.buffered()
	for {
		if n := c.deliver(pkts); n > 0 {
			return n, nil
		}
		if held {
			return 0, nil // what Buffered promised was all dropped (see Conn.Receive)
		}
		if c.woken.Swap(false) {
			c.pc.SetReadDeadline(time.Time{})
			c.deadline = false
			return 0, nil
		}
		c.beforeRead()
		if err := c.read(len(pkts)); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// A delayed packet is due, or Wake. The deadline that
				// fired may be one whose flag an earlier Receive already
				// consumed (Wake stores the flag, then moves the
				// deadline; a busy Receive can come in between): read
				// sets the deadline it wants again before it reads, or
				// every read would fail on the stale one at once.
				c.deadline = true
				continue
			}
			return 0, err
		}
	}
}

// read blocks in recvmmsg until datagrams arrive (or a delayed packet is
// due) and appends them to rxRaw. Called with rxMu held.
func (c *UDPConn) read(want int) error {
	if next, ok := c.rx.next(); ok {
		c.pc.SetReadDeadline(next)
		c.deadline = true
	} else if c.deadline {
		c.pc.SetReadDeadline(time.Time{})
		c.deadline = false
	}
	// Wake sets woken before it moves the deadline: if it ran after the
	// deadline was set above, its deadline stands; if before, woken shows.
	if c.woken.Load() {
		return os.ErrDeadlineExceeded
	}
	vlen := min(len(c.rh), want)
	for k := range vlen {
		h := &c.rh[k].Hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.SetControllen(rxCtlSize)
		h.Flags = 0
	}
	c.rCnt = vlen
	if err := c.rc.Read(c.recvFn); err != nil {
		return err
	}
	if c.rErr != 0 {
		return os.NewSyscallError("recvmmsg", c.rErr)
	}
	if raceEnabled && c.rN > 0 {
		raceAcquireAt(c.local)
	}
	for k := range c.rN {
		m := &c.rh[k]
		if m.Hdr.Flags&unix.MSG_TRUNC != 0 { // cannot happen with 64 KiB slots
			c.stats.RcvdDatagrams.Add(1)
			c.stats.Short.Add(1)
			continue
		}
		gso, ip := parseControl(c.rctl[k*rxCtlSize : k*rxCtlSize+int(m.Hdr.Controllen)])
		if !c.gro {
			gso = 0
		}
		c.rxRaw = append(c.rxRaw, rawDgram{
			buf:  c.rbuf[k*rxSlotSize : k*rxSlotSize+int(m.Len)],
			from: parseSockaddr(&c.rname[k]),
			gso:  gso,
			ip:   ip,
		})
	}
	return nil
}

// recvmmsg is the RawConn.Read callback (see sendmmsg).
func (c *UDPConn) recvmmsg(fd uintptr) bool {
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&c.rh[0])), uintptr(c.rCnt), 0, 0, 0)
		c.stats.RecvCalls.Add(1)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false // wait until readable
		case 0:
			c.rN, c.rErr = int(n), 0
		default:
			c.rN, c.rErr = 0, e
		}
		return true
	}
}

// parseControl returns the segment size of a UDP_GRO control message (0
// if there is none) and the IP header fields of the IP_TTL, IP_TOS,
// IPV6_HOPLIMIT, IPV6_TCLASS and IPV6_FLOWINFO ones.
func parseControl(ctl []byte) (gso int, ip IPInfo) {
	for len(ctl) >= unix.SizeofCmsghdr {
		h, data, rest, err := unix.ParseOneSocketControlMessage(ctl)
		if err != nil || len(data) == 0 {
			return gso, ip
		}
		// Ints are in host order; the flow information is big-endian.
		var v int
		switch {
		case len(data) >= 4:
			v = int(*(*int32)(unsafe.Pointer(&data[0])))
		case len(data) >= 2:
			v = int(*(*uint16)(unsafe.Pointer(&data[0])))
		default:
			v = int(data[0])
		}
		switch {
		case h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO:
			gso = v
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TTL,
			h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_HOPLIMIT:
			ip.TTL = uint8(v)
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TOS:
			ip.TOS = data[0] // one byte
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_TCLASS:
			ip.TOS = uint8(v)
		case h.Level == unix.IPPROTO_IPV6 && h.Type == ipv6FlowInfo && len(data) >= 4:
			ip.FlowLabel = (uint32(data[1])<<16 | uint32(data[2])<<8 | uint32(data[3])) & 0xfffff
		}
		ctl = rest
	}
	return gso, ip
}

// parseSockaddr converts a sockaddr_in or sockaddr_in6 (the scope ID is
// dropped) into an AddrPort.
func parseSockaddr(sa *unix.RawSockaddrInet6) netip.AddrPort {
	b := (*[unix.SizeofSockaddrInet6]byte)(unsafe.Pointer(sa))
	port := uint16(b[2])<<8 | uint16(b[3])
	switch sa.Family {
	case unix.AF_INET:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port)
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), port)
	}
	return netip.AddrPort{}
}

// Close implements Conn.
func (c *UDPConn) Close() error {
	c.closeOnce.Do(func() {
		c.core.closed.Store(true)
		c.closeErr = c.pc.Close()
		c.shutdown() // closes the source ports' sockets too
	})
	return c.closeErr
}
