package transport

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/softrdma/softrdma/hostmem"
	"github.com/softrdma/softrdma/transport/wire"
)

// FuzzResponder feeds arbitrary packet sequences to a connected RC QP's
// demux, responder and completer. The input is a sequence of records:
// 2-byte big-endian length, then that many bytes of RoCE packet. When the
// first byte of a record's flags says so, the packet's DestQP and PSN are
// patched to hit the QP near its expected PSN, so the fuzzer reaches deep
// states. Invariants: no panic, no byte written outside the MR, and every
// packet is accounted for (received or dropped with a reason).
func FuzzResponder(f *testing.F) { fuzzResponder(f, newResponderRig(f)) }

// FuzzResponderODP is FuzzResponder with the MR on demand-paged host memory
// and the rnr fault policy; a record whose flags byte has bit 1 set also
// migrates the MR's pages before the packet (an invalidation racing the
// message in progress), and bit 2 drops the table's entries. The
// invariants are the same: no panic, no byte outside the MR, every packet
// accounted for.
func FuzzResponderODP(f *testing.F) { fuzzResponder(f, newRig(f, true, FaultRNR)) }

func fuzzResponder(f *testing.F, r *responderRig) {
	seed := func(pkts ...[]byte) []byte {
		var out []byte
		for _, p := range pkts {
			out = binary.BigEndian.AppendUint16(out, uint16(len(p)))
			out = append(out, p...)
		}
		return out
	}
	base := r.mr.Addr()
	rk := r.mr.RKey()
	pl := make([]byte, rigMTU)
	f.Add(seed(r.build(wire.OpRDMAWriteOnly, 1000, pl[:64], true, r.reth(base, rk, 64))))
	f.Add(seed(r.build(wire.OpRDMAWriteFirst, 1000, pl, false, r.reth(base, rk, 2*rigMTU+5)),
		r.build(wire.OpRDMAWriteMiddle, 1001, pl, false, nil),
		r.build(wire.OpRDMAWriteLastWithImmediate, 1002, pl[:5], true, nil)))
	f.Add(seed(r.build(wire.OpRDMAReadRequest, 1000, nil, true, r.reth(base, rk, 3000))))
	f.Add(seed(r.build(wire.OpSendFirst, 1000, pl, false, nil), r.build(wire.OpSendLastWithInvalidate, 1001, pl[:3], true, nil)))
	f.Add(seed(r.build(wire.OpCompareSwap, 1000, nil, true, func(b []byte, info *wire.OpInfo) {
		wire.AtomicETH(b[info.Offset[wire.HdrAtomicETH]:]).Encode(&wire.AtomicETHFields{VA: base, RKey: rk, SwapAdd: 1, Compare: 0})
	})))
	f.Add(seed(r.build(wire.OpAcknowledge, 5000, nil, false, func(b []byte, info *wire.OpInfo) {
		wire.AETH(b[info.Offset[wire.HdrAETH]:]).Encode(wire.SyndromeNAKPSNSeqErr, 0)
	})))
	// Every packet of the wire package's seed corpus: one of every opcode
	// and one golden rxe packet per capture, opcode and length. The last
	// byte's low bit is set so that each is steered at the QP.
	files, _ := filepath.Glob("wire/testdata/fuzz/FuzzParse/*")
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		lines := strings.SplitN(string(data), "\n", 3)
		if len(lines) < 2 || !strings.HasPrefix(lines[1], "[]byte(") {
			continue
		}
		q, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
		if err != nil || len(q) < wire.BTHSize {
			continue
		}
		p := []byte(q)
		p[len(p)-1] |= 1
		f.Add(seed(p))
	}
	if len(files) == 0 {
		f.Fatal("no seed corpus in wire/testdata/fuzz/FuzzParse")
	}
	f.Fuzz(func(t *testing.T, in []byte) { r.fuzzOne(t, in) })
}

// fuzzOne runs one fuzz input through the rig.
func (r *responderRig) fuzzOne(t testing.TB, in []byte) {
	base := r.mr.Addr()
	{
		if r.qp.State() != QPStateRTS {
			r.connect(t)
		}
		for i := 0; i < 100; i++ {
			r.qp.PostRecv(RecvWR{WRID: 1, SGL: []SGE{{Addr: base, Length: 4096, LKey: r.mr.LKey()}}})
		}
		// At most 64 packets per input keeps each execution short.
		for k := 0; len(in) >= 2 && k < 64; k++ {
			n := int(binary.BigEndian.Uint16(in))
			in = in[2:]
			if n > len(in) {
				n = len(in)
			}
			p := append([]byte(nil), in[:n]...)
			in = in[n:]
			if r.as != nil && len(p) > 0 && p[len(p)-1]&2 != 0 {
				if m, err := r.as.Migrate(r.mr.Addr()&^(hostmem.PageSize-1), rigMR/hostmem.PageSize); err == nil {
					m.Release()
				}
			}
			if r.as != nil && len(p) > 0 && p[len(p)-1]&4 != 0 {
				r.mr.ODPTable().InvalidateRange(r.mr.Addr(), rigMR)
			}
			if len(p) >= wire.BTHSize && p[len(p)-1]&1 == 1 {
				wire.BTH(p).SetDestQP(r.qp.QPN())
				wire.BTH(p).SetPSN(r.qp.resp.ePSN.Add(uint32(p[len(p)-1] >> 6)))
			}
			before := r.d.counters.RcvdPkts.Load() + dropTotal(&r.d.counters)
			r.deliver(p)
			after := r.d.counters.RcvdPkts.Load() + dropTotal(&r.d.counters)
			if after == before {
				t.Fatalf("packet % x neither received nor counted as dropped", p)
			}
		}
		if !r.guardsIntact() {
			t.Fatalf("bytes written outside the MR")
		}
		// What the device answers piles up at the peer, whose full queue
		// drops and counts; nothing blocks.
		// Drain completions.
		wcs := make([]WC, 64)
		for {
			n, _ := r.cq.Poll(wcs)
			if n == 0 {
				break
			}
		}
	}
}

func dropTotal(c *Counters) uint64 {
	var s uint64
	for i := range c.Drops {
		s += c.Drops[i].Load()
	}
	return s
}
