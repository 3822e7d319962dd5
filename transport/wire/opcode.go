package wire

import "fmt"

// Opcode is the 8-bit BTH OpCode (IBTA 9.2.1, Table 38): the top three bits
// select the transport (RC 000, UC 001, RD 010, UD 011, CNP 100), the low
// five the operation.
type Opcode uint8

// RC opcodes, IBTA Table 38. UC and UD opcodes are the same operation codes
// with the transport prefix OR-ed in (see OpUC, OpUD).
const (
	OpSendFirst                  Opcode = 0x00
	OpSendMiddle                 Opcode = 0x01
	OpSendLast                   Opcode = 0x02
	OpSendLastWithImmediate      Opcode = 0x03
	OpSendOnly                   Opcode = 0x04
	OpSendOnlyWithImmediate      Opcode = 0x05
	OpRDMAWriteFirst             Opcode = 0x06
	OpRDMAWriteMiddle            Opcode = 0x07
	OpRDMAWriteLast              Opcode = 0x08
	OpRDMAWriteLastWithImmediate Opcode = 0x09
	OpRDMAWriteOnly              Opcode = 0x0a
	OpRDMAWriteOnlyWithImmediate Opcode = 0x0b
	OpRDMAReadRequest            Opcode = 0x0c
	OpRDMAReadResponseFirst      Opcode = 0x0d
	OpRDMAReadResponseMiddle     Opcode = 0x0e
	OpRDMAReadResponseLast       Opcode = 0x0f
	OpRDMAReadResponseOnly       Opcode = 0x10
	OpAcknowledge                Opcode = 0x11
	OpAtomicAcknowledge          Opcode = 0x12
	OpCompareSwap                Opcode = 0x13
	OpFetchAdd                   Opcode = 0x14
	OpSendLastWithInvalidate     Opcode = 0x16
	OpSendOnlyWithInvalidate     Opcode = 0x17

	// Transport prefixes (top three bits of the opcode).
	OpRC  Opcode = 0x00
	OpUC  Opcode = 0x20
	OpRD  Opcode = 0x40
	OpUD  Opcode = 0x60
	OpCNP Opcode = 0x80

	// OpUDSendOnly and OpUDSendOnlyWithImmediate are the two UD opcodes.
	OpUDSendOnly              = OpUD | OpSendOnly
	OpUDSendOnlyWithImmediate = OpUD | OpSendOnlyWithImmediate
)

// Header identifies one extension header for OpInfo.Offset.
type Header uint8

// Extension headers in the order IBTA 9.2 places them after the BTH.
const (
	HdrBTH Header = iota
	HdrRDETH
	HdrDETH
	HdrRETH
	HdrAtomicETH
	HdrAETH
	HdrAtomicAckETH
	HdrImmDt
	HdrIETH
	HdrPayload
	numHeaders
)

// headerSize is the size of each header in bytes, indexed by Header.
var headerSize = [numHeaders]int{
	HdrBTH: BTHSize, HdrRDETH: RDETHSize, HdrDETH: DETHSize, HdrRETH: RETHSize,
	HdrAtomicETH: AtomicETHSize, HdrAETH: AETHSize, HdrAtomicAckETH: AtomicAckETHSize,
	HdrImmDt: ImmDtSize, HdrIETH: IETHSize,
}

// Mask is a set of class bits describing an opcode, in the manner of
// rxe's opcode table: which headers are present and what the packet does.
type Mask uint32

// Class bits. The header bits are 1<<Header.
const (
	MaskRDETH        Mask = 1 << HdrRDETH
	MaskDETH         Mask = 1 << HdrDETH
	MaskRETH         Mask = 1 << HdrRETH
	MaskAtomicETH    Mask = 1 << HdrAtomicETH
	MaskAETH         Mask = 1 << HdrAETH
	MaskAtomicAckETH Mask = 1 << HdrAtomicAckETH
	MaskImmDt        Mask = 1 << HdrImmDt
	MaskIETH         Mask = 1 << HdrIETH
	MaskPayload      Mask = 1 << HdrPayload

	MaskReq       Mask = 1 << 12 // a request: goes to the responder
	MaskAck       Mask = 1 << 13 // a response: goes to the completer
	MaskSend      Mask = 1 << 14
	MaskWrite     Mask = 1 << 15
	MaskRead      Mask = 1 << 16 // READ request or READ response
	MaskAtomic    Mask = 1 << 17 // atomic request or atomic ACK
	MaskFirst     Mask = 1 << 18
	MaskMiddle    Mask = 1 << 19
	MaskLast      Mask = 1 << 20
	MaskOnly      Mask = MaskFirst | MaskLast
	MaskRWR       Mask = 1 << 21 // consumes a receive WQE
	MaskComp      Mask = 1 << 22 // generates a receive completion
	MaskTransport Mask = 1 << 23 // valid on this transport (always set in the table)
)

// OpInfo describes one opcode. Offsets and Length are derived from Mask at
// init time, in IBTA header order; nothing is written by hand.
type OpInfo struct {
	Name   string // IBTA name, as Wireshark prints it
	Mask   Mask
	Length int               // bytes of headers, BTH included; payload starts here
	Offset [numHeaders]uint8 // byte offset of each present header
}

// Has reports whether all bits of m are set.
func (o *OpInfo) Has(m Mask) bool { return o.Mask&m == m }

