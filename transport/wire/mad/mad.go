package mad

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// MAD common header, IBTA 13.4.2 (24 bytes), followed by 232 bytes of
// class data:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  BaseVersion  |   MgmtClass   | ClassVersion  |R|   Method    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|            Status             |         ClassSpecific         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                      TransactionID (64)                       |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|          AttributeID          |           Reserved            |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                       AttributeModifier                       |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                     Data (232 bytes) ...                      |

// Specification constants.
const (
	// Size is the size of a MAD in bytes (IBTA 13.4.2).
	Size = 256
	// HeaderSize is the size of the common MAD header.
	HeaderSize = 24
	// DataSize is the size of the class data after the common header.
	DataSize = Size - HeaderSize

	// BaseVersion is the MAD base version of IBTA 13.4.2 (Parse rejects
	// others, e.g. OPA's 0x80).
	BaseVersion = 1

	// GSIQPN is the QP of the general services interface, which receives
	// every MAD but the subnet manager's (IBTA chapter 13; RoCE has no
	// QP0).
	GSIQPN = 1
	// GSIQKey is QP1's well-known Q_Key (IBTA chapter 13), carried in the
	// DETH of every MAD sent to QP1.
	GSIQKey = 0x80010000

	// CMClassVersion is the communication management class version that
	// Linux sends (IB_CM_CLASS_VERSION) and the rxe captures carry.
	CMClassVersion = 2
)

// Decoding errors.
var (
	ErrTooShort       = errors.New("mad: shorter than a 256-byte MAD")
	ErrBadBaseVersion = errors.New("mad: base version is not 1")
	ErrNotCM          = errors.New("mad: not a communication management MAD (class 0x07, version 2)")
	ErrNotCMMessage   = errors.New("mad: CM attribute is not a message this package decodes")
)

const (
	hdrBaseVersion   = 0
	hdrMgmtClass     = 1
	hdrClassVersion  = 2
	hdrMethod        = 3
	hdrStatus        = 4
	hdrClassSpecific = 6
	hdrTID           = 8
	hdrAttrID        = 16
	hdrAttrMod       = 20
	methodRBit       = 0x80
)

// Datagram is a view of a MAD: the common header and the class data. It
// must be at least Size bytes; Parse returns one that is exactly Size.
type Datagram []byte

// Parse returns the MAD at the start of b, the payload of a UD SEND to
// QP1 (without pad and ICRC; bytes past Size are ignored). It checks the
// length (ErrTooShort) and the base version (ErrBadBaseVersion), nothing
// else: any class, method and attribute parses. It allocates nothing; the
// view aliases b.
func Parse(b []byte) (Datagram, error) {
	if len(b) < Size {
		return nil, ErrTooShort
	}
	if b[hdrBaseVersion] != BaseVersion {
		return nil, ErrBadBaseVersion
	}
	return Datagram(b[:Size:Size]), nil
}

// BaseVersion returns the "BaseVersion" field (1).
func (d Datagram) BaseVersion() uint8 { return d[hdrBaseVersion] }

// Class returns the "MgmtClass" field.
func (d Datagram) Class() Class { return Class(d[hdrMgmtClass]) }

// ClassVersion returns the "ClassVersion" field.
func (d Datagram) ClassVersion() uint8 { return d[hdrClassVersion] }

// Method returns the "Method" byte, R bit included (so GetResp is 0x81).
func (d Datagram) Method() Method { return Method(d[hdrMethod]) }

// Response returns the "R" bit: the MAD is a response.
func (d Datagram) Response() bool { return d[hdrMethod]&methodRBit != 0 }

// Status returns the 16-bit "Status" field (IBTA 13.4.2; class-specific meaning).
func (d Datagram) Status() uint16 { return binary.BigEndian.Uint16(d[hdrStatus:]) }

// ClassSpecific returns the 16-bit "ClassSpecific" field.
func (d Datagram) ClassSpecific() uint16 { return binary.BigEndian.Uint16(d[hdrClassSpecific:]) }

