package softrdma_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/softrdmatest"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// wireLog is a conn.Tap that records every RoCE packet a device sends or
// receives: opcode, AckReq, and for received packets the IPv4 ID.
type wireLog struct {
	mu   sync.Mutex
	pkts []wireRec
}

type wireRec struct {
	dir    conn.Direction
	op     wire.Opcode
	ackReq bool
	ipID   uint16
	src    netip.AddrPort
}

func (w *wireLog) Packet(dir conn.Direction, src, dst netip.AddrPort, ipID uint16, roce []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pkts = append(w.pkts, wireRec{dir: dir, op: wire.Opcode(roce[0]), ackReq: wire.BTH(roce).AckReq(), ipID: ipID, src: src})
}

func (w *wireLog) records() []wireRec {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]wireRec(nil), w.pkts...)
}

// dropConn drops, on send, the first packet drop selects.
type dropConn struct {
	conn.Conn
	mu      sync.Mutex
	drop    func(roce []byte) bool
	dropped int
}

func (c *dropConn) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped
}

func (c *dropConn) Send(pkts []conn.Packet) error {
	c.mu.Lock()
	out := make([]conn.Packet, 0, len(pkts))
	for _, p := range pkts {
		if c.dropped == 0 && c.drop(p.Buf) {
			c.dropped++
			continue
		}
		out = append(out, p)
	}
	c.mu.Unlock()
	if len(out) == 0 {
		return nil
	}
	return c.Conn.Send(out)
}

// dgPair opens two devices (transport "pipe", "udp4" or "udp6") with a QP
// of type typ each, taps on both, and wrapA around A's conn if not nil.
func dgPair(t *testing.T, typ softrdma.QPType, transport string, wrapA func(conn.Conn) conn.Conn) (a, b *softrdmatest.Side, la, lb *wireLog) {
	t.Helper()
	var ca, cb softrdma.Config
	switch transport {
	case "pipe":
		pa, pb := conn.NewPipe()
		ca.Conn, cb.Conn = pa, pb
	case "udp4":
		ca.Addr = netip.MustParseAddrPort("127.0.0.1:0")
		cb.Addr = ca.Addr
	case "udp6":
		ca.Addr = netip.MustParseAddrPort("[::1]:0")
		cb.Addr = ca.Addr
	}
	la, lb = new(wireLog), new(wireLog)
	ca.Tap, cb.Tap = la, lb
	ca.Logf, cb.Logf = t.Logf, t.Logf
	open := func(cfg softrdma.Config, wrap func(conn.Conn) conn.Conn) *softrdmatest.Side {
		if wrap != nil {
			if cfg.Conn == nil {
				c, err := conn.Listen(conn.Config{Addr: cfg.Addr, Tap: cfg.Tap})
				require.NoError(t, err)
				cfg.Conn = c
			}
			cfg.Conn = wrap(cfg.Conn)
		}
		dev, err := softrdma.Open(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { dev.Close() })
		pd, err := dev.AllocPD()
		require.NoError(t, err)
		cq, err := dev.CreateCQ(256)
		require.NoError(t, err)
		qp, err := dev.CreateQP(pd, softrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: typ,
			Cap: softrdma.Cap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2}})
		require.NoError(t, err)
		return &softrdmatest.Side{Dev: dev, PD: pd, CQ: cq, QP: qp}
	}
	a, b = open(ca, wrapA), open(cb, nil)
	debugQPs = []*softrdma.QP{a.QP, b.QP}
	debugDevs = []*softrdma.Device{a.Dev, b.Dev}
	return a, b, la, lb
}

// connectUC connects two UC QPs with a 1024-byte path MTU.
func connectUC(t *testing.T, a, b *softrdmatest.Side) {
	t.Helper()
	o := softrdma.ConnectOptions{MTU: softrdma.MTU1024}
	require.NoError(t, softrdma.Connect(a.QP, softrdma.Endpoint{Addr: b.Dev.LocalAddr(), QPN: b.QP.QPN(), PSN: 200}, 100, o))
	require.NoError(t, softrdma.Connect(b.QP, softrdma.Endpoint{Addr: a.Dev.LocalAddr(), QPN: a.QP.QPN(), PSN: 100}, 200, o))
	require.Equal(t, softrdma.QPStateRTS, a.QP.State())
}

