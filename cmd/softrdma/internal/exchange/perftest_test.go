package exchange

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"io"
	"math"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The TCP payloads of ../shared/rxe-testbed/captures/write_bw.pcap
// (ib_write_bw -d rxe0 -x 1 -F -s 8192 -n 20, perftest 4.5-0.17: VERSION
// 6.06; client 192.168.77.11, server 192.168.77.10), in the order they
// crossed:
//
//	tshark -r captures/write_bw.pcap -Y 'tcp.len>0' -T fields -e ip.src -e tcp.payload
var (
	goldenVersion606 = mustHex("362e3036000000000000000000000000")
	goldenCycle      = mustHex("00001000")
	goldenCacheLine  = mustHex("00000040")
	goldenMTU        = mustHex("3300")
	// ctx_hand_shake: client (QPN 0x11, PSN 0x1d255a, rkey 0x207) and server.
	goldenClientKeys = []byte("0000:0001:000011:1d255a:00000207:000055d5172fc000:" +
		"00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:4d:0b:00000000:\x00")
	goldenServerKeys = []byte("0000:0001:000011:1d255a:00000226:000055bd720e2000:" +
		"00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:4d:0a:00000000:\x00")
	// xchg_bw_reports, the client's: size 8192, 20 iterations, BW peak
	// 7.56 and average 6.10 MB/sec, 0.000780 Mpps (the server's are
	// uninitialized stack in 4.5-0.17, zeros in 25.01).
	goldenClientReport = [][]byte{mustHex("0000000000002000"), mustHex("0000000000000014"),
		mustHex("401e3cf52e1435a3"), mustHex("401862f3035fa4f0"), mustHex("3f499234ef23b02e")}
	goldenDone = []byte("done\x00")
)

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func TestPerftestKeysGolden(t *testing.T) {
	require.Len(t, goldenClientKeys, KeyMsgSize)
	d, err := ParsePerftestDest(goldenClientKeys)
	require.NoError(t, err)
	assert.Equal(t, PerftestDest{LID: 0, OutReads: 1, QPN: 0x11, PSN: 0x1d255a, RKey: 0x207, VAddr: 0x55d5172fc000,
		GID: netip.MustParseAddr("::ffff:192.168.77.11").As16()}, d)
	m := d.Marshal()
	assert.Equal(t, goldenClientKeys, m[:], "Marshal gives the bytes back")

	// The fields at their widest, and a READ test's out_reads (0x80, rxe's
	// max_qp_rd_atom).
	w := PerftestDest{LID: 0xffff, OutReads: 0x80, QPN: 0xffffff, PSN: 0xabcdef, RKey: 0xffffffff, VAddr: math.MaxUint64,
		GID: netip.MustParseAddr("fd00:77::1").As16(), SRQN: 0x12345678}
	m = w.Marshal()
	assert.Equal(t, byte(0), m[KeyMsgSize-1])
	assert.Equal(t, "ffff:0080:ffffff:abcdef:ffffffff:ffffffffffffffff:fd:00:00:77:00:00:00:00:00:00:00:00:00:00:00:01:12345678:",
		string(m[:KeyMsgSize-1]))
	back, err := ParsePerftestDest(m[:])
	require.NoError(t, err)
	assert.Equal(t, w, back)
}

func TestParsePerftestDestRejects(t *testing.T) {
	good := string(goldenClientKeys)
	for _, bad := range []string{
		"",
		good[:50] + "\x00",
		"0000:0001:1000011:1d255a:00000207:000055d5172fc000:00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:4d:0b:00000000:", // QPN 28 bits
		"0000:0001:000011:1d255a:00000207:000055d5172fc000:00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:4d:xx:00000000:",  // GID
		"0000:0001:000011:1d255a:00000207:000055d5172fc000:00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:4d:0b:00000000",   // no final ':'
		"0000:0001:000011:1d255a:00000207:000055d5172fc000:00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:4d:0b:100:00000000:",
	} {
		_, err := ParsePerftestDest([]byte(bad))
		assert.ErrorIs(t, err, ErrBadKeys, "%q", bad)
	}
}

func TestPerftestVersion(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want float64
	}{{"6.06", 6.06}, {"6.24", 6.24}, {"5.33", 5.33}, {"6.10a", 6.10}, {"", 0}, {"x", 0}, {"7", 7}} {
		assert.InDelta(t, tc.want, MakePerftestVer(tc.v, false).Float(), 1e-9, tc.v)
	}
	plain := MakePerftestVer("6.24", false)
	assert.Equal(t, "362e3234000000000000000000000000", hex.EncodeToString(plain[:]), "strncpy's NUL padding")
	assert.False(t, plain.native())
	marked := MakePerftestVer("6.24", true)
	assert.Equal(t, "6.24", marked.String(), "perftest reads up to the NUL")
	assert.InDelta(t, 6.24, marked.Float(), 1e-9)
	assert.True(t, marked.native())
	ver := MakePerftestVer("6.06", false)
	assert.Equal(t, goldenVersion606, ver[:])
}

