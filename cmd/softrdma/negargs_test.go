package main

import (
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNegativeFlagValues: a negative value after a flag that takes one
// reaches the tools' own checks, which name the flag and say what is
// wrong (exit 2), instead of kong's "expected duration value but got
// "-1s" (short flag); perhaps try --connect-timeout="-1s"?".
func TestNegativeFlagValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"write-bw", "--connect-timeout", "-1s", "h"}, "softrdma: --connect-timeout -1s: must not be negative\n"},
		{[]string{"write-bw", "-s", "-1", "h"}, `softrdma: --size: "-1": the size must be at least 1 byte (see softrdma write-bw --help)` + "\n"},
		{[]string{"write-bw", "-n", "-5", "h"}, `softrdma: --iters: "-5": must be 5 to 100000000 (see softrdma write-bw --help)` + "\n"},
		{[]string{"write-bw", "-p", "-1", "h"}, "softrdma: -p -1: the port must be 1 to 65535\n"},
		{[]string{"write-bw", "-D", "-1", "h"}, `softrdma: --duration: "-1": must not be negative: 100ms to 24h0m0s (see softrdma write-bw --help)` + "\n"},
		{[]string{"write-bw", "--odp-budget", "-1", "h"}, `softrdma: --odp-budget: "-1": a size must not be negative (see softrdma write-bw --help)` + "\n"},
		{[]string{"rping", "-c", "-a", "127.0.0.1", "-C", "-1"}, "softrdma: rping: Invalid count -1\n"},
		{[]string{"demo", "--timeout", "-1s"}, "softrdma: demo: --timeout -1s: must be positive (bad command line)\n"},
		{[]string{"rc-pingpong", "-n", "-1"}, "softrdma: rc-pingpong: -n -1: need at least one exchange\n"},
	} {
		code, _, stderr := runCLI(t, tc.args...)
		assert.Equal(t, exitUsage, code, tc.args)
		assert.Equal(t, tc.want, stderr, tc.args)
	}
}

// TestJoinNegativeValues: only a flag that takes a value is joined with a
// negative number after it; a bool flag, a flag given with "=", a
// positional argument and everything after "--" are left alone.
func TestJoinNegativeValues(t *testing.T) {
	var c cli
	p, err := newParser(&c, io.Discard, io.Discard, func(int) {})
	require.NoError(t, err)
	for _, tc := range []struct{ in, want []string }{
		{[]string{"write-bw", "-s", "-1", "--connect-timeout", "-1s"}, []string{"write-bw", "--size=-1", "--connect-timeout=-1s"}},
		{[]string{"write-bw", "-a", "-1"}, []string{"write-bw", "-a", "-1"}},
		{[]string{"write-bw", "--size=-1", "-2"}, []string{"write-bw", "--size=-1", "-2"}},
		{[]string{"write-bw", "-s", "64K", "--", "-n", "-1"}, []string{"write-bw", "-s", "64K", "--", "-n", "-1"}},
		{[]string{"bench", "scopes", "-T", "-1ms"}, []string{"bench", "scopes", "--period=-1ms"}},
		{[]string{"rping", "-C", "-x"}, []string{"rping", "-C", "-x"}},
	} {
		assert.Equal(t, tc.want, joinNegativeValues(p.Model, tc.in), tc.in)
	}
}
