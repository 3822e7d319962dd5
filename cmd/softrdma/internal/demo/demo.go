// Package demo is `softrdma demo`: two emulated hosts in one process, each
// with its own softrdma NIC on loopback, move a real file by RDMA WRITE,
// RDMA READ and SEND with the perftest-style tools, and check that every
// byte arrived.
package demo

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/perf"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
	"github.com/softrdma/softrdma/transport"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/pcaptap"
)

// Options configure the demo.
type Options struct {
	File   string // the file to move; default: this program's binary
	Size   int64  // message size; default 65536
	Impair string // conn.ParseImpairment syntax, applied to both NICs
	Pcap   string // record both NICs' datagrams here
	// Timeout bounds the whole demo, its three transfers together
	// (default 2 minutes): under heavy --impair loss a QP retries for
	// ever (retry_cnt 7, as rxe), and a newcomer must not wait three
	// times as long to see the first failure.
	Timeout time.Duration
	Stdout  io.Writer
	Logf    func(format string, args ...any)
}

// ErrFailed is returned when a transfer did not arrive intact or the
// --pcap capture could not be written; the output already says why.
var ErrFailed = errors.New("demo: a transfer failed")

// ErrInterrupted is returned when ctx was cancelled (Ctrl-C, SIGTERM)
// before the transfers were done; the output already says so, once.
var ErrInterrupted = errors.New("demo: interrupted")

// host addresses: two loopback IPs, so that the capture shows two hosts.
var hostIPs = [2]string{"127.0.0.1", "127.0.0.2"}

type op struct {
	test perf.Test
	name string
	how  string
}

var ops = []op{
	{perf.WriteBW, "RDMA WRITE", "A writes the file into B's memory (WRITE WITH IMM into a ring; B returns credits by SEND)"},
	{perf.ReadBW, "RDMA READ", "A reads the file out of B's memory (B announces ring slots by SEND)"},
	{perf.SendBW, "SEND", "A sends the file into receives B posted (B returns credits by SEND)"},
}

