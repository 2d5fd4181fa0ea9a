//go:build crashpoints

package volume

import (
	"os"
	"syscall"
)

// CrashPointEnv names the environment variable that, in a binary built
// with the crashpoints build tag, makes the process kill itself with
// SIGKILL (as a crash or the OOM killer would) at one fault point of the
// volume and claim actors: "persist:NodeStageVolume" (before that step's
// result is written), "persisted:NodeStageVolume" (after),
// "claim-done:NodeUnpublishVolume" (a release step done, not yet
// reported), optionally for one volume only:
// "persisted:NodeStageVolume@vol1". The end-to-end tests use it; a build
// without the tag has no crash points at all.
const CrashPointEnv = "CSIACTOR_CRASH_AT"

// crashHook returns the fault hook that crashes at the point CrashPointEnv
// names, or nil when it names none.
func crashHook() func(point, volume string) {
	at := os.Getenv(CrashPointEnv)
	if at == "" {
		return nil
	}
	return func(point, volume string) {
		if at != point && at != point+"@"+volume {
			return
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
