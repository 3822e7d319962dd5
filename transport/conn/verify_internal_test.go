package conn

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

// TestVerifyFromCachedPrefixIsVerifyICRC checks core.verify, which hashes
// from a cached prefix and tries the hint by table, against
// wire.VerifyICRC on the same packets: packets from three peers (so the
// two-entry cache evicts) of a few lengths, sent with IPv4 ID 0, with a
// GSO segment's ID under 64 (hinted right and wrong) and with an ID no
// hint names (as rxe sends); every one must verify with its true ID, and
// every packet with one bit flipped must fail, as VerifyICRC decides.
func TestVerifyFromCachedPrefixIsVerifyICRC(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, local := range []netip.AddrPort{
		netip.MustParseAddrPort("10.0.0.1:4791"),
		netip.MustParseAddrPort("[fd00::1]:4791"),
	} {
		c := &core{local: local, is4: local.Addr().Is4()}
		var peers []netip.AddrPort
		for i := range 3 {
			if c.is4 {
				peers = append(peers, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(2 + i)}), uint16(50000+i)))
			} else {
				peers = append(peers, netip.AddrPortFrom(netip.AddrFrom16([16]byte{0: 0xfd, 15: byte(2 + i)}), uint16(50000+i)))
			}
		}
		lens := []int{wire.BTHSize + wire.ICRCSize, 4128, 4112, 4112, 4112, 300}
		checked, hinted := 0, 0
		for range 3000 {
			from := peers[r.IntN(len(peers))]
			n := lens[r.IntN(len(lens))]
			pkt := make([]byte, n)
			for i := range pkt[:n-wire.ICRCSize] {
				pkt[i] = byte(r.Uint32())
			}
			var id uint16
			if c.is4 {
				switch r.IntN(3) {
				case 1:
					id = uint16(r.IntN(64))
				case 2:
					id = uint16(r.Uint32())
				}
			}
			h := wire.IPHeader{Src: from.Addr(), Dst: local.Addr(), ID: id, DF: true}
			wire.PutICRC(&h, from.Port(), local.Port(), pkt)
			hint := uint16(0)
			if c.is4 && r.IntN(2) == 0 {
				hint = uint16(r.IntN(64)) // right or wrong
			}
			ok, got := c.verify(pkt, from, hint)
			require.True(t, ok, "%v len %d ID %d hint %d", from, n, id, hint)
			require.Equal(t, id, got, "%v len %d hint %d: the ID that verified", from, n, hint)
			if hint != 0 && hint == id {
				hinted++
			}

			bit := r.IntN(8 * n)
			pkt[bit/8] ^= 1 << (bit % 8)
			h.ID = hint
			wantOK, wantID := wire.VerifyICRC(&h, from.Port(), local.Port(), pkt)
			ok, got = c.verify(pkt, from, hint)
			require.Equal(t, wantOK, ok, "%v len %d ID %d hint %d, bit %d flipped", from, n, id, hint, bit)
			if ok {
				require.Equal(t, wantID, got)
			}
			checked++
		}
		require.Equal(t, 3000, checked)
		if c.is4 {
			require.Positive(t, hinted, "some packets verified by their hint")
		}
	}
}

// TestCheckICRCAndDelta checks the two wire helpers verify uses against
// ComputeICRC: CheckICRC with the ICRC computed for the header it is given
// is VerifyICRC, and Delta(d) is the ICRC change of an ID change d.
func TestCheckICRCAndDelta(t *testing.T) {
	pkt := make([]byte, 4112)
	for i := range pkt {
		pkt[i] = byte(i * 13)
	}
	src, dst := netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("192.168.1.2")
	var tab wire.ICRCIDTable
	tab.Fill(len(pkt))
	h0 := wire.IPHeader{Src: src, Dst: dst, DF: true}
	c0 := wire.ComputeICRC(&h0, 49152, 4791, pkt[:len(pkt)-wire.ICRCSize])
	for d := range uint16(64) {
		h := wire.IPHeader{Src: src, Dst: dst, ID: d, DF: true}
		require.Equal(t, wire.ComputeICRC(&h, 49152, 4791, pkt[:len(pkt)-wire.ICRCSize]), c0^tab.Delta(d), "ID %d", d)
	}
	for _, id := range []uint16{0, 7, 63, 64, 0xbeef} {
		h := wire.IPHeader{Src: src, Dst: dst, ID: id, DF: true}
		wire.PutICRC(&h, 49152, 4791, pkt)
		ok, got := wire.CheckICRC(&h0, c0, pkt)
		require.True(t, ok, "ID %d", id)
		require.Equal(t, id, got)
	}
	ok, _ := wire.CheckICRC(&h0, c0, pkt[:wire.BTHSize+wire.ICRCSize-1])
	require.False(t, ok, "too short")
}

// BenchmarkVerify compares the receive check from a cached prefix
// (core.verify) with wire.VerifyICRC, which hashes the IP and UDP header
// words for every packet, in the same run: a 4112-byte packet (an RDMA
// WRITE MIDDLE at MTU 4096) sent as GSO segment 5 (IPv4 ID 5, which the
// receive path passes as the hint, the first ID to try: a segment's
// position in its GRO buffer) and as a lone datagram (ID 0).
func BenchmarkVerify(b *testing.B) {
	local, from := netip.MustParseAddrPort("127.0.0.1:4791"), netip.MustParseAddrPort("127.0.0.1:50000")
	for _, id := range []uint16{0, 5} {
		pkt := make([]byte, 4112)
		for i := range pkt {
			pkt[i] = byte(i)
		}
		h := wire.IPHeader{Src: from.Addr(), Dst: local.Addr(), ID: id, DF: true}
		wire.PutICRC(&h, from.Port(), local.Port(), pkt)
		name := "id=0"
		if id != 0 {
			name = "id=5"
		}
		b.Run(name+"/VerifyICRC", func(b *testing.B) {
			b.SetBytes(int64(len(pkt)))
			for b.Loop() {
				h := wire.IPHeader{Src: from.Addr(), Dst: local.Addr(), ID: id, DF: true}
				if ok, _ := wire.VerifyICRC(&h, from.Port(), local.Port(), pkt); !ok {
					b.Fatal("bad ICRC")
				}
			}
		})
		b.Run(name+"/cached", func(b *testing.B) {
			c := &core{local: local, is4: true}
			b.SetBytes(int64(len(pkt)))
			for b.Loop() {
				if ok, _ := c.verify(pkt, from, id); !ok {
					b.Fatal("bad ICRC")
				}
			}
		})
	}
}
