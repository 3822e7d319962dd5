package perf

import (
	"errors"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
)

func TestParseTestRoundTrips(t *testing.T) {
	for tt := WriteBW; tt <= AtomicBW; tt++ {
		got, err := ParseTest(tt.String())
		require.NoError(t, err)
		assert.Equal(t, tt, got)
	}
	_, err := ParseTest("write_bw")
	assert.Error(t, err)
	assert.Equal(t, "Test(0)", Test(0).String())
}

func TestTitlesArePerftests(t *testing.T) {
	assert.Equal(t, "RDMA_Write BW Test", WriteBW.title(FetchAndAdd))
	assert.Equal(t, "RDMA_Read Latency Test", ReadLat.title(FetchAndAdd))
	assert.Equal(t, "Send Latency Test", SendLat.title(FetchAndAdd))
	assert.Equal(t, "Atomic CMP_AND_SWAP BW Test", AtomicBW.title(CmpAndSwap))
}

func TestDefaultsArePerftests(t *testing.T) {
	for _, tc := range []struct {
		test              Test
		size, iters       int64
		tx, cqMod, inline int
	}{
		{WriteBW, 65536, 5000, 128, 100, 0},
		{ReadBW, 65536, 5000, 128, 100, 0},
		{SendBW, 65536, 5000, 128, 100, 0},
		{AtomicBW, 8, 5000, 128, 100, 0},
		{WriteLat, 2, 1000, 1, 1, 220}, // cq_mod is capped by tx_depth
		{ReadLat, 2, 1000, 1, 1, 0},
		{SendLat, 2, 1000, 1, 1, 236},
	} {
		p := Params{Inline: -1}
		p.Defaults(tc.test)
		assert.Equal(t, tc.test.String(), p.Test)
		assert.Equal(t, tc.size, p.Size, tc.test)
		assert.Equal(t, tc.iters, p.Iters, tc.test)
		assert.Equal(t, tc.tx, p.TxDepth, tc.test)
		assert.Equal(t, tc.cqMod, p.CQMod, tc.test)
		assert.Equal(t, tc.inline, p.Inline, tc.test)
		assert.Equal(t, 0, p.MTU) // the port's active MTU (setMTU)
		assert.Equal(t, 512, p.RxDepth)
		assert.Equal(t, 1, p.QPs)
		assert.Equal(t, FetchAndAdd, p.Atomic)
		assert.Equal(t, int64(-1), p.FileSize)
		require.NoError(t, p.Validate(tc.test), tc.test)
	}
}

func TestValidateRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		test Test
		mod  func(p *Params)
		want string
	}{
		{"other test", WriteBW, func(p *Params) { p.Test = "read-bw" }, "the client runs read-bw"},
		{"size 0", WriteBW, func(p *Params) { p.Size = -1 }, "size -1"},
		{"atomic size", AtomicBW, func(p *Params) { p.Size = 16 }, "size must be 8"},
		{"atomic all", AtomicBW, func(p *Params) { p.All = true }, "--all (-a): does not apply to atomic-bw"},
		{"few iters", WriteBW, func(p *Params) { p.Iters = 4 }, "--iters 4 (-n): must be 5 to 100000000"},
		{"negative duration", WriteBW, func(p *Params) { p.Duration = -time.Second }, "--duration -1s (-D): must be 100ms to 24h0m0s"},
		{"short duration", WriteBW, func(p *Params) { p.Duration = time.Nanosecond }, "--duration 1ns (-D): must be 100ms to 24h0m0s"},
		{"long duration", WriteBW, func(p *Params) { p.Duration = 100000 * time.Hour }, "--duration 100000h0m0s (-D): must be 100ms"},
		{"mtu", WriteBW, func(p *Params) { p.MTU = 1500 }, "--mtu 1500 (-m)"},
		{"tx depth", WriteBW, func(p *Params) { p.TxDepth = MaxTx + 1 }, "--tx-depth 15001 (-t)"},
		{"rx depth", SendBW, func(p *Params) { p.RxDepth = -2 }, "--rx-depth -2 (-r)"},
		{"cq mod", WriteBW, func(p *Params) { p.CQMod = MaxCQMod + 1 }, "--cq-mod 1025 (-Q)"},
		{"qps", WriteBW, func(p *Params) { p.QPs = MaxQPs + 1 }, "--qp 16385 (-q)"},
		{"lat qps", WriteLat, func(p *Params) { p.QPs = 2 }, "one QP"},
		{"inline", WriteBW, func(p *Params) { p.Inline = 2000 }, "--inline_size 2000 (-I): must be 0 to 1024"},
		{"qp timeout", WriteBW, func(p *Params) { p.QPTimeout = 40 }, "--qp-timeout 40 (-u): must be 1 to 31"},
		{"atomic type", AtomicBW, func(p *Params) { p.Atomic = "SWAP" }, `--atomic_type "SWAP" (-A)`},
		{"file qps", WriteBW, func(p *Params) { p.QPs, p.FileSize = 2, 10 }, "one QP"},
		{"verify write qps", WriteBW, func(p *Params) { p.QPs, p.Verify = 2, true }, "one QP"},
		{"file all", WriteBW, func(p *Params) { p.All, p.FileSize = true, 10 }, "--file and --all"},
	} {
		p := Params{}
		p.Defaults(tc.test)
		tc.mod(&p)
		err := p.Validate(tc.test)
		if assert.Error(t, err, tc.name) {
			assert.Contains(t, err.Error(), tc.want, tc.name)
			// The CLI prints the tool's name in front ("softrdma:
			// write-bw: ..."); a second one would double it.
			assert.NotRegexp(t, `^(write|read|send|atomic)-(bw|lat)`, err.Error(), tc.name)
		}
	}
	// --verify over several QPs is fine where it needs no stream.
	for _, tt := range []Test{ReadBW, AtomicBW} {
		p := Params{QPs: 4, Verify: true}
		p.Defaults(tt)
		assert.NoError(t, p.Validate(tt), tt)
	}
}

