package scopes

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestValidateHostProbeBounds: a probe shorter than MinHostProbe is
// refused (a 1-ns probe made 2 clock reads and reported no stall at all);
// negative (no probe), 0 (the default), the bounds themselves pass.
func TestValidateHostProbeBounds(t *testing.T) {
	for _, c := range []struct {
		probe time.Duration
		err   string
	}{
		{-1, ""},
		{0, ""}, // the default, 1 s
		{time.Nanosecond, "scopes: host probe 1ns: at least 10ms (or negative: no probe)"},
		{MinHostProbe - 1, "at least 10ms"},
		{MinHostProbe, ""},
		{MaxHostProbe, ""},
		{MaxHostProbe + 1, "at most 1m0s"},
	} {
		cfg := Config{HostProbe: c.probe}.WithDefaults()
		err := cfg.Validate()
		if c.err == "" {
			require.NoError(t, err, "%v", c.probe)
		} else {
			require.ErrorContains(t, err, c.err, "%v", c.probe)
		}
	}
}
