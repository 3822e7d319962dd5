package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/perf"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/pingpong"
)

// cli is the command line: one subcommand per tool, with perftest's flags.
type cli struct {
	WriteBW  toolCmd   `cmd:"" name:"write-bw" help:"RDMA WRITE bandwidth (ib_write_bw)."`
	WriteLat toolCmd   `cmd:"" name:"write-lat" help:"RDMA WRITE latency, ping-pong polling memory (ib_write_lat)."`
	ReadBW   toolCmd   `cmd:"" name:"read-bw" help:"RDMA READ bandwidth (ib_read_bw)."`
	ReadLat  toolCmd   `cmd:"" name:"read-lat" help:"RDMA READ latency (ib_read_lat)."`
	SendBW   toolCmd   `cmd:"" name:"send-bw" help:"SEND/RECV bandwidth (ib_send_bw)."`
	SendLat  toolCmd   `cmd:"" name:"send-lat" help:"SEND/RECV latency, ping-pong (ib_send_lat)."`
	AtomicBW toolCmd   `cmd:"" name:"atomic-bw" help:"Atomic FETCH_AND_ADD or CMP_AND_SWAP bandwidth (ib_atomic_bw)."`
	Demo     demoCmd   `cmd:"" help:"Two emulated hosts in this process move a file by WRITE, READ and SEND and check it."`
	Dump     dumpCmd   `cmd:"" help:"Print a pcap or pcapng of RoCEv2 traffic one packet a line, as the tests decode it (opcode, QPN, PSN, headers, CM MADs, ICRC)."`
	Pingpong pingCmd   `cmd:"" name:"rc-pingpong" help:"SEND/RECV ping-pong compatible with ibv_rc_pingpong (its TCP exchange, byte for byte)."`
	UCPing   pingCmd   `cmd:"" name:"uc-pingpong" help:"SEND/RECV ping-pong on a UC QP, compatible with ibv_uc_pingpong."`
	UDPing   udPingCmd `cmd:"" name:"ud-pingpong" help:"SEND/RECV ping-pong of UD datagrams, compatible with ibv_ud_pingpong."`
	RPing    rpingCmd  `cmd:"" name:"rping" help:"RDMA READ/WRITE ping-pong connected with the RDMA CM, compatible with librdmacm's rping."`
	Bench    expCmd    `cmd:"" help:"Experiments: bench scopes (remaps at each suspension scope and pause policy, against runs without remaps)."`
}

