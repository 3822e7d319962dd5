package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/gopacket/gopacket"
	golayers "github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrdma/softrdma/transport/wire"
	"github.com/softrdma/softrdma/transport/wire/layers"
	"github.com/softrdma/softrdma/transport/wire/mad"
)

// dumpCmd holds the arguments of `softrdma dump`.
type dumpCmd struct {
	// File is checked by AfterApply, not by kong's existingfile: kong
	// would check it before it sees an extra argument, and "dump a b"
	// said that a does not exist rather than that b is one too many.
	File string `arg:"" placeholder:"FILE" help:"Capture to print: pcap or pcapng (tcpdump, Wireshark, --pcap); - reads standard input."`
	All  bool   `short:"a" help:"Also print the frames that are not RoCEv2, one short line each."`
}

// AfterApply runs the dump once the command line is parsed and reports
// its exit code through kong's Exit, which run turns into its return
// value as it does after --help. (The command is self-contained; it needs
// no device, context or logger.)
func (d *dumpCmd) AfterApply(kctx *kong.Context) error {
	for _, tr := range kctx.Path {
		if tr.Flag != nil && tr.Flag.Name == "help" {
			return nil
		}
	}
	if d.File != "-" {
		// A path that does not exist or is a directory is a bad command
		// line (exit 2), as kong's existingfile made it.
		if st, err := os.Stat(d.File); err != nil {
			return fmt.Errorf("dump: %w", err)
		} else if st.IsDir() {
			return fmt.Errorf("dump: %s is a directory, not a capture", d.File)
		}
	}
	code := exitOK
	if err := dump(kctx.Stdout, d.File, d.All); err != nil {
		fmt.Fprintf(kctx.Stderr, "softrdma: dump: %v\n", err)
		code = exitFail
	}
	kctx.Exit(code)
	return nil
}

// packetSource is what pcapgo's pcap and pcapng readers have in common.
type packetSource interface {
	ReadPacketData() ([]byte, gopacket.CaptureInfo, error)
}

// dumpStdin is what `dump -` reads; tests replace it.
var dumpStdin io.Reader = os.Stdin

// errNotCapture is returned for a file that begins with neither pcap's nor
// pcapng's magic number (or is shorter than one).
var errNotCapture = errors.New("not a pcap or pcapng capture")

// pcapMagics are the first four bytes of a pcap file as written on a
// little- or big-endian host, with microsecond or nanosecond timestamps.
var pcapMagics = [][]byte{
	{0xd4, 0xc3, 0xb2, 0xa1}, {0xa1, 0xb2, 0xc3, 0xd4}, // microseconds
	{0x4d, 0x3c, 0xb2, 0xa1}, {0xa1, 0xb2, 0x3c, 0x4d}, // nanoseconds
}

// openCapture returns a reader for the pcap or pcapng stream r and a
// function giving the link type of a packet.
func openCapture(r *bufio.Reader) (packetSource, func(gopacket.CaptureInfo) golayers.LinkType, error) {
	magic, err := r.Peek(4)
	if err != nil {
		// Shorter than a magic number: a text file of a few bytes, or
		// an empty one.
		return nil, nil, fmt.Errorf("%w (%d bytes)", errNotCapture, len(magic))
	}
	ng := bytes.Equal(magic, []byte{0x0a, 0x0d, 0x0d, 0x0a}) // pcapng section header block
	if !ng && !slices.ContainsFunc(pcapMagics, func(m []byte) bool { return bytes.Equal(m, magic) }) {
		return nil, nil, fmt.Errorf("%w (it begins with %q)", errNotCapture, magic)
	}
	if ng {
		ng, err := pcapgo.NewNgReader(r, pcapgo.DefaultNgReaderOptions)
		if err != nil {
			return nil, nil, err
		}
		return ng, func(ci gopacket.CaptureInfo) golayers.LinkType {
			if intf, err := ng.Interface(ci.InterfaceIndex); err == nil {
				return intf.LinkType
			}
			return ng.LinkType()
		}, nil
	}
	pr, err := pcapgo.NewReader(r)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return nil, nil, errors.New("pcap file header truncated (the file ends within its first 24 bytes)")
	}
	if err != nil {
		return nil, nil, err
	}
	return pr, func(gopacket.CaptureInfo) golayers.LinkType { return pr.LinkType() }, nil
}

