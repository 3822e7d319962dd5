package transport

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/stag"
	"github.com/softrdma/softrdma/transport/conn"
	"github.com/softrdma/softrdma/transport/wire"
)

// dgGuard is the guard around FuzzDatagram's MRs; dgFuzzMR their size.
const (
	dgGuard  = 4096
	dgFuzzMR = 16384
)

// guardMR replaces the rig's MR with one in the middle of guard | MR |
// guard, the guards filled with 0xA5, and returns the whole buffer.
func (r *dgRig) guardMR(t testing.TB) []byte {
	r.place.DeregMR(r.mr)
	mem := make([]byte, dgGuard+dgFuzzMR+dgGuard)
	for i := range mem {
		mem[i] = 0xA5
	}
	mr, err := r.place.RegMR(1, mem[dgGuard:dgGuard+dgFuzzMR], stag.AccessLocalWrite|stag.AccessRemoteWrite)
	require.NoError(t, err)
	r.mr, r.mem = mr, mem
	t.Cleanup(func() { r.place.DeregMR(mr) })
	return mem
}

func guardsHold(mem []byte) bool {
	for _, c := range mem[:dgGuard] {
		if c != 0xA5 {
			return false
		}
	}
	for _, c := range mem[dgGuard+dgFuzzMR:] {
		if c != 0xA5 {
			return false
		}
	}
	return true
}

// FuzzDatagram feeds arbitrary packets to a UC QP and a UD QP (each on a
// device of its own, with receive WQEs posted and an MR between guard
// bytes). An input is a sequence of records: a flags byte, a 2-byte
// big-endian length, then that many bytes of packet. Flags bit 0 sends the
// record to the UD QP (else the UC one); bit 1 steers it: its DestQP
// becomes the QP's and, for UC, its PSN the expected one (plus flags>>6);
// bit 2 points a RETH at the MR: its rkey becomes the MR's and its VA
// lands within 4 KiB of the MR's ends. Invariants: no panic, nothing
// written outside the MRs, every packet received or dropped with a reason.
func FuzzDatagram(f *testing.F) {
	uc := newDGRig(f, QPTypeUC, conn.PipeConfig{})
	ud := newDGRig(f, QPTypeUD, conn.PipeConfig{})
	mems := [2][]byte{uc.guardMR(f), ud.guardMR(f)}
	rec := func(flags byte, p []byte) []byte {
		out := []byte{flags}
		out = binary.BigEndian.AppendUint16(out, uint16(len(p)))
		return append(out, p...)
	}
	pl := pattern(2500, 3)
	f.Add(rec(2, uc.uc(wire.OpRDMAWriteOnly, 1000, pl[:100], &wire.RETHFields{VA: uc.mr.Addr(), RKey: uc.mr.RKey(), DMALength: 100})))
	f.Add(append(rec(6, uc.uc(wire.OpRDMAWriteFirst, 1000, pl[:1024], &wire.RETHFields{VA: uc.mr.Addr() + dgFuzzMR - 2000, RKey: uc.mr.RKey(), DMALength: 2500})),
		rec(2, uc.uc(wire.OpRDMAWriteLast, 1001, pl[:1476], nil))...))
	f.Add(rec(2, uc.uc(wire.OpSendFirst, 1000, pl[:1024], nil)))
	f.Add(rec(2, uc.uc(wire.OpSendOnlyWithImmediate, 1000, pl[:10], nil)))
	f.Add(rec(3, ud.ud(dgQKey, 0x42, pl[:500], true)))
	f.Add(rec(3, ud.ud(dgQKey, 0x42, pl[:1100], false)))

	f.Fuzz(func(t *testing.T, in []byte) {
		rigs := [2]*dgRig{uc, ud}
		for _, r := range rigs {
			r.qp.rq.Lock()
			queued := int(r.qp.rq.head - r.qp.rq.tail)
			r.qp.rq.Unlock()
			for range 8 - queued {
				if _, err := r.qp.PostRecv(RecvWR{WRID: 1, SGL: []SGE{{Addr: r.mr.Addr(), Length: 2048, LKey: r.mr.LKey()}}}); err != nil {
					t.Fatal(err)
				}
			}
		}
		for k := 0; len(in) >= 3 && k < 32; k++ {
			flags := in[0]
			n := min(int(binary.BigEndian.Uint16(in[1:])), len(in)-3)
			p := append([]byte(nil), in[3:3+n]...)
			in = in[3+n:]
			r := rigs[flags&1]
			if flags&2 != 0 && len(p) >= wire.BTHSize {
				wire.BTH(p).SetDestQP(r.qp.QPN())
				if r == uc {
					wire.BTH(p).SetPSN(uc.qp.resp.ePSN.Add(uint32(flags >> 6)))
				}
			}
			if flags&4 != 0 && len(p) >= wire.BTHSize {
				if info := wire.Info(wire.Opcode(p[0])); info.Mask&wire.MaskRETH != 0 && len(p) >= int(info.Offset[wire.HdrRETH])+wire.RETHSize {
					reth := wire.RETH(p[info.Offset[wire.HdrRETH]:])
					va := r.mr.Addr() - 4096 + reth.VA()%(dgFuzzMR+8192)
					reth.Encode(&wire.RETHFields{VA: va, RKey: r.mr.RKey(), DMALength: reth.DMALength()})
				}
			}
			before := r.d.counters.RcvdPkts.Load() + dropTotal(&r.d.counters)
			r.deliver(p)
			if after := r.d.counters.RcvdPkts.Load() + dropTotal(&r.d.counters); after == before {
				t.Fatalf("packet % x neither received nor counted as dropped", p)
			}
		}
		for i, r := range rigs {
			if !guardsHold(mems[i]) {
				t.Fatalf("bytes written outside the %v QP's MR", r.qp.typ)
			}
			wcs := make([]WC, 64)
			for {
				if n, _ := r.cq.Poll(wcs); n == 0 {
					break
				}
			}
		}
	})
}
