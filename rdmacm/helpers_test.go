package rdmacm_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
)

// netipAddrPort is the rdma_cm address of dev's IP and port.
func netipAddrPort(dev *softrdma.Device, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(dev.LocalAddr().Addr(), port)
}

// reg registers n bytes with every access on side s.
func reg(t *testing.T, s *softrdmatest.Side, n int) ([]byte, *softrdma.MR) {
	t.Helper()
	buf := make([]byte, n)
	mr, err := s.Dev.RegMR(s.PD, buf, softrdma.AccessLocalWrite|softrdma.AccessRemoteWrite|softrdma.AccessRemoteRead)
	require.NoError(t, err)
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
