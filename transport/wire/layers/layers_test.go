package layers_test

import (
	"bufio"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gopacket/gopacket"
	golayers "github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/layers"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// testbedDir is shared/rxe-testbed relative to this package (the repo sits
// beside shared/).
const testbedDir = "../../../../shared/rxe-testbed"

// knownBadICRC: frames whose ICRC the host peer corrupted on purpose (see
// transport/wire golden_test.go).
var knownBadICRC = map[string][]int{
	"hostpeer_bad_icrc":      {16, 17},
	"hostpeer_ipid_mismatch": {16, 17},
}

type frame struct {
	capture string // "captures/write_bw"
	name    string
	n       int // 1-based frame number
	data    []byte
}

// captureFrames returns every frame of every golden capture, or skips.
func captureFrames(t *testing.T) []frame {
	t.Helper()
	var out []frame
	for _, set := range []string{"captures", "captures-trixie"} {
		files, err := filepath.Glob(filepath.Join(testbedDir, set, "*.pcap"))
		require.NoError(t, err)
		if len(files) == 0 {
			t.Skipf("golden rxe captures not found in %s; they live in shared/rxe-testbed beside the repo", filepath.Join(testbedDir, set))
		}
		for _, file := range files {
			f, err := os.Open(file)
			require.NoError(t, err)
			r, err := pcapgo.NewReader(bufio.NewReader(f))
			require.NoError(t, err)
			require.Equal(t, golayers.LinkTypeEthernet, r.LinkType())
			name := strings.TrimSuffix(filepath.Base(file), ".pcap")
			for n := 1; ; n++ {
				data, _, err := r.ReadPacketData()
				if err == io.EOF {
					break
				}
				require.NoError(t, err)
				out = append(out, frame{set + "/" + name, name, n, data})
			}
			f.Close()
		}
	}
	return out
}

func layerTypes(p gopacket.Packet) []gopacket.LayerType {
	var ts []gopacket.LayerType
	for _, l := range p.Layers() {
		ts = append(ts, l.LayerType())
	}
	return ts
}

func TestRegister(t *testing.T) {
	layers.Register()
	layers.Register() // idempotent
	require.Equal(t, "BTH", layers.LayerTypeBTH.String())
	require.Equal(t, "RETH", layers.LayerTypeRETH.String())
	require.Equal(t, "AtomicAckETH", layers.LayerTypeAtomicAckETH.String())
	require.Equal(t, layers.LayerTypeBTH, golayers.UDPPort(wire.RoCEv2Port).LayerType())
	for _, lt := range []gopacket.LayerType{
		layers.LayerTypeBTH, layers.LayerTypeDETH, layers.LayerTypeRETH, layers.LayerTypeAtomicETH,
		layers.LayerTypeAETH, layers.LayerTypeAtomicAckETH, layers.LayerTypeImmDt, layers.LayerTypeIETH,
	} {
		require.GreaterOrEqual(t, int(lt), 1000)
		require.Less(t, int(lt), 2000)
	}
}

// Every RoCEv2 frame of every golden capture decodes with gopacket.NewPacket
// into Ethernet, IP, UDP, BTH and the extension headers of its opcode, and
// agrees with wire.Parse.
func TestDecodeGoldenCaptures(t *testing.T) {
	layers.Register()
	var wp wire.Packet
	seen := map[string][]gopacket.LayerType{}
	roce := 0
	for _, f := range captureFrames(t) {
		p := gopacket.NewPacket(f.data, golayers.LayerTypeEthernet, gopacket.Default)
		udp, _ := p.Layer(golayers.LayerTypeUDP).(*golayers.UDP)
		if udp == nil || udp.DstPort != wire.RoCEv2Port {
			continue
		}
		roce++
		require.Nilf(t, p.ErrorLayer(), "%s frame %d: %v", f.capture, f.n, p.ErrorLayer())
		bth, ok := p.Layer(layers.LayerTypeBTH).(*layers.BTH)
		require.Truef(t, ok, "%s frame %d: %v", f.capture, f.n, layerTypes(p))

		// The layer sequence is the opcode's header chain.
		require.NoError(t, wire.Parse(udp.Payload, &wp))
		info := wire.Info(bth.Opcode)
		want := []gopacket.LayerType{golayers.LayerTypeEthernet, p.NetworkLayer().LayerType(), golayers.LayerTypeUDP, layers.LayerTypeBTH}
		for _, hl := range []struct {
			m  wire.Mask
			lt gopacket.LayerType
		}{
			{wire.MaskDETH, layers.LayerTypeDETH}, {wire.MaskRETH, layers.LayerTypeRETH},
			{wire.MaskAtomicETH, layers.LayerTypeAtomicETH}, {wire.MaskAETH, layers.LayerTypeAETH},
			{wire.MaskAtomicAckETH, layers.LayerTypeAtomicAckETH}, {wire.MaskImmDt, layers.LayerTypeImmDt},
			{wire.MaskIETH, layers.LayerTypeIETH},
		} {
			if info.Has(hl.m) {
				want = append(want, hl.lt)
			}
		}
		switch m, _ := p.Layer(layers.LayerTypeMAD).(*layers.MAD); {
		case m != nil:
			// A MAD to QP1: header, CM message, IP CM header (REQ), and the
			// private data as payload. All of it is the UD payload.
			want = append(want, layers.LayerTypeMAD, layers.LayerTypeCM)
			if m.AttributeID == mad.AttrREQ {
				want = append(want, layers.LayerTypeIPCM)
			}
			want = append(want, gopacket.LayerTypePayload)
			require.Equal(t, wp.Payload, append(m.LayerContents(), m.LayerPayload()...))
		case len(wp.Payload) > 0:
			want = append(want, gopacket.LayerTypePayload)
			require.Equal(t, wp.Payload, p.ApplicationLayer().Payload())
		}
		require.Equalf(t, want, layerTypes(p), "%s frame %d (%s)", f.capture, f.n, bth.Opcode)
		key := bth.Opcode.String()
		if m, ok := p.Layer(layers.LayerTypeMAD).(*layers.MAD); ok {
			key += " " + m.AttributeID.String()
		}
		seen[key] = want[3:]

		// Fields agree with the wire views; the ICRC is the trailer.
		require.Equal(t, wp.Opcode(), bth.Opcode)
		require.Equal(t, wp.PSN(), bth.PSN)
		require.Equal(t, wp.BTH().DestQP(), bth.DestQP)
		require.Equal(t, wp.BTH().AckReq(), bth.AckReq)
		require.Equal(t, wp.ICRC(), bth.ICRC)
		require.Equal(t, wp.PadCount(), int(bth.PadCount))
		require.Same(t, wp.Info, bth.Packet().Info)
		if r, ok := p.Layer(layers.LayerTypeRETH).(*layers.RETH); ok {
			require.Equal(t, wp.RETH().VA(), r.VA)
			require.Equal(t, wp.RETH().RKey(), r.RKey)
			require.Equal(t, wp.RETH().DMALength(), r.DMALength)
		}
		if a, ok := p.Layer(layers.LayerTypeAETH).(*layers.AETH); ok {
			require.Equal(t, wp.AETH().Syndrome(), a.Syndrome)
			require.Equal(t, wp.AETH().MSN(), a.MSN)
		}
		if d, ok := p.Layer(layers.LayerTypeDETH).(*layers.DETH); ok {
			require.Equal(t, wp.DETH().QKey(), d.QKey)
			require.Equal(t, wp.DETH().SrcQP(), d.SrcQP)
		}

		valid, err := bth.ICRCValid(p.NetworkLayer(), udp)
		require.NoError(t, err)
		require.Equalf(t, !slices.Contains(knownBadICRC[f.name], f.n), valid, "%s frame %d", f.capture, f.n)
		require.NotEmpty(t, p.String())
	}
	require.Greater(t, roce, 5000)

	// A few known packets, spelled out.
	pay := gopacket.LayerTypePayload
	for op, want := range map[string][]gopacket.LayerType{
		"RC_RDMA_WRITE_FIRST":               {layers.LayerTypeBTH, layers.LayerTypeRETH, pay},
		"RC_RDMA_WRITE_MIDDLE":              {layers.LayerTypeBTH, pay},
		"RC_RDMA_WRITE_LAST_WITH_IMMEDIATE": {layers.LayerTypeBTH, layers.LayerTypeImmDt, pay},
		"RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE": {layers.LayerTypeBTH, layers.LayerTypeRETH, layers.LayerTypeImmDt},
		"RC_RDMA_READ_REQUEST":              {layers.LayerTypeBTH, layers.LayerTypeRETH},
		"RC_RDMA_READ_RESPONSE_FIRST":       {layers.LayerTypeBTH, layers.LayerTypeAETH, pay},
		"RC_RDMA_READ_RESPONSE_MIDDLE":      {layers.LayerTypeBTH, pay},
		"RC_ACKNOWLEDGE":                    {layers.LayerTypeBTH, layers.LayerTypeAETH},
		"RC_COMPARE_SWAP":                   {layers.LayerTypeBTH, layers.LayerTypeAtomicETH},
		"RC_FETCH_ADD":                      {layers.LayerTypeBTH, layers.LayerTypeAtomicETH},
		"RC_ATOMIC_ACKNOWLEDGE":             {layers.LayerTypeBTH, layers.LayerTypeAETH, layers.LayerTypeAtomicAckETH},
		"RC_SEND_ONLY_WITH_IMMEDIATE":       {layers.LayerTypeBTH, layers.LayerTypeImmDt, pay},
		"UD_SEND_ONLY":                      {layers.LayerTypeBTH, layers.LayerTypeDETH, pay},
		"UD_SEND_ONLY REQ":                  {layers.LayerTypeBTH, layers.LayerTypeDETH, layers.LayerTypeMAD, layers.LayerTypeCM, layers.LayerTypeIPCM, pay},
		"UD_SEND_ONLY DREP":                 {layers.LayerTypeBTH, layers.LayerTypeDETH, layers.LayerTypeMAD, layers.LayerTypeCM, pay},
		"UC_SEND_FIRST":                     {layers.LayerTypeBTH, pay},
	} {
		require.Equal(t, want, seen[op], op)
	}
}

// DecodingLayerParser with NewDecodingLayers gives the same layers as
// gopacket.NewPacket, without allocating per packet.
func TestDecodingLayerParser(t *testing.T) {
	layers.Register()
	var (
		eth     golayers.Ethernet
		ip4     golayers.IPv4
		ip6     golayers.IPv6
		udp     golayers.UDP
		decoded []gopacket.LayerType
	)
	roce := layers.NewDecodingLayers()
	parser := gopacket.NewDecodingLayerParser(golayers.LayerTypeEthernet, &eth, &ip4, &ip6, &udp)
	for _, l := range roce.Layers() {
		parser.AddDecodingLayer(l)
	}
	parser.IgnoreUnsupported = true // TCP, ARP
	n := 0
	for _, f := range captureFrames(t) {
		require.NoError(t, parser.DecodeLayers(f.data, &decoded))
		if !slices.Contains(decoded, layers.LayerTypeBTH) {
			continue
		}
		n++
		p := gopacket.NewPacket(f.data, golayers.LayerTypeEthernet, gopacket.Default)
		require.Equalf(t, layerTypes(p), decoded, "%s frame %d", f.capture, f.n)
		require.Equal(t, p.Layer(layers.LayerTypeBTH).(*layers.BTH).PSN, roce.BTH.PSN)
		require.Equal(t, roce.BTH.Packet().Opcode(), roce.BTH.Opcode)
		if slices.Contains(decoded, layers.LayerTypeRETH) {
			require.Equal(t, p.Layer(layers.LayerTypeRETH).(*layers.RETH).VA, roce.RETH.VA)
			require.Equal(t, roce.BTH.Opcode, roce.RETH.Opcode)
		}
	}
	require.Greater(t, n, 5000)
}

func TestDecodingLayerParserAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful with -race")
	}
	layers.Register()
	// An RDMA WRITE First with 1 KiB, as rxe sends it.
	ip4 := &golayers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: golayers.IPProtocolUDP,
		Flags: golayers.IPv4DontFragment, Id: 0x22e4, SrcIP: vm1, DstIP: vm0}
	udp := &golayers.UDP{SrcPort: 49441, DstPort: wire.RoCEv2Port}
	bth := &layers.BTH{Opcode: wire.OpRDMAWriteFirst, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: 1910106}
	require.NoError(t, bth.SetNetworkLayerForICRC(ip4, udp))
	require.NoError(t, udp.SetNetworkLayerForChecksum(ip4))
	buf := gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		&golayers.Ethernet{SrcMAC: net.HardwareAddr{0x52, 0x54, 0, 0x77, 0, 0x0b}, DstMAC: net.HardwareAddr{0x52, 0x54, 0, 0x77, 0, 0x0a},
			EthernetType: golayers.EthernetTypeIPv4},
		ip4, udp, bth, &layers.RETH{VA: 0x55bd720e2000, RKey: 0x226, DMALength: 8192}, gopacket.Payload(make([]byte, 1024))))
	data := buf.Bytes()

	var (
		eth     golayers.Ethernet
		dip4    golayers.IPv4
		dudp    golayers.UDP
		decoded = make([]gopacket.LayerType, 0, 16)
	)
	roce := layers.NewDecodingLayers()
	parser := gopacket.NewDecodingLayerParser(golayers.LayerTypeEthernet, &eth, &dip4, &dudp)
	for _, l := range roce.Layers() {
		parser.AddDecodingLayer(l)
	}
	require.NoError(t, parser.DecodeLayers(data, &decoded))
	require.Equal(t, []gopacket.LayerType{golayers.LayerTypeEthernet, golayers.LayerTypeIPv4, golayers.LayerTypeUDP,
		layers.LayerTypeBTH, layers.LayerTypeRETH, gopacket.LayerTypePayload}, decoded)
	require.Equal(t, uint32(8192), roce.RETH.DMALength)
	require.Zero(t, testing.AllocsPerRun(100, func() {
		if err := parser.DecodeLayers(data, &decoded); err != nil {
			panic(err)
		}
	}))
}

