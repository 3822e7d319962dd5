// Package pcaptap records the datagrams of a softrdma conn in a pcap file
// (Ethernet link type) that Wireshark and tshark decode as RoCEv2: each
// RoCE packet is written as an Ethernet/IPv4 (or IPv6)/UDP frame with the
// headers Linux puts on the wire for our socket (IPv4: DF, TTL 64, TOS 0,
// the IPv4 ID the ICRC covers, a correct header checksum, UDP checksum 0
// as rxe sends it; IPv6: hop limit 64, flow label 0, a correct UDP
// checksum, which IPv6 requires).
package pcaptap

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrdma/softrdma/transport/conn"
)

// SnapLen is the snapshot length in the file header: the largest frame.
const SnapLen = 14 + 40 + 8 + 65535

// Writer is a conn.Tap that writes every datagram it is shown to a pcap
// file. It is safe for concurrent use. Write errors are sticky: the first
// one stops the writer and is returned by Err, Flush and Close.
type Writer struct {
	mu    sync.Mutex
	pw    *pcapgo.Writer           // guarded by mu
	bw    *bufio.Writer            // guarded by mu
	file  io.Closer                // closed by Close, if Create opened it
	sbuf  gopacket.SerializeBuffer // guarded by mu
	eth   layers.Ethernet          // guarded by mu; reused per packet
	ip4   layers.IPv4              // guarded by mu
	ip6   layers.IPv6              // guarded by mu
	udp   layers.UDP               // guarded by mu
	err   error                    // guarded by mu
	count int                      // guarded by mu
	now   func() time.Time
}

var _ conn.Tap = (*Writer)(nil)

var errClosed = errors.New("pcaptap: writer closed")

// NewWriter writes a pcap file header to w and returns a Writer that
// appends frames to it (buffered: call Flush or Close).
func NewWriter(w io.Writer) (*Writer, error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	pw := pcapgo.NewWriterNanos(bw)
	if err := pw.WriteFileHeader(SnapLen, layers.LinkTypeEthernet); err != nil {
		return nil, err
	}
	return &Writer{pw: pw, bw: bw, sbuf: gopacket.NewSerializeBuffer(), now: time.Now}, nil
}

// Create creates (or truncates) the file path and returns a Writer to it;
// Close closes the file.
func Create(path string) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w, err := NewWriter(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	w.file = f
	return w, nil
}

// Packet implements conn.Tap: it writes one frame carrying roce as the
// payload of a UDP datagram from src to dst with IPv4 Identification ipID.
// dir does not appear in the frame (the addresses tell it).
func (w *Writer) Packet(dir conn.Direction, src, dst netip.AddrPort, ipID uint16, roce []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return
	}
	w.err = w.write(src, dst, ipID, roce)
	if w.err == nil {
		w.count++
	}
}

func (w *Writer) write(src, dst netip.AddrPort, ipID uint16, roce []byte) error {
	b := w.sbuf
	if err := b.Clear(); err != nil {
		return err
	}
	sa, da := src.Addr().Unmap(), dst.Addr().Unmap()
	plain := gopacket.SerializeOptions{FixLengths: true}
	sums := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.Payload(roce).SerializeTo(b, plain); err != nil {
		return err
	}
	w.udp = layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
	w.eth = layers.Ethernet{SrcMAC: mac(sa), DstMAC: mac(da)}
	if sa.Is4() {
		// UDP checksum 0 ("no checksum", RFC 768), as Linux rxe sends.
		if err := w.udp.SerializeTo(b, plain); err != nil {
			return err
		}
		s, d := sa.As4(), da.As4()
		w.ip4 = layers.IPv4{
			Version: 4, IHL: 5, TTL: 64, Id: ipID,
			Flags:    layers.IPv4DontFragment,
			Protocol: layers.IPProtocolUDP,
			SrcIP:    net.IP(s[:]), DstIP: net.IP(d[:]),
		}
		if err := w.ip4.SerializeTo(b, sums); err != nil {
			return err
		}
		w.eth.EthernetType = layers.EthernetTypeIPv4
	} else {
		s, d := sa.As16(), da.As16()
		w.ip6 = layers.IPv6{
			Version: 6, HopLimit: 64,
			NextHeader: layers.IPProtocolUDP,
			SrcIP:      net.IP(s[:]), DstIP: net.IP(d[:]),
		}
		if err := w.udp.SetNetworkLayerForChecksum(&w.ip6); err != nil {
			return err
		}
		if err := w.udp.SerializeTo(b, sums); err != nil {
			return err
		}
		if err := w.ip6.SerializeTo(b, sums); err != nil {
			return err
		}
		w.eth.EthernetType = layers.EthernetTypeIPv6
	}
	if err := w.eth.SerializeTo(b, plain); err != nil {
		return err
	}
	frame := b.Bytes()
	ci := gopacket.CaptureInfo{Timestamp: w.now(), CaptureLength: len(frame), Length: len(frame)}
	return w.pw.WritePacket(ci, frame)
}

// mac returns a locally administered MAC address made from the IP address,
// so that each host has its own: 02:00 and the address's last four bytes.
func mac(a netip.Addr) net.HardwareAddr {
	b := a.As16()
	return net.HardwareAddr{0x02, 0x00, b[12], b[13], b[14], b[15]}
}

// Count returns the number of frames written.
func (w *Writer) Count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.count
}

// Err returns the first write error, if any.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == errClosed {
		return nil
	}
	return w.err
}

// Flush writes buffered frames to the underlying writer.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		if w.err == errClosed {
			return nil
		}
		return w.err
	}
	w.err = w.bw.Flush()
	return w.err
}

// Close flushes the frames and closes the file if Create opened it.
// Packets shown to the Writer afterwards are ignored.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == errClosed {
		return nil
	}
	err := w.err
	if err == nil {
		err = w.bw.Flush()
	}
	if w.file != nil {
		if cerr := w.file.Close(); err == nil {
			err = cerr
		}
	}
	w.err = errClosed
	return err
}
