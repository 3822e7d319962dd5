package rdmacm_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/softrdmatest"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// rawPeer is a UD QP on B that sends hand-made MADs to A's QP1 and
// receives what A's CM answers (answers go to the sending QP).
type rawPeer struct {
	t   *testing.T
	s   *softrdmatest.Side
	qp  *softrdma.QP
	cq  *softrdma.CQ
	ah  *softrdma.AH
	mr  *softrdma.MR
	buf []byte // send MAD at 0, receive (GRH + MAD) at 256
}

func newRawPeer(t *testing.T, p *softrdmatest.Pair) *rawPeer {
	r := &rawPeer{t: t, s: p.B, buf: make([]byte, mad.Size+softrdma.GRHSize+mad.Size)}
	var err error
	r.cq, err = p.B.Dev.CreateCQ(16)
	require.NoError(t, err)
	r.qp, err = p.B.Dev.CreateQP(p.B.PD, softrdma.QPInitAttr{Type: softrdma.QPTypeUD, SendCQ: r.cq, RecvCQ: r.cq,
		Cap: softrdma.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.NoError(t, softrdma.InitUD(r.qp, softrdma.GSIQKey, 0))
	r.mr, err = p.B.Dev.RegMR(p.B.PD, r.buf, softrdma.AccessLocalWrite)
	require.NoError(t, err)
	r.ah, err = p.B.Dev.CreateAH(p.B.PD, softrdma.AHAttrFor(p.A.Dev.LocalAddr()))
	require.NoError(t, err)
	return r
}

// send sends a MAD built by fill, and expects an answer (returned) or,
// with want false, none within a second of fake time.
func (r *rawPeer) send(fill func(d []byte), want bool) mad.Datagram {
	t := r.t
	_, err := r.qp.PostRecv(softrdma.RecvWR{SGL: []softrdma.SGE{{Addr: r.mr.Addr() + mad.Size, Length: softrdma.GRHSize + mad.Size, LKey: r.mr.LKey()}}})
	require.NoError(t, err)
	clear(r.buf)
	fill(r.buf[:mad.Size])
	_, err = r.qp.PostSend(softrdma.SendWR{Opcode: softrdma.WRSend, SGL: []softrdma.SGE{{Addr: r.mr.Addr(), Length: mad.Size, LKey: r.mr.LKey()}},
		AH: r.ah, RemoteQPN: 1, RemoteQKey: softrdma.GSIQKey})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var wc [1]softrdma.WC
	_, err = r.cq.Wait(ctx, wc[:])
	if !want {
		require.Error(t, err, "no answer expected")
		// Take the receive back for the next MAD.
		require.NoError(t, r.qp.Modify(&softrdma.QPAttr{State: softrdma.QPStateErr}, softrdma.QPAttrState))
		return nil
	}
	require.NoError(t, err)
	require.Equal(t, softrdma.WCRecv, wc[0].Opcode)
	require.Equal(t, uint32(1), wc[0].SrcQP, "answered from QP1")
	d, err := mad.Parse(r.buf[mad.Size+softrdma.GRHSize:])
	require.NoError(t, err)
	return d
}

// openLogging opens a CM on dev whose log lines are kept: logs returns
// them so far.
func openLogging(t *testing.T, dev *softrdma.Device) (cm *rdmacm.CM, logs func() []string) {
	var mu sync.Mutex
	var lines []string
	cm, err := rdmacm.Open(dev, rdmacm.Options{Logf: func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf(f, a...))
	}})
	require.NoError(t, err)
	return cm, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lines)
	}
}

func header(class mad.Class, version uint8, method mad.Method, attr mad.AttributeID, tid uint64) func(d []byte) {
	return func(d []byte) {
		mad.Datagram(d).Encode(&mad.HeaderFields{Class: class, ClassVersion: version, Method: method,
			TransactionID: tid, AttributeID: attr})
	}
}

