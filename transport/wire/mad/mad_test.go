package mad_test

import (
	"encoding/hex"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// unhex decodes a hex dump, ignoring white space and // comments.
func unhex(tb testing.TB, s string) []byte {
	tb.Helper()
	var clean strings.Builder
	for line := range strings.Lines(s) {
		line, _, _ = strings.Cut(line, "//")
		clean.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := hex.DecodeString(clean.String())
	require.NoError(tb, err)
	return b
}

// madOf returns a 256-byte MAD made of the given leading bytes, zero padded.
func madOf(tb testing.TB, s string) []byte {
	b := make([]byte, mad.Size)
	copy(b, unhex(tb, s))
	return b
}

// rpingREQ is the MAD of frame 3 of shared/rxe-testbed/captures/rping.pcap
// (rping -c to rping -s on Linux 6.1 rxe; UDP payload bytes 20-275, after
// the BTH and DETH). The bytes not shown are zero. `tshark -V` says:
//
//	MAD Header - Common Management Datagram
//	    Base Version: 0x01, Management Class: 0x07, Class Version: 0x02
//	    Method: Send() (0x03), Status: 0x0000, Class Specific: 0x0000
//	    Transaction ID: 0x000000029bcc2966, Attribute ID: 0x0010
//	    Attribute Modifier: 0x00000000
//	CM ConnectRequest
//	    Local Communication ID: 0x6629cc9b
//	    IP CM ServiceID: Prefix 0000000001, Protocol 0x06, Destination Port 0x1c06
//	    Local CA GUID: 0x505400fffe77000b
//	    Local Q_Key: 0x00000000, Local QPN: 0x000011, Responder Resources: 0x01
//	    Local EECN: 0x000000, Initiator Depth: 0x01, Remote EECN: 0x000000
//	    Remote CM Response Timeout: 0x14, Transport Service Type: 0x0, End-to-End Flow Control: 0x0
//	    Starting PSN: 0x41efb3, Local CM Response Timeout: 0x14, Retry Count: 0x7
//	    Partition Key: 0xffff, Path Packet Payload MTU: 0x3, RDC Exists: 0x0, RNR Retry Count: 0x7
//	    Max CM Retries: 0xf, SRQ: 0x0, Extended Transport: 0x0
//	    Primary Local Port LID: 65535, Primary Remote Port LID: 65535
//	    Primary Local Port GID: 192.168.77.11, Primary Remote Port GID: 192.168.77.10
//	    Primary Traffic Class: 0x00, Primary Hop Limit: 0x40, Primary SL: 0x0
//	    Primary Subnet Local: 0x0, Primary Local ACK Timeout: 0x13
//	    IP CM Private Data
//	        IP CM Major Version: 0x0, Minor Version: 0x0, IP Version: 0x4
//	        IP CM Source Port: 0xa8d7
//	        IP CM Source IP: 192.168.77.11, IP CM Destination IP: 192.168.77.10
//
// Wireshark 4.0 shows "Primary Flow Label: 0x0048e" and "Primary Packet
// Rate: 0x08", which the bytes (48 e0 f0 00 at data offset 88: 20 bits of
// flow label, 6 reserved, 6 of rate) do not say: it reads the 32-bit word
// as 24 bits. The IBTA layout (and Linux's CM_REQ_PRIMARY_FLOW_LABEL at
// bit 0 of byte 88, CM_REQ_PRIMARY_PACKET_RATE in the low 6 bits of byte
// 91) gives flow label 0x48e0f and rate 0.
const rpingREQ = `
0107020300000000000000029bcc296600100000000000006629cc9b00000000
0000000001061c06505400fffe77000b00000000000000000000110100000001
000000a041efb3a7ffff37f0ffffffff00000000000000000000ffffc0a84d0b
00000000000000000000ffffc0a84d0a48e0f000004000980000000000000000
0000000000000000000000000000000000000000000000000000000000000000
000000000040a8d7000000000000000000000000c0a84d0b0000000000000000
00000000c0a84d0a`

// rpingREP is the MAD of frame 4 (the server's ConnectReply):
//
//	Transaction ID: 0x000000029bcc2966, Attribute ID: 0x0013
//	CM ConnectReply
//	    Local Communication ID: 0xea885c77, Remote Communication ID: 0x6629cc9b
//	    Local Q_Key: 0x00000000, Local QPN: 0x000011, Local EE Context Number: 0x000000
//	    Starting PSN: 0x142214, Responder Resources: 0x01, Initiator Depth: 0x01
//	    Target ACK Delay: 0x0f, Failover Accepted: 0x0, End-To-End Flow Control: 0x0
//	    RNR Retry Count: 0x7, SRQ: 0x0
//	    Local CA GUID: 0x505400fffe77000a
const rpingREP = `
0107020300000000000000029bcc29660013000000000000ea885c776629cc9b
00000000000011000000000014221400010178e0505400fffe77000a`

// rpingRTU, rpingDREQ, rpingDREP are frames 5, 42 and 43:
//
//	ReadyToUse:        Local Communication ID 0x6629cc9b, Remote 0xea885c77
//	DisconnectRequest: Local Communication ID 0x6629cc9b, Remote 0xea885c77, Remote QPN/EECN 0x000011
//	DisconnectReply:   Local Communication ID 0xea885c77, Remote 0x6629cc9b
const (
	rpingRTU  = `0107020300000000000000029bcc296600140000000000006629cc9bea885c77`
	rpingDREQ = `0107020300000000000000029bcc296600150000000000006629cc9bea885c77 00001100`
	rpingDREP = `0107020300000000000000029bcc29660016000000000000ea885c776629cc9b`
)

func TestParseHeader(t *testing.T) {
	d, err := mad.Parse(madOf(t, rpingREQ))
	require.NoError(t, err)
	require.Len(t, d, mad.Size)
	require.Equal(t, uint8(1), d.BaseVersion())
	require.Equal(t, mad.ClassCM, d.Class())
	require.Equal(t, uint8(2), d.ClassVersion())
	require.Equal(t, mad.MethodSend, d.Method())
	require.False(t, d.Response())
	require.Zero(t, d.Status())
	require.Zero(t, d.ClassSpecific())
	require.Equal(t, uint64(0x000000029bcc2966), d.TransactionID())
	require.Equal(t, mad.AttrREQ, d.AttributeID())
	require.Zero(t, d.AttributeModifier())
	require.Len(t, d.Data(), mad.DataSize)
	require.True(t, d.IsCM())
	attr, data, err := d.CM()
	require.NoError(t, err)
	require.Equal(t, mad.AttrREQ, attr)
	require.Equal(t, []byte(d[24:]), data)

	var h mad.HeaderFields
	d.Decode(&h)
	require.Equal(t, mad.HeaderFields{BaseVersion: 1, Class: mad.ClassCM, ClassVersion: 2, Method: mad.MethodSend,
		TransactionID: 0x29bcc2966, AttributeID: mad.AttrREQ}, h)
	b := make([]byte, mad.Size)
	copy(b[mad.HeaderSize:], d.Data())
	h.BaseVersion = 0 // means 1
	mad.Datagram(b).Encode(&h)
	require.Equal(t, []byte(d), b, "Encode(Decode(d)) == d")

	require.Equal(t, "CM", d.Class().String())
	require.Equal(t, "Send", d.Method().String())
	require.Equal(t, "REQ", d.AttributeID().String())
	require.Equal(t, "GetResp", mad.MethodGetResp.String())
	require.True(t, mad.Datagram(madOf(t, "01070281")).Response())
	require.Equal(t, "method 0x42", mad.Method(0x42).String())
	require.Equal(t, "class 0x42", mad.Class(0x42).String())
	require.Equal(t, "attr 0x0042", mad.AttributeID(0x42).String())
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		err  error
	}{
		{"empty", nil, mad.ErrTooShort},
		{"255 bytes", make([]byte, 255), mad.ErrTooShort},
		{"base version 0", make([]byte, 256), mad.ErrBadBaseVersion},
		{"OPA base version", append([]byte{0x80}, make([]byte, 255)...), mad.ErrBadBaseVersion},
	} {
		_, err := mad.Parse(tc.b)
		require.ErrorIs(t, err, tc.err, tc.name)
	}
	// Longer is fine: the view is the first 256 bytes.
	d, err := mad.Parse(append(madOf(t, rpingREQ), 1, 2, 3))
	require.NoError(t, err)
	require.Len(t, d, mad.Size)

	// Other classes parse, but are not CM.
	sa := madOf(t, "01030281")
	d, err = mad.Parse(sa)
	require.NoError(t, err)
	require.Equal(t, mad.ClassSubnAdm, d.Class())
	_, _, err = d.CM()
	require.ErrorIs(t, err, mad.ErrNotCM)
	// CM class version 1 is not decoded.
	_, _, err = mad.Datagram(madOf(t, "010701030000000000000000000000000010")).CM()
	require.ErrorIs(t, err, mad.ErrNotCM)
	// A CM attribute without a view.
	attr, _, err := mad.Datagram(madOf(t, "010702030000000000000000000000000017")).CM()
	require.ErrorIs(t, err, mad.ErrNotCMMessage)
	require.Equal(t, mad.AttrSIDRREQ, attr)
	require.Equal(t, "SIDR_REQ", attr.String())
}

func TestGoldenREQ(t *testing.T) {
	d, err := mad.Parse(madOf(t, rpingREQ))
	require.NoError(t, err)
	r := mad.REQ(d.Data())
	require.Equal(t, uint32(0x6629cc9b), r.LocalCommID())
	require.Equal(t, mad.ServiceID(0x0000000001061c06), r.ServiceID())
	require.True(t, r.ServiceID().IsIP())
	require.Equal(t, mad.PortSpaceTCP, r.ServiceID().PortSpace())
	require.Equal(t, uint16(7174), r.ServiceID().Port(), "rping's default port")
	require.Equal(t, "tcp:7174", r.ServiceID().String())
	require.Equal(t, uint64(0x505400fffe77000b), r.LocalCAGUID(), "EUI-64 of vm1's MAC 52:54:00:77:00:0b")
	require.Zero(t, r.LocalQKey())
	require.Equal(t, wire.QPN(0x11), r.LocalQPN())
	require.Equal(t, uint8(1), r.ResponderResources())
	require.Zero(t, r.LocalEECN())
	require.Equal(t, uint8(1), r.InitiatorDepth())
	require.Zero(t, r.RemoteEECN())
	require.Equal(t, uint8(0x14), r.RemoteCMResponseTimeout())
	require.Equal(t, mad.TransportRC, r.TransportServiceType())
	require.False(t, r.EndToEndFlowControl())
	require.Equal(t, wire.PSN(0x41efb3), r.StartingPSN())
	require.Equal(t, uint8(0x14), r.LocalCMResponseTimeout())
	require.Equal(t, uint8(7), r.RetryCount())
	require.Equal(t, uint16(0xffff), r.PKey())
	require.Equal(t, mad.PathMTU(3), r.PathMTU())
	require.Equal(t, 1024, r.PathMTU().Bytes(), "INDEX.md: active_mtu 1024 (3)")
	require.False(t, r.RDCExists())
	require.Equal(t, uint8(7), r.RNRRetryCount())
	require.Equal(t, uint8(15), r.MaxCMRetries())
	require.False(t, r.SRQ())
	require.Zero(t, r.ExtendedTransportType())

	p := r.PrimaryPath()
	require.Equal(t, uint16(0xffff), p.LocalLID())
	require.Equal(t, uint16(0xffff), p.RemoteLID())
	require.Equal(t, netip.MustParseAddr("::ffff:192.168.77.11"), p.LocalGID())
	require.Equal(t, netip.MustParseAddr("::ffff:192.168.77.10"), p.RemoteGID())
	require.Equal(t, uint32(0x48e0f), p.FlowLabel())
	require.Zero(t, p.PacketRate())
	require.Zero(t, p.TrafficClass())
	require.Equal(t, uint8(0x40), p.HopLimit())
	require.Zero(t, p.SL())
	require.False(t, p.SubnetLocal())
	require.Equal(t, uint8(0x13), p.LocalACKTimeout())
	var alt mad.PathFields
	r.AlternatePath().Decode(&alt)
	require.Equal(t, mad.PathFields{LocalGID: netip.IPv6Unspecified(), RemoteGID: netip.IPv6Unspecified()}, alt)

	ip := mad.IPPrivateData(r.PrivateData())
	require.True(t, ip.Valid())
	require.Zero(t, ip.MajorVersion())
	require.Zero(t, ip.MinorVersion())
	require.Equal(t, uint8(4), ip.IPVersion())
	require.Equal(t, uint16(0xa8d7), ip.SrcPort())
	require.Equal(t, netip.MustParseAddr("192.168.77.11"), ip.SrcIP())
	require.Equal(t, netip.MustParseAddr("192.168.77.10"), ip.DstIP())
	require.Len(t, ip.ConsumerData(), mad.IPConsumerDataSize)

	// Decode then Encode gives the bytes back.
	var f mad.REQFields
	r.Decode(&f)
	require.Equal(t, wire.PSN(0x41efb3), f.StartingPSN)
	require.Equal(t, uint8(0x13), f.Primary.LocalACKTimeout)
	out := make([]byte, mad.DataSize)
	mad.REQ(out).Encode(&f)
	require.Equal(t, []byte(r), out)

	var ipf mad.IPPrivateDataFields
	ip.Decode(&ipf)
	ipf.IPVersion = 0 // derived from the addresses
	pd := make([]byte, mad.REQPrivateDataSize)
	mad.IPPrivateData(pd).Encode(&ipf)
	require.Equal(t, r.PrivateData(), pd)
}

func TestGoldenREPRTUDREQDREP(t *testing.T) {
	rep := mad.REP(madOf(t, rpingREP)[mad.HeaderSize:])
	require.Equal(t, uint32(0xea885c77), rep.LocalCommID())
	require.Equal(t, uint32(0x6629cc9b), rep.RemoteCommID())
	require.Zero(t, rep.LocalQKey())
	require.Equal(t, wire.QPN(0x11), rep.LocalQPN())
	require.Zero(t, rep.LocalEECN())
	require.Equal(t, wire.PSN(0x142214), rep.StartingPSN())
	require.Equal(t, uint8(1), rep.ResponderResources())
	require.Equal(t, uint8(1), rep.InitiatorDepth())
	require.Equal(t, uint8(0x0f), rep.TargetACKDelay())
	require.Zero(t, rep.FailoverAccepted())
	require.False(t, rep.EndToEndFlowControl())
	require.Equal(t, uint8(7), rep.RNRRetryCount())
	require.False(t, rep.SRQ())
	require.Equal(t, uint64(0x505400fffe77000a), rep.LocalCAGUID())
	var f mad.REPFields
	rep.Decode(&f)
	out := make([]byte, mad.DataSize)
	mad.REP(out).Encode(&f)
	require.Equal(t, []byte(rep), out)

	rtu := mad.RTU(madOf(t, rpingRTU)[mad.HeaderSize:])
	require.Equal(t, uint32(0x6629cc9b), rtu.LocalCommID())
	require.Equal(t, uint32(0xea885c77), rtu.RemoteCommID())
	require.Len(t, rtu.PrivateData(), mad.RTUPrivateDataSize)

	dreq := mad.DREQ(madOf(t, rpingDREQ)[mad.HeaderSize:])
	require.Equal(t, uint32(0x6629cc9b), dreq.LocalCommID())
	require.Equal(t, uint32(0xea885c77), dreq.RemoteCommID())
	require.Equal(t, wire.QPN(0x11), dreq.RemoteQPN())
	var df mad.DREQFields
	dreq.Decode(&df)
	out = make([]byte, mad.DataSize)
	mad.DREQ(out).Encode(&df)
	require.Equal(t, []byte(dreq), out)

	drep := mad.DREP(madOf(t, rpingDREP)[mad.HeaderSize:])
	require.Equal(t, uint32(0xea885c77), drep.LocalCommID())
	require.Equal(t, uint32(0x6629cc9b), drep.RemoteCommID())

	for _, tc := range []struct {
		hex           string
		attr          mad.AttributeID
		local, remote uint32
	}{
		{rpingREQ, mad.AttrREQ, 0x6629cc9b, 0},
		{rpingREP, mad.AttrREP, 0xea885c77, 0x6629cc9b},
		{rpingRTU, mad.AttrRTU, 0x6629cc9b, 0xea885c77},
		{rpingDREQ, mad.AttrDREQ, 0x6629cc9b, 0xea885c77},
		{rpingDREP, mad.AttrDREP, 0xea885c77, 0x6629cc9b},
	} {
		attr, data, err := mad.Datagram(madOf(t, tc.hex)).CM()
		require.NoError(t, err)
		require.Equal(t, tc.attr, attr)
		l, r := mad.CommIDs(attr, data)
		require.Equal(t, tc.local, l, attr)
		require.Equal(t, tc.remote, r, attr)
	}
}

// REJ and MRA are not in the captures: their bit positions are checked
// against hand-assembled bytes (IBTA Tables 107 and 108).
func TestREJAndMRABits(t *testing.T) {
	data := make([]byte, mad.DataSize)
	copy(data, unhex(t, `
		11223344 55667788
		40       // Message REJected = 1 (REP), 6 reserved bits
		0a       // Reject Info Length = 5, 1 reserved bit
		001c     // Reason = 28 (consumer defined)
		0102030405060708`))
	data[84], data[231] = 0xaa, 0xbb
	rej := mad.REJ(data)
	require.Equal(t, uint32(0x11223344), rej.LocalCommID())
	require.Equal(t, uint32(0x55667788), rej.RemoteCommID())
	require.Equal(t, mad.MsgREP, rej.MessageRejected())
	require.Equal(t, uint8(5), rej.RejectInfoLength())
	require.Equal(t, mad.RejConsumerDefined, rej.Reason())
	require.Equal(t, "consumer defined", rej.Reason().String())
	require.Equal(t, []byte{1, 2, 3, 4, 5}, rej.ARI())
	require.Len(t, rej.PrivateData(), mad.REJPrivateDataSize)
	require.Equal(t, byte(0xaa), rej.PrivateData()[0])
	require.Equal(t, byte(0xbb), rej.PrivateData()[mad.REJPrivateDataSize-1])
	var f mad.REJFields
	rej.Decode(&f)
	out := make([]byte, mad.DataSize)
	mad.REJ(out).Encode(&f)
	want := append([]byte(nil), data...)
	copy(want[12+5:84], make([]byte, 72)) // ARI past the info length is not kept
	require.Equal(t, want, out)
	// An info length beyond the 72 bytes of ARI is clamped.
	data[9] = 0xfe
	require.Len(t, rej.ARI(), mad.ARISize)

	data = make([]byte, mad.DataSize)
	copy(data, unhex(t, `
		11223344 55667788
		80       // Message MRAed = 2 (LAP)
		a8       // Service Timeout = 21
		ff`))
	mra := mad.MRA(data)
	require.Equal(t, mad.MsgOther, mra.MessageMRAed())
	require.Equal(t, uint8(21), mra.ServiceTimeout())
	require.Equal(t, 8589934592*time.Nanosecond, mad.Timeout(mra.ServiceTimeout()))
	require.Equal(t, byte(0xff), mra.PrivateData()[0])
	require.Len(t, mra.PrivateData(), mad.MRAPrivateDataSize)
	var mf mad.MRAFields
	mra.Decode(&mf)
	out = make([]byte, mad.DataSize)
	mad.MRA(out).Encode(&mf)
	require.Equal(t, data, out)
}

func TestEnums(t *testing.T) {
	for code, n := range map[mad.PathMTU]int{0: 0, 1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096, 6: 0, 15: 0} {
		require.Equal(t, n, code.Bytes(), code)
		if n != 0 {
			require.Equal(t, code, mad.PathMTUFor(n))
		}
	}
	require.Zero(t, mad.PathMTUFor(1500))
	require.Equal(t, 4096*time.Nanosecond, mad.Timeout(0))
	require.Equal(t, 4096*time.Nanosecond<<20, mad.Timeout(20)) // ~4.3 s, Linux's CM response timeout
	require.Equal(t, "RC", mad.TransportRC.String())
	require.Equal(t, "UC", mad.TransportUC.String())
	require.Equal(t, "extended", mad.TransportExtended.String())
	require.Equal(t, "REQ", mad.MsgREQ.String())
	require.Equal(t, "other", mad.MsgOther.String())
	require.Equal(t, "reserved", mad.MessageKind(3).String())
	require.Equal(t, "reason 99", mad.RejectReason(99).String())
	require.Equal(t, "udp:4791", mad.IPServiceID(mad.PortSpaceUDP, 4791).String())
	require.Equal(t, mad.ServiceID(0x0000000001064853), mad.IPServiceID(mad.PortSpaceTCP, 18515), "perftest -R's port")
	require.Equal(t, "0x1234000000000000", mad.ServiceID(0x1234000000000000).String())
	require.False(t, mad.ServiceID(0x1234000000000000).IsIP())
}

// randREQ returns REQFields with random values in each field's width.
func randREQ(r *rand.Rand) mad.REQFields {
	path := func() mad.PathFields {
		var l, rem [16]byte
		for i := range l {
			l[i], rem[i] = byte(r.Uint32()), byte(r.Uint32())
		}
		return mad.PathFields{LocalLID: uint16(r.Uint32()), RemoteLID: uint16(r.Uint32()),
			LocalGID: netip.AddrFrom16(l), RemoteGID: netip.AddrFrom16(rem), FlowLabel: r.Uint32() & 0xfffff,
			PacketRate: uint8(r.Uint32() & 0x3f), TrafficClass: uint8(r.Uint32()), HopLimit: uint8(r.Uint32()),
			SL: uint8(r.Uint32() & 15), SubnetLocal: r.IntN(2) == 1, LocalACKTimeout: uint8(r.Uint32() & 31)}
	}
	pd := make([]byte, mad.REQPrivateDataSize)
	for i := range pd {
		pd[i] = byte(r.Uint32())
	}
	return mad.REQFields{
		LocalCommID: r.Uint32(), ServiceID: mad.ServiceID(r.Uint64()), LocalCAGUID: r.Uint64(), LocalQKey: r.Uint32(),
		LocalQPN: wire.QPN(r.Uint32() & wire.QPNMask), ResponderResources: uint8(r.Uint32()),
		LocalEECN: r.Uint32() & 0xffffff, InitiatorDepth: uint8(r.Uint32()), RemoteEECN: r.Uint32() & 0xffffff,
		RemoteCMResponseTimeout: uint8(r.Uint32() & 31), TransportServiceType: mad.TransportType(r.IntN(4)),
		EndToEndFlowControl: r.IntN(2) == 1, StartingPSN: wire.PSN(r.Uint32() & wire.PSNMask),
		LocalCMResponseTimeout: uint8(r.Uint32() & 31), RetryCount: uint8(r.IntN(8)), PKey: uint16(r.Uint32()),
		PathMTU: mad.PathMTU(r.IntN(16)), RDCExists: r.IntN(2) == 1, RNRRetryCount: uint8(r.IntN(8)),
		MaxCMRetries: uint8(r.IntN(16)), SRQ: r.IntN(2) == 1, ExtendedTransportType: uint8(r.IntN(8)),
		Primary: path(), Alternate: path(), PrivateData: pd,
	}
}

// Every field of every message survives Encode then Decode, for random
// values in the field's width, over a buffer full of garbage (Encode writes
// every bit).
func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 4791))
	garbage := func() []byte {
		b := make([]byte, mad.DataSize)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	priv := func(n int) []byte { return garbage()[:n] }
	for range 200 {
		req := randREQ(r)
		b := garbage()
		mad.REQ(b).Encode(&req)
		var got mad.REQFields
		mad.REQ(b).Decode(&got)
		require.Equal(t, req, got)

		rep := mad.REPFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), LocalQKey: r.Uint32(),
			LocalQPN: wire.QPN(r.Uint32() & wire.QPNMask), LocalEECN: r.Uint32() & 0xffffff,
			StartingPSN: wire.PSN(r.Uint32() & wire.PSNMask), ResponderResources: uint8(r.Uint32()),
			InitiatorDepth: uint8(r.Uint32()), TargetACKDelay: uint8(r.IntN(32)), FailoverAccepted: uint8(r.IntN(4)),
			EndToEndFlowControl: r.IntN(2) == 1, RNRRetryCount: uint8(r.IntN(8)), SRQ: r.IntN(2) == 1,
			LocalCAGUID: r.Uint64(), PrivateData: priv(mad.REPPrivateDataSize)}
		b = garbage()
		mad.REP(b).Encode(&rep)
		var gotREP mad.REPFields
		mad.REP(b).Decode(&gotREP)
		require.Equal(t, rep, gotREP)

		rej := mad.REJFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), MessageRejected: mad.MessageKind(r.IntN(3)),
			Reason: mad.RejectReason(r.Uint32()), ARI: priv(r.IntN(mad.ARISize + 1)), PrivateData: priv(mad.REJPrivateDataSize)}
		b = garbage()
		mad.REJ(b).Encode(&rej)
		var gotREJ mad.REJFields
		mad.REJ(b).Decode(&gotREJ)
		require.Equal(t, rej, gotREJ)

		mra := mad.MRAFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), MessageMRAed: mad.MessageKind(r.IntN(3)),
			ServiceTimeout: uint8(r.IntN(32)), PrivateData: priv(mad.MRAPrivateDataSize)}
		b = garbage()
		mad.MRA(b).Encode(&mra)
		var gotMRA mad.MRAFields
		mad.MRA(b).Decode(&gotMRA)
		require.Equal(t, mra, gotMRA)

		rtu := mad.RTUFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(), PrivateData: priv(mad.RTUPrivateDataSize)}
		b = garbage()
		mad.RTU(b).Encode(&rtu)
		var gotRTU mad.RTUFields
		mad.RTU(b).Decode(&gotRTU)
		require.Equal(t, rtu, gotRTU)
		b = garbage()
		mad.DREP(b).Encode(&rtu)
		mad.DREP(b).Decode(&gotRTU)
		require.Equal(t, rtu, gotRTU)

		dreq := mad.DREQFields{LocalCommID: r.Uint32(), RemoteCommID: r.Uint32(),
			RemoteQPN: wire.QPN(r.Uint32() & wire.QPNMask), PrivateData: priv(mad.DREQPrivateDataSize)}
		b = garbage()
		mad.DREQ(b).Encode(&dreq)
		var gotDREQ mad.DREQFields
		mad.DREQ(b).Decode(&gotDREQ)
		require.Equal(t, dreq, gotDREQ)

		hdr := mad.HeaderFields{BaseVersion: 1, Class: mad.Class(r.Uint32()), ClassVersion: uint8(r.Uint32()),
			Method: mad.Method(r.Uint32()), Status: uint16(r.Uint32()), ClassSpecific: uint16(r.Uint32()),
			TransactionID: r.Uint64(), AttributeID: mad.AttributeID(r.Uint32()), AttributeModifier: r.Uint32()}
		b = append(garbage(), garbage()[:mad.HeaderSize]...)
		mad.Datagram(b).Encode(&hdr)
		var gotHdr mad.HeaderFields
		mad.Datagram(b).Decode(&gotHdr)
		require.Equal(t, hdr, gotHdr)
		require.Zero(t, b[18]|b[19], "reserved")

		var a4, b4 [4]byte
		var a16, b16 [16]byte
		for i := range a16 {
			a16[i], b16[i] = byte(r.Uint32()), byte(r.Uint32())
		}
		copy(a4[:], a16[:])
		copy(b4[:], b16[:])
		ipf := mad.IPPrivateDataFields{IPVersion: 4, SrcPort: uint16(r.Uint32()), SrcIP: netip.AddrFrom4(a4),
			DstIP: netip.AddrFrom4(b4), ConsumerData: priv(mad.IPConsumerDataSize)}
		if r.IntN(2) == 1 {
			ipf.IPVersion, ipf.SrcIP, ipf.DstIP = 6, netip.AddrFrom16(a16), netip.AddrFrom16(b16)
		}
		b = garbage()[:mad.REQPrivateDataSize]
		mad.IPPrivateData(b).Encode(&ipf)
		var gotIP mad.IPPrivateDataFields
		mad.IPPrivateData(b).Decode(&gotIP)
		require.Equal(t, ipf, gotIP)
		require.True(t, mad.IPPrivateData(b).Valid())
	}
}

