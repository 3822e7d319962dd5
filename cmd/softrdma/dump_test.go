package main

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	golayers "github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/pcaptap"
	"github.com/softrdma/softrdma/transport/wire"
)

// testbedDir is shared/rxe-testbed, beside the repository.
const testbedDir = "../../../shared/rxe-testbed"

// capturePath returns the path of a golden capture, or skips the test.
func capturePath(t *testing.T, set, name string) string {
	t.Helper()
	p := filepath.Join(testbedDir, set, name+".pcap")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("golden rxe captures not found (%v); they live in shared/rxe-testbed beside the repo", err)
	}
	return p
}

// dumpLines runs `softrdma dump args...` and returns its packet lines by
// frame number and its summary line.
func dumpLines(t *testing.T, args ...string) (map[int]string, string) {
	t.Helper()
	code, out, stderr := runCLI(t, append([]string{"dump"}, args...)...)
	require.Equal(t, exitOK, code, stderr)
	lines := map[int]string{}
	summary := ""
	for line := range strings.Lines(out) {
		line = strings.TrimSuffix(line, "\n")
		if strings.HasPrefix(line, "# ") {
			summary = line
			continue
		}
		n, err := strconv.Atoi(strings.Fields(line)[0])
		require.NoError(t, err, line)
		lines[n] = line
	}
	return lines, summary
}

