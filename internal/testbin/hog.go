package testbin

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// hogScript is what each CPUHog process runs: /bin/sh spinning on
// arithmetic in its own process (builtins only, no child), and every
// 100,000 turns (a fraction of a second) checking that process $1, the
// test binary, is still alive, so that a hog whose test binary died
// without running its cleanups (a -timeout panic, a SIGKILL) exits by
// itself instead of spinning forever. $1 is passed rather than read from
// $PPID, which would be 1 (and alive) had the test binary died before the
// shell started. $0 is the marker (see CPUHogMarker).
const hogScript = `while kill -0 "$1" 2>/dev/null; do
	i=0
	while [ "$i" -lt 100000 ]; do i=$((i + 1)); done
done`

// CPUHogMarker is in the command line of every process CPUHog starts
// (ProcessesWith finds them).
const CPUHogMarker = "csiactor-cpuhog"

// CPUHog starts n processes that each keep one CPU busy (a shell spinning
// on arithmetic, at the test's own scheduling priority), and registers
// their end in tb.Cleanup: each is killed and waited for, so none
// outlives tb and none is left a zombie. It returns their process IDs.
// A benchmark that runs its timed part beside CPUHog(b,
// runtime.GOMAXPROCS(0)) measures what it costs on a machine whose every
// CPU has other work: each of its threads then gets about half a CPU, and
// waits its turn after every sleep. CPUHog fails tb when n < 1 or a
// process does not start (it needs /bin/sh).
//
// The hogs stop when tb's cleanups run: call CPUHog inside the
// sub-benchmark (or subtest) that is to be loaded, not in its parent.
// Should the test binary die without running its cleanups, each hog
// notices within a fraction of a second that its parent is gone and
// exits.
func CPUHog(tb testing.TB, n int) []int {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("CPUHog: %d processes; want at least 1", n)
	}
	pids := make([]int, 0, n)
	for range n {
		cmd := exec.Command("/bin/sh", "-c", hogScript, CPUHogMarker, strconv.Itoa(os.Getpid()))
		if _, err := Start(tb, cmd, nil); err != nil {
			tb.Fatalf("CPUHog: start /bin/sh: %s", err)
		}
		pids = append(pids, cmd.Process.Pid)
	}
	return pids
}
