package perf

import (
	"fmt"
	"io"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/report"
)

// printBanner prints perftest's test description, the QPs' addresses and
// the results header.
func (s *session) printBanner(w io.Writer) {
	b := report.Banner{
		Title:    s.test.title(s.p.Atomic),
		Device:   fmt.Sprintf("softrdma %v", s.dev.LocalAddr()),
		QPs:      s.p.QPs,
		MTU:      s.p.MTU,
		Inline:   s.p.Inline,
		Exchange: s.exchangeName(),
	}
	if !s.server || s.test.IsLat() {
		b.TxDepth = s.p.TxDepth
	}
	if s.test.verb() == verbSend && s.server {
		b.RxDepth = s.p.RxDepth
	}
	if !s.test.IsLat() {
		b.CQMod = s.p.CQMod
	}
	if v := s.test.verb(); v == verbRead || v == verbAtomic {
		b.OutReads = s.outReads()
	}
	b.Print(w)
	local := s.localInfos()
	for i := range local {
		l, r := &local[i], &s.remote[i]
		fmt.Fprintln(w, report.FormatAddress("local", report.Address{Addr: l.Addr(), QPN: l.QPN, PSN: l.PSN, RKey: l.RKey, VAddr: l.VAddr}))
		fmt.Fprintln(w, report.FormatAddress("remote", report.Address{Addr: r.Addr(), QPN: r.QPN, PSN: r.PSN, RKey: r.RKey, VAddr: r.VAddr}))
	}
	fmt.Fprintln(w, report.Line)
	if s.test.IsLat() {
		fmt.Fprintln(w, report.LatHeader)
	} else {
		fmt.Fprintln(w, report.BWHeader(s.unit))
	}
}

// addRow prints and records one round's result: this side's measurement,
// or the client's where the server only served (write-bw, read-bw,
// atomic-bw, read-lat), so that both sides show the run's numbers.
func (s *session) addRow(w io.Writer, text bool, mine, peer *roundResult) {
	if s.test.IsLat() {
		r := mine.Lat
		if r == nil {
			r = peer.Lat
		}
		if r == nil {
			return
		}
		s.json.Lat = append(s.json.Lat, report.LatRow(*r))
		if text {
			fmt.Fprintln(w, report.FormatLat(*r))
		}
		return
	}
	r := mine.BW
	if r == nil || s.server && s.test == WriteBW && peer.BW != nil {
		// write-bw's server prints its client's numbers, as perftest's
		// does (write_bw.c: xchg_bw_reports, then the remote report),
		// with --verify and --file too, where it has completions of its
		// own: it sees only when messages were placed, not when they
		// were posted, and its clock starts at the first (recvClock),
		// so a short run (-n 5) that arrives in a poll or two has
		// hardly an interval to time (it once showed 51263 MB/sec for
		// the client's 143).
		r = peer.BW
	}
	if r == nil {
		return
	}
	s.json.BW = append(s.json.BW, report.BWRow(*r, s.unit))
	if text {
		fmt.Fprintln(w, report.FormatBW(*r, s.unit))
	}
}

// reportFile prints what happened to the --file bytes.
func (s *session) reportFile(w io.Writer, text bool, mine, peer *roundResult) {
	f := &report.FileJSON{Bytes: mine.Bytes, SHA256: mine.SHA256, Peer: peer.SHA256,
		Match: mine.SHA256 == peer.SHA256 && mine.Bytes == peer.Bytes}
	sender := s.server == s.test.fileFromServer()
	if sender {
		f.Path = s.o.File
	} else {
		f.Path = s.o.Out
	}
	s.json.File = f
	if !text {
		return
	}
	verdict := "the receiver's SHA-256 matches"
	if !sender {
		verdict = "matches the sender's"
	}
	if !f.Match {
		verdict = "MISMATCH with the peer's " + peer.SHA256
	}
	if sender {
		fmt.Fprintf(w, " Sent            : %s, %d bytes, SHA-256 %s (%s)\n", s.o.File, f.Bytes, f.SHA256, verdict)
		return
	}
	fmt.Fprintf(w, " Received        : %d bytes, SHA-256 %s (%s)\n", f.Bytes, f.SHA256, verdict)
	if s.o.Out != "" {
		fmt.Fprintf(w, " Written to      : %s\n", s.o.Out)
	}
}

// nonZeroCounters returns the device's hw_counters that are not zero.
// peerAddr returns the address of the round's first peer QP, else the
// last round's, else "?" (none connected).
func (s *session) peerAddr() string {
	switch {
	case len(s.remote) > 0 && s.remote[0].Addr().IsValid():
		return s.remote[0].Addr().String()
	case s.lastPeer != "":
		return s.lastPeer
	}
	return "?"
}

func nonZeroCounters(s *session) map[string]uint64 {
	m := map[string]uint64{}
	for _, c := range s.dev.Snapshot() {
		if c.Value != 0 {
			m[c.Name] = c.Value
		}
	}
	for _, c := range s.cmCounters() {
		m[c.name] = c.v
	}
	return m
}

// printStat prints the device's non-zero counters (--stat), in the order
// the device lists them; peer is the peer's address (peerAddr).
func (s *session) printStat(w io.Writer, peer string) {
	fmt.Fprintf(w, "softrdma counters (%v <-> %v):\n", s.dev.LocalAddr(), peer)
	for _, c := range s.dev.Snapshot() {
		if c.Value != 0 {
			fmt.Fprintf(w, "  %s = %d\n", c.Name, c.Value)
		}
	}
	// The socket's view (the device's counters above include the drops
	// and impairments it counts): what left and what arrived, before
	// --impair's receive side and after its send side. sent_pkts counts
	// packets an impairment then dropped, rcvd_pkts does not count them.
	for _, c := range s.cmCounters() {
		fmt.Fprintf(w, "  %s = %d\n", c.name, c.v)
	}
	cs := s.dev.ConnStats().Snapshot()
	for _, c := range []struct {
		name string
		v    uint64
	}{{"conn_sent_datagrams", cs.SentDatagrams}, {"conn_rcvd_datagrams", cs.RcvdDatagrams}, {"conn_send_errors", cs.SendErrors}} {
		if c.v != 0 {
			fmt.Fprintf(w, "  %s = %d\n", c.name, c.v)
		}
	}
}
