package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/pingpong"
)

// `softrdma uc-pingpong` takes rc-pingpong's flags (pingCmd), as
// ibv_uc_pingpong takes ibv_rc_pingpong's; `softrdma ud-pingpong` takes
// ibv_ud_pingpong's: no -m (a datagram is at most the device's MTU, 4096)
// and no -c, default size 2048.

// udPingCmd holds the flags of `softrdma ud-pingpong`.
type udPingCmd struct {
	Server string `arg:"" optional:"" help:"The server's host name or IP. Without it, run as the server and wait for one client."`

	Port    int  `short:"p" name:"port" default:"18515" help:"TCP port of the exchange (listen on / connect to)."`
	Size    int  `short:"s" name:"size" default:"2048" help:"Size of the message to exchange, in bytes (at most the MTU, 4096; the peer's may be smaller)."`
	Iters   int  `short:"n" name:"iters" default:"1000" help:"Number of exchanges."`
	RxDepth int  `short:"r" name:"rx-depth" default:"500" help:"Number of receives to post at a time."`
	SL      int  `short:"l" name:"sl" default:"0" help:"Service level (accepted; RoCEv2 packets carry no SL)."`
	Events  bool `short:"e" name:"events" help:"Sleep on CQ events instead of polling."`
	GIDIdx  int  `short:"g" name:"gid-idx" default:"-1" help:"Local GID index to advertise (softrdma has one GID, its IP, at every index). Use -g 1 with rxe."`
	IBPort  int  `short:"i" name:"ib-port" default:"1" help:"Port of the device (only 1 exists)."`

	Verify         bool          `help:"Check every message received: the client sends a random pattern and checks each echo; the server checks that every message equals the first."`
	Bind           string        `placeholder:"IP[:PORT]" help:"RoCEv2 address of this side's device. Default: the IP of the TCP connection, UDP port 4791."`
	SourcePort     sport         `name:"sport" placeholder:"spread|bind|PORT" help:"${sport_help}"`
	Pcap           string        `placeholder:"FILE" help:"Record every datagram sent and received in a pcap file."`
	Stat           bool          `help:"Print the device's non-zero counters at the end."`
	ConnectTimeout time.Duration `name:"connect-timeout" placeholder:"DURATION" help:"Client: keep retrying a refused connection for this long (default: one attempt, as ibv_ud_pingpong)."`
	IdleTimeout    time.Duration `name:"idle-timeout" default:"10s" placeholder:"DURATION" help:"Fail when no message completes for this long while exchanges remain: the exchange carries no -n, so a peer given a smaller one stops early, and one that went away says nothing (0: wait for ever, as the rdma-core tools do; otherwise 100ms to 24h)."`
	Seed           uint64        `hidden:"" help:"Seed of the --verify pattern (default: random)."`
}

// runUC runs uc-pingpong and returns the exit code.
func (c *pingCmd) runUC(ctx context.Context, stdout, stderr io.Writer) int {
	return c.runAs(ctx, stdout, stderr, "uc-pingpong", softrdma.QPTypeUC)
}

// run runs ud-pingpong and returns the exit code.
func (c *udPingCmd) run(ctx context.Context, stdout, stderr io.Writer) int {
	const name = "ud-pingpong"
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
		Type: softrdma.QPTypeUD, Server: c.Server, Port: c.Port, Size: c.Size, Iters: c.Iters,
		MTU: softrdma.MTU4096.Bytes(), RxDepth: c.RxDepth, SL: c.SL, Events: c.Events, GIDIndex: c.GIDIdx,
		Verify: c.Verify, Seed: c.Seed, Bind: c.Bind, Pcap: c.Pcap, SourcePort: int(c.SourcePort), Stat: c.Stat,
		ConnectTimeout: c.ConnectTimeout, IdleTimeout: c.IdleTimeout, Stdout: stdout, Logf: logf,
	})
	return pingExit(err, stderr, name)
}
