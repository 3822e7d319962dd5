package wire_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

// A packet built by hand with its CRC worked out independently (zlib's
// crc32 in roce_pcap.py's recipe, rxe-testbed): an RC ACK from
// 192.168.77.10:49441 to 192.168.77.11:4791, IPv4 ID 0x1234, DF.
func TestComputeICRCKnownAnswer(t *testing.T) {
	pkt := []byte{
		0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x12, 0x34, 0x56, // BTH: ACK, QP 0x11, PSN 0x123456
		0x1f, 0x00, 0x00, 0x07, // AETH: ACK, MSN 7
		0, 0, 0, 0, // ICRC
	}
	h := &wire.IPHeader{Src: vm0, Dst: vm1, ID: 0x1234, DF: true}
	want := refICRC(h, 49441, wire.RoCEv2Port, pkt[:len(pkt)-4])
	require.Equal(t, want, wire.ComputeICRC(h, 49441, wire.RoCEv2Port, pkt[:len(pkt)-4]))
	// FECN/BECN/Resv6 are masked: setting them changes nothing.
	pkt[4] = 0xc0
	require.Equal(t, want, wire.ComputeICRC(h, 49441, wire.RoCEv2Port, pkt[:len(pkt)-4]))
	wire.PutICRC(h, 49441, wire.RoCEv2Port, pkt)
	require.Equal(t, want, wire.PacketICRC(pkt))
	require.Equal(t, want, binary.LittleEndian.Uint32(pkt[len(pkt)-4:]), "ICRC goes on the wire little-endian")
}

func TestComputeICRCMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	hdrs := []wire.IPHeader{
		{Src: vm0, Dst: vm1, ID: 0, DF: true},
		{Src: vm1, Dst: vm0, ID: 0xbeef, DF: false},
		{Src: netip.AddrFrom16(vm0.As16()), Dst: netip.AddrFrom16(vm1.As16()), ID: 7, DF: true}, // IPv4-mapped
		{Src: vm0v6, Dst: vm1v6},
		{Src: netip.MustParseAddr("fe80::5054:ff:fe77:a"), Dst: netip.MustParseAddr("fe80::5054:ff:fe77:b")},
	}
	for _, op := range validOpcodes() {
		for _, n := range []int{0, 1, 2, 3, 4, 5, 63, 64, 65, 1024, 4096} {
			pkt := buildPacket(op, n, r)
			for i := range hdrs {
				h := &hdrs[i]
				sp := uint16(r.Uint32())
				got := wire.ComputeICRC(h, sp, wire.RoCEv2Port, pkt[:len(pkt)-4])
				want := refICRC(h, sp, wire.RoCEv2Port, pkt[:len(pkt)-4])
				require.Equalf(t, want, got, "ComputeICRC(%v, %s, n=%d)", h, op, n)
			}
		}
	}
}

func TestComputeICRCCoversEveryByte(t *testing.T) {
	// Flipping any bit outside the masked fields changes the ICRC.
	r := rand.New(rand.NewPCG(3, 4))
	pkt := buildPacket(wire.OpRDMAWriteFirst, 40, r)
	h := &wire.IPHeader{Src: vm0, Dst: vm1, ID: 0x55aa, DF: true}
	c := wire.ComputeICRC(h, 1000, wire.RoCEv2Port, pkt[:len(pkt)-4])
	for i := range len(pkt) - 4 {
		for bit := range 8 {
			pkt[i] ^= 1 << bit
			c2 := wire.ComputeICRC(h, 1000, wire.RoCEv2Port, pkt[:len(pkt)-4])
			pkt[i] ^= 1 << bit
			if i == 4 {
				require.Equal(t, c, c2, "BTH byte 4 is masked")
			} else {
				require.NotEqual(t, c, c2, "byte %d bit %d", i, bit)
			}
		}
	}
	for _, mod := range []func(h *wire.IPHeader){
		func(h *wire.IPHeader) { h.ID ^= 1 },
		func(h *wire.IPHeader) { h.DF = !h.DF },
		func(h *wire.IPHeader) { h.Src = vm1 },
		func(h *wire.IPHeader) { h.Dst = vm0 },
	} {
		h2 := *h
		mod(&h2)
		require.NotEqual(t, c, wire.ComputeICRC(&h2, 1000, wire.RoCEv2Port, pkt[:len(pkt)-4]))
	}
	require.NotEqual(t, c, wire.ComputeICRC(h, 1001, wire.RoCEv2Port, pkt[:len(pkt)-4]))
}

