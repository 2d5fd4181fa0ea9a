//go:build race

package partition

// raceEnabled is true when the tests run with -race; the agents are then
// built with -race too.
const raceEnabled = true