func pipePair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	b = <-acc
	require.NotNil(t, b)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// peerScript runs the peer's side: for each exchange, the bytes it must
// read from the Perftest and the bytes it writes; the client's come
// first. It returns the first mismatch or I/O error.
func peerScript(c net.Conn, peerIsClient bool, steps [][2][]byte) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	for _, st := range steps {
		want, give := st[0], st[1]
		read := func() error {
			got := make([]byte, len(want))
			if _, err := io.ReadFull(c, got); err != nil {
				return err
			}
			if !bytes.Equal(got, want) {
				return &mismatch{got: got, want: want}
			}
			return nil
		}
		if peerIsClient {
			if _, err := c.Write(give); err != nil {
				return err
			}
			if err := read(); err != nil {
				return err
			}
		} else {
			if err := read(); err != nil {
				return err
			}
			if _, err := c.Write(give); err != nil {
				return err
			}
		}
	}
	return nil
}

type mismatch struct{ got, want []byte }

func (m *mismatch) Error() string {
	return "got " + hex.EncodeToString(m.got) + " (" + string(m.got) + "), want " + hex.EncodeToString(m.want)
}

// TestPerftestClientGolden runs a Perftest client against the server of
// write_bw.pcap: it must send the capture's client bytes, but for its
// version (6.24), and read the server's.
func TestPerftestClientGolden(t *testing.T) {
	a, b := pipePair(t)
	ver624 := MakePerftestVer("6.24", false)
	steps := [][2][]byte{
		{ver624[:], goldenVersion606},
		{goldenCycle, goldenCycle}, {goldenCacheLine, goldenCacheLine}, {goldenMTU, goldenMTU},
		{goldenClientKeys, goldenServerKeys}, {goldenClientKeys, goldenServerKeys}, {goldenClientKeys, goldenServerKeys},
		{goldenClientKeys, goldenServerKeys}, // the client finished
	}
	zero := make([]byte, 8)
	for _, r := range goldenClientReport {
		steps = append(steps, [2][]byte{r, zero})
	}
	steps = append(steps, [2][]byte{goldenClientKeys, goldenServerKeys}, [2][]byte{goldenDone, goldenDone})
	errc := make(chan error, 1)
	go func() { errc <- peerScript(b, false, steps) }()

	p := NewPerftest(a, true)
	native, err := p.ExchangeVersions(false)
	require.NoError(t, err)
	assert.False(t, native)
	assert.Equal(t, "6.06", p.Remote.String())
	cycle, line, err := p.SysData(4096, 64)
	require.NoError(t, err)
	assert.Equal(t, [2]int{4096, 64}, [2]int{cycle, line})
	mtu, err := p.MTU(3)
	require.NoError(t, err)
	assert.Equal(t, 3, mtu)
	my, err := ParsePerftestDest(goldenClientKeys)
	require.NoError(t, err)
	for range 4 {
		rem, err := p.HandShake(&my)
		require.NoError(t, err)
		assert.Equal(t, uint32(0x226), rem.RKey)
	}
	f := func(i int) float64 { return math.Float64frombits(binary.BigEndian.Uint64(goldenClientReport[i])) }
	rep, err := p.Reports(PerftestReport{Size: 8192, Iters: 20, BWPeak: f(2), BWAvg: f(3), MsgRate: f(4)})
	require.NoError(t, err)
	assert.Equal(t, PerftestReport{}, rep)
	assert.InDelta(t, 7.56, f(2), 0.01)
	_, err = p.HandShake(&my)
	require.NoError(t, err)
	assert.True(t, p.SendsDone(), "6.06 writes done")
	// The script reads our "done" and writes its own, which nobody reads.
	require.NoError(t, p.Close(true))
	require.NoError(t, <-errc)
}

// TestPerftestServerMTU checks the server side of check_mtu with a server
// MTU above the client's: both use the smaller.
func TestPerftestServerMTU(t *testing.T) {
	a, b := pipePair(t)
	errc := make(chan error, 1)
	go func() { errc <- peerScript(b, true, [][2][]byte{{[]byte("5\x00"), goldenMTU}}) }()
	p := NewPerftest(a, false)
	p.Remote = MakePerftestVer("6.06", false)
	mtu, err := p.MTU(5)
	require.NoError(t, err)
	assert.Equal(t, 3, mtu)
	require.NoError(t, <-errc)
}

