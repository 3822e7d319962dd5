//go:build !race && !asan && !msan

package memcopy

const raceEnabled = false