func TestDecodeTruncated(t *testing.T) {
	layers.Register()
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"half a BTH", []byte{0x06, 0, 0xff, 0xff, 0, 0}},
		{"WRITE_FIRST without RETH", append([]byte{0x06, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1}, 1, 2, 3, 4, 5, 6)},
	} {
		var b layers.BTH
		df := &feedback{}
		require.Error(t, b.DecodeFromBytes(tc.b, df), tc.name)
		require.True(t, df.truncated, tc.name)
		var r layers.RETH
		df = &feedback{}
		require.Error(t, r.DecodeFromBytes(tc.b[:min(len(tc.b), wire.RETHSize-1)], df), tc.name)
		require.True(t, df.truncated, tc.name)
	}
	// Bad TVer is an error, not truncation.
	var b layers.BTH
	df := &feedback{}
	require.Error(t, b.DecodeFromBytes([]byte{0x04, 0x01, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1, 0, 0, 0, 0}, df))
	require.False(t, df.truncated)

	// Through NewPacket, truncation is flagged in the metadata.
	p := gopacket.NewPacket([]byte{0x06, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1, 0, 0, 0, 0}, layers.LayerTypeBTH, gopacket.Default)
	require.NotNil(t, p.ErrorLayer())
	require.True(t, p.Metadata().Truncated)
}

