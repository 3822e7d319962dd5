package softrdma_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// BenchmarkWriteBW posts RDMA WRITEs of each size back to back with 64
// outstanding, as ib_write_bw does, between two devices in this process
// over loopback UDP, and reports MB/s (1 MB = 10^6 bytes, perftest's unit).
func BenchmarkWriteBW(b *testing.B) {
	for _, size := range []int{4096, 65536, 1 << 20} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			p := softrdmatest.NewPair(b, softrdmatest.Options{NoPcap: true,
				Cap: softrdma.Cap{MaxSendWR: 128, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
			src := make([]byte, size)
			dst := make([]byte, size)
			smr, err := p.A.Dev.RegMR(p.A.PD, src, rw)
			if err != nil {
				b.Fatal(err)
			}
			dmr, err := p.B.Dev.RegMR(p.B.PD, dst, rw)
			if err != nil {
				b.Fatal(err)
			}
			wr := softrdma.SendWR{Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
				SGL:        []softrdma.SGE{{Addr: smr.Addr(), Length: uint32(size), LKey: smr.LKey()}},
				RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}
			const depth = 64
			wcs := make([]softrdma.WC, depth)
			ctx := context.Background()
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			posted, done := 0, 0
			for done < b.N {
				for posted < b.N && posted-done < depth {
					if _, err := p.A.QP.PostSend(wr); err != nil {
						b.Fatal(err)
					}
					posted++
				}
				n, err := p.A.CQ.Wait(ctx, wcs)
				if err != nil {
					b.Fatal(err)
				}
				for _, wc := range wcs[:n] {
					if wc.Status != softrdma.WCSuccess {
						b.Fatalf("wc %v", wc.Status)
					}
				}
				done += n
			}
			b.StopTimer()
			reportConn(b, p)
			c := p.A.Dev.ConnStats()
			b.ReportMetric(float64(p.A.Dev.Counters().Retransmits.Load())/float64(b.N), "retransmits/op")
			b.ReportMetric(float64(c.SentDatagrams.Load())/float64(c.SendCalls.Load()+1), "dgrams/sendcall")
		})
	}
}

func reportConn(b *testing.B, p *softrdmatest.Pair) {
	for _, s := range []*softrdmatest.Side{p.A, p.B} {
		b.Logf("%v: %+v", s.Dev.LocalAddr(), s.Dev.ConnStats().Snapshot())
	}
}
