// Package conn is the encapsulation layer of softrdma: it carries RoCEv2
// packets in UDP datagrams (IBTA Annex A17 "RoCEv2", UDP port 4791),
// computes and checks their ICRC, and offers batched I/O shaped like
// wireguard-go's conn.Bind.
//
// Two implementations share one pipeline (impairment, ICRC, tap, stats):
// Listen opens a real UDP socket (Linux: sendmmsg/recvmmsg, UDP GSO and
// GRO), NewPipe returns two cross-wired in-memory conns for engine tests.
//
// The pipeline of one datagram, in each direction:
//
//	Send:    caller's packets -> tx impairment (drop, dup, delay, reorder)
//	         -> GSO grouping -> ICRC (with the IPv4 ID the kernel will use)
//	         -> tx corruption -> tap -> socket
//	Receive: socket -> GRO split -> ICRC check (bad: counted, tapped, dropped)
//	         -> tap -> rx impairment (drop, dup, delay, reorder, corruption,
//	         which the ICRC is checked again for) -> caller
//
// So a tap records what crossed the wire in both directions, and
// impairments act inside the host, on either side of it.
package conn

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/softrdma/softrdma/transport/wire"
)

// Implementation constants.
const (
	// IdealBatchSize is the number of packets a Send or Receive call should
	// carry for the syscalls to be amortized (wireguard-go uses 128; 64
	// already amortizes sendmmsg and recvmmsg to within a few percent here,
	// and keeps the receive buffers at 64 x 64 KiB).
	IdealBatchSize = 64

	// DefaultSocketBuffer is the effective size of the socket receive and
	// send buffers that Listen asks for (with SO_RCVBUFFORCE and
	// SO_SNDBUFFORCE). Loss on loopback is dominated by receive buffer
	// overflows (see /work/shared/perf-anchors.md), hence the large value.
	DefaultSocketBuffer = 64 << 20

	// MinPacketSize is the shortest RoCE packet: a BTH and the ICRC.
	MinPacketSize = wire.BTHSize + wire.ICRCSize

	// MaxPacketSize is the largest UDP payload of an IPv4 datagram
	// (65535 - 20 - 8); Send rejects anything larger.
	MaxPacketSize = 65507

	// maxGSOSegments bounds the datagrams in one UDP_SEGMENT super-buffer
	// (the kernel's UDP_MAX_SEGMENTS; 64 until Linux 6.x raised it to 128).
	maxGSOSegments = 64
)

// Packet is one RoCEv2 packet, the payload of one UDP datagram.
type Packet struct {
	// Buf is the RoCE packet: BTH, extension headers, payload, pad and the
	// 4-byte ICRC trailer. Send fills in the trailer; on Receive the trailer
	// has been checked.
	Buf []byte
	// Addr is the destination on Send and the source on Receive.
	Addr netip.AddrPort
	// IP is what Receive knows of the IP header the datagram arrived with,
	// beyond its addresses (Send ignores it). A UD responder rebuilds the
	// header from it into the GRH it places at the head of the receive
	// buffer, as Linux rxe copies the received header.
	IP IPInfo
	// SrcPort is the UDP source port Send sends the packet from (Receive
	// leaves it 0: the source port is Addr's). 0, or the conn's own port,
	// sends from the conn's socket; any other port must be held with
	// AcquireSourcePort while packets carry it. A packet whose port is no
	// longer held when it leaves (released while the packet waited in a
	// delay impairment, say) goes from the conn's own port.
	SrcPort uint16
	// ICRCReady says that the trailer already holds the packet's ICRC for
	// IPv4 ID 0 (IPv6: the ICRC), computed with the IP header fields the
	// conn sends with (its address, Addr's, DF) from SrcPort (0: the
	// conn's own) to Addr's port, typically while the payload was copied
	// in (wire.ICRCState.Copy). Send then corrects it for the IPv4 ID the
	// datagram leaves with (wire.SetICRCID) instead of hashing the packet
	// again; a packet that would leave from another port than SrcPort
	// (no longer held) is hashed again.
	ICRCReady bool
}

