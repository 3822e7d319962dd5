package interop

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Test-bed addresses (../shared/rxe-testbed/env.sh): the host side of the
// bridge and VM 0.
const (
	hostIP = "192.168.77.1"
	vmIP   = "192.168.77.10"
	netns  = "rxetb"
	bridge = "rxebr0"
)

// Timeouts, generous: the VM runs under TCG (no KVM) and may share two
// cores with the rest of `go test ./...`.
const (
	bootTimeout = 4 * time.Minute // qemu start to RXETB-READY (8-18 s idle, 90 s seen on a loaded host)
	stepTimeout = 2 * time.Minute // one step, both sides
)

// testbed is the rxe test bed as the tests drive it.
type testbed struct {
	dir   string // the scripts (vm.sh, net.sh, roce_pcap.py)
	cache string // RXETB_CACHE: the built kernel and initramfs, run logs
	bin   string // the softrdma binary under test
	out   string // this test's artifacts: console log, pcap
}

// openTestbed returns the test bed, or skips the test (fails it with
// RXETB_INTEROP=1) if it cannot run here.
func openTestbed(t *testing.T) *testbed {
	t.Helper()
	mode := os.Getenv("RXETB_INTEROP")
	if mode == "0" {
		t.Skip("RXETB_INTEROP=0: interop with rxe skipped")
	}
	unavailable := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...) + "; see docs/interop.md"
		if mode == "1" {
			t.Fatal("RXETB_INTEROP=1 but " + msg)
		}
		t.Skip("rxe test bed not available: " + msg + " (RXETB_INTEROP=1 makes this an error)")
	}
	if reason := os.Getenv("RXETB_UNAVAILABLE"); reason != "" { // set by .ci/run
		unavailable("%s", reason)
	}
	if testing.Short() && mode != "1" {
		t.Skip("boots a qemu VM (~20-40 s); skipped with -short")
	}
	if os.Geteuid() != 0 {
		unavailable("needs root (network namespace, taps, qemu)")
	}
	for _, p := range []string{"qemu-system-x86_64", "ip", "tcpdump", "python3"} {
		if _, err := exec.LookPath(p); err != nil {
			unavailable("%s is not installed (the test bed's build.sh installs qemu and tcpdump)", p)
		}
	}
	dir := os.Getenv("RXETB_DIR")
	if dir == "" {
		dir = "../../shared/rxe-testbed" // from interop/ in the project: ../shared/rxe-testbed
	}
	dir, err := filepath.Abs(dir)
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(dir, "vm.sh")); err != nil {
		unavailable("no test bed scripts in %s (set RXETB_DIR)", dir)
	}
	cache := os.Getenv("RXETB_CACHE")
	if cache == "" {
		cache = "/var/cache/rxe-testbed"
	}
	// vm.sh boots out-$RXETB_SUITE if set, else the last build (out).
	out := "out"
	if suite := os.Getenv("RXETB_SUITE"); suite != "" {
		out += "-" + suite
	}
	if _, err := os.Stat(filepath.Join(cache, out, "kver")); err != nil {
		build := filepath.Join(dir, "build.sh")
		if suite := os.Getenv("RXETB_SUITE"); suite != "" {
			build = "RXETB_SUITE=" + suite + " " + build
		}
		unavailable("the test bed is not built (%s/%s/kver missing): run %s as root", cache, out, build)
	}
	tb := &testbed{dir: dir, cache: cache, out: t.TempDir()}
	lockTestbed(t, cache)
	tb.bin = buildSoftrdma(t, tb.out)
	t.Cleanup(func() {
		if t.Failed() {
			keep, err := os.MkdirTemp("", "softrdma-interop-")
			if err == nil && exec.Command("cp", "-r", tb.out+"/.", keep).Run() == nil {
				t.Logf("artifacts (console log, pcap) kept in %s", keep)
			}
		}
	})
	return tb
}

// lockTestbed serializes users of the test bed's bridge, host address and
// VM index 0 (another test process, a captures.sh run that takes the lock).
func lockTestbed(t *testing.T, cache string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(cache, "interop.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	require.NoError(t, err)
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		t.Logf("waiting for the test bed (%s held by another run)", f.Name())
		require.NoError(t, unix.Flock(int(f.Fd()), unix.LOCK_EX))
	}
	t.Cleanup(func() { f.Close() })
}