// TestPerftestServerScript runs the server side through a whole
// ib_write_bw exchange against the client bytes of write_bw.pcap.
func TestPerftestServerScript(t *testing.T) {
	a, b := pipePair(t)
	ver624 := MakePerftestVer("6.24", false)
	steps := [][2][]byte{
		{ver624[:], goldenVersion606},
		{goldenCycle, goldenCycle}, {goldenCacheLine, goldenCacheLine}, {goldenMTU, goldenMTU},
	}
	for range 5 {
		steps = append(steps, [2][]byte{goldenServerKeys, goldenClientKeys})
	}
	zero := make([]byte, 8)
	for _, r := range goldenClientReport {
		steps = append(steps, [2][]byte{zero, r})
	}
	steps = append(steps, [2][]byte{goldenServerKeys, goldenClientKeys}, [2][]byte{goldenDone, goldenDone})
	errc := make(chan error, 1)
	go func() { errc <- peerScript(b, true, steps) }()

	p := NewPerftest(a, false)
	native, err := p.ExchangeVersions(true)
	require.NoError(t, err)
	assert.False(t, native)
	_, _, err = p.SysData(4096, 64)
	require.NoError(t, err)
	mtu, err := p.MTU(3)
	require.NoError(t, err)
	assert.Equal(t, 3, mtu)
	my, err := ParsePerftestDest(goldenServerKeys)
	require.NoError(t, err)
	for range 5 {
		rem, err := p.HandShake(&my)
		require.NoError(t, err)
		assert.Equal(t, uint32(0x207), rem.RKey)
	}
	rep, err := p.Reports(PerftestReport{})
	require.NoError(t, err)
	assert.Equal(t, uint64(8192), rep.Size)
	assert.Equal(t, uint64(20), rep.Iters)
	assert.InDelta(t, 6.10, rep.BWAvg, 0.01)
	assert.InDelta(t, 0.000780, rep.MsgRate, 1e-6)
	_, err = p.HandShake(&my)
	require.NoError(t, err)
	require.NoError(t, p.Close(true))
	require.NoError(t, <-errc)
}

// TestPerftestOldPeer checks the steps that depend on the peer's version:
// before 5.31 check_mtu exchanges sizeof(int), before 5.32 there is no
// system data, before 5.33 the reports carry 32-bit iterations, from 6.10
// on (taken as perftest pull request #220) nobody writes "done".
func TestPerftestOldPeer(t *testing.T) {
	a, b := pipePair(t)
	old := MakePerftestVer("5.30", false)
	ver624 := MakePerftestVer("6.24", false)
	zero8 := make([]byte, 8)
	steps := [][2][]byte{
		{ver624[:], old[:]},
		{[]byte("5\x00\x00\x00"), []byte("2\x00\x00\x00")}, // no system data; MTU as 4 bytes
		{mustHex("0000000000000040"), zero8},               // size
		{mustHex("00000007"), mustHex("00000000")},         // 32-bit iterations
		{zero8, zero8}, {zero8, zero8}, {zero8, zero8},
	}
	errc := make(chan error, 1)
	go func() { errc <- peerScript(b, false, steps) }()
	p := NewPerftest(a, true)
	_, err := p.ExchangeVersions(false)
	require.NoError(t, err)
	cycle, line, err := p.SysData(4096, 64)
	require.NoError(t, err)
	assert.Equal(t, [2]int{4096, 64}, [2]int{cycle, line})
	mtu, err := p.MTU(5)
	require.NoError(t, err)
	assert.Equal(t, 2, mtu)
	_, err = p.Reports(PerftestReport{Size: 64, Iters: 7})
	require.NoError(t, err)
	assert.True(t, p.SendsDone())
	require.NoError(t, <-errc)

	p.Remote = MakePerftestVer("6.24", false)
	assert.False(t, p.SendsDone(), "25.01 does not write done")
}

// TestPerftestNative checks the switch to softrdma's exchange: both sides
// must offer it; a plain perftest version on either side keeps perftest's.
func TestPerftestNative(t *testing.T) {
	for _, tc := range []struct {
		client, server, want bool
	}{{true, true, true}, {true, false, false}, {false, true, false}, {false, false, false}} {
		a, b := pipePair(t)
		var srvNative bool
		var srvErr error
		done := make(chan struct{})
		go func() {
			srvNative, srvErr = NewPerftest(b, false).ExchangeVersions(tc.server)
			close(done)
		}()
		cli := NewPerftest(a, true)
		cliNative, err := cli.ExchangeVersions(tc.client)
		<-done
		require.NoError(t, err)
		require.NoError(t, srvErr)
		assert.Equal(t, tc.want, cliNative, "client %+v", tc)
		assert.Equal(t, tc.want, srvNative, "server %+v", tc)
		assert.Equal(t, "6.24", cli.Remote.String())
	}
}
