package placement_test

import (
	"bytes"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"unsafe"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
	"github.com/stretchr/testify/require"
)

func TestStatusString(t *testing.T) {
	for s := placement.OK; s <= placement.WouldFault; s++ {
		require.NotContains(t, s.String(), "Status(")
	}
	require.Equal(t, "remote access error", placement.RemoteAccessErr.String())
	require.Equal(t, "Status(200)", placement.Status(200).String())
	require.Equal(t, "CMP_SWAP", placement.CmpSwap.String())
	require.Equal(t, "FETCH_ADD", placement.FetchAdd.String())
}

func TestRegMRErrors(t *testing.T) {
	e := placement.New(placement.Config{PinLimit: 8 << 20})
	buf := make([]byte, 4096)
	for _, tc := range []struct {
		name   string
		buf    []byte
		access stag.Access
		is     error
		msg    string
	}{
		{"empty", nil, rw, placement.ErrInvalid, "placement: reg MR: empty buffer: invalid argument"},
		{"remote write without local write", buf, stag.AccessRemoteWrite, placement.ErrInvalid,
			"placement: reg MR: REMOTE_WRITE without LOCAL_WRITE: invalid argument"},
		{"remote atomic without local write", buf, stag.AccessRemoteAtomic | stag.AccessRemoteRead, placement.ErrInvalid,
			"placement: reg MR: REMOTE_READ|REMOTE_ATOMIC without LOCAL_WRITE: invalid argument"},
		{"unknown flag", buf, stag.AccessLocalWrite | 1<<20, placement.ErrInvalid,
			"placement: reg MR: unknown access flags 0x100000: invalid argument"},
		{"on demand without an address space", buf, stag.AccessLocalWrite | stag.AccessOnDemand, placement.ErrNoODP,
			"placement: reg MR: ON_DEMAND: on-demand paging not supported by this device: operation not supported"},
		{"zero based", buf, stag.AccessLocalWrite | stag.AccessZeroBased, placement.ErrNotSupported, ""},
		{"over the pin limit", make([]byte, 16<<20), rw, hostmem.ErrPinLimit,
			"placement: reg MR: hostmem: pin 16777216 bytes: would exceed the configured pin limit (8388608 bytes, 0 already pinned)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mr, err := e.RegMR(pd1, tc.buf, tc.access)
			require.Nil(t, mr)
			require.ErrorIs(t, err, tc.is)
			if tc.msg != "" {
				require.EqualError(t, err, tc.msg)
			}
		})
	}
	require.Zero(t, e.PinnedBytes())
	require.EqualValues(t, 8<<20, e.PinLimit())

	// Read-only registrations need no LOCAL_WRITE.
	mr := reg(t, e, pd1, buf, stag.AccessRemoteRead)
	require.Equal(t, stag.AccessRemoteRead, mr.Access())
	require.ErrorIs(t, placement.New(placement.Config{}).DeregMR(mr), placement.ErrInvalid, "another device's MR")
}

func TestMRAccessors(t *testing.T) {
	e := placement.New(placement.Config{})
	buf := make([]byte, 10000)
	mr := reg(t, e, 7, buf[100:9000], rw)
	require.Equal(t, uint64(uintptr(addr(buf[100:]))), mr.Addr())
	require.Equal(t, 8900, mr.Len())
	require.Equal(t, rw, mr.Access())
	require.EqualValues(t, 7, mr.PD())
	require.Equal(t, mr.LKey(), mr.RKey())
	require.Equal(t, &buf[100], &mr.Bytes()[0])
	require.NotZero(t, stag.STag(mr.LKey()).Index(), "index 0 is never used")
	first, last := mr.Addr()>>12, (mr.Addr()+uint64(mr.Len())-1)>>12
	require.EqualValues(t, (last-first+1)*4096, e.PinnedBytes(), "whole pages are charged")
	require.NoError(t, e.DeregMR(mr))
	require.ErrorIs(t, e.DeregMR(mr), placement.ErrDeregistered)
	require.Zero(t, e.PinnedBytes())
}

