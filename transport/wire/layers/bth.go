package layers

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gopacket/gopacket"
	golayers "github.com/gopacket/gopacket/layers"

	"github.com/softrdma/softrdma/transport/wire"
)

// Base Transport Header, IBTA 9.2 (Figure 104), followed at the end of the
// UDP payload by the pad (0-3 bytes) and the 4-byte ICRC:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|    OpCode     |S|M|Pad| TVer  |            P_Key              |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|F|B|   Resv6   |                 DestQP                        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|A|   Resv7     |                   PSN                         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|        extension headers, payload (LayerPayload) ...          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  ... payload  |  pad (PadCount bytes, zero)                   |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                   ICRC (little-endian)                        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

// BTH is the Base Transport Header layer. It is decoded from the whole
// UDP payload: its Contents are the 12 BTH bytes, its Payload the
// extension headers and the payload without pad and ICRC, and the ICRC
// trailer is the ICRC field. NextLayerType follows the opcode table.
type BTH struct {
	golayers.BaseLayer
	Opcode         wire.Opcode
	SolicitedEvent bool
	MigReq         bool
	PadCount       uint8 // pad bytes between payload and ICRC (0-3)
	TVer           uint8 // transport header version, 0
	PKey           uint16
	FECN, BECN     bool
	DestQP         wire.QPN
	AckReq         bool
	PSN            wire.PSN
	// ICRC is the invariant CRC trailer, as the number the 4 bytes hold
	// little-endian (Wireshark shows the bytes read big-endian). See
	// SerializeTo for when it is computed.
	ICRC uint32

	// pkt is the wire decode of the last DecodeFromBytes (valid opcodes).
	pkt wire.Packet
	// raw is the whole UDP payload of the last DecodeFromBytes.
	raw []byte
	// ip and udp, set by SetNetworkLayerForICRC, give the headers the ICRC
	// covers when serializing.
	ip  gopacket.NetworkLayer
	udp *golayers.UDP
}

// LayerType returns LayerTypeBTH.
func (b *BTH) LayerType() gopacket.LayerType { return LayerTypeBTH }

// CanDecode returns LayerTypeBTH.
func (b *BTH) CanDecode() gopacket.LayerClass { return LayerTypeBTH }

// NextLayerType returns the first extension header of the opcode, the
// payload, or LayerTypeZero when nothing follows. Opcodes the wire table
// does not know (e.g. CNP) are followed by payload.
func (b *BTH) NextLayerType() gopacket.LayerType {
	if !wire.Info(b.Opcode).Valid() {
		if len(b.Payload) == 0 {
			return gopacket.LayerTypeZero
		}
		return gopacket.LayerTypePayload
	}
	return nextLayerType(b.Opcode, wire.HdrBTH, b.Payload)
}

// Packet returns the wire decode of the packet: what the engine works on.
// It is valid after a successful DecodeFromBytes of a known opcode (Info
// is nil otherwise) and aliases the decoded bytes.
func (b *BTH) Packet() *wire.Packet { return &b.pkt }

// DecodeFromBytes decodes the UDP payload data (BTH through ICRC) with
// wire.Parse. Opcodes the wire table does not know are decoded as a BTH
// followed by payload; a packet too short for its headers is reported
// truncated.
func (b *BTH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	b.pkt = wire.Packet{}
	err := wire.Parse(data, &b.pkt)
	switch {
	case errors.Is(err, wire.ErrTooShort):
		need := wire.BTHSize + wire.ICRCSize
		if len(data) > 0 {
			need = max(need, wire.Info(wire.Opcode(data[0])).Length+wire.ICRCSize)
		}
		b.pkt = wire.Packet{}
		return truncated(df, "BTH", need, len(data))
	case errors.Is(err, wire.ErrUnknownOpcode):
		b.pkt = wire.Packet{}
	case err != nil:
		b.pkt = wire.Packet{}
		return fmt.Errorf("layers: %w", err)
	}
	v := wire.BTH(data)
	b.Opcode = v.Opcode()
	b.SolicitedEvent = v.SolicitedEvent()
	b.MigReq = v.MigReq()
	b.PadCount = uint8(v.PadCount())
	b.TVer = v.TVer()
	b.PKey = v.PKey()
	b.FECN = v.FECN()
	b.BECN = v.BECN()
	b.DestQP = v.DestQP()
	b.AckReq = v.AckReq()
	b.PSN = v.PSN()
	b.ICRC = wire.PacketICRC(data)
	b.raw = data
	end := len(data) - wire.ICRCSize
	if end-wire.BTHSize >= int(b.PadCount) {
		end -= int(b.PadCount)
	}
	b.BaseLayer = golayers.BaseLayer{Contents: data[:wire.BTHSize], Payload: data[wire.BTHSize:end]}
	return nil
}