// toolCmd holds the flags of the perftest-style tools. Names are
// perftest's (underscores included), with dashed aliases.
type toolCmd struct {
	Server string `arg:"" optional:"" help:"The server's host name or IP. Without it, run as the server and wait for one client."`

	Size        msgSize  `short:"s" help:"Message size in bytes (K, M suffixes: KiB, MiB). Default: 65536 (BW), 2 (lat), 8 (atomic)."`
	Iters       iters    `short:"n" help:"Iterations per QP: 5 to 100000000. Default: 5000 (BW), 1000 (lat)."`
	Duration    seconds  `short:"D" help:"Run for this many seconds (2, 0.5) or a Go duration (500ms) instead of -n: 100ms to 24h (shorter may complete nothing)."`
	All         bool     `short:"a" help:"Run sizes 2 to 2^23 bytes."`
	MTU         mtuFlag  `short:"m" name:"mtu" placeholder:"MTU" help:"Path MTU: 256, 512, 1024, 2048 or 4096, at most the port's active MTU (larger: the active MTU, with a notice). Default: the port's active MTU, the link's MTU less the RoCEv2 headers (1500: 1024; 9000: 4096). The two sides use the smaller of theirs."`
	TxDepth     count    `short:"t" name:"tx-depth" help:"Outstanding send WRs per QP. Default: 128 (BW), 1 (lat)."`
	RxDepth     count    `short:"r" name:"rx-depth" help:"Receives posted per QP (SEND tests). Default: 512."`
	CQMod       count    `short:"Q" name:"cq-mod" help:"Request a completion every this many sends (BW). Default: 100."`
	QPs         count    `short:"q" name:"qp" help:"Number of QPs. Default: 1."`
	Port        int      `short:"p" name:"port" default:"18515" help:"TCP port of the exchange with the peer (with -R: the rdma_cm port)."`
	RDMACM      bool     `short:"R" name:"rdma_cm" aliases:"rdma-cm" help:"Connect with the RDMA CM, as perftest's -R: the exchange over an RC connection to the server's rdma_cm port -p, the QPs connected by the CM."`
	RoCEPort    *int     `name:"roce-port" placeholder:"PORT" help:"Client with -R: the UDP port of the server's RoCEv2 device, where the CM sends its MADs (default 4791)."`
	QPTimeout   count    `short:"u" name:"qp-timeout" default:"14" help:"QP timeout exponent (1-31): retransmit after 4.096 µs × 2^N without an ACK (perftest -u)."`
	Inline      int      `short:"I" name:"inline_size" aliases:"inline-size" default:"-1" placeholder:"BYTES" help:"Max inline data in bytes. Default: 220 (write-lat), 236 (send-lat), else 0."`
	Atomic      string   `short:"A" name:"atomic_type" aliases:"atomic-type" enum:"FETCH_AND_ADD,CMP_AND_SWAP" default:"FETCH_AND_ADD" help:"atomic-bw: FETCH_AND_ADD or CMP_AND_SWAP."`
	ReportGbits bool     `name:"report_gbits" aliases:"report-gbits" help:"Report BW in Gb/sec instead of MB/sec."`
	JSON        bool     `name:"json" help:"Print the results as JSON."`
	Verify      bool     `help:"Check every byte that arrives against a pattern (client's flag; the server follows)."`
	File        string   `type:"existingfile" placeholder:"PATH" help:"Move this file's bytes: on the client for write-bw and send-bw, on the server for read-bw."`
	Out         string   `placeholder:"PATH" help:"Write the received --file bytes here (the receiving side)."`
	Pcap        string   `placeholder:"FILE" help:"Record every datagram sent and received in a pcap file."`
	Impair      string   `placeholder:"SPEC" help:"Impair the traffic, e.g. loss=0.01,reorder=0.01,dup=0.005,corrupt=0.001,seed=7."`
	Bind        string   `placeholder:"IP[:PORT]" help:"RoCEv2 address of this side's device. Default: the IP that reaches the peer; UDP port 4791 on the server, any on the client."`
	SourcePort  sport    `name:"sport" placeholder:"spread|bind|PORT" help:"${sport_help}"`
	ODP         bool     `short:"o" name:"odp" help:"Register this side's buffer on demand (IBV_ACCESS_ON_DEMAND) on memory of the device's address space instead of pinning it (perftest --odp)."`
	IODP        bool     `short:"O" name:"iodp" help:"Reach this side's buffer through an implicit ODP MR over the whole address space (ibv_rc_pingpong -O); implies --odp."`
	Prefetch    bool     `short:"P" name:"prefetch" help:"Make the ODP buffer present before the run: ibv_advise_mr PREFETCH_WRITE with FLUSH (ibv_rc_pingpong -P). Needs --odp or --iodp."`
	ODPBudget   byteSize `name:"odp-budget" placeholder:"BYTES" help:"Most bytes this device's ODP MRs hold present at once; over it the least recently used pages are evicted (default: unlimited)."`
	FaultPolicy string   `name:"fault-policy" placeholder:"sync|rnr" help:"How this side, as responder, meets a page fault on its ODP buffer: sync (resolve inline, as rxe; the default) or rnr (RNR NAK and fault in the background, as mlx5)."`
	Seed        uint64   `hidden:"" help:"Seed of the --verify pattern (default: random)."`

	// perftest interoperability (docs/interop.md).
	ConnectTimeout time.Duration `name:"connect-timeout" placeholder:"DURATION" help:"Client: keep retrying a refused connection for this long, and give up on a server that does not answer by then (default: one attempt, as perftest; an unanswered SYN then takes the kernel's 2 minutes). With -R: retry a REQ the server rejects (not listening yet), and give up when no CM reply came by then (default: the CM's 15 retries, 71s)."`
	IdleTimeout    time.Duration `name:"idle-timeout" default:"10s" placeholder:"DURATION" help:"With -n, fail when no completion arrives for this long (each one restarts it): the QPs retry for ever (retry_cnt 7, as rxe), so a dead peer or path would hang the run (0: wait for ever, as perftest). 100ms to 24h."`
	Stat           bool          `name:"stat" help:"Print the device's non-zero counters at the end (as rc-pingpong --stat)."`
	MaxMem         msgSize       `name:"max-mem" placeholder:"BYTES" help:"Most bytes of buffers this side allocates (-q × the region of -s); a server takes -s and -q from its client. Default: 4G."`
	Perftest       bool          `name:"perftest" help:"Speak perftest's exchange byte for byte even to a softrdma peer (a stock ib_write_bw, ib_read_bw, ... peer is detected without it); both sides then need the same -s, -n, -q, -A."`
}