// waitCounter waits until a device counter reaches want.
func waitCounter(t *testing.T, d *softrdma.Device, name string, want uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for counter(d, name) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s = %d, want %d", name, counter(d, name), want)
		}
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, want, counter(d, name), name)
}

// noAcks checks that only UC request packets, none asking for an ACK,
// crossed the wire (UC has no acknowledgements: no AckReq, no ACK).
func noAcks(t *testing.T, logs ...*wireLog) {
	t.Helper()
	for _, l := range logs {
		for _, r := range l.records() {
			require.Equal(t, wire.OpUC, r.op.Transport(), "only UC packets: %v", r.op)
			require.False(t, r.ackReq, "AckReq on %v", r.op)
		}
	}
}

// TestUCWriteAndSendByteExact: UC RDMA WRITE, WRITE with immediate and
// SEND with immediate of several path MTUs arrive byte-exact, over the
// pipe and loopback UDP, and no ACK crosses the wire.
func TestUCWriteAndSendByteExact(t *testing.T) {
	for _, tr := range []string{"pipe", "udp4", "udp6"} {
		t.Run(tr, func(t *testing.T) {
			a, b, la, lb := dgPair(t, softrdma.QPTypeUC, tr, nil)
			connectUC(t, a, b)
			const n = 10000
			src, srcMR := reg(t, a, n, rw)
			dst, dstMR := reg(t, b, 3*n, rw)
			fill(1, src)
			sgl := []softrdma.SGE{{Addr: srcMR.Addr(), Length: n, LKey: srcMR.LKey()}}
			_, err := b.QP.PostRecv(
				softrdma.RecvWR{WRID: 1, SGL: []softrdma.SGE{{Addr: dstMR.Addr() + 2*n, Length: n, LKey: dstMR.LKey()}}},
				softrdma.RecvWR{WRID: 2})
			require.NoError(t, err)
			_, err = a.QP.PostSend(
				softrdma.SendWR{WRID: 10, Opcode: softrdma.WRRDMAWrite, Flags: softrdma.SendSignaled, SGL: sgl,
					RemoteAddr: dstMR.Addr(), RKey: dstMR.RKey()},
				softrdma.SendWR{WRID: 11, Opcode: softrdma.WRSendWithImm, Flags: softrdma.SendSignaled, SGL: sgl, ImmData: 0x5a5a},
				softrdma.SendWR{WRID: 12, Opcode: softrdma.WRRDMAWriteWithImm, Flags: softrdma.SendSignaled, SGL: sgl,
					RemoteAddr: dstMR.Addr() + n, RKey: dstMR.RKey(), ImmData: 0x7777})
			require.NoError(t, err)
			swc := waitWC(t, a.CQ, 3)
			require.Equal(t, []softrdma.WCOpcode{softrdma.WCRDMAWrite, softrdma.WCSend, softrdma.WCRDMAWrite},
				[]softrdma.WCOpcode{swc[0].Opcode, swc[1].Opcode, swc[2].Opcode})
			for _, wc := range swc {
				require.Equal(t, softrdma.WCSuccess, wc.Status)
			}
			rwc := waitWC(t, b.CQ, 2)
			require.Equal(t, softrdma.WC{WRID: 1, Status: softrdma.WCSuccess, Opcode: softrdma.WCRecv, ByteLen: n,
				ImmData: 0x5a5a, QPN: uint32(b.QP.QPN()), SrcQP: uint32(a.QP.QPN()), Flags: softrdma.WCWithImm}, rwc[0])
			require.Equal(t, softrdma.WC{WRID: 2, Status: softrdma.WCSuccess, Opcode: softrdma.WCRecvRDMAWithImm, ByteLen: n,
				ImmData: 0x7777, QPN: uint32(b.QP.QPN()), SrcQP: uint32(a.QP.QPN()), Flags: softrdma.WCWithImm}, rwc[1])
			for i := range 3 {
				require.True(t, bytes.Equal(src, dst[i*n:(i+1)*n]), "message %d not byte-exact", i)
			}
			noAcks(t, la, lb)
			require.Len(t, la.records(), 3*10, "three messages of 10 packets (MTU 1024), all sent by A")
			require.Zero(t, counter(a.Dev, "rcvd_pkts"), "A received nothing: no ACK")
			require.Equal(t, uint64(30), counter(b.Dev, "rcvd_pkts"))
			require.Zero(t, counter(b.Dev, "naks_sent"))
		})
	}
}

