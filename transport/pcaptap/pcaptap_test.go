package pcaptap_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/pcaptap"
	"github.com/softrdma/softrdma/transport/wire"
)

// roce builds a RoCE packet (BTH, optional RETH, payload, ICRC for the
// given addresses and IPv4 ID).
func roce(op wire.Opcode, psn uint32, payload int, src, dst netip.AddrPort, id uint16) []byte {
	hdr := wire.BTHSize
	if op == wire.OpRDMAWriteFirst || op == wire.OpRDMAWriteOnly {
		hdr += wire.RETHSize
	}
	b := make([]byte, hdr+payload+wire.ICRCSize)
	wire.BTH(b).Encode(&wire.BTHFields{Opcode: op, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: wire.PSN(psn), AckReq: op == wire.OpRDMAWriteOnly})
	if hdr > wire.BTHSize {
		wire.RETH(b[wire.BTHSize:]).Encode(&wire.RETHFields{VA: 0x1000, RKey: 0x1234, DMALength: uint32(payload)})
	}
	for i := hdr; i < hdr+payload; i++ {
		b[i] = byte(i)
	}
	wire.PutICRC(&wire.IPHeader{Src: src.Addr(), Dst: dst.Addr(), ID: id, DF: true}, src.Port(), dst.Port(), b)
	return b
}

type frame struct {
	src, dst netip.AddrPort
	id       uint16
	roce     []byte
}

var (
	a4 = netip.MustParseAddrPort("192.0.2.1:4791")
	b4 = netip.MustParseAddrPort("192.0.2.2:49441")
	a6 = netip.MustParseAddrPort("[2001:db8::1]:4791")
	b6 = netip.MustParseAddrPort("[2001:db8::2]:4791")
)

func testFrames() []frame {
	return []frame{
		{a4, b4, 0, roce(wire.OpRDMAWriteOnly, 1, 64, a4, b4, 0)},
		{a4, b4, 1, roce(wire.OpRDMAWriteFirst, 2, 1024, a4, b4, 1)},
		{a4, b4, 2, roce(wire.OpRDMAWriteMiddle, 3, 1024, a4, b4, 2)},
		{b4, a4, 0x1234, roce(wire.OpSendOnly, 7, 100, b4, a4, 0x1234)},
		{a6, b6, 0, roce(wire.OpSendOnly, 9, 4096, a6, b6, 0)},
	}
}

func writeFrames(t *testing.T, path string, frames []frame) {
	w, err := pcaptap.Create(path)
	require.NoError(t, err)
	for i, f := range frames {
		dir := conn.DirTx
		if i%2 == 1 {
			dir = conn.DirRx
		}
		w.Packet(dir, f.src, f.dst, f.id, f.roce)
	}
	require.NoError(t, w.Err())
	require.Equal(t, len(frames), w.Count())
	require.NoError(t, w.Close())
	require.NoError(t, w.Close())
	w.Packet(conn.DirTx, a4, b4, 0, frames[0].roce) // ignored after Close
}

func TestWriterDecodesWithGopacket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tap.pcap")
	frames := testFrames()
	writeFrames(t, path, frames)

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	require.NoError(t, err)
	require.Equal(t, layers.LinkTypeEthernet, r.LinkType())
	for i, want := range frames {
		data, ci, err := r.ReadPacketData()
		require.NoError(t, err, "frame %d", i)
		require.Equal(t, len(data), ci.Length)
		require.WithinDuration(t, time.Now(), ci.Timestamp, time.Minute)
		p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
		require.Nil(t, p.ErrorLayer(), "frame %d", i)
		udp := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		require.Equal(t, want.src.Port(), uint16(udp.SrcPort))
		require.Equal(t, want.dst.Port(), uint16(udp.DstPort))
		require.Equal(t, want.roce, udp.Payload)
		require.Equal(t, uint16(8+len(want.roce)), udp.Length)
		var h wire.IPHeader
		if ip, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
			require.Equal(t, layers.IPv4DontFragment, ip.Flags)
			require.Equal(t, uint8(64), ip.TTL)
			require.Equal(t, uint8(0), ip.TOS)
			require.Equal(t, want.id, ip.Id)
			require.Equal(t, want.src.Addr().AsSlice(), []byte(ip.SrcIP.To4()))
			require.Equal(t, want.dst.Addr().AsSlice(), []byte(ip.DstIP.To4()))
			require.Zero(t, udp.Checksum, "UDP checksum 0, as rxe")
			require.Equal(t, uint16(0xffff), onesSum(data[14:14+20]), "IPv4 header checksum")
			h = wire.IPHeader{Src: want.src.Addr(), Dst: want.dst.Addr(), ID: ip.Id, DF: true}
		} else {
			ip := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
			require.Equal(t, uint8(64), ip.HopLimit)
			require.Zero(t, ip.FlowLabel)
			require.Equal(t, want.src.Addr().AsSlice(), []byte(ip.SrcIP))
			// The UDP checksum is right: over the pseudo-header and the
			// datagram it sums to all ones.
			var ph []byte
			ph = append(ph, ip.SrcIP...)
			ph = append(ph, ip.DstIP...)
			ph = binary.BigEndian.AppendUint32(ph, uint32(udp.Length))
			ph = append(ph, 0, 0, 0, 17)
			ph = append(ph, data[14+40:]...)
			require.Equal(t, uint16(0xffff), onesSum(ph))
			h = wire.IPHeader{Src: want.src.Addr(), Dst: want.dst.Addr()}
		}
		// The ICRC in the capture verifies with the capture's headers.
		require.Equal(t, wire.PacketICRC(udp.Payload), wire.ComputeICRC(&h, uint16(udp.SrcPort), uint16(udp.DstPort), udp.Payload[:len(udp.Payload)-4]))
	}
}

