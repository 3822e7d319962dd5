package wire_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

// ibtaOpcodes is IBTA Vol. 1 Table 38 for the RC, UC and UD transports
// (RD is not implemented), with the header length the table implies.
var ibtaOpcodes = []struct {
	op     wire.Opcode
	name   string
	length int
}{
	{0x00, "RC_SEND_FIRST", 12},
	{0x01, "RC_SEND_MIDDLE", 12},
	{0x02, "RC_SEND_LAST", 12},
	{0x03, "RC_SEND_LAST_WITH_IMMEDIATE", 16},
	{0x04, "RC_SEND_ONLY", 12},
	{0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", 16},
	{0x06, "RC_RDMA_WRITE_FIRST", 28},
	{0x07, "RC_RDMA_WRITE_MIDDLE", 12},
	{0x08, "RC_RDMA_WRITE_LAST", 12},
	{0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16},
	{0x0a, "RC_RDMA_WRITE_ONLY", 28},
	{0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32},
	{0x0c, "RC_RDMA_READ_REQUEST", 28},
	{0x0d, "RC_RDMA_READ_RESPONSE_FIRST", 16},
	{0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE", 12},
	{0x0f, "RC_RDMA_READ_RESPONSE_LAST", 16},
	{0x10, "RC_RDMA_READ_RESPONSE_ONLY", 16},
	{0x11, "RC_ACKNOWLEDGE", 16},
	{0x12, "RC_ATOMIC_ACKNOWLEDGE", 24},
	{0x13, "RC_COMPARE_SWAP", 40},
	{0x14, "RC_FETCH_ADD", 40},
	{0x16, "RC_SEND_LAST_WITH_INVALIDATE", 16},
	{0x17, "RC_SEND_ONLY_WITH_INVALIDATE", 16},

	{0x20, "UC_SEND_FIRST", 12},
	{0x21, "UC_SEND_MIDDLE", 12},
	{0x22, "UC_SEND_LAST", 12},
	{0x23, "UC_SEND_LAST_WITH_IMMEDIATE", 16},
	{0x24, "UC_SEND_ONLY", 12},
	{0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", 16},
	{0x26, "UC_RDMA_WRITE_FIRST", 28},
	{0x27, "UC_RDMA_WRITE_MIDDLE", 12},
	{0x28, "UC_RDMA_WRITE_LAST", 12},
	{0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16},
	{0x2a, "UC_RDMA_WRITE_ONLY", 28},
	{0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32},

	{0x64, "UD_SEND_ONLY", 20},
	{0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", 24},
}

func TestOpcodeTableMatchesIBTA(t *testing.T) {
	want := map[wire.Opcode]bool{}
	for _, tc := range ibtaOpcodes {
		want[tc.op] = true
		info := wire.Info(tc.op)
		require.Truef(t, info.Valid(), "%#02x %s missing", uint8(tc.op), tc.name)
		require.Equal(t, tc.name, info.Name)
		require.Equal(t, tc.name, tc.op.String())
		require.Equalf(t, tc.length, info.Length, "%s header length", tc.name)
	}
	for op := range 256 {
		o := wire.Opcode(op)
		require.Equalf(t, want[o], wire.Info(o).Valid(), "opcode %#02x", op)
		if !want[o] {
			require.Equal(t, fmt.Sprintf("OPCODE_0x%02x", op), o.String())
		}
	}
	// The named constants agree with the table.
	require.Equal(t, "RC_RDMA_WRITE_FIRST", wire.OpRDMAWriteFirst.String())
	require.Equal(t, "RC_COMPARE_SWAP", wire.OpCompareSwap.String())
	require.Equal(t, "UD_SEND_ONLY", wire.OpUDSendOnly.String())
	require.Equal(t, "UD_SEND_ONLY_WITH_IMMEDIATE", wire.OpUDSendOnlyWithImmediate.String())
	require.Equal(t, "UC_RDMA_WRITE_ONLY", (wire.OpUC | wire.OpRDMAWriteOnly).String())
}

func TestOpcodeTableInvariants(t *testing.T) {
	require.Equal(t, wire.MaskFirst|wire.MaskLast, wire.MaskOnly, "ONLY = FIRST|LAST")
	headers := []struct {
		h    wire.Header
		m    wire.Mask
		size int
	}{
		{wire.HdrRDETH, wire.MaskRDETH, wire.RDETHSize},
		{wire.HdrDETH, wire.MaskDETH, wire.DETHSize},
		{wire.HdrRETH, wire.MaskRETH, wire.RETHSize},
		{wire.HdrAtomicETH, wire.MaskAtomicETH, wire.AtomicETHSize},
		{wire.HdrAETH, wire.MaskAETH, wire.AETHSize},
		{wire.HdrAtomicAckETH, wire.MaskAtomicAckETH, wire.AtomicAckETHSize},
		{wire.HdrImmDt, wire.MaskImmDt, wire.ImmDtSize},
		{wire.HdrIETH, wire.MaskIETH, wire.IETHSize},
	}
	for _, op := range validOpcodes() {
		info := wire.Info(op)
		name := info.Name
		require.True(t, info.Has(wire.MaskTransport), name)
		require.Truef(t, info.Has(wire.MaskReq) != info.Has(wire.MaskAck), "%s: request xor response", name)
		require.Equal(t, map[wire.Opcode]string{wire.OpRC: "RC_", wire.OpUC: "UC_", wire.OpUD: "UD_"}[op.Transport()], name[:3])

		// Position in the message, from the name.
		switch {
		case strings.Contains(name, "_FIRST"):
			require.True(t, info.Mask&wire.MaskOnly == wire.MaskFirst, name)
		case strings.Contains(name, "_MIDDLE"):
			require.True(t, info.Has(wire.MaskMiddle) && info.Mask&wire.MaskOnly == 0, name)
		case strings.Contains(name, "_LAST"):
			require.True(t, info.Mask&wire.MaskOnly == wire.MaskLast, name)
		default: // ONLY, READ_REQUEST, ACKNOWLEDGE, atomics
			require.True(t, info.Has(wire.MaskOnly) && !info.Has(wire.MaskMiddle), name)
		}

		// Headers: IBTA order, contiguous after the BTH; payload after them.
		require.Zero(t, info.Offset[wire.HdrBTH])
		off := wire.BTHSize
		for _, h := range headers {
			if info.Has(h.m) {
				require.Equalf(t, off, int(info.Offset[h.h]), "%s: offset of header %d", name, h.h)
				off += h.size
			}
		}
		require.Equal(t, off, info.Length, name)
		require.Equal(t, info.Length, int(info.Offset[wire.HdrPayload]), "%s: payload offset = header length", name)

		// Header presence from the name.
		require.Equal(t, strings.Contains(name, "IMMEDIATE"), info.Has(wire.MaskImmDt), name)
		require.Equal(t, strings.Contains(name, "INVALIDATE"), info.Has(wire.MaskIETH), name)
		require.Equal(t, op.Transport() == wire.OpUD, info.Has(wire.MaskDETH), name)
		require.False(t, info.Has(wire.MaskRDETH), name)
		isRETH := strings.Contains(name, "WRITE_FIRST") || strings.Contains(name, "WRITE_ONLY") || strings.HasSuffix(name, "READ_REQUEST")
		require.Equal(t, isRETH, info.Has(wire.MaskRETH), name)
		require.Equal(t, op == wire.OpCompareSwap || op == wire.OpFetchAdd, info.Has(wire.MaskAtomicETH), name)
		require.Equal(t, op == wire.OpAtomicAcknowledge, info.Has(wire.MaskAtomicAckETH), name)

		// Every response carries an AETH except READ_RESPONSE_MIDDLE.
		if info.Has(wire.MaskAck) {
			require.Equal(t, op != wire.OpRDMAReadResponseMiddle, info.Has(wire.MaskAETH), name)
		} else {
			require.False(t, info.Has(wire.MaskAETH), name)
		}

		// Payload: everything but READ_REQUEST, ACKs and atomics.
		noPayload := op == wire.OpRDMAReadRequest || op == wire.OpAcknowledge || op == wire.OpAtomicAcknowledge ||
			op == wire.OpCompareSwap || op == wire.OpFetchAdd
		require.Equal(t, !noPayload, info.Has(wire.MaskPayload), name)

		// Operation class.
		require.Equal(t, strings.Contains(name, "SEND"), info.Has(wire.MaskSend), name)
		require.Equal(t, strings.Contains(name, "WRITE"), info.Has(wire.MaskWrite), name)
		require.Equal(t, strings.Contains(name, "READ"), info.Has(wire.MaskRead), name)
		require.Equal(t, strings.Contains(name, "ATOMIC") || strings.Contains(name, "SWAP") || strings.Contains(name, "FETCH"),
			info.Has(wire.MaskAtomic), name)

		// A receive WQE is consumed by the first packet of a SEND and by a
		// WRITE with immediate (at its last packet, where the ImmDt is);
		// completion where the message ends.
		consumes := (info.Has(wire.MaskSend) && info.Has(wire.MaskFirst)) || (info.Has(wire.MaskWrite) && info.Has(wire.MaskImmDt))
		require.Equal(t, consumes, info.Has(wire.MaskRWR), name)
		completes := (info.Has(wire.MaskSend) && info.Has(wire.MaskLast)) || (info.Has(wire.MaskWrite) && info.Has(wire.MaskImmDt))
		require.Equal(t, completes, info.Has(wire.MaskComp), name)
	}
}

func TestOpcodeInfoUnknown(t *testing.T) {
	for _, op := range []wire.Opcode{0x15, 0x18, 0x1f, 0x2c, 0x40, 0x60, 0x63, 0x66, 0x80, 0x81, 0xff} {
		info := wire.Info(op)
		require.NotNil(t, info)
		require.False(t, info.Valid(), op.String())
		require.False(t, info.Has(wire.MaskPayload))
	}
	require.Equal(t, "OPCODE_0x81", wire.Opcode(0x81).String())
	require.Equal(t, wire.OpCNP, wire.Opcode(0x81).Transport())
}

func TestOpcodeInfoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful with -race")
	}
	n := 0
	require.Zero(t, testing.AllocsPerRun(100, func() {
		for op := range 256 {
			if wire.Info(wire.Opcode(op)).Has(wire.MaskPayload) {
				n++
			}
			_ = wire.OpRDMAWriteFirst.String()
		}
	}))
}
