//go:build !race

package stag

const raceEnabled = false
