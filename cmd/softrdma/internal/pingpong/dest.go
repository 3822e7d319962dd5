// Package pingpong is `softrdma rc-pingpong`: a peer of rdma-core's
// ibv_rc_pingpong (libibverbs/examples/rc_pingpong.c) that speaks its
// out-of-band exchange byte for byte and runs its SEND/RECV ping-pong over
// an RC QP, so that a stock ibv_rc_pingpong on Linux rxe (or any RDMA NIC)
// and softrdma run one test together, either side as the server.
//
// The exchange, over one TCP connection (port 18515 by default):
//
//	client -> server  "LLLL:QQQQQQ:PPPPPP:GGGG…G\0"  52 bytes: LID, QPN, PSN in hex, GID as 32 hex digits
//	server -> client  the same for the server (sent after its QP is in RTS)
//	client -> server  "done\0"                        5 bytes
//
// then both close the connection and ping-pong SENDs of -s bytes, -n
// times, the client first; each side echoes the buffer it received.
package pingpong

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// DefaultPort is rc_pingpong's default TCP port.
const DefaultPort = 18515

// MsgSize is the size of one address message: sizeof
// "0000:000000:000000:00000000000000000000000000000000", NUL included.
const MsgSize = len("0000:000000:000000:00000000000000000000000000000000") + 1

// Done is what the client sends after reading the server's message
// (write(sockfd, "done", sizeof "done")).
var Done = [5]byte{'d', 'o', 'n', 'e', 0}

// ErrBadMsg reports an address message that does not parse.
var ErrBadMsg = errors.New("pingpong: malformed address message")

// Dest is what each side tells the other (struct pingpong_dest).
type Dest struct {
	LID uint16   // 0 on RoCE (ibv_port_attr.lid of an Ethernet port)
	QPN uint32   // 24 bits
	PSN uint32   // 24 bits: the sender's first send PSN
	GID [16]byte // the sender's GID at its -g index; zero without -g
}

// Marshal returns the 52-byte message: sprintf("%04x:%06x:%06x:%s") of
// LID, QPN, PSN and gid_to_wire_gid's 32 hex digits, and the NUL.
func (d *Dest) Marshal() [MsgSize]byte {
	var m [MsgSize]byte
	// gid_to_wire_gid prints the GID's four 32-bit words, each read in
	// network order, with %08x: the 16 bytes in order as hex.
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN, d.PSN, hex.EncodeToString(d.GID[:]))
	copy(m[:], s) // %04x of a uint16 and %06x of 24-bit values fit exactly
	return m
}

// Parse reads a message the way the examples do (sscanf "%x:%x:%x:%s" then
// wire_gid_to_gid): hex fields separated by ':', text up to the first NUL.
// It is strict where sscanf would silently leave fields unset: all four
// fields must be present and the GID must be 32 hex digits.
func Parse(msg []byte) (Dest, error) {
	s := string(msg)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	f := strings.Split(s, ":")
	if len(f) != 4 {
		return Dest{}, fmt.Errorf("%w: %q", ErrBadMsg, s)
	}
	var d Dest
	lid, err1 := strconv.ParseUint(f[0], 16, 16)
	qpn, err2 := strconv.ParseUint(f[1], 16, 24)
	psn, err3 := strconv.ParseUint(f[2], 16, 24)
	gid, err4 := hex.DecodeString(f[3])
	if err := errors.Join(err1, err2, err3, err4); err != nil || len(gid) != 16 {
		return Dest{}, fmt.Errorf("%w: %q", ErrBadMsg, s)
	}
	d.LID, d.QPN, d.PSN = uint16(lid), uint32(qpn), uint32(psn)
	copy(d.GID[:], gid)
	return d, nil
}

// GIDString formats a GID as inet_ntop(AF_INET6) does ("::ffff:192.168.77.10",
// "::" for the zero GID).
func GIDString(gid [16]byte) string { return netip.AddrFrom16(gid).String() }

// HasGRH reports whether a peer with this GID is addressed through a GRH:
// pp_connect_ctx sets is_global only if the GID's interface ID (its low 8
// bytes) is non-zero.
func HasGRH(gid [16]byte) bool {
	for _, b := range gid[8:] {
		if b != 0 {
			return true
		}
	}
	return false
}

// GIDAddr returns the IP address a RoCEv2 GID stands for: an IPv4-mapped
// GID (::ffff:a.b.c.d, rxe's index 1 for an IPv4 address) is that IPv4
// address, any other the IPv6 address itself.
func GIDAddr(gid [16]byte) netip.Addr { return netip.AddrFrom16(gid).Unmap() }