func req(p *softrdmatest.Pair, transport mad.TransportType, sid mad.ServiceID, ip bool) func(d []byte) {
	return func(d []byte) {
		header(mad.ClassCM, mad.CMClassVersion, mad.MethodSend, mad.AttrREQ, 77)(d)
		f := mad.REQFields{LocalCommID: 0xabcd0001, ServiceID: sid, LocalQPN: 0x33, TransportServiceType: transport,
			ExtendedTransportType: map[bool]uint8{true: 1}[transport == mad.TransportExtended], // XRC (Annex A14)
			StartingPSN:           5, PKey: 0xffff, PathMTU: 3, RetryCount: 7, RNRRetryCount: 7, MaxCMRetries: 15,
			RemoteCMResponseTimeout: 20, LocalCMResponseTimeout: 20,
			Primary: mad.PathFields{LocalLID: 0xffff, RemoteLID: 0xffff, LocalGID: p.B.Dev.LocalAddr().Addr(),
				RemoteGID: p.A.Dev.LocalAddr().Addr(), HopLimit: 64}}
		var pd [mad.REQPrivateDataSize]byte
		if ip {
			mad.IPPrivateData(pd[:]).Encode(&mad.IPPrivateDataFields{SrcPort: 40000, SrcIP: p.B.Dev.LocalAddr().Addr(),
				DstIP: p.A.Dev.LocalAddr().Addr()})
		}
		f.PrivateData = pd[:]
		mad.REQ(d[mad.HeaderSize:]).Encode(&f)
	}
}

// TestUnsupportedMADs: what softrdma's CM does not implement is answered
// as IBTA 13.4.7 and chapter 12 say, counted, and nothing else happens.
func TestUnsupportedMADs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true, NoPcap: true, NoConnect: true})
		cmA, logs := openLogging(t, p.A.Dev)
		defer cmA.Close()
		_, err := cmA.Listen(port, 1)
		require.NoError(t, err)
		r := newRawPeer(t, p)

		// LAP (0x19): a CM attribute we do not implement: GetResp with
		// status 0x000C, "unsupported method/attribute combination".
		d := r.send(header(mad.ClassCM, mad.CMClassVersion, mad.MethodSend, mad.AttrLAP, 42), true)
		require.Equal(t, mad.MethodGetResp, d.Method())
		require.Equal(t, uint16(0x000c), d.Status())
		require.Equal(t, uint64(42), d.TransactionID())
		require.Equal(t, mad.AttrLAP, d.AttributeID())

		// Another class (subnet administration, 0x03): status 0x0004.
		r = newRawPeer(t, p)
		d = r.send(header(mad.ClassSubnAdm, 2, mad.MethodGet, 0x0011, 43), true)
		require.Equal(t, uint16(0x0004), d.Status())
		// The CM class at version 1: status 0x0004 ("bad version").
		r = newRawPeer(t, p)
		d = r.send(header(mad.ClassCM, 1, mad.MethodSend, mad.AttrREQ, 44), true)
		require.Equal(t, uint16(0x0004), d.Status())

		// An XRC REQ: REJ "invalid transport type" (9) naming its comm ID.
		for _, c := range []struct {
			name   string
			fill   func(d []byte)
			reason mad.RejectReason
		}{
			{"XRC", req(p, mad.TransportExtended, mad.IPServiceID(mad.PortSpaceTCP, port), true), mad.RejInvalidTransportType},
			{"UC", req(p, mad.TransportUC, mad.IPServiceID(mad.PortSpaceTCP, port), true), mad.RejInvalidTransportType},
			{"not an IP service ID", req(p, mad.TransportRC, 0x1234, true), mad.RejInvalidServiceID},
			{"UDP port space", req(p, mad.TransportRC, mad.IPServiceID(mad.PortSpaceUDP, port), true), mad.RejInvalidServiceID},
			{"no IP CM header", req(p, mad.TransportRC, mad.IPServiceID(mad.PortSpaceTCP, port), false), mad.RejInvalidServiceID},
			{"nobody listens", req(p, mad.TransportRC, mad.IPServiceID(mad.PortSpaceTCP, port+1), true), mad.RejInvalidServiceID},
		} {
			r = newRawPeer(t, p)
			d = r.send(c.fill, true)
			attr, data, err := d.CM()
			require.NoError(t, err, c.name)
			require.Equal(t, mad.AttrREJ, attr, c.name)
			rej := mad.REJ(data)
			require.Equal(t, c.reason, rej.Reason(), c.name)
			require.Equal(t, uint32(0xabcd0001), rej.RemoteCommID(), c.name)
			require.Equal(t, mad.MsgREQ, rej.MessageRejected(), c.name)
			require.Equal(t, uint64(77), d.TransactionID(), c.name)
		}

		// A DREQ for a connection we never had: DREP (ib_cm answers so
		// that the peer stops asking).
		r = newRawPeer(t, p)
		d = r.send(func(b []byte) {
			header(mad.ClassCM, mad.CMClassVersion, mad.MethodSend, mad.AttrDREQ, 45)(b)
			mad.DREQ(b[mad.HeaderSize:]).Encode(&mad.DREQFields{LocalCommID: 9, RemoteCommID: 10, RemoteQPN: 0x11})
		}, true)
		attr, data, err := d.CM()
		require.NoError(t, err)
		require.Equal(t, mad.AttrDREP, attr)
		require.Equal(t, uint32(9), mad.DREP(data).RemoteCommID())

		// An RTU for nobody, and a response MAD: no answer, counted.
		r = newRawPeer(t, p)
		r.send(func(b []byte) {
			header(mad.ClassCM, mad.CMClassVersion, mad.MethodSend, mad.AttrRTU, 46)(b)
			mad.RTU(b[mad.HeaderSize:]).Encode(&mad.RTUFields{LocalCommID: 1, RemoteCommID: 2})
		}, false)
		r = newRawPeer(t, p)
		r.send(header(mad.ClassCM, mad.CMClassVersion, mad.MethodGetResp, mad.AttrREQ, 47), false)

		ctr := cmA.Counters()
		require.Equal(t, uint64(3), ctr.Unsupported.Load())
		require.Equal(t, uint64(6), ctr.RejectsSent.Load())
		require.Equal(t, uint64(2), ctr.UnknownCommID.Load(), "the DREQ and the RTU")
		lines := logs()
		require.Len(t, lines, 3+6+1, "every refusal is logged, naming the peer: %q", lines)
		for _, l := range lines {
			require.Contains(t, l, p.B.Dev.LocalAddr().Addr().String())
		}
	})
}

