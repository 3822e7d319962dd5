package softrdma_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// copySizes straddle the bounds of internal/memcopy's AVX-512 loop
// (MinAVX512 256, MaxAVX512 64 KiB), its 64- and 256-byte steps, a page
// and the 4096-byte MTU's packet boundary.
var copySizes = []int{1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 319, 320, 4095, 4096, 4097, 8191, 65535, 65536, 65537}

// copyOffsets are the misalignments of the source and the target: every
// residue mod 64 that the loop's head and tail treat differently, and a
// page less a few bytes, so that packets cross pages mid-copy.
var copyOffsets = []int{0, 1, 7, 63, 100, 4093}

// checkGuard fails the test if a byte of b outside [lo, hi) is not g.
func checkGuard(t *testing.T, what string, b []byte, lo, hi int, g byte) {
	t.Helper()
	for i, c := range b {
		if (i < lo || i >= hi) && c != g {
			require.Failf(t, "byte outside the target changed", "%s: byte %d (target [%d,%d)) is 0x%02x, want guard 0x%02x", what, i, lo, hi, c, g)
		}
	}
}

// TestWriteReadMisalignedSizes: RDMA WRITE and RDMA READ of sizes around
// the data path copy's boundaries, between addresses at odd offsets in
// registered memory, place exactly the bytes of the message (IBTA 9.4.3,
// 9.4.4: the DMA length at the virtual address) and nothing around them.
// The local buffer is split over three SGEs of uneven lengths to put the
// SGE boundaries off the packet boundaries too.
func TestWriteReadMisalignedSizes(t *testing.T) {
	t.Run("pinned", func(t *testing.T) { testMisaligned(t, false) })
	// ODP MRs copy page by page through the NIC's view (pagetable's
	// copyFrames), not through the linear fast path.
	t.Run("odp", func(t *testing.T) { testMisaligned(t, true) })
}

func testMisaligned(t *testing.T, odp bool) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	const span = 65537 + 2*4096 + 256
	regAny := func(s *softrdmatest.Side) ([]byte, *softrdma.MR) {
		if !odp {
			return reg(t, s, span, rw)
		}
		as, err := s.Dev.AddressSpace()
		require.NoError(t, err)
		buf, err := as.Alloc(span)
		require.NoError(t, err)
		mr, err := s.Dev.RegMR(s.PD, buf, rw|softrdma.AccessOnDemand)
		require.NoError(t, err)
		t.Cleanup(func() { s.Dev.DeregMR(mr) })
		return buf, mr
	}
	src, srcMR := regAny(p.A)
	dst, dstMR := regAny(p.B)
	back, backMR := regAny(p.A)
	const guardDst, guardBack = 0xa5, 0x5a
	for i, n := range copySizes {
		for j, so := range copyOffsets {
			do := copyOffsets[(j+i)%len(copyOffsets)]
			name := fmt.Sprintf("%d bytes src+%d dst+%d", n, so, do)
			fill(uint64(i*100+j), src)
			for k := range dst {
				dst[k] = guardDst
			}
			for k := range back {
				back[k] = guardBack
			}
			// SGEs: n/3, then 1 byte (when n > 2), then the rest.
			var sgl []softrdma.SGE
			var backSGL []softrdma.SGE
			cuts := []int{0, n / 3, n / 3, n}
			if n > 2 {
				cuts[2] = n/3 + 1
			}
			for c := 0; c+1 < len(cuts); c++ {
				l := cuts[c+1] - cuts[c]
				if l == 0 {
					continue
				}
				sgl = append(sgl, softrdma.SGE{Addr: srcMR.Addr() + uint64(so+cuts[c]), Length: uint32(l), LKey: srcMR.LKey()})
				backSGL = append(backSGL, softrdma.SGE{Addr: backMR.Addr() + uint64(so+cuts[c]), Length: uint32(l), LKey: backMR.LKey()})
			}
			_, err := p.A.QP.PostSend(softrdma.SendWR{WRID: 1, Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
				SGL: sgl, RemoteAddr: dstMR.Addr() + uint64(do), RKey: dstMR.RKey()})
			require.NoError(t, err, name)
			wc := waitWC(t, p.A.CQ, 1)[0]
			require.Equal(t, softrdma.WCSuccess, wc.Status, "write %s", name)
			require.True(t, bytes.Equal(src[so:so+n], dst[do:do+n]), "write %s: target bytes differ", name)
			checkGuard(t, "write "+name, dst, do, do+n, guardDst)

			_, err = p.A.QP.PostSend(softrdma.SendWR{WRID: 2, Opcode: softrdma.WRRDMARead, Flags: softrdma.SendSignaled,
				SGL: backSGL, RemoteAddr: dstMR.Addr() + uint64(do), RKey: dstMR.RKey()})
			require.NoError(t, err, name)
			wc = waitWC(t, p.A.CQ, 1)[0]
			require.Equal(t, softrdma.WCSuccess, wc.Status, "read %s", name)
			require.Equal(t, uint32(n), wc.ByteLen, "read %s", name)
			require.True(t, bytes.Equal(src[so:so+n], back[so:so+n]), "read %s: bytes differ", name)
			checkGuard(t, "read "+name, back, so, so+n, guardBack)
		}
	}
}
