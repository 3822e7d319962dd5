//go:build race

package conn

import (
	"net/netip"
	"sync"
	"sync/atomic"
)

const raceEnabled = true

// raceLinks holds, per local address of a UDPConn in this process, the
// variable that orders what senders to it did before a send before what
// its receiver does after the receive.
var raceLinks sync.Map // netip.AddrPort -> *atomic.Uint64

func raceLink(a netip.AddrPort) *atomic.Uint64 {
	a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	if v, ok := raceLinks.Load(a); ok {
		return v.(*atomic.Uint64)
	}
	v, _ := raceLinks.LoadOrStore(a, new(atomic.Uint64))
	return v.(*atomic.Uint64)
}

// raceReleaseTo tells the race detector that what this goroutine did so
// far happens before the receive, by the conn bound to dst, of the
// datagram about to be sent there. A datagram is a synchronisation the
// detector cannot see: sendmmsg and recvmmsg are raw system calls, without
// the annotations syscall.Write and syscall.Read carry (their ioSync), so
// two devices of one process that talk over loopback UDP look
// unsynchronised to it, and an RDMA WRITE placed by the responder's
// receive loop races, for the detector, with the requester's application
// reading the buffer after the ACK's completion. An atomic add is a
// release, and merges into what the receiver acquires (the Go memory
// model: an atomic operation observed by another is synchronized before
// it). Ordering every earlier send to dst before the receive is a little
// more than the kernel promises (the datagrams to one socket are not
// ordered among senders); it hides no race within one device.
func raceReleaseTo(dst netip.AddrPort) { raceLink(dst).Add(1) }

// raceAcquireAt is the receive side of raceReleaseTo: called after
// datagrams arrived at the conn bound to local.
func raceAcquireAt(local netip.AddrPort) { raceLink(local).Load() }
