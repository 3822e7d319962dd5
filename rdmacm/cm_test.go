package rdmacm_test

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/softrdmatest"
	"github.com/softrdma/softrdma/transport"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// The tests run in a synctest bubble over the in-memory pipe (devices at
// 127.0.0.1:4791 and 127.0.0.2:4791), so the CM's retransmission timers
// run on the bubble's fake clock.

const port = 7174 // rping's default

func pair(t *testing.T) (*softrdmatest.Pair, *rdmacm.CM, *rdmacm.CM) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true, NoPcap: true, NoConnect: true})
	a, err := rdmacm.Open(p.A.Dev, rdmacm.Options{Logf: t.Logf})
	require.NoError(t, err)
	b, err := rdmacm.Open(p.B.Dev, rdmacm.Options{Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() { a.Close(); b.Close() })
	return p, a, b
}

func sent(cm *rdmacm.CM, attr mad.AttributeID) uint64 {
	return cm.Counters().Sent[attr-mad.AttrREQ].Load()
}

func received(cm *rdmacm.CM, attr mad.AttributeID) uint64 {
	return cm.Counters().Received[attr-mad.AttrREQ].Load()
}

// TestConnectAcceptData: B connects to A's listener with private data, A
// accepts with its own; both QPs end in RTS facing each other with the
// PSNs the REQ and REP carried; a SEND and an RDMA WRITE cross; B
// disconnects, both Done channels close, both QPs are in ERR.
func TestConnectAcceptData(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, cmA, cmB := pair(t)
		ctx := context.Background()
		l, err := cmA.Listen(port, 4)
		require.NoError(t, err)

		reqPD := []byte("hello from the active side")
		repPD := []byte("welcome")
		type result struct {
			c   *rdmacm.Conn
			err error
		}
		accepted := make(chan result, 1)
		go func() {
			r, err := l.GetRequest(ctx)
			if err != nil {
				accepted <- result{nil, err}
				return
			}
			// The REQ's offer, as rdma_cm's event->param.conn shows it:
			// the consumer's private data, zero-padded to 56 bytes.
			prm := r.Param()
			if len(prm.PrivateData) != mad.IPConsumerDataSize || !bytes.HasPrefix(prm.PrivateData, reqPD) ||
				prm.ResponderResources != 1 || prm.InitiatorDepth != 2 || prm.RetryCount != 7 || prm.RNRRetryCount != 6 ||
				r.RemoteQPN() != p.B.QP.QPN() || r.RemoteAddr().Addr() != p.B.Dev.LocalAddr().Addr() ||
				r.LocalAddr() != netipAddrPort(p.A.Dev, port) {
				accepted <- result{nil, errors.New("unexpected REQ contents")}
				return
			}
			c, err := r.Accept(ctx, p.A.QP, rdmacm.ConnParam{PrivateData: repPD, ResponderResources: 2,
				InitiatorDepth: 1, RNRRetryCount: 5})
			accepted <- result{c, err}
		}()
		cb, err := cmB.Connect(ctx, p.B.QP, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{PrivateData: reqPD,
			ResponderResources: 1, InitiatorDepth: 2, RetryCount: 7, RNRRetryCount: 6})
		require.NoError(t, err)
		ra := <-accepted
		require.NoError(t, ra.err)
		ca := ra.c
		require.Equal(t, "ESTABLISHED", ca.State())
		require.Equal(t, "ESTABLISHED", cb.State())
		require.True(t, bytes.HasPrefix(cb.RemoteParam().PrivateData, repPD))
		require.Len(t, cb.RemoteParam().PrivateData, mad.REPPrivateDataSize)

		// QP attributes as ib_cm sets them.
		qa, qb := p.A.QP.Attr(), p.B.QP.Attr()
		require.Equal(t, softrdma.QPStateRTS, qa.State)
		require.Equal(t, softrdma.QPStateRTS, qb.State)
		require.Equal(t, p.B.QP.QPN(), qa.DestQPN)
		require.Equal(t, p.A.QP.QPN(), qb.DestQPN)
		require.Equal(t, qa.SQPSN, qb.RQPSN, "the REQ's starting PSN is the passive side's send PSN")
		require.Equal(t, qb.SQPSN, qa.RQPSN, "the REP's starting PSN is the active side's send PSN")
		require.Equal(t, uint8(2), qa.MaxDestRdAtomic, "passive: max_dest_rd_atomic = its responder resources")
		require.Equal(t, uint8(1), qa.MaxRdAtomic, "passive: max_rd_atomic = its initiator depth")
		require.Equal(t, uint8(2), qb.MaxRdAtomic, "active: max_rd_atomic = REP's responder resources")
		require.Equal(t, uint8(1), qb.MaxDestRdAtomic, "active: max_dest_rd_atomic = REP's initiator depth")
		require.Equal(t, uint8(5), qb.RNRRetry, "active: rnr_retry = REP's RNR retry count")
		require.Equal(t, uint8(6), qa.RNRRetry, "passive: rnr_retry = REQ's RNR retry count")
		require.Equal(t, uint8(7), qa.RetryCnt)

		// Data: a SEND from B to A, an RDMA WRITE from A to B.
		srcB, mrB := reg(t, p.B, 4096)
		dstA, mrA := reg(t, p.A, 4096)
		for i := range srcB {
			srcB[i] = byte(i * 7)
		}
		_, err = p.A.QP.PostRecv(softrdma.RecvWR{WRID: 1, SGL: []softrdma.SGE{{Addr: mrA.Addr(), Length: 4096, LKey: mrA.LKey()}}})
		require.NoError(t, err)
		_, err = p.B.QP.PostSend(softrdma.SendWR{WRID: 2, Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
			SGL: []softrdma.SGE{{Addr: mrB.Addr(), Length: 4096, LKey: mrB.LKey()}}})
		require.NoError(t, err)
		require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ).Status)
		require.Equal(t, softrdma.WCSuccess, waitWC(t, p.B.CQ).Status)
		require.Equal(t, srcB, dstA)
		for i := range dstA {
			dstA[i] = ^byte(i)
		}
		clear(srcB)
		_, err = p.A.QP.PostSend(softrdma.SendWR{WRID: 3, Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
			SGL:        []softrdma.SGE{{Addr: mrA.Addr(), Length: 4096, LKey: mrA.LKey()}},
			RemoteAddr: mrB.Addr(), RKey: mrB.RKey()})
		require.NoError(t, err)
		require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ).Status)
		require.Equal(t, dstA, srcB)

		require.NoError(t, cb.Disconnect())
		<-cb.Done()
		<-ca.Done()
		require.NoError(t, cb.Err())
		require.NoError(t, ca.Err())
		require.Equal(t, softrdma.QPStateErr, p.A.QP.State())
		require.Equal(t, softrdma.QPStateErr, p.B.QP.State())
		for _, c := range []struct {
			cm   *rdmacm.CM
			attr mad.AttributeID
			n    uint64
		}{{cmB, mad.AttrREQ, 1}, {cmA, mad.AttrREP, 1}, {cmB, mad.AttrRTU, 1}, {cmB, mad.AttrDREQ, 1}, {cmA, mad.AttrDREP, 1},
			{cmA, mad.AttrREQ, 0}, {cmA, mad.AttrREJ, 0}, {cmB, mad.AttrREJ, 0}} {
			require.Equal(t, c.n, sent(c.cm, c.attr), "%v sent", c.attr)
		}
		require.Equal(t, uint64(1), received(cmA, mad.AttrREQ))
		require.Equal(t, uint64(1), received(cmB, mad.AttrDREP))
		require.Zero(t, cmA.Counters().Retransmits.Load()+cmB.Counters().Retransmits.Load())
	})
}

