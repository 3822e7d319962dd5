package layers

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/gopacket/gopacket"
	golayers "github.com/gopacket/gopacket/layers"

	"github.com/softrdma/softrdma/transport/wire/mad"
)

// The management layers. A UD_SEND_ONLY to QP1 whose payload is a MAD
// decodes as
//
//	BTH | DETH | MAD | CM | IPCM | Payload    (a REQ to an IP service ID)
//	BTH | DETH | MAD | CM | Payload           (the other CM messages)
//	BTH | DETH | MAD | Payload                (other classes and attributes)
//
// MAD's Contents are the 24-byte common header and its Payload the 232
// bytes of class data; CM's Contents are the message's fixed fields and its
// Payload the private data; IPCM's Contents are the 36-byte IP CM header
// and its Payload the consumer's private data. The layout diagrams are in
// package mad.

// MAD is the common MAD header layer, IBTA 13.4.2.
type MAD struct {
	golayers.BaseLayer
	BaseVersion       uint8
	Class             mad.Class
	ClassVersion      uint8
	Method            mad.Method // R bit included
	Status            uint16
	ClassSpecific     uint16
	TransactionID     uint64
	AttributeID       mad.AttributeID
	AttributeModifier uint32
}

// LayerType returns LayerTypeMAD.
func (m *MAD) LayerType() gopacket.LayerType { return LayerTypeMAD }

// CanDecode returns LayerTypeMAD.
func (m *MAD) CanDecode() gopacket.LayerClass { return LayerTypeMAD }

// NextLayerType returns CM for a CM message with a view in package mad
// (REQ, MRA, REJ, REP, RTU, DREQ, DREP of class version 2), else payload.
func (m *MAD) NextLayerType() gopacket.LayerType {
	if m.isCMMessage() {
		return LayerTypeCM
	}
	return gopacket.LayerTypePayload
}

func (m *MAD) isCMMessage() bool {
	return m.Class == mad.ClassCM && m.ClassVersion == mad.CMClassVersion && m.AttributeID.IsCMMessage()
}

// DecodeFromBytes decodes the first mad.Size bytes of data with mad.Parse;
// bytes past them are not part of the layer. A short MAD is reported
// truncated; a base version other than 1 is an error.
func (m *MAD) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	d, err := mad.Parse(data)
	switch {
	case errors.Is(err, mad.ErrTooShort):
		return truncated(df, "MAD", mad.Size, len(data))
	case err != nil:
		return fmt.Errorf("layers: %w", err)
	}
	*m = MAD{
		BaseLayer:   golayers.BaseLayer{Contents: d[:mad.HeaderSize], Payload: d.Data()},
		BaseVersion: d.BaseVersion(), Class: d.Class(), ClassVersion: d.ClassVersion(), Method: d.Method(),
		Status: d.Status(), ClassSpecific: d.ClassSpecific(), TransactionID: d.TransactionID(),
		AttributeID: d.AttributeID(), AttributeModifier: d.AttributeModifier(),
	}
	return nil
}

// SerializeTo prepends the common header to the class data in the buffer
// (a CM layer's output, or a payload), padding the class data with zeros
// to mad.DataSize bytes. More class data than that is an error.
func (m *MAD) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	if err := padTo(b, "MAD class data", mad.DataSize); err != nil {
		return err
	}
	h, err := b.PrependBytes(mad.HeaderSize)
	if err != nil {
		return err
	}
	mad.Datagram(h).Encode(&mad.HeaderFields{
		BaseVersion: m.BaseVersion, Class: m.Class, ClassVersion: m.ClassVersion, Method: m.Method,
		Status: m.Status, ClassSpecific: m.ClassSpecific, TransactionID: m.TransactionID,
		AttributeID: m.AttributeID, AttributeModifier: m.AttributeModifier,
	})
	return nil
}

func decodeMAD(data []byte, p gopacket.PacketBuilder) error {
	m := &MAD{}
	if err := m.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(m)
	if m.isCMMessage() {
		return p.NextDecoder(cmDecoder{m.AttributeID})
	}
	return p.NextDecoder(gopacket.LayerTypePayload)
}

// padTo appends zeros to the bytes in b up to n bytes; more is an error.
func padTo(b gopacket.SerializeBuffer, what string, n int) error {
	have := len(b.Bytes())
	if have > n {
		return fmt.Errorf("layers: %s is %d bytes, at most %d fit", what, have, n)
	}
	if have < n {
		tail, err := b.AppendBytes(n - have)
		if err != nil {
			return err
		}
		clear(tail)
	}
	return nil
}

