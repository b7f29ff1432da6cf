//go:build race

package disker_test

// raceOn: the race detector is on, and the code under test runs several
// times slower.
const raceOn = true
