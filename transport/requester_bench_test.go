package transport

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// BenchmarkRequesterWrite is the send worker's own work per RDMA WRITE at
// path MTU 4096, without the system call: the post (PostSend without
// waking the send worker), then the requester
// builds the message's packets into a send batch (BTH and RETH, STag
// lookup and gather from the MR, ICRC), which is then discarded instead
// of sent. The floor, measured in the same run, is the per-byte work no
// requester can skip: the same payload copied into the same slots with
// its CRC computed on the way (wire.ICRCState.Copy), 4096 bytes at a
// time. build ÷ floor is what the requester adds to it; write-bw's
// sending thread spends the rest of its time in sendmmsg
// (docs/performance.md, "Session 15").
func BenchmarkRequesterWrite(b *testing.B) {
	for _, size := range []int{4096, 65536} {
		b.Run(fmt.Sprintf("size=%d/build", size), func(b *testing.B) {
			d, qp, mr := newRequesterBench(b, size)
			wr := SendWR{Opcode: WRRDMAWrite, SGL: []SGE{{Addr: mr.Addr(), Length: uint32(size), LKey: mr.LKey()}},
				RemoteAddr: 0x1000, RKey: 0x1234}
			var tx txBatch
			tx.init(d)
			want := (size + 4095) / 4096
			// one posts a WRITE without PostSend's kick, runs the
			// requester into tx and returns how many packets it built
			// (checked when check is set and it built them all), then
			// discards them and marks the WQE completed.
			one := func(check bool) int {
				qp.sq.Lock()
				err := qp.postSendLocked(&wr)
				qp.sq.Unlock()
				if err != nil {
					b.Fatal(err)
				}
				qp.runRequester(&tx)
				n := tx.n
				if check && n == want {
					checkBuiltWrite(b, d, tx.pkts[:n], mr.Bytes())
				}
				clear(tx.pkts[:n])
				tx.n = 0 // discard instead of sending
				qp.sq.Lock()
				qp.comp.idx = qp.req.idx // pretend the WQE completed
				qp.comp.psn = qp.req.psn
				qp.sq.Unlock()
				return n
			}
			// The device's own send worker holds the kick of the move to
			// RTS (Modify kicks the QP) and takes the first WQE it finds:
			// warm up until this goroutine builds a whole message (checked)
			// and the kick is gone. It may be taken out of the queue and
			// not yet run, so one message of the timed loop may still go
			// to the worker: one, not more.
			for tries := 0; one(true) != want || qp.scheduled.Load(); tries++ {
				require.Less(b, tries, 1000, "the send worker keeps taking the WQEs")
				runtime.Gosched()
			}
			stolen := 0
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if n := one(false); n != want && (n != 0 || stolen > 0) {
					b.Fatalf("built %d packets, want %d", n, want)
				} else if n == 0 {
					stolen++
				}
			}
		})
		b.Run(fmt.Sprintf("size=%d/floor", size), func(b *testing.B) {
			src := make([]byte, size)
			for i := range src {
				src[i] = byte(i)
			}
			slab := make([]byte, txBatchSize*maxPacket)
			var sum uint32
			b.SetBytes(int64(size))
			for b.Loop() {
				for off, k := 0, 0; off < size; off, k = off+4096, k+1 {
					n := min(4096, size-off)
					dst := slab[k*maxPacket+wire.BTHSize : k*maxPacket+wire.BTHSize+n]
					sum ^= wire.ICRCState(0).Copy(dst, src[off:off+n]).Sum()
				}
			}
			benchSink = sum
		})
	}
}

var benchSink uint32

// checkBuiltWrite checks that pkts are the packets of one RDMA WRITE of
// payload at MTU 4096 (IBTA 9.2, 9.3.3: FIRST with a RETH, MIDDLEs, LAST,
// or one ONLY) whose ICRC trailers are right for the conn's IPv4 header
// with ID 0 (Annex A17.3.3), so that the benchmark times correct work.
func checkBuiltWrite(b *testing.B, d *Device, pkts []conn.Packet, payload []byte) {
	b.Helper()
	var p wire.Packet
	off := 0
	for i := range pkts {
		pk := &pkts[i]
		require.True(b, pk.ICRCReady, "packet %d", i)
		require.NoError(b, wire.Parse(pk.Buf, &p), "packet %d", i)
		want := wire.OpRDMAWriteMiddle
		switch {
		case len(pkts) == 1:
			want = wire.OpRDMAWriteOnly
		case i == 0:
			want = wire.OpRDMAWriteFirst
		case i == len(pkts)-1:
			want = wire.OpRDMAWriteLast
		}
		require.Equal(b, want, p.Opcode(), "packet %d", i)
		require.Equal(b, payload[off:off+len(p.Payload)], p.Payload, "packet %d", i)
		off += len(p.Payload)
		local := d.conn.LocalAddr()
		h := wire.IPHeader{Src: local.Addr(), Dst: pk.Addr.Addr(), DF: true}
		sport := pk.SrcPort // the QP's RoCEv2 source port (0: the conn's)
		if sport == 0 {
			sport = local.Port()
		}
		require.True(b, wire.VerifyICRCExact(&h, sport, pk.Addr.Port(), pk.Buf), "packet %d: ICRC", i)
	}
	require.Equal(b, len(payload), off)
}

// newRequesterBench returns a device on a pipe with an RC QP in RTS at
// path MTU 4096 (a retransmit timeout too long to fire during a
// benchmark) and a pinned MR of size bytes.
func newRequesterBench(b *testing.B, size int) (*Device, *QP, *placement.MR) {
	b.Helper()
	a, c := conn.NewPipe()
	e := placement.New(placement.Config{})
	d, err := NewDevice(Config{Conn: c, Placement: e})
	require.NoError(b, err)
	b.Cleanup(func() { d.Close(); a.Close() })
	cq := NewCQ(1 << 12)
	qp, err := d.CreateQP(1, &QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: QPTypeRC,
		Cap: Cap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(b, err)
	mem := make([]byte, size)
	for i := range mem {
		mem[i] = byte(i * 7)
	}
	mr, err := e.RegMR(1, mem, stag.AccessLocalWrite)
	require.NoError(b, err)
	b.Cleanup(func() { e.DeregMR(mr) })
	require.NoError(b, qp.Modify(&QPAttr{State: QPStateInit, Port: 1}, QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags))
	require.NoError(b, qp.Modify(&QPAttr{State: QPStateRTR, Dest: a.LocalAddr(), PathMTU: MTU4096, DestQPN: 0x99, RQPSN: 1000, MaxDestRdAtomic: 1, MinRNRTimer: 1},
		QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN|QPAttrMaxDestRdAtomic|QPAttrMinRNRTimer))
	require.NoError(b, qp.Modify(&QPAttr{State: QPStateRTS, SQPSN: 5000, Timeout: 31, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
		QPAttrState|QPAttrSQPSN|QPAttrTimeout|QPAttrRetryCnt|QPAttrRNRRetry|QPAttrMaxQPRdAtomic))
	return d, qp, mr
}
