package softrdma_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// TestMRFieldsReadDuringRegMR: the application reads an FRWR MR's keys
// and range (ibv_mr's fields) while the send worker executes its REG_MR,
// which changes them. Under -race this failed: FastReg wrote MR.key and
// MR.entry unsynchronized with LKey, RKey, Addr, Length.
func TestMRFieldsReadDuringRegMR(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true})
	mr, err := p.B.Dev.AllocMR(p.B.PD, 1)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.B.Dev.DeregMR(mr) })
	buf := make([]byte, 4096)
	require.NoError(t, p.B.Dev.MapMR(mr, buf))
	key := softrdma.IncRKey(mr.LKey())
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _, _, _ = mr.LKey(), mr.RKey(), mr.Addr(), mr.Length()
		}
	}()
	post(t, p.B.QP, softrdma.SendWR{WRID: 1, Opcode: softrdma.WRRegMR, Flags: softrdma.SendSignaled,
		Reg: softrdma.RegWR{MR: mr, Key: key, Access: rw}})
	wc := waitWC(t, p.B.CQ, 1)[0]
	close(stop)
	<-done
	require.Equal(t, softrdma.WCSuccess, wc.Status)
	require.Equal(t, key, mr.RKey())
	require.Equal(t, uint64(addrOf(buf)), mr.Addr())
}