// IPInfo is the part of a received datagram's IP header that its addresses
// and length do not give.
type IPInfo struct {
	ID        uint16 // IPv4 Identification: the one the ICRC verified with (0 for IPv6)
	TTL       uint8  // IPv4 time to live or IPv6 hop limit
	TOS       uint8  // IPv4 type of service (DSCP and ECN) or IPv6 traffic class
	FlowLabel uint32 // IPv6 flow label (20 bits; 0 for IPv4)
}

// DefaultTTL and DefaultTOS are the IPv4 TTL (IPv6 hop limit) and TOS
// (traffic class) a conn sends with, those of Linux rxe; a PipeConn
// reports them for what it receives.
const (
	DefaultTTL = 64
	DefaultTOS = 0
)

// Conn sends and receives RoCEv2 packets over UDP (or an in-memory pipe).
//
// Send may be called from several goroutines (calls are serialized).
// Receive must be called from one goroutine at a time: the packets it
// returns alias the conn's buffers until the next Receive.
//
// A Conn may also have a method Buffered() bool (UDPConn and PipeConn do)
// reporting whether packets already read wait for the next Receive; a
// device's receive loop then coalesces ACKs while they do.
type Conn interface {
	// Send sends pkts in order. It computes every packet's ICRC in place
	// (so each Buf must have room for the trailer and no two Bufs may
	// overlap), or corrects a ready one for the IPv4 ID the datagram gets
	// (Packet.ICRCReady), and may coalesce runs of same-destination
	// packets into one UDP GSO send. The conn does not keep the Bufs after Send returns.
	// A packet shorter than MinPacketSize or longer than MaxPacketSize, or
	// with an address of the wrong family, makes Send fail before anything
	// is sent. A datagram the kernel refuses (EMSGSIZE, ...) is skipped and
	// counted in Stats().SendErrors; the first such error is returned after
	// the rest of the batch was sent.
	Send(pkts []Packet) error

	// Receive blocks until at least one packet has arrived, fills
	// pkts[:n] and returns n. It returns 0 packets and no error after a
	// Wake, and when the packets it held from an earlier read (Buffered)
	// were all dropped on delivery. Each Buf aliases the conn's buffers and is
	// valid until the next call to Receive. ICRCs have been checked;
	// packets that fail are dropped and counted in Stats().BadICRC. After
	// Close, Receive returns an error that wraps net.ErrClosed.
	Receive(pkts []Packet) (n int, err error)

	// LocalAddr returns the address the conn is bound to.
	LocalAddr() netip.AddrPort

	// BatchSize returns the number of packets per Send or Receive call
	// that the conn is tuned for (IdealBatchSize).
	BatchSize() int

	// Stats returns the conn's live counters.
	Stats() *Stats

	// SetImpairment replaces the impairment applied to the conn's traffic
	// (nil: none). It takes effect from the next packet; an invalid
	// impairment is rejected and the old one kept.
	SetImpairment(imp *Impairment) error

	// SetTap sets the tap that sees every datagram sent and received
	// (nil: none).
	SetTap(t Tap)

	// Wake makes a Receive that is blocked, or the next one, return 0
	// packets and no error, once: the receive loop then does work that
	// another goroutine made due (held packets to replay after a
	// suspension ends). It is safe to call from any goroutine.
	Wake()

	// AcquireSourcePort makes port usable as a Packet's SrcPort until the
	// matching ReleaseSourcePort. Holds are counted: the first opens what
	// sending from port needs (UDPConn: a send-only socket bound to the
	// conn's IP and port, with the conn's socket options), later ones share
	// it. Port 0 and the conn's own port need nothing and are not counted.
	// The sockets set SO_REUSEPORT: conns of the host that send from the
	// same IP and port share it. It fails if the port cannot be bound,
	// typically because a socket without SO_REUSEPORT has it (another
	// conn's own port; errors.Is(err, syscall.EADDRINUSE)); the caller may
	// then send from the conn's own port.
	AcquireSourcePort(port uint16) error

	// ReleaseSourcePort gives up one hold of port taken by
	// AcquireSourcePort; the last one closes the port's socket.
	ReleaseSourcePort(port uint16)

	// Close closes the conn. A blocked Receive returns net.ErrClosed.
	// Packets still held by a delay or reorder impairment are discarded.
	Close() error
}

// Direction is a direction of traffic through a conn.
type Direction uint8

