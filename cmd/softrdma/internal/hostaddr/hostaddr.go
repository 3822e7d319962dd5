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
