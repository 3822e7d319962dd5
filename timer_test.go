package softrdma_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// These tests run in a synctest bubble over the in-memory pipe, so the
// retransmit and RNR timers advance on the bubble's fake clock.

func pipePair(t *testing.T, c softrdma.ConnectOptions) *softrdmatest.Pair {
	c.Exact = true
	if c.MTU == 0 {
		c.MTU = softrdma.MTU1024
	}
	c.Access = rw
	if c.MaxRdAtomic == 0 {
		c.MaxRdAtomic = 4
	}
	return softrdmatest.NewPair(t, softrdmatest.Options{Pipe: true, NoPcap: true, Connect: c})
}

func TestRNRRetryExceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// rnr_retry 2, min_rnr_timer 14 (1.28 ms): the SEND is tried three
		// times, then completes with RNR_RETRY_EXC_ERR.
		p := pipePair(t, softrdma.ConnectOptions{Timeout: 14, RetryCnt: 7, RNRRetry: 2, MinRNRTimer: 14})
		_, mr := reg(t, p.A, 64, rw)
		start := time.Now()
		_, err := p.A.QP.PostSend(softrdma.SendWR{WRID: 5, Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
			SGL: []softrdma.SGE{{Addr: mr.Addr(), Length: 64, LKey: mr.LKey()}}})
		require.NoError(t, err)
		wc := waitWC(t, p.A.CQ, 1)[0]
		require.Equal(t, softrdma.WCRNRRetryExcErr, wc.Status)
		require.Equal(t, uint64(5), wc.WRID)
		require.Equal(t, uint64(3), p.A.Dev.Counters().RcvdRNRErr.Load(), "first try + 2 retries")
		require.Equal(t, uint64(3), p.B.Dev.Counters().SendRNRErr.Load())
		require.Equal(t, 2*1280*time.Microsecond, time.Since(start), "two RNR waits of 1.28 ms (IBTA Table 45, code 14)")
		require.Equal(t, softrdma.QPStateErr, p.A.QP.State())
	})
}

func TestRNRThenReceivePosted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipePair(t, softrdma.ConnectOptions{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1})
		src, mr := reg(t, p.A, 64, rw)
		dst, dmr := reg(t, p.B, 64, rw)
		fill(9, src)
		_, err := p.A.QP.PostSend(softrdma.SendWR{WRID: 1, Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
			SGL: []softrdma.SGE{{Addr: mr.Addr(), Length: 64, LKey: mr.LKey()}}})
		require.NoError(t, err)
		time.Sleep(time.Millisecond) // fake time: 100 RNR periods of 10 µs
		synctest.Wait()
		require.Greater(t, p.A.Dev.Counters().RcvdRNRErr.Load(), uint64(10), "rnr_retry 7 retries forever")
		_, err = p.B.QP.PostRecv(softrdma.RecvWR{WRID: 2, SGL: []softrdma.SGE{{Addr: dmr.Addr(), Length: 64, LKey: dmr.LKey()}}})
		require.NoError(t, err)
		require.Equal(t, softrdma.WCSuccess, waitWC(t, p.A.CQ, 1)[0].Status)
		rwc := waitWC(t, p.B.CQ, 1)[0]
		require.Equal(t, softrdma.WCSuccess, rwc.Status)
		require.Equal(t, src, dst)
	})
}

func TestRetryExceededAgainstSilentPeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// timeout 14 = 4.096 µs × 2^14 = 67.108864 ms; retry_cnt 3: four
		// transmissions, then RETRY_EXC_ERR after 4 timeouts (rxe's
		// retry_exceeded capture shows the same pattern).
		p := pipePair(t, softrdma.ConnectOptions{Timeout: 14, RetryCnt: 3, RNRRetry: 7, MinRNRTimer: 1})
		_, mr := reg(t, p.A, 64, rw)
		_, dmr := reg(t, p.B, 64, rw)
		require.NoError(t, p.B.QP.Modify(&softrdma.QPAttr{State: softrdma.QPStateErr}, softrdma.QPAttrState))
		start := time.Now()
		_, err := p.A.QP.PostSend(softrdma.SendWR{WRID: 7, Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
			SGL: []softrdma.SGE{{Addr: mr.Addr(), Length: 64, LKey: mr.LKey()}}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()})
		require.NoError(t, err)
		wc := waitWC(t, p.A.CQ, 1)[0]
		require.Equal(t, softrdma.WCRetryExcErr, wc.Status)
		require.Equal(t, 4*67108864*time.Nanosecond, time.Since(start))
		require.Equal(t, uint64(3), p.A.Dev.Counters().RetransmitTimeouts.Load())
		require.Equal(t, uint64(3), p.A.Dev.Counters().Retransmits.Load())
		require.Equal(t, uint64(1), p.A.Dev.Counters().RetryExceededErr.Load())
	})
}

func TestRetryForeverWithRetryCnt7(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := pipePair(t, softrdma.ConnectOptions{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1})
		_, mr := reg(t, p.A, 64, rw)
		_, dmr := reg(t, p.B, 64, rw)
		require.NoError(t, p.B.QP.Modify(&softrdma.QPAttr{State: softrdma.QPStateErr}, softrdma.QPAttrState))
		_, err := p.A.QP.PostSend(softrdma.SendWR{WRID: 7, Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled,
			SGL: []softrdma.SGE{{Addr: mr.Addr(), Length: 64, LKey: mr.LKey()}}, RemoteAddr: dmr.Addr(), RKey: dmr.RKey()})
		require.NoError(t, err)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		n, err := p.A.CQ.Poll(make([]softrdma.WC, 1))
		require.NoError(t, err)
		require.Zero(t, n, "retry_cnt 7 retries forever (rxe's retry_cnt7_forever capture)")
		// 10 s / 67.1 ms = 149 timeouts.
		require.Equal(t, uint64(149), p.A.Dev.Counters().RetransmitTimeouts.Load())
	})
}

func TestFenceWaitsForPriorRead(t *testing.T) {
	p := softrdmatest.NewPair(t, softrdmatest.Options{})
	remote, rmr := reg(t, p.B, 4096, rw)
	local, lmr := reg(t, p.A, 8192, rw)
	fill(3, remote)
	// READ remote into local[0:4096], then a fenced WRITE of local[0:4096]
	// back to remote[...]: the fence makes the WRITE carry the READ's data.
	_, err := p.A.QP.PostSend(
		softrdma.SendWR{WRID: 1, Opcode: softrdma.WRRDMARead, Flags: softrdma.SendSignaled,
			SGL: []softrdma.SGE{{Addr: lmr.Addr(), Length: 4096, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()},
		softrdma.SendWR{WRID: 2, Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled | softrdma.SendFence,
			SGL: []softrdma.SGE{{Addr: lmr.Addr(), Length: 4096, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	require.NoError(t, err)
	wcs := waitWC(t, p.A.CQ, 2)
	require.Equal(t, uint64(1), wcs[0].WRID)
	require.Equal(t, uint64(2), wcs[1].WRID)
	require.Equal(t, remote, local[:4096])
}