// CM is the layer of a communication manager message (IBTA 12.6): the
// class data of a CM MAD. Attribute says which message it is and which of
// the *Fields is filled in; the others are zero. The Fields' PrivateData
// alias the decoded bytes (the layer's Payload).
type CM struct {
	golayers.BaseLayer
	Attribute mad.AttributeID // from the MAD header: AttrREQ ... AttrDREP
	REQ       mad.REQFields
	MRA       mad.MRAFields
	REJ       mad.REJFields
	REP       mad.REPFields
	RTU       mad.RTUFields
	DREQ      mad.DREQFields
	DREP      mad.RTUFields
	// mad, set by NewDecodingLayers, gives Attribute in a
	// DecodingLayerParser.
	mad *MAD
}

// LayerType returns LayerTypeCM.
func (c *CM) LayerType() gopacket.LayerType { return LayerTypeCM }

// CanDecode returns LayerTypeCM.
func (c *CM) CanDecode() gopacket.LayerClass { return LayerTypeCM }

// NextLayerType returns IPCM for a REQ to an IP service ID whose private
// data has a valid IP CM header, else the private data as payload.
func (c *CM) NextLayerType() gopacket.LayerType {
	if c.Attribute == mad.AttrREQ && c.REQ.ServiceID.IsIP() && mad.IPPrivateData(c.Payload).Valid() {
		return LayerTypeIPCM
	}
	return gopacket.LayerTypePayload
}

// CommIDs returns the message's local and remote communication IDs (a REQ
// has no remote one: 0).
func (c *CM) CommIDs() (local, remote uint32) {
	switch c.Attribute {
	case mad.AttrREQ:
		return c.REQ.LocalCommID, 0
	case mad.AttrMRA:
		return c.MRA.LocalCommID, c.MRA.RemoteCommID
	case mad.AttrREJ:
		return c.REJ.LocalCommID, c.REJ.RemoteCommID
	case mad.AttrREP:
		return c.REP.LocalCommID, c.REP.RemoteCommID
	case mad.AttrRTU:
		return c.RTU.LocalCommID, c.RTU.RemoteCommID
	case mad.AttrDREQ:
		return c.DREQ.LocalCommID, c.DREQ.RemoteCommID
	case mad.AttrDREP:
		return c.DREP.LocalCommID, c.DREP.RemoteCommID
	}
	return 0, 0
}

// privateDataOffset returns where the private data of attr starts in the
// class data, or 0 for an attribute without a view.
func privateDataOffset(attr mad.AttributeID) int {
	switch attr {
	case mad.AttrREQ:
		return mad.DataSize - mad.REQPrivateDataSize
	case mad.AttrMRA:
		return mad.DataSize - mad.MRAPrivateDataSize
	case mad.AttrREJ:
		return mad.DataSize - mad.REJPrivateDataSize
	case mad.AttrREP:
		return mad.DataSize - mad.REPPrivateDataSize
	case mad.AttrRTU:
		return mad.DataSize - mad.RTUPrivateDataSize
	case mad.AttrDREQ:
		return mad.DataSize - mad.DREQPrivateDataSize
	case mad.AttrDREP:
		return mad.DataSize - mad.DREPPrivateDataSize
	}
	return 0
}

// DecodeFromBytes decodes the class data of a CM MAD (at least
// mad.DataSize bytes; more is ignored) as the message the attribute names:
// the linked MAD layer's AttributeID in a DecodingLayers, else the
// Attribute field as set before the call (gopacket.NewPacket's decoder
// sets it from the MAD layer).
func (c *CM) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	attr := c.Attribute
	if c.mad != nil {
		attr = c.mad.AttributeID
	}
	if len(data) < mad.DataSize {
		return truncated(df, "CM message", mad.DataSize, len(data))
	}
	off := privateDataOffset(attr)
	if off == 0 {
		return fmt.Errorf("layers: %w: %v", mad.ErrNotCMMessage, attr)
	}
	data = data[:mad.DataSize:mad.DataSize]
	*c = CM{
		BaseLayer: golayers.BaseLayer{Contents: data[:off], Payload: data[off:]},
		Attribute: attr,
		mad:       c.mad,
	}
	switch attr {
	case mad.AttrREQ:
		mad.REQ(data).Decode(&c.REQ)
	case mad.AttrMRA:
		mad.MRA(data).Decode(&c.MRA)
	case mad.AttrREJ:
		mad.REJ(data).Decode(&c.REJ)
	case mad.AttrREP:
		mad.REP(data).Decode(&c.REP)
	case mad.AttrRTU:
		mad.RTU(data).Decode(&c.RTU)
	case mad.AttrDREQ:
		mad.DREQ(data).Decode(&c.DREQ)
	case mad.AttrDREP:
		mad.DREP(data).Decode(&c.DREP)
	}
	return nil
}

