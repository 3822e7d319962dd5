package conn_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/conn"
)

// sendReceiveBatch returns a function that sends pkts from a to b and
// receives them all.
func sendReceiveBatch(t testing.TB, a, b conn.Conn, pkts []conn.Packet) func() {
	rpkts := make([]conn.Packet, b.BatchSize())
	return func() {
		if err := a.Send(pkts); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(pkts); {
			n, err := b.Receive(rpkts)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
}

func batchTo(b conn.Conn, n, size int) []conn.Packet {
	pkts := make([]conn.Packet, n)
	for i := range pkts {
		pkts[i] = conn.Packet{Buf: newPacket(uint32(i), size), Addr: b.LocalAddr()}
	}
	return pkts
}

func TestUDPSendReceiveDoNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful with -race")
	}
	for _, gso := range []bool{true, false} {
		for _, gro := range []bool{true, false} {
			t.Run(fmt.Sprintf("gso=%v,gro=%v", gso, gro), func(t *testing.T) {
				a := listen(t, conn.Config{DisableGSO: !gso, DisableGRO: !gro})
				b := listen(t, conn.Config{DisableGSO: !gso, DisableGRO: !gro})
				f := sendReceiveBatch(t, a, b, batchTo(b, conn.IdealBatchSize, 1040))
				f() // warm up
				require.Zero(t, testing.AllocsPerRun(100, f))
			})
		}
	}
}

func TestPipeSendReceiveDoNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful with -race")
	}
	a, b := newPipe(t, 0)
	f := sendReceiveBatch(t, a, b, batchTo(b, conn.IdealBatchSize, 1040))
	f()
	require.Zero(t, testing.AllocsPerRun(100, f))
}
