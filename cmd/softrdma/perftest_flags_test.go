package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/perf"
)

func TestPerftestFlags(t *testing.T) {
	c, cmd, err := parse(t, "write-bw", "--perftest", "--stat", "--connect-timeout", "90s", "-q", "2", "--verify", "192.168.77.10")
	require.NoError(t, err)
	test, err := perf.ParseTest(cmd)
	require.NoError(t, err)
	// write-bw -q 2 --verify streams over one QP with softrdma's exchange
	// and is refused before connecting; with perftest's it checks nothing
	// and runs.
	o, err := c.tool(test).options(test)
	require.NoError(t, err)
	assert.True(t, o.Perftest)
	assert.True(t, o.Stat)
	assert.Equal(t, 90*time.Second, o.ConnectTimeout)

	c, cmd, err = parse(t, "write-bw", "-q", "2", "--verify", "192.168.77.10")
	require.NoError(t, err)
	_, err = c.tool(test).options(test)
	assert.ErrorContains(t, err, "stream over one QP")
	_ = cmd

	code, out, _ := runCLI(t, "read-bw", "--help")
	assert.Equal(t, exitOK, code)
	for _, flag := range []string{"--perftest", "--stat", "--connect-timeout"} {
		assert.Contains(t, out, flag)
	}
}
