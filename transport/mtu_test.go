package transport

import "testing"

// TestActiveMTUFor: rxe's rule (eth_mtu_int_to_enum): the link MTU minus
// RXE_MAX_HDR_LENGTH (80), rounded down to an IB MTU.
func TestActiveMTUFor(t *testing.T) {
	for _, tc := range []struct {
		link int
		want MTU
	}{
		{1500, MTU1024}, {1104, MTU1024}, {1103, MTU512}, {2128, MTU2048}, {4176, MTU4096},
		{4175, MTU2048}, {9000, MTU4096}, {65536, MTU4096}, {576, MTU256}, {200, MTU256},
	} {
		if got := ActiveMTUFor(tc.link); got != tc.want {
			t.Errorf("ActiveMTUFor(%d) = %v, want %v", tc.link, got, tc.want)
		}
	}
}