// buildSoftrdma builds cmd/softrdma (with -race if this test runs with it).
// It first stats every Go source of the module: go test caches a result
// under the files the test opened or stat'ed, and the binary is built from
// packages this test does not import, so without that a change to the
// tool would be answered from the cache.
func buildSoftrdma(t *testing.T, dir string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != root {
			return filepath.SkipDir
		}
		if n := d.Name(); !d.IsDir() && (strings.HasSuffix(n, ".go") || n == "go.mod" || n == "go.sum") {
			_, err = os.Stat(path)
		}
		return err
	}))
	bin := filepath.Join(dir, "softrdma")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, "github.com/softrdma/softrdma/cmd/softrdma")...).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// step is one run of a stock tool in the VM against softrdma on the host.
// The VM's command and the host's start together; whichever is the client
// retries until the server listens (rxetb-retry in the VM,
// --connect-timeout on the host).
type step struct {
	name string
	vm   string   // shell command in the VM
	host []string // softrdma's arguments, run in the test bed's netns
}

// stepResult is what one step produced.
type stepResult struct {
	name     string
	vmRC     int               // the VM command's exit status
	vmOut    string            // its output
	hostErr  error             // the host command's error (nil: exit 0)
	hostOut  string            // its stdout and stderr
	hostStat map[string]uint64 // softrdma's non-zero counters (--stat)
	hwc      map[string]uint64 // rxe hw_counters, change over the step
	dur      time.Duration     // first start to last exit
}

// session is one VM boot and its steps.
type session struct {
	boot     time.Duration // qemu start to RXETB-READY
	total    time.Duration // qemu start to exit
	steps    []stepResult
	pcap     string // everything on the bridge
	versions string // the VM's kernel and packages
}

// Console markers. The test bed's init prints RXETB-READY and RXETB-EXIT;
// the script run prints the others. They are not anchored at the start of
// a line: the console may put a marker after other output on the same line
// ("Booting from ROM..RXETB-READY", a kernel message).
var (
	reReady    = regexp.MustCompile(`RXETB-READY`)
	reVersions = regexp.MustCompile(`RXETB-VERSIONS (.*)$`)
	reBegin    = regexp.MustCompile(`RXETB-STEP-BEGIN (\S+)`)
	reEnd      = regexp.MustCompile(`RXETB-STEP-END (\S+) rc=(\d+)`)
	reHWC      = regexp.MustCompile(`RXETB-HWC (\S+)((?: \S+=\d+)*)$`)
	reExit     = regexp.MustCompile(`RXETB-EXIT rc=(\d+)`)
	reANSI     = regexp.MustCompile(`\x1b(\[[0-9;?]*[a-zA-Z]|c)`)
)

// vmScript is the VM's command: a hw_counters snapshot, then per step its
// markers, the command and another snapshot.
func vmScript(steps []step) string {
	var b strings.Builder
	b.WriteString(`hwc() { echo "RXETB-HWC $1$(for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do printf ' %s=%s' "${f##*/}" "$(cat "$f")"; done)"; }` + "\n")
	b.WriteString(`echo "RXETB-VERSIONS kernel $(uname -r); $(tr '\n' ';' < /etc/rxetb-versions)"` + "\n")
	b.WriteString("hwc _boot\n")
	for _, s := range steps {
		fmt.Fprintf(&b, "echo RXETB-STEP-BEGIN %s\n", s.name)
		fmt.Fprintf(&b, "timeout %d %s 2>&1; rc=$?\n", int(stepTimeout.Seconds()), s.vm)
		fmt.Fprintf(&b, "echo RXETB-STEP-END %s rc=$rc\n", s.name)
		fmt.Fprintf(&b, "hwc %s\n", s.name)
	}
	return b.String()
}

