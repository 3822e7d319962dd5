package wire_test

import (
	"bufio"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

// testbedDir is shared/rxe-testbed relative to this package: the repo is
// checked out beside shared/ (locally /work/main next to /work/shared, in CI
// a clone with a copy of shared/ beside it).
const testbedDir = "../../../shared/rxe-testbed"

// captureSets are the folders of golden captures from Linux rdma_rxe:
// kernel 6.1 (bookworm) and 6.12 (trixie).
var captureSets = []string{"captures", "captures-trixie"}

// knownBadICRC lists, per capture, the frame numbers (1-based, as tshark
// and roce_pcap.py number them) whose ICRC is deliberately wrong: the
// host peer corrupted the ICRC of its first two pings (hostpeer_bad_icrc,
// ICRC ^ 0xdeadbeef), or computed it for IPv4 ID 0 while sending ID 0x1234
// from a raw socket (hostpeer_ipid_mismatch). rxe dropped all of them.
var knownBadICRC = map[string][]int{
	"hostpeer_bad_icrc":      {16, 17},
	"hostpeer_ipid_mismatch": {16, 17},
}

// goldenPacket is one RoCEv2 packet (UDP destination port 4791) of a capture.
type goldenPacket struct {
	capture string // "captures/write_bw"
	name    string // "write_bw"
	frame   int    // 1-based frame number in the pcap
	l3      []byte // IP header through the ICRC
	ipv6    bool
	ip      wire.IPHeader // as on the wire: ID and DF from the frame
	sport   uint16
	dport   uint16
	roce    []byte // UDP payload: BTH through ICRC
}

var golden struct {
	once sync.Once
	pkts []goldenPacket
	err  error
}

// goldenPackets returns every RoCEv2 packet of every golden capture, or
// skips the test when the captures are not there.
func goldenPackets(tb testing.TB) []goldenPacket {
	tb.Helper()
	golden.once.Do(func() { golden.pkts, golden.err = loadGolden() })
	if errors.Is(golden.err, os.ErrNotExist) {
		tb.Skipf("golden rxe captures not found (%v); they live in shared/rxe-testbed beside the repo", golden.err)
	}
	require.NoError(tb, golden.err)
	return golden.pkts
}

func loadGolden() ([]goldenPacket, error) {
	var out []goldenPacket
	for _, set := range captureSets {
		files, err := filepath.Glob(filepath.Join(testbedDir, set, "*.pcap"))
		if err != nil {
			return nil, err
		}
		if len(files) == 0 {
			return nil, &os.PathError{Op: "glob", Path: filepath.Join(testbedDir, set, "*.pcap"), Err: os.ErrNotExist}
		}
		for _, f := range files {
			pkts, err := readCapture(set, f)
			if err != nil {
				return nil, err
			}
			out = append(out, pkts...)
		}
	}
	return out, nil
}

func readCapture(set, file string) ([]goldenPacket, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := pcapgo.NewReader(bufio.NewReader(f))
	if err != nil {
		return nil, err
	}
	var (
		eth   layers.Ethernet
		ip4   layers.IPv4
		ip6   layers.IPv6
		udp   layers.UDP
		types []gopacket.LayerType
	)
	parser := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &eth, &ip4, &ip6, &udp)
	parser.IgnoreUnsupported = true
	name := strings.TrimSuffix(filepath.Base(file), ".pcap")
	var out []goldenPacket
	for frame := 1; ; frame++ {
		data, _, err := r.ReadPacketData()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if err := parser.DecodeLayers(data, &types); err != nil || !slices.Contains(types, layers.LayerTypeUDP) {
			continue
		}
		if udp.DstPort != wire.RoCEv2Port {
			continue
		}
		p := goldenPacket{
			capture: set + "/" + name, name: name, frame: frame,
			sport: uint16(udp.SrcPort), dport: uint16(udp.DstPort), roce: udp.Payload,
		}
		if slices.Contains(types, layers.LayerTypeIPv6) {
			p.ipv6 = true
			p.l3 = eth.Payload[:40+int(ip6.Length)]
			p.ip.Src, _ = netip.AddrFromSlice(ip6.SrcIP)
			p.ip.Dst, _ = netip.AddrFromSlice(ip6.DstIP)
		} else {
			p.l3 = eth.Payload[:ip4.Length]
			p.ip.Src, _ = netip.AddrFromSlice(ip4.SrcIP.To4())
			p.ip.Dst, _ = netip.AddrFromSlice(ip4.DstIP.To4())
			p.ip.ID = ip4.Id
			p.ip.DF = ip4.Flags&layers.IPv4DontFragment != 0
		}
		out = append(out, p)
	}
}