// Encode never panics on out-of-range field values: it truncates them.
func TestEncodeTruncates(t *testing.T) {
	b := make([]byte, mad.DataSize)
	f := mad.REQFields{LocalQPN: 0xffffffff, ResponderResources: 0x5a, StartingPSN: 0xffffffff, RetryCount: 0xff, RNRRetryCount: 0xff,
		ExtendedTransportType: 0xff, TransportServiceType: 0xff, PrivateData: make([]byte, 1000),
		Primary: mad.PathFields{FlowLabel: 0xffffffff, PacketRate: 0xff}}
	mad.REQ(b).Encode(&f)
	r := mad.REQ(b)
	require.Equal(t, wire.QPN(0xffffff), r.LocalQPN())
	require.Equal(t, uint8(0x5a), r.ResponderResources(), "the 24-bit QPN does not spill into the next field")
	require.Equal(t, wire.PSN(0xffffff), r.StartingPSN())
	require.Equal(t, uint8(7), r.RetryCount())
	require.Zero(t, r.LocalCMResponseTimeout())
	require.Equal(t, uint32(0xfffff), r.PrimaryPath().FlowLabel())
	require.Equal(t, uint8(0x3f), r.PrimaryPath().PacketRate())

	// An IPv6 address in an IPv4 header is written as zeros, not a panic.
	ip := make([]byte, mad.REQPrivateDataSize)
	mad.IPPrivateData(ip).Encode(&mad.IPPrivateDataFields{IPVersion: 4, SrcIP: netip.MustParseAddr("fd00::1")})
	require.Equal(t, netip.IPv4Unspecified(), mad.IPPrivateData(ip).SrcIP())
	require.Equal(t, netip.IPv4Unspecified(), mad.IPPrivateData(ip).DstIP(), "zero Addr")
	mad.IPPrivateData(ip).Encode(&mad.IPPrivateDataFields{SrcIP: netip.MustParseAddr("fd00::1"), DstIP: netip.MustParseAddr("fd00::2")})
	require.Equal(t, uint8(6), mad.IPPrivateData(ip).IPVersion())
	require.Equal(t, netip.MustParseAddr("fd00::2"), mad.IPPrivateData(ip).DstIP())
	require.False(t, mad.IPPrivateData(ip[:35]).Valid())
}

func TestDecodeAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful with -race")
	}
	b := madOf(t, rpingREQ)
	var f mad.REQFields
	var ipf mad.IPPrivateDataFields
	require.Zero(t, testing.AllocsPerRun(100, func() {
		d, err := mad.Parse(b)
		if err != nil {
			panic(err)
		}
		attr, data, err := d.CM()
		if err != nil || attr != mad.AttrREQ {
			panic(err)
		}
		mad.REQ(data).Decode(&f)
		mad.IPPrivateData(f.PrivateData).Decode(&ipf)
	}))
	out := make([]byte, mad.DataSize)
	require.Zero(t, testing.AllocsPerRun(100, func() { mad.REQ(out).Encode(&f) }))
}