// TestRemoteAccessStatus has one row per outcome of Begin (and of the
// Write/Read that follow), and checks that a failure places nothing.
func TestRemoteAccessStatus(t *testing.T) {
	e := placement.New(placement.Config{})
	const n = 3 * 4096
	buf, checkGuards := guarded(t, n)
	mr := reg(t, e, pd1, buf, rw)
	ro := reg(t, e, pd1, buf, stag.AccessRemoteRead)
	local := reg(t, e, pd1, buf, stag.AccessLocalWrite)
	stale := reg(t, e, pd1, buf, rw)
	staleKey := stale.RKey()
	require.NoError(t, e.DeregMR(stale))
	fresh := reg(t, e, pd1, buf, rw) // reuses the freed index with a new key
	require.Equal(t, stag.STag(staleKey).Index(), stag.STag(fresh.RKey()).Index())
	require.NotEqual(t, staleKey, fresh.RKey())
	va := mr.Addr()
	key := mr.RKey()
	forged := uint32(stag.Make(stag.STag(key).Index(), stag.STag(key).Key()+1))

	const W, R = stag.AccessRemoteWrite, stag.AccessRemoteRead
	for _, tc := range []struct {
		name   string
		pd     uint32
		rkey   uint32
		va     uint64
		length uint64
		need   stag.Access
		want   placement.Status
	}{
		{"write whole region", pd1, key, va, n, W, placement.OK},
		{"read whole region", pd1, key, va, n, R, placement.OK},
		{"write last byte", pd1, key, va + n - 1, 1, W, placement.OK},
		{"read-only region, read", pd1, ro.RKey(), va, 10, R, placement.OK},
		// rxe check_rkey: a zero-byte op needs no valid rkey or address.
		{"zero length, no key", pd1, 0, 0, 0, W, placement.OK},
		{"zero length, forged key, wild va", pd2, forged, math.MaxUint64, 0, R, placement.OK},
		// Key failures: remote access error.
		{"rkey 0", pd1, 0, va, 1, W, placement.RemoteAccessErr},
		{"unknown index", pd1, uint32(stag.Make(5000, 1)), va, 1, W, placement.RemoteAccessErr},
		{"forged key byte", pd1, forged, va, 1, W, placement.RemoteAccessErr},
		{"stale key after re-registration", pd1, staleKey, va, 1, W, placement.RemoteAccessErr},
		{"other PD", pd2, key, va, 1, W, placement.RemoteAccessErr},
		{"write to read-only region", pd1, ro.RKey(), va, 1, W, placement.RemoteAccessErr},
		{"read of local-only region", pd1, local.RKey(), va, 1, R, placement.RemoteAccessErr},
		// Bounds failures: remote access error.
		{"va-1", pd1, key, va - 1, 1, W, placement.RemoteAccessErr},
		{"va-1, whole length", pd1, key, va - 1, n, W, placement.RemoteAccessErr},
		{"va+len", pd1, key, va + n, 1, W, placement.RemoteAccessErr},
		{"last byte plus one", pd1, key, va + n - 1, 2, R, placement.RemoteAccessErr},
		{"length one more than the region", pd1, key, va, n + 1, W, placement.RemoteAccessErr},
		{"length overflow near 2^64", pd1, key, va + 16, math.MaxUint64 - 15, W, placement.RemoteAccessErr},
		{"length 2^64-1", pd1, key, va, math.MaxUint64, W, placement.RemoteAccessErr},
		{"va near 2^64", pd1, key, math.MaxUint64, 1, W, placement.RemoteAccessErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fill(buf, 0)
			var c placement.Cursor
			st := e.Begin(&c, tc.pd, tc.rkey, tc.va, tc.length, tc.need)
			require.Equal(t, tc.want, st)
			if st != placement.OK {
				require.False(t, c.Busy())
				require.Equal(t, make([]byte, n), buf, "a failed check places nothing")
				checkGuards()
				return
			}
			require.Equal(t, tc.length, c.Resid())
			require.Equal(t, tc.length != 0, c.Busy())
			if tc.need == W {
				// One byte more than the message is an invalid request
				// and places nothing.
				require.Equal(t, placement.InvalidRequest, e.Write(&c, make([]byte, tc.length+1)))
				require.Equal(t, make([]byte, n), buf)
				payload := bytes.Repeat([]byte{marker}, int(tc.length))
				require.Equal(t, placement.OK, e.Write(&c, payload))
				if tc.length > 0 {
					off := tc.va - va
					require.Equal(t, payload, buf[off:off+tc.length])
				}
				require.Equal(t, int(tc.length), bytes.Count(buf, []byte{marker}))
			} else {
				require.Equal(t, placement.InvalidRequest, e.Read(&c, make([]byte, tc.length+1)))
				require.Equal(t, placement.OK, e.Read(&c, make([]byte, tc.length)))
			}
			require.Zero(t, c.Resid())
			require.Equal(t, placement.OK, e.Write(&c, nil), "an empty payload at the end is fine")
			require.Equal(t, placement.InvalidRequest, e.Write(&c, []byte{1}))
			e.End(&c)
			require.False(t, c.Busy())
			checkGuards()
		})
	}
}

