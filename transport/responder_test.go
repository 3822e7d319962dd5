package transport

import (
	"fmt"
	"github.com/softrdma/softrdma/hostmem"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/placement"
	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// responderRig is a device whose QP is connected to a bare pipe end that
// the test drives by hand: packets are handed to the demux directly (the
// receive loop stays idle because nothing is sent to the device's conn)
// and the device's answers are read from the peer end.
type responderRig struct {
	t      testing.TB
	d      *Device
	qp     *QP
	peer   *conn.PipeConn
	from   netip.AddrPort
	place  *placement.Engine
	mem    []byte // guard | MR | guard
	mr     *placement.MR
	cq     *CQ
	pkt    wire.Packet
	ePSN   wire.PSN
	peerQP wire.QPN
	as     *hostmem.AddressSpace // the ODP rig's host memory
}

const (
	rigGuard = 4096
	rigMR    = 8192
	rigMTU   = 1024
)

func newResponderRig(t testing.TB) *responderRig { return newRig(t, false, FaultSync) }

// newRig builds the rig; with odp its MR is an ODP MR on a host address
// space (guard pages around it), and policy is the device's fault policy.
func newRig(t testing.TB, odp bool, policy FaultPolicy) *responderRig {
	a, b := conn.NewPipe()
	var as *hostmem.AddressSpace
	if odp {
		var err error
		as, err = hostmem.NewAddressSpace(hostmem.Config{Size: 16 << 20})
		require.NoError(t, err)
	}
	e := placement.New(placement.Config{AddressSpace: as})
	d, err := NewDevice(Config{Conn: b, Placement: e, FaultPolicy: policy})
	require.NoError(t, err)
	t.Cleanup(func() { d.Close(); a.Close() })
	r := &responderRig{t: t, d: d, peer: a, from: a.LocalAddr(), place: e, peerQP: 0x99, ePSN: 1000, as: as}
	r.cq = NewCQ(1 << 12)
	r.qp, err = d.CreateQP(1, &QPInitAttr{SendCQ: r.cq, RecvCQ: r.cq, Type: QPTypeRC,
		Cap: Cap{MaxSendWR: 16, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2}})
	require.NoError(t, err)
	if odp {
		r.mem, err = as.Alloc(rigGuard + rigMR + rigGuard)
		require.NoError(t, err)
		t.Cleanup(func() { _ = as.Free(hostmem.AddrOf(r.mem), len(r.mem)); _ = as.Close() })
	} else {
		r.mem = make([]byte, rigGuard+rigMR+rigGuard)
	}
	for i := range r.mem {
		r.mem[i] = 0xA5
	}
	access := stag.AccessLocalWrite | stag.AccessRemoteWrite | stag.AccessRemoteRead | stag.AccessRemoteAtomic
	if odp {
		access |= stag.AccessOnDemand
	}
	r.mr, err = e.RegMR(1, r.mem[rigGuard:rigGuard+rigMR], access)
	require.NoError(t, err)
	t.Cleanup(func() { e.DeregMR(r.mr) })
	r.connect(t)
	return r
}

func (r *responderRig) connect(t testing.TB) {
	qp := r.qp
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateInit, Port: 1,
		AccessFlags: stag.AccessRemoteWrite | stag.AccessRemoteRead | stag.AccessRemoteAtomic},
		QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags))
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTR, Dest: r.from, PathMTU: MTU1024, DestQPN: r.peerQP,
		RQPSN: 1000, MaxDestRdAtomic: 4, MinRNRTimer: 1},
		QPAttrState|QPAttrAV|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN|QPAttrMaxDestRdAtomic|QPAttrMinRNRTimer))
	require.NoError(t, qp.Modify(&QPAttr{State: QPStateRTS, SQPSN: 5000, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4},
		QPAttrState|QPAttrSQPSN|QPAttrTimeout|QPAttrRetryCnt|QPAttrRNRRetry|QPAttrMaxQPRdAtomic))
	r.ePSN = 1000
}

// build returns a request packet (ICRC space included) for the QP.
func (r *responderRig) build(op wire.Opcode, psn wire.PSN, payload []byte, ackReq bool, f func(p []byte, info *wire.OpInfo)) []byte {
	info := wire.Info(op)
	pad := wire.PadFor(len(payload))
	b := make([]byte, info.Length+len(payload)+pad+wire.ICRCSize)
	wire.BTH(b).Encode(&wire.BTHFields{Opcode: op, PadCount: pad, PKey: 0xffff, DestQP: r.qp.QPN(), AckReq: ackReq, PSN: psn})
	copy(b[info.Length:], payload)
	if f != nil {
		f(b, info)
	}
	return b
}

