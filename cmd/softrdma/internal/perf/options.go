// Package perf runs the perftest-style tools of cmd/softrdma (write-bw,
// write-lat, read-bw, read-lat, send-bw, send-lat, atomic-bw) over the
// softrdma verbs API: a server waits for one client on TCP, the two agree
// on the test and exchange their QPs' addresses, keys and PSNs, run it over
// RoCEv2 and report in perftest's format.
//
// The semantics follow linux-rdma/perftest: BW tools keep tx-depth work
// requests outstanding with a completion every cq-mod of them; write-lat
// is a ping-pong in which each side writes into the other's buffer and
// polls its own memory for the last byte; read-lat times one READ round
// trip; send-lat is a SEND/RECV ping-pong. See docs/cli.md for what
// --verify and --file add.
package perf

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/odpbuf"
	"github.com/softrdma/softrdma/transport/conn"
)

// Test is one of the tools.
type Test uint8

// Tests.
const (
	WriteBW Test = iota + 1
	WriteLat
	ReadBW
	ReadLat
	SendBW
	SendLat
	AtomicBW
)

type verb uint8

// Verbs, in perftest's testsStr order.
const (
	verbSend verb = iota
	verbWrite
	verbRead
	verbAtomic
)

var verbTitles = [...]string{"Send", "RDMA_Write", "RDMA_Read", "Atomic"}

var testInfo = [...]struct {
	name string
	verb verb
	lat  bool
}{
	WriteBW:  {"write-bw", verbWrite, false},
	WriteLat: {"write-lat", verbWrite, true},
	ReadBW:   {"read-bw", verbRead, false},
	ReadLat:  {"read-lat", verbRead, true},
	SendBW:   {"send-bw", verbSend, false},
	SendLat:  {"send-lat", verbSend, true},
	AtomicBW: {"atomic-bw", verbAtomic, false},
}

func (t Test) valid() bool { return t >= WriteBW && t <= AtomicBW }

func (t Test) String() string {
	if t.valid() {
		return testInfo[t].name
	}
	return fmt.Sprintf("Test(%d)", uint8(t))
}

// ParseTest returns the test named name ("write-bw", ...).
func ParseTest(name string) (Test, error) {
	for t := WriteBW; t <= AtomicBW; t++ {
		if testInfo[t].name == name {
			return t, nil
		}
	}
	return 0, fmt.Errorf("unknown test %q", name)
}

func (t Test) verb() verb { return testInfo[t].verb }

// IsLat reports whether t is a latency test.
func (t Test) IsLat() bool { return testInfo[t].lat }

// title is perftest's banner title, e.g. "RDMA_Write BW Test".
func (t Test) title(atomic string) string {
	s := verbTitles[t.verb()] + " "
	if t.verb() == verbAtomic {
		s += atomic + " "
	}
	if t.IsLat() {
		return s + "Latency Test"
	}
	return s + "BW Test"
}

// fileFromServer reports whether --file belongs on the server: the side
// whose bytes move. READ moves the server's bytes to the client; WRITE and
// SEND move the client's to the server.
func (t Test) fileFromServer() bool { return t.verb() == verbRead }

// Atomic operations (perftest's -A).
const (
	FetchAndAdd = "FETCH_AND_ADD"
	CmpAndSwap  = "CMP_AND_SWAP"
)

// Defaults and limits, perftest's (perftest_parameters.h).
const (
	DefSizeBW      = 65536
	DefSizeLat     = 2
	DefSizeAtomic  = 8
	DefIters       = 1000
	DefItersWB     = 5000 // write-bw, read-bw, send-bw, atomic-bw
	DefTxBW        = 128
	DefTxLat       = 1
	DefRxSend      = 512
	DefCQMod       = 100
	DefInlineWrite = 220     // perftest's DEF_INLINE_WRITE
	DefInlineSend  = 236     // perftest's DEF_INLINE_SEND_RC_UC
	MaxSize        = 1 << 23 // 8 MiB, the largest size of -a
	MinIters       = 5
	MaxIters       = 100_000_000
	MaxTx          = 15000
	MaxQPs         = 16384
	// DefaultMaxMem is Options.MaxMem's default: 4 GiB of buffers.
	DefaultMaxMem = 4 << 30
	MaxCQMod      = 1024
	// MinDuration and MaxDuration bound -D. perftest's -D counts whole
	// seconds; softrdma takes Go durations too, but a run shorter than
	// MinDuration may complete no iteration (and one that does is no
	// measurement), and one longer than a day is a typo.
	MinDuration = 100 * time.Millisecond
	MaxDuration = 24 * time.Hour
)

// DefServerPort is the server's RoCEv2 UDP port when --bind gives none.
const DefServerPort = 4791

