package scopes_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/softrdma/softrdma"
	"github.com/softrdma/softrdma/bench/scopes"
)

func TestProbeRun(t *testing.T) {
	cfg := scopes.Config{Scopes: []softrdma.Scope{softrdma.ScopeMR}, Policies: []softrdma.PausePolicy{softrdma.PolicyHold}, Duration: 1 * time.Second}
	rs, err := scopes.Run(t.Context(), cfg)
	require.NoError(t, err)
	for _, r := range rs {
		t.Logf("%s/%s wall p50 %.0f duty %.3f cpus %.2f base %.2f ratio %.3f in %.3f between %.3f", r.Scope, r.Policy, r.RemapWallP50Us, r.RemapDuty, r.CPUs, r.BaselineCPUs, float64(r.Untouched), float64(r.UntouchedInRemap), float64(r.UntouchedBetween))
		for _, rep := range r.Reports[:4] {
			t.Logf("  %+v", rep)
		}
	}
}
