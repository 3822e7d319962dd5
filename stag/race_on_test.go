//go:build race

package stag

const raceEnabled = true
