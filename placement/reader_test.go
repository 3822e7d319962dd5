package placement_test

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
	"github.com/stretchr/testify/require"
)

// TestDeregMRRacesPlacement deregisters regions while writers place
// messages into them, through cursors bound to a Reader and through unbound
// cursors, and checks DeregMR's guarantee: once it returns, no byte of the
// region changes any more. Every registration has its own buffer, and each
// buffer is copied when its DeregMR returns and compared at the end. Under
// -race a placement that is not ordered before DeregMR's return is also a
// reported race with that copy.
func TestDeregMRRacesPlacement(t *testing.T) {
	e := placement.New(placement.Config{})
	const writers = 4 // two bound, two unbound
	const per = 2 * 4096
	var cur atomic.Pointer[placement.MR]
	newMR := func() *placement.MR {
		mr, err := e.RegMR(pd1, make([]byte, writers*per), rw)
		require.NoError(t, err)
		return mr
	}
	cur.Store(newMR())
	var stop atomic.Bool
	var placed, refused atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < writers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var c placement.Cursor
			var rd *placement.Reader
			if g%2 == 0 {
				rd = e.NewReader()
				defer rd.Close()
				c.Bind(rd)
			}
			payload := make([]byte, 1000)
			for i := 1; !stop.Load(); i++ {
				fill(payload, byte(i))
				mr := cur.Load()
				// Each writer has its own bytes: two QPs writing the same
				// bytes race in real RDMA too.
				st := e.Begin(&c, pd1, mr.RKey(), mr.Addr()+uint64(g*per), 3000, stag.AccessRemoteWrite)
				for p := 0; st == placement.OK && c.Resid() > 0; p++ {
					st = e.Write(&c, payload[:min(uint64(len(payload)), c.Resid())])
					if rd != nil && p == 1 && i%3 == 0 {
						rd.Quiesce() // between the packets of a message
					}
				}
				e.End(&c)
				if rd != nil && i%4 == 0 {
					rd.Quiesce() // after a "batch"
				}
				switch st {
				case placement.OK:
					placed.Add(1)
				case placement.RemoteAccessErr:
					refused.Add(1)
				default:
					panic(st)
				}
			}
		}(g)
	}
	rounds := 200
	if raceEnabled {
		rounds = 60
	}
	type dead struct{ buf, copy []byte }
	var deregistered []dead
	for i := 0; i < rounds; i++ {
		old := cur.Load()
		cur.Store(newMR())
		require.NoError(t, e.DeregMR(old))
		deregistered = append(deregistered, dead{old.Bytes(), bytes.Clone(old.Bytes())})
	}
	stop.Store(true)
	wg.Wait()
	require.NoError(t, e.DeregMR(cur.Load()))
	require.Zero(t, e.PinnedBytes())
	for i, d := range deregistered {
		require.True(t, bytes.Equal(d.copy, d.buf), "region %d changed after DeregMR returned", i)
	}
	require.NotZero(t, placed.Load())
	t.Logf("%d messages placed, %d refused", placed.Load(), refused.Load())
}

// TestBoundCursorDoesNotHoldDeregMR: a bound cursor holds no reference
// between packets, so DeregMR returns while its message is open (as soon as
// the reader has quiesced), and the message's next packet fails and places
// nothing.
func TestBoundCursorDoesNotHoldDeregMR(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := placement.New(placement.Config{})
		buf := make([]byte, 8192)
		mr, err := e.RegMR(pd1, buf, rw)
		require.NoError(t, err)
		rd := e.NewReader()
		defer rd.Close()
		var c placement.Cursor
		c.Bind(rd)
		require.Equal(t, placement.OK, e.Begin(&c, pd1, mr.RKey(), mr.Addr(), 8192, stag.AccessRemoteWrite))
		require.Equal(t, placement.OK, e.Write(&c, []byte{1, 2, 3}))
		require.True(t, c.Busy())
		rd.Quiesce()

		done := make(chan error)
		go func() { done <- e.DeregMR(mr) }()
		synctest.Wait()
		select {
		case err := <-done:
			require.NoError(t, err)
		default:
			t.Fatal("DeregMR waits for a bound cursor whose reader has quiesced")
		}
		require.Zero(t, e.PinnedBytes())
		require.Equal(t, placement.RemoteAccessErr, e.Write(&c, []byte{9}))
		e.End(&c)
		require.Equal(t, []byte{1, 2, 3, 0}, buf[:4])
	})
}

