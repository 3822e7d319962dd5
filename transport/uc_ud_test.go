package transport

import (
	"bufio"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// dgRig is a device with one UC or UD QP on a pipe end whose other end the
// test drives by hand, as responderRig does for RC.
type dgRig struct {
	t      testing.TB
	d      *Device
	qp     *QP
	peer   *conn.PipeConn
	from   netip.AddrPort
	place  *placement.Engine
	mem    []byte
	mr     *placement.MR
	cq     *CQ
	pkt    wire.Packet
	peerQP wire.QPN
}

const (
	dgQKey = 0x11111111 // ibv_ud_pingpong's Q_Key, as in captures/ud_pingpong
	dgMem  = 64 << 10
)

func newDGRig(t testing.TB, typ QPType, pc conn.PipeConfig) *dgRig {
	return newDGRigMTU(t, typ, pc, 0)
}

// newDGRigMTU is newDGRig on a device whose port's active MTU is mtu (0:
// 4096).
func newDGRigMTU(t testing.TB, typ QPType, pc conn.PipeConfig, mtu MTU) *dgRig {
	a, b, err := conn.NewPipeWith(pc)
	require.NoError(t, err)
	e := placement.New(placement.Config{})
	d, err := NewDevice(Config{Conn: b, Placement: e, ActiveMTU: mtu})
	require.NoError(t, err)
	t.Cleanup(func() { d.Close(); a.Close() })
	r := &dgRig{t: t, d: d, peer: a, from: a.LocalAddr(), place: e, peerQP: 0x99}
	r.cq = NewCQ(1 << 12)
	r.qp, err = d.CreateQP(1, &QPInitAttr{SendCQ: r.cq, RecvCQ: r.cq, Type: typ,
		Cap: Cap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}})
	require.NoError(t, err)
	r.mem = make([]byte, dgMem)
	r.mr, err = e.RegMR(1, r.mem, stag.AccessLocalWrite|stag.AccessRemoteWrite)
	require.NoError(t, err)
	t.Cleanup(func() { e.DeregMR(r.mr) })
	qp := r.qp
	switch typ {
	case QPTypeUC:
		require.NoError(t, qp.Modify(&QPAttr{State: QPStateInit, Port: 1, AccessFlags: stag.AccessRemoteWrite},
			QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags))
		require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTR, Dest: r.from, PathMTU: MTU1024, DestQPN: r.peerQP, RQPSN: 1000},
			QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN))
	case QPTypeUD:
		require.NoError(t, qp.Modify(&QPAttr{State: QPStateInit, Port: 1, QKey: dgQKey},
			QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrQKey))
		require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTR}, QPAttrState))
	}
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTS, SQPSN: 5000}, QPAttrState|QPAttrSQPSN))
	return r
}

// uc returns a UC request packet (ICRC space included).
func (r *dgRig) uc(op wire.Opcode, psn wire.PSN, payload []byte, reth *wire.RETHFields) []byte {
	op |= wire.OpUC
	info := wire.Info(op)
	pad := wire.PadFor(len(payload))
	b := make([]byte, info.Length+len(payload)+pad+wire.ICRCSize)
	wire.BTH(b).Encode(&wire.BTHFields{Opcode: op, PadCount: pad, PKey: 0xffff, DestQP: r.qp.QPN(), PSN: psn})
	if reth != nil {
		wire.RETH(b[info.Offset[wire.HdrRETH]:]).Encode(reth)
	}
	if info.Mask&wire.MaskImmDt != 0 {
		wire.ImmDt(b[info.Offset[wire.HdrImmDt]:]).SetImm(0xfeed)
	}
	copy(b[info.Length:], payload)
	return b
}

// ud returns a UD SEND (with immediate 0xcafe if imm) from QPN src.
func (r *dgRig) ud(qkey uint32, src wire.QPN, payload []byte, imm bool) []byte {
	op := wire.OpUDSendOnly
	if imm {
		op = wire.OpUDSendOnlyWithImmediate
	}
	info := wire.Info(op)
	pad := wire.PadFor(len(payload))
	b := make([]byte, info.Length+len(payload)+pad+wire.ICRCSize)
	wire.BTH(b).Encode(&wire.BTHFields{Opcode: op, PadCount: pad, PKey: 0xffff, DestQP: r.qp.QPN(), PSN: 77})
	wire.DETH(b[info.Offset[wire.HdrDETH]:]).Encode(qkey, src)
	if imm {
		wire.ImmDt(b[info.Offset[wire.HdrImmDt]:]).SetImm(0xcafe)
	}
	copy(b[info.Length:], payload)
	return b
}

// deliver runs the demux on b as if it had arrived from the peer with the
// IP header fields a pipe reports (TTL 64, TOS 0, ID 0).
func (r *dgRig) deliver(b []byte) {
	r.d.handle(&conn.Packet{Buf: b, Addr: r.from, IP: conn.IPInfo{TTL: conn.DefaultTTL}}, &r.pkt)
	r.d.flushAcks()
	r.d.rxTx.flush()
	r.d.reader.Quiesce()
}

func (r *dgRig) postRecv(wrid uint64, off, n uint32) {
	_, err := r.qp.PostRecv(RecvWR{WRID: wrid, SGL: []SGE{{Addr: r.mr.Addr() + uint64(off), Length: n, LKey: r.mr.LKey()}}})
	require.NoError(r.t, err)
}

func (r *dgRig) poll() []WC {
	wcs := make([]WC, 64)
	n, err := r.cq.Poll(wcs)
	require.NoError(r.t, err)
	return wcs[:n]
}

