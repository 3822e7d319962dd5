package placement

import (
	"bytes"
	"testing"

	"github.com/softrdma/softrdma/stag"
	"github.com/stretchr/testify/require"
)

// TestCursorFollowsTheLinearMapping: when a region stops being mapped
// linearly in the middle of a message (what a remap or dirty tracking
// does first), the next packets walk the translation table instead, and
// when the mapping comes back they use it again.
func TestCursorFollowsTheLinearMapping(t *testing.T) {
	e := New(Config{})
	buf := make([]byte, 5*4096)
	mr, err := e.RegMR(1, buf, stag.AccessLocalWrite|stag.AccessRemoteWrite|stag.AccessRemoteRead)
	require.NoError(t, err)
	defer e.DeregMR(mr)
	flat, _ := mr.table.Linear()
	msg := make([]byte, 4*4096)
	for i := range msg {
		msg[i] = byte(i*13 + 5)
	}
	for _, bound := range []bool{false, true} {
		clear(buf)
		var c Cursor
		if bound {
			rd := e.NewReader()
			defer rd.Close()
			c.Bind(rd)
		}
		require.Equal(t, OK, e.Begin(&c, 1, mr.RKey(), mr.Addr()+100, uint64(len(msg)), stag.AccessRemoteWrite))
		require.True(t, c.s.Linear())
		require.Equal(t, OK, e.Write(&c, msg[:4096]))
		require.NoError(t, e.mrs.ClearLinear(mr.key))
		require.Equal(t, OK, e.Write(&c, msg[4096:8192]))
		require.False(t, c.s.Linear(), "the second packet walked the table")
		require.NoError(t, e.mrs.SetLinear(mr.key, &flat[0], true))
		require.Equal(t, OK, e.Write(&c, msg[8192:]))
		require.True(t, c.s.Linear())
		e.End(&c)
		require.True(t, bytes.Equal(msg, buf[100:100+len(msg)]))

		got := make([]byte, len(msg))
		require.Equal(t, OK, e.Begin(&c, 1, mr.RKey(), mr.Addr()+100, uint64(len(got)), stag.AccessRemoteRead))
		require.NoError(t, e.mrs.ClearLinear(mr.key))
		require.Equal(t, OK, e.Read(&c, got))
		require.NoError(t, e.mrs.SetLinear(mr.key, &flat[0], true))
		e.End(&c)
		require.Equal(t, msg, got)
	}
}
