//go:build crashpoints

package snapshot

import (
	"os"
	"syscall"
)

// CrashPointEnv names the environment variable that, in a binary built
// with the crashpoints build tag, makes the process kill itself with
// SIGKILL at one fault point of the snapshot actor, optionally for one
// snapshot only: "persisted:snapshot-create@snap1". It is the volume
// actor's variable: one crash point per run, whichever actor reaches it.
const CrashPointEnv = "CSIACTOR_CRASH_AT"

// crashHook returns the fault hook that crashes at the point CrashPointEnv
// names, or nil when it names none.
func crashHook() func(point, snapshot string) {
	at := os.Getenv(CrashPointEnv)
	if at == "" {
		return nil
	}
	return func(point, snapshot string) {
		if at != point && at != point+"@"+snapshot {
			return
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