// The lines of rping.pcap, checked against the capture: the full tshark
// decode of the frames (values in the comments, from `tshark -V`), the
// frame numbers and times of tshark's one-line decode in logs/rping.txt,
// and the packet and ICRC counts of INDEX.md.
func TestDumpRping(t *testing.T) {
	lines, summary := dumpLines(t, capturePath(t, "captures", "rping"))

	// INDEX.md: | rping | 43 | 41 | 41/0 | ...
	assert.Equal(t, "# 43 frames, 41 RoCEv2 packets, ICRC 41 ok, 0 bad", summary)
	assert.Len(t, lines, 41)

	for n, want := range map[int]string{
		// Frame 3, CM ConnectRequest: UDP 55410 -> 4791; BTH UD SEND only,
		// Destination Queue Pair 0x000001, Acknowledge Request True, PSN 0;
		// DETH Queue Key 0x80010000, Source Queue Pair 0x00000001; MAD
		// class 0x07 Send(), Transaction ID 0x000000029bcc2966, Attribute ID
		// 0x0010; Local Communication ID 0x6629cc9b, ServiceID protocol
		// 0x06 port 0x1c06, Local QPN 0x000011, Starting PSN 0x41efb3,
		// Transport Service Type 0, Path Packet Payload MTU 3, Responder
		// Resources 1, Initiator Depth 1, Retry Count 7, RNR Retry Count 7,
		// Primary Local ACK Timeout 0x13, Remote CM Response Timeout 0x14,
		// GIDs 192.168.77.11 and .10; IP CM IP Version 4, Source Port
		// 0xa8d7, Source IP 192.168.77.11, Destination IP 192.168.77.10.
		3: "3 0.038987 192.168.77.11:55410 -> 192.168.77.10:4791 UD_SEND_ONLY qpn=0x000001 psn=0x000000 ackreq=1 " +
			"DETH[qkey=0x80010000 srcqp=0x000001] MAD[CM/Send REQ tid=0x000000029bcc2966] " +
			"REQ[lcid=0x6629cc9b sid=tcp:7174 qpn=0x000011 psn=0x41efb3 RC mtu=1024 resp_res=1 init_depth=1 " +
			"retry=7 rnr_retry=7 ack_timeout=19 cm_timeout=20 gid=::ffff:192.168.77.11 -> ::ffff:192.168.77.10] " +
			"IPCM[v4 192.168.77.11:43223 -> 192.168.77.10:7174] payload=256 icrc=ok",
		// Frame 4, CM ConnectReply: Local Communication ID 0xea885c77,
		// Remote 0x6629cc9b, Local QPN 0x000011, Starting PSN 0x142214,
		// Responder Resources 1, Initiator Depth 1, RNR Retry Count 7.
		4: "4 0.083115 192.168.77.10:55410 -> 192.168.77.11:4791 UD_SEND_ONLY qpn=0x000001 psn=0x000000 ackreq=1 " +
			"DETH[qkey=0x80010000 srcqp=0x000001] MAD[CM/Send REP tid=0x000000029bcc2966] " +
			"REP[lcid=0xea885c77 rcid=0x6629cc9b qpn=0x000011 psn=0x142214 resp_res=1 init_depth=1 rnr_retry=7] " +
			"payload=256 icrc=ok",
		// Frame 8: RC RDMA READ Request, Destination Queue Pair 0x000011,
		// Acknowledge Request True, PSN 4321203 (0x41efb3, the REQ's
		// Starting PSN), Virtual Address 0x000055d72c4ecd50, Remote Key
		// 0x000005d0, DMA Length 64.
		8: "8 0.102340 192.168.77.10:52765 -> 192.168.77.11:4791 RC_RDMA_READ_REQUEST qpn=0x000011 psn=0x41efb3 ackreq=1 " +
			"RETH[va=0x55d72c4ecd50 rkey=0x000005d0 len=64] icrc=ok",
		// Frame 9: RC RDMA READ response Only, PSN 4321203, Acknowledge
		// Request False, Syndrome 31 (Ack), Message Sequence Number 1,
		// Data (64 bytes).
		9: "9 0.106735 192.168.77.11:52765 -> 192.168.77.10:4791 RC_RDMA_READ_RESPONSE_ONLY qpn=0x000011 psn=0x41efb3 ackreq=0 " +
			"AETH[ACK(0x1f) msn=1] payload=64 icrc=ok",
		// Frame 43, CM DisconnectReply: Local Communication ID 0xea885c77,
		// Remote 0x6629cc9b; the server's second MAD (PSN 1).
		43: "43 0.141096 192.168.77.10:55410 -> 192.168.77.11:4791 UD_SEND_ONLY qpn=0x000001 psn=0x000001 ackreq=1 " +
			"DETH[qkey=0x80010000 srcqp=0x000001] MAD[CM/Send DREP tid=0x000000029bcc2966] " +
			"DREP[lcid=0xea885c77 rcid=0x6629cc9b] payload=256 icrc=ok",
	} {
		assert.Equal(t, want, lines[n], "frame %d", n)
	}

	// Frame numbers and times as tshark's one-line decode (logs/rping.txt:
	// "    3   0.038987   LID: 65535 → 192.168.77.10 RRoCE 322 CM: ...").
	f, err := os.Open(filepath.Join(testbedDir, "captures", "logs", "rping.txt"))
	require.NoError(t, err)
	defer f.Close()
	row := regexp.MustCompile(`^\s*(\d+)\s+(\d+\.\d{6})\s.*\sRRoCE\s`)
	seen := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := row.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[1])
		require.Contains(t, lines, n, "tshark's RRoCE frame %d", n)
		assert.Equal(t, m[2], strings.Fields(lines[n])[1], "frame %d time", n)
		seen++
	}
	require.Equal(t, 41, seen)

	// --all adds the two ARP frames of the 43.
	all, _ := dumpLines(t, "--all", capturePath(t, "captures", "rping"))
	require.Len(t, all, 43)
	assert.Equal(t, "1 0.000000 Ethernet/ARP len=42", all[1])
}