// demoCmd holds the flags of `softrdma demo`.
type demoCmd struct {
	File    string        `type:"existingfile" placeholder:"PATH" help:"File to move (default: this program's binary)."`
	Size    msgSize       `short:"s" default:"65536" help:"Message size in bytes (K, M, G suffixes)."`
	Impair  string        `placeholder:"SPEC" help:"Impair both NICs' traffic, e.g. loss=0.01,reorder=0.01,seed=7."`
	Pcap    string        `placeholder:"FILE" help:"Record both NICs' datagrams in a pcap file, each once, as sent."`
	Timeout time.Duration `default:"2m" help:"Most time the whole demo (its three transfers together) may take: under heavy --impair loss the QPs retry for ever, as rxe's, and the transfer still running then fails, with those not started."`
}

// check refuses, as usage errors (perf.ErrUsage), the demo flags that
// demo.Run cannot tell from its defaults or would find bad only after the
// NICs are open: a typed --timeout of 0 or less (0 is demo.Options'
// default), and a --pcap that cannot be created (checked without touching
// an existing file, which the capture replaces when the run starts).
func (c *demoCmd) check() error {
	if c.Timeout <= 0 {
		return fmt.Errorf("--timeout %v: must be positive (%w)", c.Timeout, perf.ErrUsage)
	}
	if err := checkTimeout("--timeout", c.Timeout); err != nil {
		return fmt.Errorf("%w (%w)", err, perf.ErrUsage)
	}
	if err := checkPcap(c.Pcap); err != nil {
		return fmt.Errorf("%w (%w)", err, perf.ErrUsage)
	}
	return nil
}

// maxTimeout is the longest --timeout or --connect-timeout: a longer one
// is a typo (100000h) rather than a plan, as a -D over perf.MaxDuration.
const maxTimeout = 24 * time.Hour

// checkTimeout refuses a negative --timeout or --connect-timeout of flag
// (0 is the default) or one over maxTimeout: a bad command line.
func checkTimeout(flag string, d time.Duration) error {
	switch {
	case d < 0:
		return fmt.Errorf("%s %v: must not be negative", flag, d)
	case d > maxTimeout:
		return fmt.Errorf("%s %v: at most %v", flag, d, maxTimeout)
	}
	return nil
}

// minIdleTimeout is the shortest --idle-timeout other than 0: a shorter
// one cuts healthy runs (a completion can take longer than that on a busy
// host) and blames the peer, as -D's minimum does for durations.
const minIdleTimeout = pingpong.MinIdleTimeout // the same bound for every tool

// checkConnectTimeout is checkTimeout for --connect-timeout: 0 (one
// attempt) or at least minIdleTimeout. A shorter limit fails before the
// connection can complete, even to a server that is listening, and the
// message then blamed the server's host or a firewall ("no answer ...
// within --connect-timeout 1ns").
func checkConnectTimeout(d time.Duration) error {
	if d > 0 && d < minIdleTimeout {
		return fmt.Errorf("--connect-timeout %v: must be 0 (one attempt) or at least %v", d, minIdleTimeout)
	}
	return checkTimeout("--connect-timeout", d)
}

