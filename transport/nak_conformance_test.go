package transport

import (
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/transport/conn"

	"github.com/softrdma/softrdma/transport/wire"
)

// A RETH whose DMA length exceeds 2^31 bytes is an invalid request (IBTA
// 9.4.3 and 9.4.4: an RDMA WRITE or READ message is 0 to 2^31 bytes; a
// class C responder error, 9.9.3), checked before the R_Key as rxe's
// check_length does (RESPST_ERR_LENGTH, NAK invalid request): the rkey and
// VA below are valid, so without the check the request meets the bounds
// check and is NAKed as a remote access error instead. 2^31 itself is
// legal and meets the bounds check.
func TestDMALengthOver2GiB(t *testing.T) {
	mtu := make([]byte, rigMTU)
	for _, c := range []struct {
		name   string
		op     wire.Opcode
		length uint32
		pay    []byte
		drop   DropReason
		nak    wire.Syndrome
	}{
		{"WRITE FIRST 2^31+1", wire.OpRDMAWriteFirst, 1<<31 + 1, mtu, DropLength, wire.SyndromeNAKInvalidRequest},
		{"WRITE FIRST 2^32-1", wire.OpRDMAWriteFirst, 0xffffffff, mtu, DropLength, wire.SyndromeNAKInvalidRequest},
		{"READ 2^31+1", wire.OpRDMAReadRequest, 1<<31 + 1, nil, DropLength, wire.SyndromeNAKInvalidRequest},
		{"WRITE FIRST 2^31", wire.OpRDMAWriteFirst, 1 << 31, mtu, DropAccess, wire.SyndromeNAKRemoteAccess},
		{"READ 2^31", wire.OpRDMAReadRequest, 1 << 31, nil, DropAccess, wire.SyndromeNAKRemoteAccess},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newResponderRig(t)
			before := r.drops(c.drop)
			r.deliver(r.build(c.op, 1000, c.pay, true, r.reth(r.mr.Addr(), r.mr.RKey(), c.length)))
			require.Equal(t, before+1, r.drops(c.drop), "drop counter %v", c.drop)
			op, syn, psn := r.answer()
			require.Equal(t, wire.OpAcknowledge, op)
			require.Equal(t, c.nak, syn, "NAK syndrome")
			require.Equal(t, wire.PSN(1000), psn)
			require.Equal(t, QPStateErr, r.qp.State())
			require.True(t, r.guardsIntact())
			require.Equal(t, byte(0xA5), r.mem[rigGuard], "nothing placed")
		})
	}
}

// An atomic with a misaligned VA and an invalid R_Key is a remote access
// error, not an invalid request: rxe checks the R_Key and the range
// (check_rkey, RESPST_ERR_RKEY_VIOLATION) before the alignment
// (atomic_reply, RESPST_ERR_MISALIGNED_ATOMIC), and the placement engine's
// Atomic documents the same order. A misaligned VA with a valid R_Key
// stays an invalid request (TestResponderBadInput).
func TestMisalignedAtomicWithBadRKeyIsRemoteAccessError(t *testing.T) {
	for _, c := range []struct {
		name string
		rkey func(r *responderRig) uint32
		va   func(r *responderRig) uint64
		nak  wire.Syndrome
	}{
		{"bad rkey", func(r *responderRig) uint32 { return r.mr.RKey() ^ 1 }, func(r *responderRig) uint64 { return r.mr.Addr() + 4 }, wire.SyndromeNAKRemoteAccess},
		{"outside the MR", func(r *responderRig) uint32 { return r.mr.RKey() }, func(r *responderRig) uint64 { return r.mr.Addr() + rigMR + 4 }, wire.SyndromeNAKRemoteAccess},
		{"valid rkey", func(r *responderRig) uint32 { return r.mr.RKey() }, func(r *responderRig) uint64 { return r.mr.Addr() + 4 }, wire.SyndromeNAKInvalidRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newResponderRig(t)
			r.deliver(r.build(wire.OpCompareSwap, 1000, nil, true, func(b []byte, info *wire.OpInfo) {
				wire.AtomicETH(b[info.Offset[wire.HdrAtomicETH]:]).Encode(&wire.AtomicETHFields{VA: c.va(r), RKey: c.rkey(r), SwapAdd: 1})
			}))
			op, syn, psn := r.answer()
			require.Equal(t, wire.OpAcknowledge, op)
			require.Equal(t, c.nak, syn, "NAK syndrome")
			require.Equal(t, wire.PSN(1000), psn)
			require.Equal(t, QPStateErr, r.qp.State())
			require.True(t, r.guardsIntact())
		})
	}
}

