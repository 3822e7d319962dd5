package transport

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// ackFrom delivers a WRITE ONLY with AckReq to the rig's QP and returns
// the address its ACK came from.
func (r *responderRig) ackFrom(psn wire.PSN) netip.AddrPort {
	r.t.Helper()
	r.deliver(r.build(wire.OpRDMAWriteOnly, psn, []byte{1, 2, 3, 4}, true, r.reth(r.mr.Addr(), r.mr.RKey(), 4)))
	pkts := make([]conn.Packet, 1)
	n, err := r.peer.Receive(pkts)
	require.NoError(r.t, err)
	require.Equal(r.t, 1, n)
	var p wire.Packet
	require.NoError(r.t, wire.Parse(pkts[0].Buf, &p))
	require.Equal(r.t, wire.OpAcknowledge, p.Opcode())
	require.Equal(r.t, psn, p.PSN())
	return pkts[0].Addr
}

// An RC QP sends from the port rxe would give it: from its QPN and its
// peer's once it has an address vector, from the flow label when it has
// one. The port is held while the QP may send, shared between QPs, and
// given up on RESET and DestroyQP.
func TestSourcePortAsRxe(t *testing.T) {
	r := newResponderRig(t)
	pipe := r.d.conn.(*conn.PipeConn)
	ip := r.d.LocalAddr().Addr()
	want := wire.SourcePort(0, r.qp.QPN(), r.peerQP)
	require.Equal(t, want, r.qp.SourcePort())
	require.Equal(t, netip.AddrPortFrom(ip, want), r.ackFrom(1000))
	require.Equal(t, map[uint16]int{want: 1}, pipe.SourcePorts())

	// A new address vector with a flow label (SQD -> SQD, the transition
	// that takes one): the port follows it.
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD}, QPAttrState))
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateSQD, Dest: r.from, FlowLabel: 0x48e0f}, QPAttrState|QPAttrAV))
	require.Equal(t, uint16(52765), r.qp.SourcePort())
	require.Equal(t, netip.AddrPortFrom(ip, 52765), r.ackFrom(1001))
	require.Equal(t, map[uint16]int{52765: 1}, pipe.SourcePorts())
	require.Equal(t, uint32(0x48e0f), r.qp.Attr().FlowLabel)
	require.ErrorIs(t, r.qp.Modify(&QPAttr{State: QPStateSQD, Dest: r.from, FlowLabel: 1 << 20}, QPAttrState|QPAttrAV), ErrBadAttr)
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState))

	// A second QP with the same flow label shares the port.
	qp2, err := r.d.CreateQP(1, &QPInitAttr{SendCQ: r.cq, RecvCQ: r.cq, Type: QPTypeRC, Cap: Cap{MaxSendWR: 4, MaxRecvWR: 4}})
	require.NoError(t, err)
	require.Equal(t, wire.QPSourcePort(qp2.QPN()), qp2.SourcePort(), "before its address vector: rxe's creation port")
	require.NoError(t, qp2.Modify(&QPAttr{State: QPStateInit, Port: 1}, QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags))
	require.Equal(t, map[uint16]int{52765: 1}, pipe.SourcePorts(), "INIT holds nothing")
	require.NoError(t, qp2.Modify(&QPAttr{State: QPStateRTR, Dest: r.from, FlowLabel: 0x48e0f, PathMTU: MTU1024, DestQPN: 0x98},
		QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN|QPAttrMaxDestRdAtomic|QPAttrMinRNRTimer))
	require.Equal(t, map[uint16]int{52765: 2}, pipe.SourcePorts())
	require.NoError(t, qp2.Modify(&QPAttr{State: QPStateErr}, QPAttrState))
	require.Equal(t, map[uint16]int{52765: 2}, pipe.SourcePorts(), "ERR keeps the port until RESET or destroy")
	require.NoError(t, r.d.DestroyQP(qp2))
	require.Equal(t, map[uint16]int{52765: 1}, pipe.SourcePorts())

	// RESET gives the port up; a new connection takes the new one.
	r.peerQP = 0x1234
	r.connect(t)
	want = wire.SourcePort(0, r.qp.QPN(), 0x1234)
	require.Equal(t, map[uint16]int{want: 1}, pipe.SourcePorts())
	require.Equal(t, netip.AddrPortFrom(ip, want), r.ackFrom(1000))
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
	require.Empty(t, pipe.SourcePorts())
	r.connect(t)
	require.NoError(t, r.d.DestroyQP(r.qp))
	require.Empty(t, pipe.SourcePorts())
}

// A UD QP keeps the port of its creation (its modifies carry no address
// vector): 0xC000 + hash_32(QPN, 14), as ud_pingpong's 57236 for QP 0x11.
func TestSourcePortUD(t *testing.T) {
	r := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	require.Equal(t, wire.QPN(FirstQPN), r.qp.QPN())
	require.Equal(t, uint16(57236), r.qp.SourcePort())
	require.Equal(t, map[uint16]int{57236: 1}, r.d.conn.(*conn.PipeConn).SourcePorts())
}