// hostpeer_bad_icrc: the host peer XOR-ed the ICRC of frames 16 and 17
// with 0xdeadbeef (INDEX.md: 8 RoCEv2 packets, ICRC 6 ok / 2 bad).
func TestDumpBadICRC(t *testing.T) {
	lines, summary := dumpLines(t, capturePath(t, "captures", "hostpeer_bad_icrc"))
	assert.Equal(t, "# 23 frames, 8 RoCEv2 packets, ICRC 6 ok, 2 bad", summary)
	for n, line := range lines {
		bad := n == 16 || n == 17
		assert.Equal(t, bad, strings.Contains(line, " icrc=BAD("), line)
		assert.Equal(t, !bad, strings.HasSuffix(line, " icrc=ok"), line)
	}
	// The stored trailer is the right one XOR 0xdeadbeef (as read
	// little-endian; shown big-endian like Wireshark's "Invariant CRC").
	m := regexp.MustCompile(`icrc=BAD\(have 0x([0-9a-f]{8}), want 0x([0-9a-f]{8})\)`).FindStringSubmatch(lines[16])
	require.NotNil(t, m, lines[16])
	have, _ := strconv.ParseUint(m[1], 16, 32)
	want, _ := strconv.ParseUint(m[2], 16, 32)
	assert.Equal(t, uint64(0xefbeadde), have^want)
}

// A pcapng of the same frames prints the same lines.
func TestDumpPcapng(t *testing.T) {
	src := capturePath(t, "captures", "rping")
	f, err := os.Open(src)
	require.NoError(t, err)
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	require.NoError(t, err)
	ng := filepath.Join(t.TempDir(), "rping.pcapng")
	out, err := os.Create(ng)
	require.NoError(t, err)
	w, err := pcapgo.NewNgWriter(out, r.LinkType())
	require.NoError(t, err)
	for {
		data, ci, err := r.ReadPacketData()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		require.NoError(t, w.WritePacket(ci, data))
	}
	require.NoError(t, w.Flush())
	require.NoError(t, out.Close())

	_, want, _ := runCLI(t, "dump", src)
	code, got, stderr := runCLI(t, "dump", ng)
	require.Equal(t, exitOK, code, stderr)
	require.Equal(t, want, got)
}