// TestWriteReadBackThroughSecondMR writes a multi-packet message through
// one key and reads it back through another region over the same memory.
func TestWriteReadBackThroughSecondMR(t *testing.T) {
	e := placement.New(placement.Config{})
	hb, err := e.HostAlloc(64 << 10)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, hb.Free()) })
	mem := hb.Bytes()
	w := reg(t, e, pd1, mem[1000:60000], stag.AccessLocalWrite|stag.AccessRemoteWrite)
	r := reg(t, e, pd1, mem[:], stag.AccessRemoteRead)
	require.ErrorIs(t, hb.Free(), hostmem.ErrBufferBusy)

	msg := make([]byte, 50000)
	for i := range msg {
		msg[i] = byte(i*31 + i>>8)
	}
	const mtu = 4096
	va := w.Addr() + 777
	var c placement.Cursor
	require.Equal(t, placement.OK, e.Begin(&c, pd1, w.RKey(), va, uint64(len(msg)), stag.AccessRemoteWrite))
	for off := 0; off < len(msg); off += mtu {
		require.Equal(t, placement.OK, e.Write(&c, msg[off:min(off+mtu, len(msg))]), "packet at %d", off)
	}
	require.Zero(t, c.Resid())
	e.End(&c)

	// The application sees the bytes (written through the NIC mapping).
	require.Equal(t, msg, mem[1000+777:1000+777+len(msg)])

	got := make([]byte, len(msg))
	rva := r.Addr() + 1000 + 777
	require.Equal(t, placement.OK, e.Begin(&c, pd1, r.RKey(), rva, uint64(len(got)), stag.AccessRemoteRead))
	for off := 0; off < len(got); off += mtu {
		require.Equal(t, placement.OK, e.Read(&c, got[off:min(off+mtu, len(got))]))
	}
	e.End(&c)
	require.Equal(t, msg, got)
}

// TestDeregWaitsForCursor: deregistration invalidates the key at once but
// returns only when the cursor that holds the region has ended.
func TestDeregWaitsForCursor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := placement.New(placement.Config{})
		buf := make([]byte, 8192)
		mr, err := e.RegMR(pd1, buf, rw)
		require.NoError(t, err)
		var c placement.Cursor
		require.Equal(t, placement.OK, e.Begin(&c, pd1, mr.RKey(), mr.Addr(), 8192, stag.AccessRemoteWrite))
		require.Equal(t, placement.OK, e.Write(&c, []byte{1, 2, 3}))

		done := make(chan error)
		go func() { done <- e.DeregMR(mr) }()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("DeregMR returned while a cursor held the region")
		default:
		}
		// The key is invalid already: new messages and the held cursor's
		// next packet fail, and nothing is placed.
		var c2 placement.Cursor
		require.Equal(t, placement.RemoteAccessErr, e.Begin(&c2, pd1, mr.RKey(), mr.Addr(), 1, stag.AccessRemoteWrite))
		require.Equal(t, placement.RemoteAccessErr, e.Write(&c, []byte{9}))
		require.Equal(t, byte(0), buf[3])
		require.NotZero(t, e.PinnedBytes(), "still pinned while the cursor holds it")

		e.End(&c)
		require.NoError(t, <-done)
		require.Zero(t, e.PinnedBytes())
		require.Equal(t, []byte{1, 2, 3}, buf[:3])
	})
}

