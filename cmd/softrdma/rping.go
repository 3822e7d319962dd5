package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/rping"
)

// rpingCmd holds the flags of `softrdma rping`: rping's (same letters and
// defaults; rdma-core librdmacm/examples/rping.c), then softrdma's own.
type rpingCmd struct {
	Server   bool   `short:"s" help:"Server side: listen on -a (default: the host's only non-loopback address; softrdma's device has one address) and -p."`
	Client   bool   `short:"c" help:"Client side: connect to the server at -a and -p."`
	Addr     string `short:"a" placeholder:"ADDR" help:"Address: the server's (client) or the one to bind (server)."`
	Source   string `short:"I" placeholder:"ADDR" help:"Source address to bind to for the client."`
	Port     int    `short:"p" default:"7174" help:"rdma_cm port (RDMA_PS_TCP)."`
	Count    int    `short:"C" help:"Ping count (client; 0: until interrupted)."`
	Size     int    `short:"S" default:"64" help:"Ping data size in bytes (26 to 65535)."`
	Verbose  bool   `short:"v" help:"Display ping data to stdout."`
	Validate bool   `short:"V" help:"Validate ping data (client)."`
	Debug    bool   `short:"d" help:"Debug printfs."`
	SelfQP   bool   `short:"q" help:"Use a self-created, self-modified QP (accepted: softrdma's QPs always are)."`
	Persist  bool   `short:"P" help:"Persistent server (not supported: one connection per run)."`

	Bind     string        `placeholder:"IP[:PORT]" help:"RoCEv2 address of this side's device. Default: -a on the server, -I or the address routed to the server on the client; UDP port 4791."`
	RoCEPort *int          `name:"roce-port" placeholder:"PORT" help:"UDP port of the server's device (client; default 4791)."`
	Pcap     string        `placeholder:"FILE" help:"Record every datagram sent and received in a pcap file."`
	Stat     bool          `help:"Print the device's non-zero counters at the end."`
	Timeout  time.Duration `placeholder:"DURATION" help:"Give up connecting after this long (default: the CM's 15 retries of 4.3 s)."`

	ConnectTimeout time.Duration `name:"connect-timeout" placeholder:"DURATION" help:"Client: keep trying while the server refuses (REJ invalid service ID: not listening yet) for this long (default: one attempt, as rping)."`
	IdleTimeout    time.Duration `name:"idle-timeout" default:"10s" placeholder:"DURATION" help:"Once connected, fail when no completion and no packet from the peer came for this long: a peer killed with SIGKILL sends no DREQ (softrdma's CM is in its process) and the QP retries for ever (0: wait for ever, as rping). 100ms to 24h."`
}

func (c *rpingCmd) run(ctx context.Context, stdout, stderr io.Writer) int {
	if c.Persist {
		fmt.Fprintln(stderr, "softrdma: rping: -P (persistent server) is not supported; run once per client")
		return exitUsage
	}
	if c.Size == 0 { // rping.Options takes 0 for the default; rping refuses it
		fmt.Fprintf(stderr, "softrdma: rping: Invalid size 0 (valid range is %d to %d)\n", rping.MinSize, rping.MaxSize)
		return exitUsage
	}
	if c.Port == 0 { // rping.Options takes 0 for the default
		fmt.Fprintln(stderr, "softrdma: rping: -p 0: not a port (1 to 65535; default 7174)")
		return exitUsage
	}
	if c.RoCEPort != nil && (*c.RoCEPort < 1 || *c.RoCEPort > 65535) {
		fmt.Fprintf(stderr, "softrdma: rping: --roce-port %d: not a UDP port (1 to 65535; default 4791)\n", *c.RoCEPort)
		return exitUsage
	}
	if err := cmp.Or(checkTimeout("--timeout", c.Timeout), checkConnectTimeout(c.ConnectTimeout),
		checkIdleTimeout("--idle-timeout", c.IdleTimeout), checkPcap(c.Pcap)); err != nil {
		fmt.Fprintf(stderr, "softrdma: rping: %v\n", err)
		return exitUsage
	}
	err := rping.Run(ctx, rping.Options{Server: c.Server, Client: c.Client, Addr: c.Addr, Source: c.Source,
		Port: c.Port, Count: c.Count, Size: c.Size, Verbose: c.Verbose, Validate: c.Validate, Debug: c.Debug,
		Bind: c.Bind, RoCEPort: portOr0(c.RoCEPort), Pcap: c.Pcap, Stat: c.Stat, Timeout: c.Timeout, ConnectTimeout: c.ConnectTimeout, IdleTimeout: c.IdleTimeout,
		Stdout: stdout, Stderr: stderr})
	var ue *rping.UsageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "softrdma: rping: %v\n", err)
		return exitUsage
	}
	fmt.Fprintf(stderr, "softrdma: rping: %v\n", interrupted(err))
	return exitFail
}