// Every line of the UC, UD and CM captures carries the opcode, QPN, PSN
// and AckReq that tshark decodes from the same frame.
func TestDumpMatchesTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed")
	}
	field := regexp.MustCompile(`^(\d+) \S+ \S+ -> \S+ (\S+) qpn=0x([0-9a-f]{6}) psn=0x([0-9a-f]{6}) ackreq=([01])`)
	for _, name := range []string{"uc_pingpong", "ud_pingpong", "send_bw_rdmacm", "atomic_fadd"} {
		for _, set := range []string{"captures", "captures-trixie"} {
			path := capturePath(t, set, name)
			lines, _ := dumpLines(t, path)
			out, err := exec.Command(tshark, "-r", path, "-Y", "udp.dstport == 4791", "-T", "fields",
				"-e", "frame.number", "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp",
				"-e", "infiniband.bth.psn", "-e", "infiniband.bth.a").Output()
			require.NoError(t, err)
			n := 0
			for row := range strings.Lines(strings.TrimSpace(string(out))) {
				c := strings.Fields(row)
				require.Len(t, c, 5, row)
				frame, _ := strconv.Atoi(c[0])
				m := field.FindStringSubmatch(lines[frame])
				require.NotNil(t, m, "%s/%s frame %d: %q", set, name, frame, lines[frame])
				op, _ := strconv.ParseUint(c[1], 10, 8)
				qpn, _ := strconv.ParseUint(c[2], 0, 32)
				psn, _ := strconv.ParseUint(c[3], 10, 32)
				assert.Equal(t, wire.Opcode(op).String(), m[2], "%s/%s frame %d", set, name, frame)
				assert.Equal(t, qpn, must(strconv.ParseUint(m[3], 16, 32)), "%s/%s frame %d", set, name, frame)
				assert.Equal(t, psn, must(strconv.ParseUint(m[4], 16, 32)), "%s/%s frame %d", set, name, frame)
				assert.Equal(t, map[string]string{"1": "1", "0": "0", "True": "1", "False": "0"}[c[4]], m[5])
				n++
			}
			require.Equal(t, len(lines), n, "%s/%s: one line per RoCEv2 frame", set, name)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestDumpErrors(t *testing.T) {
	code, _, stderr := runCLI(t, "dump", filepath.Join(t.TempDir(), "missing.pcap"))
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "missing.pcap")

	// A file that is not a capture says so, however short it is,
	// instead of pcapgo's "unexpected EOF".
	for _, tc := range []struct{ content, want string }{
		{"hello, world\n", `not a pcap or pcapng capture (it begins with "hell")`},
		{"hello", `not a pcap or pcapng capture (it begins with "hell")`},
		{"hi", "not a pcap or pcapng capture (2 bytes)"},
		{"", "not a pcap or pcapng capture (0 bytes)"},
		{"\xd4\xc3\xb2\xa1\x02\x00", "pcap file header truncated (the file ends within its first 24 bytes)"},
	} {
		notPcap := filepath.Join(t.TempDir(), "x.pcap")
		require.NoError(t, os.WriteFile(notPcap, []byte(tc.content), 0o644))
		code, _, stderr = runCLI(t, "dump", notPcap)
		assert.Equal(t, exitFail, code, tc.content)
		assert.Equal(t, "softrdma: dump: "+notPcap+": "+tc.want+"\n", stderr, tc.content)
	}

	// One file only: the extra argument is named, not the first one.
	code, _, stderr = runCLI(t, "dump", "a-missing-file", "b")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "unexpected argument b")
	code, _, stderr = runCLI(t, "dump", t.TempDir())
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "is a directory, not a capture")

	// A truncated capture (its writer killed, or cut with head -c)
	// prints what it read and the summary, marked truncated, then fails
	// saying after which frame.
	src := capturePath(t, "captures", "rping")
	data, err := os.ReadFile(src)
	require.NoError(t, err)
	cut := filepath.Join(t.TempDir(), "cut.pcap")
	require.NoError(t, os.WriteFile(cut, data[:len(data)-100], 0o644))
	code, out, stderr := runCLI(t, "dump", cut)
	assert.Equal(t, exitFail, code)
	assert.Contains(t, out, "\n42 ")
	assert.Regexp(t, `\n# 42 frames, .*, truncated\n$`, out)
	assert.Equal(t, "softrdma: dump: "+cut+": capture truncated after frame 42 (frame 43 is cut short: its writer was killed, or the file was cut)\n", stderr)

	// - reads standard input.
	dumpStdin = bytes.NewReader(data)
	t.Cleanup(func() { dumpStdin = os.Stdin })
	code, out, stderr = runCLI(t, "dump", "-")
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, out, "\n# 43 frames, ")

	// --help prints the help and dumps nothing.
	code, out, _ = runCLI(t, "dump", src, "--help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, out, "--all")
	assert.NotContains(t, out, "RoCEv2 packets, ICRC")
}

