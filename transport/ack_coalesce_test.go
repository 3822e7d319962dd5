package transport

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// TestACKsCoalescedWhilePacketsWait: IBTA 9.7.5.1.1 lets a responder
// acknowledge several requests with one ACK. The receive loop sends the
// ACKs it coalesced when the conn has nothing more buffered (the next
// Receive may block) or after ackCoalescePackets packets; until then each
// batch of requests asking for an ACK (AckReq) adds to one owed ACK.
// Without a conn that tells what it buffers, every batch ends with its ACK.
func TestACKsCoalescedWhilePacketsWait(t *testing.T) {
	const batch = 64 // conn.IdealBatchSize
	// run hands n WRITE ONLY packets with AckReq (PSNs 1000...) to the
	// demux in batches of 64, with buffered reporting more waiting until
	// the last batch, and returns the PSNs of the ACKs the peer got.
	run := func(t *testing.T, n int, tells bool) []wire.PSN {
		r := newResponderRig(t)
		left := n
		if tells {
			r.d.buffered = func() bool { return left > 0 }
		} else {
			r.d.buffered = nil
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
		var acks []wire.PSN
		for range r.d.counters.SentPkts.Load() - sent0 {
			op, syn, psn := r.answer()
			require.Equal(t, wire.OpAcknowledge, op)
			require.Equal(t, wire.SyndromeACK, syn)
			acks = append(acks, psn)
		}
		return acks
	}
	t.Run("buffered", func(t *testing.T) {
		// 600 packets: ACKs after 256 (4 batches), 512 (8), and the last
		// batch, when nothing is buffered any more.
		require.Equal(t, int(ackCoalescePackets), 256)
		require.Equal(t, []wire.PSN{1255, 1511, 1599}, run(t, 600, true))
	})
	t.Run("conn cannot tell", func(t *testing.T) {
		require.Equal(t, []wire.PSN{1063, 1127, 1191, 1199}, run(t, 200, false))
	})
}
