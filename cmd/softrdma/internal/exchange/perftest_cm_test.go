package exchange

import (
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The RC SEND payloads on the first RDMA CM connection (QPN 0x11) of
// ../shared/rxe-testbed/captures/send_bw_rdmacm.pcap (ib_send_bw -d rxe0
// -x 1 -F -R -s 1024 -n 5, perftest 4.5-0.17; client 192.168.77.11 sends
// first in every step), frames 6-25, 29-47 and 59-62:
//
//	tshark -r captures/send_bw_rdmacm.pcap -Y 'infiniband.bth.opcode == 4' -x
//
// versions (16), cycle buffer (4), cache line (4), MTU (2): the bytes of
// the TCP exchange (goldenVersion606, ...), then ctx_hand_shake as struct
// pingpong_dest (56 bytes, big-endian fields): twice all zeros around the
// data connection (create_rdma_cm_connection, before set_up_connection
// filled my_dest), four times the QPs' keys before the run (the fourth
// with stack garbage in the padding after rkey), once after it.
var (
	goldenCMZeroKeys   = make([]byte, CMKeyMsgSize)
	goldenCMClientKeys = mustHex("00000000" + "00000001" + "00000012" + "0037a170" + "00000000" + "00000000" +
		"000055dbc893d000" + "00000000000000000000ffffc0a84d0b" + "00000000" + "00000001")
	goldenCMServerKeys = mustHex("00000000" + "00000001" + "00000012" + "00ec562e" + "00000000" + "00000000" +
		"0000562b3df82000" + "00000000000000000000ffffc0a84d0a" + "00000000" + "00000001")
	goldenCMClientKeys4 = mustHex("0000000000000001000000120037a17000000000fc7f0000000055dbc893d000" +
		"00000000000000000000ffffc0a84d0b0000000000000001")
	goldenCMServerKeys4 = mustHex("00000000000000010000001200ec562e00000000fc7f00000000562b3df82000" +
		"00000000000000000000ffffc0a84d0a0000000000000001")
)

// sendConn records the size of every Write: over rdma_cm each is one
// SEND, and the peer's receive is 56 bytes.
type sendConn struct {
	net.Conn
	mu    sync.Mutex
	sizes []int
}

func (c *sendConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.sizes = append(c.sizes, len(b))
	c.mu.Unlock()
	return c.Conn.Write(b)
}

func TestPerftestCMKeysGolden(t *testing.T) {
	d, err := ParsePerftestDestCM(goldenCMClientKeys)
	require.NoError(t, err)
	assert.Equal(t, PerftestDest{OutReads: 1, QPN: 0x12, PSN: 0x37a170, RKey: 0, VAddr: 0x55dbc893d000,
		GID: netip.MustParseAddr("::ffff:192.168.77.11").As16(), GIDIndex: 1}, d,
		"rkey 0: rxe gives an MR without remote access no rkey, and ib_send_bw's has none")
	m := d.MarshalCM()
	assert.Equal(t, goldenCMClientKeys, m[:], "MarshalCM gives the bytes back")

	d4, err := ParsePerftestDestCM(goldenCMClientKeys4)
	require.NoError(t, err)
	assert.Equal(t, d, d4, "the padding after rkey is ignored")
	s, err := ParsePerftestDestCM(goldenCMServerKeys4)
	require.NoError(t, err)
	assert.Equal(t, uint32(0xec562e), s.PSN)
	assert.Equal(t, uint64(0x562b3df82000), s.VAddr)

	z, err := ParsePerftestDestCM(goldenCMZeroKeys)
	require.NoError(t, err)
	assert.Equal(t, PerftestDest{}, z)

	for _, bad := range [][]byte{
		goldenCMClientKeys[:55],
		append(append([]byte{}, goldenCMClientKeys...), 0),
		mustHex("00000000000000010100001200000000000000000000000000000000000000000000000000000000000000000000000000000000"), // QPN 25 bits
		mustHex("00000000000000010000001201000000000000000000000000000000000000000000000000000000000000000000000000000000"), // PSN 25 bits
		mustHex("00010000000000010000001200000000000000000000000000000000000000000000000000000000000000000000000000000000"), // LID 17 bits
	} {
		_, err := ParsePerftestDestCM(bad)
		assert.ErrorIs(t, err, ErrBadKeys, "%x", bad)
	}
}

// cmSteps returns the exchange of send_bw_rdmacm.pcap from the client's
// side (its bytes first), with this side's version 6.24 in place of the
// client's 6.06 when client.
func cmSteps(client bool) [][2][]byte {
	ver624 := MakePerftestVer("6.24", false)
	steps := [][2][]byte{
		{goldenVersion606, goldenVersion606},
		{goldenCycle, goldenCycle}, {goldenCacheLine, goldenCacheLine}, {goldenMTU, goldenMTU},
		{goldenCMZeroKeys, goldenCMZeroKeys}, {goldenCMZeroKeys, goldenCMZeroKeys},
		{goldenCMClientKeys, goldenCMServerKeys}, {goldenCMClientKeys, goldenCMServerKeys},
		{goldenCMClientKeys, goldenCMServerKeys}, {goldenCMClientKeys4, goldenCMServerKeys4},
		{goldenCMClientKeys, goldenCMServerKeys},
	}
	if client {
		steps[0][0] = ver624[:]
	} else {
		steps[0][1] = ver624[:]
	}
	return steps
}

// TestPerftestCMClientGolden runs a Perftest client over rdma_cm against
// the server of send_bw_rdmacm.pcap: it must send the capture's client
// bytes (but its version, and zero padding in the fourth hand shake), one
// SEND per step of the sizes the capture shows, and no "done".
func TestPerftestCMClientGolden(t *testing.T) {
	a, b := pipePair(t)
	steps := cmSteps(true)
	for i := range steps { // the script checks what this side sends: zero padding
		if i == 9 {
			steps[i][0] = goldenCMClientKeys
		}
	}
	// The script swaps the roles: it reads [0] (ours) and writes [1].
	errc := make(chan error, 1)
	go func() { errc <- peerScript(b, false, steps) }()

	sc := &sendConn{Conn: a}
	p := NewPerftest(sc, true)
	p.RDMACM = true
	native, err := p.ExchangeVersions(false)
	require.NoError(t, err)
	assert.False(t, native)
	assert.Equal(t, "6.06", p.Remote.String())
	_, _, err = p.SysData(4096, 64)
	require.NoError(t, err)
	mtu, err := p.MTU(3)
	require.NoError(t, err)
	assert.Equal(t, 3, mtu)
	var zero PerftestDest
	for range 2 {
		rem, err := p.HandShake(&zero)
		require.NoError(t, err)
		assert.Equal(t, PerftestDest{}, rem)
	}
	my, err := ParsePerftestDestCM(goldenCMClientKeys)
	require.NoError(t, err)
	for range 5 {
		rem, err := p.HandShake(&my)
		require.NoError(t, err)
		assert.Equal(t, uint32(0x12), rem.QPN)
		assert.Equal(t, uint32(0xec562e), rem.PSN)
	}
	assert.False(t, p.SendsDone(), "no done over rdma_cm, whatever the version")
	require.NoError(t, <-errc)
	require.NoError(t, p.Close(true))
	assert.Equal(t, []int{16, 4, 4, 2, 56, 56, 56, 56, 56, 56, 56}, sc.sizes, "one SEND per step, the capture's sizes")
}

// TestPerftestCMServerGolden runs the server side against the client
// bytes of send_bw_rdmacm.pcap.
func TestPerftestCMServerGolden(t *testing.T) {
	a, b := pipePair(t)
	steps := cmSteps(false)
	// The script is the client: it writes [0] and reads [1] (ours, with
	// zero padding).
	script := make([][2][]byte, len(steps))
	for i, st := range steps {
		script[i] = [2][]byte{st[1], st[0]}
		if i == 9 {
			script[i][0] = goldenCMServerKeys
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- peerScript(b, true, script) }()

	sc := &sendConn{Conn: a}
	p := NewPerftest(sc, false)
	p.RDMACM = true
	native, err := p.ExchangeVersions(true)
	require.NoError(t, err)
	assert.False(t, native, "the capture's client offers no softrdma mark")
	_, _, err = p.SysData(4096, 64)
	require.NoError(t, err)
	_, err = p.MTU(3)
	require.NoError(t, err)
	var zero PerftestDest
	for range 2 {
		_, err := p.HandShake(&zero)
		require.NoError(t, err)
	}
	my, err := ParsePerftestDestCM(goldenCMServerKeys)
	require.NoError(t, err)
	for i := range 5 {
		rem, err := p.HandShake(&my)
		require.NoError(t, err)
		assert.Equal(t, uint32(0x37a170), rem.PSN, "hand shake %d", i)
	}
	require.NoError(t, <-errc)
	require.NoError(t, p.Close(true))
	assert.Equal(t, []int{16, 4, 4, 2, 56, 56, 56, 56, 56, 56, 56}, sc.sizes)
}