// TestUCLostMiddlePacketDropsMessage: the first SEND MIDDLE A sends is
// lost on the wire; B drops the rest of that message (IBTA: a UC responder
// that misses a packet discards the message and resumes at the next FIRST
// or ONLY), the next message arrives whole, and the sender, which nothing
// tells, completes both.
func TestUCLostMiddlePacketDropsMessage(t *testing.T) {
	for _, tr := range []string{"pipe", "udp4"} {
		t.Run(tr, func(t *testing.T) {
			var dc *dropConn
			a, b, la, lb := dgPair(t, softrdma.QPTypeUC, tr, func(c conn.Conn) conn.Conn {
				dc = &dropConn{Conn: c, drop: func(roce []byte) bool { return wire.Opcode(roce[0]) == wire.OpUC|wire.OpSendMiddle }}
				return dc
			})
			connectUC(t, a, b)
			src, srcMR := reg(t, a, 8192, rw)
			dst, dstMR := reg(t, b, 8192, rw)
			fill(2, src)
			_, err := b.QP.PostRecv(
				softrdma.RecvWR{WRID: 1, SGL: []softrdma.SGE{{Addr: dstMR.Addr(), Length: 4096, LKey: dstMR.LKey()}}},
				softrdma.RecvWR{WRID: 2, SGL: []softrdma.SGE{{Addr: dstMR.Addr() + 4096, Length: 4096, LKey: dstMR.LKey()}}})
			require.NoError(t, err)
			_, err = a.QP.PostSend(
				softrdma.SendWR{WRID: 10, Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
					SGL: []softrdma.SGE{{Addr: srcMR.Addr(), Length: 4096, LKey: srcMR.LKey()}}}, // FIRST, MIDDLE (lost), MIDDLE, LAST
				softrdma.SendWR{WRID: 11, Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
					SGL: []softrdma.SGE{{Addr: srcMR.Addr() + 4096, Length: 2000, LKey: srcMR.LKey()}}}) // FIRST, LAST
			require.NoError(t, err)
			swc := waitWC(t, a.CQ, 2)
			require.Equal(t, softrdma.WCSuccess, swc[0].Status)
			require.Equal(t, softrdma.WCSuccess, swc[1].Status)
			rwc := waitWC(t, b.CQ, 1)
			require.Equal(t, uint64(1), rwc[0].WRID, "the lost message's WQE takes the next message")
			require.Equal(t, uint32(2000), rwc[0].ByteLen)
			require.True(t, bytes.Equal(src[4096:4096+2000], dst[:2000]), "second message not byte-exact")
			waitCounter(t, b.Dev, "rcvd_pkts", 5)
			require.Equal(t, uint64(2), counter(b.Dev, "drop_uc_message_lost"), "the MIDDLE and LAST after the gap")
			require.Equal(t, 1, dc.count())
			n, err := b.CQ.Poll(make([]softrdma.WC, 4))
			require.NoError(t, err)
			require.Zero(t, n, "no completion for the lost message")
			require.Equal(t, softrdma.QPStateRTS, b.QP.State())
			noAcks(t, la, lb)
		})
	}
}

// udPeers makes A and B's UD QPs ready with Q_Key qkey.
func udPeers(t *testing.T, a, b *softrdmatest.Side, qkey uint32) {
	t.Helper()
	require.NoError(t, softrdma.InitUD(a.QP, qkey, 0x57ff0c))
	require.NoError(t, softrdma.InitUD(b.QP, qkey, 0xb5d735))
}

