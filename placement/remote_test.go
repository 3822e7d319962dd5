package placement

import (
	"testing"

	"github.com/softrdma/softrdma/stag"
	"github.com/stretchr/testify/require"
)

// TestRemoteStatus: every Reason a key check can give maps to the Status
// Begin returns (remoteStatus relies on the values of both types).
func TestRemoteStatus(t *testing.T) {
	for r := range 256 {
		want := RemoteAccessErr
		switch stag.Reason(r) {
		case stag.OK:
			want = OK
		case stag.Suspended:
			want = Suspended
		}
		require.Equal(t, want, remoteStatus(stag.Reason(r)), "%v", stag.Reason(r))
	}
}