// SerializeTo prepends the fixed fields of the message Attribute names to
// the private data in the buffer (an IPCM layer's output, or a payload),
// padding the private data with zeros to the message's size. The Fields'
// PrivateData is not used: the buffer's bytes are the private data.
func (c *CM) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	off := privateDataOffset(c.Attribute)
	if off == 0 {
		return fmt.Errorf("layers: %w: %v", mad.ErrNotCMMessage, c.Attribute)
	}
	if err := padTo(b, c.Attribute.String()+" private data", mad.DataSize-off); err != nil {
		return err
	}
	var tmp [mad.DataSize]byte
	switch c.Attribute {
	case mad.AttrREQ:
		f := c.REQ
		f.PrivateData = nil
		mad.REQ(tmp[:]).Encode(&f)
	case mad.AttrMRA:
		f := c.MRA
		f.PrivateData = nil
		mad.MRA(tmp[:]).Encode(&f)
	case mad.AttrREJ:
		f := c.REJ
		f.PrivateData = nil
		mad.REJ(tmp[:]).Encode(&f)
	case mad.AttrREP:
		f := c.REP
		f.PrivateData = nil
		mad.REP(tmp[:]).Encode(&f)
	case mad.AttrRTU:
		f := c.RTU
		f.PrivateData = nil
		mad.RTU(tmp[:]).Encode(&f)
	case mad.AttrDREQ:
		f := c.DREQ
		f.PrivateData = nil
		mad.DREQ(tmp[:]).Encode(&f)
	case mad.AttrDREP:
		f := c.DREP
		f.PrivateData = nil
		mad.DREP(tmp[:]).Encode(&f)
	}
	h, err := b.PrependBytes(off)
	if err != nil {
		return err
	}
	copy(h, tmp[:off])
	return nil
}

// cmDecoder decodes a CM message with attribute attr (from its MAD).
type cmDecoder struct{ attr mad.AttributeID }

// Decode implements gopacket.Decoder.
func (d cmDecoder) Decode(data []byte, p gopacket.PacketBuilder) error {
	c := &CM{Attribute: d.attr}
	if err := c.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(c)
	return p.NextDecoder(c.NextLayerType())
}

// decodeCMStandalone is LayerTypeCM's registered decoder: without its MAD
// header a CM message cannot be told apart.
func decodeCMStandalone(data []byte, p gopacket.PacketBuilder) error {
	return errors.New("layers: a CM message decodes only after its MAD header (start at LayerTypeMAD)")
}

// IPCM is the layer of the RDMA CM IP private data header of a REQ (IBTA
// Annex A11): the addresses and port of the connection as rdma_cm sees it.
type IPCM struct {
	golayers.BaseLayer
	MajorVersion, MinorVersion uint8 // 0.0
	IPVersion                  uint8 // 4 or 6
	SrcPort                    uint16
	SrcIP, DstIP               netip.Addr // 4-byte for IPVersion 4
}

// LayerType returns LayerTypeIPCM.
func (i *IPCM) LayerType() gopacket.LayerType { return LayerTypeIPCM }

// CanDecode returns LayerTypeIPCM.
func (i *IPCM) CanDecode() gopacket.LayerClass { return LayerTypeIPCM }

// NextLayerType returns the consumer's private data as payload.
func (i *IPCM) NextLayerType() gopacket.LayerType { return gopacket.LayerTypePayload }

// DecodeFromBytes decodes the IP CM header at the start of data.
func (i *IPCM) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	if len(data) < mad.IPPrivateDataHeaderSize {
		return truncated(df, "IPCM", mad.IPPrivateDataHeaderSize, len(data))
	}
	v := mad.IPPrivateData(data)
	*i = IPCM{
		BaseLayer:    golayers.BaseLayer{Contents: data[:mad.IPPrivateDataHeaderSize], Payload: data[mad.IPPrivateDataHeaderSize:]},
		MajorVersion: v.MajorVersion(), MinorVersion: v.MinorVersion(), IPVersion: v.IPVersion(),
		SrcPort: v.SrcPort(), SrcIP: v.SrcIP(), DstIP: v.DstIP(),
	}
	return nil
}

// SerializeTo prepends the IP CM header to the consumer data in the
// buffer, padding it with zeros to mad.IPConsumerDataSize bytes. With
// IPVersion 0 the version follows the addresses.
func (i *IPCM) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	if err := padTo(b, "IP CM consumer data", mad.IPConsumerDataSize); err != nil {
		return err
	}
	h, err := b.PrependBytes(mad.IPPrivateDataHeaderSize)
	if err != nil {
		return err
	}
	mad.IPPrivateData(h).Encode(&mad.IPPrivateDataFields{
		MajorVersion: i.MajorVersion, MinorVersion: i.MinorVersion, IPVersion: i.IPVersion,
		SrcPort: i.SrcPort, SrcIP: i.SrcIP, DstIP: i.DstIP,
	})
	return nil
}

func decodeIPCM(data []byte, p gopacket.PacketBuilder) error {
	i := &IPCM{}
	if err := i.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(i)
	return p.NextDecoder(gopacket.LayerTypePayload)
}