// TestUDBetweenDevices: UD SEND and SEND with immediate between two
// devices; each receive starts with the GRH holding the IP header the
// datagram arrived with (IPv4: 20 zero bytes, then version/IHL 0x45, TOS 0,
// total length, the ID on the wire, DF, TTL 64, UDP, a valid checksum, the
// addresses; IPv6: version 6, traffic class 0, payload length, UDP, hop
// limit 64, the addresses); byte_len counts the 40 bytes, the WC has
// IBV_WC_GRH and the sender's QPN. Then a wrong Q_Key and an oversized
// datagram are dropped and counted, the QP stays in RTS, and the next
// datagram arrives in the WQE they did not consume.
func TestUDBetweenDevices(t *testing.T) {
	for _, tr := range []string{"pipe", "udp4", "udp6"} {
		t.Run(tr, func(t *testing.T) {
			const qkey = 0x11111111
			a, b, _, lb := dgPair(t, softrdma.QPTypeUD, tr, nil)
			udPeers(t, a, b, qkey)
			ah, err := a.Dev.CreateAH(a.PD, softrdma.AHAttrFor(b.Dev.LocalAddr()))
			require.NoError(t, err)
			src, srcMR := reg(t, a, 4096, rw)
			dst, dstMR := reg(t, b, 4*1024, rw)
			fill(3, src)
			for i := range 3 {
				_, err = b.QP.PostRecv(softrdma.RecvWR{WRID: uint64(i + 1),
					SGL: []softrdma.SGE{{Addr: dstMR.Addr() + uint64(i)*1024, Length: 1024, LKey: dstMR.LKey()}}})
				require.NoError(t, err)
			}
			send := func(wrid uint64, n uint32, qk uint32, imm bool) {
				wr := softrdma.SendWR{WRID: wrid, Opcode: softrdma.WRSend, Flags: softrdma.SendSignaled,
					SGL: []softrdma.SGE{{Addr: srcMR.Addr(), Length: n, LKey: srcMR.LKey()}},
					AH:  ah, RemoteQPN: b.QP.QPN(), RemoteQKey: qk}
				if imm {
					wr.Opcode, wr.ImmData = softrdma.WRSendWithImm, 0x1234abcd
				}
				_, err := a.QP.PostSend(wr)
				require.NoError(t, err)
				wc := waitWC(t, a.CQ, 1)[0]
				require.Equal(t, softrdma.WCSuccess, wc.Status)
				require.Equal(t, softrdma.WCSend, wc.Opcode)
			}
			checkGRH := func(grh []byte, roceLen int) {
				sa, da := a.Dev.LocalAddr().Addr().Unmap(), b.Dev.LocalAddr().Addr().Unmap()
				if sa.Is4() {
					require.Equal(t, make([]byte, 20), grh[:20])
					h := grh[20:40]
					require.Equal(t, []byte{0x45, 0x00}, h[:2], "version 4, IHL 5, TOS 0")
					require.Equal(t, uint16(20+8+roceLen), binary.BigEndian.Uint16(h[2:]), "total length")
					var id uint16
					for _, r := range lb.records() {
						if r.dir == conn.DirRx {
							id = r.ipID // the ID of the last datagram B received
						}
					}
					require.Equal(t, id, binary.BigEndian.Uint16(h[4:]), "ID as on the wire")
					require.Equal(t, []byte{0x40, 0x00, 64, 17}, h[6:10], "DF, TTL 64, UDP")
					var sum uint32
					for i := 0; i < 20; i += 2 {
						sum += uint32(binary.BigEndian.Uint16(h[i:]))
					}
					for sum > 0xffff {
						sum = sum&0xffff + sum>>16
					}
					require.Equal(t, uint32(0xffff), sum, "header checksum valid")
					require.Equal(t, sa.AsSlice(), h[12:16])
					require.Equal(t, da.AsSlice(), h[16:20])
					return
				}
				require.Equal(t, byte(0x60), grh[0]&0xf0, "version 6")
				require.Equal(t, uint32(0), binary.BigEndian.Uint32(grh[0:])>>20&0xff, "traffic class 0")
				require.Equal(t, uint16(8+roceLen), binary.BigEndian.Uint16(grh[4:]), "payload length")
				require.Equal(t, []byte{17, 64}, grh[6:8], "next header UDP, hop limit 64")
				require.Equal(t, sa.AsSlice(), grh[8:24])
				require.Equal(t, da.AsSlice(), grh[24:40])
			}

			// SEND of 512 bytes (ibv_ud_pingpong's size).
			send(1, 512, qkey, false)
			wc := waitWC(t, b.CQ, 1)[0]
			require.Equal(t, softrdma.WC{WRID: 1, Status: softrdma.WCSuccess, Opcode: softrdma.WCRecv, ByteLen: 40 + 512,
				QPN: uint32(b.QP.QPN()), SrcQP: uint32(a.QP.QPN()), Flags: softrdma.WCWithGRH,
				SrcPort: sendPort(a)}, wc, "SrcPort: the UDP port A's QP sends from")
			checkGRH(dst[:40], 12+8+512+4)
			require.True(t, bytes.Equal(src[:512], dst[40:40+512]))

			// SEND with immediate of 983 bytes (40 + 983 = 1023: fits).
			send(2, 983, 0x80000000, true) // controlled Q_Key: the QP's own
			wc = waitWC(t, b.CQ, 1)[0]
			require.Equal(t, softrdma.WC{WRID: 2, Status: softrdma.WCSuccess, Opcode: softrdma.WCRecv, ByteLen: 40 + 983,
				ImmData: 0x1234abcd, QPN: uint32(b.QP.QPN()), SrcQP: uint32(a.QP.QPN()), Flags: softrdma.WCWithGRH | softrdma.WCWithImm,
				SrcPort: sendPort(a)}, wc)
			checkGRH(dst[1024:1064], 12+8+4+983+1+4)
			require.True(t, bytes.Equal(src[:983], dst[1064:1064+983]))

			// A wrong Q_Key: dropped and counted.
			send(3, 16, qkey+1, false)
			waitCounter(t, b.Dev, "drop_bad_qkey", 1)
			// 40 + 985 > 1024: dropped and counted, the QP unharmed.
			send(4, 985, qkey, false)
			waitCounter(t, b.Dev, "drop_recv_too_small", 1)
			require.Equal(t, softrdma.QPStateRTS, b.QP.State())
			// The next datagram arrives, in the WQE they left.
			send(5, 984, qkey, false)
			wc = waitWC(t, b.CQ, 1)[0]
			require.Equal(t, uint64(3), wc.WRID)
			require.Equal(t, softrdma.WCSuccess, wc.Status)
			require.Equal(t, uint32(1024), wc.ByteLen)
			require.True(t, bytes.Equal(src[:984], dst[2048+40:3072]))
		})
	}
}

