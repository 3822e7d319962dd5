package layers_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"math/bits"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	golayers "github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/layers"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// tsharkFields are the Wireshark fields compared with our layers, for
// every RoCEv2 frame of every golden capture. Left out on purpose:
// infiniband.cm.req.{prim,alt}_{flowlabel,reserved0,pktrate}, which
// Wireshark 4.0 decodes from a 24-bit read of the 32-bit word (it shows
// flow label 0x0048e and rate 8 for the bytes 48 e0 f0 00 of rping's REQ;
// the IBTA layout gives 0x48e0f and 0, see package mad's TestGoldenREQ),
// and the private data blobs.
var tsharkFields = []string{
	"frame.number", "_ws.malformed",
	"infiniband.bth.opcode", "infiniband.bth.se", "infiniband.bth.m", "infiniband.bth.padcnt",
	"infiniband.bth.tver", "infiniband.bth.p_key", "infiniband.bth.destqp", "infiniband.bth.a",
	"infiniband.bth.psn", "infiniband.invariant.crc",
	"infiniband.deth.q_key", "infiniband.deth.srcqp",
	"infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen",
	"infiniband.atomiceth.swapdt", "infiniband.atomiceth.cmpdt",
	"infiniband.aeth.syndrome", "infiniband.aeth.msn", "infiniband.atomicacketh.origremdt",
	"infiniband.immdt", "infiniband.ieth",
	"infiniband.mad.baseversion", "infiniband.mad.mgmtclass", "infiniband.mad.classversion",
	"infiniband.mad.method", "infiniband.mad.status", "infiniband.mad.classspecific",
	"infiniband.mad.transactionid", "infiniband.mad.attributeid", "infiniband.mad.attributemodifier",
	"infiniband.cm.req", "infiniband.cm.req.serviceid", "infiniband.cm.req.localcaguid",
	"infiniband.cm.req.localqkey", "infiniband.cm.req.localqpn", "infiniband.cm.req.responderres",
	"infiniband.cm.req.localeecn", "infiniband.cm.req.initdepth", "infiniband.cm.req.remoteeecn",
	"infiniband.cm.req.remoteresptout", "infiniband.cm.req.transpsvctype", "infiniband.cm.req.e2eflowctrl",
	"infiniband.cm.req.startpsn", "infiniband.cm.req.localresptout", "infiniband.cm.req.retrcount",
	"infiniband.cm.req.pkey", "infiniband.cm.req.pppmtu", "infiniband.cm.req.rdcexist",
	"infiniband.cm.req.rnrretrcount", "infiniband.cm.req.maxcmretr", "infiniband.cm.req.srq",
	"infiniband.cm.req.ext_transport", "infiniband.cm.req.prim_locallid", "infiniband.cm.req.prim_remotelid",
	"infiniband.cm.req.prim_localgid_ipv4", "infiniband.cm.req.prim_remotegid_ipv4",
	"infiniband.cm.req.prim_localgid", "infiniband.cm.req.prim_remotegid",
	"infiniband.cm.req.prim_tfcclass", "infiniband.cm.req.prim_hoplim", "infiniband.cm.req.prim_sl",
	"infiniband.cm.req.prim_subnetlocal", "infiniband.cm.req.prim_localacktout",
	"infiniband.cm.req.alt_locallid", "infiniband.cm.req.alt_remotelid", "infiniband.cm.req.alt_localgid",
	"infiniband.cm.req.alt_remotegid", "infiniband.cm.req.alt_tfcclass", "infiniband.cm.req.alt_hoplim",
	"infiniband.cm.req.alt_sl", "infiniband.cm.req.alt_subnetlocal", "infiniband.cm.req.alt_localacktout",
	"infiniband.cm.req.ip_cm.majv", "infiniband.cm.req.ip_cm.minv", "infiniband.cm.req.ip_cm.ipv",
	"infiniband.cm.req.ip_cm.sport", "infiniband.cm.req.ip_cm.sip4", "infiniband.cm.req.ip_cm.dip4",
	"infiniband.cm.req.ip_cm.sip6", "infiniband.cm.req.ip_cm.dip6",
	"infiniband.cm.rep", "infiniband.cm.rep.remotecommid", "infiniband.cm.rep.localqkey",
	"infiniband.cm.rep.localqpn", "infiniband.cm.rep.localeecn", "infiniband.cm.rep.startpsn",
	"infiniband.cm.rep.respres", "infiniband.cm.rep.initdepth", "infiniband.cm.rep.tgtackdelay",
	"infiniband.cm.rep.failoveracc", "infiniband.cm.rep.e2eflowctrl", "infiniband.cm.rep.rnrretrcount",
	"infiniband.cm.rep.srq", "infiniband.cm.rep.localcaguid",
	"infiniband.cm.rtu.localcommid", "infiniband.cm.rtu.remotecommid",
	"infiniband.cm.rej.localcommid", "infiniband.cm.rej.remotecommid", "infiniband.cm.rej.msgrej",
	"infiniband.cm.rej.rejinfolen", "infiniband.cm.rej.reason",
	"infiniband.cm.dreq.localcommid", "infiniband.cm.dreq.remotecommid", "infiniband.cm.req.remoteqpneecn",
	"infiniband.cm.drsp.localcommid", "infiniband.cm.drsp.remotecommid",
}

