package layers_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/gopacket/gopacket"
	golayers "github.com/gopacket/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/layers"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// eui64 returns the EUI-64 of a MAC, the GUID rxe gives its device.
func eui64(mac net.HardwareAddr) uint64 {
	return uint64(mac[0]^0x02)<<56 | uint64(mac[1])<<48 | uint64(mac[2])<<40 | 0xff<<32 | 0xfe<<24 |
		uint64(mac[3])<<16 | uint64(mac[4])<<8 | uint64(mac[5])
}

// cmPacket is one decoded CM MAD of a golden capture.
type cmPacket struct {
	frame    frame
	src, dst netip.Addr
	mac      net.HardwareAddr
	mad      *layers.MAD
	cm       *layers.CM
	ipcm     *layers.IPCM
}

// connection is one REQ/REP/RTU exchange.
type connection struct {
	req, rep, rtu *cmPacket
}

// The CM MADs of the golden captures (rping and ib_send_bw -R between two
// rxe VMs) checked against what the rest of each capture and its INDEX.md
// say, without tshark:
//   - every UD SEND to QP1 decodes as MAD | CM, sent with the GSI Q_Key from
//     QP1, class CM version 2, method Send;
//   - REP and RTU carry the REQ's transaction ID and the communication IDs
//     of the two sides;
//   - the Local CA GUIDs are the EUI-64s of the senders' MACs, the primary
//     path's GIDs and the IP CM addresses are the IP header's, the service
//     ID is TCP port 7174 (rping's default) or 18515 (perftest's), the path
//     MTU is rxe's active_mtu 1024 (INDEX.md);
//   - the RC traffic that follows uses the QPNs and starting PSNs the REQ
//     and REP announced: the passive side sends from the REQ's Starting PSN
//     to the REQ's Local QPN, the active side from the REP's to the REP's;
//   - a DREQ names the receiver's QPN and communication IDs, its DREP
//     answers with the same transaction ID.
func TestGoldenCMConnections(t *testing.T) {
	layers.Register()
	var (
		cms   = map[string][]*cmPacket{} // by capture
		conns = map[string][]*connection{}
		rc    = map[string][]gopacket.Packet{}
	)
	for _, f := range captureFrames(t) {
		p := gopacket.NewPacket(f.data, golayers.LayerTypeEthernet, gopacket.Default)
		bth, ok := p.Layer(layers.LayerTypeBTH).(*layers.BTH)
		if !ok {
			continue
		}
		if bth.Opcode.Transport() == wire.OpRC {
			rc[f.capture] = append(rc[f.capture], p)
			continue
		}
		if bth.DestQP != mad.GSIQPN {
			continue
		}
		require.Equal(t, wire.OpUDSendOnly, bth.Opcode)
		deth := p.Layer(layers.LayerTypeDETH).(*layers.DETH)
		require.Equal(t, uint32(mad.GSIQKey), deth.QKey)
		require.Equal(t, wire.QPN(mad.GSIQPN), deth.SrcQP)
		m, ok := p.Layer(layers.LayerTypeMAD).(*layers.MAD)
		require.Truef(t, ok, "%s frame %d: a UD SEND to QP1 is a MAD", f.capture, f.n)
		require.Equal(t, mad.ClassCM, m.Class)
		require.Equal(t, uint8(mad.CMClassVersion), m.ClassVersion)
		require.Equal(t, mad.MethodSend, m.Method)
		require.Zero(t, m.Status)
		c, ok := p.Layer(layers.LayerTypeCM).(*layers.CM)
		require.True(t, ok, "%s frame %d", f.capture, f.n)
		require.Equal(t, m.AttributeID, c.Attribute)
		ip4 := p.Layer(golayers.LayerTypeIPv4).(*golayers.IPv4)
		cp := &cmPacket{frame: f, mad: m, cm: c,
			src: netip.AddrFrom4([4]byte(ip4.SrcIP.To4())), dst: netip.AddrFrom4([4]byte(ip4.DstIP.To4())),
			mac: p.Layer(golayers.LayerTypeEthernet).(*golayers.Ethernet).SrcMAC}
		cp.ipcm, _ = p.Layer(layers.LayerTypeIPCM).(*layers.IPCM)
		cms[f.capture] = append(cms[f.capture], cp)
	}
	require.Len(t, cms, 4, "rping and send_bw_rdmacm, two capture sets")

	for capture, list := range cms {
		port := map[bool]uint16{true: 7174, false: 18515}[strings.HasSuffix(capture, "/rping")]
		var open []*connection
		for _, cp := range list {
			c := cp.cm
			switch c.Attribute {
			case mad.AttrREQ:
				r := &c.REQ
				require.Equal(t, eui64(cp.mac), r.LocalCAGUID, "%s frame %d", capture, cp.frame.n)
				require.Equal(t, mad.IPServiceID(mad.PortSpaceTCP, port), r.ServiceID)
				require.Equal(t, cp.src, r.Primary.LocalGID.Unmap())
				require.Equal(t, cp.dst, r.Primary.RemoteGID.Unmap())
				require.Equal(t, uint16(0xffff), r.Primary.LocalLID, "permissive LID on RoCE")
				require.Equal(t, uint8(64), r.Primary.HopLimit, "rxe's TTL")
				require.Equal(t, uint16(wire.DefaultPKey), r.PKey)
				require.Equal(t, 1024, r.PathMTU.Bytes())
				require.Equal(t, mad.TransportRC, r.TransportServiceType)
				require.NotNil(t, cp.ipcm, "%s frame %d: IP CM header", capture, cp.frame.n)
				require.Equal(t, uint8(4), cp.ipcm.IPVersion)
				require.Equal(t, cp.src, cp.ipcm.SrcIP)
				require.Equal(t, cp.dst, cp.ipcm.DstIP)
				require.NotZero(t, cp.ipcm.SrcPort)
				open = append(open, &connection{req: cp})
			case mad.AttrREP:
				conn := findConn(open, func(c *connection) bool { return c.rep == nil && c.req.mad.TransactionID == cp.mad.TransactionID })
				require.NotNil(t, conn, "%s frame %d: REP without REQ", capture, cp.frame.n)
				require.Equal(t, conn.req.cm.REQ.LocalCommID, c.REP.RemoteCommID)
				require.Equal(t, eui64(cp.mac), c.REP.LocalCAGUID)
				require.Equal(t, conn.req.dst, cp.src)
				conn.rep = cp
			case mad.AttrRTU:
				conn := findConn(open, func(c *connection) bool {
					return c.rep != nil && c.rtu == nil && c.req.mad.TransactionID == cp.mad.TransactionID
				})
				require.NotNil(t, conn, "%s frame %d: RTU without REP", capture, cp.frame.n)
				require.Equal(t, conn.req.cm.REQ.LocalCommID, c.RTU.LocalCommID)
				require.Equal(t, conn.rep.cm.REP.LocalCommID, c.RTU.RemoteCommID)
				conn.rtu = cp
			case mad.AttrDREQ:
				conn := findConn(open, func(c *connection) bool {
					l, r := cp.cm.CommIDs()
					return c.rep != nil && l == c.req.cm.REQ.LocalCommID && r == c.rep.cm.REP.LocalCommID ||
						l == c.rep.cm.REP.LocalCommID && r == c.req.cm.REQ.LocalCommID
				})
				require.NotNil(t, conn, "%s frame %d: DREQ for no connection", capture, cp.frame.n)
				if cp.src == conn.req.src { // from the active side to the passive one
					require.Equal(t, conn.rep.cm.REP.LocalQPN, c.DREQ.RemoteQPN)
				} else {
					require.Equal(t, conn.req.cm.REQ.LocalQPN, c.DREQ.RemoteQPN)
				}
			case mad.AttrDREP:
				var dreq *cmPacket
				for _, o := range list {
					if o.cm.Attribute == mad.AttrDREQ && o.mad.TransactionID == cp.mad.TransactionID {
						dreq = o
					}
				}
				require.NotNil(t, dreq, "%s frame %d: DREP without DREQ", capture, cp.frame.n)
				require.Equal(t, dreq.src, cp.dst)
				require.Equal(t, dreq.cm.DREQ.LocalCommID, c.DREP.RemoteCommID)
				require.Equal(t, dreq.cm.DREQ.RemoteCommID, c.DREP.LocalCommID)
			default:
				t.Fatalf("%s frame %d: unexpected %v", capture, cp.frame.n, c.Attribute)
			}
		}
		for i, conn := range open {
			require.NotNil(t, conn.rtu, "%s: REQ, REP and RTU", capture)
			// Both sides send requests on rping's connection and on
			// perftest's first (its exchange); on perftest's second only
			// the client sends, the server ACKs.
			want := map[bool]int{true: 2, false: 1}[strings.HasSuffix(capture, "/rping") || i == 0]
			require.Equal(t, want, checkStartingPSNs(t, capture, conn, rc[capture]), "%s connection %d", capture, i)
		}
		conns[capture] = open
	}
	require.Len(t, conns["captures/rping"], 1)
	require.Len(t, conns["captures/send_bw_rdmacm"], 2)
	// ib_send_bw -R printed "QPN 0x0012" on both sides (INDEX.md): its
	// test QP is the second connection's.
	for _, set := range []string{"captures", "captures-trixie"} {
		second := conns[set+"/send_bw_rdmacm"][1]
		require.Equal(t, wire.QPN(0x12), second.req.cm.REQ.LocalQPN)
		require.Equal(t, wire.QPN(0x12), second.rep.cm.REP.LocalQPN)
	}
}

