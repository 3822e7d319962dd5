package pagetable

// RaceEnabled exports raceEnabled to the external tests.
const RaceEnabled = raceEnabled
