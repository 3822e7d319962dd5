package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/bench/scopes"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/perf"
)

// expCmd holds the experiments of `softrdma bench` (its name kept short
// so that the cli struct's columns stay aligned).
type expCmd struct {
	Scopes benchScopesCmd `cmd:"" help:"The scope experiment: N QPs stream RDMA WRITEs into M MRs in P PDs while MR 0 is remapped every T ms, at each suspension scope and pause policy; prints the critical section, the QPs paused, the bytes delayed and the throughput of the QPs that do not touch the remapped MR against runs without remaps (see docs/scopes.md)."`
}

// benchScopesCmd holds the flags of `softrdma bench scopes`
// (scopes.Config).
type benchScopesCmd struct {
	QPs         int           `short:"q" name:"qps" default:"8" help:"N: RC QPs, QP i writing MR i mod M."`
	MRs         int           `name:"mrs" default:"4" help:"M: MRs on the responder, MR j in PD j mod P; MR 0 is remapped."`
	PDs         int           `name:"pds" default:"2" help:"P: protection domains on the responder."`
	MRSize      byteSize      `name:"mr-size" default:"1M" help:"Bytes per MR (whole pages; K, M, G suffixes)."`
	Size        byteSize      `short:"s" name:"size" default:"16K" help:"Bytes per RDMA WRITE."`
	Window      int           `short:"t" name:"tx-depth" default:"8" help:"WRITEs outstanding per QP."`
	Duration    time.Duration `short:"D" name:"duration" default:"500ms" help:"Time each scope × policy runs with remaps; it runs as long again without, in interleaved slices."`
	Slice       time.Duration `name:"slice" default:"100ms" help:"Length of one slice with or without remaps (ABBA order; longer than --settle; one longer than -D is cut to -D)."`
	Settle      time.Duration `name:"settle" default:"10ms" help:"Traffic not counted at the start of each slice."`
	Period      time.Duration `short:"T" name:"period" default:"10ms" help:"T: a remap of MR 0 starts every T (at least 1ms: a remap call takes several hundred µs)."`
	Scope       []string      `name:"scope" default:"mr,qp-allowed,pd,device" help:"Scopes to run (mr, qp-allowed, pd, device), comma-separated."`
	Policy      []string      `name:"policy" default:"hold,nak" help:"Pause policies to run (hold, nak), comma-separated."`
	Profile     string        `name:"profile" default:"odp" enum:"odp,t3,coarse" help:"Responder's device profile: odp (finest scope mr), t3 (pd), coarse (device)."`
	MRKind      string        `name:"mr-kind" default:"pinned" enum:"pinned,odp" help:"Register the MRs pinned or on demand (ODP)."`
	NoAdvertise bool          `name:"no-advertise" help:"Do not declare MR 0's rkey advertised to its writers: qp-allowed then pauses MR 0's whole PD."`
	RNRTimer    uint8         `name:"rnr-timer" default:"12" help:"Encoded min_rnr_timer of the responder's QPs: the back-off after a pause's RNR NAK (12: 0.64 ms)."`
	Controls    bool          `name:"controls" help:"Add two control runs: suspend-only (suspend MR 0 at mr scope and resume, no memory moved) and migrate-only (migrate an unrelated range of the same size, nothing paused)."`
	Netns       bool          `name:"netns" help:"Put the two devices in two new network namespaces joined by a veth pair (needs root and iproute2)."`
	CSV         string        `name:"csv" placeholder:"FILE" help:"Also write the results as CSV to FILE."`
	JSON        bool          `name:"json" help:"Print the results as JSON instead of the table."`
	Plot        string        `name:"plot" placeholder:"FILE.svg" help:"Also plot the results into FILE (.svg, .png or .pdf)."`
	MaxMem      byteSize      `name:"max-mem" default:"4G" help:"Most bytes of MRs the responder registers (--mrs × --mr-size)."`
	HostProbe   time.Duration `name:"host-probe" default:"1s" help:"Before the rows, spin one thread on the clock this long and report how often the host stalled it and the delay it adds to W µs of work, W being each row's critical section p50: the floor under the p99 (0: no probe; else 10ms to 1m)."`
}

