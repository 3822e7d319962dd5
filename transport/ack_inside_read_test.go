package transport

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

// TestACKInsideAReadLeavesItsResponses: an ACKNOWLEDGE whose PSN falls
// inside a READ's response PSNs acknowledges nothing of the READ (a READ is
// answered by its responses only; rxe's check_psn ignores such an ACK,
// COMPST_DONE). It used to move the oldest unacknowledged PSN past the
// READ's first responses, which were then dropped as duplicates when they
// came: the READ never completed.
func TestACKInsideAReadLeavesItsResponses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMARead, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 3 * rigMTU, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		require.Len(t, r.sent(), 1)
		r.ackPkt(wire.SyndromeACK, 5001, 0) // inside 5000..5002
		require.Equal(t, wire.PSN(5000), r.qp.RequesterState().OldestPSN)
		for i, op := range []wire.Opcode{wire.OpRDMAReadResponseFirst, wire.OpRDMAReadResponseMiddle, wire.OpRDMAReadResponseLast} {
			r.deliver(r.build(op, wire.PSN(5000+i), make([]byte, rigMTU), false, func(b []byte, info *wire.OpInfo) {
				if info.Mask&wire.MaskAETH != 0 {
					wire.AETH(b[info.Offset[wire.HdrAETH]:]).Encode(wire.SyndromeACK, 1)
				}
			}))
		}
		wcs := r.poll()
		require.Len(t, wcs, 1)
		require.Equal(t, WCSuccess, wcs[0].Status)
		require.Equal(t, uint32(3*rigMTU), wcs[0].ByteLen)
	})
}