// StreamBuffer bounds the registered ring a --file or --verify stream
// uses (slots × size), so that large files move through pinned memory of
// a fixed size.
const StreamBuffer = 4 << 20

// Params are the test parameters. The client's are authoritative: it sends
// them in its hello and the server adopts them, so the server needs no
// flags but the ones about itself (-p, --bind, --out, --pcap, ...).
type Params struct {
	Test     string        `json:"test"`
	Size     int64         `json:"size"`     // message size in bytes
	Iters    int64         `json:"iters"`    // per QP; ignored with Duration
	Duration time.Duration `json:"duration"` // run for this long instead of Iters
	All      bool          `json:"all"`      // sizes 2 to 2^23
	MTU      int           `json:"mtu"`      // path MTU, bytes; 0 (no -m): the port's active MTU (setMTU)
	TxDepth  int           `json:"tx_depth"`
	RxDepth  int           `json:"rx_depth"` // SEND tests: receives posted
	CQMod    int           `json:"cq_mod"`   // BW: a completion every CQMod sends
	QPs      int           `json:"qps"`
	Inline   int           `json:"inline"` // max inline data; sends up to this size go inline; -1: perftest's default
	Atomic   string        `json:"atomic"` // FetchAndAdd or CmpAndSwap
	Verify   bool          `json:"verify"`
	Seed     uint64        `json:"seed"` // of the --verify pattern
	// QPTimeout is the local ACK timeout exponent (perftest -u): the
	// retransmit timer is 4.096 µs × 2^QPTimeout. 0 means perftest's 14.
	QPTimeout int `json:"qp_timeout"`
	// FileSize is the size of the client's --file (write-bw, send-bw);
	// -1 when none.
	FileSize int64 `json:"file_size"`

	// perftest: the run uses perftest's exchange, where --verify of
	// write-bw and send-bw streams nothing (see perftest.go).
	perftest bool
}

// Sizes returns the message sizes to run: 2 to 2^23 with All, else Size.
func (p *Params) Sizes() []int64 {
	if !p.All {
		return []int64{p.Size}
	}
	var s []int64
	for n := int64(2); n <= MaxSize; n *= 2 {
		s = append(s, n)
	}
	return s
}

// Options configure one run of a tool.
type Options struct {
	Test   Test
	Params Params

	// Server is the server's host name or IP (a client); "" runs the
	// server.
	Server string
	// Port is the TCP port of the exchange (perftest's -p, 18515); 0
	// lets a server pick one (see Ready). With RDMACM, the rdma_cm port
	// (0: 18515).
	Port int
	// RDMACM connects with the RDMA CM instead of TCP, as perftest's -R:
	// the exchange runs over an RC connection the CM makes to the
	// server's port, and the CM connects the data QPs (see cm.go).
	RDMACM bool
	// RoCEPort is the UDP port of the server's device, where a -R
	// client's CM sends its MADs (0: 4791, every RoCE NIC's).
	RoCEPort int
	// ConnectTimeout makes a client retry a refused connection for this
	// long (0: one attempt, as perftest).
	ConnectTimeout time.Duration
	// SetupTimeout bounds the exchange's setup, from the TCP connection
	// to the agreement on the test (the version exchange, then softrdma's
	// hello and reply or perftest's system data and MTU): a peer that
	// connected but does not speak the exchange fails the run instead of
	// hanging it (0: DefaultSetupTimeout).
	SetupTimeout time.Duration
	// IdleTimeout ends an -n run in which no completion arrived for this
	// long (--idle-timeout; 0: no bound, the library's default): the QPs
	// retry for ever (retry_cnt 7, as on rxe), so a dead peer or path
	// would keep it going. Each completion restarts it. A -D run is
	// bounded by its drain limit instead. A side with no completions
	// (write-bw's server, ...) learns of its peer's expiry over the
	// exchange, or, with RDMACM or perftest's exchange, where it cannot,
	// watches the packets it receives. With RDMACM every message of the
	// exchange must also be acknowledged within it.
	IdleTimeout time.Duration
	// Bind is the RoCEv2 device's address: "IP" or "IP:port". The default
	// is the IP of the TCP connection (the one that reaches the peer) and
	// port 4791 for a server (an ephemeral port if 4791 is taken), an
	// ephemeral port for a client.
	Bind string
	// File is the file whose bytes move: the client's for write-bw and
	// send-bw, the server's for read-bw.
	File string
	// Out is where the receiving side writes the bytes of File.
	Out string
	// Pcap, if set, records every datagram the device sends and receives.
	Pcap string
	// Impair injects loss, reordering, ... (conn.ParseImpairment syntax).
	Impair string
	// SourcePort is the UDP source port of the device's packets
	// (softrdma.Config.SourcePort: 0 spreads QPs as rxe does, -1 is the
	// device's own port, else that port).
	SourcePort int
	// Perftest makes this side speak perftest's exchange even to a
	// softrdma peer (byte for byte: no softrdma mark in its version), as
	// it does by itself with a stock perftest peer; see perftest.go.
	Perftest bool
	// Stat prints the device's non-zero counters at the end, also after
	// a failure ("softrdma counters (local <-> peer):", then "  name =
	// value" lines, as rc-pingpong --stat).
	Stat bool
	// MaxMem is the most bytes of buffers this side allocates and
	// registers (-q QPs × the region of -s, whole pages; 0:
	// DefaultMaxMem). A server takes -s and -q from its client, so this
	// is what keeps a client from making it allocate what it cannot.
	MaxMem int64
	// JSON prints the results as JSON instead of text.
	JSON bool
	// ReportGbits prints BW in Gb/sec instead of MB/sec.
	ReportGbits bool

	// Demand paging of this side's buffer (each side chooses its own, as
	// with perftest's --odp; the exchange does not carry them).
	ODP ODPOptions

	// Device, if set, is used instead of opening one (the demo's two
	// emulated hosts); Bind, Pcap and Impair are then ignored.
	Device *softrdma.Device
	// Listener, if set, is the server's TCP listener (Port is ignored).
	Listener net.Listener
	// Ready is called by a server once its TCP listener accepts
	// connections, with its address (with RDMACM: once its CM listens,
	// with the rdma_cm address, a cmchan.Addr).
	Ready func(addr net.Addr)
	// Stdout receives the report; Logf, if set, notices (e.g. a fallback
	// port).
	Stdout io.Writer
	Logf   func(format string, args ...any)
}