// A NAK with a reserved code (IBTA Table 42: NAK codes 5 to 31 are
// reserved) completes the WQE with REM_OP_ERR and moves the QP to ERR, as
// rxe's completer does ("unexpected nak": IB_WC_REM_OP_ERR); the defined
// codes keep their statuses.
func TestReservedNAKCodeIsRemoteOperationalError(t *testing.T) {
	for _, c := range []struct {
		syn  wire.Syndrome
		want WCStatus
	}{
		{wire.SyndromeNAKInvalidRequest, WCRemInvReqErr},
		{wire.SyndromeNAKRemoteAccess, WCRemAccessErr},
		{wire.SyndromeNAKRemoteOp, WCRemOpErr},
		{0x65, WCRemOpErr},
		{0x7f, WCRemOpErr},
	} {
		t.Run(fmt.Sprintf("%#x", uint8(c.syn)), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newSyncRig(t)
				_, err := r.qp.PostSend(SendWR{WRID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled,
					SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
				require.NoError(t, err)
				require.Len(t, r.sent(), 1)
				r.ackPkt(c.syn, 5000, 0)
				wcs := r.poll()
				require.Len(t, wcs, 1)
				require.Equal(t, c.want, wcs[0].Status)
				require.Equal(t, QPStateErr, r.qp.State())
			})
		})
	}
}

// A READ whose region fails after the request was accepted is a class C
// responder error (IBTA 9.9.3): the responder NAKs remote access and moves
// its QP to ERR, counting the drop, as rxe's read_reply does (it rechecks
// the MR for every response and a replay, RESPST_ERR_RKEY_VIOLATION ->
// do_class_ac_error). Before, the NAK went out and the QP stayed in RTS,
// answering further requests on a connection whose requester had failed.
func TestReadFailingAfterAcceptanceMovesResponderToErr(t *testing.T) {
	t.Run("duplicate READ after DeregMR", func(t *testing.T) {
		r := newResponderRig(t)
		r.deliver(r.build(wire.OpRDMAReadRequest, 1000, nil, true, r.reth(r.mr.Addr(), r.mr.RKey(), 3000)))
		for i := range 3 {
			_, _, psn := r.answer()
			require.Equal(t, wire.PSN(1000+i), psn)
		}
		require.NoError(t, r.place.DeregMR(r.mr))
		before := r.drops(DropAccess)
		r.deliver(r.build(wire.OpRDMAReadRequest, 1000, nil, true, r.reth(r.mr.Addr(), r.mr.RKey(), 3000)))
		op, syn, psn := r.answer()
		require.Equal(t, wire.OpAcknowledge, op)
		require.Equal(t, wire.SyndromeNAKRemoteAccess, syn)
		require.Equal(t, wire.PSN(1000), psn)
		require.Equal(t, before+1, r.drops(DropAccess))
		require.Equal(t, QPStateErr, r.qp.State())
	})
	t.Run("ODP page that cannot be faulted in", func(t *testing.T) {
		r := newRig(t, true, FaultSync)
		// The MR's second page leaves the host address space: the READ
		// is accepted (key and range are good), its first four responses
		// come from the first page and the fifth cannot be read.
		require.NoError(t, r.as.Free(hostmem.AddrOf(r.mem[rigGuard+hostmem.PageSize:]), hostmem.PageSize))
		before := r.drops(DropAccess)
		r.deliver(r.build(wire.OpRDMAReadRequest, 1000, nil, true, r.reth(r.mr.Addr(), r.mr.RKey(), rigMR)))
		var last wire.Syndrome
		var lastOp wire.Opcode
		var lastPSN wire.PSN
		for range hostmem.PageSize/rigMTU + 1 {
			lastOp, last, lastPSN = r.answer()
		}
		require.Equal(t, wire.OpAcknowledge, lastOp)
		require.Equal(t, wire.SyndromeNAKRemoteAccess, last)
		require.Equal(t, wire.PSN(1000+hostmem.PageSize/rigMTU), lastPSN)
		require.Equal(t, before+1, r.drops(DropAccess))
		require.Equal(t, QPStateErr, r.qp.State())
	})
}

// On UC a RETH DMA length over 2^31 drops the message as a length error
// (rxe check_length, class D on UC), not as an R_Key violation, and the QP
// stays in RTS; the next message lands.
func TestUCDMALengthOver2GiBIsALengthError(t *testing.T) {
	r := newDGRig(t, QPTypeUC, conn.PipeConfig{})
	r.postRecv(1, 0, 2000)
	mtu := make([]byte, 1024)
	r.deliver(r.uc(wire.OpRDMAWriteFirst, 1000, mtu, &wire.RETHFields{VA: r.mr.Addr(), RKey: r.mr.RKey(), DMALength: 1<<31 + 1}))
	require.Equal(t, uint64(1), r.drops(DropLength))
	require.Equal(t, uint64(0), r.drops(DropAccess))
	require.Equal(t, QPStateRTS, r.qp.State())
	require.False(t, r.qp.resp.cur.Busy())
	r.deliver(r.uc(wire.OpSendOnly, 2000, []byte("next"), nil))
	wcs := r.poll()
	require.Len(t, wcs, 1)
	require.Equal(t, WCSuccess, wcs[0].Status)
}