func TestVerifyICRCRecoversRandomIDs(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	ops := validOpcodes()
	for i := range 2000 {
		op := ops[r.IntN(len(ops))]
		n := r.IntN(4200)
		if i%10 == 0 {
			n = 9000 + r.IntN(2000) // past the per-length cache
		}
		pkt := buildPacket(op, n, r)
		id := uint16(r.Uint32())
		sender := &wire.IPHeader{Src: vm1, Dst: vm0, ID: id, DF: true}
		sp := uint16(r.Uint32())
		wire.PutICRC(sender, sp, wire.RoCEv2Port, pkt)

		guess := uint16(r.Uint32())
		if i%3 == 0 {
			guess = 0
		}
		rcv := &wire.IPHeader{Src: vm1, Dst: vm0, ID: guess, DF: true}
		ok, got := wire.VerifyICRC(rcv, sp, wire.RoCEv2Port, pkt)
		require.Truef(t, ok, "VerifyICRC(%s, len %d, id %#04x, guess %#04x)", op, len(pkt), id, guess)
		require.Equal(t, id, got)
		require.Equal(t, guess == id, wire.VerifyICRCExact(rcv, sp, wire.RoCEv2Port, pkt))

		// The DF bit is taken as given, not recovered.
		rcv.DF = false
		ok, got = wire.VerifyICRC(rcv, sp, wire.RoCEv2Port, pkt)
		if ok {
			require.NotEqual(t, id, got, "DF flipped yet the sender's ID matched")
		}
	}
}

func TestVerifyICRCRejectsCorruption(t *testing.T) {
	// A fixed set of corruptions. With the ID free, a random corruption
	// passes with probability 2^-16; these seeds are known to be rejected.
	r := rand.New(rand.NewPCG(7, 8))
	rejected := 0
	const trials = 500
	for range trials {
		pkt := buildPacket(wire.OpRDMAWriteMiddle, 1024, r)
		h := &wire.IPHeader{Src: vm1, Dst: vm0, ID: uint16(r.Uint32()), DF: true}
		wire.PutICRC(h, 49441, wire.RoCEv2Port, pkt)
		i := wire.BTHSize + r.IntN(len(pkt)-wire.BTHSize-4)
		pkt[i] ^= byte(1 + r.IntN(255))
		ok, _ := wire.VerifyICRC(&wire.IPHeader{Src: vm1, Dst: vm0, DF: true}, 49441, wire.RoCEv2Port, pkt)
		if !ok {
			rejected++
		}
	}
	require.Equal(t, trials, rejected)

	// Single-bit errors anywhere, including the ICRC itself.
	pkt := buildPacket(wire.OpSendOnly, 100, r)
	h := &wire.IPHeader{Src: vm1, Dst: vm0, ID: 0x4242, DF: true}
	wire.PutICRC(h, 49441, wire.RoCEv2Port, pkt)
	for i := range pkt {
		if i == 4 {
			continue // masked
		}
		for bit := range 8 {
			pkt[i] ^= 1 << bit
			ok, _ := wire.VerifyICRC(&wire.IPHeader{Src: vm1, Dst: vm0, DF: true}, 49441, wire.RoCEv2Port, pkt)
			pkt[i] ^= 1 << bit
			require.Falsef(t, ok, "bit %d of byte %d flipped", bit, i)
		}
	}
}

func TestVerifyICRCIPv6IsExact(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	pkt := buildPacket(wire.OpSendOnly, 64, r)
	h := &wire.IPHeader{Src: vm0v6, Dst: vm1v6}
	wire.PutICRC(h, 4791, wire.RoCEv2Port, pkt)
	ok, id := wire.VerifyICRC(h, 4791, wire.RoCEv2Port, pkt)
	require.True(t, ok)
	require.Zero(t, id)
	pkt[20] ^= 1
	ok, _ = wire.VerifyICRC(h, 4791, wire.RoCEv2Port, pkt)
	require.False(t, ok)
}

