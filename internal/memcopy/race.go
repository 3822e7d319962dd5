//go:build race || asan || msan

package memcopy

// raceEnabled: the race detector, ASan or MSan is on. Copy is then the
// built-in copy, whose calls the compiler instruments for them.
const raceEnabled = true
