package proc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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
// with its recorded start time. It then removes the State file (a broken
// one too, after killing the store's process), unless a process would not
// die. It reports whether it killed anything.
func KillLeftover(ctx context.Context, dir string, pid int, startTicks uint64) (bool, error) {
	var killed, stuck bool
	var errs []error
	st, err := ReadState(dir)
	if err != nil {
		errs = append(errs, err) // a broken file: the store's process is still killed
	}
	for _, p := range []struct {
		pid   int
		start uint64
	}{{st.PID, st.PIDStart}, {pid, startTicks}, {st.ShimPID, st.ShimPIDStart}} {
		k, err := KillStale(ctx, p.pid, p.start)
		killed = killed || k
		if err != nil {
			errs = append(errs, err)
			stuck = true
		}
	}
	if !stuck { // else keep the record: the process may still be there
		if err := RemoveState(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return killed, errors.Join(errs...)
}

// KillListener kills the process that listens on the unix socket path, if
// one does (found by SO_PEERCRED on a connection to it), with its process
// group, and reports its PID (0 when nothing answered). It is for a
// plugin's own socket, where anything listening is a plugin process left
// by an agent that was killed before it could record it: without this, a
// new plugin would start beside it.
func KillListener(ctx context.Context, path string) (int, error) {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return 0, nil // nothing listens (or no socket at all)
	}
	defer c.Close()
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("socket %s: %w", path, err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, fmt.Errorf("socket %s: %w", path, err)
	}
	if cerr != nil {
		return 0, fmt.Errorf("socket %s: peer credentials: %w", path, cerr)
	}
	pid := int(cred.Pid)
	if pid <= 0 || pid == os.Getpid() {
		return 0, nil // another PID namespace, or this very process
	}
	st, err := ReadStat(pid)
	if errors.Is(err, ErrNoProcess) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	_ = c.Close() // let it go before it is killed
	if _, err := KillStale(ctx, pid, st.StartTicks); err != nil {
		return pid, err
	}
	return pid, nil
}