// dump prints the capture in file to w: one line per RoCEv2 packet (and,
// with all, per other frame), then a summary line.
// A capture that ends within a frame (its writer was killed, or the file
// was cut) still gets its summary, then the error says after which frame.
func dump(w io.Writer, file string, all bool) error {
	in := dumpStdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	} else {
		file = "standard input"
	}
	src, linkType, err := openCapture(bufio.NewReader(in))
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	layers.Register()
	out := bufio.NewWriter(w)
	var (
		first              time.Time
		frames, roce, good int
		malformed          int // RoCEv2 packets too short or broken to check
		line               strings.Builder
	)
	var readErr error
	for {
		data, ci, err := src.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			readErr = fmt.Errorf("%s: capture truncated after frame %d (frame %d is cut short: its writer was killed, or the file was cut)",
				file, frames, frames+1)
			break
		}
		if err != nil {
			readErr = fmt.Errorf("%s: frame %d: %w (the frames after it are not read)", file, frames+1, err)
			break
		}
		frames++
		if frames == 1 {
			first = ci.Timestamp
		}
		p := gopacket.NewPacket(data, linkType(ci), gopacket.DecodeOptions{NoCopy: true})
		line.Reset()
		fmt.Fprintf(&line, "%d %.6f ", frames, ci.Timestamp.Sub(first).Seconds())
		isRoCE, icrcOK, broken := formatRoCE(&line, p, offPort(p))
		switch {
		case isRoCE:
			roce++
			if icrcOK {
				good++
			}
			if broken {
				malformed++
			}
		case !all:
			continue
		default:
			formatOther(&line, p, len(data))
		}
		line.WriteByte('\n')
		out.WriteString(line.String())
	}
	fmt.Fprintf(out, "# %d frames, %d RoCEv2 packets, ICRC %d ok, %d bad", frames, roce, good, roce-good-malformed)
	if malformed > 0 {
		fmt.Fprintf(out, ", %d malformed (not checked)", malformed)
	}
	if readErr != nil {
		out.WriteString(", truncated")
	}
	out.WriteString("\n")
	if err := out.Flush(); err != nil {
		return err
	}
	return readErr
}

// formatOther writes a frame that is not RoCEv2: its layers and length.
func formatOther(b *strings.Builder, p gopacket.Packet, n int) {
	if nl := p.NetworkLayer(); nl != nil {
		// A network layer that did not decode (a truncated header) has
		// no addresses: print none rather than "<nil>-><nil>".
		if f := nl.NetworkFlow(); len(f.Src().Raw()) > 0 {
			fmt.Fprintf(b, "%s ", f)
		}
	}
	names := make([]string, 0, 4)
	for _, l := range p.Layers() {
		names = append(names, l.LayerType().String())
	}
	fmt.Fprintf(b, "%s len=%d", strings.Join(names, "/"), n)
}

