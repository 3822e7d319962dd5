package wire_test

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma/transport/wire"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite testdata/fuzz/FuzzParse from Encode and the golden captures")

// FuzzParse checks that Parse never panics and that what it accepts is
// consistent: every header view lies inside the packet, and headers,
// payload, pad and ICRC add up to the packet length.
//
// Seeds: testdata/fuzz/FuzzParse (one packet of every opcode built with
// Encode, and one golden rxe packet per capture, opcode and length; see
// TestWriteFuzzCorpus), plus every packet of the golden captures when
// shared/rxe-testbed is present.
func FuzzParse(f *testing.F) {
	golden.once.Do(func() { golden.pkts, golden.err = loadGolden() })
	for _, g := range golden.pkts {
		f.Add(g.roce)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p wire.Packet
		err := wire.Parse(b, &p)
		if err != nil {
			require.True(t, errors.Is(err, wire.ErrTooShort) || errors.Is(err, wire.ErrUnknownOpcode) ||
				errors.Is(err, wire.ErrBadTVer) || errors.Is(err, wire.ErrBadPad), err)
			return
		}
		info := p.Info
		require.True(t, info.Valid())
		require.Equal(t, len(b), info.Length+len(p.Payload)+p.PadCount()+wire.ICRCSize)
		if len(p.Payload) > 0 {
			require.Same(t, &b[info.Length], &p.Payload[0], "Payload aliases the packet")
		}
		for h := wire.HdrBTH; h <= wire.HdrPayload; h++ {
			hdr := p.Header(h)
			if hdr == nil || h == wire.HdrPayload {
				continue
			}
			o := int(info.Offset[h])
			require.LessOrEqual(t, o+len(hdr), info.Length)
			require.Same(t, &b[o], &hdr[0])
		}
		bth := p.BTH()
		_, _, _, _ = bth.PSN(), bth.DestQP(), bth.AckReq(), bth.PKey()
		if info.Has(wire.MaskRETH) {
			_, _, _ = p.RETH().VA(), p.RETH().RKey(), p.RETH().DMALength()
		}
		if info.Has(wire.MaskAETH) {
			_, _ = p.AETH().Syndrome().Type(), p.AETH().MSN()
		}
		if info.Has(wire.MaskAtomicETH) {
			_, _, _, _ = p.AtomicETH().VA(), p.AtomicETH().RKey(), p.AtomicETH().SwapAdd(), p.AtomicETH().Compare()
		}
		if info.Has(wire.MaskAtomicAckETH) {
			_ = p.AtomicAckETH().OrigRemoteData()
		}
		if info.Has(wire.MaskImmDt) {
			_ = p.ImmDt().Imm()
		}
		if info.Has(wire.MaskIETH) {
			_ = p.IETH().RKey()
		}
		if info.Has(wire.MaskDETH) {
			_, _ = p.DETH().QKey(), p.DETH().SrcQP()
		}
		// The ICRC functions accept whatever Parse accepts.
		h := wire.IPHeader{Src: vm0, Dst: vm1, DF: true}
		_, _ = wire.VerifyICRC(&h, 49441, wire.RoCEv2Port, b)
		h6 := wire.IPHeader{Src: vm0v6, Dst: vm1v6}
		_ = wire.VerifyICRCExact(&h6, 49441, wire.RoCEv2Port, b)
	})
}

// TestWriteFuzzCorpus regenerates testdata/fuzz/FuzzParse:
//
//	go test ./transport/wire -run TestWriteFuzzCorpus -update-corpus
func TestWriteFuzzCorpus(t *testing.T) {
	if !*updateCorpus {
		t.Skip("run with -update-corpus to rewrite testdata/fuzz/FuzzParse")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzParse")
	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.MkdirAll(dir, 0o755))
	write := func(name string, b []byte) {
		data := fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", b)
		sum := sha256.Sum256(data)
		name = fmt.Sprintf("%s-%x", name, sum[:4])
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
	}
	r := rand.New(rand.NewPCG(4791, 1))
	h := &wire.IPHeader{Src: vm1, Dst: vm0, DF: true}
	for _, op := range validOpcodes() {
		b := buildPacket(op, 1+r.IntN(64), r)
		wire.PutICRC(h, 49441, wire.RoCEv2Port, b)
		write(fmt.Sprintf("encode-%02x-%s", uint8(op), op), b)
	}
	// One golden packet per capture set, capture, opcode and length keeps
	// every shape rxe produced without committing megabytes of payload;
	// FuzzParse adds all of them at run time when the captures are there.
	seen := map[string]bool{}
	var p wire.Packet
	for _, g := range goldenPackets(t) {
		require.NoError(t, wire.Parse(g.roce, &p))
		key := fmt.Sprintf("golden-%s-%s-%s-%d", filepath.Dir(g.capture), g.name, p.Opcode(), len(g.roce))
		if seen[key] {
			continue
		}
		seen[key] = true
		write(key, g.roce)
	}
}