// TestAcceptFlowLabel: the passive side's QP takes the REQ's flow label,
// as rxe's does, and with it rxe's UDP source port: rping's REQ in
// rping.pcap carries 0x48e0f, and rxe's RC packets of that connection
// leave from port 52765 on both sides.
func TestAcceptFlowLabel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true, NoPcap: true, NoConnect: true})
		cmA, err := rdmacm.Open(p.A.Dev, rdmacm.Options{Logf: t.Logf})
		require.NoError(t, err)
		defer cmA.Close()
		l, err := cmA.Listen(port, 1)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		go func() {
			if r, err := l.GetRequest(ctx); err == nil {
				_, _ = r.Accept(ctx, p.A.QP, rdmacm.ConnParam{})
			}
		}()
		raw := newRawPeer(t, p)
		d := raw.send(func(b []byte) {
			req(p, mad.TransportRC, mad.IPServiceID(mad.PortSpaceTCP, port), true)(b)
			var f mad.REQFields
			mad.REQ(b[mad.HeaderSize:]).Decode(&f)
			f.Primary.FlowLabel = 0x48e0f
			f.PrivateData = append([]byte(nil), f.PrivateData...)
			mad.REQ(b[mad.HeaderSize:]).Encode(&f)
		}, true)
		attr, _, err := d.CM()
		require.NoError(t, err)
		require.Equal(t, mad.AttrREP, attr)
		require.Equal(t, softrdma.QPStateRTS, p.A.QP.State())
		require.Equal(t, uint16(52765), p.A.QP.SourcePort())
	})
}

// TestWarningsAreRateLimited: a peer that sends the same bad MAD again and
// again gets it counted every time but logged only 10 times (then one in
// 1000), as the device's drop warnings are: a log line per garbage MAD
// would let any peer flood the log.
func TestWarningsAreRateLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true, NoPcap: true, NoConnect: true})
		cmA, logs := openLogging(t, p.A.Dev)
		defer cmA.Close()
		const n = 25
		for i := range n {
			r := newRawPeer(t, p)
			r.send(func(b []byte) {
				header(mad.ClassCM, mad.CMClassVersion, mad.MethodSend, mad.AttrREQ, uint64(100+i))(b)
				b[0] = 2 // base version 2: does not parse
			}, false)
		}
		require.Equal(t, uint64(n), cmA.Counters().Malformed.Load())
		lines := logs()
		require.Len(t, lines, 10, "%q", lines)
		require.Contains(t, lines[0], "base version")
	})
}