// TestUDPostAboveMTURefused: a UD datagram is one packet: a payload above
// the port's active MTU (4096 on a pipe) is refused at post, and so are address handles
// without the GRH RoCE needs.
func TestUDPostAboveMTURefused(t *testing.T) {
	a, b, _, _ := dgPair(t, softrdma.QPTypeUD, "pipe", nil)
	udPeers(t, a, b, 7)
	_, srcMR := reg(t, a, 8192, rw)
	ah, err := a.Dev.CreateAH(a.PD, softrdma.AHAttrFor(b.Dev.LocalAddr()))
	require.NoError(t, err)
	wr := softrdma.SendWR{Opcode: softrdma.WRSend, SGL: []softrdma.SGE{{Addr: srcMR.Addr(), Length: 4097, LKey: srcMR.LKey()}},
		AH: ah, RemoteQPN: b.QP.QPN(), RemoteQKey: 7}
	_, err = a.QP.PostSend(wr)
	require.ErrorIs(t, err, softrdma.ErrMsgSize)
	attr := softrdma.AHAttrFor(b.Dev.LocalAddr())
	attr.IsGlobal = false
	_, err = a.Dev.CreateAH(a.PD, attr)
	require.ErrorIs(t, err, softrdma.ErrBadAHAttr)
	attr = softrdma.AHAttrFor(netip.MustParseAddrPort("[fd00::1]:4791"))
	_, err = a.Dev.CreateAH(a.PD, attr)
	require.ErrorIs(t, err, softrdma.ErrBadAHAttr, "IPv6 GID from an IPv4 device")
}

// sendPort is the UDP source port of s's QP: rxe's port for it when the
// device spreads (QP.SourcePort), else the device's own.
func sendPort(s *softrdmatest.Side) uint16 {
	if p := s.QP.SourcePort(); p != 0 {
		return p
	}
	return s.Dev.LocalAddr().Port()
}