// run boots VM 0, runs the steps in order with their host sides and
// captures the bridge. It returns an error only if the session could not
// be run; the steps' outcomes are in the result.
func (tb *testbed) run(t *testing.T, steps []step) *session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout+time.Duration(len(steps))*stepTimeout)
	defer cancel()
	for _, args := range [][]string{{"up"}, {"tap", "0"}} {
		out, err := exec.Command(filepath.Join(tb.dir, "net.sh"), args...).CombinedOutput()
		require.NoError(t, err, "net.sh %v: %s", args, out)
	}
	s := &session{pcap: filepath.Join(tb.out, "bridge.pcap")}
	stopDump := tb.tcpdump(t, s.pcap)

	logf, err := os.Create(filepath.Join(tb.out, "vm0.console.log"))
	require.NoError(t, err)
	defer logf.Close()
	vm := exec.Command(filepath.Join(tb.dir, "vm.sh"), "-i", "0", "--no-ipv6",
		"--timeout", strconv.Itoa(int((bootTimeout + time.Duration(len(steps))*stepTimeout).Seconds())), vmScript(steps))
	stdout, err := vm.StdoutPipe()
	require.NoError(t, err)
	vm.Stderr = logf
	t0 := time.Now()
	vmProc, err := start(t, vm)
	require.NoError(t, err)
	con := newConsole(stdout, logf)

	if _, err := con.expect(ctx, bootTimeout, reReady); err != nil {
		t.Fatalf("VM did not boot: %v (console: %s)", err, logf.Name())
	}
	s.boot = time.Since(t0)
	l, err := con.expect(ctx, stepTimeout, reVersions)
	if err != nil {
		t.Fatalf("no versions line from the VM: %v", err)
	}
	s.versions = reVersions.FindStringSubmatch(l)[1]
	l, err = con.expect(ctx, stepTimeout, reHWC)
	if err != nil {
		t.Fatalf("no hw_counters from the VM: %v", err)
	}
	prev := parseHWC(l)

	for _, st := range steps {
		r := stepResult{name: st.name, hwc: map[string]uint64{}}
		ts := time.Now()
		host := tb.startHost(t, st.host)
		l, err = con.expect(ctx, stepTimeout, reEnd)
		if err != nil {
			t.Fatalf("step %s: no end marker from the VM: %v (console: %s)", st.name, err, logf.Name())
		}
		m := reEnd.FindStringSubmatch(l)
		r.vmRC, _ = strconv.Atoi(m[2])
		r.vmOut = con.between(st.name)
		r.hostOut, r.hostErr = host.wait(stepTimeout)
		r.dur = time.Since(ts)
		r.hostStat = parseStat(r.hostOut)
		l, err = con.expect(ctx, stepTimeout, reHWC)
		if err != nil {
			t.Fatalf("step %s: hw_counters: %v", st.name, err)
		}
		now := parseHWC(l)
		for k, v := range now {
			r.hwc[k] = v - prev[k]
		}
		prev = now
		s.steps = append(s.steps, r)
	}
	if l, err := con.expect(ctx, stepTimeout, reExit); err != nil || reExit.FindStringSubmatch(l)[1] != "0" {
		t.Errorf("VM script did not exit cleanly: %q %v", l, err)
	}
	if err := vmProc.wait(30 * time.Second); err != nil {
		t.Errorf("vm.sh: %v", err)
	}
	s.total = time.Since(t0)
	stopDump()
	return s
}

// tcpdump captures the bridge into path until the returned function is
// called.
func (tb *testbed) tcpdump(t *testing.T, path string) (stop func()) {
	t.Helper()
	errf, err := os.Create(path + ".stderr")
	require.NoError(t, err)
	cmd := exec.Command("ip", "netns", "exec", netns, "tcpdump", "-i", bridge, "-B", "131072",
		"--immediate-mode", "-U", "-s", "0", "-Z", "root", "-w", path, "udp port 4791 or tcp or arp")
	cmd.Stderr = errf
	p, err := start(t, cmd)
	require.NoError(t, err)
	for range 100 {
		if b, _ := os.ReadFile(errf.Name()); bytes.Contains(b, []byte("listening on")) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		time.Sleep(200 * time.Millisecond) // the last packets
		cmd.Process.Signal(os.Interrupt)
		p.wait(10 * time.Second)
		errf.Close()
	}
	t.Cleanup(stop)
	return stop
}

// hostRun is a softrdma process in the netns.
type hostRun struct {
	p   *proc
	out *bytes.Buffer // stdout and stderr; os/exec serializes the writes; read after exit
	err error         // the start error
}

func (tb *testbed) startHost(t *testing.T, args []string) *hostRun {
	cmd := exec.Command("ip", append([]string{"netns", "exec", netns, tb.bin}, args...)...)
	h := &hostRun{out: &bytes.Buffer{}}
	cmd.Stdout, cmd.Stderr = h.out, h.out
	h.p, h.err = start(t, cmd)
	return h
}