// TestScatterGatherSGL scatters across three SGEs in three regions (one in
// a memfd buffer) at every offset and gathers back.
func TestScatterGatherSGL(t *testing.T) {
	e := placement.New(placement.Config{})
	hb, err := e.HostAlloc(8192)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, hb.Free()) })
	a, checkA := guarded(t, 5000)
	b, checkB := guarded(t, 300)
	mra := reg(t, e, pd1, a, stag.AccessLocalWrite)
	mrb := reg(t, e, pd1, b, stag.AccessLocalWrite)
	mrc := reg(t, e, pd1, hb.Bytes(), stag.AccessLocalWrite|stag.AccessRemoteRead)
	cMem := hb.Bytes()
	sgl := []placement.SGE{
		{Addr: mra.Addr() + 10, Length: 4000, LKey: mra.LKey()},
		{Addr: mrb.Addr() + 0, Length: 300, LKey: mrb.LKey()},
		{Addr: mrc.Addr() + 4000, Length: 1000, LKey: mrc.LKey()},
	}
	total, st := e.CheckSGL(pd1, sgl, stag.AccessLocalWrite)
	require.Equal(t, placement.OK, st)
	require.EqualValues(t, 5300, total)

	// Where SGL byte i lives.
	at := func(i int) *byte {
		switch {
		case i < 4000:
			return &a[10+i]
		case i < 4300:
			return &b[i-4000]
		}
		return &cMem[4000+i-4300]
	}
	for _, tc := range []struct{ off, n int }{
		{0, 5300}, {0, 1}, {3999, 2}, {3999, 302}, {4000, 300}, {4299, 1001}, {5299, 1}, {17, 5000}, {5300, 0}, {123, 0},
	} {
		fill(a, 0)
		fill(b, 0)
		fill(cMem, 0)
		src := make([]byte, tc.n)
		for i := range src {
			src[i] = byte(i%251 + 1)
		}
		require.Equal(t, placement.OK, e.Scatter(pd1, sgl, uint64(tc.off), src), "scatter %+v", tc)
		for i := 0; i < 5300; i++ {
			want := byte(0)
			if i >= tc.off && i < tc.off+tc.n {
				want = src[i-tc.off]
			}
			require.Equal(t, want, *at(i), "SGL byte %d after scatter %+v", i, tc)
		}
		got := make([]byte, tc.n)
		require.Equal(t, placement.OK, e.Gather(pd1, sgl, uint64(tc.off), got))
		require.Equal(t, src, got)
	}
	checkA()
	checkB()

	// Beyond the SGL: LocalLenErr, and nothing placed.
	fill(a, 0)
	for _, tc := range []struct {
		off uint64
		n   int
	}{{0, 5301}, {5300, 1}, {5301, 0}, {1, 5300}, {math.MaxUint64, 2}} {
		require.Equal(t, placement.LocalLenErr, e.Scatter(pd1, sgl, tc.off, make([]byte, tc.n)), "%+v", tc)
		require.Equal(t, placement.LocalLenErr, e.Gather(pd1, sgl, tc.off, make([]byte, tc.n)), "%+v", tc)
	}
	require.Equal(t, make([]byte, len(a)), a)

	// Protection failures.
	bad := func(i int, f func(*placement.SGE)) []placement.SGE {
		s := append([]placement.SGE(nil), sgl...)
		f(&s[i])
		return s
	}
	ro := reg(t, e, pd1, b, stag.AccessRemoteRead)
	for _, tc := range []struct {
		name string
		pd   uint32
		sgl  []placement.SGE
	}{
		{"other PD", pd2, sgl},
		{"bad lkey", pd1, bad(1, func(s *placement.SGE) { s.LKey++ })},
		{"SGE before the region", pd1, bad(1, func(s *placement.SGE) { s.Addr-- })},
		{"SGE past the region", pd1, bad(2, func(s *placement.SGE) { s.Length = 8192 - 4000 + 1 })},
		{"no LOCAL_WRITE", pd1, bad(1, func(s *placement.SGE) { s.LKey = ro.LKey() })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, st := e.CheckSGL(tc.pd, tc.sgl, stag.AccessLocalWrite)
			require.Equal(t, placement.LocalProtErr, st)
			total := 0
			for _, s := range tc.sgl {
				total += int(s.Length)
			}
			require.Equal(t, placement.LocalProtErr, e.Scatter(tc.pd, tc.sgl, 0, make([]byte, total)))
		})
	}
	// A read-only region may be gathered from.
	roSGL := []placement.SGE{{Addr: ro.Addr(), Length: 300, LKey: ro.LKey()}}
	_, st = e.CheckSGL(pd1, roSGL, 0)
	require.Equal(t, placement.OK, st)
	require.Equal(t, placement.OK, e.Gather(pd1, roSGL, 0, make([]byte, 300)))
	// Zero-length SGEs name no memory and are skipped.
	z := []placement.SGE{{Addr: 0, Length: 0, LKey: 12345}, sgl[1], {Length: 0}}
	total, st = e.CheckSGL(pd1, z, stag.AccessLocalWrite)
	require.Equal(t, placement.OK, st)
	require.EqualValues(t, 300, total)
	require.Equal(t, placement.OK, e.Scatter(pd1, z, 0, make([]byte, 300)))
	require.Equal(t, placement.OK, e.Scatter(pd1, nil, 0, nil))
}

