package transport

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

// TestImpliedNAKCountsAgainstRetryCnt: an implied NAK (an ACK or a
// response past a READ or atomic whose response has not come) starts a
// retry like a NAK sequence error, and retry_cnt bounds it: rxe's
// completer takes check_psn's COMPST_ERROR_RETRY for it, which decrements
// retry_cnt or, at 0, completes the WQE with RETRY_EXC_ERR and moves the QP
// to ERR. With retry_cnt 0 the READ used to be requested again, as often
// as implied NAKs came.
func TestImpliedNAKCountsAgainstRetryCnt(t *testing.T) {
	for _, by := range []string{"ACK", "atomic ACK"} {
		t.Run(by, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newSyncRig(t)
				require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD}, QPAttrState))
				require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, RetryCnt: 0}, QPAttrState|QPAttrRetryCnt))
				require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState))
				sge := []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}
				second := SendWR{WRID: 2, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: sge, RemoteAddr: 0x1000, RKey: 0x1234}
				if by == "atomic ACK" {
					second = SendWR{WRID: 2, Opcode: WRAtomicFetchAndAdd, Flags: SendSignaled, SGL: sge, RemoteAddr: 0x1000, RKey: 0x1234, CompareAdd: 1}
				}
				_, err := r.qp.PostSend(
					SendWR{WRID: 1, Opcode: WRRDMARead, Flags: SendSignaled, SGL: sge, RemoteAddr: 0x1000, RKey: 0x1234}, second)
				require.NoError(t, err)
				require.Len(t, r.sent(), 2)
				// The READ's response (5000) was lost; the second request's
				// answer (5001) arrives.
				if by == "ACK" {
					r.ackPkt(wire.SyndromeACK, 5001, 2)
				} else {
					r.deliver(r.build(wire.OpAtomicAcknowledge, 5001, nil, false, func(b []byte, info *wire.OpInfo) {
						wire.AETH(b[info.Offset[wire.HdrAETH]:]).Encode(wire.SyndromeACK, 2)
						wire.AtomicAckETH(b[info.Offset[wire.HdrAtomicAckETH]:]).SetOrigRemoteData(7)
					}))
				}
				require.Empty(t, r.sent(), "retry_cnt 0: no retry")
				wcs := r.poll()
				require.Len(t, wcs, 2)
				require.Equal(t, uint64(1), wcs[0].WRID)
				require.Equal(t, WCRetryExcErr, wcs[0].Status)
				require.Equal(t, uint64(2), wcs[1].WRID)
				require.Equal(t, WCWRFlushErr, wcs[1].Status)
				require.Equal(t, QPStateErr, r.qp.State())
				require.Equal(t, uint64(1), r.d.counters.RetryExceededErr.Load())
			})
		})
	}
}

// TestImpliedNAKRetriesWhileRetryCntLasts: with retry_cnt 1 the first
// implied NAK requests the READ again (and spends the retry); the READ's
// response then completes both WRs, and a completion restores retry_cnt.
func TestImpliedNAKRetriesWhileRetryCntLasts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD}, QPAttrState))
		require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, RetryCnt: 1}, QPAttrState|QPAttrRetryCnt))
		require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState))
		sge := []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}
		_, err := r.qp.PostSend(
			SendWR{WRID: 1, Opcode: WRRDMARead, Flags: SendSignaled, SGL: sge, RemoteAddr: 0x1000, RKey: 0x1234},
			SendWR{WRID: 2, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: sge, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		require.Len(t, r.sent(), 2)
		r.ackPkt(wire.SyndromeACK, 5001, 2)
		ps := r.sent()
		require.NotEmpty(t, ps)
		require.Equal(t, wire.OpRDMAReadRequest, ps[0].Opcode())
		require.Equal(t, uint8(0), r.qp.RequesterState().RetryCnt)
		r.deliver(r.build(wire.OpRDMAReadResponseOnly, 5000, make([]byte, 8), false, func(b []byte, info *wire.OpInfo) {
			wire.AETH(b[info.Offset[wire.HdrAETH]:]).Encode(wire.SyndromeACK, 1)
		}))
		r.ackPkt(wire.SyndromeACK, 5001, 2)
		wcs := r.poll()
		require.Len(t, wcs, 2)
		require.Equal(t, WCSuccess, wcs[0].Status)
		require.Equal(t, WCSuccess, wcs[1].Status)
		require.Equal(t, uint8(1), r.qp.RequesterState().RetryCnt)
	})
}
