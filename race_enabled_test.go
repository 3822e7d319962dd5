//go:build race

package softrdma_test

const raceEnabled = true
