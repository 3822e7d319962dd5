package rdmacm_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/rdmacm"
	"github.com/softrdma/softrdma/softrdmatest"
	"golang.org/x/sys/unix"
)

// netipAddrPort is the rdma_cm address of dev's IP and port.
func netipAddrPort(dev *softrdma.Device, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(dev.LocalAddr().Addr(), port)
}

// reg registers n bytes with every access on side s, outside the Go heap
// (mmap) like DMA memory: over real sockets the race detector cannot see
// how the protocol orders the application's and the NIC's accesses.
func reg(t *testing.T, s *softrdmatest.Side, n int) ([]byte, *softrdma.MR) {
	t.Helper()
	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	mr, err := s.Dev.RegMR(s.PD, buf, softrdma.AccessLocalWrite|softrdma.AccessRemoteWrite|softrdma.AccessRemoteRead)
	require.NoError(t, err)
	t.Cleanup(func() { // before the devices close (cleanups run last first)
		_ = s.Dev.DeregMR(mr)
		_ = unix.Munmap(buf)
	})
	return buf, mr
}

// waitWC returns the next completion of cq (fake time in a bubble).
func waitWC(t *testing.T, cq *softrdma.CQ) softrdma.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wc [1]softrdma.WC
	_, err := cq.Wait(ctx, wc[:])
	require.NoError(t, err)
	return wc[0]
}

// acceptResult is what acceptAsync's Accept returned.
type acceptResult struct {
	c   *rdmacm.Conn
	err error
}

// acceptAsync takes the next request on l and accepts it on qp with p, in
// a goroutine; the result arrives on the channel.
func acceptAsync(ctx context.Context, l *rdmacm.Listener, qp *softrdma.QP, p rdmacm.ConnParam) <-chan acceptResult {
	ch := make(chan acceptResult, 1)
	go func() {
		r, err := l.GetRequest(ctx)
		if err != nil {
			ch <- acceptResult{nil, err}
			return
		}
		c, err := r.Accept(ctx, qp, p)
		ch <- acceptResult{c, err}
	}()
	return ch
}

// connect connects p's two QPs with the CMs, B active (port 7174, zero
// ConnParams), and returns A's and B's connections.
func connect(t *testing.T, p *softrdmatest.Pair, cmA, cmB *rdmacm.CM) (ca, cb *rdmacm.Conn) {
	t.Helper()
	l, err := cmA.Listen(port, 1)
	require.NoError(t, err)
	accepted := acceptAsync(context.Background(), l, p.A.QP, rdmacm.ConnParam{})
	cb, err = cmB.Connect(context.Background(), p.B.QP, netipAddrPort(p.A.Dev, port), rdmacm.ConnParam{})
	require.NoError(t, err)
	ra := <-accepted
	require.NoError(t, ra.err)
	return ra.c, cb
}