// SetNetworkLayerForICRC gives the IP (IPv4 or IPv6) and UDP layers whose
// headers the ICRC covers, as UDP.SetNetworkLayerForChecksum does for the
// UDP checksum. The layers are read when SerializeTo runs: the IPv4 ID and
// DF bit, the addresses and the ports; lengths come from the buffer.
func (b *BTH) SetNetworkLayerForICRC(ip gopacket.NetworkLayer, udp *golayers.UDP) error {
	if _, err := IPHeader(ip); err != nil {
		return err
	}
	if udp == nil {
		return errNoNetwork
	}
	b.ip, b.udp = ip, udp
	return nil
}

// ICRCValid reports whether the decoded packet's ICRC matches, computed
// with exactly the IP and UDP layers it was decoded with (a capture shows
// the sender's IPv4 ID, so no ID recovery is needed or done).
func (b *BTH) ICRCValid(ip gopacket.NetworkLayer, udp *golayers.UDP) (bool, error) {
	h, err := IPHeader(ip)
	if err != nil {
		return false, err
	}
	if udp == nil {
		return false, errNoNetwork
	}
	if b.raw == nil {
		return false, errors.New("layers: BTH not decoded")
	}
	return wire.VerifyICRCExact(&h, uint16(udp.SrcPort), uint16(udp.DstPort), b.raw), nil
}

// SerializeTo prepends the BTH and appends the pad and the ICRC to the
// extension headers and payload already in the buffer.
//
// With opts.FixLengths, PadCount is set to pad the payload (the bytes past
// the opcode's extension headers) to a multiple of 4. With
// opts.ComputeChecksums and SetNetworkLayerForICRC called, the ICRC field
// is computed (wire.ComputeICRC) over the IP and UDP headers those layers
// will produce — their lengths taken from the buffer, so serialize them in
// the same SerializeLayers call with FixLengths — and the BTH bytes
// written here. Otherwise the ICRC field is written as it is. The layers
// above (UDP, IP) are serialized after this one and do not change what the
// ICRC covers: it masks the UDP and IP checksums, TTL and TOS.
func (b *BTH) SerializeTo(buf gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	if opts.FixLengths {
		n := len(buf.Bytes())
		if info := wire.Info(b.Opcode); info.Valid() {
			ext := info.Length - wire.BTHSize
			if n < ext {
				return fmt.Errorf("layers: %v needs %d bytes of extension headers, have %d", b.Opcode, ext, n)
			}
			n -= ext
		}
		b.PadCount = uint8(wire.PadFor(n))
	}
	tail, err := buf.AppendBytes(int(b.PadCount&3) + wire.ICRCSize)
	if err != nil {
		return err
	}
	clear(tail)
	hdr, err := buf.PrependBytes(wire.BTHSize)
	if err != nil {
		return err
	}
	wire.BTH(hdr).Encode(&wire.BTHFields{
		Opcode:         b.Opcode,
		SolicitedEvent: b.SolicitedEvent,
		MigReq:         b.MigReq,
		PadCount:       int(b.PadCount),
		PKey:           b.PKey,
		FECN:           b.FECN,
		BECN:           b.BECN,
		DestQP:         b.DestQP,
		AckReq:         b.AckReq,
		PSN:            b.PSN,
	})
	hdr[1] |= b.TVer & 0x0f
	pkt := buf.Bytes()
	if opts.ComputeChecksums && b.ip != nil {
		h, err := IPHeader(b.ip)
		if err != nil {
			return err
		}
		b.ICRC = wire.ComputeICRC(&h, uint16(b.udp.SrcPort), uint16(b.udp.DstPort), pkt[:len(pkt)-wire.ICRCSize])
	}
	binary.LittleEndian.PutUint32(pkt[len(pkt)-wire.ICRCSize:], b.ICRC)
	return nil
}

func decodeBTH(data []byte, p gopacket.PacketBuilder) error {
	b := &BTH{}
	if err := b.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(b)
	if !wire.Info(b.Opcode).Valid() {
		return p.NextDecoder(gopacket.LayerTypePayload)
	}
	return p.NextDecoder(nextDecoder(b.Opcode, wire.HdrBTH, b.DestQP))
}