// Directions. DirBoth is for Impairment.Dir only.
const (
	DirTx   Direction = 1 << iota // sent by this conn
	DirRx                         // received by this conn
	DirBoth = DirTx | DirRx
)

func (d Direction) String() string {
	switch d {
	case DirTx:
		return "tx"
	case DirRx:
		return "rx"
	case DirBoth:
		return "both"
	}
	return "none"
}

// Tap sees every datagram that crosses the wire: each one handed to the
// kernel (after tx impairment, with its final ICRC) and each one read from
// it (before rx impairment, whether or not its ICRC is good, and those too
// short to hold a packet, which are then dropped). ipID is the
// IPv4 Identification the datagram carries on the wire (sent: what the
// kernel assigns; received: the one its ICRC verified with, or the first
// guess if it did not verify); it is 0 for IPv6. Each datagram is seen
// once: a GSO super-buffer that the kernel refused as a whole and that is
// sent again without GSO (other IDs, so other ICRCs) is seen as it was
// first handed over, and a datagram the kernel refused is seen too (the
// tap runs before the send, so that a tap shared with the receiving conn
// records the send first).
//
// Packet is called with one of the conn's locks held: it must be quick and
// must not call back into the conn. roce aliases the conn's buffers and is
// only valid during the call. pcaptap.Writer is a Tap that writes a pcap.
type Tap interface {
	Packet(dir Direction, src, dst netip.AddrPort, ipID uint16, roce []byte)
}

// Errors.
var (
	// ErrPacketSize reports a packet given to Send that is shorter than
	// MinPacketSize or longer than MaxPacketSize.
	ErrPacketSize = errors.New("conn: packet size out of range")
	// ErrAddressFamily reports a destination the conn cannot reach: of the
	// other IP family, or (pipe) not the peer's address.
	ErrAddressFamily = errors.New("conn: destination address not reachable from this conn")
)

// SendError is what Send returns when the kernel refused some datagrams
// of a batch (EMSGSIZE, ENOBUFS, EPERM from a firewall, ...): Failed of
// them were not sent (and are counted in Stats().SendErrors), every other
// packet was. Err is the first refusal, an *os.SyscallError. With an
// impairment that delays packets, the datagrams sent (and refused) by one
// Send may include packets of earlier calls that fell due.
type SendError struct {
	Failed int   // datagrams refused by the kernel
	Err    error // the first refusal
}

func (e *SendError) Error() string {
	return fmt.Sprintf("conn: datagrams not sent: %d: %v", e.Failed, e.Err)
}

// Unwrap returns the first refusal.
func (e *SendError) Unwrap() error { return e.Err }

// Config configures Listen.
type Config struct {
	// Addr is the local address to bind: a specific IPv4 or IPv6 address
	// (the ICRC covers the source address, so it must be known) and a port.
	// Port 0 picks an ephemeral port (for tests); RoCEv2 peers expect
	// wire.RoCEv2Port (4791).
	Addr netip.AddrPort

	// RcvBuf and SndBuf are the effective socket buffer sizes wanted
	// (what SO_RCVBUF reads back, twice what is set). 0 means
	// DefaultSocketBuffer; negative leaves the kernel's default.
	RcvBuf, SndBuf int

	// DisableGSO and DisableGRO turn off UDP segmentation offload on send
	// and UDP receive offload, even where the kernel has them.
	DisableGSO, DisableGRO bool

	// Impair is the initial impairment (nil: none); see Conn.SetImpairment.
	Impair *Impairment

	// Tap, if not nil, sees every datagram (see Tap).
	Tap Tap

	// NoICRC sends datagrams without computing the ICRC trailer and
	// accepts every received datagram without checking it. It exists for
	// one purpose: a raw-UDP baseline in benchmarks that costs what plain
	// UDP costs with the same batching. Never use it for RoCE traffic.
	NoICRC bool

	// Logf, if not nil, receives warnings (buffer sizes not obtained,
	// offloads turned off at run time). Nothing is logged per packet.
	Logf func(format string, args ...any)
}

// DefaultAddr returns ip with the RoCEv2 port (4791).
func DefaultAddr(ip netip.Addr) netip.AddrPort { return netip.AddrPortFrom(ip, wire.RoCEv2Port) }