// Defaults fills the zero fields of p with perftest's defaults for t.
func (p *Params) Defaults(t Test) {
	p.Test = t.String()
	if p.Size == 0 {
		switch {
		case t.verb() == verbAtomic:
			p.Size = DefSizeAtomic
		case t.IsLat():
			p.Size = DefSizeLat
		default:
			p.Size = DefSizeBW
		}
	}
	if p.Iters == 0 {
		if t.IsLat() {
			p.Iters = DefIters
		} else {
			p.Iters = DefItersWB
		}
	}
	if p.QPTimeout == 0 {
		p.QPTimeout = 14
	}
	if p.TxDepth == 0 {
		if t.IsLat() {
			p.TxDepth = DefTxLat
		} else {
			p.TxDepth = DefTxBW
		}
	}
	if p.RxDepth == 0 {
		p.RxDepth = DefRxSend
	}
	if p.CQMod == 0 {
		p.CQMod = DefCQMod
	}
	// perftest: cq_mod cannot exceed tx_depth, or no completion would ever
	// free the send queue.
	p.CQMod = min(p.CQMod, p.TxDepth)
	if p.QPs == 0 {
		p.QPs = 1
	}
	if p.Inline < 0 {
		// perftest's ctx_set_max_inline: inline by default for the
		// latency tests only.
		switch t {
		case WriteLat:
			p.Inline = DefInlineWrite
		case SendLat:
			p.Inline = DefInlineSend
		default:
			p.Inline = 0
		}
	}
	if p.Atomic == "" {
		p.Atomic = FetchAndAdd
	}
	if p.FileSize == 0 {
		p.FileSize = -1
	}
}

