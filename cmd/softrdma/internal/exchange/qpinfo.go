package exchange

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// QPInfo is what one side tells the other about one of its QPs: perftest's
// struct pingpong_dest (GID, QPN, PSN, rkey, vaddr) with the RoCEv2 UDP
// port in place of the LID and the size of the buffer at VAddr.
type QPInfo struct {
	GID   [16]byte // the device's IP address as a GID (IPv4-mapped for IPv4)
	Port  uint16   // the device's UDP port
	QPN   uint32   // 24 bits
	PSN   uint32   // first PSN the QP sends; 24 bits
	RKey  uint32   // remote key of the buffer
	VAddr uint64   // IOVA of the buffer
	Size  uint64   // bytes at VAddr the peer may access
}

// Addr returns the device address the peer sends to.
func (q *QPInfo) Addr() netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom16(q.GID).Unmap(), q.Port)
}

// QPInfoSize is the encoded size of one QPInfo.
const QPInfoSize = 16 + 2 + 2 + 4 + 4 + 4 + 8 + 8

// MaxQPs bounds the QPs of one exchange (perftest's MAX_QP_NUM).
const MaxQPs = 16384

var errShortQPs = errors.New("exchange: QP list truncated")

// AppendQPInfos appends the encoding of qs: a 4-byte big-endian count, then
// per QP the GID, port, 2 reserved bytes, QPN, PSN, rkey, vaddr and size,
// big-endian.
func AppendQPInfos(b []byte, qs []QPInfo) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(qs)))
	for i := range qs {
		q := &qs[i]
		b = append(b, q.GID[:]...)
		b = binary.BigEndian.AppendUint16(b, q.Port)
		b = append(b, 0, 0)
		b = binary.BigEndian.AppendUint32(b, q.QPN)
		b = binary.BigEndian.AppendUint32(b, q.PSN)
		b = binary.BigEndian.AppendUint32(b, q.RKey)
		b = binary.BigEndian.AppendUint64(b, q.VAddr)
		b = binary.BigEndian.AppendUint64(b, q.Size)
	}
	return b
}

// ParseQPInfos decodes what AppendQPInfos encoded; trailing bytes are an
// error.
func ParseQPInfos(b []byte) ([]QPInfo, error) {
	if len(b) < 4 {
		return nil, errShortQPs
	}
	n := binary.BigEndian.Uint32(b)
	b = b[4:]
	if n > MaxQPs {
		return nil, fmt.Errorf("exchange: %d QPs (max %d)", n, MaxQPs)
	}
	if len(b) != int(n)*QPInfoSize {
		return nil, fmt.Errorf("%w: %d QPs in %d bytes", errShortQPs, n, len(b))
	}
	qs := make([]QPInfo, n)
	for i := range qs {
		q := &qs[i]
		copy(q.GID[:], b)
		q.Port = binary.BigEndian.Uint16(b[16:])
		q.QPN = binary.BigEndian.Uint32(b[20:])
		q.PSN = binary.BigEndian.Uint32(b[24:])
		q.RKey = binary.BigEndian.Uint32(b[28:])
		q.VAddr = binary.BigEndian.Uint64(b[32:])
		q.Size = binary.BigEndian.Uint64(b[40:])
		if q.QPN > 0xffffff || q.PSN > 0xffffff {
			return nil, fmt.Errorf("exchange: QP %d: QPN %#x or PSN %#x exceeds 24 bits", i, q.QPN, q.PSN)
		}
		b = b[QPInfoSize:]
	}
	return qs, nil
}

// QPExchanger exchanges per-QP connection data with the peer: the client
// sends first, the server answers (as perftest's ctx_hand_shake).
type QPExchanger interface {
	ExchangeQPs(ctx context.Context, server bool, local []QPInfo) (remote []QPInfo, err error)
	// Name describes the method for the banner ("Data ex. method").
	Name() string
}

// Native is softrdma's QPExchanger: one MsgQPs frame each way.
type Native struct{ C *Conn }

// Name implements QPExchanger.
func (Native) Name() string { return "Ethernet (TCP, softrdma framing)" }

// ExchangeQPs implements QPExchanger. The peer must describe as many QPs
// as local.
func (n Native) ExchangeQPs(ctx context.Context, server bool, local []QPInfo) ([]QPInfo, error) {
	send := func() error { return n.C.Send(MsgQPs, AppendQPInfos(nil, local)) }
	if !server {
		if err := send(); err != nil {
			return nil, err
		}
	}
	b, err := n.C.Recv(ctx, MsgQPs)
	if err != nil {
		return nil, err
	}
	remote, err := ParseQPInfos(b)
	if err != nil {
		return nil, err
	}
	if server {
		if err := send(); err != nil {
			return nil, err
		}
	}
	if len(remote) != len(local) {
		return nil, fmt.Errorf("exchange: peer has %d QPs, this side %d", len(remote), len(local))
	}
	return remote, nil
}
