package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/perf"
)

// TestRPingSizeZeroRefused: rping -S 0 is refused in rping's words
// ("Invalid size 0 (valid range is 26 to 65535)", rping.c's getopt loop),
// as -S 25 is; it silently ran with the default 64, rping.Options taking
// 0 for the default. (A short context bounds a server that would wait.)
func TestRPingSizeZeroRefused(t *testing.T) {
	for _, args := range [][]string{
		{"rping", "-s", "-a", "127.0.0.1", "--bind", "127.0.0.1:0", "-S", "0"},
		{"rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.1:0", "-S", "0", "-C", "1", "--timeout", "1s"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		var o, e bytes.Buffer
		code := run(ctx, args, &o, &e)
		cancel()
		assert.Equal(t, exitUsage, code, "%v: %s", args, e.String())
		assert.Equal(t, "softrdma: rping: Invalid size 0 (valid range is 26 to 65535)\n", e.String(), args)
	}
}

// waitsForFIFOWriter reports whether a thread of process pid is blocked
// opening a FIFO for a writer (its wchan is the kernel's
// wait_for_partner).
func waitsForFIFOWriter(pid int) bool {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/wchan", pid))
	for _, w := range tasks {
		if b, err := os.ReadFile(w); err == nil && strings.TrimSpace(string(b)) == "wait_for_partner" {
			return true
		}
	}
	return false
}

// TestSecondInterruptEndsProcess: the first Ctrl-C (SIGINT) cancels the
// command's context, and a second ends the process, whatever it waits
// for: a wait that no context ends (`dump FIFO` opening a FIFO that no
// writer opens, as the tools' --file did) ignored every Ctrl-C, and
// `timeout`'s SIGTERM too.
func TestSecondInterruptEndsProcess(t *testing.T) {
	_, bin := buildTool(t)
	fifo := filepath.Join(t.TempDir(), "fifo")
	require.NoError(t, unix.Mkfifo(fifo, 0o600))
	cmd := exec.Command(bin, "dump", fifo)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	waited := make(chan struct{})
	go func() {
		exited <- cmd.Wait()
		close(waited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-waited
	})
	pid := cmd.Process.Pid
	deadline := time.Now().Add(30 * time.Second)
	for !waitsForFIFOWriter(pid) {
		require.True(t, time.Now().Before(deadline), "dump never blocked opening the FIFO")
		time.Sleep(time.Millisecond)
	}
	// The first SIGINT is taken; a later one (the handler is reset just
	// after the first, so keep sending) ends the process.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	giveUp := time.After(10 * time.Second)
	for {
		select {
		case err := <-exited:
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee)
			assert.False(t, ee.Exited(), "ended by the signal")
			return
		case <-tick.C:
			cmd.Process.Signal(syscall.SIGINT)
		case <-giveUp:
			t.Fatal("softrdma dump FIFO still running after 10 s of SIGINTs")
		}
	}
}

// TestPingpongPortZeroRefused: rc-, uc- and ud-pingpong -p 0 are usage
// errors, as the perftest tools' -p 0 and rping's are: pingpong.Options
// takes 0 for the default, so a server given -p 0 silently listened on
// 18515 and a client connected there. (A short context bounds a server
// that would wait.)
func TestPingpongPortZeroRefused(t *testing.T) {
	for _, tool := range []string{"rc-pingpong", "uc-pingpong", "ud-pingpong"} {
		args := []string{tool, "-g", "1", "-p", "0", "--bind", "127.0.0.1:0"}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		var o, e bytes.Buffer
		code := run(ctx, args, &o, &e)
		cancel()
		assert.Equal(t, exitUsage, code, "%v: %s", args, e.String())
		assert.Equal(t, "softrdma: "+tool+": -p 0: not a TCP port (1 to 65535; default 18515)\n", e.String(), args)
	}
}

// TestRoCEPortZeroRefused: an explicit --roce-port 0 is a usage error, as
// -p 0 is, not the default 4791 taken silently (new-user pass 12); without
// the flag the port is the default.
func TestRoCEPortZeroRefused(t *testing.T) {
	c, _, err := parse(t, "write-bw", "-R", "--roce-port", "0", "10.0.0.1")
	require.NoError(t, err)
	_, err = c.tool(perf.WriteBW).options(perf.WriteBW)
	require.EqualError(t, err, "--roce-port 0: not a UDP port (1 to 65535; default 4791)")
	c, _, err = parse(t, "write-bw", "-R", "10.0.0.1")
	require.NoError(t, err)
	o, err := c.tool(perf.WriteBW).options(perf.WriteBW)
	require.NoError(t, err)
	assert.Zero(t, o.RoCEPort, "the default (4791) is the engine's")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var o2, e bytes.Buffer
	code := run(ctx, []string{"rping", "-c", "-a", "127.0.0.1", "--roce-port", "0"}, &o2, &e)
	assert.Equal(t, exitUsage, code, e.String())
	assert.Equal(t, "softrdma: rping: --roce-port 0: not a UDP port (1 to 65535; default 4791)\n", e.String())
}