// Validate checks p for test t (after Defaults).
func (p *Params) Validate(t Test) error {
	if !t.valid() {
		return fmt.Errorf("unknown test %d", t)
	}
	if p.Test != t.String() {
		return fmt.Errorf("the client runs %s, this side %s", p.Test, t)
	}
	// Each message names the flag, long and short, and the value: the
	// server checks its client's parameters with the same words.
	switch {
	case p.QPTimeout < 1 || p.QPTimeout > 31:
		return fmt.Errorf("--qp-timeout %d (-u): must be 1 to 31", p.QPTimeout)
	case p.Size < 1 || p.Size > 1<<31:
		return fmt.Errorf("--size %d (-s): must be 1 to 2^31 bytes", p.Size)
	case t.verb() == verbAtomic && p.Size != 8:
		return fmt.Errorf("--size %d (-s): atomic-bw's size must be 8", p.Size)
	case t.verb() == verbAtomic && p.All:
		return errors.New("--all (-a): does not apply to atomic-bw (atomics are 8 bytes)")
	case p.Duration == 0 && (p.Iters < MinIters || p.Iters > MaxIters):
		return fmt.Errorf("--iters %d (-n): must be %d to %d", p.Iters, MinIters, MaxIters)
	case p.Duration != 0 && (p.Duration < MinDuration || p.Duration > MaxDuration):
		return fmt.Errorf("--duration %v (-D): must be %v to %v", p.Duration, MinDuration, MaxDuration)
	case p.MTU != 0 && mtuCode(p.MTU) == 0:
		return fmt.Errorf("--mtu %d (-m): must be 256, 512, 1024, 2048 or 4096", p.MTU)
	case p.TxDepth < 1 || p.TxDepth > MaxTx:
		return fmt.Errorf("--tx-depth %d (-t): must be 1 to %d", p.TxDepth, MaxTx)
	case p.RxDepth < 1 || p.RxDepth > MaxTx:
		return fmt.Errorf("--rx-depth %d (-r): must be 1 to %d", p.RxDepth, MaxTx)
	case p.CQMod < 1 || p.CQMod > MaxCQMod:
		return fmt.Errorf("--cq-mod %d (-Q): must be 1 to %d", p.CQMod, MaxCQMod)
	case p.QPs < 1 || p.QPs > MaxQPs:
		return fmt.Errorf("--qp %d (-q): must be 1 to %d", p.QPs, MaxQPs)
	case t.IsLat() && p.QPs != 1:
		return fmt.Errorf("--qp %d (-q): %s is a latency test, which uses one QP", p.QPs, t)
	case p.Inline < 0 || p.Inline > 1024:
		return fmt.Errorf("--inline_size %d (-I): must be 0 to 1024", p.Inline)
	case p.Atomic != FetchAndAdd && p.Atomic != CmpAndSwap:
		return fmt.Errorf("--atomic_type %q (-A): must be %s or %s", p.Atomic, FetchAndAdd, CmpAndSwap)
	}
	if p.QPs != 1 && (p.FileSize >= 0 || p.Verify && (t == WriteBW || t == SendBW)) && !p.perftest {
		// (No tool name in front: the CLI prints the error after it.)
		return errors.New("--file and --verify stream over one QP (-q 1)")
	}
	if p.FileSize >= 0 && p.All {
		return errors.New("--file and --all cannot be combined (the file decides the message count)")
	}
	return nil
}

// setMTU is perftest's set_mtu (src/perftest_parameters.c): the path MTU
// this side can use, in bytes. Without -m (requested 0) it is the port's
// active MTU, which the device derives from its link as rxe does (1500 →
// 1024); a requested MTU larger than the active one becomes the active
// one, and notice gets perftest's two lines saying so (perftest prints
// them on stdout, and the active MTU as its ibv_mtu enum). The two sides
// then agree on the smaller of theirs (agreeMTU).
func setMTU(requested int, active softrdma.MTU, notice func(string)) int {
	if requested == 0 {
		return active.Bytes()
	}
	if mtuCode(requested) > active {
		notice(fmt.Sprintf("Requested mtu is higher than active mtu\nChanging to active mtu - %d (%d[B])\n",
			active, active.Bytes()))
		return active.Bytes()
	}
	return requested
}

// agreeMTU is check_mtu's rule (src/perftest_communication.c): each side
// offers its setMTU and both use the smaller, the peer's only if it is a
// valid MTU (an older softrdma server sends none).
func agreeMTU(mine, peer int) int {
	if mtuCode(peer) != 0 && peer < mine {
		return peer
	}
	return mine
}

func mtuCode(bytes int) softrdma.MTU {
	for m := softrdma.MTU256; m <= softrdma.MTU4096; m++ {
		if m.Bytes() == bytes {
			return m
		}
	}
	return 0
}

// ODPOptions choose how a side registers its buffer: pinned (the zero
// value), on demand, or through an implicit ODP MR (odpbuf.Options, shared
// with rc-pingpong).
type ODPOptions = odpbuf.Options

// ParseBind parses --bind: "IP" or "IP:port" (IPv6 as "[IP]:port").
// It reports whether a port was given.
func ParseBind(s string) (ap netip.AddrPort, hasPort bool, err error) {
	if s == "" {
		return netip.AddrPort{}, false, nil
	}
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return netip.AddrPortFrom(a.Unmap(), 0), false, checkBindIP(a)
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, false, fmt.Errorf("--bind %q: want IP or IP:port", s)
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.AddrPort{}, false, fmt.Errorf("--bind %q: %q is not an IP address", s, host)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, false, fmt.Errorf("--bind %q: bad port %q", s, port)
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(n)), true, checkBindIP(a)
}

func checkBindIP(a netip.Addr) error {
	if a.IsUnspecified() {
		return fmt.Errorf("--bind %v: the RoCE device needs a specific IP (it is the device's GID)", a)
	}
	return nil
}

// ParseImpair parses --impair (conn.ParseImpairment).
func ParseImpair(s string) (*conn.Impairment, error) {
	imp, err := conn.ParseImpairment(s)
	if err != nil {
		return nil, fmt.Errorf("--impair: %w", err)
	}
	return imp, nil
}
