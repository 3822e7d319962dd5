package wire_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

// raw builds a UDP payload from a BTH opcode and flags byte, followed by
// n further bytes (headers, payload, pad and ICRC together).
func raw(op wire.Opcode, flags byte, n int) []byte {
	b := make([]byte, wire.BTHSize+n)
	b[0], b[1] = byte(op), flags
	return b
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		// Length.
		{"empty", nil, wire.ErrTooShort},
		{"BTH only", raw(wire.OpSendOnly, 0, 0), wire.ErrTooShort},
		{"BTH and 3 bytes", raw(wire.OpSendOnly, 0, 3), wire.ErrTooShort},
		{"WRITE_FIRST without RETH", raw(wire.OpRDMAWriteFirst, 0, 4), wire.ErrTooShort},
		{"WRITE_FIRST with half a RETH", raw(wire.OpRDMAWriteFirst, 0, 8+4), wire.ErrTooShort},
		{"COMPARE_SWAP one byte short", raw(wire.OpCompareSwap, 0, 27+4), wire.ErrTooShort},
		{"ATOMIC_ACK without AtomicAckETH", raw(wire.OpAtomicAcknowledge, 0, 4+4), wire.ErrTooShort},
		{"UD SEND_ONLY without DETH", raw(wire.OpUDSendOnly, 0, 4+4), wire.ErrTooShort},
		// Opcode.
		{"reserved RC opcode 0x15", raw(0x15, 0, 64), wire.ErrUnknownOpcode},
		{"RD opcode", raw(wire.OpRD|wire.OpSendOnly, 0, 64), wire.ErrUnknownOpcode},
		{"UC READ", raw(wire.OpUC|wire.OpRDMAReadRequest, 0, 64), wire.ErrUnknownOpcode},
		{"UD SEND_FIRST", raw(wire.OpUD|wire.OpSendFirst, 0, 64), wire.ErrUnknownOpcode},
		{"CNP", raw(0x81, 0, 64), wire.ErrUnknownOpcode},
		{"0xff", raw(0xff, 0, 64), wire.ErrUnknownOpcode},
		{"unknown and short", raw(0xff, 0, 3), wire.ErrTooShort},
		// Transport version.
		{"TVer 1", raw(wire.OpSendOnly, 0x01, 64), wire.ErrBadTVer},
		{"TVer 15", raw(wire.OpSendOnly, 0x0f, 64), wire.ErrBadTVer},
		// Pad.
		{"pad 1, no payload", raw(wire.OpSendOnly, 0x10, 4), wire.ErrBadPad},
		{"pad 3, 2 bytes", raw(wire.OpSendOnly, 0x30, 2+4), wire.ErrBadPad},
		{"pad on an ACK", raw(wire.OpAcknowledge, 0x10, 4+4), wire.ErrBadPad},
		{"pad on a READ_REQUEST", raw(wire.OpRDMAReadRequest, 0x20, 16+4), wire.ErrBadPad},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p wire.Packet
			require.ErrorIs(t, wire.Parse(tc.b, &p), tc.want)
		})
	}
}

func TestParseBoundaries(t *testing.T) {
	for _, tc := range []struct {
		name    string
		b       []byte
		payload int
	}{
		{"SEND_ONLY, empty", raw(wire.OpSendOnly, 0, 4), 0},
		{"SEND_ONLY, 1 byte + pad 3", raw(wire.OpSendOnly, 0x30, 4+4), 1},
		{"SEND_ONLY, pad 3 of 3 bytes", raw(wire.OpSendOnly, 0x30, 3+4), 0},
		{"ACK", raw(wire.OpAcknowledge, 0, 4+4), 0},
		{"WRITE_ONLY_IMM, zero length", raw(wire.OpRDMAWriteOnlyWithImmediate, 0, 20+4), 0},
		{"COMPARE_SWAP", raw(wire.OpCompareSwap, 0, 28+4), 0},
		{"UD SEND_ONLY_IMM, 256", raw(wire.OpUDSendOnlyWithImmediate, 0, 12+256+4), 256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p wire.Packet
			require.NoError(t, wire.Parse(tc.b, &p))
			require.Len(t, p.Payload, tc.payload)
			require.Equal(t, len(tc.b), p.Info.Length+len(p.Payload)+p.PadCount()+wire.ICRCSize)
		})
	}
}

