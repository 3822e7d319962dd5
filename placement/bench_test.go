package placement_test

import (
	"testing"

	"github.com/softrdma/softrdma/internal/memcopy"
	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
)

var benchSizes = []struct {
	name string
	n    int
}{{"64B", 64}, {"4KiB", 4 << 10}, {"1MiB", 1 << 20}}

// The destination of every benchmark below is the same slot of a 2 MiB
// region (cache-hot for the small sizes), so BenchmarkWrite and
// BenchmarkCopy differ only in what placement adds to copy(): the key
// lookup, the bounds check, the translation, the per-packet check (and,
// for an unbound cursor, the in-flight reference).

// BenchmarkCopy is the reference: a plain copy() of the payload.
func BenchmarkCopy(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			dst := make([]byte, 2<<20)
			src := make([]byte, sz.n)
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			for b.Loop() {
				copy(dst[100:], src)
			}
		})
	}
}

// BenchmarkMemcopy is the second reference: the copy placement itself
// uses (internal/memcopy: AVX-512 from 256 bytes to 64 KiB where the CPU
// has it, else copy()). BenchmarkCopy ÷ BenchmarkWrite is the issue's
// target (placement against copy()); BenchmarkMemcopy ÷ BenchmarkWrite is
// what the lookup, bounds check and translation cost on top of the same
// copy.
func BenchmarkMemcopy(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			dst := make([]byte, 2<<20)
			src := make([]byte, sz.n)
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			for b.Loop() {
				memcopy.Copy(dst[100:100+sz.n], src)
			}
		})
	}
}

// batch is how many messages a receive loop places between two quiescent
// states of its Reader in the benchmarks: one full receive batch
// (transport/conn.IdealBatchSize datagrams, each a WRITE ONLY message).
const batch = 64

// BenchmarkWrite places one RDMA WRITE ONLY message per op: Begin (lookup,
// bounds, translation), Write (copy), End, with the cursor bound to a
// Reader that quiesces after every batch of messages, as a receive loop
// does.
func BenchmarkWrite(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			e := placement.New(placement.Config{})
			mr := reg(b, e, pd1, make([]byte, 2<<20), rw)
			src := make([]byte, sz.n)
			va := mr.Addr() + 100
			rd := e.NewReader()
			defer rd.Close()
			var c placement.Cursor
			c.Bind(rd)
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if e.Begin(&c, pd1, mr.RKey(), va, uint64(sz.n), stag.AccessRemoteWrite) != placement.OK ||
					e.Write(&c, src) != placement.OK {
					b.Fatal("placement failed")
				}
				e.End(&c)
				if i++; i == batch {
					rd.Quiesce()
					i = 0
				}
			}
		})
	}
}

// BenchmarkWriteUnbound is BenchmarkWrite with a cursor that is not bound
// to a Reader: Begin counts a reference on the region and End drops it.
func BenchmarkWriteUnbound(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			e := placement.New(placement.Config{})
			mr := reg(b, e, pd1, make([]byte, 2<<20), rw)
			src := make([]byte, sz.n)
			va := mr.Addr() + 100
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			var c placement.Cursor
			for b.Loop() {
				if e.Begin(&c, pd1, mr.RKey(), va, uint64(sz.n), stag.AccessRemoteWrite) != placement.OK ||
					e.Write(&c, src) != placement.OK {
					b.Fatal("placement failed")
				}
				e.End(&c)
			}
		})
	}
}

// streamSize is the destination of the streaming benchmarks: like the
// memcpy.large figures of perf-anchors.md, consecutive slots of a large
// pre-faulted region (here 32 MiB, beyond the caches), wrapping.
const streamSize = 32 << 20

// BenchmarkCopyStream is copy() into consecutive slots of a large region:
// what a receive path does when messages fill a big buffer.
func BenchmarkCopyStream(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			dst := make([]byte, streamSize)
			for i := range dst {
				dst[i] = 1
			}
			src := make([]byte, sz.n)
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			off := 0
			for b.Loop() {
				copy(dst[off:], src)
				if off += sz.n; off+sz.n > streamSize {
					off = 0
				}
			}
		})
	}
}

