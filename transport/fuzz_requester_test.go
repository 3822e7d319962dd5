package transport

import (
	"encoding/binary"
	"testing"

	"github.com/softrdma/softrdma/transport/wire"
)

// Where FuzzRequester's WRs read and write in the rig's MR (offsets from
// its start): the READ lands in [reqReadOff, +reqReadLen), the atomic's
// original value in [reqAtomicOff, +8). Nothing else in the MR may change.
const (
	reqReadOff   = 2048
	reqReadLen   = 3000
	reqAtomicOff = 6144
	reqRecord    = 14 // bytes per fuzz record
)

// respOps are the opcodes a requester receives.
var respOps = [...]wire.Opcode{wire.OpAcknowledge, wire.OpAtomicAcknowledge,
	wire.OpRDMAReadResponseFirst, wire.OpRDMAReadResponseMiddle,
	wire.OpRDMAReadResponseLast, wire.OpRDMAReadResponseOnly}

// FuzzRequester posts four WRs on a connected RC QP (a 3-packet WRITE at
// PSN 5000, a 3-packet READ at 5003, a CMP_SWAP at 5006, a SEND at 5007)
// and feeds its completer arbitrary responses near those PSNs: ACKs and
// NAKs of every syndrome, READ responses of any length, atomic ACKs. An
// input is a sequence of 14-byte records: opcode selector, PSN offset
// (5000 - 2 + b%12), AETH syndrome byte, MSN, payload length (2 bytes,
// mod 1100), the atomic ACK's original value (8 bytes).
//
// Invariants: no panic; no byte of the MR changes outside the READ's and
// the atomic's local buffers, and nothing outside the MR; every packet is
// received or dropped with a reason; completions name only this input's
// WRs, each at most once and in posting order (IBTA 10.8.3: RC completes
// in order), and after an error completion only flushed ones (or the
// one error that flushed them).
func FuzzRequester(f *testing.F) {
	r := newResponderRig(f)
	rec := func(sel, psnOff, syn, msn byte, n uint16, orig uint64) []byte {
		b := []byte{sel, psnOff, syn, msn}
		b = binary.BigEndian.AppendUint16(b, n)
		return binary.BigEndian.AppendUint64(b, orig)
	}
	cat := func(rs ...[]byte) []byte {
		var out []byte
		for _, x := range rs {
			out = append(out, x...)
		}
		return out
	}
	// The happy path: ACK the WRITE, answer the READ, the atomic, ACK the SEND.
	f.Add(cat(rec(0, 4, 0, 1, 0, 0), rec(2, 5, 0, 1, 1024, 0), rec(3, 6, 0, 1, 1024, 0),
		rec(4, 7, 0, 2, 952, 0), rec(1, 8, 0, 3, 0, 7), rec(0, 9, 0, 4, 0, 0)))
	// A sequence NAK, an RNR NAK, a remote access NAK.
	f.Add(cat(rec(0, 3, 0x60, 0, 0, 0), rec(0, 2, 0x2e, 0, 0, 0), rec(0, 6, 0x62, 1, 0, 0)))
	// A READ response out of order, then an ACK past the READ (implied NAK).
	f.Add(cat(rec(3, 6, 0, 1, 1024, 0), rec(0, 9, 0, 4, 0, 0)))
	// An invalid request NAK for the SEND overtakes the READ's and the
	// atomic's responses: they are flushed, the SEND fails (failAt).
	f.Add(cat(rec(0, 4, 0, 1, 0, 0), rec(0, 9, 0xe1, 224, 0, 0)))

	var round uint64
	f.Fuzz(func(t *testing.T, in []byte) {
		orig := in
		round++
		base := round * 10
		r.connect(t) // RESET discards the last input's WRs
		r.poll()
		for i := range r.mem {
			r.mem[i] = 0xA5
		}
		mr := r.mr.Addr()
		lk := r.mr.LKey()
		_, err := r.qp.PostSend(
			SendWR{WRID: base + 1, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{{Addr: mr, Length: 3000, LKey: lk}}, RemoteAddr: 0x1000, RKey: 0x1234},
			SendWR{WRID: base + 2, Opcode: WRRDMARead, Flags: SendSignaled, SGL: []SGE{{Addr: mr + reqReadOff, Length: reqReadLen, LKey: lk}}, RemoteAddr: 0x1000, RKey: 0x1234},
			SendWR{WRID: base + 3, Opcode: WRAtomicCmpAndSwp, Flags: SendSignaled, SGL: []SGE{{Addr: mr + reqAtomicOff, Length: 8, LKey: lk}}, RemoteAddr: 0x2000, RKey: 0x1234, CompareAdd: 1, Swap: 2},
			SendWR{WRID: base + 4, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{{Addr: mr, Length: 100, LKey: lk}}})
		if err != nil {
			t.Fatalf("post: %v", err)
		}
		payload := make([]byte, 1100)
		for i := range payload {
			payload[i] = byte(i)
		}
		last, flushed, failed := base, false, false
		check := func() {
			for _, wc := range r.poll() {
				if wc.WRID <= last || wc.WRID > base+4 {
					t.Fatalf("completion %+v: want WRIDs %d..%d in order, after %d (in %x)", wc, base+1, base+4, last, orig)
				}
				// Once the QP is in ERR the rest are flushed (IBTA
				// 10.3.1, 11.6.2). One WR at most fails with the error
				// that sent it there; older READs and atomics a fatal
				// NAK overtook may be flushed before it (failAt).
				switch {
				case (flushed || failed) && wc.Status == WCSuccess,
					failed && wc.Status != WCWRFlushErr:
					t.Fatalf("completion %+v after an error completion (in %x)", wc, orig)
				}
				flushed = flushed || wc.Status == WCWRFlushErr
				failed = failed || (wc.Status != WCSuccess && wc.Status != WCWRFlushErr)
				last = wc.WRID
			}
		}
		for k := 0; len(in) >= reqRecord && k < 64; k++ {
			x := in[:reqRecord]
			in = in[reqRecord:]
			op := respOps[int(x[0])%len(respOps)]
			psn := wire.PSN(5000 - 2 + uint32(x[1]%12))
			n := int(binary.BigEndian.Uint16(x[4:])) % len(payload)
			var pl []byte
			if wire.Info(op).Mask&wire.MaskPayload != 0 {
				pl = payload[:n]
			}
			p := r.build(op, psn, pl, false, func(b []byte, info *wire.OpInfo) {
				if info.Mask&wire.MaskAETH != 0 {
					a := b[info.Offset[wire.HdrAETH]:]
					binary.BigEndian.PutUint32(a, uint32(x[2])<<24|uint32(x[3]))
				}
				if info.Mask&wire.MaskAtomicAckETH != 0 {
					wire.AtomicAckETH(b[info.Offset[wire.HdrAtomicAckETH]:]).SetOrigRemoteData(binary.BigEndian.Uint64(x[6:]))
				}
			})
			before := r.d.counters.RcvdPkts.Load() + dropTotal(&r.d.counters)
			r.deliver(p)
			if after := r.d.counters.RcvdPkts.Load() + dropTotal(&r.d.counters); after == before {
				t.Fatalf("packet % x neither received nor counted as dropped", p)
			}
			check()
		}
		if !r.guardsIntact() {
			t.Fatalf("bytes written outside the MR")
		}
		m := r.mem[rigGuard : rigGuard+rigMR]
		for i, c := range m {
			inRead := i >= reqReadOff && i < reqReadOff+reqReadLen
			inAtomic := i >= reqAtomicOff && i < reqAtomicOff+8
			if c != 0xA5 && !inRead && !inAtomic {
				t.Fatalf("MR byte %d changed to %#x: outside the READ's and the atomic's buffers", i, c)
			}
		}
		check()
	})
}