func TestSizes(t *testing.T) {
	p := Params{Size: 100}
	assert.Equal(t, []int64{100}, p.Sizes())
	p.All = true
	s := p.Sizes()
	require.Len(t, s, 23)
	assert.Equal(t, int64(2), s[0])
	assert.Equal(t, int64(1<<23), s[22])
}

func TestParseBind(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    netip.AddrPort
		hasPort bool
		err     string
	}{
		{"", netip.AddrPort{}, false, ""},
		{"10.0.0.1", netip.MustParseAddrPort("10.0.0.1:0"), false, ""},
		{"10.0.0.1:4791", netip.MustParseAddrPort("10.0.0.1:4791"), true, ""},
		{"10.0.0.1:0", netip.MustParseAddrPort("10.0.0.1:0"), true, ""},
		{"::1", netip.MustParseAddrPort("[::1]:0"), false, ""},
		{"[::1]", netip.MustParseAddrPort("[::1]:0"), false, ""},
		{"[fe80::2]:4792", netip.MustParseAddrPort("[fe80::2]:4792"), true, ""},
		{"::ffff:10.0.0.1", netip.MustParseAddrPort("10.0.0.1:0"), false, ""},
		{"0.0.0.0", netip.AddrPort{}, false, "specific IP"},
		{"host:4791", netip.AddrPort{}, false, "not an IP address"},
		{"10.0.0.1:http", netip.AddrPort{}, false, "bad port"},
		{"10.0.0.1:70000", netip.AddrPort{}, false, "bad port"},
		{"nonsense", netip.AddrPort{}, false, "want IP or IP:port"},
	} {
		got, hasPort, err := ParseBind(tc.in)
		if tc.err != "" {
			if assert.Error(t, err, tc.in) {
				assert.Contains(t, err.Error(), tc.err, tc.in)
			}
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
		assert.Equal(t, tc.hasPort, hasPort, tc.in)
	}
}

func TestParseImpair(t *testing.T) {
	imp, err := ParseImpair("")
	require.NoError(t, err)
	assert.Nil(t, imp)
	imp, err = ParseImpair("loss=0.01,reorder=0.01,dup=0.005,corrupt=0.001,seed=7")
	require.NoError(t, err)
	assert.NotNil(t, imp)
	_, err = ParseImpair("loss=2")
	assert.ErrorContains(t, err, "--impair")
}

func TestRingSlots(t *testing.T) {
	p := Params{TxDepth: 128}
	assert.Equal(t, 64, ringSlots(&p, 65536)) // 4 MiB of 64 KiB
	assert.Equal(t, 128, ringSlots(&p, 2))    // tx-depth bounds it
	assert.Equal(t, 1, ringSlots(&p, 8<<20))  // one message larger than the ring
	p.TxDepth = 1
	assert.Equal(t, 1, ringSlots(&p, 2))
}

func TestWRIDRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		kind uint64
		qp   int
		idx  int64
	}{{kindData, 0, 0}, {kindCredit, 1, 12345}, {kindRecv, 16383, 1<<40 - 1}, {kindEOS, 7, 99}} {
		w := wrid(tc.kind, tc.qp, tc.idx)
		assert.Equal(t, tc.kind, wridKind(w))
		assert.Equal(t, tc.qp, wridQP(w))
		assert.Equal(t, tc.idx, wridIdx(w))
	}
}