func (r *dgRig) drops(why DropReason) uint64 { return r.d.counters.Drops[why].Load() }

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// TestUDReceivePlacesGRHThenPayload: a UD SEND with immediate lands as
// the 40-byte GRH followed by the payload (ibv_grh; rxe copies the IP
// header: IPv4 after 20 zero bytes, IPv6 whole), byte_len counts the GRH,
// the WC has IBV_WC_GRH, IBV_WC_WITH_IMM and the DETH's source QPN.
func TestUDReceivePlacesGRHThenPayload(t *testing.T) {
	// The UDP payload is BTH 12 + DETH 8 + ImmDt 4 + 100 + ICRC 4 = 128
	// bytes; UDP length 136 (0x88), IPv4 total length 156 (0x9c).
	t.Run("IPv4", func(t *testing.T) {
		r := newDGRig(t, QPTypeUD, conn.PipeConfig{})
		r.postRecv(1, 0, 1024)
		payload := pattern(100, 1)
		r.deliver(r.ud(dgQKey, 0x1234, payload, true))
		wcs := r.poll()
		require.Len(t, wcs, 1)
		require.Equal(t, WC{WRID: 1, Status: WCSuccess, Opcode: WCRecv, ByteLen: 140, ImmData: 0xcafe,
			QPN: uint32(r.qp.QPN()), SrcQP: 0x1234, Flags: WCWithGRH | WCWithImm,
			SrcPort: 4791}, wcs[0], "SrcPort: the pipe peer's UDP port (conn.DefaultAddr)")
		want := []byte{
			0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // 20 bytes unused
			0x45, 0x00, 0x00, 0x9c, // version 4, IHL 5, TOS 0, total length 156
			0x00, 0x00, 0x40, 0x00, // ID 0 (what a pipe or an unconnected DF socket sends), DF
			0x40, 0x11, 0x3c, 0x4e, // TTL 64, UDP, header checksum
			127, 0, 0, 1, // source: the peer
			127, 0, 0, 2, // destination: this device
		}
		require.Equal(t, want, r.mem[:40])
		require.Equal(t, payload, r.mem[40:140])
		require.Zero(t, r.mem[140], "nothing past byte_len")
		require.Equal(t, uint64(1), r.d.counters.RcvdPkts.Load())
	})
	t.Run("IPv6", func(t *testing.T) {
		r := newDGRig(t, QPTypeUD, conn.PipeConfig{
			AddrA: netip.MustParseAddrPort("[fd00:77::b]:4791"), AddrB: netip.MustParseAddrPort("[fd00:77::a]:4791")})
		r.postRecv(1, 0, 1024)
		payload := pattern(100, 3)
		r.deliver(r.ud(dgQKey, 0x1234, payload, false))
		wcs := r.poll()
		require.Len(t, wcs, 1)
		require.Equal(t, uint32(140), wcs[0].ByteLen)
		require.Equal(t, WCWithGRH, wcs[0].Flags)
		want := []byte{
			0x60, 0x00, 0x00, 0x00, // version 6, traffic class 0, flow label 0
			0x00, 0x84, 0x11, 0x40, // payload length 8 + 124, next header UDP, hop limit 64
			0xfd, 0x00, 0x00, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0b, // source
			0xfd, 0x00, 0x00, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a, // destination
		}
		require.Equal(t, want, r.mem[:40])
		require.Equal(t, payload, r.mem[40:140])
	})
}

// TestGRHMatchesRxeCaptures rebuilds the GRH of every UD packet (and, for
// the IPv6 layout, every packet of the IPv6 captures) of the golden rxe
// captures from what the conn knows (addresses, IPv4 ID, TTL, TOS, flow
// label, length) and compares it with the IP header on the wire, which is
// what rxe places: checksum and all.
func TestGRHMatchesRxeCaptures(t *testing.T) {
	dir := "../../shared/rxe-testbed"
	files, _ := filepath.Glob(filepath.Join(dir, "captures*", "*.pcap"))
	if len(files) == 0 {
		t.Skipf("golden rxe captures not found in %s", dir)
	}
	var ud4, any6 int
	for _, f := range files {
		fh, err := os.Open(f)
		require.NoError(t, err)
		rd, err := pcapgo.NewReader(bufio.NewReader(fh))
		require.NoError(t, err)
		var (
			eth   layers.Ethernet
			ip4   layers.IPv4
			ip6   layers.IPv6
			udp   layers.UDP
			types []gopacket.LayerType
		)
		parser := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &eth, &ip4, &ip6, &udp)
		parser.IgnoreUnsupported = true
		for {
			data, _, err := rd.ReadPacketData()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			if parser.DecodeLayers(data, &types) != nil || !slices.Contains(types, layers.LayerTypeUDP) || udp.DstPort != wire.RoCEv2Port {
				continue
			}
			var grh [GRHSize]byte
			if slices.Contains(types, layers.LayerTypeIPv6) {
				src, _ := netip.AddrFromSlice(ip6.SrcIP)
				dst, _ := netip.AddrFromSlice(ip6.DstIP)
				putGRH(&grh, src, dst, &conn.IPInfo{TTL: ip6.HopLimit, TOS: ip6.TrafficClass, FlowLabel: ip6.FlowLabel}, len(udp.Payload))
				require.Equal(t, eth.Payload[:40], grh[:], "%s: IPv6 header", f)
				any6++
				continue
			}
			if udp.Payload[0] != byte(wire.OpUDSendOnly) && udp.Payload[0] != byte(wire.OpUDSendOnlyWithImmediate) {
				continue
			}
			src, _ := netip.AddrFromSlice(ip4.SrcIP.To4())
			dst, _ := netip.AddrFromSlice(ip4.DstIP.To4())
			putGRH(&grh, src, dst, &conn.IPInfo{ID: ip4.Id, TTL: ip4.TTL, TOS: ip4.TOS}, len(udp.Payload))
			require.Equal(t, make([]byte, 20), grh[:20])
			require.Equal(t, eth.Payload[:20], grh[20:], "%s: IPv4 header", f)
			ud4++
		}
		fh.Close()
	}
	t.Logf("GRH rebuilt byte-exact for %d UD datagrams over IPv4 and %d packets over IPv6", ud4, any6)
	require.Positive(t, ud4, "UD packets over IPv4 (ud_pingpong, hostpeer_ud, the CM MADs)")
	require.Positive(t, any6, "packets over IPv6 (rc_pingpong_ipv6_*)")
}