func TestDecodeUnknownOpcode(t *testing.T) {
	layers.Register()
	// A CNP (opcode 0x81): BTH, 16 reserved bytes, ICRC.
	data := make([]byte, 12+16+4)
	data[0], data[2], data[3], data[7] = 0x81, 0xff, 0xff, 0x11
	p := gopacket.NewPacket(data, layers.LayerTypeBTH, gopacket.Default)
	require.Nil(t, p.ErrorLayer())
	require.Equal(t, []gopacket.LayerType{layers.LayerTypeBTH, gopacket.LayerTypePayload}, layerTypes(p))
	bth := p.Layer(layers.LayerTypeBTH).(*layers.BTH)
	require.Equal(t, wire.Opcode(0x81), bth.Opcode)
	require.Len(t, bth.Payload, 16)
	require.Nil(t, bth.Packet().Info)
}

func TestDecodeStandaloneHeader(t *testing.T) {
	layers.Register()
	data := []byte{0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x02, 0x26, 0, 0, 0x20, 0, 0xaa, 0xbb}
	p := gopacket.NewPacket(data, layers.LayerTypeRETH, gopacket.Default)
	require.Nil(t, p.ErrorLayer())
	require.Equal(t, []gopacket.LayerType{layers.LayerTypeRETH, gopacket.LayerTypePayload}, layerTypes(p))
	r := p.Layer(layers.LayerTypeRETH).(*layers.RETH)
	require.Equal(t, uint64(0x1000), r.VA)
	require.Equal(t, uint32(0x226), r.RKey)
	require.Equal(t, uint32(8192), r.DMALength)
}

type feedback struct{ truncated bool }

func (f *feedback) SetTruncated() { f.truncated = true }

var (
	vm0 = net.IPv4(192, 168, 77, 10).To4()
	vm1 = net.IPv4(192, 168, 77, 11).To4()
)