func TestAdvance(t *testing.T) {
	assert.Equal(t, int64(5), advance(0, 5))
	assert.Equal(t, int64(5), advance(5, 5))
	// Across the 32-bit wrap.
	assert.Equal(t, int64(1<<32+3), advance(1<<32-2, 3))
}

func TestPeakWindow(t *testing.T) {
	assert.Equal(t, int64(100), peakWindow(100, 1000, 0))
	assert.Equal(t, int64(625), peakWindow(100, 10000, 0))
	assert.Equal(t, int64(100), peakWindow(100, 10000, time.Second))
	assert.Equal(t, int64(100), peakWindow(100, -1, 0))
}

// TestSetMTU: perftest's set_mtu. Without -m the port's active MTU (a
// link of 1500 bytes gives 1024); -m above the active MTU becomes the
// active MTU with perftest's notice; -m the port carries is kept, quietly.
func TestSetMTU(t *testing.T) {
	for _, tc := range []struct {
		requested int
		active    softrdma.MTU
		want      int
		notice    string
	}{
		// No -m: the port's.
		{0, softrdma.MTU1024, 1024, ""},
		{0, softrdma.MTU4096, 4096, ""},
		{0, softrdma.MTU256, 256, ""},
		// -m larger than the port carries: the port's, and the notice.
		{4096, softrdma.MTU1024, 1024, "Requested mtu is higher than active mtu\nChanging to active mtu - 3 (1024[B])\n"},
		{2048, softrdma.MTU1024, 1024, "Requested mtu is higher than active mtu\nChanging to active mtu - 3 (1024[B])\n"},
		{4096, softrdma.MTU2048, 2048, "Requested mtu is higher than active mtu\nChanging to active mtu - 4 (2048[B])\n"},
		// -m the port carries.
		{512, softrdma.MTU1024, 512, ""},
		{1024, softrdma.MTU1024, 1024, ""},
		{4096, softrdma.MTU4096, 4096, ""},
		{256, softrdma.MTU4096, 256, ""},
	} {
		var notice string
		got := setMTU(tc.requested, tc.active, func(s string) { notice += s })
		assert.Equal(t, tc.want, got, "setMTU(%d, %v)", tc.requested, tc.active)
		assert.Equal(t, tc.notice, notice, "setMTU(%d, %v)'s notice", tc.requested, tc.active)
	}
}

// TestAgreeMTU: check_mtu's rule, the smaller of the two sides' MTUs; a
// peer's value that is no MTU (0 from an older softrdma server) is ignored.
func TestAgreeMTU(t *testing.T) {
	for _, tc := range []struct{ mine, peer, want int }{
		{1024, 4096, 1024},
		{4096, 1024, 1024},
		{512, 512, 512},
		{4096, 0, 4096},
		{1024, 1500, 1024},
		{2048, 1500, 2048},
	} {
		assert.Equal(t, tc.want, agreeMTU(tc.mine, tc.peer), "agreeMTU(%d, %d)", tc.mine, tc.peer)
	}
}

// TestPeerResultIsBoundedWhenItMatters: after this side failed, or in a
// -D run, the wait for the peer's result ends after drainLimit (a peer
// whose host died keeps its TCP connection open); after this side's own
// idle watch fired, after peerGrace only (a limit that says 10s must not
// become 20s on a dead link); after the -D bound of the wait for the
// peer's run, at once. A result that arrives is returned; an -n run that
// succeeded waits for it as perftest does. (synctest: the clock is the
// bubble's.)
func TestPeerResultIsBoundedWhenItMatters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		never := make(chan peerMsg)
		for _, tc := range []struct {
			name      string
			d         time.Duration
			runErr    error
			idleFired bool
			want      time.Duration
		}{
			{"this side failed", 0, errors.New("boom"), false, drainMin},
			{"-D run", 20 * time.Millisecond, nil, false, drainMin},
			{"-D run longer than drainMin", 30 * time.Second, nil, false, 30 * time.Second},
			{"this side's idle watch fired", 0, errors.New("no completion"), true, peerGrace},
			{"-D wait for the peer's run expired", 3 * time.Second, &noResultError{}, false, 0},
		} {
			s := &session{p: Params{Duration: tc.d}}
			start := time.Now()
			_, waited := s.peerResult(never, s.resultWait(tc.runErr, tc.idleFired))
			assert.False(t, waited, tc.name)
			assert.Equal(t, tc.want, time.Since(start), tc.name)
		}
		s := &session{}
		assert.Negative(t, s.resultWait(nil, false), "an -n run that succeeded waits for ever")
		got := make(chan peerMsg, 1)
		got <- peerMsg{r: roundResult{Err: "theirs"}}
		pm, waited := s.peerResult(got, s.resultWait(nil, false))
		assert.True(t, waited)
		assert.Equal(t, "theirs", pm.r.Err)
	})
}