// TestUDQKeyMismatchDropped: a datagram whose DETH Q_Key is not the QP's
// is dropped and counted (IBTA 10.2.5), consuming no receive WQE; the QP
// stays in RTS and takes the next datagram into the same WQE.
func TestUDQKeyMismatchDropped(t *testing.T) {
	r := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	r.postRecv(1, 0, 1024)
	r.deliver(r.ud(dgQKey^1, 0x1234, pattern(8, 0), false))
	require.Equal(t, uint64(1), r.drops(DropBadQKey))
	require.Empty(t, r.poll())
	require.Equal(t, QPStateRTS, r.qp.State())
	r.deliver(r.ud(dgQKey, 0x1234, pattern(8, 0), false))
	wcs := r.poll()
	require.Len(t, wcs, 1)
	require.Equal(t, uint64(1), wcs[0].WRID)
	require.Equal(t, uint32(GRHSize+8), wcs[0].ByteLen)
}

// TestUDBadQKeyIsAHeaderCheck: the Q_Key is checked with the headers, as
// the P_Key is (rxe check_keys, in hdr_check, before rcvd_pkts counts the
// packet; IBTA 10.2.5): a datagram with a wrong Q_Key counts as bad_qkey
// only, not as a received packet, and a suspension of the device does not
// hold it for replay or count it as suspended: it is dropped as bad_qkey
// at once.
func TestUDBadQKeyIsAHeaderCheck(t *testing.T) {
	r := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	r.postRecv(1, 0, 1024)
	r.deliver(r.ud(dgQKey^0x100, 0x1234, pattern(8, 0), false))
	require.Equal(t, uint64(1), r.drops(DropBadQKey))
	require.Zero(t, r.d.counters.RcvdPkts.Load(), "rcvd_pkts counts packets that passed the header checks")
	r.deliver(r.ud(dgQKey, 0x1234, pattern(8, 0), false))
	require.Len(t, r.poll(), 1)
	require.Equal(t, uint64(1), r.d.counters.RcvdPkts.Load())

	// Resume wakes the receive loop: nothing is delivered by hand after it.
	s, err := r.d.Suspend(placement.ScopeDevice, nil, PolicyNAK)
	require.NoError(t, err)
	r.deliver(r.ud(dgQKey^0x100, 0x1234, pattern(8, 0), false))
	require.Equal(t, uint64(2), r.drops(DropBadQKey), "dropped for its Q_Key, suspended or not")
	require.Zero(t, r.drops(DropSuspended))
	require.Zero(t, r.d.SuspendCounters().Dropped)
	_, err = r.d.Resume(s)
	require.NoError(t, err)
	require.Equal(t, uint64(1), r.d.counters.RcvdPkts.Load())
	require.Empty(t, r.poll())
}

