package softrdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// getEvent waits (at most 20 s) for d's next asynchronous event.
func getEvent(t *testing.T, d *softrdma.Device) softrdma.AsyncEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ev, err := d.GetAsyncEvent(ctx)
	require.NoError(t, err)
	return ev
}

// TestRemoteAccessErrorEventAtResponderOnly: an RDMA WRITE with an rkey
// the responder does not know. The requester's WR completes with
// WCRemAccessErr (the NAK remote access error, IBTA 9.7.5.2.4) and its
// device raises no event: the error is reported by the completion. The
// responder's QP goes to ERR and, the WRITE having no receive WQE to
// complete in error, its client gets the affiliated asynchronous error
// EventQPAccessErr ("Local Access Violation Work Queue Error", IBTA
// C9-222.1.1 / 11.6.3.2) on that QP.
func TestRemoteAccessErrorEventAtResponderOnly(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{})
	src, smr := reg(t, p.A, 64, rw)
	_, dmr := reg(t, p.B, 64, rw)
	fill(1, src)
	_, err := p.A.QP.PostSend(softrdma.SendWR{WRID: 1, Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
		SGL:        []softrdma.SGE{{Addr: smr.Addr(), Length: 64, LKey: smr.LKey()}},
		RemoteAddr: dmr.Addr(), RKey: dmr.RKey() ^ 0x80})
	require.NoError(t, err)
	wcs := waitWC(t, p.A.CQ, 1)
	require.Equal(t, softrdma.WCRemAccessErr, wcs[0].Status)

	ev := getEvent(t, p.B.Dev)
	require.Equal(t, softrdma.EventQPAccessErr, ev.Type)
	require.Same(t, p.B.QP, ev.QP)
	require.Nil(t, ev.CQ)
	require.Equal(t, "local access violation work queue error", ev.Type.String())
	require.Equal(t, softrdma.QPStateErr, p.B.QP.State())
	p.B.Dev.AckAsyncEvent(ev)

	_, ok := p.A.Dev.PollAsyncEvent()
	require.False(t, ok, "the requester's error is a completion, not an event")
	_, ok = p.B.Dev.PollAsyncEvent()
	require.False(t, ok, "one event")
	require.NoError(t, p.B.Dev.DestroyQP(p.B.QP), "acknowledged: DestroyQP does not wait")
}

// TestCommEstWhenRTRQPReceives: the responder is left in RTR (as a passive
// side is between its REP and the RTU); the requester's SEND is its first
// packet: EventCommEst on its QP (IBTA 11.6.3.1). The SEND completes on
// both sides: RTR receives.
func TestCommEstWhenRTRQPReceives(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoConnect: true})
	const pa, pb = 100, 200
	require.NoError(t, softrdma.Connect(p.A.QP, softrdma.Endpoint{Addr: p.B.Dev.LocalAddr(), QPN: p.B.QP.QPN(), PSN: pb}, pa, softrdma.ConnectOptions{}))
	b := p.B.QP
	require.NoError(t, b.Modify(&softrdma.QPAttr{State: softrdma.QPStateInit, Port: 1, AccessFlags: softrdma.AccessRemoteWrite},
		softrdma.QPAttrState|softrdma.QPAttrPKeyIndex|softrdma.QPAttrPort|softrdma.QPAttrAccessFlags))
	require.NoError(t, b.Modify(&softrdma.QPAttr{State: softrdma.QPStateRTR, Dest: p.A.Dev.LocalAddr(), PathMTU: softrdma.MTU1024,
		DestQPN: p.A.QP.QPN(), RQPSN: pa, MaxDestRdAtomic: 1, MinRNRTimer: 12},
		softrdma.QPAttrState|softrdma.QPAttrAV|softrdma.QPAttrPathMTU|softrdma.QPAttrDestQPN|softrdma.QPAttrRQPSN|
			softrdma.QPAttrMaxDestRdAtomic|softrdma.QPAttrMinRNRTimer))
	_, ok := p.B.Dev.PollAsyncEvent()
	require.False(t, ok)

	src, smr := reg(t, p.A, 16, rw)
	_, dmr := reg(t, p.B, 16, rw)
	fill(2, src)
	_, err := b.PostRecv(softrdma.RecvWR{WRID: 9, SGL: []softrdma.SGE{{Addr: dmr.Addr(), Length: 16, LKey: dmr.LKey()}}})
	require.NoError(t, err)
	_, err = p.A.QP.PostSend(softrdma.SendWR{WRID: 1, Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
		SGL: []softrdma.SGE{{Addr: smr.Addr(), Length: 16, LKey: smr.LKey()}}})
	require.NoError(t, err)

	ev := getEvent(t, p.B.Dev)
	require.Equal(t, softrdma.EventCommEst, ev.Type)
	require.Same(t, b, ev.QP)
	require.Nil(t, ev.CQ)
	p.B.Dev.AckAsyncEvent(ev)
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.B.CQ, 1)[0].Status)
	require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
	_, ok = p.A.Dev.PollAsyncEvent()
	require.False(t, ok, "the requester, in RTS, raises none")
}

// TestGetAsyncEventCanceled: GetAsyncEvent on a device with no event
// returns the context's error.
func TestGetAsyncEventCanceled(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := p.A.Dev.GetAsyncEvent(ctx)
	require.ErrorIs(t, err, context.Canceled)
}
