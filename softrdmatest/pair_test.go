package softrdmatest_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// TestCapFieldDefaults: each zero field of Options.Cap takes its default
// (256 WRs, 4 SGEs, 64 bytes inline) and each field given is used: a Cap
// without MaxSendWR was dropped whole (Cap{MaxRecvWR: 2} gave 256
// receives), and Cap{MaxSendWR: 4} left the receive queue at 0 (every
// PostRecv ErrRQFull).
func TestCapFieldDefaults(t *testing.T) {
	postRecvs := func(qp *softrdma.QP, mr *softrdma.MR, n int) error {
		for i := range n {
			sge := []softrdma.SGE{{Addr: mr.Addr(), Length: 8, LKey: mr.LKey()}}
			if _, err := qp.PostRecv(softrdma.RecvWR{WRID: uint64(i), SGL: sge}); err != nil {
				return err
			}
		}
		return nil
	}
	p := softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true, Cap: softrdma.Cap{MaxRecvWR: 2}})
	mr, err := p.A.Dev.RegMR(p.A.PD, make([]byte, 64), softrdma.AccessLocalWrite)
	require.NoError(t, err)
	require.ErrorIs(t, postRecvs(p.A.QP, mr, 3), softrdma.ErrRQFull, "MaxRecvWR 2 taken")

	p = softrdmatest.NewPair(t, softrdmatest.Options{NoPcap: true, Cap: softrdma.Cap{MaxSendWR: 4}})
	mr, err = p.A.Dev.RegMR(p.A.PD, make([]byte, 64), softrdma.AccessLocalWrite)
	require.NoError(t, err)
	require.NoError(t, postRecvs(p.A.QP, mr, 8), "MaxRecvWR defaults to 256")
	sgl := make([]softrdma.SGE, 4) // MaxSendSGE defaults to 4
	for i := range sgl {
		sgl[i] = softrdma.SGE{Addr: mr.Addr(), Length: 8, LKey: mr.LKey()}
	}
	var sendErr error
	for i := range 5 {
		if _, err := p.A.QP.PostSend(softrdma.SendWR{WRID: uint64(i), Opcode: softrdma.WRSend, SGL: sgl}); err != nil {
			sendErr = err
			require.Equal(t, 4, i, "the fifth send is refused")
			break
		}
	}
	require.ErrorIs(t, sendErr, softrdma.ErrSQFull, "MaxSendWR 4 taken")
}
