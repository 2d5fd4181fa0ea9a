// Package acceptance holds operator-level regression tests of the csiactor
// binary: they build it, run real agents with the example plugin in
// temporary directories, and drive them with the CLI and over HTTP the way
// an operator would, checking exit codes, messages, logs and what is left
// on the host afterwards.
//
// The tests run the binary as built by `go build` (not with -race: the
// agent's own races are test/e2e's concern) and skip with -short. Mount
// checks need root, as the example plugin bind-mounts only as root.
package acceptance
