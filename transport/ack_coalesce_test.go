package transport

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// TestACKsCoalescedWhilePacketsWait: IBTA 9.7.5.1.1 lets a responder
// acknowledge several requests with one ACK. The receive loop sends the
// ACKs it coalesced when its conn is about to wait for the network (the
// conn's idle hook, onIdle) or after ackCoalescePackets packets; a conn
// without the hook that tells what it buffers gets them when nothing more
// is buffered; and without either, every batch ends with its ACK.
func TestACKsCoalescedWhilePacketsWait(t *testing.T) {
	const batch = 64 // conn.IdealBatchSize
	type mode int
	const (
		idle     mode = iota // the conn runs onIdle before it waits
		buffered             // the conn tells what it buffers
		neither
	)
	// run hands n WRITE ONLY packets with AckReq (PSNs 1000...) to the
	// demux in batches of 64, more waiting until the last batch, then
	// lets the conn go idle, and returns the PSNs of the ACKs the peer
	// got.
	run := func(t *testing.T, n int, m mode) []wire.PSN {
		r := newResponderRig(t)
		left := n
		r.d.idleAcks = m == idle
		r.d.buffered = nil
		if m == buffered {
			r.d.buffered = func() bool { return left > 0 }
		}
		va := uint64(r.mr.Addr())
		sent0 := r.d.counters.SentPkts.Load()
		for psn := 0; psn < n; {
			k := min(batch, n-psn)
			for i := range k {
				b := r.build(wire.OpRDMAWriteOnly, wire.PSN(1000+psn+i), []byte{1, 2, 3, 4}, true, r.reth(va, r.mr.RKey(), 4))
				r.d.handle(&conn.Packet{Buf: b, Addr: r.from}, &r.pkt)
			}
			psn += k
			left -= k
			r.d.endBatch(k)
		}
		if m == idle {
			r.d.onIdle()
		}
		var acks []wire.PSN
		for range r.d.counters.SentPkts.Load() - sent0 {
			op, syn, psn := r.answer()
			require.Equal(t, wire.OpAcknowledge, op)
			require.Equal(t, wire.SyndromeACK, syn)
			acks = append(acks, psn)
		}
		return acks
	}
	require.Equal(t, 256, int(ackCoalescePackets))
	// 600 packets: ACKs after 256 (4 batches), 512 (8), and at the end.
	t.Run("idle hook", func(t *testing.T) {
		require.Equal(t, []wire.PSN{1255, 1511, 1599}, run(t, 600, idle))
	})
	t.Run("buffered", func(t *testing.T) {
		require.Equal(t, []wire.PSN{1255, 1511, 1599}, run(t, 600, buffered))
	})
	t.Run("neither", func(t *testing.T) {
		require.Equal(t, []wire.PSN{1063, 1127, 1191, 1199}, run(t, 200, neither))
	})
}
