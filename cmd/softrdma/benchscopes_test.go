package main

import (
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBenchScopes runs `softrdma bench scopes` briefly with every output:
// the table, --csv, --plot, and --json.
func TestBenchScopes(t *testing.T) {
	dir := t.TempDir()
	csvPath, svgPath := filepath.Join(dir, "s.csv"), filepath.Join(dir, "s.svg")
	short := []string{"bench", "scopes", "-D", "100ms", "--slice", "50ms", "--settle", "5ms", "-T", "5ms", "--mr-size", "128K", "--policy", "hold"}
	code, out, errOut := runCLI(t, append(short, "--scope", "mr,device", "--csv", csvPath, "--plot", svgPath)...)
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	require.Contains(t, out, "scope experiment (loopback): 8 QPs over 4 MRs in 2 PDs")
	require.Contains(t, out, "targets (issue 4), mr scope, hold")
	f, err := os.Open(csvPath)
	require.NoError(t, err)
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Len(t, recs, 3) // header, mr, device
	svg, err := os.ReadFile(svgPath)
	require.NoError(t, err)
	require.True(t, strings.Contains(string(svg), "<svg"))

	code, out, errOut = runCLI(t, append(short, "--json", "--scope", "pd")...)
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	var rs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rs))
	require.Len(t, rs, 1)
	require.Equal(t, "pd", rs[0]["scope"])
}

func TestBenchScopesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "scopes", "--scope", "page"},
		{"bench", "scopes", "--policy", "drop"},
		{"bench", "scopes", "--mrs", "2", "--pds", "3"},
		{"bench", "scopes", "--mr-kind", "odp", "--profile", "t3"},
	} {
		code, _, _ := runCLI(t, args...)
		require.Equal(t, exitUsage, code, "%v", args)
	}
}

// TestBenchScopesNetns runs the experiment with --netns: the devices in
// two network namespaces joined by a veth pair. It needs root and
// iproute2's ip; otherwise it skips.
func TestBenchScopesNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces and a veth pair")
	}
	if _, err := os.Stat("/var/run/netns"); err != nil && !os.IsNotExist(err) {
		t.Skipf("no network namespaces here: %v", err)
	}
	code, out, errOut := runCLI(t, "bench", "scopes", "--netns", "-D", "100ms", "--slice", "50ms", "--settle", "5ms", "-T", "5ms",
		"--mr-size", "128K", "--scope", "mr", "--policy", "hold,nak")
	if code != exitOK && strings.Contains(errOut, "ip netns add") {
		t.Skipf("cannot create network namespaces: %s", errOut)
	}
	require.Equal(t, exitOK, code, "stderr: %s", errOut)
	require.Contains(t, out, "scope experiment (netns)")
	require.Contains(t, errOut, "over a veth pair")
}