// TestGSIQPUsesTheGSIQKey: QP1 takes and sends datagrams with the GSI's
// well-known Q_Key 0x80010000 (IBTA 13.5.1.2) whatever Q_Key its
// attributes hold, as rxe does: check_keys compares the DETH of a datagram
// for QPN 1 with GSI_QKEY, and init_req_packet puts GSI_QKEY in every DETH
// QP1 sends.
func TestGSIQPUsesTheGSIQKey(t *testing.T) {
	r := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	gsi, err := r.d.CreateGSIQP(1, &QPInitAttr{SendCQ: r.cq, RecvCQ: r.cq, Type: QPTypeUD,
		Cap: Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.NoError(t, gsi.Modify(&QPAttr{State: QPStateInit, Port: 1, QKey: dgQKey},
		QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrQKey))
	require.NoError(t, gsi.Modify(&QPAttr{State: QPStateRTR}, QPAttrState))
	require.NoError(t, gsi.Modify(&QPAttr{State: QPStateRTS, SQPSN: 0}, QPAttrState|QPAttrSQPSN))
	r.qp = gsi
	r.postRecv(1, 0, 1024)

	r.deliver(r.ud(dgQKey, 0x1234, pattern(8, 0), false))
	require.Equal(t, uint64(1), r.drops(DropBadQKey), "QP1's attribute is not its Q_Key")
	r.deliver(r.ud(0x80010000, 0x1234, pattern(8, 0), false))
	wcs := r.poll()
	require.Len(t, wcs, 1, "the GSI Q_Key")
	require.Equal(t, uint64(1), wcs[0].WRID)

	ah, err := r.d.CreateAH(1, &AHAttr{Dest: r.from})
	require.NoError(t, err)
	_, err = gsi.PostSend(SendWR{Opcode: WRSend, SGL: []SGE{{Addr: r.mr.Addr() + 8192, Length: 256, LKey: r.mr.LKey()}},
		AH: ah, RemoteQPN: 1, RemoteQKey: 0x22222222})
	require.NoError(t, err)
	pkts := make([]conn.Packet, 1)
	n, err := r.peer.Receive(pkts)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	var p wire.Packet
	require.NoError(t, wire.Parse(pkts[0].Buf, &p))
	require.Equal(t, uint32(0x80010000), p.DETH().QKey(), "QP1 sends the GSI Q_Key")
	require.Equal(t, wire.QPN(1), p.DETH().SrcQP())
}

// TestUDOversizedDatagramDropped: a datagram whose payload and 40-byte GRH
// exceed the receive buffer is dropped and counted, without an error
// completion and without moving the QP to ERR; the WQE stays posted and the
// next datagram that fits arrives in it.
func TestUDOversizedDatagramDropped(t *testing.T) {
	r := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	r.postRecv(1, 0, 100)
	r.deliver(r.ud(dgQKey, 0x1234, pattern(61, 0), false)) // 40 + 61 = 101 > 100
	require.Equal(t, uint64(1), r.drops(DropRecvTooSmall))
	require.Empty(t, r.poll())
	require.Equal(t, QPStateRTS, r.qp.State())
	payload := pattern(60, 9) // 40 + 60 = 100: fits exactly
	r.deliver(r.ud(dgQKey, 0x1234, payload, false))
	wcs := r.poll()
	require.Len(t, wcs, 1)
	require.Equal(t, WCSuccess, wcs[0].Status)
	require.Equal(t, uint64(1), wcs[0].WRID)
	require.Equal(t, uint32(100), wcs[0].ByteLen)
	require.Equal(t, payload, r.mem[40:100])
}

// TestUDWithoutReceiveWQEDropped: no RNR NAK exists on UD: a datagram
// without a receive WQE is dropped, counted, and nothing is sent back.
func TestUDWithoutReceiveWQEDropped(t *testing.T) {
	r := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	r.deliver(r.ud(dgQKey, 0x1234, pattern(8, 0), false))
	require.Equal(t, uint64(1), r.drops(DropNoRecvWQE))
	require.Zero(t, r.peer.Stats().RcvdDatagrams.Load()+r.d.conn.Stats().SentDatagrams.Load(), "nothing sent back")
	require.Equal(t, QPStateRTS, r.qp.State())
}

// TestTransportMismatchDropped: a QP takes only its own service's opcodes
// (rxe check_type_state): RC on UD, UC on RC, UD on UC are dropped.
func TestTransportMismatchDropped(t *testing.T) {
	ud := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	ud.postRecv(1, 0, 1024)
	b := ud.ud(dgQKey, 1, nil, false)
	b[0] = byte(wire.OpSendOnly) // RC SEND_ONLY carries no DETH, but the opcode decides
	ud.deliver(b[:wire.BTHSize+wire.ICRCSize])
	require.Equal(t, uint64(1), ud.drops(DropUnknownOpcode))

	uc := newDGRig(t, QPTypeUC, conn.PipeConfig{})
	uc.postRecv(1, 0, 1024)
	b = uc.ud(dgQKey, 1, nil, false)
	wire.BTH(b).SetDestQP(uc.qp.QPN())
	uc.deliver(b)
	require.Equal(t, uint64(1), uc.drops(DropUnknownOpcode))
	require.Empty(t, uc.poll())
}

// TestUDSendBuildsDatagram checks the packet a UD send puts on the wire
// against what rxe sends (captures/ud_pingpong): UD_SEND_ONLY (0x64) or
// _WITH_IMMEDIATE (0x65), AckReq 0, P_Key 0xffff, the WR's destination QPN,
// PSNs from sq_psn, a DETH with the WR's Q_Key (the QP's own when the WR's
// has the high bit, IBTA 10.2.5) and the sender's QPN, from the UDP source
// port rxe gives the QP (0xC000 + hash_32 of its QPN; 57236 for QP 0x11 in
// the capture); the WR completes once sent.
func TestUDSendBuildsDatagram(t *testing.T) {
	r := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	ah, err := r.d.CreateAH(1, &AHAttr{Dest: r.from})
	require.NoError(t, err)
	copy(r.mem, pattern(512, 5))
	sgl := []SGE{{Addr: r.mr.Addr(), Length: 512, LKey: r.mr.LKey()}}
	_, err = r.qp.PostSend(
		SendWR{WRID: 1, Opcode: WRSend, SGL: sgl, Flags: SendSignaled, AH: ah, RemoteQPN: 0x11, RemoteQKey: 0x22222222},
		SendWR{WRID: 2, Opcode: WRSendWithImm, SGL: sgl[:0], Flags: SendSignaled | SendSolicited, ImmData: 0xabcd,
			AH: ah, RemoteQPN: 0x12, RemoteQKey: 0x80000000})
	require.NoError(t, err)
	pkts := make([]conn.Packet, 2)
	got := 0
	var p wire.Packet
	for got < 2 {
		n, err := r.peer.Receive(pkts[got:])
		require.NoError(t, err)
		for _, pk := range pkts[got : got+n] {
			require.NoError(t, wire.Parse(pk.Buf, &p))
			require.Equal(t, netip.AddrPortFrom(r.d.LocalAddr().Addr(), wire.QPSourcePort(r.qp.QPN())), pk.Addr)
			require.False(t, p.BTH().AckReq())
			require.Equal(t, uint16(0xffff), p.BTH().PKey())
			require.Equal(t, wire.PSN(5000+got), p.PSN())
			require.Equal(t, r.qp.QPN(), p.DETH().SrcQP())
			if got == 0 {
				require.Equal(t, wire.OpUDSendOnly, p.Opcode())
				require.Equal(t, wire.QPN(0x11), p.BTH().DestQP())
				require.Equal(t, uint32(0x22222222), p.DETH().QKey())
				require.Equal(t, r.mem[:512], p.Payload)
				require.False(t, p.BTH().SolicitedEvent())
			} else {
				require.Equal(t, wire.OpUDSendOnlyWithImmediate, p.Opcode())
				require.Equal(t, wire.QPN(0x12), p.BTH().DestQP())
				require.Equal(t, uint32(dgQKey), p.DETH().QKey(), "controlled Q_Key: the QP's")
				require.Equal(t, uint32(0xabcd), p.ImmDt().Imm())
				require.Empty(t, p.Payload)
				require.True(t, p.BTH().SolicitedEvent())
			}
			got++
		}
	}
	wcs := waitCQ(t, r.cq, 2)
	require.Equal(t, []WC{{WRID: 1, Status: WCSuccess, Opcode: WCSend, QPN: uint32(r.qp.QPN())},
		{WRID: 2, Status: WCSuccess, Opcode: WCSend, QPN: uint32(r.qp.QPN())}}, wcs)
}

// waitCQ polls cq until n completions arrived.
func waitCQ(t *testing.T, cq *CQ, n int) []WC {
	t.Helper()
	var out []WC
	buf := make([]WC, 16)
	// Bounded by time, not by a count of polls: on a loaded machine 20000
	// yields passed before the device's goroutines ran
	// (TestSendCQOverrunUCUD failed so while another suite ran).
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		k, err := cq.Poll(buf)
		require.NoError(t, err)
		out = append(out, buf[:k]...)
		if len(out) >= n {
			return out
		}
		runtime.Gosched()
	}
	t.Fatalf("waiting for %d completions, have %+v", n, out)
	return nil
}

// TestUDPostChecks: PostSend refuses a UD payload above the path MTU (a
// datagram is one packet), a missing, destroyed or foreign-PD address
// handle, and operations other than SEND.
func TestUDPostChecks(t *testing.T) {
	r := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	ah, err := r.d.CreateAH(1, &AHAttr{Dest: r.from})
	require.NoError(t, err)
	other, err := r.d.CreateAH(2, &AHAttr{Dest: r.from})
	require.NoError(t, err)
	sge := func(n uint32) []SGE { return []SGE{{Addr: r.mr.Addr(), Length: n, LKey: r.mr.LKey()}} }
	wr := SendWR{Opcode: WRSend, SGL: sge(4096), AH: ah, RemoteQPN: 0x11, RemoteQKey: dgQKey}
	_, err = r.qp.PostSend(wr)
	require.NoError(t, err, "4096 bytes: the path MTU")
	wr.SGL = sge(4097)
	_, err = r.qp.PostSend(wr)
	require.ErrorIs(t, err, ErrMsgSize)
	wr.SGL = sge(16)
	for _, bad := range []*AH{nil, other} {
		wr.AH = bad
		_, err = r.qp.PostSend(wr)
		require.ErrorIs(t, err, ErrBadAH)
	}
	wr.AH, wr.Opcode, wr.RKey = ah, WRRDMAWrite, 1
	_, err = r.qp.PostSend(wr)
	require.ErrorIs(t, err, ErrBadOpcode)
	wr.Opcode = WRSend
	require.NoError(t, r.d.DestroyAH(ah))
	_, err = r.qp.PostSend(wr)
	require.ErrorIs(t, err, ErrBadAH)
	_, err = r.d.CreateAH(1, &AHAttr{Dest: netip.MustParseAddrPort("[fd00::1]:4791")})
	require.ErrorIs(t, err, ErrBadAHAttr, "an IPv6 destination from an IPv4 device")
	require.NotErrorIs(t, err, ErrBadAH)
	for _, dst := range []string{"224.0.0.1:4791", "255.255.255.255:4791", "0.0.0.0:4791"} {
		_, err = r.d.CreateAH(1, &AHAttr{Dest: netip.MustParseAddrPort(dst)})
		require.ErrorIs(t, err, ErrBadAHAttr, dst)
	}
}

// TestUDDatagramBoundedByPortMTU: a UD message is bounded by the MTU of
// the port (IBTA C10-93.1.1, "the MTU of the port as returned by
// QueryHCA"; rxe's requester takes port.mtu_cap for UD, get_mtu), not by
// 4096: on a 1500-byte Ethernet link the active MTU is 1024 and a longer
// datagram would not fit the link. PostSend refuses one byte more than
// the active MTU. A receive still takes a datagram longer than the local
// port's MTU (up to 4096) when it fits the receive WQE: rxe checks the
// payload of UD requests only against the receive buffer (check_length,
// IBA C9-92).
func TestUDDatagramBoundedByPortMTU(t *testing.T) {
	r := newDGRigMTU(t, QPTypeUD, conn.PipeConfig{}, MTU1024)
	ah, err := r.d.CreateAH(1, &AHAttr{Dest: r.from})
	require.NoError(t, err)
	sge := func(n uint32) []SGE { return []SGE{{Addr: r.mr.Addr() + 8192, Length: n, LKey: r.mr.LKey()}} }
	wr := SendWR{Opcode: WRSend, SGL: sge(1024), AH: ah, RemoteQPN: 0x11, RemoteQKey: dgQKey}
	_, err = r.qp.PostSend(wr)
	require.NoError(t, err, "1024 bytes: the active MTU")
	wr.SGL = sge(1025)
	_, err = r.qp.PostSend(wr)
	require.ErrorIs(t, err, ErrMsgSize, "1025 bytes on a port whose active MTU is 1024")

	r.postRecv(1, 0, 4096)
	payload := pattern(2048, 3)
	r.deliver(r.ud(dgQKey, 0x1234, payload, false))
	wcs := r.poll()
	var got []WC
	for _, wc := range wcs {
		if wc.Opcode == WCRecv {
			got = append(got, wc)
		}
	}
	require.Len(t, got, 1, "a 2048-byte datagram fits the 4096-byte receive WQE")
	require.Equal(t, uint32(GRHSize+2048), got[0].ByteLen)
	require.Equal(t, payload, r.mem[GRHSize:GRHSize+2048])
}

// TestUCLostPacketDropsMessage: UC drops a message with a lost packet
// whole (IBTA chapter 9, unreliable service; rxe check_psn for UC: after a PSN gap nothing is
// accepted until the next FIRST or ONLY), keeps its receive WQE for the
// next SEND, and sends nothing back.
func TestUCLostPacketDropsMessage(t *testing.T) {
	r := newDGRig(t, QPTypeUC, conn.PipeConfig{})
	r.postRecv(1, 0, 8192)
	r.postRecv(2, 8192, 8192)
	m1, m2 := pattern(4096, 1), pattern(3000, 2)
	r.deliver(r.uc(wire.OpSendFirst, 1000, m1[:1024], nil))
	// 1001, a MIDDLE, is lost.
	r.deliver(r.uc(wire.OpSendMiddle, 1002, m1[2048:3072], nil))
	r.deliver(r.uc(wire.OpSendLast, 1003, m1[3072:], nil))
	require.Empty(t, r.poll(), "the message is lost")
	require.Equal(t, uint64(2), r.drops(DropUCMessage), "the packets after the gap")
	r.deliver(r.uc(wire.OpSendFirst, 1004, m2[:1024], nil))
	r.deliver(r.uc(wire.OpSendMiddle, 1005, m2[1024:2048], nil))
	r.deliver(r.uc(wire.OpSendLast, 1006, m2[2048:], nil))
	wcs := r.poll()
	require.Len(t, wcs, 1)
	require.Equal(t, WC{WRID: 1, Status: WCSuccess, Opcode: WCRecv, ByteLen: 3000, QPN: uint32(r.qp.QPN()), SrcQP: uint32(r.peerQP)}, wcs[0],
		"the first receive WQE, reused (rxe class D1)")
	require.Equal(t, m2, r.mem[:3000])
	require.Equal(t, QPStateRTS, r.qp.State())
	require.Zero(t, r.d.conn.Stats().SentDatagrams.Load(), "UC never acknowledges")
	require.Zero(t, r.d.counters.NAKsSent.Load())
}

// TestUCResponderTable: one row per UC receive rule; each row delivers its
// packets, then an ONLY that must land, and checks the drops.
func TestUCResponderTable(t *testing.T) {
	mtu := make([]byte, 1024)
	type row struct {
		name  string
		pkts  func(r *dgRig) [][]byte
		drop  DropReason
		drops uint64
	}
	rows := []row{
		// Sequence: a message is accepted only whole and in order.
		{"MIDDLE without FIRST", func(r *dgRig) [][]byte { return [][]byte{r.uc(wire.OpSendMiddle, 1000, mtu, nil)} }, DropUCMessage, 1},
		{"LAST with a PSN gap", func(r *dgRig) [][]byte {
			return [][]byte{r.uc(wire.OpSendFirst, 1000, mtu, nil), r.uc(wire.OpSendLast, 1002, mtu[:10], nil)}
		}, DropUCMessage, 1},
		{"WRITE MIDDLE inside a SEND", func(r *dgRig) [][]byte {
			return [][]byte{r.uc(wire.OpSendFirst, 1000, mtu, nil), r.uc(wire.OpRDMAWriteMiddle, 1001, mtu, nil),
				r.uc(wire.OpSendLast, 1002, mtu[:4], nil)}
		}, DropUCMessage, 2},
		{"FIRST interrupting a message", func(r *dgRig) [][]byte {
			// The new FIRST starts over; the first message is lost, the
			// second completes in the same WQE (checked below by the
			// ONLY's landing in WQE 2).
			return [][]byte{r.uc(wire.OpSendFirst, 1000, mtu, nil), r.uc(wire.OpSendFirst, 1003, mtu, nil),
				r.uc(wire.OpSendLast, 1004, mtu[:4], nil)}
		}, DropUCMessage, 0},
		// Lengths and keys: dropped, the QP stays in RTS (class D).
		{"FIRST shorter than the MTU", func(r *dgRig) [][]byte {
			return [][]byte{r.uc(wire.OpSendFirst, 1000, mtu[:100], nil), r.uc(wire.OpSendLast, 1001, mtu[:4], nil)}
		}, DropLength, 1},
		{"SEND larger than the receive buffer", func(r *dgRig) [][]byte {
			return [][]byte{r.uc(wire.OpSendFirst, 1000, mtu, nil), r.uc(wire.OpSendMiddle, 1001, mtu, nil),
				r.uc(wire.OpSendLast, 1002, mtu[:4], nil)}
		}, DropRecvTooSmall, 1},
		// A LAST carries 1 to PMTU bytes: a requester ends a message
		// of a multiple of the PMTU with a full LAST and sends an empty
		// one as an ONLY (rxe check_length: "last packet zero or too
		// long", class D on UC). Without the check the empty LAST
		// completed the WRITE with immediate into WQE 1.
		{"SEND LAST without payload", func(r *dgRig) [][]byte {
			return [][]byte{r.uc(wire.OpSendFirst, 1000, mtu, nil), r.uc(wire.OpSendLast, 1001, nil, nil)}
		}, DropLength, 1},
		{"WRITE LAST with immediate without payload", func(r *dgRig) [][]byte {
			return [][]byte{r.uc(wire.OpRDMAWriteFirst, 1000, mtu, &wire.RETHFields{VA: r.mr.Addr() + 8192, RKey: r.mr.RKey(), DMALength: 1024}),
				r.uc(wire.OpRDMAWriteLastWithImmediate, 1001, nil, nil)}
		}, DropLength, 1},
		{"WRITE with a bad rkey", func(r *dgRig) [][]byte {
			return [][]byte{r.uc(wire.OpRDMAWriteOnly, 1000, mtu[:8], &wire.RETHFields{VA: r.mr.Addr(), RKey: r.mr.RKey() ^ 1, DMALength: 8})}
		}, DropAccess, 1},
		{"WRITE past the MR", func(r *dgRig) [][]byte {
			return [][]byte{r.uc(wire.OpRDMAWriteOnly, 1000, mtu[:64], &wire.RETHFields{VA: r.mr.Addr() + dgMem - 32, RKey: r.mr.RKey(), DMALength: 64})}
		}, DropAccess, 1},
	}
	for _, c := range rows {
		t.Run(c.name, func(t *testing.T) {
			r := newDGRig(t, QPTypeUC, conn.PipeConfig{})
			r.postRecv(1, 0, 2000)
			r.postRecv(2, 4096, 2000)
			for _, b := range c.pkts(r) {
				r.deliver(b)
			}
			require.Equal(t, c.drops, r.drops(c.drop), "drops %v", c.drop)
			require.Equal(t, QPStateRTS, r.qp.State())
			wcs := r.poll()
			if c.name == "FIRST interrupting a message" {
				require.Len(t, wcs, 1)
				require.Equal(t, uint32(1028), wcs[0].ByteLen)
			} else {
				require.Empty(t, wcs)
			}
			before := len(wcs)
			r.deliver(r.uc(wire.OpSendOnly, 2000, []byte("next"), nil))
			wcs = r.poll()
			require.Len(t, wcs, 1, "the next message lands")
			require.Equal(t, uint64(1+before), wcs[0].WRID)
			require.Equal(t, WCSuccess, wcs[0].Status)
			require.Equal(t, uint32(4), wcs[0].ByteLen)
			require.False(t, r.qp.resp.cur.Busy(), "no cursor left open")
		})
	}
}

// TestUCWriteWithImmediate: a three-packet UC WRITE with immediate places
// its data, consumes a receive WQE at the LAST and reports
// RECV_RDMA_WITH_IMM with the DMA length.
func TestUCWriteWithImmediate(t *testing.T) {
	r := newDGRig(t, QPTypeUC, conn.PipeConfig{})
	r.postRecv(7, 0, 16)
	data := pattern(2500, 4)
	reth := &wire.RETHFields{VA: r.mr.Addr() + 8192, RKey: r.mr.RKey(), DMALength: 2500}
	r.deliver(r.uc(wire.OpRDMAWriteFirst, 1000, data[:1024], reth))
	r.deliver(r.uc(wire.OpRDMAWriteMiddle, 1001, data[1024:2048], nil))
	r.deliver(r.uc(wire.OpRDMAWriteLastWithImmediate, 1002, data[2048:], nil))
	wcs := r.poll()
	require.Equal(t, []WC{{WRID: 7, Status: WCSuccess, Opcode: WCRecvRDMAWithImm, ByteLen: 2500, ImmData: 0xfeed,
		QPN: uint32(r.qp.QPN()), SrcQP: uint32(r.peerQP), Flags: WCWithImm}}, wcs)
	require.Equal(t, data, r.mem[8192:8192+2500])
}

// TestUCSendBuildsPackets: a UC SEND of 2.5 path MTUs leaves as UC
// SEND_FIRST, MIDDLE, LAST (0x20, 0x21, 0x22, as captures/uc_pingpong)
// with consecutive PSNs from sq_psn and AckReq never set, and completes
// without any answer; a READ is refused at post.
func TestUCSendBuildsPackets(t *testing.T) {
	r := newDGRig(t, QPTypeUC, conn.PipeConfig{})
	copy(r.mem, pattern(2560, 6))
	_, err := r.qp.PostSend(SendWR{WRID: 9, Opcode: WRSend, Flags: SendSignaled,
		SGL: []SGE{{Addr: r.mr.Addr(), Length: 2560, LKey: r.mr.LKey()}}})
	require.NoError(t, err)
	var p wire.Packet
	pkts := make([]conn.Packet, 3)
	var ops []wire.Opcode
	var data []byte
	for len(ops) < 3 {
		n, err := r.peer.Receive(pkts)
		require.NoError(t, err)
		for _, pk := range pkts[:n] {
			require.NoError(t, wire.Parse(pk.Buf, &p))
			require.Equal(t, wire.PSN(5000+len(ops)), p.PSN())
			require.False(t, p.BTH().AckReq())
			require.Equal(t, r.peerQP, p.BTH().DestQP())
			ops = append(ops, p.Opcode())
			data = append(data, p.Payload...)
		}
	}
	require.Equal(t, []wire.Opcode{0x20, 0x21, 0x22}, ops)
	require.Equal(t, r.mem[:2560], data)
	require.Equal(t, []WC{{WRID: 9, Status: WCSuccess, Opcode: WCSend, QPN: uint32(r.qp.QPN())}}, waitCQ(t, r.cq, 1))
	_, err = r.qp.PostSend(SendWR{Opcode: WRRDMARead, SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}})
	require.ErrorIs(t, err, ErrBadOpcode)
}

