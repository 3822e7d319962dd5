package wire_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/softrdma/softrdma/transport/wire"
)

func BenchmarkParse(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, tc := range []struct {
		op wire.Opcode
		n  int
	}{
		{wire.OpRDMAWriteFirst, 1024},
		{wire.OpAcknowledge, 0},
	} {
		pkt := buildPacket(tc.op, tc.n, r)
		b.Run(tc.op.String(), func(b *testing.B) {
			b.ReportAllocs()
			var p wire.Packet
			var sink uint32
			for b.Loop() {
				if err := wire.Parse(pkt, &p); err != nil {
					b.Fatal(err)
				}
				sink += uint32(p.PSN())
			}
			_ = sink
		})
	}
}

func BenchmarkEncodeWriteFirst(b *testing.B) {
	b.ReportAllocs()
	buf := make([]byte, 64)
	bf := wire.BTHFields{Opcode: wire.OpRDMAWriteFirst, PKey: wire.DefaultPKey, DestQP: 0x11}
	rf := wire.RETHFields{VA: 0x000055bd720e2000, RKey: 0x226, DMALength: 8192}
	for b.Loop() {
		bf.PSN++
		wire.BTH(buf).Encode(&bf)
		wire.RETH(buf[wire.BTHSize:]).Encode(&rf)
	}
}

func BenchmarkComputeICRC(b *testing.B) {
	r := rand.New(rand.NewPCG(2, 2))
	for _, size := range []int{64, 1024, 4096} {
		// size is the UDP payload: BTH, payload and ICRC.
		pkt := buildPacket(wire.OpRDMAWriteMiddle, size-wire.BTHSize-wire.ICRCSize, r)
		for _, v := range []struct {
			name string
			h    wire.IPHeader
		}{
			{"IPv4", wire.IPHeader{Src: vm0, Dst: vm1, DF: true}},
			{"IPv6", wire.IPHeader{Src: vm0v6, Dst: vm1v6}},
		} {
			b.Run(fmt.Sprintf("%s/%dB", v.name, size), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(size))
				var sink uint32
				for b.Loop() {
					sink += wire.ComputeICRC(&v.h, 49441, wire.RoCEv2Port, pkt[:len(pkt)-wire.ICRCSize])
				}
				_ = sink
			})
		}
	}
}

// BenchmarkICRCCopy is what a requester does per MTU-4096 packet: copy
// the payload into the packet and compute the ICRC. "separate" copies and
// then hashes (ComputeICRC), "fused" hashes while it copies (ICRCState),
// from the headers' prefix computed once (as the transport caches it).
func BenchmarkICRCCopy(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 3))
	const payload = 4096
	src := make([]byte, payload)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	pkt := buildPacket(wire.OpRDMAWriteMiddle, payload, r)
	h := wire.IPHeader{Src: vm0, Dst: vm1, DF: true}
	body := pkt[wire.BTHSize : len(pkt)-wire.ICRCSize]
	b.Run("separate", func(b *testing.B) {
		b.SetBytes(payload)
		var sink uint32
		for b.Loop() {
			copy(body, src)
			sink += wire.ComputeICRC(&h, 49441, wire.RoCEv2Port, pkt[:len(pkt)-wire.ICRCSize])
		}
		_ = sink
	})
	b.Run("fused", func(b *testing.B) {
		b.SetBytes(payload)
		var sink uint32
		pre := wire.NewICRCPrefix(&h, 49441, wire.RoCEv2Port, len(pkt))
		for b.Loop() {
			st := pre.Begin(pkt)
			sink += st.Copy(body, src).Sum()
		}
		_ = sink
	})
}

func BenchmarkVerifyICRC(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 3))
	for _, size := range []int{64, 1024, 4096} {
		pkt := buildPacket(wire.OpRDMAWriteMiddle, size-wire.BTHSize-wire.ICRCSize, r)
		wire.PutICRC(&wire.IPHeader{Src: vm1, Dst: vm0, ID: 0x22e4, DF: true}, 49441, wire.RoCEv2Port, pkt)
		b.Run(fmt.Sprintf("knownID/%dB", size), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			h := wire.IPHeader{Src: vm1, Dst: vm0, ID: 0x22e4, DF: true}
			for b.Loop() {
				if ok, _ := wire.VerifyICRC(&h, 49441, wire.RoCEv2Port, pkt); !ok {
					b.Fatal("ICRC mismatch")
				}
			}
		})
		b.Run(fmt.Sprintf("recoverID/%dB", size), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			h := wire.IPHeader{Src: vm1, Dst: vm0, DF: true}
			for b.Loop() {
				if ok, id := wire.VerifyICRC(&h, 49441, wire.RoCEv2Port, pkt); !ok || id != 0x22e4 {
					b.Fatal("ID not recovered")
				}
			}
		})
	}
}

func BenchmarkICRCWithID(b *testing.B) {
	b.ReportAllocs()
	var c uint32
	for b.Loop() {
		c = wire.ICRCWithID(c, 1056, 0, 3)
	}
	_ = c
}

// BenchmarkSetID is moving a 1056-byte packet's ICRC to IPv4 ID 3, by
// ICRCWithID (SetICRCID) and by a filled ICRCIDTable.
func BenchmarkSetID(b *testing.B) {
	pkt := make([]byte, 1056)
	b.Run("SetICRCID", func(b *testing.B) {
		for b.Loop() {
			wire.SetICRCID(pkt, 0, 3)
		}
	})
	b.Run("ICRCIDTable", func(b *testing.B) {
		var t wire.ICRCIDTable
		t.Fill(len(pkt))
		b.ReportAllocs()
		for b.Loop() {
			t.SetID(pkt, 0, 3)
		}
	})
}
