package pingpong

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The TCP payloads of ../shared/rxe-testbed/captures/rc_pingpong.pcap
// (ibv_rc_pingpong -g 1 -s 4096 -n 5 between two rxe VMs, rdma-core 44):
//
//	tshark -r rc_pingpong.pcap -Y tcp.len>0 -T fields -e ip.src -e tcp.payload
//	6   192.168.77.11 -> :18515   52 bytes  client's address
//	8   192.168.77.10 -> client   52 bytes  server's address
//	10  192.168.77.11 -> :18515    5 bytes  "done"
var (
	goldenClient = mustHex("303030303a3030303031313a6265313536613a303030303030303030303030303030303030303066666666633061383464306200")
	goldenServer = mustHex("303030303a3030303031313a3565303061653a303030303030303030303030303030303030303066666666633061383464306100")
	goldenDone   = mustHex("646f6e6500")
)

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func gid(s string) [16]byte { return netip.MustParseAddr(s).As16() }

func TestMarshalGolden(t *testing.T) {
	for _, tc := range []struct {
		d    Dest
		want []byte
	}{
		{Dest{QPN: 0x11, PSN: 0xbe156a, GID: gid("::ffff:192.168.77.11")}, goldenClient},
		{Dest{QPN: 0x11, PSN: 0x5e00ae, GID: gid("::ffff:192.168.77.10")}, goldenServer},
	} {
		m := tc.d.Marshal()
		assert.Equal(t, tc.want, m[:], "Marshal(%+v): %q", tc.d, m[:])
		got, err := Parse(tc.want)
		require.NoError(t, err)
		assert.Equal(t, tc.d, got)
	}
	assert.Equal(t, goldenDone, Done[:])
	assert.Equal(t, 52, MsgSize)
}

func TestMarshalRoundTrip(t *testing.T) {
	for _, d := range []Dest{
		{},
		{LID: 0xffff, QPN: 0xffffff, PSN: 0xffffff, GID: gid("fe80::5054:ff:fe77:a")},
		{LID: 1, QPN: 0x123, PSN: 0x1, GID: gid("fd00:77::1")},
	} {
		m := d.Marshal()
		assert.Zero(t, m[MsgSize-1], "NUL-terminated")
		got, err := Parse(m[:])
		require.NoError(t, err)
		assert.Equal(t, d, got)
	}
}

func TestParseRejects(t *testing.T) {
	for _, s := range []string{
		"",
		"0000:000011:5e00ae", // no GID
		"0000:000011:5e00ae:00000000000000000000ffffc0a84d0",    // 31 hex digits
		"0000:000011:5e00ae:00000000000000000000ffffc0a84d0a00", // 34
		"0000:1000000:5e00ae:00000000000000000000ffffc0a84d0a",  // QPN > 24 bits
		"0000:000011:5e00ae:00000000000000000000ffffc0a84dxx",
		"0000:000011:5e00ae:00000000000000000000ffffc0a84d0a:1",
	} {
		_, err := Parse([]byte(s + "\x00"))
		assert.ErrorIs(t, err, ErrBadMsg, "Parse(%q)", s)
	}
}

func TestGIDHelpers(t *testing.T) {
	for _, tc := range []struct {
		gid  string
		str  string
		grh  bool
		addr string
	}{
		{"::ffff:192.168.77.10", "::ffff:192.168.77.10", true, "192.168.77.10"},
		{"::", "::", false, "::"},
		{"fd00:77::a", "fd00:77::a", true, "fd00:77::a"},
		{"fe80::5054:ff:fe77:a", "fe80::5054:ff:fe77:a", true, "fe80::5054:ff:fe77:a"},
		{"fe80::", "fe80::", false, "fe80::"}, // interface ID zero: no GRH, as pp_connect_ctx
	} {
		g := gid(tc.gid)
		assert.Equal(t, tc.str, GIDString(g), "GIDString(%s)", tc.gid)
		assert.Equal(t, tc.grh, HasGRH(g), "HasGRH(%s)", tc.gid)
		assert.Equal(t, netip.MustParseAddr(tc.addr), GIDAddr(g), "GIDAddr(%s)", tc.gid)
	}
}

// TestExchangeBytes plays rc_pingpong's side of each exchange from the
// golden capture against ours and checks every byte ours sends.
func TestExchangeBytes(t *testing.T) {
	t.Run("client", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		peer := make(chan []byte, 1)
		go func() { // the stock server: read, write, read "done"
			defer b.Close()
			var in bytes.Buffer
			buf := make([]byte, MsgSize)
			io.ReadFull(b, buf)
			in.Write(buf)
			b.Write(goldenServer)
			done := make([]byte, len(Done))
			io.ReadFull(b, done)
			in.Write(done)
			peer <- in.Bytes()
		}()
		my := Dest{QPN: 0x11, PSN: 0xbe156a, GID: gid("::ffff:192.168.77.11")}
		rem, err := ClientExchange(a, &my)
		require.NoError(t, err)
		assert.Equal(t, Dest{QPN: 0x11, PSN: 0x5e00ae, GID: gid("::ffff:192.168.77.10")}, rem)
		assert.Equal(t, append(bytes.Clone(goldenClient), goldenDone...), <-peer)
	})
	t.Run("server", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		peer := make(chan []byte, 1)
		go func() { // the stock client: write, read, write "done"
			defer b.Close()
			b.Write(goldenClient)
			buf := make([]byte, MsgSize)
			io.ReadFull(b, buf)
			b.Write(goldenDone)
			peer <- buf
		}()
		my := Dest{QPN: 0x11, PSN: 0x5e00ae, GID: gid("::ffff:192.168.77.10")}
		var connected *Dest
		rem, err := ServerExchange(a, &my, func(rem Dest) error {
			connected = &rem
			return nil
		})
		require.NoError(t, err)
		want := Dest{QPN: 0x11, PSN: 0xbe156a, GID: gid("::ffff:192.168.77.11")}
		assert.Equal(t, want, rem)
		require.NotNil(t, connected, "the QP is connected before the server answers")
		assert.Equal(t, want, *connected)
		assert.Equal(t, goldenServer, <-peer)
	})
	t.Run("server connect fails", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		go func() {
			defer b.Close()
			b.Write(goldenClient)
			io.Copy(io.Discard, b)
		}()
		boom := errors.New("boom")
		_, err := ServerExchange(a, &Dest{}, func(Dest) error { return boom })
		assert.ErrorIs(t, err, boom)
	})
	t.Run("server bad done", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		go func() {
			defer b.Close()
			b.Write(goldenClient)
			io.ReadFull(b, make([]byte, MsgSize))
			b.Write([]byte("dona\x00"))
		}()
		_, err := ServerExchange(a, &Dest{}, func(Dest) error { return nil })
		assert.ErrorIs(t, err, ErrBadMsg)
	})
}