// A RoCEv2 packet on neither port 4791 — an ACK from a spread source port
// to a client's ephemeral port — is printed when its ICRC verifies; a
// datagram on those ports whose ICRC does not is not RoCEv2.
func TestDumpOffPort(t *testing.T) {
	path := filepath.Join(t.TempDir(), "offport.pcap")
	w, err := pcaptap.Create(path)
	require.NoError(t, err)
	src, dst := netip.MustParseAddrPort("127.0.0.2:49441"), netip.MustParseAddrPort("127.0.0.1:37316")
	ack := make([]byte, wire.BTHSize+wire.AETHSize+wire.ICRCSize)
	wire.BTH(ack).Encode(&wire.BTHFields{Opcode: wire.OpAcknowledge, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: 0x1234})
	wire.AETH(ack[wire.BTHSize:]).Encode(wire.SyndromeACK, 7)
	wire.PutICRC(&wire.IPHeader{Src: src.Addr(), Dst: dst.Addr(), DF: true}, src.Port(), dst.Port(), ack)
	w.Packet(conn.DirTx, src, dst, 0, ack)
	bad := bytes.Clone(ack)
	bad[len(bad)-1] ^= 1
	w.Packet(conn.DirTx, src, dst, 0, bad)
	require.NoError(t, w.Close())

	lines, summary := dumpLines(t, path)
	assert.Equal(t, "# 2 frames, 1 RoCEv2 packets, ICRC 1 ok, 0 bad", summary)
	require.Len(t, lines, 1)
	assert.Regexp(t, `^1 0\.\d{6} 127\.0\.0\.2:49441 -> 127\.0\.0\.1:37316 RC_ACKNOWLEDGE qpn=0x000011 psn=0x001234 ackreq=0 AETH\[ACK\(0x1f\) msn=7\] icrc=ok$`, lines[1])
	all, _ := dumpLines(t, "-a", path)
	assert.Contains(t, all[2], "Ethernet/IPv4/UDP/Payload")
}

// TestDumpTruncatedFrames: a datagram to port 4791 too short for a BTH,
// an empty one too, is counted as a malformed RoCEv2 packet, not as a bad ICRC (its ICRC cannot
// be checked), and a frame whose IPv4 header is cut short is printed
// without "<nil>" addresses.
func TestDumpTruncatedFrames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "short.pcap")
	f, err := os.Create(path)
	require.NoError(t, err)
	w := pcapgo.NewWriter(f)
	require.NoError(t, w.WriteFileHeader(65535, golayers.LinkTypeEthernet))
	eth := &golayers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: golayers.EthernetTypeIPv4}
	ip := &golayers.IPv4{Version: 4, TTL: 64, Protocol: golayers.IPProtocolUDP, SrcIP: net.IPv4(10, 0, 0, 1), DstIP: net.IPv4(10, 0, 0, 2), Flags: golayers.IPv4DontFragment}
	udp := &golayers.UDP{SrcPort: 49152, DstPort: 4791}
	require.NoError(t, udp.SetNetworkLayerForChecksum(ip))
	buf := gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, udp, gopacket.Payload{0x04, 0, 0xff}))
	frame := bytes.Clone(buf.Bytes())
	// An empty datagram (UDP length 8) to port 4791: the device drops it
	// as drop_short (shorter than a BTH and ICRC, 16 bytes).
	buf = gopacket.NewSerializeBuffer()
	require.NoError(t, gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, udp))
	empty := buf.Bytes()
	for _, b := range [][]byte{frame, frame[:14+10], empty} { // the datagram; the frame cut inside the IPv4 header; the empty datagram
		require.NoError(t, w.WritePacket(gopacket.CaptureInfo{Timestamp: time.Unix(1, 0), CaptureLength: len(b), Length: len(b)}, b))
	}
	require.NoError(t, f.Close())

	all, summary := dumpLines(t, "-a", path)
	assert.Equal(t, "# 3 frames, 2 RoCEv2 packets, ICRC 0 ok, 0 bad, 2 malformed (not checked)", summary)
	assert.Contains(t, all[1], "10.0.0.1:49152 -> 10.0.0.2:4791 malformed RoCEv2")
	assert.NotContains(t, all[2], "<nil>")
	assert.Regexp(t, `^3 0\.000000 10\.0\.0\.1:49152 -> 10\.0\.0\.2:4791 malformed RoCEv2: too short \(0 bytes of UDP payload; `+
		`a BTH and its ICRC take 16\), as the device's drop_short$`, all[3])
	// Without -a too: it is a RoCEv2 datagram, and counted.
	lines, summary := dumpLines(t, path)
	assert.Equal(t, "# 3 frames, 2 RoCEv2 packets, ICRC 0 ok, 0 bad, 2 malformed (not checked)", summary)
	assert.Contains(t, lines, 3)
}
