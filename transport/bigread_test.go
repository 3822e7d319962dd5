package transport

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/wire"
)

// TestReadOf2To23PSNs: a READ of 2^31-255 bytes at path MTU 256 takes
// 2^23 response PSNs, half the PSN space: PSN comparisons (signed 24-bit
// distances) saw its end as before its start, its first response was
// dropped as a ghost and it never completed. Such a READ is refused at
// post; one of 2^23-1 PSNs waits until nothing else is outstanding, so
// that its responses stay in the ordered half of the space.
func TestReadOf2To23PSNs(t *testing.T) {
	if testing.Short() || raceEnabled {
		// The race detector's shadow of 2 GiB costs 15 s; the test is
		// single-goroutine logic.
		t.Skip("registers a 2 GiB buffer (untouched but for one page)")
	}
	synctest.Test(t, func(t *testing.T) {
		r := newSyncRig(t)
		qp := r.qp
		require.NoError(t, qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
		require.NoError(t, qp.Modify(&QPAttr{State: QPStateInit, Port: 1, AccessFlags: stag.AccessRemoteRead},
			QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags))
		require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTR, Dest: r.from, PathMTU: MTU256, DestQPN: r.peerQP,
			RQPSN: 1000, MaxDestRdAtomic: 4, MinRNRTimer: 1},
			QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN|QPAttrMaxDestRdAtomic|QPAttrMinRNRTimer))
		require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTS, SQPSN: 5000, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4},
			QPAttrState|QPAttrSQPSN|QPAttrTimeout|QPAttrRetryCnt|QPAttrRNRRetry|QPAttrMaxQPRdAtomic))
		big := make([]byte, 1<<31)
		mr, err := r.place.RegMR(1, big, stag.AccessLocalWrite)
		require.NoError(t, err)
		defer r.place.DeregMR(mr)
		read := func(n uint32) error {
			_, err := qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMARead, Flags: SendSignaled,
				SGL: []SGE{{Addr: mr.Addr(), Length: n, LKey: mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
			return err
		}
		// 2^23 PSNs: refused.
		require.ErrorIs(t, read(1<<31-255), ErrMsgTooLong)
		// Over 2 GiB in two SGEs: refused whatever the opcode.
		_, err = qp.PostSend(SendWR{WRID: 3, Opcode: WRRDMAWrite, SGL: []SGE{{Addr: mr.Addr(), Length: 1 << 31, LKey: mr.LKey()},
			{Addr: mr.Addr(), Length: 1, LKey: mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.ErrorIs(t, err, ErrMsgTooLong)
		// 2^23-1 PSNs behind a WRITE: it waits for the WRITE's ACK.
		_, err = qp.PostSend(SendWR{WRID: 2, Opcode: WRRDMAWrite, SGL: []SGE{{Addr: mr.Addr(), Length: 8, LKey: mr.LKey()}},
			RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
		require.NoError(t, read(1<<31-256))
		ps := r.sent()
		require.Len(t, ps, 1, "the READ waits")
		require.Equal(t, wire.OpRDMAWriteOnly, ps[0].Opcode())
		r.ackPkt(wire.SyndromeACK, 5000, 1)
		ps = r.sent()
		require.Len(t, ps, 1)
		require.Equal(t, wire.OpRDMAReadRequest, ps[0].Opcode())
		require.Equal(t, wire.PSN(5001), ps[0].PSN())
		ghost := r.drops(DropGhostResponse)
		payload := make([]byte, 256)
		payload[0] = 42
		r.deliver(r.build(wire.OpRDMAReadResponseFirst, 5001, payload, false, func(b []byte, info *wire.OpInfo) {
			wire.AETH(b[info.Offset[wire.HdrAETH]:]).Encode(wire.SyndromeACK, 2)
		}))
		require.Equal(t, ghost, r.drops(DropGhostResponse), "the first response is not a ghost")
		require.Equal(t, byte(42), big[0])
	})
}