func TestAtomics(t *testing.T) {
	e := placement.New(placement.Config{})
	buf, checkGuards := guarded(t, 64)
	mr := reg(t, e, pd1, buf, all)
	noAtomic := reg(t, e, pd1, buf, rw)
	w := (mr.Addr() + 7) &^ 7 // first aligned word
	at := func() *uint64 { return (*uint64)(unsafe.Pointer(&buf[w-mr.Addr()])) }
	word := func() uint64 { return *at() }
	set := func(v uint64) { *at() = v }

	set(100)
	orig, st := e.Atomic(pd1, mr.RKey(), w, placement.CmpSwap, 7, 100)
	require.Equal(t, placement.OK, st)
	require.EqualValues(t, 100, orig, "CMP_SWAP returns the original value")
	require.EqualValues(t, 7, word(), "and swaps when it equals compare")

	orig, st = e.Atomic(pd1, mr.RKey(), w, placement.CmpSwap, 9, 100)
	require.Equal(t, placement.OK, st)
	require.EqualValues(t, 7, orig)
	require.EqualValues(t, 7, word(), "no swap when it differs")

	orig, st = e.Atomic(pd1, mr.RKey(), w, placement.FetchAdd, 5, 0)
	require.Equal(t, placement.OK, st)
	require.EqualValues(t, 7, orig, "FETCH_ADD returns the original value")
	require.EqualValues(t, 12, word())

	set(math.MaxUint64)
	orig, st = e.Atomic(pd1, mr.RKey(), w, placement.FetchAdd, 2, 0)
	require.Equal(t, placement.OK, st)
	require.EqualValues(t, uint64(math.MaxUint64), orig)
	require.EqualValues(t, 1, word(), "FETCH_ADD wraps modulo 2^64")

	set(42)
	end := mr.Addr() + uint64(mr.Len())
	for _, tc := range []struct {
		name string
		pd   uint32
		rkey uint32
		va   uint64
		op   placement.AtomicOp
		want placement.Status
	}{
		{"misaligned by 4", pd1, mr.RKey(), w + 4, placement.FetchAdd, placement.InvalidRequest},
		{"misaligned by 1", pd1, mr.RKey(), w + 1, placement.CmpSwap, placement.InvalidRequest},
		{"no REMOTE_ATOMIC", pd1, noAtomic.RKey(), w, placement.FetchAdd, placement.RemoteAccessErr},
		{"other PD", pd2, mr.RKey(), w, placement.FetchAdd, placement.RemoteAccessErr},
		{"bad key", pd1, mr.RKey() ^ 1, w, placement.FetchAdd, placement.RemoteAccessErr},
		{"before the region", pd1, mr.RKey(), w - 8, placement.FetchAdd, placement.RemoteAccessErr},
		{"at or across the end", pd1, mr.RKey(), end &^ 7, placement.FetchAdd, placement.RemoteAccessErr},
		{"unknown op", pd1, mr.RKey(), w, placement.AtomicOp(9), placement.InvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, st := e.Atomic(tc.pd, tc.rkey, tc.va, tc.op, 1, 42)
			require.Equal(t, tc.want, st)
			require.EqualValues(t, 42, word(), "nothing changed")
		})
	}
	checkGuards()
}