// TestRejectNoListener: a REQ for a port nobody listens on gets REJ
// "invalid service ID" (8), as Linux's ib_cm answers.
func TestRejectNoListener(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, cmA, cmB := pair(t)
		_, err := cmB.Connect(context.Background(), p.B.QP, netipAddrPort(p.A.Dev, 9999), rdmacm.ConnParam{RetryCount: 7})
		var rej *rdmacm.RejectError
		require.ErrorAs(t, err, &rej)
		require.Equal(t, mad.RejInvalidServiceID, rej.Reason)
		require.Equal(t, uint64(1), sent(cmA, mad.AttrREJ))
		require.Equal(t, softrdma.QPStateReset, p.B.QP.State(), "the QP is not touched before a REP")
	})
}

// TestRejectByApplication: rdma_reject's private data reaches the active
// side with reason "consumer defined" (28).
func TestRejectByApplication(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, cmA, cmB := pair(t)
		l, err := cmA.Listen(port, 1)
		require.NoError(t, err)
		go func() {
			r, err := l.GetRequest(context.Background())
			if err == nil {
				_ = r.Reject([]byte("go away"))
			}
		}()
		_, err = cmB.Connect(context.Background(), p.B.QP, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{})
		var rej *rdmacm.RejectError
		require.ErrorAs(t, err, &rej)
		require.Equal(t, mad.RejConsumerDefined, rej.Reason)
		require.Len(t, rej.PrivateData, mad.REJPrivateDataSize)
		require.True(t, bytes.HasPrefix(rej.PrivateData, []byte("go away")))
	})
}

