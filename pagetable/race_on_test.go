//go:build race

package pagetable

const raceEnabled = true
