package transport

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

// TestPostRecvInErrorKeepsReceiveCompletionsInOrder: a multi-packet SEND
// has taken receive WR 7 (WR 8 waits behind it) when a fatal NAK moves
// the QP to ERR; the engine flushes the responder's WR 7 once it has
// respMu, which the responder holds here. A PostRecv in that window finds
// the QP in ERR and flushes what is queued. Receive completions come in
// the order the WRs were posted (IBTA 11.4.2.1; every WR flushed in ERR,
// 10.3.1): 7, 8, 9. The PostRecv used to flush 8 and 9 before the
// engine flushed 7.
func TestPostRecvInErrorKeepsReceiveCompletionsInOrder(t *testing.T) {
	r := newResponderRig(t)
	recv := func(wrid uint64) RecvWR {
		return RecvWR{WRID: wrid, SGL: []SGE{{Addr: r.mr.Addr(), Length: 4096, LKey: r.mr.LKey()}}}
	}
	_, err := r.qp.PostRecv(recv(7), recv(8))
	require.NoError(t, err)
	r.deliver(r.build(wire.OpSendFirst, 1000, make([]byte, rigMTU), false, nil))
	_, err = r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
		SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
	require.NoError(t, err)
	op, _, psn := r.answer()
	require.Equal(t, wire.OpRDMAWriteOnly, op)

	r.qp.respMu.Lock() // the responder is busy: the engine's flush of WR 7 waits
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.ackPkt(wire.SyndromeNAKRemoteAccess, psn, 0)
	}()
	wcs := make([]WC, 4)
	n, err := r.cq.Wait(context.Background(), wcs)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, uint64(1), wcs[0].WRID)
	require.Equal(t, WCRemAccessErr, wcs[0].Status)
	require.Equal(t, QPStateErr, r.qp.State())
	_, err = r.qp.PostRecv(recv(9))
	require.NoError(t, err)
	r.qp.respMu.Unlock()
	<-done

	var ids []uint64
	for _, wc := range r.poll() {
		require.Equal(t, WCRecv, wc.Opcode)
		require.Equal(t, WCWRFlushErr, wc.Status)
		ids = append(ids, wc.WRID)
	}
	require.Equal(t, []uint64{7, 8, 9}, ids)
}