func (r *responderRig) reth(va uint64, rkey, n uint32) func([]byte, *wire.OpInfo) {
	return func(b []byte, info *wire.OpInfo) {
		wire.RETH(b[info.Offset[wire.HdrRETH]:]).Encode(&wire.RETHFields{VA: va, RKey: rkey, DMALength: n})
	}
}

// deliver runs the demux on b as if it had arrived from the peer, then
// sends what the device owes.
func (r *responderRig) deliver(b []byte) {
	r.d.handle(&conn.Packet{Buf: b, Addr: r.from}, &r.pkt)
	r.d.flushAcks()
	r.d.rxTx.flush()
	// The test goroutine plays the receive loop: it must quiesce the
	// loop's reader after its batch, or a DeregMR would wait for it.
	r.d.reader.Quiesce()
}

// answer reads one packet the device sent to the peer.
func (r *responderRig) answer() (wire.Opcode, wire.Syndrome, wire.PSN) {
	pkts := make([]conn.Packet, 1)
	n, err := r.peer.Receive(pkts)
	require.NoError(r.t, err)
	require.Equal(r.t, 1, n)
	var p wire.Packet
	require.NoError(r.t, wire.Parse(pkts[0].Buf, &p))
	var syn wire.Syndrome
	if p.Info.Mask&wire.MaskAETH != 0 {
		syn = p.AETH().Syndrome()
	}
	return p.Opcode(), syn, p.PSN()
}

func (r *responderRig) drops(why DropReason) uint64 { return r.d.counters.Drops[why].Load() }

// guardsIntact reports whether nothing was written outside the MR.
func (r *responderRig) guardsIntact() bool {
	for _, c := range r.mem[:rigGuard] {
		if c != 0xA5 {
			return false
		}
	}
	for _, c := range r.mem[rigGuard+rigMR:] {
		if c != 0xA5 {
			return false
		}
	}
	return true
}

func TestResponderWriteInOrderAcksAndPlaces(t *testing.T) {
	r := newResponderRig(t)
	data := make([]byte, 100)
	for i := range data {
		data[i] = byte(i)
	}
	r.deliver(r.build(wire.OpRDMAWriteOnly, 1000, data, true, r.reth(r.mr.Addr()+10, r.mr.RKey(), 100)))
	op, syn, psn := r.answer()
	require.Equal(t, wire.OpAcknowledge, op)
	require.Equal(t, wire.SyndromeACK, syn)
	require.Equal(t, wire.PSN(1000), psn)
	require.Equal(t, data, r.mem[rigGuard+10:rigGuard+110])
	require.True(t, r.guardsIntact())
}

