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
		require.NoError(t, e.mrs.ClearLinear(mr.stag()))
		require.Equal(t, OK, e.Write(&c, msg[4096:8192]))
		require.False(t, c.s.Linear(), "the second packet walked the table")
		require.NoError(t, e.mrs.SetLinear(mr.stag(), &flat[0], true))
		require.Equal(t, OK, e.Write(&c, msg[8192:]))
		require.True(t, c.s.Linear())
		e.End(&c)
		require.True(t, bytes.Equal(msg, buf[100:100+len(msg)]))

		got := make([]byte, len(msg))
		require.Equal(t, OK, e.Begin(&c, 1, mr.RKey(), mr.Addr()+100, uint64(len(got)), stag.AccessRemoteRead))
		require.NoError(t, e.mrs.ClearLinear(mr.stag()))
		require.Equal(t, OK, e.Read(&c, got))
		require.NoError(t, e.mrs.SetLinear(mr.stag(), &flat[0], true))
		e.End(&c)
		require.Equal(t, msg, got)
	}
}

// recordingCopier records what GatherWith shows it, in order.
type recordingCopier struct {
	seen          []byte
	copies, tells int
}

func (r *recordingCopier) Copy(dst, src []byte) {
	copy(dst, src)
	r.seen = append(r.seen, src...)
	r.copies++
}

func (r *recordingCopier) Copied(p []byte) {
	r.seen = append(r.seen, p...)
	r.tells++
}

// GatherWith gathers what Gather does and shows the copier every byte once,
// in order: through Copy for a linearly mapped region, through Copied for
// one whose translation table did the copy, across SGEs of both kinds.
func TestGatherWithShowsEveryByteOnce(t *testing.T) {
	e := New(Config{})
	a, b := make([]byte, 3*4096), make([]byte, 2*4096)
	for i := range a {
		a[i] = byte(i*7 + 1)
	}
	for i := range b {
		b[i] = byte(i*11 + 3)
	}
	ma, err := e.RegMR(1, a, stag.AccessLocalWrite)
	require.NoError(t, err)
	defer e.DeregMR(ma)
	mb, err := e.RegMR(1, b, stag.AccessLocalWrite)
	require.NoError(t, err)
	defer e.DeregMR(mb)
	require.NoError(t, e.mrs.ClearLinear(mb.stag())) // b walks its table
	sgl := []SGE{{Addr: ma.Addr() + 10, Length: 5000, LKey: ma.LKey()}, {Addr: mb.Addr() + 4000, Length: 4000, LKey: mb.LKey()}}
	for _, tc := range []struct{ off, n int }{{0, 9000}, {100, 4900}, {4999, 2}, {5000, 4000}, {6000, 100}} {
		want := make([]byte, tc.n)
		require.Equal(t, OK, e.Gather(1, sgl, uint64(tc.off), want))
		var rc recordingCopier
		got := make([]byte, tc.n)
		require.Equal(t, OK, e.GatherWith(1, sgl, uint64(tc.off), got, &rc), "%+v", tc)
		require.Equal(t, want, got, "%+v", tc)
		require.Equal(t, want, rc.seen, "%+v", tc)
		require.Equal(t, tc.off < 5000, rc.copies == 1, "%+v: Copy for the linear region", tc)
		require.Equal(t, tc.off+tc.n > 5000, rc.tells == 1, "%+v: Copied for the other", tc)
	}
}