func TestGoldenCapturesParse(t *testing.T) {
	var pkt wire.Packet
	n := 0
	for _, g := range goldenPackets(t) {
		require.NoErrorf(t, wire.Parse(g.roce, &pkt), "%s frame %d", g.capture, g.frame)
		tr := pkt.Opcode().Transport()
		require.Containsf(t, []wire.Opcode{wire.OpRC, wire.OpUC, wire.OpUD}, tr, "%s frame %d: %s", g.capture, g.frame, pkt.Opcode())
		require.Equal(t, len(g.roce), pkt.Info.Length+len(pkt.Payload)+pkt.BTH().PadCount()+wire.ICRCSize)
		require.Equal(t, uint16(wire.DefaultPKey), pkt.BTH().PKey())
		require.Zero(t, pkt.BTH().TVer())
		n++
	}
	t.Logf("%d RoCEv2 packets parsed", n)
	require.Greater(t, n, 5000)
}

func TestGoldenCapturesICRC(t *testing.T) {
	bad := map[string][]int{}
	for _, g := range goldenPackets(t) {
		stored := wire.PacketICRC(g.roce)
		computed := wire.ComputeICRC(&g.ip, g.sport, g.dport, g.roce[:len(g.roce)-wire.ICRCSize])
		require.Equalf(t, l3ICRC(g.l3, g.ipv6), computed, "%s frame %d: ComputeICRC disagrees with the reference recipe", g.capture, g.frame)
		exact := wire.VerifyICRCExact(&g.ip, g.sport, g.dport, g.roce)
		require.Equal(t, stored == computed, exact)
		if !exact {
			bad[g.capture] = append(bad[g.capture], g.frame)
		}
	}
	want := map[string][]int{}
	for _, set := range captureSets {
		for name, frames := range knownBadICRC {
			want[set+"/"+name] = frames
		}
	}
	require.Equal(t, want, bad, "exactly the deliberately corrupted packets fail the ICRC")
}

// A UDP socket does not see the sender's IPv4 ID; VerifyICRC given ID 0
// must recover the ID rxe put in each frame.
func TestGoldenCapturesRecoverIPv4ID(t *testing.T) {
	nonZero := 0
	for _, g := range goldenPackets(t) {
		h := g.ip
		h.ID = 0
		ok, id := wire.VerifyICRC(&h, g.sport, g.dport, g.roce)
		switch {
		case g.ipv6:
			require.True(t, ok, "%s frame %d", g.capture, g.frame)
			require.Zero(t, id)
		case g.name == "hostpeer_ipid_mismatch":
			// Sent with ID 0x1234, ICRC computed for ID 0: rxe dropped
			// them, but from the UDP payload alone they are valid
			// packets with ID 0. Only the exact check (raw socket) can
			// tell.
			require.Equal(t, uint16(0x1234), g.ip.ID)
			require.True(t, ok, "%s frame %d", g.capture, g.frame)
			require.Zero(t, id)
		case slices.Contains(knownBadICRC[g.name], g.frame):
			require.False(t, ok, "%s frame %d: a corrupted ICRC must not be explained by any ID", g.capture, g.frame)
		default:
			require.Truef(t, ok, "%s frame %d", g.capture, g.frame)
			require.Equalf(t, g.ip.ID, id, "%s frame %d", g.capture, g.frame)
			if id != 0 {
				nonZero++
			}
		}
	}
	require.Greater(t, nonZero, 5000, "rxe's IDs are non-zero")
}

