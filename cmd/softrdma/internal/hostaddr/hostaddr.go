// Package hostaddr picks the address of a device that a tool binds
// without being told where: the host's only usable address. A stock
// server (perftest -R, rping -s) listens on every address; a softrdma
// device has one.
package hostaddr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
)

// ErrNone: the host has no address but loopback and link-local ones.
var ErrNone = errors.New("this host has no address but loopback")

// Sole returns the host's only non-loopback, non-link-local unicast
// address, IPv4 preferred (one IPv4 address wins over any number of IPv6
// ones). Errors: ErrNone, or an error listing the candidates when there
// are several.
func Sole() (netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Addr{}, err
	}
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		pfx, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := pfx.Addr().Unmap()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsMulticast() {
			continue
		}
		if ip.Is4() {
			v4 = append(v4, ip)
		} else {
			v6 = append(v6, ip)
		}
	}
	switch {
	case len(v4) == 1:
		return v4[0], nil
	case len(v4) == 0 && len(v6) == 1:
		return v6[0], nil
	case len(v4)+len(v6) == 0:
		return netip.Addr{}, ErrNone
	}
	return netip.Addr{}, fmt.Errorf("this host has several addresses (%v)", slices.Concat(v4, v6))
}

// ListenAll listens for a tool's TCP exchange on port of every address,
// as perftest's and rc_pingpong's servers do (getaddrinfo with
// AI_PASSIVE). device is the address the tool's RoCE device binds, if
// known (--bind). Go's "tcp" ":port" (and "[::]:port" alike) listens on
// IPv4 alone when the process finds no IPv6 loopback (a fresh network
// namespace whose lo is still down, as after `ip netns add`), which
// leaves a client of an IPv6 device refused; so for an IPv6 device it
// listens on "tcp6" "[::]:port": every IPv6 address (a client reaching
// it over IPv4 would give its own device an IPv4 address, which cannot
// talk to an IPv6 device anyway).
func ListenAll(port int, device netip.Addr) (net.Listener, error) {
	if device.Is6() && !device.Is4In6() {
		return net.Listen("tcp6", net.JoinHostPort("::", strconv.Itoa(port)))
	}
	return net.Listen("tcp", ":"+strconv.Itoa(port))
}
