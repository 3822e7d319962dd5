package conn_test

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// newPacket builds an RC RDMA WRITE MIDDLE packet of size bytes (BTH,
// payload, ICRC trailer left zero) whose PSN is seq and whose payload is a
// pattern derived from seq, so that a received packet can be checked
// against the one sent.
func newPacket(seq uint32, size int) []byte {
	b := make([]byte, size)
	wire.BTH(b).Encode(&wire.BTHFields{
		Opcode: wire.OpRDMAWriteMiddle,
		PKey:   wire.DefaultPKey,
		DestQP: 0x11,
		PSN:    wire.PSN(seq & wire.PSNMask),
	})
	payload := b[wire.BTHSize : size-wire.ICRCSize]
	x := seq*2654435761 + 1
	for i := range payload {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		payload[i] = byte(x)
	}
	if len(payload) >= 4 {
		binary.BigEndian.PutUint32(payload, seq)
	}
	return b
}

// seqOf returns the sequence number newPacket put in b (as its PSN).
func seqOf(b []byte) uint32 { return uint32(wire.BTH(b).PSN()) }

// mixedSizes returns n packet sizes that exercise GSO grouping: runs of
// equal sizes ending in a shorter one, single odd sizes, minimum-size
// packets, a few large ones.
func mixedSizes(r *rand.Rand, n int) []int {
	sizes := make([]int, 0, n)
	for len(sizes) < n {
		switch r.IntN(5) {
		case 0, 1: // a run of MTU-sized packets, maybe with a short tail
			seg := []int{1024, 4096, 256, 1500}[r.IntN(4)] + 12 + 4
			k := 1 + r.IntN(20)
			for range k {
				sizes = append(sizes, seg)
			}
			if r.IntN(2) == 0 {
				sizes = append(sizes, 16+r.IntN(seg-16))
			}
		case 2:
			sizes = append(sizes, 16+r.IntN(9000))
		case 3:
			sizes = append(sizes, conn.MinPacketSize)
		case 4:
			sizes = append(sizes, 20000+r.IntN(40000))
		}
	}
	return sizes[:n]
}

// listen opens a loopback UDP conn on an ephemeral port, closed at the
// end of the test.
func listen(t testing.TB, cfg conn.Config) *conn.UDPConn {
	t.Helper()
	if !cfg.Addr.IsValid() {
		cfg.Addr = netip.AddrPortFrom(loopback, 0)
	}
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	c, err := conn.Listen(cfg)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skip("no UDP conn on " + runtime.GOOS)
	}
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// received is a copy of one received packet.
type received struct {
	buf  []byte
	from netip.AddrPort
}

// receiveN receives until n packets have arrived or timeout passes
// without progress, and returns copies of them.
func receiveN(t testing.TB, c conn.Conn, n int, timeout time.Duration) []received {
	t.Helper()
	var out []received
	done := make(chan struct{})
	var rerr error
	go func() {
		defer close(done)
		pkts := make([]conn.Packet, c.BatchSize())
		for len(out) < n {
			k, err := c.Receive(pkts)
			if err != nil {
				rerr = err
				return
			}
			for _, p := range pkts[:k] {
				out = append(out, received{buf: append([]byte(nil), p.Buf...), from: p.Addr})
			}
		}
	}()
	select {
	case <-done:
		require.NoError(t, rerr)
	case <-time.After(timeout):
		// Unblock the receiver by closing; the caller's cleanup closes again.
		c.Close()
		<-done
		if !errors.Is(rerr, net.ErrClosed) {
			require.NoError(t, rerr)
		}
	}
	return out
}

// goroutineLeakCheck fails the test if goroutines started during it are
// still running at its end (wireguard-go's check).
func goroutineLeakCheck(t *testing.T) {
	goroutines := func() (int, []byte) {
		p := make([]byte, 1<<20)
		for {
			n := runtime.Stack(p, true)
			if n < len(p) {
				p = p[:n]
				break
			}
			p = make([]byte, len(p)*2)
		}
		return strings.Count(string(p), "goroutine "), p
	}
	start, _ := goroutines()
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		var end int
		var stacks []byte
		for range 50 {
			if end, stacks = goroutines(); end <= start {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("%s", stacks)
		t.Errorf("goroutine leak: %d at start, %d at end", start, end)
	})
}
