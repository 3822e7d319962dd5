package perf

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestFileFIFORefused: a --file that is a FIFO is refused as not a
// regular file (ErrUsage, before connecting: port 1 has no server), as
// /dev/zero is. Opening it for reading blocked until a writer came: for
// ever, and the blocked open ignored Ctrl-C and timeout's SIGTERM.
func TestFileFIFORefused(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	require.NoError(t, unix.Mkfifo(fifo, 0o600))
	done := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), &Options{Test: WriteBW, Server: "127.0.0.1", Port: 1, File: fifo})
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrUsage)
		assert.EqualError(t, err, "--file "+fifo+": not a regular file")
	case <-time.After(10 * time.Second):
		// Release the blocked open so that the goroutine ends.
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		t.Fatal("Run blocked opening the FIFO given as --file")
	}
}

// TestFileOfKernelFSRefused: a --file of the kernel's procfs or sysfs is
// refused before connecting: its size is not its content (a procfs file
// has size 0, and was called empty; a sysfs attribute has size 4096 and
// holds a few bytes, so the run failed midway with "read file:
// unexpected EOF").
func TestFileOfKernelFSRefused(t *testing.T) {
	for _, tc := range []struct{ path, fs string }{
		{"/proc/self/status", "procfs"},
		{"/sys/kernel/mm/transparent_hugepage/enabled", "sysfs"},
	} {
		if _, err := os.Stat(tc.path); err != nil {
			t.Logf("%s: %v", tc.path, err)
			continue
		}
		_, err := Run(context.Background(), &Options{Test: WriteBW, Server: "127.0.0.1", Port: 1, File: tc.path})
		require.ErrorIs(t, err, ErrUsage, tc.path)
		assert.Contains(t, err.Error(), "--file "+tc.path+": a file of the kernel's "+tc.fs, tc.path)
	}
}

// TestConnectErrorNotCalledSetupTimeout: a QP connection that fails in the
// first round (here the client's device is IPv6, ::1, and the server's
// IPv4) fails both sides at once with that error, not with "said hello
// but sent no QP data within 10s (the setup time limit)": the check read
// the first round's exchange context after cancelling it, so every error
// of the first connect was taken for the setup limit's expiry.
func TestConnectErrorNotCalledSetupTimeout(t *testing.T) {
	start := time.Now()
	r := runPair(t, WriteBW, Options{}, Options{Bind: "[::1]:0", Params: Params{Iters: 5}})
	require.Error(t, r.cliErr)
	require.Error(t, r.srvErr)
	for _, err := range []error{r.cliErr, r.srvErr} {
		assert.NotContains(t, err.Error(), "sent no QP data")
		assert.Contains(t, err.Error(), "IPv")
	}
	assert.Contains(t, r.cliErr.Error(), "is IPv4 but the device is bound to ::1")
	assert.Less(t, time.Since(start), DefaultSetupTimeout, "neither side waited for the setup limit")
}

// TestPeerReasonWithoutPackagePrefix: the reason a side tells its peer
// reads as the side's own message does, without softrdma.Open's
// "softrdma: " (the peer prints "softrdma: write-bw: peer: open ...", not
// "peer: softrdma: open ...").
func TestPeerReasonWithoutPackagePrefix(t *testing.T) {
	r := runPair(t, WriteBW, Options{}, Options{Bind: "224.0.0.1", Params: Params{Iters: 5}})
	require.Error(t, r.cliErr)
	require.Error(t, r.srvErr)
	assert.Contains(t, r.srvErr.Error(), "peer: open 224.0.0.1:0: conn: listen 224.0.0.1:0: need a specific local IP address")
}