// TestConnectTimeout: a peer without a CM never answers: the REQ is sent
// 1 + 15 times, one CM response timeout apart (4.096 µs × 2^20 plus the
// round trip allowance of 2 × 4.096 µs × 2^14), then ErrTimeout.
func TestConnectTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true, NoPcap: true, NoConnect: true})
		cmB, err := rdmacm.Open(p.B.Dev, rdmacm.Options{Logf: t.Logf})
		require.NoError(t, err)
		defer cmB.Close()
		start := time.Now()
		_, err = cmB.Connect(context.Background(), p.B.QP, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{})
		require.ErrorIs(t, err, rdmacm.ErrTimeout)
		step := 4096*time.Nanosecond<<20 + 2*(4096*time.Nanosecond<<14)
		require.Equal(t, 16*step, time.Since(start))
		n, every := cmB.Retries()
		require.Equal(t, 15, n)
		require.Equal(t, step, every, "Retries says how long Connect waits: (15+1) × every")
		require.Equal(t, uint64(16), sent(cmB, mad.AttrREQ))
		require.Equal(t, uint64(15), cmB.Counters().Retransmits.Load())
		require.Equal(t, uint64(1), sent(cmB, mad.AttrREJ), "then a REJ \"timeout\", as ib_cm sends")
		synctest.Wait() // the REJ reaches A
		require.Equal(t, uint64(16+1), p.A.Dev.Counters().Drops[transport.DropUnknownQPN].Load(),
			"no QP1 on A: the REQs and the REJ dropped and counted")
	})
}

// TestMRA: the passive application answers after the active side's first
// timeout: the duplicate REQ gets an MRA (service timeout 24), the active
// side waits instead of sending again, and the late Accept connects.
func TestMRA(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, cmA, cmB := pair(t)
		l, err := cmA.Listen(port, 1)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			r, err := l.GetRequest(context.Background())
			if err == nil {
				time.Sleep(10 * time.Second) // two REQ timeouts of 4.3 s
				_, err = r.Accept(context.Background(), p.A.QP, rdmacm.ConnParam{})
			}
			done <- err
		}()
		c, err := cmB.Connect(context.Background(), p.B.QP, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{})
		require.NoError(t, err)
		require.NoError(t, <-done)
		require.Equal(t, uint64(2), sent(cmB, mad.AttrREQ), "one retransmission, then the MRA holds it")
		require.Equal(t, uint64(1), sent(cmA, mad.AttrMRA))
		require.Equal(t, uint64(1), received(cmB, mad.AttrMRA))
		require.Equal(t, uint64(1), cmA.Counters().Duplicates.Load())
		require.Equal(t, "ESTABLISHED", c.State())
	})
}

// TestListenErrors: a port is listened on once; bad QPs and private data
// that does not fit are refused before anything is sent.
func TestListenErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, cmA, cmB := pair(t)
		_, err := cmA.Listen(port, 1)
		require.NoError(t, err)
		_, err = cmA.Listen(port, 1)
		require.ErrorIs(t, err, rdmacm.ErrPortInUse)
		ctx := context.Background()
		_, err = cmB.Connect(ctx, p.B.QP, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{PrivateData: make([]byte, 57)})
		require.ErrorIs(t, err, rdmacm.ErrPrivateData)
		_, err = cmB.Connect(ctx, nil, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{})
		require.ErrorIs(t, err, rdmacm.ErrBadQP)
		ud, err := p.B.Dev.CreateQP(p.B.PD, softrdma.QPInitAttr{Type: softrdma.QPTypeUD, SendCQ: p.B.CQ, RecvCQ: p.B.CQ,
			Cap: softrdma.Cap{MaxSendWR: 1, MaxRecvWR: 1}})
		require.NoError(t, err)
		_, err = cmB.Connect(ctx, ud, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{})
		require.ErrorIs(t, err, rdmacm.ErrBadQP)
		require.Zero(t, sent(cmB, mad.AttrREQ))
		_, err = rdmacm.Open(p.A.Dev, rdmacm.Options{})
		require.Error(t, err, "one CM per device: QP1 exists")
	})
}