// offPort returns the RoCEv2 layers of a UDP datagram that is on neither
// port 4791 yet is a RoCEv2 packet, decoded from its UDP payload, or nil.
// RoCEv2 fixes the destination port only: an ACK or a response from a
// spread source port (0xC000-0xFFFF, as rxe and softrdma send) to a
// device bound to another port than 4791 (the perftest-style tools'
// clients take an ephemeral one) has 4791 on neither side, and gopacket,
// like Wireshark, decodes RoCEv2 by port. Such a datagram is taken for
// RoCEv2 when its payload parses and ends in the ICRC of its IP and UDP
// headers: a check of 32 bits, which other traffic passes by chance with
// probability 2^-32.
func offPort(p gopacket.Packet) gopacket.Packet {
	udp, _ := p.Layer(golayers.LayerTypeUDP).(*golayers.UDP)
	if udp == nil || udp.SrcPort == wire.RoCEv2Port || udp.DstPort == wire.RoCEv2Port {
		return nil
	}
	var pkt wire.Packet
	if wire.Parse(udp.Payload, &pkt) != nil {
		return nil
	}
	h, err := layers.IPHeader(p.NetworkLayer())
	if err != nil || !wire.VerifyICRCExact(&h, uint16(udp.SrcPort), uint16(udp.DstPort), udp.Payload) {
		return nil
	}
	return gopacket.NewPacket(udp.Payload, layers.LayerTypeBTH, gopacket.DecodeOptions{NoCopy: true})
}