// TestModifyRequiredAttributesByType checks IBTA Table 91's required
// attributes for UC and UD (ib_modify_qp_is_ok): UD needs P_Key index,
// port and Q_Key at INIT, nothing at RTR, the SQ PSN at RTS; UC needs no
// READ/atomic or retry attributes.
func TestModifyRequiredAttributesByType(t *testing.T) {
	a, b := conn.NewPipe()
	t.Cleanup(func() { a.Close() })
	d, err := NewDevice(Config{Conn: b, Placement: placement.New(placement.Config{})})
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	cq := NewCQ(16)
	mk := func(typ QPType) *QP {
		qp, err := d.CreateQP(1, &QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: typ, Cap: Cap{MaxSendWR: 1, MaxRecvWR: 1}})
		require.NoError(t, err)
		return qp
	}
	ud := mk(QPTypeUD)
	err = ud.Modify(&QPAttr{State: QPStateInit, Port: 1}, QPAttrState|QPAttrPKeyIndex|QPAttrPort)
	require.ErrorIs(t, err, ErrBadAttr)
	require.ErrorContains(t, err, "IBV_QP_QKEY")
	require.NoError(t, ud.Modify(&QPAttr{State: QPStateInit, Port: 1, QKey: 5}, QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrQKey))
	require.NoError(t, ud.Modify(&QPAttr{State: QPStateRTR}, QPAttrState))
	err = ud.Modify(&QPAttr{State: QPStateRTS}, QPAttrState)
	require.ErrorContains(t, err, "IBV_QP_SQ_PSN")
	require.NoError(t, ud.Modify(&QPAttr{State: QPStateRTS, SQPSN: 1}, QPAttrState|QPAttrSQPSN))
	require.Equal(t, uint32(5), ud.Attr().QKey)

	uc := mk(QPTypeUC)
	require.NoError(t, uc.Modify(&QPAttr{State: QPStateInit, Port: 1}, QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags))
	err = uc.Modify(&QPAttr{State: QPStateRTR, Dest: a.LocalAddr(), PathMTU: MTU1024, DestQPN: 3},
		QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN)
	require.ErrorContains(t, err, "IBV_QP_RQ_PSN")
	require.NoError(t, uc.Modify(&QPAttr{State: QPStateRTR, Dest: a.LocalAddr(), PathMTU: MTU1024, DestQPN: 3},
		QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN))
	require.NoError(t, uc.Modify(&QPAttr{State: QPStateRTS, SQPSN: 1}, QPAttrState|QPAttrSQPSN))

	_, err = d.CreateQP(1, &QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: 9, Cap: Cap{MaxSendWR: 1}})
	require.ErrorIs(t, err, ErrBadAttr)
}