// wait waits up to timeout for the host command and returns its output
// and error; on timeout it kills it.
func (h *hostRun) wait(timeout time.Duration) (string, error) {
	if h.err != nil {
		return "", h.err
	}
	err := h.p.wait(timeout)
	return h.out.String(), err
}

// parseStat reads softrdma's --stat lines ("  name = value").
func parseStat(out string) map[string]uint64 {
	m := map[string]uint64{}
	in := false
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "softrdma counters") {
			in = true
			continue
		}
		if name, val, ok := strings.Cut(strings.TrimSpace(l), " = "); in && ok {
			if v, err := strconv.ParseUint(val, 10, 64); err == nil {
				m[name] = v
			}
		}
	}
	return m
}

// parseHWC reads a hw_counters snapshot line ("RXETB-HWC tag name=value ...").
func parseHWC(l string) map[string]uint64 {
	m := map[string]uint64{}
	for _, f := range strings.Fields(reHWC.FindStringSubmatch(l)[2]) {
		name, val, _ := strings.Cut(f, "=")
		v, _ := strconv.ParseUint(val, 10, 64)
		m[name] = v
	}
	return m
}

// console reads the VM's serial console line by line.
type console struct {
	lines chan string
	buf   []string // lines read but not yet consumed by expect
	seen  []string // every line, for between
}

func newConsole(r io.Reader, log io.Writer) *console {
	c := &console{lines: make(chan string, 4096)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := reANSI.ReplaceAllString(strings.TrimRight(sc.Text(), "\r"), "")
			fmt.Fprintln(log, l)
			c.lines <- l
		}
	}()
	return c
}

var errConsoleClosed = errors.New("VM console closed (qemu exited)")

// expect returns the next line matching re; lines before it are kept in
// seen.
func (c *console) expect(ctx context.Context, timeout time.Duration, re *regexp.Regexp) (string, error) {
	for i, l := range c.buf {
		if re.MatchString(l) {
			c.buf = append(c.buf[:i:i], c.buf[i+1:]...)
			return l, nil
		}
	}
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				return "", errConsoleClosed
			}
			c.seen = append(c.seen, l)
			if re.MatchString(l) {
				return l, nil
			}
			c.buf = append(c.buf, l)
		case <-tm.C:
			return "", fmt.Errorf("timed out after %v waiting for %v", timeout, re)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// between returns the lines the VM printed between a step's markers.
func (c *console) between(name string) string {
	var b strings.Builder
	in := false
	for _, l := range c.seen {
		switch {
		case reBegin.MatchString(l) && reBegin.FindStringSubmatch(l)[1] == name:
			in = true
		case reEnd.MatchString(l) && reEnd.FindStringSubmatch(l)[1] == name:
			return b.String()
		case in:
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// proc is a child process that leads its own process group, so that
// killing it also ends what it started (vm.sh -> timeout -> qemu).
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when Wait returned
	err  error         // Wait's result, set before done is closed
}

// start starts cmd in a new process group; t's cleanup kills the group if
// it is still running.
func start(t *testing.T, cmd *exec.Cmd) (*proc, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.kill() })
	return p, nil
}

// kill kills the process group unless the process was already reaped.
func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// wait waits up to timeout for the process, then kills it.
func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		p.kill()
		return fmt.Errorf("killed after %v", timeout)
	}
}

// icrcCheck runs the test bed's independent checker (roce_pcap.py) on a
// capture and returns the RoCEv2 packets whose ICRC matched and did not.
func (tb *testbed) icrcCheck(t *testing.T, pcap string) (ok, bad int) {
	t.Helper()
	out, err := exec.Command("python3", filepath.Join(tb.dir, "roce_pcap.py"), pcap).CombinedOutput()
	require.NoError(t, err, "roce_pcap.py: %s", out)
	m := regexp.MustCompile(`ICRC ok=(\d+) bad=(\d+)`).FindSubmatch(out)
	require.NotNil(t, m, "roce_pcap.py output: %s", out)
	ok, _ = strconv.Atoi(string(m[1]))
	bad, _ = strconv.Atoi(string(m[2]))
	t.Logf("roce_pcap.py %s:\n%s", filepath.Base(pcap), out)
	return ok, bad
}