func onesSum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// TestWriterTshark decodes the capture with Wireshark's dissectors: every
// frame must be eth:ethertype:ip(v6):udp:infiniband (plus :data for the
// payload), without malformed or expert-info flags.
func TestWriterTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (apt-get install -y tshark)")
	}
	path := filepath.Join(t.TempDir(), "tap.pcap")
	frames := testFrames()
	writeFrames(t, path, frames)
	out, err := exec.Command(tshark, "-r", path, "-T", "fields", "-E", "separator=|",
		"-e", "frame.protocols", "-e", "_ws.malformed", "-e", "_ws.expert", "-e", "infiniband.bth.opcode").Output()
	require.NoError(t, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, len(frames), "%s", out)
	for i, l := range lines {
		f := strings.Split(l, "|")
		require.Len(t, f, 4, l)
		ip := "ip"
		if frames[i].src.Addr().Is6() {
			ip = "ipv6"
		}
		// Wireshark shows the payload after the transport headers as
		// "data", as it does for rxe's own packets.
		require.Equal(t, "eth:ethertype:"+ip+":udp:infiniband", strings.TrimSuffix(f[0], ":data"), "frame %d", i)
		require.Empty(t, f[1], "frame %d malformed", i)
		require.Empty(t, f[2], "frame %d expert info", i)
		require.Equal(t, frames[i].roce[0], parseUint8(t, f[3]), "frame %d opcode", i)
	}
}

func parseUint8(t *testing.T, s string) byte {
	var v byte
	for _, c := range s {
		require.True(t, c >= '0' && c <= '9', s)
		v = v*10 + byte(c-'0')
	}
	return v
}

func TestWriterConcurrentUse(t *testing.T) {
	var buf bytes.Buffer
	w, err := pcaptap.NewWriter(&buf)
	require.NoError(t, err)
	p := roce(wire.OpSendOnly, 1, 200, a4, b4, 0)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				w.Packet(conn.DirTx, a4, b4, uint16(g), p)
			}
		}()
	}
	wg.Wait()
	require.NoError(t, w.Flush())
	require.Equal(t, 800, w.Count())
	r, err := pcapgo.NewReader(&buf)
	require.NoError(t, err)
	n := 0
	for {
		data, _, err := r.ReadPacketData()
		if err != nil {
			break
		}
		require.Len(t, data, 14+20+8+len(p))
		n++
	}
	require.Equal(t, 800, n)
}

// TestTapOnPipe records a pipe's traffic, both ends into one file, and
// reads it back: each datagram appears once as sent and once as received.
func TestTapOnPipe(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pipe.pcap")
	w, err := pcaptap.Create(path)
	require.NoError(t, err)
	a, b := conn.NewPipe()
	defer a.Close()
	defer b.Close()
	a.SetTap(w)
	b.SetTap(w)
	pkts := []conn.Packet{
		{Buf: roce(wire.OpRDMAWriteOnly, 1, 64, a.LocalAddr(), b.LocalAddr(), 0), Addr: b.LocalAddr()},
		{Buf: roce(wire.OpSendOnly, 2, 300, a.LocalAddr(), b.LocalAddr(), 0), Addr: b.LocalAddr()},
	}
	require.NoError(t, a.Send(pkts))
	rp := make([]conn.Packet, 4)
	for got := 0; got < len(pkts); {
		n, err := b.Receive(rp)
		require.NoError(t, err)
		got += n
	}
	require.NoError(t, w.Close())
	require.Equal(t, 4, w.Count())

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	require.NoError(t, err)
	for i := range 4 {
		data, _, err := r.ReadPacketData()
		require.NoError(t, err)
		p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
		udp := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		require.Equal(t, pkts[i%2].Buf, udp.Payload) // tx 0, tx 1, rx 0, rx 1
	}
}
