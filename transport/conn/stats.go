package conn

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
)

// Stats are a conn's counters. They are updated atomically and may be read
// at any time; Snapshot copies them.
type Stats struct {
	SentDatagrams atomic.Uint64 // datagrams handed to the kernel (GSO segments counted one by one)
	SentBytes     atomic.Uint64 // their UDP payload bytes
	SendCalls     atomic.Uint64 // sendmmsg calls (pipe: Send calls)
	GSOBatches    atomic.Uint64 // super-buffers of more than one segment sent with UDP_SEGMENT
	SendErrors    atomic.Uint64 // datagrams the kernel refused (or the pipe could not route)

	RcvdDatagrams atomic.Uint64 // datagrams read from the kernel (GRO segments counted one by one)
	RcvdBytes     atomic.Uint64 // their UDP payload bytes
	RecvCalls     atomic.Uint64 // recvmmsg calls, including ones that found nothing (pipe: wake-ups)
	GROBatches    atomic.Uint64 // super-buffers of more than one segment received with UDP_GRO
	BadICRC       atomic.Uint64 // packets dropped because their ICRC did not verify
	Short         atomic.Uint64 // datagrams dropped for being shorter than MinPacketSize (or truncated)
	RecvQueueFull atomic.Uint64 // pipe: datagrams dropped because this end's queue was full

	TxImpair ImpairStats // impairments applied to sent packets
	RxImpair ImpairStats // impairments applied to received packets
}

// ImpairStats count the packets an impairment acted on, by kind. A packet
// that was both duplicated and delayed is counted in both.
type ImpairStats struct {
	Dropped    atomic.Uint64
	Reordered  atomic.Uint64
	Duplicated atomic.Uint64
	Corrupted  atomic.Uint64
	Delayed    atomic.Uint64
	// Discarded counts packets still delayed or held back for reordering
	// when the conn closed: they never reached the wire (or, on receive,
	// the reader), and no other counter has them as lost.
	Discarded atomic.Uint64
}

// StatsSnapshot is a copy of Stats at one moment.
type StatsSnapshot struct {
	SentDatagrams, SentBytes, SendCalls, GSOBatches, SendErrors                    uint64
	RcvdDatagrams, RcvdBytes, RecvCalls, GROBatches, BadICRC, Short, RecvQueueFull uint64
	TxImpair, RxImpair                                                             ImpairSnapshot
}

// ImpairSnapshot is a copy of ImpairStats.
type ImpairSnapshot struct {
	Dropped, Reordered, Duplicated, Corrupted, Delayed, Discarded uint64
}

// Snapshot returns a copy of the counters.
func (s *Stats) Snapshot() StatsSnapshot {
	return StatsSnapshot{
		SentDatagrams: s.SentDatagrams.Load(),
		SentBytes:     s.SentBytes.Load(),
		SendCalls:     s.SendCalls.Load(),
		GSOBatches:    s.GSOBatches.Load(),
		SendErrors:    s.SendErrors.Load(),
		RcvdDatagrams: s.RcvdDatagrams.Load(),
		RcvdBytes:     s.RcvdBytes.Load(),
		RecvCalls:     s.RecvCalls.Load(),
		GROBatches:    s.GROBatches.Load(),
		BadICRC:       s.BadICRC.Load(),
		Short:         s.Short.Load(),
		RecvQueueFull: s.RecvQueueFull.Load(),
		TxImpair:      s.TxImpair.Snapshot(),
		RxImpair:      s.RxImpair.Snapshot(),
	}
}

// Snapshot returns a copy of the counters.
func (s *ImpairStats) Snapshot() ImpairSnapshot {
	return ImpairSnapshot{
		Dropped:    s.Dropped.Load(),
		Reordered:  s.Reordered.Load(),
		Duplicated: s.Duplicated.Load(),
		Corrupted:  s.Corrupted.Load(),
		Delayed:    s.Delayed.Load(),
		Discarded:  s.Discarded.Load(),
	}
}

// RecvQueue is the kernel's view of a conn's receive socket (see
// UDPConn.RecvQueue).
type RecvQueue struct {
	Drops  uint64 // datagrams the kernel dropped at the socket (full receive buffer), since it was opened
	Queued uint64 // bytes waiting in the receive queue, with the kernel's per-datagram overhead
}

// UDPSNMP holds the kernel's UDP counters (the "Udp:" lines of
// /proc/net/snmp, or "Udp6..." of /proc/net/snmp6). They are per network
// namespace, for all sockets: compare two readings around a test.
type UDPSNMP struct {
	InDatagrams, NoPorts, InErrors, OutDatagrams, RcvbufErrors, SndbufErrors, InCsumErrors uint64
}

// ReadUDPSNMP reads the kernel's UDP counters for IPv4 (ipv6 false) or IPv6.
// RcvbufErrors is the only place where datagrams dropped by a full socket
// receive buffer show up.
func ReadUDPSNMP(ipv6 bool) (UDPSNMP, error) {
	if ipv6 {
		return readSNMP6("/proc/net/snmp6")
	}
	return readSNMP("/proc/net/snmp")
}

func (s *UDPSNMP) set(name string, v uint64) {
	switch name {
	case "InDatagrams":
		s.InDatagrams = v
	case "NoPorts":
		s.NoPorts = v
	case "InErrors":
		s.InErrors = v
	case "OutDatagrams":
		s.OutDatagrams = v
	case "RcvbufErrors":
		s.RcvbufErrors = v
	case "SndbufErrors":
		s.SndbufErrors = v
	case "InCsumErrors":
		s.InCsumErrors = v
	}
}

// readSNMP parses the pair of "Udp:" lines (names, then values).
func readSNMP(path string) (UDPSNMP, error) {
	var s UDPSNMP
	f, err := os.Open(path)
	if err != nil {
		return s, err
	}
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = fields[1:]
			continue
		}
		for i, v := range fields[1:] {
			if i < len(names) {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return s, fmt.Errorf("conn: %s: %s: %w", path, names[i], err)
				}
				s.set(names[i], n)
			}
		}
		return s, nil
	}
	if err := sc.Err(); err != nil {
		return s, err
	}
	return s, fmt.Errorf("conn: %s: no Udp lines", path)
}

// readSNMP6 parses "Udp6Name value" lines.
func readSNMP6(path string) (UDPSNMP, error) {
	var s UDPSNMP
	f, err := os.Open(path)
	if err != nil {
		return s, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 || !strings.HasPrefix(fields[0], "Udp6") {
			continue
		}
		n, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			return s, fmt.Errorf("conn: %s: %s: %w", path, fields[0], err)
		}
		s.set(strings.TrimPrefix(fields[0], "Udp6"), n)
	}
	return s, sc.Err()
}
