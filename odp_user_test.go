package softrdma_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/softrdmatest"
)

// TestODPRemapBothSidesEveryByte: a check, as a user makes it, of ODP copies
// through the NIC's view. A READs B's ODP MR into its own ODP MR while
// both MRs are remapped; between rounds B's application rewrites its
// buffer through its own mapping. Every READ returns what B's
// application last wrote, and A's application reads every byte the
// READ responses placed, whatever frames the pages moved to.
func TestODPRemapBothSidesEveryByte(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		p := softrdmatest.NewPair(t, o)
		const size = 16 * pageSize
		src, srcMR := odpAlloc(t, p.B, size, rw)
		dst, dstMR := odpAlloc(t, p.A, size, rw)
		require.NoError(t, p.A.Dev.AdviseMR(p.A.PD, softrdma.AdvisePrefetchWrite, softrdma.AdviseFlagFlush,
			[]softrdma.SGE{{Addr: dstMR.Addr(), Length: size, LKey: dstMR.LKey()}}))
		for round := range 8 {
			fill(uint64(round)+1, src) // B's application, between remaps
			done := make(chan error, 2)
			go func() {
				for range 3 {
					if _, err := p.B.Dev.Remap(srcMR, softrdma.ScopeMR, softrdma.PolicyHold); err != nil {
						done <- fmt.Errorf("remap B: %w", err)
						return
					}
				}
				done <- nil
			}()
			go func() {
				for range 3 {
					if _, err := p.A.Dev.Remap(dstMR, softrdma.ScopeMR, softrdma.PolicyNAK); err != nil {
						done <- fmt.Errorf("remap A: %w", err)
						return
					}
				}
				done <- nil
			}()
			// READ in 4 pieces so that responses land while A's MR moves.
			for i := range 4 {
				off := uint64(i) * size / 4
				_, err := p.A.QP.PostSend(softrdma.SendWR{WRID: uint64(i), Opcode: softrdma.WRRDMARead, Flags: softrdma.SendSignaled,
					SGL:        []softrdma.SGE{{Addr: dstMR.Addr() + off, Length: size / 4, LKey: dstMR.LKey()}},
					RemoteAddr: srcMR.Addr() + off, RKey: srcMR.RKey()})
				require.NoError(t, err)
			}
			for _, wc := range waitWC(t, p.A.CQ, 4) {
				require.Equal(t, softrdma.WCSuccess, wc.Status)
			}
			require.NoError(t, <-done)
			require.NoError(t, <-done)
			require.True(t, bytes.Equal(src, dst), "round %d: A's application does not read what B's application wrote", round)
		}
	})
}

// TestImplicitODPFreeAndReallocate: WRITEs through an implicit ODP
// MR land in the frames the application sees, also after the range was
// freed and allocated again (new frames, the old entries invalidated).
func TestImplicitODPFreeAndReallocate(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		p := softrdmatest.NewPair(t, o)
		as := mustAS(t, p.B)
		imr, err := p.B.Dev.RegMRImplicit(p.B.PD, rw|softrdma.AccessOnDemand)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, p.B.Dev.DeregMR(imr)) })
		const size = 8 * pageSize
		src, srcMR := reg(t, p.A, size, rw)
		buf, err := as.Alloc(size)
		require.NoError(t, err)
		addr := hostmem.AddrOf(buf)
		for round := range 4 {
			fill(uint64(round)+100, src)
			write(t, p.A, srcMR, 0, size, imr, addr)
			require.True(t, bytes.Equal(src, buf), "round %d", round)
			require.NoError(t, as.Free(addr, size))
			buf, err = as.AllocAt(addr, size)
			require.NoError(t, err)
			require.Equal(t, make([]byte, size), buf, "round %d: reallocated memory is not zero", round)
		}
		require.NoError(t, as.Free(addr, size))
	})
}