// TestRetryAfterReject: a connection refused before the REP leaves the
// application's QP as it was (INIT, receives posted), so the same QP
// connects once the server listens (what rping --connect-timeout does).
func TestRetryAfterReject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, cmA, cmB := pair(t)
		require.NoError(t, p.B.QP.Modify(&softrdma.QPAttr{State: softrdma.QPStateInit, Port: 1},
			softrdma.QPAttrState|softrdma.QPAttrPKeyIndex|softrdma.QPAttrPort|softrdma.QPAttrAccessFlags))
		_, err := cmB.Connect(context.Background(), p.B.QP, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{})
		var rej *rdmacm.RejectError
		require.ErrorAs(t, err, &rej)
		require.Equal(t, softrdma.QPStateInit, p.B.QP.State())
		l, err := cmA.Listen(port, 1)
		require.NoError(t, err)
		accepted := acceptAsync(context.Background(), l, p.A.QP, rdmacm.ConnParam{})
		c, err := cmB.Connect(context.Background(), p.B.QP, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{})
		require.NoError(t, err)
		require.NoError(t, (<-accepted).err)
		require.Equal(t, softrdma.QPStateRTS, p.B.QP.State())
		require.NoError(t, c.Disconnect())
		<-c.Done()
	})
}

// TestConnectUDP: over real sockets (IPv4 and IPv6 loopback, two devices on
// ephemeral UDP ports): the passive side answers at the UDP port the REQ
// came from (a lab device), the active side reaches the passive device at
// ConnParam.RoCEPort, and the IP CM header carries the address family.
func TestConnectUDP(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "IPv4", true: "IPv6"}[v6], func(t *testing.T) {
			p := softrdmatest.NewPair(t, softrdmatest.Options{IPv6: v6, NoConnect: true})
			cmA, err := rdmacm.Open(p.A.Dev, rdmacm.Options{Logf: t.Logf})
			require.NoError(t, err)
			defer cmA.Close()
			cmB, err := rdmacm.Open(p.B.Dev, rdmacm.Options{Logf: t.Logf})
			require.NoError(t, err)
			defer cmB.Close()
			l, err := cmA.Listen(port, 1)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			got := make(chan netip.AddrPort, 1)
			go func() {
				r, err := l.GetRequest(ctx)
				if err != nil {
					got <- netip.AddrPort{}
					return
				}
				got <- r.RemoteAddr()
				_, _ = r.Accept(ctx, p.A.QP, rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1})
			}()
			c, err := cmB.Connect(ctx, p.B.QP, netipAddrPort(p.A.Dev, port),
				rdmacm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7,
					RoCEPort: p.A.Dev.LocalAddr().Port()})
			require.NoError(t, err)
			require.Equal(t, p.B.Dev.LocalAddr().Addr(), (<-got).Addr(), "the REQ's IP CM source address")
			require.Equal(t, softrdma.QPStateRTS, p.A.QP.State())
			require.Equal(t, softrdma.QPStateRTS, p.B.QP.State())
			require.Equal(t, p.A.Dev.LocalAddr(), p.B.QP.Attr().Dest, "B's QP faces A's device")
			require.Equal(t, p.B.Dev.LocalAddr(), p.A.QP.Attr().Dest, "A's QP faces B's device, at its port")

			// An RDMA READ from A of B's memory.
			src, mrB := reg(t, p.B, 256)
			for i := range src {
				src[i] = byte(i)
			}
			dst, mrA := reg(t, p.A, 256)
			_, err = p.A.QP.PostSend(softrdma.SendWR{Opcode: softrdma.WRRDMARead, Flags: softrdma.SendSignaled,
				SGL:        []softrdma.SGE{{Addr: mrA.Addr(), Length: 256, LKey: mrA.LKey()}},
				RemoteAddr: mrB.Addr(), RKey: mrB.RKey()})
			require.NoError(t, err)
			require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ).Status)
			require.Equal(t, src, dst)
			require.NoError(t, c.Disconnect())
			select {
			case <-c.Done():
			case <-ctx.Done():
				t.Fatal("no DREP")
			}
		})
	}
}

