package perf

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// logRecorder collects what a side logs (its stderr) and passes it on to
// the test's log.
type logRecorder struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (l *logRecorder) logf(format string, args ...any) {
	l.t.Helper()
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
	l.mu.Unlock()
	l.t.Logf(format, args...)
}

func (l *logRecorder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// TestServerRefusalNamesNoTool: the CLI prints the tool's name before an
// error ("softrdma: read-bw: ..."), so the server's refusal of a client's
// parameters does not name it again.
func TestServerRefusalNamesNoTool(t *testing.T) {
	in, _ := writeTestFile(t, 10_000)
	r := runPair(t, ReadBW, Options{File: in}, Options{Params: Params{QPs: 2}})
	require.Error(t, r.srvErr)
	assert.EqualError(t, r.srvErr, "--file streams over one QP (-q 1); the client asked for -q 2")
	require.Error(t, r.cliErr)
	assert.Contains(t, r.cliErr.Error(), "peer: --file streams over one QP")
}

// TestFileRunSaysDurationAndItersAreIgnored: a --file run moves the whole
// file whatever -D and -n say (documented); the client says so on stderr,
// once, instead of ignoring them silently; without them it says nothing.
func TestFileRunSaysDurationAndItersAreIgnored(t *testing.T) {
	in, _ := writeTestFile(t, 20_000)
	for _, tc := range []struct {
		name string
		p    Params
		want string
	}{
		{"both", Params{Size: 4096, Iters: 7, Duration: 2 * time.Second},
			"softrdma: -D 2s and -n 7 ignored: a --file run moves the whole file, 5 messages of -s 4096 bytes"},
		{"iters", Params{Size: 4096, Iters: 7}, "softrdma: -n 7 ignored: a --file run moves the whole file, 5 messages of -s 4096 bytes"},
		{"neither", Params{Size: 4096}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &logRecorder{t: t}
			r := runPair(t, WriteBW, Options{}, Options{File: in, Params: tc.p, Logf: log.logf})
			requireOK(t, r)
			assert.Equal(t, int64(5), r.cli.Report.BW[0].Iterations, "the whole file moved")
			if tc.want == "" {
				assert.NotContains(t, log.String(), "ignored")
				return
			}
			assert.Equal(t, 1, strings.Count(log.String(), "ignored"), log.String())
			assert.Contains(t, log.String(), tc.want)
		})
	}
}

// TestPcapWriteFailureFailsTheRun: a --pcap capture that could not be
// written (/dev/full: no space left on device) fails a run that otherwise
// passed (exit 1 in the CLI), with the reason, instead of a line on
// stderr and exit 0.
func TestPcapWriteFailureFailsTheRun(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("needs /dev/full")
	}
	r := runPair(t, WriteBW, Options{Pcap: "/dev/full", JSON: true}, Options{Params: Params{Iters: 20}})
	require.NoError(t, r.cliErr)
	require.Error(t, r.srvErr)
	assert.Regexp(t, `^--pcap: .*/dev/full: no space left on device$`, r.srvErr.Error())
	assert.Equal(t, r.srvErr.Error(), r.srv.Report.Error, "the JSON says it too")
	assert.Contains(t, r.srvOut, `"error": "--pcap:`)
}

// TestOutWrittenOnlyOnSuccess: --out is written to a temporary file
// beside it and renamed over it when the run passed; a run that failed
// leaves an existing --out as it was, no temporary behind, and says that
// --out was not written.
func TestOutWrittenOnlyOnSuccess(t *testing.T) {
	in, sum := writeTestFile(t, 50_000)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.bin")
	require.NoError(t, os.WriteFile(out, []byte("the old file"), 0o600))

	testCorrupt = func(k int64, data []byte) {
		if k == 2 {
			data[7] ^= 0x40
		}
	}
	r := runPair(t, WriteBW, Options{Out: out}, Options{File: in, Params: Params{Size: 4096}})
	testCorrupt = nil
	require.ErrorIs(t, r.srvErr, ErrMismatch)
	assert.Contains(t, r.srvErr.Error(), "(--out "+out+" was not written)")
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, "the old file", string(got), "a failed run leaves --out as it was")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left: %v", entries)

	r = runPair(t, WriteBW, Options{Out: out}, Options{File: in, Params: Params{Size: 4096}})
	requireOK(t, r)
	assert.Equal(t, sum, sha256File(t, out))
	st, err := os.Stat(out)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the replaced file's mode is kept")
	entries, err = os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1)
}