// pyOpcodeNames maps the opcode names of roce_pcap.py (and so of
// captures/INDEX.md) to opcodes.
var pyOpcodeNames = map[string]wire.Opcode{
	"SEND_FIRST": wire.OpSendFirst, "SEND_MIDDLE": wire.OpSendMiddle, "SEND_LAST": wire.OpSendLast,
	"SEND_LAST_IMM": wire.OpSendLastWithImmediate, "SEND_ONLY": wire.OpSendOnly,
	"SEND_ONLY_IMM": wire.OpSendOnlyWithImmediate, "WRITE_FIRST": wire.OpRDMAWriteFirst,
	"WRITE_MIDDLE": wire.OpRDMAWriteMiddle, "WRITE_LAST": wire.OpRDMAWriteLast,
	"WRITE_LAST_IMM": wire.OpRDMAWriteLastWithImmediate, "WRITE_ONLY": wire.OpRDMAWriteOnly,
	"WRITE_ONLY_IMM": wire.OpRDMAWriteOnlyWithImmediate, "READ_REQUEST": wire.OpRDMAReadRequest,
	"READ_RESP_FIRST": wire.OpRDMAReadResponseFirst, "READ_RESP_MIDDLE": wire.OpRDMAReadResponseMiddle,
	"READ_RESP_LAST": wire.OpRDMAReadResponseLast, "READ_RESP_ONLY": wire.OpRDMAReadResponseOnly,
	"ACK": wire.OpAcknowledge, "ATOMIC_ACK": wire.OpAtomicAcknowledge, "CMP_SWAP": wire.OpCompareSwap,
	"FETCH_ADD": wire.OpFetchAdd, "SEND_LAST_INV": wire.OpSendLastWithInvalidate,
	"SEND_ONLY_INV": wire.OpSendOnlyWithInvalidate,
}

var transportNames = map[string]wire.Opcode{"RC": wire.OpRC, "UC": wire.OpUC, "UD": wire.OpUD}

// indexRow is one row of the summary table of captures/INDEX.md.
type indexRow struct {
	roce, ok, bad int
	ops           map[wire.Opcode]int
}

var indexRowRE = regexp.MustCompile(`^\| \[(\w+)\]\(#\w+\) \| \d+ \| (\d+) \| (\d+)/(\d+) \| [^|]* \| ([^|]*) \|$`)

func readIndex(t *testing.T, set string) map[string]indexRow {
	data, err := os.ReadFile(filepath.Join(testbedDir, set, "INDEX.md"))
	require.NoError(t, err)
	rows := map[string]indexRow{}
	for line := range strings.Lines(string(data)) {
		m := indexRowRE.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		row := indexRow{ops: map[wire.Opcode]int{}}
		row.roce, _ = strconv.Atoi(m[2])
		row.ok, _ = strconv.Atoi(m[3])
		row.bad, _ = strconv.Atoi(m[4])
		for item := range strings.SplitSeq(m[5], ", ") {
			// "RC WRITE_FIRST x20"
			f := strings.Fields(item)
			require.Len(t, f, 3, item)
			tr, ok := transportNames[f[0]]
			require.True(t, ok, item)
			op, ok := pyOpcodeNames[f[1]]
			require.True(t, ok, item)
			n, err := strconv.Atoi(strings.TrimPrefix(f[2], "x"))
			require.NoError(t, err, item)
			row.ops[tr|op] = n
		}
		rows[m[1]] = row
	}
	require.NotEmpty(t, rows)
	return rows
}

func TestGoldenCapturesMatchIndex(t *testing.T) {
	pkts := goldenPackets(t)
	for _, set := range captureSets {
		got := map[string]indexRow{}
		var pkt wire.Packet
		for _, g := range pkts {
			if !strings.HasPrefix(g.capture, set+"/") {
				continue
			}
			row, ok := got[g.name]
			if !ok {
				row.ops = map[wire.Opcode]int{}
			}
			require.NoError(t, wire.Parse(g.roce, &pkt))
			row.roce++
			row.ops[pkt.Opcode()]++
			if wire.VerifyICRCExact(&g.ip, g.sport, g.dport, g.roce) {
				row.ok++
			} else {
				row.bad++
			}
			got[g.name] = row
		}
		require.Equal(t, readIndex(t, set), got, set)

		// Spelled out for the record (captures/INDEX.md).
		require.Equal(t, map[wire.Opcode]int{
			wire.OpRDMAWriteFirst: 20, wire.OpRDMAWriteMiddle: 120, wire.OpRDMAWriteLast: 20, wire.OpAcknowledge: 20,
		}, got["write_bw"].ops)
		require.Equal(t, map[wire.Opcode]int{
			wire.OpRDMAReadRequest: 20, wire.OpRDMAReadResponseFirst: 20,
			wire.OpRDMAReadResponseMiddle: 120, wire.OpRDMAReadResponseLast: 20,
		}, got["read_bw"].ops)
		require.Equal(t, map[wire.Opcode]int{wire.OpCompareSwap: 20, wire.OpAtomicAcknowledge: 20}, got["atomic_cas"].ops)
	}
}

