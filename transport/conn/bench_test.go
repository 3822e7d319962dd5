package conn_test

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// BenchmarkLoopback measures Send -> Receive over loopback UDP in one
// process with 4096-byte RoCE payloads (an RDMA WRITE MIDDLE packet of
// 4112 bytes): one datagram per call, sendmmsg/recvmmsg batches, GSO, and
// GSO + GRO. These are the raw baselines the engine is compared with (see
// /work/shared/perf-anchors.md, udp.inproc.*.p4096). Each op is one packet;
// MB/s counts payload bytes sent, rx-MB/s and rx-dgrams/s what arrived.
func BenchmarkLoopback(b *testing.B) {
	for _, m := range []struct {
		name     string
		batch    int
		gso, gro bool
		sports   int // source ports the packets come from (0: the conn's own)
	}{
		{"plain", 1, false, false, 0},
		{"batch", conn.IdealBatchSize, false, false, 0},
		{"gso", conn.IdealBatchSize, true, false, 0},
		{"gsogro", conn.IdealBatchSize, true, true, 0},
		// Source ports (AcquireSourcePort): one, and four interleaved
		// packet by packet, which Send splits into four GSO sends.
		{"gso-sport", conn.IdealBatchSize, true, false, 1},
		{"gso-4sports", conn.IdealBatchSize, true, false, 4},
	} {
		b.Run(m.name, func(b *testing.B) {
			tx := listen(b, conn.Config{DisableGSO: !m.gso, DisableGRO: true})
			rx := listen(b, conn.Config{DisableGSO: true, DisableGRO: !m.gro})
			if g, _ := tx.Offload(); g != m.gso {
				b.Skip("no UDP GSO")
			}
			if _, g := rx.Offload(); g != m.gro {
				b.Skip("no UDP GRO")
			}
			var ports []uint16
			if m.sports > 0 {
				ports = freePorts(b, m.sports)
				for _, p := range ports {
					if err := tx.AcquireSourcePort(p); err != nil {
						b.Fatal(err)
					}
				}
			}
			benchmarkThroughput(b, tx, rx, m.batch, ports...)
		})
	}
	// The same loop over plain net.UDPConns (one datagram per call, no
	// ICRC): the reference to read the others against in the same run.
	b.Run("netudp", func(b *testing.B) {
		tx, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback, 0)))
		if err != nil {
			b.Fatal(err)
		}
		defer tx.Close()
		rx, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback, 0)))
		if err != nil {
			b.Fatal(err)
		}
		rx.SetReadBuffer(conn.DefaultSocketBuffer / 2) // capped by rmem_max
		benchmarkThroughput(b, &netUDP{tx, rx}, &netUDP{rx, rx}, 1)
	})
	b.Run("pipe", func(b *testing.B) {
		tx, rx := newPipe(b, 1<<16)
		benchmarkThroughput(b, tx, rx, conn.IdealBatchSize)
	})
}

// benchmarkThroughput sends batches from tx to rx, packet i from source
// port sports[i%len(sports)] if any are given.
func benchmarkThroughput(b *testing.B, tx, rx conn.Conn, batch int, sports ...uint16) {
	const payload = 4096
	size := wire.BTHSize + payload + wire.ICRCSize
	pkts := make([]conn.Packet, batch)
	for i := range pkts {
		pkts[i] = conn.Packet{Buf: newPacket(uint32(i), size), Addr: rx.LocalAddr()}
		if len(sports) > 0 {
			pkts[i].SrcPort = sports[i%len(sports)]
		}
	}
	var received atomic.Int64
	var last atomic.Int64 // UnixNano of the last packet received
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rpkts := make([]conn.Packet, batch)
		for {
			n, err := rx.Receive(rpkts)
			if err != nil {
				return
			}
			received.Add(int64(n))
			last.Store(time.Now().UnixNano())
		}
	}()
	b.SetBytes(payload)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for sent := 0; sent < b.N; {
		k := min(batch, b.N-sent)
		if err := tx.Send(pkts[:k]); err != nil {
			b.Fatal(err)
		}
		sent += k
	}
	b.StopTimer()
	// Wait for the receiver to drain: until everything arrived or nothing
	// did for 50ms (the rest was lost to a full receive buffer).
	for prev := int64(-1); received.Load() < int64(b.N) && received.Load() != prev; {
		prev = received.Load()
		time.Sleep(50 * time.Millisecond)
	}
	rx.Close()
	wg.Wait()
	got := received.Load()
	elapsed := time.Duration(last.Load() - start.UnixNano())
	if got > 0 && elapsed > 0 {
		b.ReportMetric(float64(got)/elapsed.Seconds(), "rx-dgrams/s")
		b.ReportMetric(float64(got)*payload/elapsed.Seconds()/1e6, "rx-MB/s")
	}
	b.ReportMetric(100*float64(int64(b.N)-got)/float64(b.N), "loss-%")
	if calls := tx.Stats().SendCalls.Load(); calls > 0 {
		b.ReportMetric(float64(b.N)/float64(calls), "dgrams/sendcall")
	}
}

// netUDP adapts a net.UDPConn to the part of conn.Conn the benchmark uses.
type netUDP struct {
	c, rx *net.UDPConn
}

func (u *netUDP) Send(pkts []conn.Packet) error {
	for _, p := range pkts {
		if _, err := u.c.WriteToUDPAddrPort(p.Buf, p.Addr); err != nil {
			return err
		}
	}
	return nil
}

var netUDPBuf = make([]byte, 65536)

func (u *netUDP) Receive(pkts []conn.Packet) (int, error) {
	n, from, err := u.c.ReadFromUDPAddrPort(netUDPBuf)
	if err != nil {
		return 0, err
	}
	pkts[0] = conn.Packet{Buf: netUDPBuf[:n], Addr: from}
	return 1, nil
}

func (u *netUDP) LocalAddr() netip.AddrPort            { return u.c.LocalAddr().(*net.UDPAddr).AddrPort() }
func (u *netUDP) BatchSize() int                       { return 1 }
func (u *netUDP) Stats() *conn.Stats                   { return new(conn.Stats) }
func (u *netUDP) SetImpairment(*conn.Impairment) error { return nil }
func (u *netUDP) SetTap(conn.Tap)                      {}
func (u *netUDP) Close() error                         { return u.c.Close() }
func (u *netUDP) Wake()                                { u.c.SetReadDeadline(time.Now()) }
func (u *netUDP) AcquireSourcePort(uint16) error       { return errors.ErrUnsupported }
func (u *netUDP) ReleaseSourcePort(uint16)             {}