// TestODPRemapUnderBudget: WRITEs stream into an ODP MR twice the
// size of the device's page budget, so that faults evict pages while the
// MR is remapped; atomics on the same MR run too. After the last
// completion the application reads exactly what was written.
func TestODPRemapUnderBudget(t *testing.T) {
	odpPolicies(t, func(t *testing.T, o softrdmatest.Options) {
		o.ODPBudget = 16 * pageSize
		p := softrdmatest.NewPair(t, o)
		const pages = 32
		const size = pages * pageSize
		dst, dstMR := odpAlloc(t, p.B, size, rw)
		const window, chunk = 8, 5000
		src, srcMR := reg(t, p.A, window*chunk+8, rw)
		shadow := make([]byte, size)
		done := make(chan error, 1)
		stop := make(chan struct{})
		go func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				pol := []softrdma.PausePolicy{softrdma.PolicyHold, softrdma.PolicyNAK}[i%2]
				if _, err := p.B.Dev.Remap(dstMR, softrdma.ScopeMR, pol); err != nil {
					done <- err
					return
				}
			}
		}()
		const writes = 300
		inflight := 0
		var adds uint64
		for i := range writes {
			if inflight == window {
				wc := waitWC(t, p.A.CQ, 1)[0]
				require.Equal(t, softrdma.WCSuccess, wc.Status, "%+v", wc)
				inflight--
			}
			if i%50 == 49 { // an atomic on the last 8 bytes, which no WRITE touches
				_, err := p.A.QP.PostSend(softrdma.SendWR{WRID: 1 << 40, Opcode: softrdma.WRAtomicFetchAndAdd, Flags: softrdma.SendSignaled,
					SGL:        []softrdma.SGE{{Addr: srcMR.Addr() + window*chunk, Length: 8, LKey: srcMR.LKey()}},
					RemoteAddr: dstMR.Addr() + size - 8, RKey: dstMR.RKey(), CompareAdd: 3})
				require.NoError(t, err)
				inflight++
				adds += 3
				continue
			}
			slot := uint64(i%window) * chunk
			fill(uint64(i)+7, src[slot:slot+chunk])
			off := (i * 4099) % (size - 8 - chunk)
			copy(shadow[off:], src[slot:slot+chunk])
			postWrite(t, p.A.QP, uint64(i), srcMR, slot, chunk, dstMR, dstMR.Addr()+uint64(off))
			inflight++
		}
		for range inflight {
			wc := waitWC(t, p.A.CQ, 1)[0]
			require.Equal(t, softrdma.WCSuccess, wc.Status, "%+v", wc)
		}
		close(stop)
		require.NoError(t, <-done)
		binary.LittleEndian.PutUint64(shadow[size-8:], adds)
		require.True(t, bytes.Equal(shadow, dst), "the application's view differs from what was written")
		require.LessOrEqual(t, p.B.Dev.ODPBudget().Peak(), int64(16))
	})
}

// TestOpenRefusesNegativeODPBudget: a negative Config.ODPBudget is
// refused by Open, as the CLI refuses `--odp-budget -1`, instead of
// opening a device whose budget reports a limit of -1 pages and limits
// nothing.
func TestOpenRefusesNegativeODPBudget(t *testing.T) {
	d, err := softrdma.Open(softrdma.Config{Addr: netip.MustParseAddrPort("127.0.0.1:0"), ODPBudget: -1})
	if err == nil {
		t.Logf("budget limit %d pages", d.ODPBudget().Limit())
		d.Close()
	}
	require.ErrorContains(t, err, "softrdma: open: ODPBudget -1: must not be negative (0: unlimited)")
	require.ErrorIs(t, err, unix.EINVAL)
}

// Open's refusals of an invalid Config are EINVAL, as ibv_open_device's
// and the verbs' invalid arguments are, so that errors.Is finds them.
func TestOpenInvalidConfigIsEINVAL(t *testing.T) {
	addr := netip.MustParseAddrPort("127.0.0.1:0")
	for _, cfg := range []softrdma.Config{
		{Addr: addr, Profile: "t9"},
		{Addr: addr, FaultPolicy: softrdma.FaultRNR + 1},
	} {
		d, err := softrdma.Open(cfg)
		if err == nil {
			d.Close()
		}
		require.ErrorIs(t, err, unix.EINVAL, "%+v", cfg)
	}
}

// TestODPOnGoSliceSaysWhere: an ODP registration of a Go slice is
// EINVAL (docs/odp.md) with a message that tells a new user where ODP
// memory comes from, not only that the range is outside the address
// space.
func TestODPOnGoSliceSaysWhere(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true})
	_, err := p.A.Dev.RegMR(p.A.PD, make([]byte, 4096), rw|softrdma.AccessOnDemand)
	require.ErrorIs(t, err, unix.EINVAL)
	require.ErrorContains(t, err, "ODP memory must be allocated from it (AddressSpace.Alloc; a Go slice is not)")
}
