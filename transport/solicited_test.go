package transport

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// solicitedWRs are a two-packet WRITE with immediate and IBV_SEND_SOLICITED,
// a WRITE with immediate without it, a solicited WRITE and a solicited
// SEND, at path MTU 1024; wantSE is the BTH SE bit of each of their five
// packets.
func solicitedWRs(addr uint64, lkey uint32) []SendWR {
	sgl := func(n uint32) []SGE { return []SGE{{Addr: addr, Length: n, LKey: lkey}} }
	return []SendWR{
		{WRID: 1, Opcode: WRRDMAWriteWithImm, Flags: SendSolicited, SGL: sgl(2048), RemoteAddr: 0x1000, RKey: 0x1234, ImmData: 7},
		{WRID: 2, Opcode: WRRDMAWriteWithImm, SGL: sgl(8), RemoteAddr: 0x1000, RKey: 0x1234, ImmData: 8},
		{WRID: 3, Opcode: WRRDMAWrite, Flags: SendSolicited, SGL: sgl(8), RemoteAddr: 0x1000, RKey: 0x1234},
		{WRID: 4, Opcode: WRSend, Flags: SendSolicited, SGL: sgl(8)},
	}
}

var wantSE = []bool{false, true, false, false, true}

// TestSolicitedEventOnWriteWithImmediate: IBV_SEND_SOLICITED sets the BTH
// SE bit on the last packet of a SEND or of an RDMA WRITE with immediate
// (IBTA 9.2.3: both consume a receive WQE, whose completion raises the
// solicited event; rxe's init_req_packet sets it for both), and on no
// other packet. A WRITE with immediate used to go without it, on RC and UC
// alike.
func TestSolicitedEventOnWriteWithImmediate(t *testing.T) {
	t.Run("RC", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := newSyncRig(t)
			_, err := r.qp.PostSend(solicitedWRs(r.mr.Addr(), r.mr.LKey())...)
			require.NoError(t, err)
			ps := r.sent()
			require.Len(t, ps, len(wantSE))
			require.Equal(t, wire.OpRDMAWriteLastWithImmediate, ps[1].Opcode())
			for i, p := range ps {
				require.Equal(t, wantSE[i], p.BTH().SolicitedEvent(), "packet %d (%v)", i, p.Opcode())
			}
		})
	})
	t.Run("UC", func(t *testing.T) {
		r := newDGRig(t, QPTypeUC, conn.PipeConfig{})
		_, err := r.qp.PostSend(solicitedWRs(r.mr.Addr(), r.mr.LKey())...)
		require.NoError(t, err)
		pkts := make([]conn.Packet, 1)
		for i := range wantSE {
			n, err := r.peer.Receive(pkts)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			var p wire.Packet
			require.NoError(t, wire.Parse(pkts[0].Buf, &p))
			if i == 1 {
				require.Equal(t, wire.OpUC|wire.OpRDMAWriteLastWithImmediate, p.Opcode())
			}
			require.Equal(t, wantSE[i], p.BTH().SolicitedEvent(), "packet %d (%v)", i, p.Opcode())
		}
	})
}