// TestResponderBadInput sends one malformed or illegal request per row and
// checks the drop reason, the NAK the IBTA names (if any) and that nothing
// was written outside the MR.
func TestResponderBadInput(t *testing.T) {
	mtu := make([]byte, rigMTU)
	type row struct {
		name    string
		pkt     func(r *responderRig) []byte
		drop    DropReason
		nak     wire.Syndrome // 0: no answer expected
		toError bool          // the responder QP moves to ERR
	}
	rows := []row{
		// Decoding.
		{"too short", func(r *responderRig) []byte { return []byte{0, 0, 0} }, DropMalformed, 0, false},
		{"unknown opcode", func(r *responderRig) []byte {
			b := r.build(wire.OpSendOnly, 1000, nil, true, nil)
			b[0] = 0x1f
			return b
		}, DropUnknownOpcode, 0, false},
		{"wrong pad", func(r *responderRig) []byte {
			b := r.build(wire.OpSendOnly, 1000, nil, true, nil)
			b[1] |= 0x30
			return b
		}, DropMalformed, 0, false},
		{"RETH truncated", func(r *responderRig) []byte { return r.build(wire.OpRDMAWriteOnly, 1000, nil, true, nil)[:20] }, DropMalformed, 0, false},
		// Addressing and state.
		{"unknown QPN", func(r *responderRig) []byte {
			b := r.build(wire.OpSendOnly, 1000, nil, true, nil)
			wire.BTH(b).SetDestQP(0x7777)
			return b
		}, DropUnknownQPN, 0, false},
		{"bad P_Key", func(r *responderRig) []byte {
			b := r.build(wire.OpSendOnly, 1000, nil, true, nil)
			b[2], b[3] = 0x12, 0x34
			return b
		}, DropBadPKey, 0, false},
		{"payload longer than the MTU", func(r *responderRig) []byte {
			return r.build(wire.OpRDMAWriteOnly, 1000, make([]byte, rigMTU+4), true, r.reth(r.mr.Addr(), r.mr.RKey(), rigMTU+4))
		}, DropTooLong, 0, false},
		{"QP not ready to receive", func(r *responderRig) []byte {
			require.NoError(r.t, r.qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
			return r.build(wire.OpSendOnly, 1000, nil, true, nil)
		}, DropBadQPState, 0, false},
		// Sequence.
		{"PSN after the expected one", func(r *responderRig) []byte { return r.build(wire.OpSendOnly, 1005, nil, true, nil) },
			DropPSNOutOfWindow, wire.SyndromeNAKPSNSeqErr, false},
		{"MIDDLE without FIRST", func(r *responderRig) []byte { return r.build(wire.OpRDMAWriteMiddle, 1000, mtu, false, nil) },
			DropOpSeq, wire.SyndromeNAKInvalidRequest, true},
		// Lengths and keys.
		{"FIRST shorter than the MTU", func(r *responderRig) []byte {
			return r.build(wire.OpRDMAWriteFirst, 1000, mtu[:100], false, r.reth(r.mr.Addr(), r.mr.RKey(), 4096))
		}, DropLength, wire.SyndromeNAKInvalidRequest, true},
		{"RETH length not matching the payload", func(r *responderRig) []byte {
			return r.build(wire.OpRDMAWriteOnly, 1000, mtu[:100], true, r.reth(r.mr.Addr(), r.mr.RKey(), 99))
		}, DropLength, wire.SyndromeNAKInvalidRequest, true},
		{"bad rkey", func(r *responderRig) []byte {
			return r.build(wire.OpRDMAWriteOnly, 1000, mtu[:8], true, r.reth(r.mr.Addr(), r.mr.RKey()^0x01, 8))
		}, DropAccess, wire.SyndromeNAKRemoteAccess, true},
		{"write past the MR", func(r *responderRig) []byte {
			return r.build(wire.OpRDMAWriteOnly, 1000, mtu[:64], true, r.reth(r.mr.Addr()+rigMR-32, r.mr.RKey(), 64))
		}, DropAccess, wire.SyndromeNAKRemoteAccess, true},
		{"write before the MR", func(r *responderRig) []byte {
			return r.build(wire.OpRDMAWriteOnly, 1000, mtu[:64], true, r.reth(r.mr.Addr()-64, r.mr.RKey(), 64))
		}, DropAccess, wire.SyndromeNAKRemoteAccess, true},
		{"length wrapping the address space", func(r *responderRig) []byte {
			// 2^31, the largest DMA length (a longer one is an invalid
			// request before the R_Key is looked at: TestDMALengthOver2GiB).
			return r.build(wire.OpRDMAReadRequest, 1000, nil, true, r.reth(^uint64(0)-10, r.mr.RKey(), 1<<31))
		}, DropAccess, wire.SyndromeNAKRemoteAccess, true},
		{"misaligned atomic", func(r *responderRig) []byte {
			return r.build(wire.OpFetchAdd, 1000, nil, true, func(b []byte, info *wire.OpInfo) {
				wire.AtomicETH(b[info.Offset[wire.HdrAtomicETH]:]).Encode(&wire.AtomicETHFields{VA: r.mr.Addr() + 4, RKey: r.mr.RKey(), SwapAdd: 1})
			})
		}, DropAccess, wire.SyndromeNAKInvalidRequest, true},
	}
	for _, c := range rows {
		t.Run(c.name, func(t *testing.T) {
			r := newResponderRig(t)
			before := r.drops(c.drop)
			r.deliver(c.pkt(r))
			require.Equal(t, before+1, r.drops(c.drop), "drop counter %v", c.drop)
			if c.nak != 0 {
				op, syn, psn := r.answer()
				require.Equal(t, wire.OpAcknowledge, op)
				require.Equal(t, c.nak, syn, "NAK syndrome")
				require.Equal(t, wire.PSN(1000), psn, "the NAK names the expected PSN")
			}
			switch {
			case c.toError:
				require.Equal(t, QPStateErr, r.qp.State())
			case c.drop == DropBadQPState:
				require.Equal(t, QPStateReset, r.qp.State())
			default:
				require.Equal(t, QPStateRTS, r.qp.State())
			}
			require.True(t, r.guardsIntact(), "bytes written outside the MR")
			require.Equal(t, byte(0xA5), r.mem[rigGuard], "a failed check places zero bytes")
		})
	}
}

// TestResponderWrongAddressBeforeLength checks that a packet from an
// address that is not the QP's peer is dropped as such whatever else is
// wrong with it: rxe's hdr_check runs check_addr before the responder
// ever looks at the payload length (rxe_recv.c, then rxe_resp.c
// check_length), so a spoofed oversized WRITE is a wrong_address drop, not
// a too_long one.
func TestResponderWrongAddressBeforeLength(t *testing.T) {
	r := newResponderRig(t)
	other := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.77"), r.from.Port())
	long := r.build(wire.OpRDMAWriteOnly, 1000, make([]byte, rigMTU+4), true, r.reth(r.mr.Addr(), r.mr.RKey(), rigMTU+4))
	r.d.handle(&conn.Packet{Buf: long, Addr: other}, &r.pkt)
	require.Equal(t, uint64(1), r.drops(DropWrongAddress), "a packet from another address is a wrong_address drop")
	require.Zero(t, r.drops(DropTooLong), "its length is not looked at")
	require.Equal(t, QPStateRTS, r.qp.State())
	require.True(t, r.guardsIntact())
	require.Equal(t, byte(0xA5), r.mem[rigGuard], "nothing placed")
}

func TestResponderNAKsPSNSequenceErrorOncePerGap(t *testing.T) {
	r := newResponderRig(t)
	for psn := wire.PSN(1001); psn < 1005; psn++ {
		r.deliver(r.build(wire.OpSendOnly, psn, nil, true, nil))
	}
	op, syn, psn := r.answer()
	require.Equal(t, wire.OpAcknowledge, op)
	require.Equal(t, wire.SyndromeNAKPSNSeqErr, syn)
	require.Equal(t, wire.PSN(1000), psn)
	require.Equal(t, uint64(4), r.d.counters.OutOfSeqRequest.Load())
	require.Equal(t, uint64(1), r.d.counters.NAKsSent.Load(), "one NAK per gap")
}

func TestResponderRNRNAKWithoutReceiveWQE(t *testing.T) {
	r := newResponderRig(t)
	r.deliver(r.build(wire.OpSendOnly, 1000, []byte("hi"), true, nil))
	op, syn, psn := r.answer()
	require.Equal(t, wire.OpAcknowledge, op)
	require.Equal(t, wire.RNRNAK(1), syn, "RNR NAK carries min_rnr_timer")
	require.Equal(t, wire.PSN(1000), psn)
	require.Equal(t, uint64(1), r.d.counters.SendRNRErr.Load())
}

func TestResponderDuplicateWriteIsAcknowledgedNotExecuted(t *testing.T) {
	r := newResponderRig(t)
	p := r.build(wire.OpRDMAWriteOnly, 1000, []byte{1, 2, 3, 4}, true, r.reth(r.mr.Addr(), r.mr.RKey(), 4))
	r.deliver(p)
	r.answer()
	r.mem[rigGuard] = 9 // the application changes the byte; a re-execution would overwrite it
	r.deliver(p)
	op, syn, psn := r.answer()
	require.Equal(t, wire.OpAcknowledge, op)
	require.Equal(t, wire.SyndromeACK, syn)
	require.Equal(t, wire.PSN(1000), psn)
	require.Equal(t, byte(9), r.mem[rigGuard])
	require.Equal(t, uint64(1), r.d.counters.DuplicateRequest.Load())
}

// TestDestroyQPReleasesMessageInProgress: a peer that starts a multi-packet
// WRITE and goes away must not keep the MR from being deregistered once the
// QP is destroyed (or reset).
func TestDestroyQPReleasesMessageInProgress(t *testing.T) {
	for _, how := range []string{"destroy", "reset", "error"} {
		t.Run(how, func(t *testing.T) {
			r := newResponderRig(t)
			r.deliver(r.build(wire.OpRDMAWriteFirst, 1000, make([]byte, rigMTU), false, r.reth(r.mr.Addr(), r.mr.RKey(), 4*rigMTU)))
			require.True(t, r.qp.resp.cur.Busy(), "the WRITE holds the MR")
			switch how {
			case "destroy":
				require.NoError(t, r.d.DestroyQP(r.qp))
			case "reset":
				require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
			case "error":
				require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateErr}, QPAttrState))
			}
			done := make(chan error, 1)
			go func() { done <- r.place.DeregMR(r.mr) }()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("DeregMR still waits for the QP's WRITE after the QP was " + how)
			}
		})
	}
}