// TestLossyConnect: with 15% of the packets lost on each device's send
// and receive (28% a hop), every
// connection is still made and ended: lost REQs, REPs and DREQs are sent
// again at the response timeout, a lost RTU brings the REP again and the
// REP the RTU again, a lost DREP brings the DREQ again. Over the seeds,
// each of those paths is taken (the counters say so).
func TestLossyConnect(t *testing.T) {
	var retransmits, duplicates uint64
	for seed := uint64(1); seed <= 12; seed++ {
		synctest.Test(t, func(t *testing.T) {
			p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true, NoPcap: true, NoConnect: true,
				Impair: &conn.Impairment{Loss: 0.15, Seed: seed}})
			cmA, err := rdmacm.Open(p.A.Dev, rdmacm.Options{Logf: t.Logf})
			require.NoError(t, err)
			defer cmA.Close()
			cmB, err := rdmacm.Open(p.B.Dev, rdmacm.Options{Logf: t.Logf})
			require.NoError(t, err)
			defer cmB.Close()
			l, err := cmA.Listen(port, 1)
			require.NoError(t, err)
			ctx := context.Background()
			accepted := acceptAsync(ctx, l, p.A.QP, rdmacm.ConnParam{})
			cb, err := cmB.Connect(ctx, p.B.QP, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{RetryCount: 7, RNRRetryCount: 7})
			require.NoError(t, err, "seed %d", seed)
			ra := <-accepted
			require.NoError(t, ra.err, "seed %d", seed)
			ca := ra.c
			require.NoError(t, cb.Disconnect())
			<-cb.Done()
			<-ca.Done()
			require.NoError(t, cb.Err(), "seed %d", seed)
			require.NoError(t, ca.Err(), "seed %d", seed)
			for _, cm := range []*rdmacm.CM{cmA, cmB} {
				retransmits += cm.Counters().Retransmits.Load()
				duplicates += cm.Counters().Duplicates.Load()
			}
		})
	}
	require.NotZero(t, retransmits)
	require.NotZero(t, duplicates)
}

// TestPathMTUCap: ConnParam.PathMTU caps what each side offers and uses:
// the REQ offers the smaller of the port's MTU and the active side's cap,
// the passive side takes the smallest of that, its port's and its own cap.
func TestPathMTUCap(t *testing.T) {
	for _, tc := range []struct {
		active, passive, want softrdma.MTU
	}{
		{0, 0, 0}, // no cap: the port's (both the same here)
		{softrdma.MTU1024, 0, softrdma.MTU1024},
		{0, softrdma.MTU512, softrdma.MTU512},
		{softrdma.MTU2048, softrdma.MTU1024, softrdma.MTU1024},
	} {
		synctest.Test(t, func(t *testing.T) {
			p, cmA, cmB := pair(t)
			l, err := cmA.Listen(port, 1)
			require.NoError(t, err)
			want := tc.want
			if want == 0 {
				want = p.A.QP.ActiveMTU()
			}
			accepted := make(chan error, 1)
			go func() {
				r, err := l.GetRequest(context.Background())
				if err == nil {
					_, err = r.Accept(context.Background(), p.A.QP, rdmacm.ConnParam{PathMTU: tc.passive})
				}
				accepted <- err
			}()
			_, err = cmB.Connect(context.Background(), p.B.QP, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{PathMTU: tc.active})
			require.NoError(t, err)
			require.NoError(t, <-accepted)
			require.Equal(t, want, p.A.QP.Attr().PathMTU, "passive side, caps %v %v", tc.active, tc.passive)
			if tc.passive == 0 || tc.active != 0 && tc.active <= tc.passive {
				// The active side uses what its REQ offered (ib_cm: the
				// REP carries no MTU).
				require.Equal(t, want, p.B.QP.Attr().PathMTU, "active side")
			}
		})
	}
}

// TestCloseKeepsCleanDisconnect: a connection that ended with a
// disconnect reports no error, also after its CM closed during the
// timewait that follows.
func TestCloseKeepsCleanDisconnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, cmA, cmB := pair(t)
		ca, cb := connect(t, p, cmA, cmB)
		require.NoError(t, ca.Disconnect())
		<-ca.Done()
		<-cb.Done()
		require.Equal(t, "TIMEWAIT", ca.State())
		require.NoError(t, cmA.Close())
		require.NoError(t, cmB.Close())
		require.NoError(t, ca.Err(), "disconnected cleanly before the CM closed")
		require.NoError(t, cb.Err())
	})
}