// TestAtomicsAreAtomic: concurrent FETCH_ADDs lose no update.
func TestAtomicsAreAtomic(t *testing.T) {
	e := placement.New(placement.Config{})
	buf := make([]byte, 8)
	mr := reg(t, e, pd1, buf, all)
	const G, N = 4, 2000
	done := make(chan struct{})
	for g := 0; g < G; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; i < N; i++ {
				if _, st := e.Atomic(pd1, mr.RKey(), mr.Addr(), placement.FetchAdd, 1, 0); st != placement.OK {
					panic(st)
				}
			}
		}()
	}
	for g := 0; g < G; g++ {
		<-done
	}
	orig, st := e.Atomic(pd1, mr.RKey(), mr.Addr(), placement.FetchAdd, 0, 0)
	require.Equal(t, placement.OK, st)
	require.EqualValues(t, G*N, orig)
}

// TestOverlappingMRsDoNotUnlock registers two regions that share pages and
// checks with the kernel's VmLck that deregistering one keeps the shared
// pages locked.
func TestOverlappingMRsDoNotUnlock(t *testing.T) {
	e := placement.New(placement.Config{})
	hb, err := e.HostAlloc(8 * 4096)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, hb.Free()) })
	mem := hb.Bytes()
	base := vmLckKB(t)
	a, err := e.RegMR(pd1, mem[:4*4096], rw) // pages 0-3
	require.NoError(t, err)
	b, err := e.RegMR(pd1, mem[2*4096+1:6*4096-1], rw) // pages 2-5
	require.NoError(t, err)
	require.Equal(t, base+6*4, vmLckKB(t))
	require.NoError(t, e.DeregMR(a))
	require.Equal(t, base+4*4, vmLckKB(t), "pages 2-3 stay locked for the second region")
	require.NoError(t, e.DeregMR(b))
	require.Equal(t, base, vmLckKB(t))
}

// TestNeverWritesOutsideRegion throws random (va, length, payload) requests
// at a region inside a guarded buffer: bytes land only where a request was
// accepted, and never outside the region.
func TestNeverWritesOutsideRegion(t *testing.T) {
	e := placement.New(placement.Config{})
	const n = 2*4096 + 123
	buf, checkGuards := guarded(t, n)
	mr := reg(t, e, pd1, buf, rw)
	shadow := make([]byte, n)
	seed := uint64(12345)
	rnd := func(m uint64) uint64 { seed = seed*6364136223846793005 + 1442695040888963407; return (seed >> 11) % m }
	edges := []uint64{0, 1, 2, 4095, 4096, n - 1, n, n + 1, math.MaxUint64, math.MaxUint64 - uint64(n)}
	for i := 0; i < 20000; i++ {
		var off, length uint64
		if i%2 == 0 {
			off, length = edges[rnd(uint64(len(edges)))], edges[rnd(uint64(len(edges)))]
		} else {
			off, length = rnd(n+10), rnd(n+10)
		}
		va := mr.Addr() + off
		if i%7 == 0 {
			va = mr.Addr() - 1 - rnd(10)
		}
		var c placement.Cursor
		st := e.Begin(&c, pd1, mr.RKey(), va, length, stag.AccessRemoteWrite)
		inside := va >= mr.Addr() && length <= n && va-mr.Addr() <= n-length
		require.Equal(t, inside || length == 0, st == placement.OK, "va %#x length %d", va, length)
		if st != placement.OK {
			continue
		}
		v := byte(i)
		for c.Resid() > 0 {
			k := min(c.Resid(), 1+rnd(5000))
			p := bytes.Repeat([]byte{v}, int(k))
			at := c.IOVA() - mr.Addr()
			require.Equal(t, placement.OK, e.Write(&c, p))
			copy(shadow[at:], p)
		}
		e.End(&c)
	}
	require.Equal(t, shadow, buf)
	checkGuards()
}

func TestZeroAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	e := placement.New(placement.Config{})
	buf := make([]byte, 64<<10)
	mr := reg(t, e, pd1, buf, all)
	sgl := []placement.SGE{
		{Addr: mr.Addr(), Length: 1000, LKey: mr.LKey()},
		{Addr: mr.Addr() + 5000, Length: 9000, LKey: mr.LKey()},
	}
	payload := make([]byte, 4096)
	rd := e.NewReader()
	defer rd.Close()
	var bound placement.Cursor
	bound.Bind(rd)
	for name, f := range map[string]func(){
		"bound Begin/Write/Read/End, Quiesce": func() {
			e.Begin(&bound, pd1, mr.RKey(), mr.Addr()+100, 8192, stag.AccessRemoteWrite)
			e.Write(&bound, payload)
			rd.Quiesce()
			e.Write(&bound, payload)
			e.End(&bound)
			e.Begin(&bound, pd1, mr.RKey(), mr.Addr()+100, 4096, stag.AccessRemoteRead)
			e.Read(&bound, payload)
			e.End(&bound)
			rd.Quiesce()
		},
		"Begin/Write/End": func() {
			var c placement.Cursor
			e.Begin(&c, pd1, mr.RKey(), mr.Addr()+100, 8192, stag.AccessRemoteWrite)
			e.Write(&c, payload)
			e.Write(&c, payload)
			e.End(&c)
		},
		"Begin/Read/End": func() {
			var c placement.Cursor
			e.Begin(&c, pd1, mr.RKey(), mr.Addr()+100, 4096, stag.AccessRemoteRead)
			e.Read(&c, payload)
			e.End(&c)
		},
		"failed Begin": func() {
			var c placement.Cursor
			e.Begin(&c, pd2, mr.RKey(), mr.Addr(), 1, stag.AccessRemoteWrite)
		},
		"Atomic":     func() { e.Atomic(pd1, mr.RKey(), mr.Addr(), placement.FetchAdd, 1, 0) },
		"CheckSGL":   func() { e.CheckSGL(pd1, sgl, stag.AccessLocalWrite) },
		"Gather":     func() { e.Gather(pd1, sgl, 500, payload) },
		"GatherWith": func() { e.GatherWith(pd1, sgl, 500, payload, plainCopier{}) },
		"Scatter":    func() { e.Scatter(pd1, sgl, 500, payload) },
	} {
		require.Zero(t, testing.AllocsPerRun(100, f), name)
	}
}

// plainCopier is a placement.Copier that only copies.
type plainCopier struct{}

func (plainCopier) Copy(dst, src []byte) { copy(dst, src) }
func (plainCopier) Copied([]byte)        {}

func TestHostAllocErrors(t *testing.T) {
	e := placement.New(placement.Config{})
	_, err := e.HostAlloc(0)
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), "hostmem:"))
}

// TestPlacementDuringReregistration places through whatever key is current
// while another goroutine deregisters and registers regions over the same
// memory (run with -race): every placement either succeeds or is refused,
// and no pin is left behind.
func TestPlacementDuringReregistration(t *testing.T) {
	e := placement.New(placement.Config{})
	buf := make([]byte, 3*4096)
	var cur atomic.Pointer[placement.MR]
	first, err := e.RegMR(pd1, buf, rw)
	require.NoError(t, err)
	cur.Store(first)
	var stop atomic.Bool
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func(g uint64) {
			defer wg.Done()
			payload := make([]byte, 1000)
			var c placement.Cursor
			for !stop.Load() {
				mr := cur.Load()
				// Each writer has its own bytes: two QPs writing the same
				// bytes race in real RDMA too.
				st := e.Begin(&c, pd1, mr.RKey(), mr.Addr()+g*4096, 3000, stag.AccessRemoteWrite)
				for st == placement.OK && c.Resid() > 0 {
					st = e.Write(&c, payload)
				}
				e.End(&c)
				switch st {
				case placement.OK:
					ok.Add(1)
				case placement.RemoteAccessErr:
					refused.Add(1)
				default:
					panic(st)
				}
			}
		}(uint64(g))
	}
	for i := 0; i < 300; i++ {
		old := cur.Load()
		mr, err := e.RegMR(pd1, buf, rw)
		require.NoError(t, err)
		cur.Store(mr)
		require.NoError(t, e.DeregMR(old))
	}
	stop.Store(true)
	wg.Wait()
	require.NoError(t, e.DeregMR(cur.Load()))
	require.Zero(t, e.PinnedBytes())
	t.Logf("%d messages placed, %d refused", ok.Load(), refused.Load())
}