// Run runs the demo. It returns ErrFailed (wrapped) if any transfer did
// not arrive intact.
func Run(ctx context.Context, o Options) error {
	w := o.Stdout
	if w == nil {
		w = io.Discard
	}
	if o.Size == 0 {
		o.Size = perf.DefSizeBW
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.Timeout < 0 {
		return fmt.Errorf("--timeout %v: must be positive (%w)", o.Timeout, perf.ErrUsage)
	}
	if o.Size < 1 || o.Size > 1<<31 {
		return fmt.Errorf("-s %d: must be 1 to 2^31 bytes (%w)", o.Size, perf.ErrUsage)
	}
	if o.File == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("demo: find this program's binary: %w (use --file)", err)
		}
		o.File = exe
	} else if err := checkFile(o.File); err != nil {
		return err
	}
	size, sum, err := hashFile(o.File)
	if err != nil {
		return fmt.Errorf("demo: --file: %w", err)
	}
	imp, err := perf.ParseImpair(o.Impair)
	if err != nil {
		return fmt.Errorf("%w (%w)", err, perf.ErrUsage)
	}
	var tap *pcaptap.Writer
	if o.Pcap != "" {
		if tap, err = pcaptap.Create(o.Pcap); err != nil {
			return fmt.Errorf("demo: --pcap: %w", err)
		}
		defer tap.Close()
	}
	var devs [2]*softrdma.Device
	for i := range devs {
		if devs[i], err = openHost(hostIPs[i], imp, tap, o.Logf); err != nil {
			return err
		}
		defer devs[i].Close()
	}
	tmp, err := os.MkdirTemp("", "softrdma-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	fmt.Fprintf(w, "softrdma demo: two emulated RDMA NICs in this process, RoCEv2 over loopback UDP\n")
	fmt.Fprintf(w, " host A  %-22v client\n", devs[0].LocalAddr())
	fmt.Fprintf(w, " host B  %-22v server\n", devs[1].LocalAddr())
	fmt.Fprintf(w, " file    %s, %d bytes, SHA-256 %s\n", o.File, size, sum)
	if imp != nil {
		fmt.Fprintf(w, " impair  %s (both NICs)\n", o.Impair)
	}
	if o.Pcap != "" {
		fmt.Fprintf(w, " pcap    %s\n", o.Pcap)
	}
	if imp != nil {
		fmt.Fprintf(w, " timeout %v for the three transfers together (--timeout)\n", o.Timeout)
	}
	// One deadline for the whole demo: with --impair loss=1 the demo
	// fails after --timeout, not three times --timeout.
	tctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	failed, done := 0, 0
	for _, op := range ops {
		fmt.Fprintln(w, report.Line)
		fmt.Fprintf(w, " %s: %s\n", op.name, op.how)
		if tctx.Err() != nil && ctx.Err() == nil {
			failed++
			fmt.Fprintf(w, " FAILED: not started, the demo's --timeout %v had passed\n", o.Timeout)
			continue
		}
		fmt.Fprintln(w, report.BWHeader(report.MBps))
		out := filepath.Join(tmp, strings.ReplaceAll(op.test.String(), "-", "_")+".out")
		res, err := transfer(tctx, op.test, o.File, out, o.Size, devs, o.Logf)
		if ctx.Err() != nil {
			// Ctrl-C or SIGTERM: say so once, not as a network failure
			// of this transfer and of the ones after it.
			break
		}
		if err != nil && tctx.Err() != nil {
			err = fmt.Errorf("not done within the demo's %v (--timeout); with --impair loss a QP retries for ever, as rxe's retry_cnt 7", o.Timeout)
		}
		done++
		if res != nil && len(res.Report.BW) > 0 {
			r := res.Report.BW[0]
			fmt.Fprintf(w, " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n",
				r.Bytes, r.Iterations, r.BWPeak, r.BWAverage, r.MsgRate)
		}
		got, gotSum, herr := hashFile(out)
		receiver := "B"
		if op.test == perf.ReadBW {
			receiver = "A"
		}
		switch {
		case err != nil:
			failed++
			fmt.Fprintf(w, " FAILED: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		case herr != nil:
			failed++
			fmt.Fprintf(w, " FAILED: %v\n", herr)
		case gotSum != sum || got != size:
			failed++
			fmt.Fprintf(w, " FAILED: %s received %d bytes with SHA-256 %s\n", receiver, got, gotSum)
		default:
			fmt.Fprintf(w, " SHA-256 at %s   %s  ok\n", receiver, gotSum)
		}
	}
	fmt.Fprintln(w, report.Line)
	printCounters(w, devs)
	fmt.Fprintln(w, report.Line)
	if ctx.Err() != nil {
		fmt.Fprintf(w, " INTERRUPTED after %d of %d transfers\n", done, len(ops))
		return ErrInterrupted
	}
	var pcapErr error
	if tap != nil {
		// The tap's write errors are sticky and silent per packet: a
		// capture that could not be written (a full disk, /dev/full)
		// fails the demo here rather than leaving a truncated file
		// behind a PASS.
		if pcapErr = tap.Close(); pcapErr != nil {
			fmt.Fprintf(w, " FAILED: --pcap %s: %v (the capture holds at most the first %d frames)\n", o.Pcap, pcapErr, tap.Count())
		}
	}
	switch {
	case failed > 0:
		fmt.Fprintf(w, " FAIL: %d of %d transfers did not arrive intact\n", failed, len(ops))
		return fmt.Errorf("%w: %d of %d", ErrFailed, failed, len(ops))
	case pcapErr != nil:
		fmt.Fprintf(w, " FAIL: %d of %d transfers arrived intact, but the capture could not be written\n", len(ops), len(ops))
		return fmt.Errorf("%w: --pcap: %w", ErrFailed, pcapErr)
	}
	fmt.Fprintf(w, " PASS: %d of %d transfers arrived intact\n", len(ops), len(ops))
	return nil
}

// openHost opens one emulated NIC on ip, port 4791 if it is free (so that
// Wireshark decodes the capture as RoCEv2) or else any port. 127.0.0.2
// falls back to 127.0.0.1 where the loopback has only that address.
func openHost(ip string, imp *conn.Impairment, tap *pcaptap.Writer, logf func(string, ...any)) (*softrdma.Device, error) {
	cfg := softrdma.Config{Impair: imp, Logf: logf}
	if tap != nil {
		cfg.Tap = sentOnly{tap}
	}
	var err error
	for _, a := range []string{ip + ":4791", ip + ":0", hostIPs[0] + ":0"} {
		cfg.Addr = netip.MustParseAddrPort(a)
		var dev *softrdma.Device
		if dev, err = softrdma.Open(cfg); err == nil {
			return dev, nil
		}
	}
	return nil, fmt.Errorf("demo: open NIC on %s: %w", ip, err)
}

// sentOnly is the demo's tap: both NICs share one capture, and every
// datagram one sends the other receives, so a tap of both directions
// recorded each one twice (a newcomer's Wireshark showed every packet
// duplicated). The sent side is the wire's view: after tx impairment,
// before rx impairment.
type sentOnly struct{ conn.Tap }

func (t sentOnly) Packet(dir conn.Direction, src, dst netip.AddrPort, ipID uint16, roce []byte) {
	if dir == conn.DirTx {
		t.Tap.Packet(dir, src, dst, ipID, roce)
	}
}

// transfer moves file with test: host B serves, host A is the client. The
// receiving side writes the bytes to out. It returns the client's result.
func transfer(ctx context.Context, test perf.Test, file, out string, size int64, devs [2]*softrdma.Device,
	logf func(string, ...any)) (*perf.Result, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &perf.Options{Test: test, Listener: ln, Device: devs[1], Logf: logf}
	cli := &perf.Options{Test: test, Server: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port, Device: devs[0],
		Params: perf.Params{Size: size}, Logf: logf}
	if test == perf.ReadBW {
		srv.File, cli.Out = file, out
	} else {
		cli.File, srv.Out = file, out
	}
	var wg sync.WaitGroup
	var serr error
	wg.Go(func() { _, serr = perf.Run(ctx, srv) })
	res, cerr := perf.Run(ctx, cli)
	if cerr != nil {
		ln.Close() // the server may still wait for a connection
	}
	wg.Wait()
	return res, errors.Join(cerr, serr)
}

// checkFile refuses, as a usage error, a --file the demo cannot move: one
// that is not a regular file (a device or a pipe has no size to register
// and send, and opening a FIFO blocks until a writer comes), one that is
// empty (the tools would post no WRITE, READ or SEND, and each transfer
// would "arrive intact" having moved nothing), one of the kernel's procfs
// or sysfs (its size is not its content), or one that cannot be read.
func checkFile(path string) error {
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return fmt.Errorf("--file: %w (%w)", err, perf.ErrUsage)
	case !st.Mode().IsRegular():
		return fmt.Errorf("--file %s: not a regular file (%w)", path, perf.ErrUsage)
	case perf.KernelFS(path) != "":
		return fmt.Errorf("--file %s: a file of the kernel's %s, whose size (%d bytes) is not its content; copy it to a regular file first (%w)",
			path, perf.KernelFS(path), st.Size(), perf.ErrUsage)
	case st.Size() == 0:
		return fmt.Errorf("--file %s: empty, the demo needs bytes to move (%w)", path, perf.ErrUsage)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--file: %w (%w)", err, perf.ErrUsage)
	}
	return f.Close()
}