// Build every opcode with Encode, parse it back, read every header.
func TestParseRoundTripEveryOpcode(t *testing.T) {
	r := rand.New(rand.NewPCG(20, 21))
	var p wire.Packet
	for _, op := range validOpcodes() {
		for _, n := range []int{0, 1, 2, 3, 4, 255, 1024} {
			b := buildPacket(op, n, r)
			h := &wire.IPHeader{Src: vm0, Dst: vm1, DF: true}
			wire.PutICRC(h, 49441, wire.RoCEv2Port, b)
			require.NoError(t, wire.Parse(b, &p), op.String())
			info := wire.Info(op)
			require.Same(t, info, p.Info)
			require.Equal(t, op, p.Opcode())
			require.Equal(t, wire.BTH(b).PSN(), p.PSN())
			require.Equal(t, []byte(wire.BTH(b[:wire.BTHSize])), []byte(p.BTH()))
			if info.Has(wire.MaskPayload) {
				require.Len(t, p.Payload, n)
				require.Equal(t, b[info.Length:info.Length+n], p.Payload)
				require.Equal(t, wire.PadFor(n), p.PadCount())
			} else {
				require.Empty(t, p.Payload)
			}
			require.Equal(t, wire.PacketICRC(b), p.ICRC())

			// Every present header is where the table says, with its size.
			for hdr := wire.HdrBTH; hdr < wire.HdrPayload; hdr++ {
				got := p.Header(hdr)
				if hdr != wire.HdrBTH && !info.Has(wire.Mask(1)<<hdr) {
					require.Nil(t, got)
					continue
				}
				o := int(info.Offset[hdr])
				require.Equal(t, b[o:o+wire.HeaderSize(hdr)], got)
			}
			require.Equal(t, p.Payload, p.Header(wire.HdrPayload))
			require.Nil(t, p.Header(wire.HdrPayload+1))
			if info.Has(wire.MaskRETH) {
				require.Equal(t, wire.RETH(p.Header(wire.HdrRETH)).VA(), p.RETH().VA())
				require.Len(t, p.RETH(), wire.RETHSize)
			}
			if info.Has(wire.MaskAETH) {
				require.Len(t, p.AETH(), wire.AETHSize)
			}
			if info.Has(wire.MaskAtomicETH) {
				require.Len(t, p.AtomicETH(), wire.AtomicETHSize)
			}
			if info.Has(wire.MaskAtomicAckETH) {
				require.Len(t, p.AtomicAckETH(), wire.AtomicAckETHSize)
			}
			if info.Has(wire.MaskImmDt) {
				require.Len(t, p.ImmDt(), wire.ImmDtSize)
			}
			if info.Has(wire.MaskIETH) {
				require.Len(t, p.IETH(), wire.IETHSize)
			}
			if info.Has(wire.MaskDETH) {
				require.Len(t, p.DETH(), wire.DETHSize)
			}
			ok, _ := wire.VerifyICRC(h, 49441, wire.RoCEv2Port, b)
			require.True(t, ok)
		}
	}
}

func TestParseReusesPacket(t *testing.T) {
	r := rand.New(rand.NewPCG(22, 23))
	var p wire.Packet
	a := buildPacket(wire.OpRDMAWriteFirst, 100, r)
	b := buildPacket(wire.OpAcknowledge, 0, r)
	require.NoError(t, wire.Parse(a, &p))
	require.NoError(t, wire.Parse(b, &p))
	require.Equal(t, wire.OpAcknowledge, p.Opcode())
	require.Empty(t, p.Payload)
	require.Nil(t, p.Header(wire.HdrRETH))
}

func TestParseAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful with -race")
	}
	r := rand.New(rand.NewPCG(24, 25))
	pkts := [][]byte{
		buildPacket(wire.OpRDMAWriteFirst, 1024, r),
		buildPacket(wire.OpAcknowledge, 0, r),
		buildPacket(wire.OpUDSendOnly, 256, r),
		raw(0xff, 0, 64),
	}
	var p wire.Packet
	var n int
	require.Zero(t, testing.AllocsPerRun(100, func() {
		for _, b := range pkts {
			if wire.Parse(b, &p) == nil {
				n += len(p.Payload) + len(p.Header(wire.HdrRETH)) + int(p.PSN())
			}
		}
	}))
}