func TestModifyRejectsNilAttrAndClosedDevice(t *testing.T) {
	r := newResponderRig(t)
	require.ErrorIs(t, r.qp.Modify(nil, QPAttrState), ErrBadAttr)
	require.NoError(t, r.d.Close())
	require.NoError(t, r.qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState))
	err := r.qp.Modify(&QPAttr{State: QPStateInit, Port: 1}, QPAttrState|QPAttrPort|QPAttrPKeyIndex|QPAttrAccessFlags)
	require.ErrorIs(t, err, ErrClosed)
}

// TestCloseSendsPendingACK: the ACK of a request is coalesced until the end
// of the receive batch, after the request's completion is visible. If the
// application closes the device in between (it saw its last completion),
// Close must still send the ACK, or the peer retries a request we executed
// against a device that is gone.
func TestCloseSendsPendingACK(t *testing.T) {
	r := newResponderRig(t)
	_, err := r.qp.PostRecv(RecvWR{WRID: 7, SGL: []SGE{{Addr: r.mr.Addr(), Length: 64, LKey: r.mr.LKey()}}})
	require.NoError(t, err)
	// The rig plays the receive loop: handle the SEND, but stop before the
	// end-of-batch ACK flush.
	r.d.handle(&conn.Packet{Buf: r.build(wire.OpSendOnly, 1000, make([]byte, 16), true, nil), Addr: r.from}, &r.pkt)
	r.d.reader.Quiesce()
	wcs := make([]WC, 1)
	n, _ := r.cq.Poll(wcs)
	require.Equal(t, 1, n, "the receive completed")
	require.NoError(t, r.d.Close())
	op, syn, psn := r.answer()
	require.Equal(t, wire.OpAcknowledge, op)
	require.Equal(t, wire.TypeACK, syn.Type())
	require.Equal(t, wire.PSN(1000), psn)
}