func TestVerifyICRCShortPacket(t *testing.T) {
	h := &wire.IPHeader{Src: vm0, Dst: vm1}
	for n := range wire.BTHSize + wire.ICRCSize {
		ok, _ := wire.VerifyICRC(h, 1, 2, make([]byte, n))
		require.False(t, ok)
		require.False(t, wire.VerifyICRCExact(h, 1, 2, make([]byte, n)))
	}
}

func TestICRCWithID(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{0, 1, 1024, 4096, 9000, 12000} {
		pkt := buildPacket(wire.OpRDMAWriteMiddle, n, r)
		h := &wire.IPHeader{Src: vm0, Dst: vm1, ID: 0, DF: true}
		wire.PutICRC(h, 49441, wire.RoCEv2Port, pkt)
		c0 := wire.PacketICRC(pkt)
		// A UDP GSO batch gives its segments IDs 0, 1, 2, ...
		for _, id := range []uint16{0, 1, 2, 3, 0x1234, 0xffff} {
			h.ID = id
			want := wire.ComputeICRC(h, 49441, wire.RoCEv2Port, pkt[:len(pkt)-4])
			require.Equal(t, want, wire.ICRCWithID(c0, len(pkt), 0, id), "n=%d id=%#x", n, id)
			require.Equal(t, c0, wire.ICRCWithID(want, len(pkt), id, 0))
		}
		wire.SetICRCID(pkt, 0, 7)
		h.ID = 7
		require.True(t, wire.VerifyICRCExact(h, 49441, wire.RoCEv2Port, pkt))
	}
}

// ICRCIDTable.SetID gives the ICRC of the packet sent with the new IPv4
// ID, computed from scratch, for every ID change of a GSO batch (0..63)
// and falls back to SetICRCID for larger changes and other lengths.
func TestICRCIDTable(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	var tab wire.ICRCIDTable
	require.Zero(t, tab.Len())
	for _, n := range []int{0, 1, 1024, 4096, 9000, 12000} {
		pkt := buildPacket(wire.OpRDMAWriteMiddle, n, r)
		tab.Fill(len(pkt))
		require.Equal(t, len(pkt), tab.Len())
		h := &wire.IPHeader{Src: vm0, Dst: vm1, DF: true}
		for _, ids := range [][2]uint16{{0, 0}, {0, 1}, {0, 15}, {0, 63}, {5, 9}, {63, 0}, {0, 64}, {0, 0xffff}, {0x1234, 0x1200}} {
			h.ID = ids[0]
			wire.PutICRC(h, 49441, wire.RoCEv2Port, pkt)
			tab.SetID(pkt, ids[0], ids[1])
			h.ID = ids[1]
			require.Equal(t, wire.ComputeICRC(h, 49441, wire.RoCEv2Port, pkt[:len(pkt)-4]), wire.PacketICRC(pkt), "n=%d ids=%v", n, ids)
		}
		// A packet of another length: the table does not apply.
		other := buildPacket(wire.OpRDMAWriteMiddle, n+4, r)
		h.ID = 0
		wire.PutICRC(h, 49441, wire.RoCEv2Port, other)
		tab.SetID(other, 0, 3)
		h.ID = 3
		require.True(t, wire.VerifyICRCExact(h, 49441, wire.RoCEv2Port, other))
	}
}

// An ICRC built piecewise with ICRCState (the headers, then the rest of the
// packet in chunks, some copied) is ComputeICRC's, and Copy copies.
func TestICRCStateMatchesComputeICRC(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	hdrs := []wire.IPHeader{
		{Src: vm0, Dst: vm1, ID: 0, DF: true},
		{Src: vm1, Dst: vm0, ID: 0xbeef},
		{Src: vm0v6, Dst: vm1v6},
	}
	for _, op := range validOpcodes() {
		for _, n := range []int{0, 1, 31, 32, 100, 4096} {
			pkt := buildPacket(op, n, r)
			body := pkt[:len(pkt)-wire.ICRCSize]
			for i := range hdrs {
				h := &hdrs[i]
				want := wire.ComputeICRC(h, 49441, wire.RoCEv2Port, body)
				out := make([]byte, len(pkt))
				copy(out, pkt[:wire.BTHSize])
				st := wire.BeginICRC(h, 49441, wire.RoCEv2Port, len(pkt), out)
				if r.IntN(2) == 0 {
					st = wire.NewICRCPrefix(h, 49441, wire.RoCEv2Port, len(pkt)).Begin(out)
				}
				for off := wire.BTHSize; off < len(body); {
					k := min(len(body)-off, 1+r.IntN(200))
					if r.IntN(2) == 0 {
						st = st.Copy(out[off:], body[off:off+k])
					} else {
						copy(out[off:], body[off:off+k])
						st = st.Update(out[off : off+k])
					}
					off += k
				}
				require.Equalf(t, want, st.Sum(), "%v, %s, n=%d", h, op, n)
				require.Equal(t, body, out[:len(body)])
			}
		}
	}
}

func TestICRCAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful with -race")
	}
	r := rand.New(rand.NewPCG(13, 14))
	pkt := buildPacket(wire.OpRDMAWriteMiddle, 1024, r)
	wire.PutICRC(&wire.IPHeader{Src: vm1, Dst: vm0, ID: 0x9999, DF: true}, 49441, wire.RoCEv2Port, pkt)
	h := &wire.IPHeader{Src: vm1, Dst: vm0, DF: true}
	h6 := &wire.IPHeader{Src: vm1v6, Dst: vm0v6}
	var sink uint32
	require.Zero(t, testing.AllocsPerRun(100, func() {
		sink += wire.ComputeICRC(h, 49441, wire.RoCEv2Port, pkt[:len(pkt)-4])
		sink += wire.ComputeICRC(h6, 49441, wire.RoCEv2Port, pkt[:len(pkt)-4])
	}))
	require.Zero(t, testing.AllocsPerRun(100, func() {
		ok, id := wire.VerifyICRC(h, 49441, wire.RoCEv2Port, pkt)
		if !ok || id != 0x9999 {
			panic(fmt.Sprint("VerifyICRC: ", ok, id))
		}
	}))
	require.Zero(t, testing.AllocsPerRun(100, func() {
		sink += wire.ICRCWithID(sink, 20000, 0, 1) // uncached length
	}))
	out := make([]byte, len(pkt))
	require.Zero(t, testing.AllocsPerRun(100, func() {
		st := wire.BeginICRC(h, 49441, wire.RoCEv2Port, len(pkt), pkt)
		sink += st.Copy(out, pkt[wire.BTHSize:len(pkt)-4]).Sum()
	}))
	_ = sink
}

// BeginCached, called on one prefix for a stream of packets as a sender
// builds them (the same first 8 BTH bytes over and over, with new AckReq
// and PSN bytes, then other opcodes, P_Keys and QPs, and random BTHs), is
// ComputeICRC's for every packet: its cache never answers for BTH bytes it
// was not computed from.
func TestBeginCachedMatchesComputeICRC(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	hdrs := []wire.IPHeader{
		{Src: vm0, Dst: vm1, DF: true},
		{Src: vm1, Dst: vm0, ID: 0x1234},
		{Src: vm0v6, Dst: vm1v6},
	}
	const n = 256
	for i := range hdrs {
		h := &hdrs[i]
		pkt := buildPacket(wire.OpRDMAWriteMiddle, n, r)
		body := pkt[:len(pkt)-wire.ICRCSize]
		pre := wire.NewICRCPrefix(h, 49441, wire.RoCEv2Port, len(pkt))
		for k := range 3000 {
			switch {
			case k%500 == 499: // another header entirely
				for j := range wire.BTHSize {
					body[j] = byte(r.Uint32())
				}
			case k%50 == 49: // another opcode, P_Key or QP: one of bytes 0-7
				body[r.IntN(8)] ^= byte(1 + r.IntN(255))
			default: // the next packet: AckReq and PSN only
				wire.BTH(body).SetPSN(wire.BTH(body).PSN().Add(1))
				body[8] = byte(r.IntN(2)) << 7
			}
			want := wire.ComputeICRC(h, 49441, wire.RoCEv2Port, body)
			got := pre.BeginCached(body).Update(body[wire.BTHSize:]).Sum()
			require.Equalf(t, want, got, "%v, packet %d, BTH % x", h, k, body[:wire.BTHSize])
			require.Equal(t, want, pre.Begin(body).Update(body[wire.BTHSize:]).Sum())
		}
	}
}