// TestDeregWaitsForOnlineReader: DeregMR waits until a reader that was
// placing when the key was invalidated has quiesced; meanwhile the
// reader's next packet already fails.
func TestDeregWaitsForOnlineReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := placement.New(placement.Config{})
		buf := make([]byte, 8192)
		mr, err := e.RegMR(pd1, buf, rw)
		require.NoError(t, err)
		rd := e.NewReader()
		defer rd.Close()
		var c placement.Cursor
		c.Bind(rd)
		require.Equal(t, placement.OK, e.Begin(&c, pd1, mr.RKey(), mr.Addr(), 8192, stag.AccessRemoteWrite))
		require.Equal(t, placement.OK, e.Write(&c, []byte{1, 2, 3}))

		done := make(chan error)
		go func() { done <- e.DeregMR(mr) }()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("DeregMR returned while a reader that was placing had not quiesced")
		default:
		}
		require.NotZero(t, e.PinnedBytes())
		require.Equal(t, placement.RemoteAccessErr, e.Write(&c, []byte{9}), "the key is invalid already")
		var c2 placement.Cursor
		c2.Bind(rd)
		require.Equal(t, placement.RemoteAccessErr, e.Begin(&c2, pd1, mr.RKey(), mr.Addr(), 1, stag.AccessRemoteWrite))
		e.End(&c)
		rd.Quiesce()
		require.NoError(t, <-done)
		require.Zero(t, e.PinnedBytes())
		require.Equal(t, []byte{1, 2, 3, 0}, buf[:4])
	})
}

// TestBoundCursorPlaces runs the remote paths through a bound cursor:
// multi-packet WRITE and READ with quiescent states between packets.
func TestBoundCursorPlaces(t *testing.T) {
	e := placement.New(placement.Config{})
	buf, checkGuards := guarded(t, 3*4096)
	mr := reg(t, e, pd1, buf, rw)
	rd := e.NewReader()
	defer rd.Close()
	var c placement.Cursor
	c.Bind(rd)
	msg := make([]byte, len(buf)-10)
	for i := range msg {
		msg[i] = byte(i*7 + 1)
	}
	require.Equal(t, placement.OK, e.Begin(&c, pd1, mr.RKey(), mr.Addr()+5, uint64(len(msg)), stag.AccessRemoteWrite))
	for off := 0; off < len(msg); off += 1000 {
		require.Equal(t, placement.OK, e.Write(&c, msg[off:min(off+1000, len(msg))]))
		rd.Quiesce()
	}
	require.Equal(t, placement.InvalidRequest, e.Write(&c, []byte{1}))
	e.End(&c)
	require.Equal(t, msg, buf[5:5+len(msg)])

	got := make([]byte, len(msg))
	require.Equal(t, placement.OK, e.Begin(&c, pd1, mr.RKey(), mr.Addr()+5, uint64(len(got)), stag.AccessRemoteRead))
	for off := 0; off < len(got); off += 700 {
		require.Equal(t, placement.OK, e.Read(&c, got[off:min(off+700, len(got))]))
		if off%1400 == 0 {
			rd.Quiesce()
		}
	}
	e.End(&c)
	require.Equal(t, msg, got)
	checkGuards()

	// Bind wants an idle cursor.
	require.Equal(t, placement.OK, e.Begin(&c, pd1, mr.RKey(), mr.Addr(), 1, stag.AccessRemoteWrite))
	require.Panics(t, func() { c.Bind(nil) })
	e.End(&c)
	c.Bind(nil)
}