// checkIdleTimeout is checkTimeout for --idle-timeout: 0 (wait for ever)
// or at least minIdleTimeout.
func checkIdleTimeout(flag string, d time.Duration) error {
	if d > 0 && d < minIdleTimeout {
		return fmt.Errorf("%s %v: must be 0 (wait for ever) or at least %v", flag, d, minIdleTimeout)
	}
	return checkTimeout(flag, d)
}

// checkPcap refuses a --pcap that cannot be written (checkWritable), for
// every tool before it opens a device, waits for a peer or connects: a
// bad command line (exit 2). An empty path (no --pcap) passes.
func checkPcap(path string) error {
	if path == "" {
		return nil
	}
	if err := checkWritable(path); err != nil {
		return fmt.Errorf("--pcap: %w", err)
	}
	return nil
}

// options converts the flags of test into runner options.
func (c *toolCmd) options(test perf.Test) (*perf.Options, error) {
	if c.Inline < -1 {
		return nil, fmt.Errorf("--inline_size %d (-I): must be 0 to 1024", c.Inline)
	}
	if err := checkConnectTimeout(c.ConnectTimeout); err != nil {
		return nil, err
	}
	if err := checkIdleTimeout("--idle-timeout", c.IdleTimeout); err != nil {
		return nil, err
	}
	if c.Port < 1 || c.Port > 65535 {
		return nil, fmt.Errorf("-p %d: the port must be 1 to 65535", c.Port)
	}
	if c.Atomic != perf.FetchAndAdd && test != perf.AtomicBW {
		return nil, fmt.Errorf("%s: --atomic_type is for atomic-bw", test)
	}
	// Bad --impair and --bind values are command-line errors (exit 2),
	// found before anything is opened.
	if _, err := perf.ParseImpair(c.Impair); err != nil {
		return nil, err
	}
	if c.Bind != "" {
		if _, _, err := perf.ParseBind(c.Bind); err != nil {
			return nil, err
		}
	}
	// Output paths that cannot be created are command-line errors too,
	// found before the server waits for its client or the client connects
	// (checked without touching an existing file). --out belongs to the
	// receiving side (write-bw's and send-bw's server, read-bw's client);
	// on the other side it is refused later with its own message.
	for _, o := range []struct{ flag, path string }{{"--pcap", c.Pcap}, {"--out", c.Out}} {
		if o.path == "" {
			continue
		}
		if err := checkWritable(o.path); err != nil {
			return nil, fmt.Errorf("%s: %w", o.flag, err)
		}
	}
	switch {
	case c.Perftest && (c.File != "" || c.Out != ""):
		return nil, fmt.Errorf("--file and --out need a softrdma peer: --perftest's exchange cannot carry them")
	case c.RoCEPort != nil && !c.RDMACM:
		return nil, fmt.Errorf("--roce-port is the server's device's port for the RDMA CM: it needs -R")
	case c.RoCEPort != nil && c.Server == "":
		return nil, fmt.Errorf("--roce-port is the client's (where it reaches the server's device); the server's own is --bind")
	case c.RoCEPort != nil && (*c.RoCEPort < 1 || *c.RoCEPort > 65535):
		return nil, fmt.Errorf("--roce-port %d: not a UDP port (1 to 65535; default 4791)", *c.RoCEPort)
	case c.RDMACM && (c.Port < 0 || c.Port > 65535):
		return nil, fmt.Errorf("-p %d: not an rdma_cm port", c.Port)
	}
	p := perf.Params{
		Size: int64(c.Size), Iters: int64(c.Iters), Duration: time.Duration(c.Duration), All: c.All, MTU: int(c.MTU),
		TxDepth: int(c.TxDepth), RxDepth: int(c.RxDepth), CQMod: int(c.CQMod), QPs: int(c.QPs), Inline: c.Inline,
		Atomic: c.Atomic, Verify: c.Verify, Seed: c.Seed, QPTimeout: int(c.QPTimeout),
	}
	if !c.Perftest { // --perftest: checked after connecting, by perftest's rules
		// Check the parameters before connecting: the client's, which
		// the run uses, and the server's own, which its client's replace
		// (a server's -m 100 is still a mistake worth saying).
		q := p
		q.Defaults(test)
		if c.File != "" {
			// The file's size is known only once it is opened; any
			// size ≥ 0 makes Validate apply --file's rules (-q 1, no
			// -a) now, before the server waits or the client connects.
			q.FileSize = 0
		}
		if err := q.Validate(test); err != nil {
			return nil, err
		}
	}
	odp := perf.ODPOptions{Explicit: c.ODP && !c.IODP, Implicit: c.IODP, Prefetch: c.Prefetch,
		Budget: int64(c.ODPBudget), FaultPolicy: c.FaultPolicy}
	if err := odp.Validate(); err != nil {
		return nil, err
	}
	return &perf.Options{
		Test: test, Params: p, Server: c.Server, Port: c.Port, Bind: c.Bind, File: c.File, Out: c.Out,
		Pcap: c.Pcap, Impair: c.Impair, SourcePort: int(c.SourcePort), JSON: c.JSON, ReportGbits: c.ReportGbits, ODP: odp,
		Perftest: c.Perftest, ConnectTimeout: c.ConnectTimeout, Stat: c.Stat, RDMACM: c.RDMACM, RoCEPort: portOr0(c.RoCEPort),
		MaxMem: int64(c.MaxMem), IdleTimeout: c.IdleTimeout,
	}, nil
}