// ours returns, for each tshark field, the value our layers decoded from
// p (uint64, bool, netip.Addr or a lowercase hex string), and nothing for
// a header the packet does not have.
func ours(p gopacket.Packet) map[string]any {
	m := map[string]any{}
	u := func(name string, v uint64) { m[name] = v }
	b := func(name string, v bool) { m[name] = v }
	bth := p.Layer(layers.LayerTypeBTH).(*layers.BTH)
	u("infiniband.bth.opcode", uint64(bth.Opcode))
	b("infiniband.bth.se", bth.SolicitedEvent)
	b("infiniband.bth.m", bth.MigReq)
	u("infiniband.bth.padcnt", uint64(bth.PadCount))
	u("infiniband.bth.tver", uint64(bth.TVer))
	u("infiniband.bth.p_key", uint64(bth.PKey))
	u("infiniband.bth.destqp", uint64(bth.DestQP))
	b("infiniband.bth.a", bth.AckReq)
	u("infiniband.bth.psn", uint64(bth.PSN))
	// Wireshark shows the little-endian ICRC's bytes read big-endian.
	u("infiniband.invariant.crc", uint64(bits.ReverseBytes32(bth.ICRC)))
	if l, ok := p.Layer(layers.LayerTypeDETH).(*layers.DETH); ok {
		u("infiniband.deth.q_key", uint64(l.QKey))
		u("infiniband.deth.srcqp", uint64(l.SrcQP))
	}
	if l, ok := p.Layer(layers.LayerTypeRETH).(*layers.RETH); ok {
		u("infiniband.reth.va", l.VA)
		u("infiniband.reth.r_key", uint64(l.RKey))
		u("infiniband.reth.dmalen", uint64(l.DMALength))
	}
	if l, ok := p.Layer(layers.LayerTypeAtomicETH).(*layers.AtomicETH); ok {
		// Wireshark shows the AtomicETH's VA and R_Key as RETH fields.
		u("infiniband.reth.va", l.VA)
		u("infiniband.reth.r_key", uint64(l.RKey))
		u("infiniband.atomiceth.swapdt", l.SwapAdd)
		u("infiniband.atomiceth.cmpdt", l.Compare)
	}
	if l, ok := p.Layer(layers.LayerTypeAETH).(*layers.AETH); ok {
		u("infiniband.aeth.syndrome", uint64(l.Syndrome))
		u("infiniband.aeth.msn", uint64(l.MSN))
	}
	if l, ok := p.Layer(layers.LayerTypeAtomicAckETH).(*layers.AtomicAckETH); ok {
		u("infiniband.atomicacketh.origremdt", l.OrigRemoteData)
	}
	if l, ok := p.Layer(layers.LayerTypeImmDt).(*layers.ImmDt); ok {
		m["infiniband.immdt"] = fmt.Sprintf("%08x", l.Imm)
	}
	if l, ok := p.Layer(layers.LayerTypeIETH).(*layers.IETH); ok {
		m["infiniband.ieth"] = fmt.Sprintf("%08x", l.RKey)
	}
	if l, ok := p.Layer(layers.LayerTypeMAD).(*layers.MAD); ok {
		u("infiniband.mad.baseversion", uint64(l.BaseVersion))
		u("infiniband.mad.mgmtclass", uint64(l.Class))
		u("infiniband.mad.classversion", uint64(l.ClassVersion))
		u("infiniband.mad.method", uint64(l.Method))
		u("infiniband.mad.status", uint64(l.Status))
		u("infiniband.mad.classspecific", uint64(l.ClassSpecific))
		u("infiniband.mad.transactionid", l.TransactionID)
		u("infiniband.mad.attributeid", uint64(l.AttributeID))
		u("infiniband.mad.attributemodifier", uint64(l.AttributeModifier))
	}
	cm, _ := p.Layer(layers.LayerTypeCM).(*layers.CM)
	if cm == nil {
		return m
	}
	switch cm.Attribute {
	case mad.AttrREQ:
		r := &cm.REQ
		const q = "infiniband.cm.req"
		u(q, uint64(r.LocalCommID))
		u(q+".serviceid", uint64(r.ServiceID))
		u(q+".localcaguid", r.LocalCAGUID)
		u(q+".localqkey", uint64(r.LocalQKey))
		u(q+".localqpn", uint64(r.LocalQPN))
		u(q+".responderres", uint64(r.ResponderResources))
		u(q+".localeecn", uint64(r.LocalEECN))
		u(q+".initdepth", uint64(r.InitiatorDepth))
		u(q+".remoteeecn", uint64(r.RemoteEECN))
		u(q+".remoteresptout", uint64(r.RemoteCMResponseTimeout))
		u(q+".transpsvctype", uint64(r.TransportServiceType))
		b(q+".e2eflowctrl", r.EndToEndFlowControl)
		u(q+".startpsn", uint64(r.StartingPSN))
		u(q+".localresptout", uint64(r.LocalCMResponseTimeout))
		u(q+".retrcount", uint64(r.RetryCount))
		u(q+".pkey", uint64(r.PKey))
		u(q+".pppmtu", uint64(r.PathMTU))
		b(q+".rdcexist", r.RDCExists)
		u(q+".rnrretrcount", uint64(r.RNRRetryCount))
		u(q+".maxcmretr", uint64(r.MaxCMRetries))
		b(q+".srq", r.SRQ)
		u(q+".ext_transport", uint64(r.ExtendedTransportType))
		for _, pa := range []struct {
			pre string
			f   *mad.PathFields
		}{{q + ".prim_", &r.Primary}, {q + ".alt_", &r.Alternate}} {
			u(pa.pre+"locallid", uint64(pa.f.LocalLID))
			u(pa.pre+"remotelid", uint64(pa.f.RemoteLID))
			// Wireshark shows an IPv4-mapped primary GID as an IPv4 field.
			for _, g := range []struct {
				name string
				gid  netip.Addr
			}{{"localgid", pa.f.LocalGID}, {"remotegid", pa.f.RemoteGID}} {
				if pa.pre == q+".prim_" && g.gid.Is4In6() {
					g.name += "_ipv4"
				}
				m[pa.pre+g.name] = g.gid
			}
			u(pa.pre+"tfcclass", uint64(pa.f.TrafficClass))
			u(pa.pre+"hoplim", uint64(pa.f.HopLimit))
			u(pa.pre+"sl", uint64(pa.f.SL))
			b(pa.pre+"subnetlocal", pa.f.SubnetLocal)
			u(pa.pre+"localacktout", uint64(pa.f.LocalACKTimeout))
		}
		if ip, ok := p.Layer(layers.LayerTypeIPCM).(*layers.IPCM); ok {
			u(q+".ip_cm.majv", uint64(ip.MajorVersion))
			u(q+".ip_cm.minv", uint64(ip.MinorVersion))
			u(q+".ip_cm.ipv", uint64(ip.IPVersion))
			u(q+".ip_cm.sport", uint64(ip.SrcPort))
			v := "6"
			if ip.IPVersion == 4 {
				v = "4"
			}
			m[q+".ip_cm.sip"+v] = ip.SrcIP
			m[q+".ip_cm.dip"+v] = ip.DstIP
		}
	case mad.AttrREP:
		r := &cm.REP
		const q = "infiniband.cm.rep"
		u(q, uint64(r.LocalCommID))
		u(q+".remotecommid", uint64(r.RemoteCommID))
		u(q+".localqkey", uint64(r.LocalQKey))
		u(q+".localqpn", uint64(r.LocalQPN))
		u(q+".localeecn", uint64(r.LocalEECN))
		u(q+".startpsn", uint64(r.StartingPSN))
		u(q+".respres", uint64(r.ResponderResources))
		u(q+".initdepth", uint64(r.InitiatorDepth))
		u(q+".tgtackdelay", uint64(r.TargetACKDelay))
		u(q+".failoveracc", uint64(r.FailoverAccepted))
		b(q+".e2eflowctrl", r.EndToEndFlowControl)
		u(q+".rnrretrcount", uint64(r.RNRRetryCount))
		b(q+".srq", r.SRQ)
		u(q+".localcaguid", r.LocalCAGUID)
	case mad.AttrRTU:
		u("infiniband.cm.rtu.localcommid", uint64(cm.RTU.LocalCommID))
		u("infiniband.cm.rtu.remotecommid", uint64(cm.RTU.RemoteCommID))
	case mad.AttrREJ:
		u("infiniband.cm.rej.localcommid", uint64(cm.REJ.LocalCommID))
		u("infiniband.cm.rej.remotecommid", uint64(cm.REJ.RemoteCommID))
		u("infiniband.cm.rej.msgrej", uint64(cm.REJ.MessageRejected))
		u("infiniband.cm.rej.rejinfolen", uint64(len(cm.REJ.ARI)))
		u("infiniband.cm.rej.reason", uint64(cm.REJ.Reason))
	case mad.AttrDREQ:
		u("infiniband.cm.dreq.localcommid", uint64(cm.DREQ.LocalCommID))
		u("infiniband.cm.dreq.remotecommid", uint64(cm.DREQ.RemoteCommID))
		u("infiniband.cm.req.remoteqpneecn", uint64(cm.DREQ.RemoteQPN))
	case mad.AttrDREP:
		u("infiniband.cm.drsp.localcommid", uint64(cm.DREP.LocalCommID))
		u("infiniband.cm.drsp.remotecommid", uint64(cm.DREP.RemoteCommID))
	}
	return m
}

