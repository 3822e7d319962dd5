package transport

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// TestDataPathAllocatesNothing runs the receive demux, the responder and
// placement on in-order RDMA WRITE packets (with the coalesced ACK and its
// send), and the requester on posted WRITEs: none may allocate.
func TestDataPathAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r := newResponderRig(t)
	payload := make([]byte, rigMTU)
	psn := wire.PSN(1000)
	pkt := r.build(wire.OpRDMAWriteOnly, psn, payload, true, r.reth(r.mr.Addr(), r.mr.RKey(), rigMTU))
	in := conn.Packet{Buf: pkt, Addr: r.from}
	acks := make([]conn.Packet, 4)
	allocs := testing.AllocsPerRun(200, func() {
		wire.BTH(pkt).SetPSN(psn)
		psn = psn.Add(1)
		r.d.handle(&in, &r.pkt)
		r.d.flushAcks()
		r.d.rxTx.flush()
		r.d.reader.Quiesce()
		// Take the ACK at the peer, which returns the pipe's buffer.
		if n, err := r.peer.Receive(acks); err != nil || n != 1 {
			t.Fatalf("ACK: %d %v", n, err)
		}
	})
	require.Zero(t, allocs, "responder allocations per packet")
	require.Equal(t, uint64(201), r.d.counters.RDMARecvs.Load())

	// Requester: post a WRITE and build its packets (the peer never
	// answers; the window is large enough for all of them).
	wr := SendWR{Opcode: WRRDMAWrite, SGL: []SGE{{Addr: r.mr.Addr(), Length: 4 * rigMTU, LKey: r.mr.LKey()}},
		RemoteAddr: 0x1000, RKey: 0x1234}
	var b txBatch
	b.init(r.d)
	allocs = testing.AllocsPerRun(10, func() {
		if _, err := r.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		r.qp.runRequester(&b)
		b.n = 0 // discard instead of sending
		r.qp.sq.Lock()
		r.qp.comp.idx = r.qp.req.idx // pretend the WQEs completed
		r.qp.comp.psn = r.qp.req.psn
		r.qp.sq.Unlock()
	})
	require.Zero(t, allocs, "requester allocations per WR")
}

// TestAllocSetsEveryPacketField: txBatch.alloc fills a reused slot field by
// field, so a field added to conn.Packet would keep the value of the
// slot's last packet unless alloc sets it too.
func TestAllocSetsEveryPacketField(t *testing.T) {
	var names []string
	for f := range reflect.TypeFor[conn.Packet]().Fields() {
		names = append(names, f.Name)
	}
	require.Equal(t, []string{"Buf", "Addr", "IP", "SrcPort", "ICRCReady"}, names,
		"conn.Packet changed: set the new field in txBatch.alloc, then list it here")
}
