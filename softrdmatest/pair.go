// Package softrdmatest gives tests a connected pair of softrdma devices in
// one call, in the manner of net/http/httptest.
package softrdmatest

import (
	"cmp"
	"math/rand/v2"
	"net/netip"
	"os"

	"strings"
	"testing"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/pcaptap"
)

// Options configure NewPair. The zero value gives two devices on real
// loopback UDP sockets (127.0.0.1, ephemeral ports), MTU 4096, queues of
// 256 WRs and CQs of 1024.
type Options struct {
	StartPSN *[2]uint32       // first send PSNs of A and B (default random), e.g. near the 2^24 wrap
	IPv6     bool             // bind the devices to [::1] instead of 127.0.0.1
	Pipe     bool             // use conn.NewPipe (in memory) instead of UDP sockets
	Impair   *conn.Impairment // applied to both devices
	Connect  softrdma.ConnectOptions
	// NoConnect leaves the two RC QPs in RESET, for a test that connects
	// them itself (with the connection manager, package rdmacm).
	NoConnect  bool
	Cap        softrdma.Cap // each zero field takes its default: 256 WRs, 4 SGEs, 64 bytes inline
	CQDepth    int          // default 1024
	NoPcap     bool         // do not capture (by default a failing test keeps a pcap)
	PcapPath   string       // capture into this file and always keep it
	DisableGSO bool
	DisableGRO bool
	// Demand paging, applied to both devices.
	Profile     softrdma.Profile
	FaultPolicy softrdma.FaultPolicy
	ODPBudget   int64 // bytes
	// SlowRestart turns on softrdma.Config.SlowRestart on both devices.
	SlowRestart bool
}

// Side is one end of a Pair.
type Side struct {
	Dev *softrdma.Device
	PD  *softrdma.PD
	CQ  *softrdma.CQ // send and receive CQ
	QP  *softrdma.QP
}

// Pair is two devices with a connected RC QP between them.
type Pair struct {
	A, B *Side
	// PcapPath is where the pair's packets are written; the file is kept
	// (and its path logged) only when the test fails.
	PcapPath string
}

// NewPair creates two devices and an RC QP on each, connected to each
// other and in RTS. Everything is torn down when the test ends; if the test
// failed, the capture of the exchange is kept for Wireshark and its path
// logged.
func NewPair(tb testing.TB, o Options) *Pair {
	tb.Helper()
	p := &Pair{}
	var tap *pcaptap.Writer
	if o.PcapPath != "" {
		var err error
		if tap, err = pcaptap.Create(o.PcapPath); err != nil {
			tb.Fatalf("softrdmatest: %v", err)
		}
		p.PcapPath = o.PcapPath
	} else if !o.NoPcap {
		name := strings.NewReplacer("/", "_", " ", "_").Replace(tb.Name())
		f, err := os.CreateTemp("", "softrdma-"+name+"-*.pcap")
		if err == nil {
			f.Close()
			if tap, err = pcaptap.Create(f.Name()); err == nil {
				p.PcapPath = f.Name()
			}
		}
	}
	var cfgA, cfgB softrdma.Config
	if o.Pipe {
		ca, cb := conn.NewPipe()
		cfgA.Conn, cfgB.Conn = ca, cb
	} else {
		ip := "127.0.0.1"
		if o.IPv6 {
			ip = "::1"
		}
		cfgA.Addr = netip.AddrPortFrom(netip.MustParseAddr(ip), 0)
		cfgB.Addr = netip.AddrPortFrom(netip.MustParseAddr(ip), 0)
	}
	for _, c := range []*softrdma.Config{&cfgA, &cfgB} {
		c.Impair = o.Impair
		c.DisableGSO, c.DisableGRO = o.DisableGSO, o.DisableGRO
		c.Profile, c.FaultPolicy, c.ODPBudget = o.Profile, o.FaultPolicy, o.ODPBudget
		c.SlowRestart = o.SlowRestart
		c.Logf = tb.Logf
		if tap != nil {
			c.Tap = tap
		}
	}
	p.A = newSide(tb, cfgA, o)
	p.B = newSide(tb, cfgB, o)
	pa, pb := softrdma.PSN(rand.Uint32()&0xffffff), softrdma.PSN(rand.Uint32()&0xffffff)
	if o.StartPSN != nil {
		pa, pb = softrdma.PSN(o.StartPSN[0]&0xffffff), softrdma.PSN(o.StartPSN[1]&0xffffff)
	}
	if !o.NoConnect {
		if err := softrdma.Connect(p.A.QP, softrdma.Endpoint{Addr: p.B.Dev.LocalAddr(), QPN: p.B.QP.QPN(), PSN: pb}, pa, o.Connect); err != nil {
			tb.Fatalf("softrdmatest: connect A: %v", err)
		}
		if err := softrdma.Connect(p.B.QP, softrdma.Endpoint{Addr: p.A.Dev.LocalAddr(), QPN: p.A.QP.QPN(), PSN: pa}, pb, o.Connect); err != nil {
			tb.Fatalf("softrdmatest: connect B: %v", err)
		}
	}
	tb.Cleanup(func() {
		p.A.Dev.Close()
		p.B.Dev.Close()
		if tap != nil {
			tap.Close()
			if o.PcapPath != "" {
				// kept
			} else if tb.Failed() {
				tb.Logf("softrdmatest: packets of the failed test kept in %s (open with wireshark or tshark -r)", p.PcapPath)
			} else {
				os.Remove(p.PcapPath)
			}
		}
	})
	return p
}

func newSide(tb testing.TB, cfg softrdma.Config, o Options) *Side {
	tb.Helper()
	dev, err := softrdma.Open(cfg)
	if err != nil {
		tb.Fatalf("softrdmatest: open: %v", err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		tb.Fatalf("softrdmatest: alloc PD: %v", err)
	}
	depth := o.CQDepth
	if depth == 0 {
		depth = 1024
	}
	cq, err := dev.CreateCQ(depth)
	if err != nil {
		tb.Fatalf("softrdmatest: create CQ: %v", err)
	}
	// Each zero field takes its default, each field given is used.
	c := o.Cap
	c.MaxSendWR = cmp.Or(c.MaxSendWR, 256)
	c.MaxRecvWR = cmp.Or(c.MaxRecvWR, 256)
	c.MaxSendSGE = cmp.Or(c.MaxSendSGE, 4)
	c.MaxRecvSGE = cmp.Or(c.MaxRecvSGE, 4)
	c.MaxInlineData = cmp.Or(c.MaxInlineData, 64)
	qp, err := dev.CreateQP(pd, softrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: c, Type: softrdma.QPTypeRC})
	if err != nil {
		tb.Fatalf("softrdmatest: create QP: %v", err)
	}
	return &Side{Dev: dev, PD: pd, CQ: cq, QP: qp}
}