// config converts the flags.
func (c *benchScopesCmd) config() (scopes.Config, error) {
	cfg := scopes.Config{
		QPs: c.QPs, MRs: c.MRs, PDs: c.PDs, MRSize: int(c.MRSize), MsgSize: int(c.Size), Window: c.Window,
		Duration: c.Duration, Slice: min(c.Slice, c.Duration), Settle: c.Settle, Period: c.Period, Profile: softrdma.Profile(c.Profile),
		Kind: scopes.MRKind(c.MRKind), NoAdvertise: c.NoAdvertise, RNRTimer: c.RNRTimer, Controls: c.Controls,
		HostProbe: c.HostProbe,
	}
	if len(c.Scope) == 0 {
		return cfg, errors.New("--scope: no scope given")
	}
	if len(c.Policy) == 0 {
		return cfg, errors.New("--policy: no policy given")
	}
	for _, s := range c.Scope {
		sc, err := softrdma.ParseScope(s)
		if err != nil {
			return cfg, fmt.Errorf("--scope %q: mr, qp-allowed, pd or device", s)
		}
		if slices.Contains(cfg.Scopes, sc) { // it would run the row twice
			return cfg, fmt.Errorf("--scope %s: %s given twice", strings.Join(c.Scope, ","), s)
		}
		cfg.Scopes = append(cfg.Scopes, sc)
	}
	for _, s := range c.Policy {
		if s != "hold" && s != "nak" {
			return cfg, fmt.Errorf("--policy %q: hold or nak", s)
		}
		p, _ := softrdma.ParsePausePolicy(s)
		if slices.Contains(cfg.Policies, p) {
			return cfg, fmt.Errorf("--policy %s: %s given twice", strings.Join(c.Policy, ","), s)
		}
		cfg.Policies = append(cfg.Policies, p)
	}
	if c.Settle < 0 {
		return cfg, fmt.Errorf("--settle %v: must be 0 or more", c.Settle)
	}
	if c.Settle == 0 {
		cfg.Settle = time.Nanosecond // 0 means the default in scopes.Config
	}
	switch {
	case c.HostProbe < 0:
		return cfg, fmt.Errorf("--host-probe %v: must be 0 (no probe) or more", c.HostProbe)
	case c.HostProbe > scopes.MaxHostProbe:
		return cfg, fmt.Errorf("--host-probe %v: at most %v", c.HostProbe, scopes.MaxHostProbe)
	case c.HostProbe > 0 && c.HostProbe < scopes.MinHostProbe:
		// A probe shorter than a timer tick can see no stall at all and
		// print "0×/s" for a host that stalls thousands of times a second.
		return cfg, fmt.Errorf("--host-probe %v: must be 0 (no probe) or at least %v", c.HostProbe, scopes.MinHostProbe)
	case c.HostProbe == 0:
		cfg.HostProbe = -1 // 0 means the default in scopes.Config
	}
	if c.RNRTimer == 0 || c.RNRTimer > 31 {
		return cfg, fmt.Errorf("--rnr-timer %d: 1-31 (0, 655 ms, is not supported here)", c.RNRTimer)
	}
	if c.MRSize > 0 && int64(c.MRs) > int64(c.MaxMem)/int64(c.MRSize) {
		return cfg, fmt.Errorf("--mrs %d × --mr-size %d bytes: more than --max-mem %d", c.MRs, int64(c.MRSize), int64(c.MaxMem))
	}
	if c.QPs > scopes.MaxQPs {
		return cfg, fmt.Errorf("-q/--qps %d: at most %d", c.QPs, scopes.MaxQPs)
	}
	if c.Plot != "" && !slices.Contains([]string{".svg", ".png", ".pdf"}, strings.ToLower(filepath.Ext(c.Plot))) {
		return cfg, fmt.Errorf("--plot %s: the file name must end in .svg, .png or .pdf", c.Plot)
	}
	// The flags have explicit defaults, so a 0 here was typed: refuse it
	// rather than let scopes.Config take it for "default".
	for _, z := range []struct {
		name string
		zero bool
	}{
		{"-q/--qps", c.QPs == 0}, {"--mrs", c.MRs == 0}, {"--pds", c.PDs == 0}, {"--mr-size", c.MRSize == 0},
		{"-s/--size", c.Size == 0}, {"-t/--tx-depth", c.Window == 0},
	} {
		if z.zero {
			return cfg, fmt.Errorf("%s 0: must be positive", z.name)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"-D/--duration", c.Duration}, {"--slice", c.Slice}, {"-T/--period", c.Period}} {
		if d.v <= 0 {
			return cfg, fmt.Errorf("%s %v: must be positive", d.name, d.v)
		}
	}
	// Name the flag the user gave: a -D shorter than --slice is the
	// slice (config cuts the slice to -D), and scopes.Validate would
	// blame "slice 1ms".
	switch {
	case c.Duration <= c.Settle:
		return cfg, fmt.Errorf("-D/--duration %v: must be longer than --settle %v, which each slice of -D begins with and does not count", c.Duration, c.Settle)
	case c.Slice <= c.Settle:
		return cfg, fmt.Errorf("--slice %v: must be longer than the settle time (--settle %v), which is not counted", c.Slice, c.Settle)
	case c.Period < scopes.MinPeriod:
		return cfg, fmt.Errorf("-T/--period %v: at least %v (a remap call of a 1 MiB MR takes 400-800 µs; closer remaps would overlap)", c.Period, scopes.MinPeriod)
	}
	cfg = cfg.WithDefaults()
	return cfg, cfg.Validate()
}