func findConn(open []*connection, match func(*connection) bool) *connection {
	for _, c := range open {
		if match(c) {
			return c
		}
	}
	return nil
}

// checkStartingPSNs checks that the first RC request each side of conn
// sends to the peer's QPN starts at the PSN the CM exchange announced, and
// returns for how many sides there is one.
func checkStartingPSNs(t *testing.T, capture string, conn *connection, rc []gopacket.Packet) int {
	t.Helper()
	sides := 0
	active, passive := conn.req.src, conn.req.dst
	req, rep := &conn.req.cm.REQ, &conn.rep.cm.REP
	for _, dir := range []struct {
		from, to netip.Addr
		qpn      wire.QPN
		psn      wire.PSN
	}{
		{passive, active, req.LocalQPN, req.StartingPSN},
		{active, passive, rep.LocalQPN, rep.StartingPSN},
	} {
		for _, p := range rc {
			ip4 := p.Layer(golayers.LayerTypeIPv4).(*golayers.IPv4)
			bth := p.Layer(layers.LayerTypeBTH).(*layers.BTH)
			if !ip4.SrcIP.Equal(dir.from.AsSlice()) || bth.DestQP != dir.qpn || bth.Opcode == wire.OpAcknowledge {
				continue
			}
			require.Equalf(t, dir.psn, bth.PSN, "%s: first request %v -> QPN %#x", capture, dir.from, dir.qpn)
			sides++
			break
		}
	}
	return sides
}

