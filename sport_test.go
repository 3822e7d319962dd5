package softrdma_test

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
	"github.com/softrdma/softrdma/transport"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// portTap counts the datagrams a device sends and receives by the UDP
// source address they carry.
type portTap struct {
	mu   sync.Mutex
	seen map[conn.Direction]map[netip.AddrPort]int
}

func (p *portTap) Packet(dir conn.Direction, src, _ netip.AddrPort, _ uint16, _ []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seen == nil {
		p.seen = map[conn.Direction]map[netip.AddrPort]int{}
	}
	if p.seen[dir] == nil {
		p.seen[dir] = map[netip.AddrPort]int{}
	}
	p.seen[dir][src]++
}

func (p *portTap) sources(dir conn.Direction) map[netip.AddrPort]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[netip.AddrPort]int{}
	for k, v := range p.seen[dir] {
		out[k] = v
	}
	return out
}

// Two devices on 127.0.0.1 (real UDP, ephemeral ports): by default each
// QP sends from rxe's port for the connection, which both QPs share (QP
// 0x11 to QP 0x11: 49441, one socket per device, shared through
// SO_REUSEPORT); SourcePortOwn sends from the devices' own ports, as
// before the spread. Either way the traffic flows, what one device sends
// arrives at the other from the same address, and no ICRC fails.
func TestSourcePortsOverLoopback(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sport int
	}{
		{"spread", softrdma.SourcePortSpread},
		{"own", softrdma.SourcePortOwn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var taps [2]portTap
			var devs [2]*softrdma.Device
			var qps [2]*softrdma.QP
			var sides [2]*softrdmatest.Side
			for i := range devs {
				d, err := softrdma.Open(softrdma.Config{Addr: netip.MustParseAddrPort("127.0.0.1:0"),
					Tap: &taps[i], SourcePort: tc.sport, Logf: t.Logf})
				require.NoError(t, err)
				t.Cleanup(func() { d.Close() })
				pd, err := d.AllocPD()
				require.NoError(t, err)
				cq, err := d.CreateCQ(16)
				require.NoError(t, err)
				qps[i], err = d.CreateQP(pd, softrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: softrdma.QPTypeRC,
					Cap: softrdma.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
				require.NoError(t, err)
				devs[i], sides[i] = d, &softrdmatest.Side{Dev: d, PD: pd, CQ: cq, QP: qps[i]}
			}
			for i, j := range []int{1, 0} {
				require.NoError(t, softrdma.Connect(qps[i], softrdma.Endpoint{Addr: devs[j].LocalAddr(), QPN: qps[j].QPN(), PSN: 100},
					100, softrdma.ConnectOptions{}))
			}
			src, smr := reg(t, sides[0], 64<<10, rw)
			_, dmr := reg(t, sides[1], 64<<10, rw)
			fill(1, src)
			_, err := qps[0].PostSend(softrdma.SendWR{Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
				SGL:        []softrdma.SGE{{Addr: smr.Addr(), Length: uint32(len(src)), LKey: smr.LKey()}},
				RemoteAddr: dmr.Addr(), RKey: dmr.RKey()})
			require.NoError(t, err)
			require.Equal(t, softrdma.WCSuccess, waitWC(t, sides[0].CQ, 1)[0].Status)

			var want [2]netip.AddrPort
			for i, d := range devs {
				want[i] = d.LocalAddr()
				if tc.sport == softrdma.SourcePortSpread {
					want[i] = netip.AddrPortFrom(want[i].Addr(), wire.SourcePort(0, qps[i].QPN(), qps[1-i].QPN()))
				}
				require.Equal(t, want[i].Port(), qps[i].SourcePort())
			}
			if tc.sport == softrdma.SourcePortSpread {
				require.Equal(t, uint16(49441), want[0].Port(), "QP 0x11 to QP 0x11, as rxe")
				require.Equal(t, want[0], want[1], "one port, shared by the two devices")
			}
			for i, d := range devs {
				sent := taps[i].sources(conn.DirTx)
				require.Equal(t, []netip.AddrPort{want[i]}, keysOf(sent), "device %d sends from its QP's port", i)
				require.Positive(t, sent[want[i]])
				rcvd := taps[1-i].sources(conn.DirRx)
				require.Equal(t, keysOf(sent), keysOf(rcvd), "what device %d sent arrives from that address", i)
				for _, c := range d.Snapshot() {
					if c.Name == "drop_bad_icrc" {
						require.Zero(t, c.Value)
					}
				}
			}
		})
	}
}

func keysOf[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestGSISourcePort: QP1 sends from rxe's port for QP1, 0xC000 +
// hash_32(1, 14) = 55410 (every CM MAD in the golden captures), on a
// device on 4791; on a lab device (another port) from the device's own
// port, where a peer's CM answers it.
func TestGSISourcePort(t *testing.T) {
	for _, c := range []struct {
		name string
		o    softrdmatest.Options
		want func(d *softrdma.Device) uint16
	}{
		{"4791", softrdmatest.Options{Pipe: true, NoPcap: true, NoConnect: true}, func(*softrdma.Device) uint16 { return 55410 }},
		{"lab", softrdmatest.Options{NoPcap: true, NoConnect: true}, func(d *softrdma.Device) uint16 { return d.LocalAddr().Port() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := softrdmatest.NewPair(t, c.o)
			qp, err := p.A.Dev.CreateGSIQP(p.A.PD, softrdma.QPInitAttr{SendCQ: p.A.CQ, RecvCQ: p.A.CQ,
				Cap: softrdma.Cap{MaxSendWR: 1, MaxRecvWR: 1}})
			require.NoError(t, err)
			require.NoError(t, softrdma.InitUD(qp, softrdma.GSIQKey, 0))
			got := qp.SourcePort()
			if got == 0 {
				got = p.A.Dev.LocalAddr().Port()
			}
			require.Equal(t, c.want(p.A.Dev), got)
			_, err = p.A.Dev.CreateGSIQP(p.A.PD, softrdma.QPInitAttr{SendCQ: p.A.CQ, RecvCQ: p.A.CQ,
				Cap: softrdma.Cap{MaxSendWR: 1, MaxRecvWR: 1}})
			require.ErrorIs(t, err, transport.ErrBusy, "one QP1 per device")
		})
	}
}
