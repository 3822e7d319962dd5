package wire_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

func TestSourcePortKnownValues(t *testing.T) {
	for _, c := range []struct {
		name string
		got  uint16
		want uint16
	}{
		// QP creation: 0xC000 + hash_32(qpn, 14).
		{"QP1 (the CM's datagrams in rping)", wire.QPSourcePort(1), 55410},
		{"UD QP 0x11 (ud_pingpong)", wire.QPSourcePort(0x11), 57236},
		{"QPN 0", wire.QPSourcePort(0), wire.SourcePortMin},
		// Modify with an address vector, flow label 0: the QPNs' product.
		{"0x11 to 0x11 (rc_pingpong, perftest)", wire.SourcePort(0, 0x11, 0x11), 49441},
		{"0x11 to 0x123 (hostpeer_rc)", wire.SourcePort(0, 0x11, 0x123), 54099},
		{"0x123 to 0x11: symmetric", wire.SourcePort(0, 0x123, 0x11), 54099},
		// A flow label: folded, the QPNs do not matter (rping's REQ).
		{"flow label 0x48e0f", wire.SourcePort(0x48e0f, 0x11, 0x11), 52765},
		{"flow label 0x48e0f, other QPNs", wire.SourcePort(0x48e0f, 0x99, 0x1234), 52765},
		{"flow label above 20 bits is masked", wire.SourcePort(0xf048e0f, 1, 2), 52765},
	} {
		assert.Equal(t, c.want, c.got, c.name)
	}
	assert.Equal(t, uint32(0x121), wire.FlowLabel(0x11, 0x11))
	assert.Equal(t, uint32(0x1353), wire.FlowLabel(0x11, 0x123))
	// The product of two large QPNs has bits above 40: all are folded in.
	assert.Equal(t, uint32(((0xffffff*0xffffff)^(0xffffff*0xffffff)>>20^(0xffffff*0xffffff)>>40)&0xfffff),
		wire.FlowLabel(0xffffff, 0xffffff))

	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		q, p, fl := wire.QPN(r.Uint32N(1<<24)), wire.QPN(r.Uint32N(1<<24)), r.Uint32N(1<<20)
		for _, port := range []uint16{wire.QPSourcePort(q), wire.SourcePort(fl, q, p), wire.SourcePort(0, q, p)} {
			require.GreaterOrEqual(t, port, uint16(wire.SourcePortMin))
		}
		require.Equal(t, wire.SourcePort(0, q, p), wire.SourcePort(0, p, q))
	}
}

func TestSourcePortAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	var sink uint16
	require.Zero(t, testing.AllocsPerRun(100, func() {
		sink += wire.QPSourcePort(0x11) + wire.SourcePort(0, 0x11, 0x12) + wire.SourcePort(0x48e0f, 1, 2)
	}))
	_ = sink
}