// The CM layers through a DecodingLayerParser: the same as NewPacket, and
// no allocation per packet.
func TestDecodingLayerParserCM(t *testing.T) {
	layers.Register()
	var (
		eth     golayers.Ethernet
		ip4     golayers.IPv4
		udp     golayers.UDP
		decoded = make([]gopacket.LayerType, 0, 16)
	)
	roce := layers.NewDecodingLayers()
	parser := gopacket.NewDecodingLayerParser(golayers.LayerTypeEthernet, &eth, &ip4, &udp)
	for _, l := range roce.Layers() {
		parser.AddDecodingLayer(l)
	}
	parser.IgnoreUnsupported = true
	var req []byte
	n := 0
	for _, f := range captureFrames(t) {
		if !strings.HasSuffix(f.capture, "/rping") && !strings.HasSuffix(f.capture, "/send_bw_rdmacm") {
			continue
		}
		require.NoError(t, parser.DecodeLayers(f.data, &decoded))
		if len(decoded) < 6 || decoded[5] != layers.LayerTypeMAD {
			continue
		}
		n++
		p := gopacket.NewPacket(f.data, golayers.LayerTypeEthernet, gopacket.Default)
		require.Equal(t, layerTypes(p), decoded)
		want := p.Layer(layers.LayerTypeCM).(*layers.CM)
		require.Equal(t, want.Attribute, roce.CM.Attribute)
		require.Equal(t, want.REQ, roce.CM.REQ)
		require.Equal(t, want.REP, roce.CM.REP)
		require.Equal(t, want.DREQ, roce.CM.DREQ)
		l, r := want.CommIDs()
		gl, gr := roce.CM.CommIDs()
		require.Equal(t, []uint32{l, r}, []uint32{gl, gr})
		if roce.CM.Attribute == mad.AttrREQ {
			require.Equal(t, *p.Layer(layers.LayerTypeIPCM).(*layers.IPCM), roce.IPCM)
			req = f.data
		} else {
			require.Zero(t, roce.CM.REQ, "fields of the previous message are cleared")
		}
	}
	require.Equal(t, 32, n, "5 + 5 + 10 + 12 CM MADs (INDEX.md: UD SEND_ONLY)")
	if raceEnabled {
		return
	}
	require.Zero(t, testing.AllocsPerRun(100, func() {
		if err := parser.DecodeLayers(req, &decoded); err != nil {
			panic(err)
		}
	}))
	require.Equal(t, mad.AttrREQ, roce.CM.Attribute)
}