// formatRoCE writes the line of a RoCEv2 packet: addresses, BTH, each
// extension header, MAD and CM fields, payload length and ICRC check. It
// reports whether p is RoCEv2 (a BTH on UDP, or a datagram to port 4791),
// whether its ICRC is right, and whether it was too broken to check.
// roce, if not nil, holds the RoCEv2 layers of p's UDP payload, decoded
// apart because p is not on port 4791 (offPort).
func formatRoCE(b *strings.Builder, p, roce gopacket.Packet) (isRoCE, icrcOK, malformed bool) {
	if roce == nil {
		roce = p
	}
	udp, _ := p.Layer(golayers.LayerTypeUDP).(*golayers.UDP)
	bth, _ := roce.Layer(layers.LayerTypeBTH).(*layers.BTH)
	if udp == nil || bth == nil {
		switch {
		case udp == nil || udp.DstPort != wire.RoCEv2Port:
		case p.ErrorLayer() != nil:
			fmt.Fprintf(b, "%s -> %s malformed RoCEv2: %v", endpoint(srcIP(p), udp.SrcPort), endpoint(dstIP(p), udp.DstPort), p.ErrorLayer().Error())
			return true, false, true
		case len(udp.Payload) < wire.BTHSize+wire.ICRCSize:
			// An empty datagram: gopacket decodes no layer from no
			// bytes, so reports no error. The device drops it (and
			// any shorter than a BTH and ICRC) as drop_short.
			fmt.Fprintf(b, "%s -> %s malformed RoCEv2: too short (%d bytes of UDP payload; a BTH and its ICRC take %d), as the device's drop_short",
				endpoint(srcIP(p), udp.SrcPort), endpoint(dstIP(p), udp.DstPort), len(udp.Payload), wire.BTHSize+wire.ICRCSize)
			return true, false, true
		}
		return false, false, false
	}
	fmt.Fprintf(b, "%s -> %s %s qpn=0x%06x psn=0x%06x ackreq=%d", endpoint(srcIP(p), udp.SrcPort), endpoint(dstIP(p), udp.DstPort),
		bth.Opcode, uint32(bth.DestQP), uint32(bth.PSN), b2i(bth.AckReq))
	if bth.SolicitedEvent {
		b.WriteString(" se=1")
	}
	if bth.MigReq {
		b.WriteString(" migreq=1")
	}
	if bth.PadCount != 0 {
		fmt.Fprintf(b, " pad=%d", bth.PadCount)
	}
	if bth.PKey != wire.DefaultPKey {
		fmt.Fprintf(b, " pkey=0x%04x", bth.PKey)
	}
	if bth.FECN || bth.BECN {
		fmt.Fprintf(b, " fecn=%d becn=%d", b2i(bth.FECN), b2i(bth.BECN))
	}
	var (
		payload int
		dport   uint16 // of the REQ's IP service ID
	)
	for _, l := range roce.Layers() {
		switch l := l.(type) {
		case *layers.DETH:
			fmt.Fprintf(b, " DETH[qkey=0x%08x srcqp=0x%06x]", l.QKey, uint32(l.SrcQP))
		case *layers.RETH:
			fmt.Fprintf(b, " RETH[va=0x%x rkey=0x%08x len=%d]", l.VA, l.RKey, l.DMALength)
		case *layers.AtomicETH:
			if l.Opcode == wire.OpFetchAdd {
				fmt.Fprintf(b, " AtomicETH[va=0x%x rkey=0x%08x add=0x%x]", l.VA, l.RKey, l.SwapAdd)
			} else {
				fmt.Fprintf(b, " AtomicETH[va=0x%x rkey=0x%08x swap=0x%x compare=0x%x]", l.VA, l.RKey, l.SwapAdd, l.Compare)
			}
		case *layers.AETH:
			fmt.Fprintf(b, " AETH[%s msn=%d]", syndrome(l.Syndrome), uint32(l.MSN))
		case *layers.AtomicAckETH:
			fmt.Fprintf(b, " AtomicAckETH[orig=0x%x]", l.OrigRemoteData)
		case *layers.ImmDt:
			fmt.Fprintf(b, " ImmDt[imm=0x%08x]", l.Imm)
		case *layers.IETH:
			fmt.Fprintf(b, " IETH[rkey=0x%08x]", l.RKey)
		case *layers.MAD:
			fmt.Fprintf(b, " MAD[%s/%s %s tid=0x%016x", l.Class, l.Method, l.AttributeID, l.TransactionID)
			if l.Status != 0 {
				fmt.Fprintf(b, " status=0x%04x", l.Status)
			}
			if l.AttributeModifier != 0 {
				fmt.Fprintf(b, " mod=0x%08x", l.AttributeModifier)
			}
			b.WriteByte(']')
		case *layers.IPCM:
			// The destination port is the REQ's service ID's.
			fmt.Fprintf(b, " IPCM[v%d %s -> %s]", l.IPVersion, netip.AddrPortFrom(l.SrcIP, l.SrcPort),
				netip.AddrPortFrom(l.DstIP, dport))
		case *layers.CM:
			formatCM(b, l)
			dport = l.REQ.ServiceID.Port()
		case *gopacket.Payload:
			payload = len(*l)
		}
	}
	if bth.Packet().Info != nil {
		payload = len(bth.Packet().Payload) // a MAD's bytes are payload too
	}
	if payload > 0 {
		fmt.Fprintf(b, " payload=%d", payload)
	}
	if el := roce.ErrorLayer(); el != nil {
		fmt.Fprintf(b, " malformed: %v", el.Error())
		return true, false, true
	}
	h, err := layers.IPHeader(p.NetworkLayer())
	if err != nil {
		fmt.Fprintf(b, " icrc=unchecked(%v)", err)
		return true, false, true
	}
	raw := udp.Payload
	want := wire.ComputeICRC(&h, uint16(udp.SrcPort), uint16(udp.DstPort), raw[:len(raw)-wire.ICRCSize])
	if want == bth.ICRC {
		b.WriteString(" icrc=ok")
		return true, true, false
	}
	// As Wireshark shows them: the trailer's bytes read big-endian.
	fmt.Fprintf(b, " icrc=BAD(have 0x%08x, want 0x%08x)", bits.ReverseBytes32(bth.ICRC), bits.ReverseBytes32(want))
	return true, false, false
}

