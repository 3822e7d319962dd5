//go:build !race

package placement_test

const raceEnabled = false
