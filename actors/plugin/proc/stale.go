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

// KillLeftover stops what a previous run of the agent left running for a
// plugin whose output directory is dir: the plugin process and its log
// shim recorded in dir's State, and the process pid with start time
// startTicks (from the store; zero for none), each only if it still runs
// with its recorded start time. It then removes the State file. It
// reports whether it killed anything.
func KillLeftover(ctx context.Context, dir string, pid int, startTicks uint64) (bool, error) {
	st, err := ReadState(dir)
	if err != nil {
		return false, err
	}
	var killed bool
	var errs []error
	for _, p := range []struct {
		pid   int
		start uint64
	}{{st.PID, st.PIDStart}, {pid, startTicks}, {st.ShimPID, st.ShimPIDStart}} {
		k, err := KillStale(ctx, p.pid, p.start)
		killed = killed || k
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return killed, err
	}
	return killed, RemoveState(dir)
}