func hashFile(path string) (int64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return 0, "", err
	} else if !st.Mode().IsRegular() {
		// A device or a pipe has no size to register and send.
		return 0, "", fmt.Errorf("%s: not a regular file", path)
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return 0, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// legend explains the counters an ibverbs user misreads, each entry
// printed when one of its counters is not zero (docs/cli.md, "demo"). The
// meanings are Linux rxe's (rxe_hw_counters.c, and where rxe_comp.c,
// rxe_resp.c count them) and transport.Counters' for softrdma's own.
var legend = []struct {
	names []string
	text  string
}{
	{[]string{"rdma_sends", "rdma_recvs"},
		"rdma_sends/rdma_recvs: RDMA WRITE and READ requests sent/executed, as rxe counts them (SENDs are not counted; the WRITE stream ends with one zero-length WRITE WITH IMM more)"},
	{[]string{"send_rnr_err", "rcvd_rnr_err", "drop_rnr"},
		"send_rnr_err/rcvd_rnr_err: RNR NAKs sent by a responder/received by a requester (drop_rnr: the requests they answered), a SEND\n" +
			"   that came before its receive was posted (the tools post theirs as a stream starts); the sender retries after the\n" +
			"   RNR timer: a few on a clean run are a race, not loss"},
	{[]string{"rcvd_seq_err"},
		"rcvd_seq_err: PSN sequence error NAKs received: the responder saw a gap (a request packet lost or reordered), and\n" +
			"   the requester goes back to the NAKed PSN"},
	{[]string{"naks_sent"},
		"naks_sent: NAKs of every kind sent by a responder: PSN sequence error, RNR and the others (not an rxe counter)"},
	{[]string{"completer_retry_err", "retransmit_timeouts"},
		"completer_retry_err: go-back-N retries started, after a PSN sequence error NAK or the retransmit timer, as rxe's\n" +
			"   completer counts them; retransmit_timeouts: those the timer started (-u; not an rxe counter)"},
	{[]string{"retransmits"},
		"retransmits: request packets sent again, by those retries or after an RNR NAK (not an rxe counter)"},
	{[]string{"duplicate_request"},
		"duplicate_request: requests received again (a retransmission of one already done): answered again, not executed twice"},
	{[]string{"out_of_seq_request", "drop_psn_out_of_window"},
		"out_of_seq_request/drop_psn_out_of_window: requests past a gap in the PSNs, dropped (the gap NAKed once) until\n" +
			"   the missing one is sent again"},
	{[]string{"drop_duplicate_response"},
		"drop_duplicate_response: ACKs or responses for PSNs already acknowledged (a retransmission's); harmless"},
	{[]string{"impair_tx_dropped", "impair_rx_dropped", "impair_reordered", "impair_duplicated", "impair_corrupted", "impair_delayed", "impair_discarded"},
		"impair_*: datagrams --impair dropped (on send: tx, on receive: rx), reordered, duplicated, corrupted or delayed;\n" +
			"   impair_discarded: those still delayed or held back for reordering when the NIC closed, never delivered"},
	{[]string{"drop_unknown_qpn"},
		"drop_unknown_qpn: a packet for a QP already destroyed (late at the end of a transfer: under --impair, a\n" +
			"   retransmission or duplicate); harmless"},
}

// printCounters prints the hw_counters that are not zero on either NIC,
// then the legend of those that need one.
func printCounters(w io.Writer, devs [2]*softrdma.Device) {
	writeCounters(w, devs[0].Snapshot(), devs[1].Snapshot())
}

// writeCounters is printCounters for the two NICs' snapshots a and b (the
// same counters in the same order, as Device.Snapshot returns them).
func writeCounters(w io.Writer, a, b []transport.Counter) {
	fmt.Fprintf(w, " %-28s %14s %14s\n", "hw_counters (non-zero)", "host A", "host B")
	shown := map[string]bool{}
	for i := range a {
		if a[i].Value != 0 || b[i].Value != 0 {
			fmt.Fprintf(w, " %-28s %14d %14d\n", a[i].Name, a[i].Value, b[i].Value)
			shown[a[i].Name] = true
		}
	}
	for _, l := range legend {
		if slices.ContainsFunc(l.names, func(n string) bool { return shown[n] }) {
			fmt.Fprintf(w, " %s\n", l.text)
		}
	}
}
