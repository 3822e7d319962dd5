package wire

import "errors"

// Decoding errors. Each names the check that failed; the transport counts
// drops by these reasons.
var (
	ErrTooShort      = errors.New("wire: packet shorter than its headers and ICRC")
	ErrUnknownOpcode = errors.New("wire: unknown or unsupported opcode")
	ErrBadTVer       = errors.New("wire: BTH transport version is not 0")
	ErrBadPad        = errors.New("wire: pad count larger than the payload")
)

// Packet is one decoded RoCEv2 packet (the UDP payload). Parse fills it in
// place; it aliases the buffer it was parsed from. Keep one Packet per
// receive goroutine and reuse it: parsing allocates nothing.
type Packet struct {
	// Raw is the whole UDP payload: headers, payload, pad and ICRC.
	Raw []byte
	// Info is the opcode's table entry.
	Info *OpInfo
	// Payload is the data after the headers, without pad and ICRC.
	Payload []byte
}

// Parse decodes b as a RoCEv2 packet into p. It checks the length against
// the opcode's headers, the transport version and the pad count; it does
// not check the ICRC (see VerifyICRC). On error p is left unspecified.
func Parse(b []byte, p *Packet) error {
	if len(b) < BTHSize+ICRCSize {
		return ErrTooShort
	}
	info := &opTable[b[0]]
	if !info.Valid() {
		return ErrUnknownOpcode
	}
	if BTH(b).TVer() != 0 {
		return ErrBadTVer
	}
	end := len(b) - ICRCSize
	if end < info.Length {
		return ErrTooShort
	}
	pad := BTH(b).PadCount()
	if end-info.Length < pad {
		return ErrBadPad
	}
	p.Raw = b
	p.Info = info
	p.Payload = b[info.Length : end-pad]
	return nil
}

// BTH returns the packet's BTH.
func (p *Packet) BTH() BTH { return BTH(p.Raw[:BTHSize]) }

// Opcode returns the BTH opcode.
func (p *Packet) Opcode() Opcode { return Opcode(p.Raw[0]) }

// PSN returns the BTH PSN.
func (p *Packet) PSN() PSN { return BTH(p.Raw).PSN() }

// Header returns the bytes of header h, or nil if the opcode has none.
// Header(HdrPayload) returns Payload.
func (p *Packet) Header(h Header) []byte {
	switch {
	case h == HdrPayload:
		return p.Payload
	case h >= numHeaders || h != HdrBTH && p.Info.Mask&(1<<h) == 0:
		return nil
	}
	o := int(p.Info.Offset[h])
	return p.Raw[o : o+headerSize[h]]
}

// PadCount returns the BTH pad count: the bytes between Payload and the ICRC.
func (p *Packet) PadCount() int { return BTH(p.Raw).PadCount() }

// ICRC returns the ICRC trailer as stored (see PacketICRC).
func (p *Packet) ICRC() uint32 { return PacketICRC(p.Raw) }

// HeaderSize returns the size in bytes of header h (0 for HdrPayload).
func HeaderSize(h Header) int {
	if h >= numHeaders {
		return 0
	}
	return headerSize[h]
}

// RETH returns the RETH view; the opcode must have one.
func (p *Packet) RETH() RETH { o := p.Info.Offset[HdrRETH]; return RETH(p.Raw[o : o+RETHSize]) }

// AETH returns the AETH view; the opcode must have one.
func (p *Packet) AETH() AETH { o := p.Info.Offset[HdrAETH]; return AETH(p.Raw[o : o+AETHSize]) }

// ImmDt returns the ImmDt view; the opcode must have one.
func (p *Packet) ImmDt() ImmDt { o := p.Info.Offset[HdrImmDt]; return ImmDt(p.Raw[o : o+ImmDtSize]) }

// IETH returns the IETH view; the opcode must have one.
func (p *Packet) IETH() IETH { o := p.Info.Offset[HdrIETH]; return IETH(p.Raw[o : o+IETHSize]) }

// DETH returns the DETH view; the opcode must have one.
func (p *Packet) DETH() DETH { o := p.Info.Offset[HdrDETH]; return DETH(p.Raw[o : o+DETHSize]) }

// AtomicETH returns the AtomicETH view; the opcode must have one.
func (p *Packet) AtomicETH() AtomicETH {
	o := p.Info.Offset[HdrAtomicETH]
	return AtomicETH(p.Raw[o : o+AtomicETHSize])
}

// AtomicAckETH returns the AtomicAckETH view; the opcode must have one.
func (p *Packet) AtomicAckETH() AtomicAckETH {
	o := p.Info.Offset[HdrAtomicAckETH]
	return AtomicAckETH(p.Raw[o : o+AtomicAckETHSize])
}

// PadFor returns the pad count (0-3) that brings a payload of n bytes to a
// multiple of 4 bytes (IBTA 9.2, PadCnt).
func PadFor(n int) int { return (4 - n&3) & 3 }
