package transport

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

// setRetryCnt sets retry_cnt through SQD, the one state from which RTS
// takes it (Table 91).
func (r *syncRig) setRetryCnt(t *testing.T, n uint8) {
	t.Helper()
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD}, QPAttrState))
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, RetryCnt: n}, QPAttrState|QPAttrRetryCnt))
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState))
}

// TestACKProgressRestoresRetryCnt: retry_cnt bounds retries without
// progress, not the retries of a whole message. An ACK that acknowledges
// part of a long WRITE restores it, as rxe's check_ack does on every ACK
// (reset_retry_counters) and as IBTA's requester does on forward progress
// (9.7.5.1.3). With retry_cnt 1, a NAK, an ACK of the packet resent after
// it, and a second NAK must start a second retry. The counter used to come
// back only when a whole WQE completed, so a long message under loss ended
// in RETRY_EXC_ERR after retry_cnt NAKs however much it progressed.
func TestACKProgressRestoresRetryCnt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		r.setRetryCnt(t, 1)
		_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 3 * rigMTU, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		require.Len(t, r.sent(), 3) // PSNs 5000-5002
		r.ackPkt(wire.SyndromeNAKPSNSeqErr, 5001, 0)
		ps := r.sent()
		require.NotEmpty(t, ps, "the first NAK starts a retry")
		require.Equal(t, wire.PSN(5001), ps[0].PSN())
		require.Equal(t, uint8(0), r.qp.RequesterState().RetryCnt)

		r.ackPkt(wire.SyndromeACK, 5001, 0) // progress
		require.Equal(t, uint8(1), r.qp.RequesterState().RetryCnt, "progress restores retry_cnt")
		r.ackPkt(wire.SyndromeNAKPSNSeqErr, 5002, 0)
		ps = r.sent()
		require.NotEmpty(t, ps, "the second NAK, after progress, starts a retry too")
		require.Equal(t, wire.PSN(5002), ps[0].PSN())
		require.Empty(t, r.poll(), "no completion yet")
		require.Equal(t, uint64(0), r.d.counters.RetryExceededErr.Load())

		r.ackPkt(wire.SyndromeACK, 5002, 1)
		wcs := r.poll()
		require.Len(t, wcs, 1)
		require.Equal(t, WCSuccess, wcs[0].Status)
	})
}

// TestReadResponseGapSpendsRetryCnt: a gap in a READ's responses (a
// response lost) makes the requester ask again for the rest; that is a
// retry, and retry_cnt bounds it as it bounds a NAK's or a timeout's (rxe
// waits for its retransmit timer, which takes COMPST_ERROR_RETRY). With
// retry_cnt 0 the READ completes with RETRY_EXC_ERR and the QP goes to
// ERR; it used to be requested again without end. With retry_cnt 1 the
// first gap asks again, and the in-order response that follows restores
// the count (rxe's check_ack resets it on each READ response).
func TestReadResponseGapSpendsRetryCnt(t *testing.T) {
	read := func(r *syncRig) {
		_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMARead, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 4 * rigMTU, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		require.Len(t, r.sent(), 1) // the READ request, PSNs 5000-5003
	}
	t.Run("retry_cnt 0", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newSyncRig(t)
			r.setRetryCnt(t, 0)
			read(r)
			r.deliver(r.build(wire.OpRDMAReadResponseFirst, 5000, make([]byte, rigMTU), false, nil))
			r.deliver(r.build(wire.OpRDMAReadResponseMiddle, 5002, make([]byte, rigMTU), false, nil)) // 5001 lost
			require.Empty(t, r.sent(), "retry_cnt 0: the READ is not asked again")
			wcs := r.poll()
			require.Len(t, wcs, 1)
			require.Equal(t, WCRetryExcErr, wcs[0].Status)
			require.Equal(t, QPStateErr, r.qp.State())
			require.Equal(t, uint64(1), r.d.counters.RetryExceededErr.Load())
		})
	})
	t.Run("retry_cnt 1", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newSyncRig(t)
			r.setRetryCnt(t, 1)
			read(r)
			r.deliver(r.build(wire.OpRDMAReadResponseFirst, 5000, make([]byte, rigMTU), false, nil))
			r.deliver(r.build(wire.OpRDMAReadResponseMiddle, 5002, make([]byte, rigMTU), false, nil)) // 5001 lost
			ps := r.sent()
			require.Len(t, ps, 1, "the rest of the READ is asked again")
			require.Equal(t, wire.OpRDMAReadRequest, ps[0].Opcode())
			require.Equal(t, wire.PSN(5001), ps[0].PSN())
			require.Equal(t, uint8(0), r.qp.RequesterState().RetryCnt)
			// The new stream: 5001 arrives in order and restores retry_cnt,
			// so when the rest is lost too, the retransmit timeout asks
			// again instead of failing.
			r.deliver(r.build(wire.OpRDMAReadResponseMiddle, 5001, make([]byte, rigMTU), false, nil))
			require.Equal(t, uint8(1), r.qp.RequesterState().RetryCnt)
			time.Sleep(r.qp.timeoutDuration() + time.Microsecond)
			ps = r.sent()
			require.Len(t, ps, 1)
			require.Equal(t, wire.OpRDMAReadRequest, ps[0].Opcode())
			require.Equal(t, wire.PSN(5002), ps[0].PSN())
			require.Empty(t, r.poll())
			require.Equal(t, QPStateRTS, r.qp.State())
		})
	})
}
