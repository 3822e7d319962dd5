package exchange

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseDest feeds arbitrary bytes to the decoders of what a peer sends
// over the exchange before any QP exists: softrdma's QP list
// (ParseQPInfos), perftest's KEY_PRINT_FMT_GID message (ParsePerftestDest)
// and its rdma_cm form (ParsePerftestDestCM). None may panic, and what one
// accepts must survive its encoder unchanged (decode, encode, decode gives
// the same value): a value the decoder lets through that its own encoder
// cannot say back is a field it did not bound.
func FuzzParseDest(f *testing.F) {
	d := PerftestDest{LID: 1, OutReads: 16, QPN: 0x11, PSN: 0xabcdef, RKey: 0x101, VAddr: 0x7f0000001000,
		GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 1}}
	m := d.Marshal()
	f.Add(m[:])
	cm := d.MarshalCM()
	f.Add(cm[:])
	f.Add(AppendQPInfos(nil, []QPInfo{{Port: 4791, QPN: 0x11, PSN: 0xffffff, RKey: 7, VAddr: 1 << 40, Size: 4096}}))
	f.Add([]byte("0000:0000:000011:abcdef:00000101:00007f0000001000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01:00000000:"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if qs, err := ParseQPInfos(b); err == nil {
			again, err := ParseQPInfos(AppendQPInfos(nil, qs))
			require.NoError(t, err)
			require.Equal(t, qs, again)
		}
		if d, err := ParsePerftestDest(b); err == nil {
			m := d.Marshal()
			again, err := ParsePerftestDest(m[:])
			require.NoError(t, err, "%q", m[:])
			require.Equal(t, d, again)
		}
		if d, err := ParsePerftestDestCM(b); err == nil {
			m := d.MarshalCM()
			again, err := ParsePerftestDestCM(m[:])
			require.NoError(t, err)
			require.Equal(t, d, again)
		}
	})
}
