package conn

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDelayLineReleasesInTimeOrderFIFOAmongEquals(t *testing.T) {
	var d delayLine
	t0 := time.Unix(1000, 0)
	r := rand.New(rand.NewPCG(1, 1))
	type rec struct {
		at  time.Duration
		seq int
	}
	var want []rec
	for i := range 500 {
		at := time.Duration(r.IntN(20)) * time.Millisecond // many equal times
		d.push(t0.Add(at), item{pos: int32(i), buf: []byte{byte(at / time.Millisecond)}})
		want = append(want, rec{at, i})
	}
	slices.SortStableFunc(want, func(a, b rec) int { return int(a.at - b.at) })
	for i, w := range want {
		require.Equal(t, t0.Add(w.at), d.h[0].at)
		it := d.pop()
		require.Equal(t, int32(w.seq), it.pos, "pop %d", i)
	}
	require.Empty(t, d.h)
}

func TestImpairerHoldsReorderedPacketsBehindLaterOnes(t *testing.T) {
	var st ImpairStats
	var im impairer
	im.init(DirTx, &st, new(bufPool))
	im.begin(&Impairment{Reorder: 1, ReorderGap: 1})
	now := time.Unix(0, 0)
	// Every packet is held for exactly one later packet, but held packets
	// only count down on packets that go out, so with Reorder 1 nothing
	// goes out until the hold expires...
	var out []item
	for i := range 3 {
		out = im.process(out, item{buf: make([]byte, 16), pos: int32(i)}, now)
	}
	require.Empty(t, out)
	im.settle()
	for _, h := range im.held {
		require.NotNil(t, h.it.pb, "held packets own their bytes after settle")
	}
	out = im.due(out, now.Add(DefaultReorderHold))
	require.Len(t, out, 3)
	// ... and once a packet does go out, the held one follows it.
	im.begin(&Impairment{Reorder: 1, ReorderGap: 1, Seed: 1})
	out = im.process(out[:0], item{buf: make([]byte, 16), pos: 10}, now)
	im.begin(&Impairment{Seed: 2})
	out = im.process(out, item{buf: make([]byte, 16), pos: 11}, now)
	require.Equal(t, []int32{11, 10}, []int32{out[0].pos, out[1].pos})
	require.Equal(t, uint64(4), st.Reordered.Load())
	next, ok := im.next()
	require.False(t, ok, "nothing held: %v", next)
}

func TestBufPoolClassesAndReuse(t *testing.T) {
	var p bufPool
	for _, n := range []int{1, 2048, 2049, 9 << 10, 9<<10 + 1, MaxPacketSize} {
		b := p.get(n)
		require.Len(t, b.b, n)
		require.GreaterOrEqual(t, cap(b.b), n)
		p.put(b)
		require.Same(t, b, p.get(n), "reused")
	}
}