// Config.SourcePort: a fixed port for every QP, held by the device; the
// device's own port; values out of range.
func TestSourcePortConfigured(t *testing.T) {
	for _, c := range []struct {
		sport int
		want  uint16 // 0: the conn's own port
		holds map[uint16]int
	}{
		{5000, 5000, map[uint16]int{5000: 1}},
		{SourcePortOwn, 0, map[uint16]int{}},
		{wire.RoCEv2Port, 0, map[uint16]int{}}, // the pipe's own port
	} {
		t.Run(fmt.Sprint(c.sport), func(t *testing.T) {
			a, b := conn.NewPipe()
			d, err := NewDevice(Config{Conn: b, Placement: placement.New(placement.Config{}), SourcePort: c.sport})
			require.NoError(t, err)
			t.Cleanup(func() { d.Close(); a.Close() })
			require.Equal(t, c.holds, b.SourcePorts())
			cq := NewCQ(16)
			qp, err := d.CreateQP(1, &QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: QPTypeUD, Cap: Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxInlineData: 16}})
			require.NoError(t, err)
			require.NoError(t, qp.Modify(&QPAttr{State: QPStateInit, Port: 1, QKey: dgQKey}, QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrQKey))
			require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTR}, QPAttrState))
			require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState|QPAttrSQPSN))
			require.Equal(t, c.holds, b.SourcePorts(), "QPs take no hold of a configured port")
			want := c.want
			if want == 0 {
				want = b.LocalAddr().Port()
			}
			require.Equal(t, want, qp.SourcePort())
			ah, err := d.CreateAH(1, &AHAttr{Dest: a.LocalAddr()})
			require.NoError(t, err)
			_, err = qp.PostSend(SendWR{Opcode: WRSend, Flags: SendInline, AH: ah, RemoteQPN: 0x11, RemoteQKey: dgQKey})
			require.NoError(t, err)
			pkts := make([]conn.Packet, 1)
			n, err := a.Receive(pkts)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, netip.AddrPortFrom(b.LocalAddr().Addr(), want), pkts[0].Addr)
			require.NoError(t, d.DestroyQP(qp))
			require.Equal(t, c.holds, b.SourcePorts())
		})
	}
	for _, bad := range []int{-2, 65536} {
		a, b := conn.NewPipe()
		_, err := NewDevice(Config{Conn: b, Placement: placement.New(placement.Config{}), SourcePort: bad})
		require.Error(t, err, bad)
		a.Close()
		b.Close()
	}
}

// On one host another socket may have the port a QP should send from
// (another device listening on 127.0.0.1:57236, say): the QP then sends
// from the device's own port, with a warning, and its traffic flows.
// A fixed port that cannot be bound fails NewDevice.
func TestSourcePortInUseFallsBack(t *testing.T) {
	local := netip.MustParseAddr("127.0.0.1")
	blocker, err := conn.Listen(conn.Config{Addr: netip.AddrPortFrom(local, wire.QPSourcePort(FirstQPN))})
	if err != nil {
		t.Skipf("port %d is not free here: %v", wire.QPSourcePort(FirstQPN), err)
	}
	defer blocker.Close()
	c, err := conn.Listen(conn.Config{Addr: netip.AddrPortFrom(local, 0)})
	require.NoError(t, err)
	var (
		mu   sync.Mutex
		logs []string
	)
	logf := func(f string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		logs = append(logs, fmt.Sprintf(f, args...))
	}
	d, err := NewDevice(Config{Conn: c, Placement: placement.New(placement.Config{}), Logf: logf})
	require.NoError(t, err)
	defer d.Close()
	cq := NewCQ(16)
	qp, err := d.CreateQP(1, &QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: QPTypeUD, Cap: Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxInlineData: 16}})
	require.NoError(t, err)
	require.Equal(t, wire.QPN(FirstQPN), qp.QPN())
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateInit, Port: 1, QKey: dgQKey}, QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrQKey))
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTR}, QPAttrState))
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTS}, QPAttrState|QPAttrSQPSN))
	require.Equal(t, c.LocalAddr().Port(), qp.SourcePort())
	require.Empty(t, c.SourcePorts())
	mu.Lock()
	require.Len(t, logs, 1)
	require.Contains(t, logs[0], fmt.Sprintf("instead of rxe's %d", wire.QPSourcePort(FirstQPN)))
	mu.Unlock()

	ah, err := d.CreateAH(1, &AHAttr{Dest: blocker.LocalAddr()})
	require.NoError(t, err)
	_, err = qp.PostSend(SendWR{Opcode: WRSend, Flags: SendInline, AH: ah, RemoteQPN: 0x11, RemoteQKey: dgQKey})
	require.NoError(t, err)
	pkts := make([]conn.Packet, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, err := blocker.Receive(pkts)
		if err == nil && n == 1 {
			return
		}
		t.Errorf("receive: %d, %v", n, err)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		blocker.Close()
		<-done
		t.Fatal("the datagram did not arrive")
	}
	require.Equal(t, c.LocalAddr(), pkts[0].Addr)

	// A fixed port another socket has: Open fails.
	c2, err := conn.Listen(conn.Config{Addr: netip.AddrPortFrom(local, 0)})
	require.NoError(t, err)
	_, err = NewDevice(Config{Conn: c2, Placement: placement.New(placement.Config{}), SourcePort: int(blocker.LocalAddr().Port())})
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "address already in use"), err)
	c2.Close()
}