// TransactionID returns the 64-bit "TransactionID" field. The CM keeps one
// per exchange: REQ, REP and RTU of a connection carry the same.
func (d Datagram) TransactionID() uint64 { return binary.BigEndian.Uint64(d[hdrTID:]) }

// AttributeID returns the "AttributeID" field; its meaning depends on the
// class (for ClassCM, the message: AttrREQ, AttrREP, ...).
func (d Datagram) AttributeID() AttributeID {
	return AttributeID(binary.BigEndian.Uint16(d[hdrAttrID:]))
}

// AttributeModifier returns the 32-bit "AttributeModifier" field.
func (d Datagram) AttributeModifier() uint32 { return binary.BigEndian.Uint32(d[hdrAttrMod:]) }

// Data returns the DataSize bytes of class data after the header.
func (d Datagram) Data() []byte { return d[HeaderSize:Size:Size] }

// IsCM reports whether d belongs to the communication management class
// version this package decodes (ClassCM, CMClassVersion).
func (d Datagram) IsCM() bool {
	return d.Class() == ClassCM && d.ClassVersion() == CMClassVersion
}

// CM returns the CM attribute of d and its class data, ready for the
// message views (REQ(data), REP(data), ...). It returns ErrNotCM for
// another class or class version and ErrNotCMMessage for a CM attribute
// without a view here (ClassPortInfo, SIDR, LAP, APR); the attribute is
// returned in both cases. It allocates nothing.
func (d Datagram) CM() (AttributeID, []byte, error) {
	attr := d.AttributeID()
	if !d.IsCM() {
		return attr, nil, ErrNotCM
	}
	if !attr.IsCMMessage() {
		return attr, nil, ErrNotCMMessage
	}
	return attr, d.Data(), nil
}

// HeaderFields holds the fields of a common MAD header for Encode.
type HeaderFields struct {
	BaseVersion       uint8 // 0 means BaseVersion
	Class             Class
	ClassVersion      uint8
	Method            Method // R bit included
	Status            uint16
	ClassSpecific     uint16
	TransactionID     uint64
	AttributeID       AttributeID
	AttributeModifier uint32
}

// Decode fills f from the header of d.
func (d Datagram) Decode(f *HeaderFields) {
	*f = HeaderFields{
		BaseVersion: d.BaseVersion(), Class: d.Class(), ClassVersion: d.ClassVersion(), Method: d.Method(),
		Status: d.Status(), ClassSpecific: d.ClassSpecific(), TransactionID: d.TransactionID(),
		AttributeID: d.AttributeID(), AttributeModifier: d.AttributeModifier(),
	}
}

// Encode writes the common header f into d (at least HeaderSize bytes),
// reserved bytes zero; the class data is left alone.
func (d Datagram) Encode(f *HeaderFields) {
	_ = d[HeaderSize-1]
	v := f.BaseVersion
	if v == 0 {
		v = BaseVersion
	}
	d[hdrBaseVersion] = v
	d[hdrMgmtClass] = byte(f.Class)
	d[hdrClassVersion] = f.ClassVersion
	d[hdrMethod] = byte(f.Method)
	binary.BigEndian.PutUint16(d[hdrStatus:], f.Status)
	binary.BigEndian.PutUint16(d[hdrClassSpecific:], f.ClassSpecific)
	binary.BigEndian.PutUint64(d[hdrTID:], f.TransactionID)
	binary.BigEndian.PutUint16(d[hdrAttrID:], uint16(f.AttributeID))
	d[hdrAttrID+2], d[hdrAttrID+3] = 0, 0
	binary.BigEndian.PutUint32(d[hdrAttrMod:], f.AttributeModifier)
}

// Class is the "MgmtClass" of a MAD (IBTA 13.4.2).
type Class uint8

