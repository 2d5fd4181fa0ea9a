//go:build !race

package cluster_test

// raceEnabled is true when the tests run with -race; the agents the
// process-level tests run are then built with -race too.
const raceEnabled = false
