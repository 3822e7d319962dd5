package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/odpbuf"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/pingpong"
)

// pingCmd holds the flags of `softrdma rc-pingpong`: ibv_rc_pingpong's
// (same letters, long names and defaults), then softrdma's own.
type pingCmd struct {
	Server string `arg:"" optional:"" help:"The server's host name or IP. Without it, run as the server and wait for one client."`

	Port    int  `short:"p" name:"port" default:"18515" help:"TCP port of the exchange (listen on / connect to)."`
	Size    int  `short:"s" name:"size" default:"4096" help:"Size of the message to exchange, in bytes."`
	Iters   int  `short:"n" name:"iters" default:"1000" help:"Number of exchanges."`
	MTU     int  `short:"m" name:"mtu" default:"1024" help:"Path MTU: 256, 512, 1024, 2048 or 4096."`
	RxDepth int  `short:"r" name:"rx-depth" default:"500" help:"Number of receives to post at a time."`
	SL      int  `short:"l" name:"sl" default:"0" help:"Service level (accepted; RoCEv2 packets carry no SL)."`
	Events  bool `short:"e" name:"events" help:"Sleep on CQ events instead of polling."`
	GIDIdx  int  `short:"g" name:"gid-idx" default:"-1" help:"Local GID index to advertise (softrdma has one GID, its IP, at every index). Without -g the GID is zero, which a RoCE peer cannot address: use -g 1 with rxe."`
	Chk     bool `short:"c" name:"chk" help:"Validate the received buffer (the client zeroes the first byte of each page, the server checks it)."`
	IBPort  int  `short:"i" name:"ib-port" default:"1" help:"Port of the device (only 1 exists)."`
	// Demand paging, ibv_rc_pingpong's letters (the perftest-style tools
	// have them too; odpbuf).
	ODP      bool `short:"o" name:"odp" help:"Register the buffer on demand (IBV_ACCESS_ON_DEMAND): the device faults its pages in as transfers reach them."`
	IODP     bool `short:"O" name:"iodp" help:"Reach the buffer through an implicit ODP MR over the whole address space (ibv_reg_mr(pd, NULL, SIZE_MAX)); implies -o."`
	Prefetch bool `short:"P" name:"prefetch" help:"Prefetch the message's pages through the ODP MR before the first exchange (ibv_advise_mr PREFETCH_WRITE with FLUSH). Needs -o or -O."`

	Verify         bool          `help:"Check every message received: the client sends a random pattern and checks each echo; the server checks that every message equals the first."`
	Bind           string        `placeholder:"IP[:PORT]" help:"RoCEv2 address of this side's device. Default: the IP of the TCP connection, UDP port 4791 (the exchange carries no port, so a stock peer sends to 4791)."`
	SourcePort     sport         `name:"sport" placeholder:"spread|bind|PORT" help:"${sport_help}"`
	Pcap           string        `placeholder:"FILE" help:"Record every datagram sent and received in a pcap file."`
	Stat           bool          `help:"Print the device's non-zero counters at the end."`
	ConnectTimeout time.Duration `name:"connect-timeout" placeholder:"DURATION" help:"Client: keep retrying a refused connection for this long (default: one attempt, as ibv_rc_pingpong)."`
	IdleTimeout    time.Duration `name:"idle-timeout" default:"10s" placeholder:"DURATION" help:"Fail when no message completes for this long while exchanges remain: the exchange carries no -n, so a peer given a smaller one stops early, and one that went away says nothing (0: wait for ever, as the rdma-core tools do; otherwise 100ms to 24h)."`
	Seed           uint64        `hidden:"" help:"Seed of the --verify pattern (default: random)."`
}

// run runs the command and returns the exit code.
func (c *pingCmd) run(ctx context.Context, stdout, stderr io.Writer) int {
	return c.runAs(ctx, stdout, stderr, "rc-pingpong", softrdma.QPTypeRC)
}

// runAs runs the command as rc-pingpong or uc-pingpong (ucudpingpong.go).
func (c *pingCmd) runAs(ctx context.Context, stdout, stderr io.Writer, name string, typ softrdma.QPType) int {
	if c.IBPort != 1 {
		fmt.Fprintf(stderr, "softrdma: %s: -i %d: the device has port 1 only\n", name, c.IBPort)
		return exitUsage
	}
	if c.Port == 0 { // pingpong.Options takes 0 for the default
		fmt.Fprintf(stderr, "softrdma: %s: -p 0: not a TCP port (1 to 65535; default %d)\n", name, pingpong.DefaultPort)
		return exitUsage
	}
	if err := cmp.Or(checkConnectTimeout(c.ConnectTimeout),
		checkTimeout("--idle-timeout", c.IdleTimeout), checkPcap(c.Pcap)); err != nil {
		fmt.Fprintf(stderr, "softrdma: %s: %v\n", name, err)
		return exitUsage
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) }
	err := pingpong.Run(ctx, pingpong.Options{
		Type: typ, Server: c.Server, Port: c.Port, Size: c.Size, Iters: c.Iters, MTU: c.MTU, RxDepth: c.RxDepth,
		SL: c.SL, Events: c.Events, GIDIndex: c.GIDIdx, Check: c.Chk, Verify: c.Verify, Seed: c.Seed,
		ODP:  odpbuf.Options{Explicit: c.ODP && !c.IODP, Implicit: c.IODP, Prefetch: c.Prefetch},
		Bind: c.Bind, Pcap: c.Pcap, SourcePort: int(c.SourcePort), Stat: c.Stat, ConnectTimeout: c.ConnectTimeout, IdleTimeout: c.IdleTimeout,
		Stdout: stdout, Logf: logf,
	})
	return pingExit(err, stderr, name)
}

// pingExit reports err and returns the exit code.
func pingExit(err error, stderr io.Writer, name string) int {
	var ue *pingpong.UsageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "softrdma: %s: %v\n", name, err)
		return exitUsage
	}
	fmt.Fprintf(stderr, "softrdma: %s: %v\n", name, interrupted(err))
	return exitFail
}
