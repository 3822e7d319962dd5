// Command softrdma runs the software RDMA NIC's tools: perftest-style
// benchmarks (write-bw, write-lat, read-bw, read-lat, send-bw, send-lat,
// atomic-bw) between a server and a client, and a self-contained demo.
//
//	softrdma write-bw                 # server: waits for a client
//	softrdma write-bw 127.0.0.1       # client: connects and runs
//	softrdma demo                     # two emulated hosts in one process
//
// See docs/cli.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/alecthomas/kong"

	"github.com/softrdma/softrdma/cmd/softrdma/internal/demo"
	"github.com/softrdma/softrdma/cmd/softrdma/internal/perf"
)

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // the test failed, including a verification mismatch
	exitUsage = 2 // bad command line
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first Ctrl-C or SIGTERM cancels ctx, and the commands end
	// cleanly; a second one ends the process (the signal's default
	// action), whatever it waits for: a system call that no context
	// ends, such as opening a FIFO that no writer opens, ignored them all.
	go func() {
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// interrupted says "interrupted" for an error that only says the run was
// cancelled (Ctrl-C or SIGTERM cancels the commands' context), instead of
// Go's "context canceled", keeping a note in parentheses after it ("(--out
// FILE was not written)"); other errors are returned as they are.
func interrupted(err error) any {
	if err == nil {
		return err
	}
	if note, ok := strings.CutPrefix(err.Error(), context.Canceled.Error()); ok && (note == "" || strings.HasPrefix(note, " (")) {
		return "interrupted" + note
	}
	return err
}

// run parses args and runs the command; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	exited := -1
	parser, err := newParser(&c, stdout, stderr, func(code int) { exited = code })
	if err != nil {
		fmt.Fprintf(stderr, "softrdma: %s\n", errText(err))
		return exitFail
	}
	kctx, err := parser.Parse(joinNegativeValues(parser.Model, args))
	if exited >= 0 { // --help
		return exited
	}
	if err != nil {
		fmt.Fprintf(stderr, "softrdma: %v (see %s --help)\n", err, helpFor(err))
		return exitUsage
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) }
	cmd := strings.Fields(kctx.Command())[0]
	if cmd == "demo" {
		err := c.Demo.check()
		if err == nil {
			err = demo.Run(ctx, demo.Options{File: c.Demo.File, Size: int64(c.Demo.Size), Impair: c.Demo.Impair,
				Pcap: c.Demo.Pcap, Timeout: c.Demo.Timeout, Stdout: stdout, Logf: logf})
		}
		if err != nil {
			if errors.Is(err, perf.ErrUsage) {
				fmt.Fprintf(stderr, "softrdma: demo: %v\n", err)
				return exitUsage
			}
			if !errors.Is(err, demo.ErrFailed) && !errors.Is(err, demo.ErrInterrupted) { // those said it on stdout
				fmt.Fprintf(stderr, "softrdma: %s\n", errText(err))
			}
			return exitFail
		}
		return exitOK
	}
	if cmd == "rc-pingpong" {
		return c.Pingpong.run(ctx, stdout, stderr)
	}
	if cmd == "uc-pingpong" {
		return c.UCPing.runUC(ctx, stdout, stderr)
	}
	if cmd == "ud-pingpong" {
		return c.UDPing.run(ctx, stdout, stderr)
	}
	if cmd == "rping" {
		return c.RPing.run(ctx, stdout, stderr)
	}
	if cmd == "bench" {
		return c.Bench.Scopes.run(ctx, stdout, stderr)
	}
	test, err := perf.ParseTest(cmd)
	if err != nil {
		fmt.Fprintf(stderr, "softrdma: %s\n", errText(err))
		return exitUsage
	}
	o, err := c.tool(test).options(test)
	if err != nil {
		fmt.Fprintf(stderr, "softrdma: %s\n", errText(err))
		return exitUsage
	}
	o.Stdout, o.Logf = stdout, logf
	if _, err := perf.Run(ctx, o); err != nil {
		fmt.Fprintf(stderr, "softrdma: %s: %v\n", test, interrupted(errors.New(errText(err))))
		if errors.Is(err, perf.ErrUsage) {
			return exitUsage
		}
		return exitFail
	}
	return exitOK
}

// helpFor names the help that lists the flags of a parse error's
// command: "softrdma write-bw" when a subcommand was selected (the
// top-level help lists only the commands), else "softrdma".
func helpFor(err error) string {
	var pe *kong.ParseError
	if errors.As(err, &pe) && pe.Context != nil {
		if cmd := pe.Context.Selected(); cmd != nil {
			return cmd.FullPath() // "softrdma write-bw"
		}
	}
	return "softrdma"
}

// newParser returns the command-line parser filling c; exit is called
// instead of os.Exit after --help.
func newParser(c *cli, stdout, stderr io.Writer, exit func(int)) (*kong.Kong, error) {
	return kong.New(c,
		kong.Name("softrdma"),
		kong.Description("A software RDMA NIC (RoCEv2 over UDP): perftest-style tools and a demo."),
		kong.Writers(stdout, stderr),
		kong.Exit(exit),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.Vars{"sport_help": sportHelp},
	)
}

// tool returns the flags of test's subcommand.
func (c *cli) tool(t perf.Test) *toolCmd {
	switch t {
	case perf.WriteBW:
		return &c.WriteBW
	case perf.WriteLat:
		return &c.WriteLat
	case perf.ReadBW:
		return &c.ReadBW
	case perf.ReadLat:
		return &c.ReadLat
	case perf.SendBW:
		return &c.SendBW
	case perf.SendLat:
		return &c.SendLat
	}
	return &c.AtomicBW
}

// errText is err's message without the package prefixes that the
// command's own prefix already says ("softrdma: ", then "scopes: "), so
// that a message reads "softrdma: open …" rather than "softrdma: softrdma:
// open …".
func errText(err error) string {
	s := err.Error()
	for _, p := range []string{"softrdma: ", "scopes: "} {
		s = strings.TrimPrefix(s, p)
	}
	return s
}