// TestOutKeepsSymlinksAndDevices: --out through a symlink replaces the
// link's target and leaves the link; --out naming a device (a null device
// made for the test: the machine's /dev/null is what a failing run would
// replace) is written in place and stays a device. The rename of the
// temporary file had replaced both with a regular file.
func TestOutKeepsSymlinksAndDevices(t *testing.T) {
	in, sum := writeTestFile(t, 50_000)
	dir := t.TempDir()
	target, link := filepath.Join(dir, "target.bin"), filepath.Join(dir, "link.bin")
	require.NoError(t, os.WriteFile(target, []byte("old"), 0o600))
	require.NoError(t, os.Symlink("target.bin", link))
	r := runPair(t, WriteBW, Options{Out: link}, Options{File: in, Params: Params{Size: 4096}})
	requireOK(t, r)
	fi, err := os.Lstat(link)
	require.NoError(t, err)
	assert.NotZero(t, fi.Mode()&os.ModeSymlink, "--out's symlink was replaced: %v", fi.Mode())
	assert.Equal(t, sum, sha256File(t, target))

	if os.Geteuid() != 0 {
		t.Skip("mknod of a null device needs root")
	}
	null := filepath.Join(dir, "null")
	require.NoError(t, unix.Mknod(null, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	r = runPair(t, WriteBW, Options{Out: null}, Options{File: in, Params: Params{Size: 4096}})
	requireOK(t, r)
	fi, err = os.Lstat(null)
	require.NoError(t, err)
	assert.NotZero(t, fi.Mode()&os.ModeCharDevice, "--out's device was replaced: %v", fi.Mode())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 3, "no temporary file left: %v", entries)
}

// TestOutOverTheSameFile: a server's --out and a client's --file naming
// the same file on one host: the source is read whole (before, --out
// truncated it first and both sides said only "read file: EOF") and
// replaced by the same bytes.
func TestOutOverTheSameFile(t *testing.T) {
	in, sum := writeTestFile(t, 50_000)
	r := runPair(t, WriteBW, Options{Out: in}, Options{File: in, Params: Params{Size: 4096}})
	requireOK(t, r)
	assert.Equal(t, int64(50_000), r.srv.Report.File.Bytes)
	assert.Equal(t, sum, sha256File(t, in))
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// TestWriteBWServerPrintsTheClientsRow: the server of write-bw prints its
// client's numbers, as perftest's does, with --verify and --file too
// (where it has completions of its own, but no honest clock: a short run
// could arrive whole before it started timing, 51263 MB/sec for the
// client's 143).
func TestWriteBWServerPrintsTheClientsRow(t *testing.T) {
	in, _ := writeTestFile(t, 40_000)
	for _, tc := range []struct {
		name string
		cli  Options
	}{
		{"verify", Options{Params: Params{Size: 4096, Iters: 5, Verify: true}}},
		{"verify -a", Options{Params: Params{Iters: 5, Verify: true, All: true}}},
		{"file", Options{File: in, Params: Params{Size: 4096}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runPair(t, WriteBW, Options{}, tc.cli)
			requireOK(t, r)
			require.NotEmpty(t, r.cli.Report.BW)
			assert.Equal(t, r.cli.Report.BW, r.srv.Report.BW)
		})
	}
}

// TestPcapWithDurationWarns: --pcap with -D records every packet of a run
// that moves as much as it can (hundreds of MB a second over loopback): each
// side that records says so on its log (stderr), once, with the file and
// the duration; an -n run (its size known) does not.
func TestPcapWithDurationWarns(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var logs []string
	logf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		logs = append(logs, fmt.Sprintf(format, args...))
	}
	warned := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var w []string
		for _, l := range logs {
			if strings.Contains(l, "--pcap") {
				w = append(w, l)
			}
		}
		return w
	}
	srvPcap := filepath.Join(dir, "srv.pcap")
	r := runPair(t, WriteBW, Options{Pcap: srvPcap, Logf: logf},
		Options{Params: Params{Size: 4096, Duration: 200 * time.Millisecond}, Logf: func(string, ...any) {}})
	requireOK(t, r)
	assert.Equal(t, []string{"softrdma: warning: --pcap " + srvPcap + " records every packet of the -D 200ms run: " +
		"about its BW average × 200ms in bytes (hundreds of MB a second over loopback); -n bounds it"}, warned())

	logs = nil
	r = runPair(t, WriteBW, Options{Pcap: srvPcap, Logf: logf}, Options{Params: Params{Size: 4096, Iters: 20}})
	requireOK(t, r)
	assert.Empty(t, warned())
}