// TestRNRWaitEndsWithACK: an RNR NAK for a request and then an ACK that
// covers it (the responder accepted a retransmission that crossed the NAK)
// end the RNR wait: the next work request goes out at once. (The wait used
// to outlive the ACK with its timer stopped, so the next request was never
// sent.)
func TestRNRWaitEndsWithACK(t *testing.T) {
	r := newResponderRig(t)
	post := func(id uint64) {
		_, err := r.qp.PostSend(SendWR{WRID: id, Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{{Addr: r.mr.Addr(), Length: 8, LKey: r.mr.LKey()}}, RemoteAddr: 0x1000, RKey: 0x1234})
		require.NoError(t, err)
	}
	ack := func(syn wire.Syndrome, psn wire.PSN) {
		r.deliver(r.build(wire.OpAcknowledge, psn, nil, false, func(b []byte, info *wire.OpInfo) {
			wire.AETH(b[info.Offset[wire.HdrAETH]:]).Encode(syn, 0)
		}))
	}
	post(1)
	op, _, psn := r.answer()
	require.Equal(t, wire.OpRDMAWriteOnly, op)
	require.Equal(t, wire.PSN(5000), psn)
	ack(wire.RNRNAK(31), 5000) // 491.52 ms: it must not fire before the ACK
	ack(wire.SyndromeACK, 5000)
	wcs := make([]WC, 1)
	n, _ := r.cq.Poll(wcs)
	require.Equal(t, 1, n)
	require.Equal(t, WCSuccess, wcs[0].Status)
	post(2)
	op, _, psn = r.answer()
	require.Equal(t, wire.OpRDMAWriteOnly, op)
	require.Equal(t, wire.PSN(5001), psn, "the next request is sent")
}