// TestUDDataPathAllocatesNothing: the demux and the UD responder (Q_Key,
// WQE, GRH, scatter, completion), and the UD requester, allocate nothing.
func TestUDDataPathAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r := newDGRig(t, QPTypeUD, conn.PipeConfig{})
	in := conn.Packet{Buf: r.ud(dgQKey, 0x1234, make([]byte, 1024), true), Addr: r.from, IP: conn.IPInfo{TTL: 64}}
	rwr := []RecvWR{{WRID: 1, SGL: []SGE{{Addr: r.mr.Addr(), Length: 2048, LKey: r.mr.LKey()}}}}
	wcs := make([]WC, 4)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := r.qp.PostRecv(rwr...); err != nil {
			t.Fatal(err)
		}
		r.d.handle(&in, &r.pkt)
		r.d.reader.Quiesce()
		if n, _ := r.cq.Poll(wcs); n != 1 || wcs[0].ByteLen != GRHSize+1024 {
			t.Fatalf("receive: %d %+v", n, wcs[0])
		}
	})
	require.Zero(t, allocs, "UD receive allocations per datagram")

	ah, err := r.d.CreateAH(1, &AHAttr{Dest: r.from})
	require.NoError(t, err)
	swr := []SendWR{{Opcode: WRSendWithImm, SGL: []SGE{{Addr: r.mr.Addr(), Length: 1024, LKey: r.mr.LKey()}},
		AH: ah, RemoteQPN: 0x11, RemoteQKey: dgQKey}}
	var b txBatch
	b.init(r.d)
	// The test runs the requester itself (marked as scheduled, the QP is
	// not kicked to the send worker), which sends the datagram and
	// completes the WR; the peer takes the datagram, which returns the
	// pipe's buffer.
	r.qp.scheduled.Store(true)
	pkts := make([]conn.Packet, 4)
	allocs = testing.AllocsPerRun(200, func() {
		if _, err := r.qp.PostSend(swr...); err != nil {
			t.Fatal(err)
		}
		r.qp.runRequester(&b)
		if n, err := r.peer.Receive(pkts); err != nil || n != 1 {
			t.Fatalf("datagram: %d %v", n, err)
		}
	})
	require.Zero(t, allocs, "UD requester allocations per datagram")
}
