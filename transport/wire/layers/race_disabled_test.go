//go:build !race

package layers_test

// raceEnabled is set when the race detector is on; allocation counts are
// not meaningful then.
const raceEnabled = false