// TestUnsupportedOpcodeLogged: an opcode we do not implement (XRC's SEND
// ONLY, 0xA4) is dropped, counted, and the log names the peer and the
// opcode (issue 5 item 7), rate-limited.
func TestUnsupportedOpcodeLogged(t *testing.T) {
	a, b := conn.NewPipe()
	var logs []string
	var mu sync.Mutex
	d, err := NewDevice(Config{Conn: b, Placement: placement.New(placement.Config{}),
		Logf: func(f string, args ...any) { mu.Lock(); logs = append(logs, fmt.Sprintf(f, args...)); mu.Unlock() }})
	require.NoError(t, err)
	defer func() { d.Close(); a.Close() }()
	pkt := make([]byte, wire.BTHSize+16+wire.ICRCSize)
	wire.BTH(pkt).Encode(&wire.BTHFields{Opcode: 0xA4, PKey: 0xffff, DestQP: 0x11, PSN: 1})
	var p wire.Packet
	for range 12 {
		d.handle(&conn.Packet{Buf: pkt, Addr: a.LocalAddr()}, &p)
	}
	require.Equal(t, uint64(12), d.counters.Drops[DropUnknownOpcode].Load())
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, logs, 10, "rate-limited: the first 10")
	require.Contains(t, logs[0], a.LocalAddr().String())
	require.Contains(t, logs[0], "opcode 0xa4 is not supported")
}

// TestResponseSupersedesCoalescedACK: a WRITE and then a READ in one
// receive batch. The WRITE's ACK is coalesced to the end of the batch; the
// READ response, which acknowledges the WRITE too (IBTA 9.7.5.1.2), goes
// out first, so the coalesced ACK would arrive after it, for an older PSN,
// and the requester would drop it as a duplicate response. It must not be
// sent: the device answers with the READ response alone.
func TestResponseSupersedesCoalescedACK(t *testing.T) {
	r := newResponderRig(t)
	data := []byte("coalesced")
	base := r.mr.Addr()
	r.d.handle(&conn.Packet{Buf: r.build(wire.OpRDMAWriteOnly, 1000, data, true, r.reth(base, r.mr.RKey(), uint32(len(data)))), Addr: r.from}, &r.pkt)
	r.d.handle(&conn.Packet{Buf: r.build(wire.OpRDMAReadRequest, 1001, nil, true, r.reth(base, r.mr.RKey(), uint32(len(data)))), Addr: r.from}, &r.pkt)
	deferred := r.d.counters.AckDeferred.Load()
	sent := r.d.counters.SentPkts.Load()
	r.d.flushAcks()
	r.d.rxTx.flush()
	r.d.reader.Quiesce()
	op, _, psn := r.answer()
	require.Equal(t, wire.OpRDMAReadResponseOnly, op)
	require.Equal(t, wire.PSN(1001), psn)
	require.Equal(t, sent+1, r.d.counters.SentPkts.Load(), "a packet after the READ response: the superseded ACK")
	require.Equal(t, deferred, r.d.counters.AckDeferred.Load(), "counted when superseded, not again at the flush")
	require.Positive(t, deferred)
}

// TestResponderEmptyLASTIsALengthError: a LAST packet carries at least one
// byte; an empty message is an ONLY (IBTA 9.7.5.2, C9-88; rxe's
// check_length: "last packet zero or too long", class C on RC: NAK
// invalid request, QP to ERR). An empty LAST after a FIRST that already
// carried the whole RETH length, or ending a SEND, used to be accepted and
// complete the message.
func TestResponderEmptyLASTIsALengthError(t *testing.T) {
	mtu := make([]byte, rigMTU)
	for _, c := range []struct {
		name        string
		first, last wire.Opcode
	}{
		{"SEND", wire.OpSendFirst, wire.OpSendLast},
		{"WRITE", wire.OpRDMAWriteFirst, wire.OpRDMAWriteLast},
		{"WRITE with immediate", wire.OpRDMAWriteFirst, wire.OpRDMAWriteLastWithImmediate},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newResponderRig(t)
			_, err := r.qp.PostRecv(RecvWR{WRID: 7, SGL: []SGE{{Addr: r.mr.Addr(), Length: 4 * rigMTU, LKey: r.mr.LKey()}}})
			require.NoError(t, err)
			var reth func([]byte, *wire.OpInfo)
			if c.first == wire.OpRDMAWriteFirst {
				reth = r.reth(r.mr.Addr(), r.mr.RKey(), rigMTU)
			}
			r.deliver(r.build(c.first, 1000, mtu, false, reth))
			before := r.drops(DropLength)
			r.deliver(r.build(c.last, 1001, nil, true, nil))
			require.Equal(t, before+1, r.drops(DropLength))
			op, syn, psn := r.answer()
			require.Equal(t, wire.OpAcknowledge, op)
			require.Equal(t, wire.SyndromeNAKInvalidRequest, syn)
			require.Equal(t, wire.PSN(1001), psn)
			require.Equal(t, QPStateErr, r.qp.State())
			for _, wc := range r.poll() {
				require.NotEqual(t, WCSuccess, wc.Status, "the message does not complete")
			}
		})
	}
}