// BenchmarkWriteStream is BenchmarkWrite (one WRITE ONLY message per op)
// into consecutive slots of a large region.
func BenchmarkWriteStream(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			e := placement.New(placement.Config{})
			mr, err := e.RegMR(pd1, make([]byte, streamSize), rw)
			if err != nil {
				b.Skip(err) // 32 MiB exceeds RLIMIT_MEMLOCK without CAP_IPC_LOCK
			}
			defer e.DeregMR(mr)
			src := make([]byte, sz.n)
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			var c placement.Cursor
			off := uint64(0)
			for b.Loop() {
				if e.Begin(&c, pd1, mr.RKey(), mr.Addr()+off, uint64(sz.n), stag.AccessRemoteWrite) != placement.OK ||
					e.Write(&c, src) != placement.OK {
					b.Fatal("placement failed")
				}
				e.End(&c)
				if off += uint64(sz.n); off+uint64(sz.n) > streamSize {
					off = 0
				}
			}
		})
	}
}

// BenchmarkWritePacket places the packets of long messages: mostly Write
// alone, as for MIDDLE packets (Begin and End run once per message of as
// many packets as fit in the 2 MiB region; the destination walks through
// it).
func BenchmarkWritePacket(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			e := placement.New(placement.Config{})
			mr := reg(b, e, pd1, make([]byte, 2<<20), rw)
			src := make([]byte, sz.n)
			va := mr.Addr() + 100
			packets := (2<<20 - 100) / sz.n
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			var c placement.Cursor
			for b.Loop() {
				if c.Resid() == 0 {
					e.End(&c)
					e.Begin(&c, pd1, mr.RKey(), va, uint64(packets*sz.n), stag.AccessRemoteWrite)
				}
				if e.Write(&c, src) != placement.OK {
					b.Fatal("placement failed")
				}
			}
			e.End(&c)
		})
	}
}

// BenchmarkRead is the READ responder: Begin, Read, End per op.
func BenchmarkRead(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			e := placement.New(placement.Config{})
			mr := reg(b, e, pd1, make([]byte, 2<<20), rw)
			dst := make([]byte, sz.n)
			va := mr.Addr() + 100
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			var c placement.Cursor
			for b.Loop() {
				e.Begin(&c, pd1, mr.RKey(), va, uint64(sz.n), stag.AccessRemoteRead)
				e.Read(&c, dst)
				e.End(&c)
			}
		})
	}
}

func BenchmarkScatter(b *testing.B) {
	e := placement.New(placement.Config{})
	mr := reg(b, e, pd1, make([]byte, 64<<10), rw)
	sgl := []placement.SGE{
		{Addr: mr.Addr(), Length: 1024, LKey: mr.LKey()},
		{Addr: mr.Addr() + 8192, Length: 4096, LKey: mr.LKey()},
		{Addr: mr.Addr() + 20000, Length: 4096, LKey: mr.LKey()},
	}
	src := make([]byte, 4096)
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		e.Scatter(pd1, sgl, 512, src)
	}
}

func BenchmarkAtomicFetchAdd(b *testing.B) {
	e := placement.New(placement.Config{})
	mr := reg(b, e, pd1, make([]byte, 4096), all)
	b.ReportAllocs()
	for b.Loop() {
		e.Atomic(pd1, mr.RKey(), mr.Addr(), placement.FetchAdd, 1, 0)
	}
}

// BenchmarkRegDeregMR is the cost of a registration and a deregistration of
// resident memory: prefault, mlock, page reference counts, table build, key
// allocation; then invalidate, drain, munlock. b.SetBytes makes the MB/s
// column registration bandwidth.
func BenchmarkRegDeregMR(b *testing.B) {
	for _, sz := range []struct {
		name string
		n    int
	}{{"4KiB", 4 << 10}, {"1MiB", 1 << 20}, {"64MiB", 64 << 20}} {
		b.Run(sz.name, func(b *testing.B) {
			e := placement.New(placement.Config{})
			buf := make([]byte, sz.n)
			for i := 0; i < len(buf); i += 4096 {
				buf[i] = 1 // resident, as a buffer pool is
			}
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			for b.Loop() {
				mr, err := e.RegMR(pd1, buf, rw)
				if err != nil {
					b.Fatal(err)
				}
				if err := e.DeregMR(mr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
