// Package e2e holds csiactor's end-to-end tests; it has no code. The tests
// build the csiactor binary, run `csiactor agent` as a real process with a
// config file that exec-manages the example plugin, and drive it with the
// CLI the way an operator would: create and claim volumes, write through
// the target paths, SIGKILL the agent halfway, start it again, check that
// no claim or mount was lost, read /metrics, and stop it with SIGTERM.
//
// They run in `make test` (with -race, and then the binary is built with
// the race detector too); -short skips them. As root the example plugin
// bind-mounts volumes and the tests check /proc/self/mountinfo; otherwise
// the target paths are symlinks and the mount checks are skipped.
// $CSIACTOR_E2E_BINARY, when set, names a csiactor binary to test instead
// of building one.
package e2e
