package report

import (
	"fmt"
	"io"
	"net/netip"
)

// Banner is the short test description perftest prints before the results
// (ctx_print_test_info), with the fields that mean something here.
type Banner struct {
	Title    string // "RDMA_Write BW Test", as perftest names its tests
	Device   string // the local RoCE address, e.g. "softrdma 127.0.0.1:4791"
	QPs      int
	TxDepth  int // printed when > 0 (the client, as perftest)
	RxDepth  int // printed when > 0 (SEND tests, the receiving side)
	CQMod    int // printed when > 0 (BW tests)
	MTU      int // bytes
	Inline   int // max inline data, printed when OutReads is 0
	OutReads int // outstanding READ/atomic, printed when > 0
	Exchange string
}

// Print writes the banner between two RESULT_LINEs.
func (b *Banner) Print(w io.Writer) {
	fmt.Fprintln(w, Line)
	fmt.Fprintf(w, "                    %s\n", b.Title)
	fmt.Fprintf(w, " Number of qps   : %d\t\tTransport type : RoCEv2 over UDP\n", b.QPs)
	fmt.Fprintf(w, " Connection type : RC\t\tDevice         : %s\n", b.Device)
	if b.TxDepth > 0 {
		fmt.Fprintf(w, " TX depth        : %d\n", b.TxDepth)
	}
	if b.RxDepth > 0 {
		fmt.Fprintf(w, " RX depth        : %d\n", b.RxDepth)
	}
	if b.CQMod > 0 {
		fmt.Fprintf(w, " CQ Moderation   : %d\n", b.CQMod)
	}
	fmt.Fprintf(w, " Mtu             : %d[B]\n", b.MTU)
	fmt.Fprintf(w, " Link type       : Ethernet\n")
	if b.OutReads > 0 {
		fmt.Fprintf(w, " Outstand reads  : %d\n", b.OutReads)
	} else {
		fmt.Fprintf(w, " Max inline data : %d[B]\n", b.Inline)
	}
	fmt.Fprintf(w, " Data ex. method : %s\n", b.Exchange)
	fmt.Fprintln(w, Line)
}

// Address is one side of one QP as perftest prints it ("local address:
// LID ... QPN ... PSN ... RKey ... VAddr ..."), with the RoCEv2 UDP
// address in place of the LID.
type Address struct {
	Addr  netip.AddrPort
	QPN   uint32
	PSN   uint32
	RKey  uint32
	VAddr uint64
}

// FormatAddress formats a as perftest's BASIC_ADDR_FMT + RDMA_FMT line
// (C's %#06x counts the 0x in the width, hence 0x%04x); side is "local"
// or "remote".
func FormatAddress(side string, a Address) string {
	return fmt.Sprintf(" %s address: IP %s UDP %d QPN 0x%04x PSN 0x%04x RKey 0x%06x VAddr 0x%014x",
		side, a.Addr.Addr(), a.Addr.Port(), a.QPN, a.PSN, a.RKey, a.VAddr)
}