// formatCM writes the fields of a CM message.
func formatCM(b *strings.Builder, c *layers.CM) {
	switch c.Attribute {
	case mad.AttrREQ:
		r := &c.REQ
		fmt.Fprintf(b, " REQ[lcid=0x%08x sid=%s qpn=0x%06x psn=0x%06x %s mtu=%d resp_res=%d init_depth=%d"+
			" retry=%d rnr_retry=%d ack_timeout=%d cm_timeout=%d gid=%s -> %s]",
			r.LocalCommID, r.ServiceID, uint32(r.LocalQPN), uint32(r.StartingPSN), r.TransportServiceType,
			r.PathMTU.Bytes(), r.ResponderResources, r.InitiatorDepth, r.RetryCount, r.RNRRetryCount,
			r.Primary.LocalACKTimeout, r.RemoteCMResponseTimeout, r.Primary.LocalGID, r.Primary.RemoteGID)
	case mad.AttrREP:
		r := &c.REP
		fmt.Fprintf(b, " REP[lcid=0x%08x rcid=0x%08x qpn=0x%06x psn=0x%06x resp_res=%d init_depth=%d rnr_retry=%d]",
			r.LocalCommID, r.RemoteCommID, uint32(r.LocalQPN), uint32(r.StartingPSN), r.ResponderResources,
			r.InitiatorDepth, r.RNRRetryCount)
	case mad.AttrRTU:
		fmt.Fprintf(b, " RTU[lcid=0x%08x rcid=0x%08x]", c.RTU.LocalCommID, c.RTU.RemoteCommID)
	case mad.AttrDREQ:
		fmt.Fprintf(b, " DREQ[lcid=0x%08x rcid=0x%08x qpn=0x%06x]", c.DREQ.LocalCommID, c.DREQ.RemoteCommID, uint32(c.DREQ.RemoteQPN))
	case mad.AttrDREP:
		fmt.Fprintf(b, " DREP[lcid=0x%08x rcid=0x%08x]", c.DREP.LocalCommID, c.DREP.RemoteCommID)
	case mad.AttrREJ:
		fmt.Fprintf(b, " REJ[lcid=0x%08x rcid=0x%08x rejected=%s reason=%d(%s) ari=%d]", c.REJ.LocalCommID,
			c.REJ.RemoteCommID, c.REJ.MessageRejected, uint16(c.REJ.Reason), c.REJ.Reason, len(c.REJ.ARI))
	case mad.AttrMRA:
		fmt.Fprintf(b, " MRA[lcid=0x%08x rcid=0x%08x mraed=%s timeout=%d]", c.MRA.LocalCommID, c.MRA.RemoteCommID,
			c.MRA.MessageMRAed, c.MRA.ServiceTimeout)
	}
}

// syndrome writes an AETH syndrome as "ACK", "RNR_NAK(timer=14)" or
// "NAK(REMOTE_ACCESS)", with its byte.
func syndrome(s wire.Syndrome) string {
	switch s.Type() {
	case wire.TypeACK:
		return fmt.Sprintf("ACK(0x%02x)", uint8(s))
	case wire.TypeRNRNAK:
		return fmt.Sprintf("RNR_NAK(0x%02x timer=%d)", uint8(s), s.Value())
	case wire.TypeNAK:
		name := [...]string{"PSN_SEQ_ERR", "INVALID_REQUEST", "REMOTE_ACCESS", "REMOTE_OP", "INVALID_RD_REQUEST"}
		if int(s.Value()) < len(name) {
			return fmt.Sprintf("NAK(0x%02x %s)", uint8(s), name[s.Value()])
		}
		return fmt.Sprintf("NAK(0x%02x)", uint8(s))
	}
	return fmt.Sprintf("RESERVED(0x%02x)", uint8(s))
}

func srcIP(p gopacket.Packet) string {
	if nl := p.NetworkLayer(); nl != nil {
		return nl.NetworkFlow().Src().String()
	}
	return "?"
}

func dstIP(p gopacket.Packet) string {
	if nl := p.NetworkLayer(); nl != nil {
		return nl.NetworkFlow().Dst().String()
	}
	return "?"
}

// endpoint returns "ip:port", or "[ip]:port" for IPv6.
func endpoint(ip string, port golayers.UDPPort) string {
	if strings.Contains(ip, ":") {
		return fmt.Sprintf("[%s]:%d", ip, port)
	}
	return fmt.Sprintf("%s:%d", ip, port)
}

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}