// sport is --sport, the UDP source port of the packets a device sends
// (softrdma.Config.SourcePort): "spread" (the default) gives each
// QP the port Linux rxe would, "bind" the device's own port, a number
// that port.
type sport int

// sportHelp is the help of every tool's --sport.
const sportHelp = "UDP source port of the packets this side sends: spread (the default: each QP sends from the port Linux rxe would give it, 0xC000 plus a hash of the two QPNs), bind (the device's own port, the one it receives on), or a port number."

func (p *sport) UnmarshalText(text []byte) error {
	switch s := strings.TrimSpace(string(text)); s {
	case "spread", "rxe":
		*p = sport(softrdma.SourcePortSpread)
	case "bind":
		*p = sport(softrdma.SourcePortOwn)
	default:
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("--sport %q: want spread, bind or a UDP port (1-65535)", s)
		}
		*p = sport(n)
	}
	return nil
}

// byteSize is a size in bytes with an optional binary suffix: 4096, 64K,
// 64KiB, 1M, 1MiB, 1G.
type byteSize int64

func (b *byteSize) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"k", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 0, 64)
	if err == nil && n < 0 {
		return fmt.Errorf("%q: a size must not be negative", text)
	}
	if err != nil || n > (1<<62)/mult {
		return fmt.Errorf("%q is not a size in bytes", text)
	}
	*b = byteSize(n * mult)
	return nil
}

// msgSize is a message size (-s): a byteSize of at least 1 byte. Unset
// (0) stands for the tool's default; an explicit 0 is refused.
type msgSize byteSize

func (m *msgSize) UnmarshalText(text []byte) error {
	var b byteSize
	if strings.HasPrefix(strings.TrimSpace(string(text)), "-") {
		return fmt.Errorf("%q: the size must be at least 1 byte", text)
	}
	if err := b.UnmarshalText(text); err != nil {
		return err
	}
	if b == 0 {
		return fmt.Errorf("%q: the size must be at least 1 byte", text)
	}
	*m = msgSize(b)
	return nil
}

// count is a flag that counts something (-n, -t, -r, -Q, -q, -u): at
// least 1. Unset (0) stands for the tool's default; an explicit 0 or a
// negative number is refused, so that 0 never silently means the default.
type count int64

func (c *count) UnmarshalText(text []byte) error {
	n, err := strconv.ParseInt(strings.TrimSpace(string(text)), 0, 64)
	if err != nil || n < 1 {
		return fmt.Errorf("%q: must be a whole number, at least 1", text)
	}
	*c = count(n)
	return nil
}