func TestGoldenCapturesHeaders(t *testing.T) {
	var pkt wire.Packet
	var lastReadPSN wire.PSN
	seenRead := false
	hits := map[string]int{}
	for _, g := range goldenPackets(t) {
		require.NoError(t, wire.Parse(g.roce, &pkt))
		b := pkt.BTH()
		hit := func(what string) { hits[g.capture+" "+what]++ }
		switch {
		case g.name == "send_bw_rdmacm" && pkt.Opcode() == wire.OpUDSendOnly:
			// RDMA-CM MADs: UD SEND_ONLY to QP1, Q_Key 0x80010000, 256-byte MAD.
			hit("CM MAD")
			require.Equal(t, wire.QPN(1), b.DestQP())
			require.Equal(t, uint32(0x80010000), pkt.DETH().QKey())
			require.Equal(t, wire.QPN(1), pkt.DETH().SrcQP())
			require.Len(t, pkt.Payload, 256)
			require.True(t, b.AckReq())
		case g.capture == "captures/write_bw" && pkt.Opcode() == wire.OpRDMAWriteFirst:
			hit("WRITE_FIRST")
			require.Equal(t, uint32(8192), pkt.RETH().DMALength())
			require.Len(t, pkt.Payload, 1024)
			require.False(t, b.AckReq())
		case g.capture == "captures/write_bw" && pkt.Opcode() == wire.OpRDMAWriteLast:
			hit("WRITE_LAST")
			require.True(t, b.AckReq(), "AckReq on the last packet of a request")
		case g.capture == "captures/write_bw" && pkt.Opcode() == wire.OpAcknowledge:
			hit("ACK")
			require.Equal(t, wire.SyndromeACK, pkt.AETH().Syndrome())
			require.Equal(t, wire.TypeACK, pkt.AETH().Syndrome().Type())
		case g.capture == "captures/read_bw" && pkt.Opcode() == wire.OpRDMAReadRequest:
			hit("READ_REQUEST")
			// An 8 KiB READ at MTU 1024 takes 8 response PSNs.
			if seenRead {
				require.Equal(t, int32(8), lastReadPSN.Distance(b.PSN()))
			}
			lastReadPSN, seenRead = b.PSN(), true
		case g.capture == "captures/rnr_nak" && pkt.Opcode() == wire.OpAcknowledge &&
			pkt.AETH().Syndrome().Type() == wire.TypeRNRNAK:
			hit("RNR NAK")
			require.Equal(t, uint8(14), pkt.AETH().Syndrome().Value())
			require.Equal(t, int64(1_280_000), wire.RNRTimerNanoseconds(pkt.AETH().Syndrome().Value()))
		case g.capture == "captures/bad_rkey_write" && pkt.Opcode() == wire.OpAcknowledge:
			hit("NAK")
			require.Equal(t, wire.SyndromeNAKRemoteAccess, pkt.AETH().Syndrome())
		case g.name == "write_imm_zero" && pkt.Opcode() == wire.OpRDMAWriteOnlyWithImmediate:
			hit("WRITE_ONLY_IMM")
			require.Zero(t, pkt.RETH().DMALength())
			require.Empty(t, pkt.Payload)
		}
	}
	require.True(t, seenRead)
	require.Equal(t, map[string]int{
		"captures-trixie/send_bw_rdmacm CM MAD": 12, "captures/send_bw_rdmacm CM MAD": 10,
		"captures/write_bw WRITE_FIRST": 20, "captures/write_bw WRITE_LAST": 20, "captures/write_bw ACK": 20,
		"captures/read_bw READ_REQUEST":          20,
		"captures/rnr_nak RNR NAK":               hits["captures/rnr_nak RNR NAK"],
		"captures/bad_rkey_write NAK":            1,
		"captures/write_imm_zero WRITE_ONLY_IMM": 2, "captures-trixie/write_imm_zero WRITE_ONLY_IMM": 2,
	}, hits)
	require.Greater(t, hits["captures/rnr_nak RNR NAK"], 100, "~120 RNR NAKs")
}