// TestCloseSendsLastDREQ: a DREQ posted just before Close still leaves
// (Close lets posted MADs go before QP1 is destroyed), so the peer learns
// of the disconnect (rping's server exiting on an error does exactly
// this).
func TestCloseSendsLastDREQ(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, cmA, cmB := pair(t)
		ca, cb := connect(t, p, cmA, cmB)
		require.NoError(t, cb.Disconnect())
		require.NoError(t, cmB.Close())
		select {
		case <-ca.Done():
		case <-time.After(time.Minute):
			t.Fatal("the DREQ posted before Close never arrived")
		}
		require.Equal(t, uint64(1), received(cmA, mad.AttrDREQ))
	})
}

// TestActiveGivesUpBeforeAccept: the active side abandons its REQ before
// the passive application takes it from the backlog. Its REJ "timeout"
// (reason 4) carries no remote comm ID (the active side never learnt the
// passive one), so, as ib_cm does (cm_acquire_rejected_id), the passive
// side finds the connection by the REJ's local comm ID and the Local CA
// GUID in its ARI (IBTA 12.6.7, Table 112), and ends it (cm_rej_handler
// in REQ_RCVD): the late Accept fails at once with the REJ, without
// sending a REP the active side no longer knows and waiting out its 15
// retransmissions.
func TestActiveGivesUpBeforeAccept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, cmA, cmB := pair(t)
		l, err := cmA.Listen(port, 1)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = cmB.Connect(ctx, p.B.QP, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, uint64(1), sent(cmB, mad.AttrREJ))
		synctest.Wait() // the REJ reaches A
		require.Equal(t, uint64(1), received(cmA, mad.AttrREJ))
		require.Zero(t, cmA.Counters().UnknownCommID.Load(), "the REJ is matched by its ARI")
		r, err := l.GetRequest(context.Background())
		require.NoError(t, err)
		start := time.Now()
		_, err = r.Accept(context.Background(), p.A.QP, rdmacm.ConnParam{})
		var rej *rdmacm.RejectError
		require.ErrorAs(t, err, &rej)
		require.Equal(t, mad.RejTimeout, rej.Reason)
		require.Zero(t, time.Since(start))
		require.Zero(t, sent(cmA, mad.AttrREP))
		require.Equal(t, softrdma.QPStateReset, p.A.QP.State(), "the QP is not touched")
	})
}

// TestPassiveRetriesFollowTheREQ: the passive side waits for the active
// side's answers as long as the REQ's Local CM Response Timeout says
// and sends a request again as many times as the REQ's Max CM Retries
// say, for its DREQ as for its REP (IBTA 12.7.27 and 12.7.39: the Max CM
// Retries "either CM" uses; ib_cm's cm_req_handler takes both from the
// REQ). Here A (passive: timeout 16, 2 retries of its own) disconnects
// from B (active: timeout 18, 3 retries), whose CM is gone: the DREQ
// goes 1 + 3 times, 4.096 µs × 2^18 (plus the round-trip allowance)
// apart, then A's connection ends.
func TestPassiveRetriesFollowTheREQ(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true, NoPcap: true, NoConnect: true})
		cmA, err := rdmacm.Open(p.A.Dev, rdmacm.Options{Logf: t.Logf, ResponseTimeout: 16, MaxRetries: 2})
		require.NoError(t, err)
		defer cmA.Close()
		cmB, err := rdmacm.Open(p.B.Dev, rdmacm.Options{Logf: t.Logf, ResponseTimeout: 18, MaxRetries: 3})
		require.NoError(t, err)
		ca, _ := connect(t, p, cmA, cmB)
		require.NoError(t, cmB.Close()) // B's DREPs never come
		start := time.Now()
		require.NoError(t, ca.Disconnect())
		<-ca.Done()
		step := 4096*time.Nanosecond<<18 + 2*(4096*time.Nanosecond<<14)
		require.Equal(t, 4*step, time.Since(start))
		require.Equal(t, uint64(4), sent(cmA, mad.AttrDREQ))
	})
}

// TestListenerCloseSkipsEndedRequests: a request in the backlog that the
// active side has abandoned (its REJ "timeout") is not rejected again
// when the listener closes: there is nobody left to tell.
func TestListenerCloseSkipsEndedRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, cmA, cmB := pair(t)
		l, err := cmA.Listen(port, 1)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = cmB.Connect(ctx, p.B.QP, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		synctest.Wait()
		require.Equal(t, uint64(1), received(cmA, mad.AttrREJ))
		require.NoError(t, l.Close())
		synctest.Wait()
		require.Zero(t, sent(cmA, mad.AttrREJ))
		require.Zero(t, cmB.Counters().UnknownCommID.Load())
	})
}
