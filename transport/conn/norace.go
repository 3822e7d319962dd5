//go:build !race

package conn

import "net/netip"

const raceEnabled = false

func raceReleaseTo(netip.AddrPort) {}

func raceAcquireAt(netip.AddrPort) {}