// pingpongSide is one side of an ibv_*_pingpong run as its log in INDEX.md
// reports it: "local address:  LID 0x0000, QPN 0x000011, PSN 0x890bb9, GID
// ::ffff:192.168.77.10".
type pingpongSide struct {
	qpn wire.QPN
	psn wire.PSN
}

var localAddressRE = regexp.MustCompile(`local address:\s+LID 0x[0-9a-f]+, QPN (0x[0-9a-f]+), PSN (0x[0-9a-f]+)[,:] GID ::ffff:([0-9.]+)`)

// pingpongSides returns, by IP, the QPN and first PSN each side of capture
// name printed, from the capture's section of INDEX.md.
func pingpongSides(t *testing.T, set, name string) map[netip.Addr]pingpongSide {
	data, err := os.ReadFile(filepath.Join(testbedDir, set, "INDEX.md"))
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(data), "\n## "+name+"\n")
	require.True(t, ok, "%s: no section %s in INDEX.md", set, name)
	section, _, _ = strings.Cut(section, "\n## ")
	sides := map[netip.Addr]pingpongSide{}
	for _, m := range localAddressRE.FindAllStringSubmatch(section, -1) {
		qpn, err := strconv.ParseUint(m[1], 0, 32)
		require.NoError(t, err)
		psn, err := strconv.ParseUint(m[2], 0, 32)
		require.NoError(t, err)
		sides[netip.MustParseAddr(m[3])] = pingpongSide{wire.QPN(qpn), wire.PSN(psn)}
	}
	require.Len(t, sides, 2, "%s/%s: server and client", set, name)
	return sides
}

// UC and UD as ibv_uc_pingpong and ibv_ud_pingpong sent them: each side's
// packets start at the PSN its log printed and count up by one, go to the
// QPN the peer printed, and have the shape of the command line (-s 4096 at
// MTU 1024: FIRST, MIDDLE, MIDDLE, LAST of 1 KiB each; -s 512: one UD
// SEND_ONLY of 512 bytes whose DETH carries the sender's QPN and the
// pingpong's Q_Key 0x11111111).
func TestGoldenCapturesUCUD(t *testing.T) {
	pkts := goldenPackets(t)
	for _, set := range captureSets {
		for _, name := range []string{"uc_pingpong", "ud_pingpong"} {
			sides := pingpongSides(t, set, name)
			next := map[netip.Addr]wire.PSN{}
			n := 0
			var p wire.Packet
			for _, g := range pkts {
				if g.capture != set+"/"+name {
					continue
				}
				require.NoError(t, wire.Parse(g.roce, &p))
				from, ok := sides[g.ip.Src]
				require.True(t, ok, "%s frame %d from %v", g.capture, g.frame, g.ip.Src)
				to := sides[g.ip.Dst]
				want, seen := next[g.ip.Src]
				if !seen {
					want = from.psn
				}
				require.Equalf(t, want, p.PSN(), "%s frame %d", g.capture, g.frame)
				next[g.ip.Src] = p.PSN().Add(1)
				require.Equal(t, to.qpn, p.BTH().DestQP())
				require.False(t, p.BTH().AckReq(), "no acknowledgements on UC and UD (tshark: A=0)")
				if name == "uc_pingpong" {
					// Message k of a side starts at PSN first+4k.
					k := from.psn.Distance(p.PSN()) % 4
					require.Equal(t, []wire.Opcode{wire.OpUC | wire.OpSendFirst, wire.OpUC | wire.OpSendMiddle,
						wire.OpUC | wire.OpSendMiddle, wire.OpUC | wire.OpSendLast}[k], p.Opcode(), "%s frame %d", g.capture, g.frame)
					require.Len(t, p.Payload, 1024)
				} else {
					require.Equal(t, wire.OpUDSendOnly, p.Opcode())
					require.Len(t, p.Payload, 512)
					require.Equal(t, uint32(0x11111111), p.DETH().QKey())
					require.Equal(t, from.qpn, p.DETH().SrcQP())
				}
				n++
			}
			require.Equal(t, map[string]int{"uc_pingpong": 40, "ud_pingpong": 10}[name], n, "%s/%s (INDEX.md)", set, name)
			require.Len(t, next, 2, "both sides sent")
		}
	}
}
