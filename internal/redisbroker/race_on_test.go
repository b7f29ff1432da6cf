//go:build race

package redisbroker

// raceOn: the race detector is on, and the code under test runs several
// times slower.
const raceOn = true
