package scopes

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/softrdma/softrdma"
)

// Netns is two network namespaces joined by a veth pair (MTU 9000, so
// that 4096-byte RoCE payloads fit), each with one address: the two
// devices of the experiment then talk over a real link between two
// network stacks instead of loopback. One process holds both devices:
// each device's UDP socket is created inside its namespace (OpenIn), and
// a socket keeps the namespace it was created in.
type Netns struct {
	A, B         string     // names under /var/run/netns
	AddrA, AddrB netip.Addr // the veth ends' addresses
	created      bool       // NewNetns made them: Close deletes them
}

// NewNetns creates the namespaces and the veth pair with iproute2's ip
// (names and a 10.234.x.0/24 subnet derived from the process ID). It
// needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN). Close deletes them.
func NewNetns() (*Netns, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("scopes: network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("scopes: network namespaces need iproute2's ip: %w", err)
	}
	pid := os.Getpid()
	id := pid % 200
	n := &Netns{
		A: fmt.Sprintf("srdma-scopes-a-%d", pid), B: fmt.Sprintf("srdma-scopes-b-%d", pid),
		AddrA: netip.MustParseAddr(fmt.Sprintf("10.234.%d.1", id)),
		AddrB: netip.MustParseAddr(fmt.Sprintf("10.234.%d.2", id)),
	}
	vA, vB := fmt.Sprintf("srsc%da", pid%100000), fmt.Sprintf("srsc%db", pid%100000)
	ip := func(args ...string) error {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("scopes: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := ip("netns", "add", n.A); err != nil {
		return nil, err
	}
	n.created = true
	steps := [][]string{
		{"netns", "add", n.B},
		{"link", "add", vA, "netns", n.A, "type", "veth", "peer", "name", vB, "netns", n.B},
	}
	for _, c := range []struct {
		ns, dev string
		addr    netip.Addr
	}{{n.A, vA, n.AddrA}, {n.B, vB, n.AddrB}} {
		steps = append(steps,
			[]string{"-n", c.ns, "link", "set", "lo", "up"},
			[]string{"-n", c.ns, "link", "set", c.dev, "mtu", "9000", "up"},
			[]string{"-n", c.ns, "addr", "add", c.addr.String() + "/24", "dev", c.dev})
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			_ = n.Close()
			return nil, err
		}
	}
	return n, nil
}

// Close deletes the namespaces NewNetns created (the veth pair goes with
// them).
func (n *Netns) Close() error {
	if n == nil || !n.created {
		return nil
	}
	n.created = false
	var errs []error
	for _, ns := range []string{n.A, n.B} {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil &&
			!strings.Contains(string(out), "No such file") {
			errs = append(errs, fmt.Errorf("scopes: ip netns del %s: %w: %s", ns, err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

// OpenIn opens a device whose UDP socket is created inside the network
// namespace ns (a name under /var/run/netns). It runs softrdma.Open on a
// locked OS thread that enters ns and goes back to the process's
// namespace afterwards; if it cannot go back, the thread stays locked and
// exits with its goroutine, so no other goroutine runs in ns. The Go
// runtime starts new threads from its template thread, not from a locked
// one, so the device's goroutines do not inherit ns either; only the
// socket lives there.
func OpenIn(ns string, cfg softrdma.Config) (*softrdma.Device, error) {
	type res struct {
		d   *softrdma.Device
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{err: fmt.Errorf("scopes: own network namespace: %w", err)}
			return
		}
		defer unix.Close(orig)
		fd, err := unix.Open("/var/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{err: fmt.Errorf("scopes: network namespace %s: %w", ns, err)}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- res{err: fmt.Errorf("scopes: enter network namespace %s: %w", ns, err)}
			return
		}
		d, err := softrdma.Open(cfg)
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and exits with this goroutine
		if err != nil {
			err = fmt.Errorf("scopes: in network namespace %s: %w", ns, err)
		}
		ch <- res{d, err}
	}()
	r := <-ch
	return r.d, r.err
}
