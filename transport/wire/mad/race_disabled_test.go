//go:build !race

package mad_test

// raceEnabled is set when the race detector is on; allocation counts are
// not meaningful then.
const raceEnabled = false
