package proc

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// KillStale stops a process left over from a previous run of the agent:
// the process with the given PID, if it still exists and its start time
// is startTicks (so a new process that reuses the PID is left alone). It
// sends SIGKILL to the process's group (when the process leads one, as
// every process started by a Launcher does) and waits until it is gone
// or a zombie. It reports whether it killed something.
func KillStale(ctx context.Context, pid int, startTicks uint64) (bool, error) {
	if pid <= 0 || startTicks == 0 {
		return false, nil
	}
	st, err := ReadStat(pid)
	if errors.Is(err, ErrNoProcess) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if st.StartTicks != startTicks || st.State == "Z" {
		return false, nil
	}
	if st.PGID == pid {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		st, err := ReadStat(pid)
		if errors.Is(err, ErrNoProcess) || (err == nil && (st.StartTicks != startTicks || st.State == "Z")) {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return true, fmt.Errorf("%w: stale pid %d: %w", ErrNotExited, pid, ctx.Err())
		case <-t.C:
		}
	}
}