// run runs the experiment and returns the exit code.
func (c *benchScopesCmd) run(ctx context.Context, stdout, stderr io.Writer) int {
	cfg, err := c.config()
	if err != nil {
		fmt.Fprintf(stderr, "softrdma: bench scopes: %s\n", errText(err))
		return exitUsage
	}
	// The output files' directories are checked before the run, so that
	// a path that cannot be written does not cost the run's results (an
	// existing file is left as it is until the results replace it).
	for _, f := range []struct{ flag, path string }{{"--csv", c.CSV}, {"--plot", c.Plot}} {
		if f.path == "" {
			continue
		}
		if err := checkWritable(f.path); err != nil {
			fmt.Fprintf(stderr, "softrdma: bench scopes: %s: %v\n", f.flag, err)
			return exitUsage
		}
	}
	cfg.Logf = func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) }
	if c.Netns {
		n, err := scopes.NewNetns()
		if err != nil {
			fmt.Fprintf(stderr, "softrdma: bench scopes: --netns: %v\n", err)
			return exitFail
		}
		defer func() {
			if err := n.Close(); err != nil {
				fmt.Fprintf(stderr, "softrdma: bench scopes: %s\n", errText(err))
			}
		}()
		cfg.Netns = n
		fmt.Fprintf(stderr, "softrdma: bench scopes: device A in netns %s (%v), B in %s (%v), over a veth pair\n",
			n.A, n.AddrA, n.B, n.AddrB)
	}
	rs, err := scopes.Run(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			// Ctrl-C or SIGTERM: "interrupted", as the other commands
			// say, not "mr/hold: context canceled".
			err = errors.New("interrupted")
		}
		fmt.Fprintf(stderr, "softrdma: bench scopes: %s\n", errText(err))
		return exitFail
	}
	if c.JSON {
		err = scopes.WriteJSON(stdout, rs)
	} else {
		err = scopes.WriteTable(stdout, cfg, rs)
	}
	if err != nil {
		fmt.Fprintf(stderr, "softrdma: bench scopes: %s\n", errText(err))
		return exitFail
	}
	if c.CSV != "" {
		if err := writeFile(c.CSV, func(w io.Writer) error { return scopes.WriteCSV(w, rs) }); err != nil {
			fmt.Fprintf(stderr, "softrdma: bench scopes: %s\n", errText(err))
			return exitFail
		}
	}
	if c.Plot != "" {
		title := fmt.Sprintf("softrdma scope experiment (%s): %d QPs, %d MRs, %d PDs, %s MRs of %s, remap every %v",
			cfg.Network(), cfg.QPs, cfg.MRs, cfg.PDs, cfg.Kind, fmt.Sprintf("%d KiB", cfg.MRSize>>10), cfg.Period)
		if err := scopes.Plot(c.Plot, rs, title); err != nil {
			fmt.Fprintf(stderr, "softrdma: bench scopes: %s\n", errText(err))
			return exitFail
		}
	}
	return exitOK
}

// checkWritable reports whether path can be created or replaced (as the
// output files are, by os.Create) without changing it, and if not, why,
// naming path: a directory or a file of the kernel's procfs or sysfs
// cannot; an existing file must open for writing and take a write of no
// bytes; a new one must be creatable in its directory (a scratch file is
// made there and removed).
func checkWritable(path string) error {
	st, err := os.Stat(path)
	switch {
	case err == nil && st.IsDir():
		return fmt.Errorf("%s is a directory", path)
	case err == nil:
		if kfs := perf.KernelFS(path); kfs != "" {
			return fmt.Errorf("%s is a file of the kernel's %s, not one that keeps what is written to it", path, kfs)
		}
		// O_NONBLOCK: a FIFO without a reader fails instead of blocking.
		f, err := os.OpenFile(path, os.O_WRONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("cannot write to %s: %w", path, pathErrno(err))
		}
		defer f.Close()
		if st.Mode().IsRegular() {
			if _, err := f.Write(nil); err != nil {
				return fmt.Errorf("cannot write to %s: %w", path, pathErrno(err))
			}
		}
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("cannot use %s: %w", path, pathErrno(err))
	}
	dir := filepath.Dir(path)
	if kfs := perf.KernelFS(dir); kfs != "" {
		return fmt.Errorf("cannot create %s: %s is in the kernel's %s, where no file can be created", path, dir, kfs)
	}
	f, err := os.CreateTemp(dir, ".softrdma-check-*")
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", path, pathErrno(err))
	}
	f.Close()
	return os.Remove(f.Name())
}

// pathErrno is the reason of a *fs.PathError without its operation and
// path, so that a message names the user's path (and not a scratch
// file's) once.
func pathErrno(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// writeFile creates path and writes it with f.
func writeFile(path string, f func(io.Writer) error) error {
	w, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := f(w); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}