// Management classes.
const (
	ClassSubnLIDRouted      Class = 0x01
	ClassSubnAdm            Class = 0x03
	ClassPerf               Class = 0x04
	ClassBM                 Class = 0x05
	ClassDevMgt             Class = 0x06
	ClassCM                 Class = 0x07 // communication management, IBTA chapter 12
	ClassSNMP               Class = 0x08
	ClassSubnDirectedRouted Class = 0x81
)

var classNames = map[Class]string{
	ClassSubnLIDRouted: "SubnLIDRouted", ClassSubnAdm: "SubnAdm", ClassPerf: "Perf", ClassBM: "BM",
	ClassDevMgt: "DevMgt", ClassCM: "CM", ClassSNMP: "SNMP", ClassSubnDirectedRouted: "SubnDirectedRouted",
}

// String returns the class name ("CM") or its number ("class 0x42").
func (c Class) String() string {
	if s, ok := classNames[c]; ok {
		return s
	}
	return fmt.Sprintf("class 0x%02x", uint8(c))
}

// Method is the "Method" byte of a MAD, response bit included
// (IBTA 13.4.2: the high bit R marks a response).
type Method uint8

// Methods. The CM sends every message with MethodSend.
const (
	MethodGet         Method = 0x01
	MethodSet         Method = 0x02
	MethodSend        Method = 0x03
	MethodTrap        Method = 0x05
	MethodReport      Method = 0x06
	MethodTrapRepress Method = 0x07
	MethodGetResp     Method = 0x81
	MethodReportResp  Method = 0x86
)

var methodNames = map[Method]string{
	MethodGet: "Get", MethodSet: "Set", MethodSend: "Send", MethodTrap: "Trap", MethodReport: "Report",
	MethodTrapRepress: "TrapRepress", MethodGetResp: "GetResp", MethodReportResp: "ReportResp",
}

// String returns the method name as Wireshark prints it ("Send") or its
// number ("method 0x42").
func (m Method) String() string {
	if s, ok := methodNames[m]; ok {
		return s
	}
	return fmt.Sprintf("method 0x%02x", uint8(m))
}

// AttributeID is the "AttributeID" of a MAD. The constants are the
// communication management class's (IBTA 12.6).
type AttributeID uint16

// CM attributes.
const (
	AttrClassPortInfo AttributeID = 0x0001
	AttrREQ           AttributeID = 0x0010 // ConnectRequest
	AttrMRA           AttributeID = 0x0011 // MsgRcptAck
	AttrREJ           AttributeID = 0x0012 // ConnectReject
	AttrREP           AttributeID = 0x0013 // ConnectReply
	AttrRTU           AttributeID = 0x0014 // ReadyToUse
	AttrDREQ          AttributeID = 0x0015 // DisconnectRequest
	AttrDREP          AttributeID = 0x0016 // DisconnectReply
	AttrSIDRREQ       AttributeID = 0x0017 // ServiceIDResReq
	AttrSIDRREP       AttributeID = 0x0018 // ServiceIDResReqResp
	AttrLAP           AttributeID = 0x0019 // LoadAlternatePath
	AttrAPR           AttributeID = 0x001a // AlternatePathResponse
)

var attrNames = map[AttributeID]string{
	AttrClassPortInfo: "ClassPortInfo", AttrREQ: "REQ", AttrMRA: "MRA", AttrREJ: "REJ", AttrREP: "REP",
	AttrRTU: "RTU", AttrDREQ: "DREQ", AttrDREP: "DREP", AttrSIDRREQ: "SIDR_REQ", AttrSIDRREP: "SIDR_REP",
	AttrLAP: "LAP", AttrAPR: "APR",
}

// String returns the CM message name ("REQ") or the number ("attr 0x0042").
func (a AttributeID) String() string {
	if s, ok := attrNames[a]; ok {
		return s
	}
	return fmt.Sprintf("attr 0x%04x", uint16(a))
}

// IsCMMessage reports whether a is a CM message this package has a view
// for: REQ, MRA, REJ, REP, RTU, DREQ or DREP.
func (a AttributeID) IsCMMessage() bool { return a >= AttrREQ && a <= AttrDREP }