// Valid reports whether the opcode is one this package knows.
func (o *OpInfo) Valid() bool { return o.Mask != 0 }

var opTable [256]OpInfo

// Info returns the table entry for op. For an unknown opcode the entry's
// Valid method returns false. It never returns nil and never allocates.
func Info(op Opcode) *OpInfo { return &opTable[op] }

// String returns the IBTA name of the opcode, e.g. "RC_RDMA_WRITE_FIRST".
func (op Opcode) String() string {
	if i := &opTable[op]; i.Valid() {
		return i.Name
	}
	return fmt.Sprintf("OPCODE_0x%02x", uint8(op))
}

// Transport returns the transport prefix of op (OpRC, OpUC, OpRD, OpUD or OpCNP).
func (op Opcode) Transport() Opcode { return op & 0xe0 }

func init() {
	const (
		pay = MaskPayload
		req = MaskReq
		ack = MaskAck
	)
	sendOps := []struct {
		op   Opcode
		name string
		m    Mask
	}{
		{OpSendFirst, "SEND_FIRST", req | MaskSend | MaskFirst | MaskRWR | pay},
		{OpSendMiddle, "SEND_MIDDLE", req | MaskSend | MaskMiddle | pay},
		{OpSendLast, "SEND_LAST", req | MaskSend | MaskLast | MaskComp | pay},
		{OpSendLastWithImmediate, "SEND_LAST_WITH_IMMEDIATE", req | MaskSend | MaskLast | MaskComp | MaskImmDt | pay},
		{OpSendOnly, "SEND_ONLY", req | MaskSend | MaskOnly | MaskRWR | MaskComp | pay},
		{OpSendOnlyWithImmediate, "SEND_ONLY_WITH_IMMEDIATE", req | MaskSend | MaskOnly | MaskRWR | MaskComp | MaskImmDt | pay},
		{OpRDMAWriteFirst, "RDMA_WRITE_FIRST", req | MaskWrite | MaskFirst | MaskRETH | pay},
		{OpRDMAWriteMiddle, "RDMA_WRITE_MIDDLE", req | MaskWrite | MaskMiddle | pay},
		{OpRDMAWriteLast, "RDMA_WRITE_LAST", req | MaskWrite | MaskLast | pay},
		{OpRDMAWriteLastWithImmediate, "RDMA_WRITE_LAST_WITH_IMMEDIATE", req | MaskWrite | MaskLast | MaskImmDt | MaskRWR | MaskComp | pay},
		{OpRDMAWriteOnly, "RDMA_WRITE_ONLY", req | MaskWrite | MaskOnly | MaskRETH | pay},
		{OpRDMAWriteOnlyWithImmediate, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", req | MaskWrite | MaskOnly | MaskRETH | MaskImmDt | MaskRWR | MaskComp | pay},
	}
	for _, s := range sendOps {
		set(OpRC|s.op, "RC_"+s.name, s.m)
		set(OpUC|s.op, "UC_"+s.name, s.m)
	}
	set(OpRDMAReadRequest, "RC_RDMA_READ_REQUEST", req|MaskRead|MaskOnly|MaskRETH)
	set(OpRDMAReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST", ack|MaskRead|MaskFirst|MaskAETH|pay)
	set(OpRDMAReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", ack|MaskRead|MaskMiddle|pay)
	set(OpRDMAReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST", ack|MaskRead|MaskLast|MaskAETH|pay)
	set(OpRDMAReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY", ack|MaskRead|MaskOnly|MaskAETH|pay)
	set(OpAcknowledge, "RC_ACKNOWLEDGE", ack|MaskOnly|MaskAETH)
	set(OpAtomicAcknowledge, "RC_ATOMIC_ACKNOWLEDGE", ack|MaskAtomic|MaskOnly|MaskAETH|MaskAtomicAckETH)
	set(OpCompareSwap, "RC_COMPARE_SWAP", req|MaskAtomic|MaskOnly|MaskAtomicETH)
	set(OpFetchAdd, "RC_FETCH_ADD", req|MaskAtomic|MaskOnly|MaskAtomicETH)
	set(OpSendLastWithInvalidate, "RC_SEND_LAST_WITH_INVALIDATE", req|MaskSend|MaskLast|MaskComp|MaskIETH|pay)
	set(OpSendOnlyWithInvalidate, "RC_SEND_ONLY_WITH_INVALIDATE", req|MaskSend|MaskOnly|MaskRWR|MaskComp|MaskIETH|pay)
	set(OpUDSendOnly, "UD_SEND_ONLY", req|MaskSend|MaskOnly|MaskRWR|MaskComp|MaskDETH|pay)
	set(OpUDSendOnlyWithImmediate, "UD_SEND_ONLY_WITH_IMMEDIATE", req|MaskSend|MaskOnly|MaskRWR|MaskComp|MaskDETH|MaskImmDt|pay)
}

func set(op Opcode, name string, m Mask) {
	info := OpInfo{Name: name, Mask: m | MaskTransport}
	off := 0
	for h := HdrBTH; h < HdrPayload; h++ {
		if h == HdrBTH || m&(1<<h) != 0 {
			info.Offset[h] = uint8(off)
			off += headerSize[h]
		}
	}
	info.Offset[HdrPayload] = uint8(off)
	info.Length = off
	opTable[op] = info
}