// iters is -n: perftest's MinIters to MaxIters. Unset (0) stands for the
// tool's default; any value given outside the range, 0 included, is
// refused with the range, so that -n 0 and -n 4 read alike.
type iters int64

func (n *iters) UnmarshalText(text []byte) error {
	v, err := strconv.ParseInt(strings.TrimSpace(string(text)), 0, 64)
	if err != nil || v < perf.MinIters || v > perf.MaxIters {
		return fmt.Errorf("%q: must be %d to %d", text, perf.MinIters, perf.MaxIters)
	}
	*n = iters(v)
	return nil
}

// Decode implements kong.MapperValue.
func (n *iters) Decode(ctx *kong.DecodeContext) error { return decodeText(ctx, "count", n) }

// mtuFlag is -m of the perftest tools: unset (0) stands for the port's
// active MTU; a value given, 0 included, must be one of IBTA's five (the
// range check, with its message, is perf's).
type mtuFlag int

func (m *mtuFlag) UnmarshalText(text []byte) error {
	n, err := strconv.Atoi(strings.TrimSpace(string(text)))
	if err != nil || n < 1 {
		return fmt.Errorf("%q: must be 256, 512, 1024, 2048 or 4096", text)
	}
	*m = mtuFlag(n)
	return nil
}

// Decode implements kong.MapperValue.
func (m *mtuFlag) Decode(ctx *kong.DecodeContext) error { return decodeText(ctx, "MTU", m) }

// seconds is a duration given as a number of seconds (perftest's -D,
// whole there; a decimal such as 0.5 here too) or as a Go duration,
// longer than 0.
type seconds time.Duration

// decimalSeconds matches a plain number of seconds: digits with an
// optional decimal point (2, 0.5, .5, 3.), no sign, exponent or unit.
var decimalSeconds = regexp.MustCompile(`^([0-9]+\.?[0-9]*|\.[0-9]+)$`)

func (d *seconds) UnmarshalText(text []byte) error {
	s := string(text)
	unit := ""
	if decimalSeconds.MatchString(s) {
		unit = "s" // time.ParseDuration reads "0.5s" exactly
	}
	v, err := time.ParseDuration(s + unit)
	if err == nil && v < 0 || err != nil && negativeValue.MatchString(s) {
		return fmt.Errorf("%q: must not be negative: %v to %v", s, perf.MinDuration, perf.MaxDuration)
	}
	if err != nil {
		return fmt.Errorf("%q is not a number of seconds (such as 2 or 0.5) or a Go duration (such as 500ms)", s)
	}
	if v == 0 {
		return fmt.Errorf("%q: must be %v to %v", s, perf.MinDuration, perf.MaxDuration)
	}
	*d = seconds(v)
	return nil
}

// decodeText pops the flag's value, naming what it expects (what), and
// hands it to u: kong's own TextUnmarshaler path names every such value
// "value" ("expected value value but got ..." for -n -5).
func decodeText(ctx *kong.DecodeContext, what string, u interface{ UnmarshalText([]byte) error }) error {
	t, err := ctx.Scan.PopValue(what)
	if err != nil {
		return err
	}
	return u.UnmarshalText([]byte(fmt.Sprint(t.Value)))
}

// Decode implements kong.MapperValue.
func (b *byteSize) Decode(ctx *kong.DecodeContext) error { return decodeText(ctx, "size", b) }

// Decode implements kong.MapperValue.
func (m *msgSize) Decode(ctx *kong.DecodeContext) error { return decodeText(ctx, "size", m) }

// Decode implements kong.MapperValue.
func (c *count) Decode(ctx *kong.DecodeContext) error { return decodeText(ctx, "count", c) }

// Decode implements kong.MapperValue.
func (d *seconds) Decode(ctx *kong.DecodeContext) error { return decodeText(ctx, "duration", d) }

// portOr0 returns the port a --roce-port flag gave, or 0 (the default,
// 4791) when it was not given. The flag is a pointer so that an explicit
// --roce-port 0 is refused rather than taken for the default.
func portOr0(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
