package softrdma_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// TestAtomicLocalSGLSumsToEight: an atomic's local SGL may have several
// SGEs whose lengths add up to 8 bytes, as rxe accepts (validate_send_wr
// checks the sum of the SGE lengths, length != 8 is EINVAL; the completer
// scatters the original value over the SGL with copy_data): the 8 bytes of
// the original remote value land across the SGEs in order. A sum other
// than 8 is still refused (ErrAtomicLength).
func TestAtomicLocalSGLSumsToEight(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	target, targetMR := reg(t, p.B, 8, rw)
	binary.NativeEndian.PutUint64(target, 0x0102030405060708)
	lo, loMR := reg(t, p.A, 4096, rw)
	hi, hiMR := reg(t, p.A, 4096, rw)
	sgl := []softrdma.SGE{
		{Addr: loMR.Addr() + 100, Length: 3, LKey: loMR.LKey()},
		{Addr: hiMR.Addr() + 200, Length: 0, LKey: hiMR.LKey()},
		{Addr: hiMR.Addr() + 300, Length: 5, LKey: hiMR.LKey()},
	}
	post(t, p.A.QP, softrdma.SendWR{WRID: 1, Opcode: softrdma.WRAtomicFetchAndAdd, Flags: softrdma.SendSignaled,
		CompareAdd: 1, RemoteAddr: targetMR.Addr(), RKey: targetMR.RKey(), SGL: sgl})
	wc := waitWC(t, p.A.CQ, 1)[0]
	require.Equal(t, softrdma.WCSuccess, wc.Status)
	require.Equal(t, softrdma.WCFetchAdd, wc.Opcode)
	require.Equal(t, uint32(8), wc.ByteLen)
	var orig [8]byte
	binary.NativeEndian.PutUint64(orig[:], 0x0102030405060708)
	require.Equal(t, orig[:3], lo[100:103], "the first 3 bytes in the first SGE")
	require.Equal(t, orig[3:], hi[300:305], "the last 5 in the third")
	require.Equal(t, uint64(0x0102030405060709), binary.NativeEndian.Uint64(target))

	for _, bad := range [][]softrdma.SGE{
		{{Addr: loMR.Addr(), Length: 4, LKey: loMR.LKey()}, {Addr: hiMR.Addr(), Length: 5, LKey: hiMR.LKey()}},
		{{Addr: loMR.Addr(), Length: 4, LKey: loMR.LKey()}, {Addr: hiMR.Addr(), Length: 3, LKey: hiMR.LKey()}},
		nil,
	} {
		_, err := p.A.QP.PostSend(softrdma.SendWR{Opcode: softrdma.WRAtomicCmpAndSwp,
			RemoteAddr: targetMR.Addr(), RKey: targetMR.RKey(), SGL: bad})
		require.ErrorIs(t, err, softrdma.ErrAtomicLength)
	}
}
