package pingpong

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
)

// TestPingpongUCUD runs uc-pingpong and ud-pingpong between two devices in
// this process, with every message verified.
func TestPingpongUCUD(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"uc multi-packet", Options{Type: softrdma.QPTypeUC, Iters: 30, Size: 4096, MTU: 1024}},
		{"uc odd size mtu256", Options{Type: softrdma.QPTypeUC, Iters: 10, Size: 1001, MTU: 256}},
		{"ud 512", Options{Type: softrdma.QPTypeUD, Iters: 30, Size: 512, MTU: 4096}},
		{"ud full datagram", Options{Type: softrdma.QPTypeUD, Iters: 10, Size: 4096, MTU: 4096}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			o.GIDIndex, o.Verify, o.RxDepth = 1, true, DefaultRxDepth
			so, co, serr, cerr := pair(t, o, o)
			require.NoError(t, cerr, "client:\n%s", co)
			require.NoError(t, serr, "server:\n%s", so)
			for _, out := range []string{so, co} {
				require.Contains(t, out, fmt.Sprintf("verified %d messages of %d bytes", o.Iters, o.Size))
				require.Regexp(t, reIters, out)
			}
		})
	}
	o := Options{Type: softrdma.QPTypeUD, Iters: 1, Size: 4097, MTU: 4096, RxDepth: 1}
	var ue *UsageError
	require.ErrorAs(t, o.Validate(), &ue, "a datagram above the MTU")
}