// Serialize a REJ and an MRA (the captures have none) and decode them back.
func TestSerializeCMRoundTrip(t *testing.T) {
	layers.Register()
	for _, c := range []*layers.CM{
		{Attribute: mad.AttrREJ, REJ: mad.REJFields{LocalCommID: 1, RemoteCommID: 2, MessageRejected: mad.MsgREQ,
			Reason: mad.RejInvalidServiceID, ARI: []byte{}}},
		{Attribute: mad.AttrMRA, MRA: mad.MRAFields{LocalCommID: 3, RemoteCommID: 4, MessageMRAed: mad.MsgREP, ServiceTimeout: 17}},
	} {
		m := &layers.MAD{Class: mad.ClassCM, ClassVersion: mad.CMClassVersion, Method: mad.MethodSend,
			TransactionID: 0x1234, AttributeID: c.Attribute}
		bth := &layers.BTH{Opcode: wire.OpUDSendOnly, PKey: wire.DefaultPKey, DestQP: mad.GSIQPN, AckReq: true}
		deth := &layers.DETH{Opcode: wire.OpUDSendOnly, QKey: mad.GSIQKey, SrcQP: mad.GSIQPN}
		buf := gopacket.NewSerializeBuffer()
		require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true},
			bth, deth, m, c, gopacket.Payload("hello")))
		require.Len(t, buf.Bytes(), wire.BTHSize+wire.DETHSize+mad.Size+wire.ICRCSize)

		p := gopacket.NewPacket(buf.Bytes(), layers.LayerTypeBTH, gopacket.Default)
		require.Nil(t, p.ErrorLayer())
		require.Equal(t, []gopacket.LayerType{layers.LayerTypeBTH, layers.LayerTypeDETH, layers.LayerTypeMAD,
			layers.LayerTypeCM, gopacket.LayerTypePayload}, layerTypes(p))
		got := p.Layer(layers.LayerTypeCM).(*layers.CM)
		require.Equal(t, c.Attribute, got.Attribute)
		require.Equal(t, "hello", string(got.Payload[:5]), "private data, zero padded")
		require.Zero(t, got.Payload[5])
		switch c.Attribute {
		case mad.AttrREJ:
			got.REJ.PrivateData = nil
			require.Equal(t, c.REJ, got.REJ)
		case mad.AttrMRA:
			got.MRA.PrivateData = nil
			require.Equal(t, c.MRA, got.MRA)
		}
	}

	// Too much private data, an unknown attribute, a CM without its MAD.
	buf := gopacket.NewSerializeBuffer()
	require.Error(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{},
		&layers.CM{Attribute: mad.AttrRTU}, gopacket.Payload(make([]byte, 225))))
	require.Error(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, &layers.CM{Attribute: mad.AttrLAP}))
	p := gopacket.NewPacket(make([]byte, mad.DataSize), layers.LayerTypeCM, gopacket.Default)
	require.NotNil(t, p.ErrorLayer())
}

// A UD SEND to QP1 that is not a MAD (wrong length or base version), or a
// MAD to another QP, stays payload; a MAD of another class stops at MAD.
func TestMADDetection(t *testing.T) {
	layers.Register()
	build := func(destQP wire.QPN, payload []byte) gopacket.Packet {
		buf := gopacket.NewSerializeBuffer()
		require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true},
			&layers.BTH{Opcode: wire.OpUDSendOnly, PKey: wire.DefaultPKey, DestQP: destQP},
			&layers.DETH{QKey: mad.GSIQKey, SrcQP: 1}, gopacket.Payload(payload)))
		return gopacket.NewPacket(buf.Bytes(), layers.LayerTypeBTH, gopacket.Default)
	}
	cm := make([]byte, mad.Size)
	copy(cm, []byte{1, 7, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0x14})
	sa := make([]byte, mad.Size)
	copy(sa, []byte{1, 3, 2, 0x81})
	v0 := make([]byte, mad.Size)
	pay := gopacket.LayerTypePayload
	for _, tc := range []struct {
		name   string
		destQP wire.QPN
		b      []byte
		want   []gopacket.LayerType
	}{
		{"CM RTU to QP1", 1, cm, []gopacket.LayerType{layers.LayerTypeMAD, layers.LayerTypeCM, pay}},
		{"SA GetResp to QP1", 1, sa, []gopacket.LayerType{layers.LayerTypeMAD, pay}},
		{"CM RTU to QP 0x11", 0x11, cm, []gopacket.LayerType{pay}},
		{"base version 0", 1, v0, []gopacket.LayerType{pay}},
		{"255 bytes", 1, cm[:255], []gopacket.LayerType{pay}},
		{"257 bytes", 1, append(cm, 0), []gopacket.LayerType{pay}},
	} {
		p := build(tc.destQP, tc.b)
		require.Nil(t, p.ErrorLayer(), tc.name)
		require.Equal(t, append([]gopacket.LayerType{layers.LayerTypeBTH, layers.LayerTypeDETH}, tc.want...), layerTypes(p), tc.name)
	}
}