// parseLike parses tshark's text s as the type of want.
func parseLike(s string, want any) (any, error) {
	switch want.(type) {
	case uint64:
		return strconv.ParseUint(s, 0, 64)
	case bool:
		switch s {
		case "1", "True":
			return true, nil
		case "0", "False":
			return false, nil
		}
		// One-bit CM fields are FT_UINT8 in Wireshark: "0x00".
		v, err := strconv.ParseUint(s, 0, 1)
		return v == 1, err
	case netip.Addr:
		if b, err := hex.DecodeString(s); err == nil && len(b) == 16 { // FT_BYTES GIDs
			return netip.AddrFrom16([16]byte(b)), nil
		}
		return netip.ParseAddr(s)
	case string:
		return strings.ToLower(strings.ReplaceAll(s, ":", "")), nil
	}
	return nil, fmt.Errorf("no parser for %T", want)
}

// Every RoCEv2 frame of every golden capture, decoded by our layers and by
// tshark: every header field tshark shows has the value we decode, and
// every header we decode is one tshark shows. The frames of all captures
// go to tshark in one pcap, so that it starts once.
func TestGoldenCapturesMatchTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (apt-get install tshark)")
	}
	layers.Register()
	frames := captureFrames(t)

	merged := filepath.Join(t.TempDir(), "golden.pcap")
	f, err := os.Create(merged)
	require.NoError(t, err)
	w := pcapgo.NewWriter(f)
	require.NoError(t, w.WriteFileHeader(65536, golayers.LinkTypeEthernet))
	for i, fr := range frames {
		require.NoError(t, w.WritePacket(gopacket.CaptureInfo{
			Timestamp: time.Unix(int64(i), 0), CaptureLength: len(fr.data), Length: len(fr.data),
		}, fr.data))
	}
	require.NoError(t, f.Close())

	args := []string{"-r", merged, "-Y", fmt.Sprintf("udp.dstport == %d", wire.RoCEv2Port), "-T", "fields", "-E", "occurrence=f", "-E", "separator=/t"}
	// Wireshark guesses at SEND payloads (RPC-over-RDMA, SMB Direct, ...)
	// and, when a guess throws, stops before the ICRC. Payloads are not
	// compared here: turn the guessing off.
	for _, proto := range []string{"rpcordma", "smb_direct", "nvme-rdma", "iser", "lnet", "smc", "infiniband_sdp", "fcoib"} {
		args = append(args, "--disable-protocol", proto)
	}
	for _, name := range tsharkFields {
		args = append(args, "-e", name)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(tshark, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())

	rows, cmFields := 0, 0
	cms := map[mad.AttributeID]int{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		cols := strings.Split(sc.Text(), "\t")
		require.Len(t, cols, len(tsharkFields))
		n, err := strconv.Atoi(cols[0])
		require.NoError(t, err)
		fr := frames[n-1]
		require.Emptyf(t, cols[1], "%s frame %d: tshark says malformed", fr.capture, fr.n)
		p := gopacket.NewPacket(fr.data, golayers.LayerTypeEthernet, gopacket.Default)
		require.Nil(t, p.ErrorLayer(), "%s frame %d", fr.capture, fr.n)
		our := ours(p)
		for i, name := range tsharkFields[2:] {
			theirs := cols[i+2]
			want, ok := our[name]
			switch {
			case theirs == "" && !ok:
				continue
			case theirs == "" || !ok:
				t.Fatalf("%s frame %d: %s: tshark %q, ours %v", fr.capture, fr.n, name, theirs, want)
			}
			got, err := parseLike(theirs, want)
			require.NoError(t, err, "%s frame %d: %s", fr.capture, fr.n, name)
			if a, ok := want.(netip.Addr); ok {
				want = a.Unmap()
				got = got.(netip.Addr).Unmap()
			}
			require.Equalf(t, want, got, "%s frame %d: %s (tshark %q)", fr.capture, fr.n, name, theirs)
			if strings.HasPrefix(name, "infiniband.cm.") {
				cmFields++
			}
		}
		if cm, ok := p.Layer(layers.LayerTypeCM).(*layers.CM); ok {
			cms[cm.Attribute]++
		}
		rows++
	}
	require.NoError(t, sc.Err())
	t.Logf("%d RoCEv2 frames, %d CM field values compared with tshark", rows, cmFields)
	require.Greater(t, rows, 5000)
	require.Greater(t, cmFields, 400)
	// rping: REQ REP RTU DREQ DREP in each set; send_bw_rdmacm: two
	// connections, and 2 DREQ + 2 DREP (6.1) or 3 + 3 (6.12). tshark
	// agrees: "CM: ConnectRequest", ... in captures*/logs/*.txt.
	require.Equal(t, map[mad.AttributeID]int{mad.AttrREQ: 6, mad.AttrREP: 6, mad.AttrRTU: 6, mad.AttrDREQ: 7, mad.AttrDREP: 7}, cms)
}