// TestGoldenSourcePorts checks the source port of every packet rxe sent in
// the golden captures against the functions, given the QPN of the QP that
// sent it. A UD packet names its sender in the DETH. An RC or UC packet
// does not: its sender is the destination QP of the packets that flow the
// other way on the connection, and the flow label (0 for the ibverbs
// tools) is the one of the RDMA CM's REQ for the connection, when the CM
// set it up (the REP names the passive side's QP).
func TestGoldenSourcePorts(t *testing.T) {
	type dirKey struct {
		src, dst netip.Addr
		destQP   wire.QPN
	}
	type sender struct {
		qpn wire.QPN
		fl  uint32
	}
	type req struct {
		active netip.Addr
		qpn    wire.QPN
		fl     uint32
	}
	var (
		byCapture = map[string][]goldenPacket{}
		order     []string
		pkt       wire.Packet
	)
	for _, g := range goldenPackets(t) {
		if _, ok := byCapture[g.capture]; !ok {
			order = append(order, g.capture)
		}
		byCapture[g.capture] = append(byCapture[g.capture], g)
	}
	flows := map[string]bool{} // capture, source, port, destination QP: checked
	var udPkts, connPkts, cmPkts, hostPeer int
	cmFlowLabels := map[uint32]bool{}
	for _, capture := range order {
		pkts := byCapture[capture]
		// The destination QPs of RC and UC packets by direction, for
		// finding the sender of the packets that flow the other way.
		dests := map[[2]netip.Addr]map[wire.QPN]bool{}
		for _, g := range pkts {
			require.NoError(t, wire.Parse(g.roce, &pkt))
			if tr := pkt.Opcode().Transport(); tr == wire.OpRC || tr == wire.OpUC {
				k := [2]netip.Addr{g.ip.Src, g.ip.Dst}
				if dests[k] == nil {
					dests[k] = map[wire.QPN]bool{}
				}
				dests[k][pkt.BTH().DestQP()] = true
			}
		}
		cm := map[dirKey]sender{} // connections the CM set up so far
		reqs := map[uint64]req{}  // REQs by transaction ID
		for _, g := range pkts {
			require.NoError(t, wire.Parse(g.roce, &pkt))
			where := fmt.Sprintf("%s frame %d (%v:%d -> %v, %v)", g.capture, g.frame, g.ip.Src, g.sport, g.ip.Dst, pkt.Opcode())
			if g.sport < wire.SourcePortMin {
				// Not rxe: the host-side peer (softrdma before spreading,
				// or a raw socket) at 192.168.77.1, port 4791.
				require.Equal(t, netip.MustParseAddr("192.168.77.1"), g.ip.Src, where)
				require.Contains(t, g.name, "hostpeer", where)
				hostPeer++
				continue
			}
			bth := pkt.BTH()
			var want uint16
			switch pkt.Opcode().Transport() {
			case wire.OpUD:
				src := wire.DETH(pkt.Header(wire.HdrDETH)).SrcQP()
				want = wire.QPSourcePort(src)
				udPkts++
				if bth.DestQP() == 1 && len(pkt.Payload) == mad.Size {
					d, err := mad.Parse(pkt.Payload)
					require.NoError(t, err, where)
					attr, data, err := d.CM()
					if err != nil {
						break
					}
					switch attr {
					case mad.AttrREQ:
						r := mad.REQ(data)
						reqs[d.TransactionID()] = req{g.ip.Src, r.LocalQPN(), r.PrimaryPath().FlowLabel()}
					case mad.AttrREP:
						r, ok := reqs[d.TransactionID()]
						require.True(t, ok, "%s: a REP without its REQ", where)
						passive := mad.REP(data).LocalQPN()
						cm[dirKey{r.active, g.ip.Src, passive}] = sender{r.qpn, r.fl}
						cm[dirKey{g.ip.Src, r.active, r.qpn}] = sender{passive, r.fl}
						cmFlowLabels[r.fl] = true
					}
				}
			default: // RC, UC
				s, ok := cm[dirKey{g.ip.Src, g.ip.Dst, bth.DestQP()}]
				if ok {
					cmPkts++
				} else {
					back := dests[[2]netip.Addr{g.ip.Dst, g.ip.Src}]
					if len(back) == 0 {
						// Nothing came back (retry_exceeded: the peer's
						// QP was gone): the ibverbs tools of these
						// captures connect QP 0x11 to QP 0x11.
						back = map[wire.QPN]bool{0x11: true}
						require.Equal(t, wire.QPN(0x11), bth.DestQP(), where)
					}
					require.Len(t, back, 1, "%s: the sender's QPN is ambiguous", where)
					for q := range back {
						s = sender{qpn: q}
					}
				}
				want = wire.SourcePort(s.fl, s.qpn, bth.DestQP())
				connPkts++
			}
			require.Equal(t, want, g.sport, where)
			flows[fmt.Sprintf("%s %v %d %v", g.capture, g.ip.Src, g.sport, bth.DestQP())] = true
		}
	}
	t.Logf("source ports of %d rxe packets checked (%d UD, %d RC/UC of which %d set up by the RDMA CM, flow labels %v) in %d flows of %d captures; %d host-peer packets skipped",
		udPkts+connPkts, udPkts, connPkts, cmPkts, keys(cmFlowLabels), len(flows), len(order), hostPeer)
	require.NotZero(t, cmPkts, "no RDMA CM connection in the captures")
	require.GreaterOrEqual(t, len(cmFlowLabels), 3, "the CM captures' flow labels")
	require.Greater(t, len(flows), 100)
}

func keys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
