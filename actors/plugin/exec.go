package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/csiactor/csiactor/actors/plugin/proc"
)

// startProcess starts the plugin process of an exec-managed allocation.
// A failure to start is retried with the same backoff as an exit, but is
// counted and described as a failed start, not as an exit.
func (a *Actor) startProcess() {
	if a.stale.PID != 0 {
		ctx, cancel := context.WithTimeout(a.ctx, 10*time.Second)
		killed, err := proc.KillStale(ctx, a.stale.PID, a.stale.PIDStart)
		cancel()
		switch {
		case err != nil:
			a.log.WithError(err).WithField("pid", a.stale.PID).Error("could not kill the plugin process left by a previous agent")
		case killed:
			a.log.WithField("pid", a.stale.PID).Warn("killed the plugin process left by a previous agent")
		}
		a.stale = StaleProcess{}
	}
	if err := a.prepareSocketDir(); err != nil {
		a.startFailed(err, err.Error())
		return
	}
	p, err := a.cfg.Launcher.Start(a.ctx, proc.Spec{
		Command: a.spec.command(),
		Env:     a.spec.environ(a.cfg.BaseEnv),
		Log:     a.log,
	})
	if err != nil {
		a.startFailed(err, startErrorText(err))
		return
	}
	a.proc = p
	a.failures = 0
	a.startFailures = 0
	a.status.PID, a.status.PIDStart = p.PID(), p.StartTicks()
	a.setHealth(false, fmt.Sprintf("starting: process %d started", p.PID()))
	a.log.WithField("pid", p.PID()).Info("plugin process started")
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		select {
		case <-p.Exited():
			a.send(&procExited{owner: a, p: p})
			_ = p.Wait(context.Background()) // output drained; bounded by proc
		case <-a.ctx.Done():
		}
	}()
	// Connected already (a restart): gRPC reconnects on its own and the
	// watcher reports READY; fingerprint soon in case it never left READY.
	if a.client != nil {
		a.heart.Reset(a.cfg.UnhealthyRetry)
	}
}

// prepareSocketDir creates <data_dir>/plugins/<id> with mode 0700 and
// removes a socket left by an earlier process, so that Dial waits for the
// new one.
func (a *Actor) prepareSocketDir() error {
	dir := filepath.Dir(a.spec.Socket)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create socket directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("create socket directory: %w", err)
	}
	if err := os.Remove(a.spec.Socket); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove old socket: %w", err)
	}
	return nil
}

func (a *Actor) onProcExited(ctx actor.Context, m *procExited) {
	if a.done || m.p != a.proc {
		return
	}
	a.proc = nil
	a.status.PID, a.status.PIDStart = 0, 0
	a.status.Exits++
	if time.Since(m.p.Started()) >= a.cfg.RestartBackoff.Window {
		a.restartStep = 0 // it ran well for a while: start the backoff over
	}
	a.log.WithField("status", m.p.Status()).Warn("plugin process exited")
	a.processExited(m.p.Status())
	a.report(ctx)
}

// processExited records an exit with its status ("exit status 7",
// "signal: killed"), sets the health description and schedules the
// restart.
func (a *Actor) processExited(status string) {
	now := time.Now()
	kept := a.exits[:0]
	for _, t := range a.exits {
		if now.Sub(t) < a.cfg.RestartBackoff.Window {
			kept = append(kept, t)
		}
	}
	a.exits = append(kept, now)
	delay := a.nextRestart()
	if n := len(a.exits); n >= a.cfg.CrashLoopExits {
		a.setHealth(false, fmt.Sprintf("crash-looping: exited %d times in %s, last with %s; restarting in %s",
			n, a.cfg.RestartBackoff.Window, status, delay))
	} else {
		a.setHealth(false, fmt.Sprintf("plugin process exited with %s; restarting in %s", status, delay))
	}
}

// startFailed records a failed start: the health says why ("failed to
// start: fork/exec /x: no such file or directory"), and after more than
// one in a row how many ("cannot start plugin (3 attempts): …"). The start
// is retried with backoff.
func (a *Actor) startFailed(err error, why string) {
	a.startFailures++
	delay := a.nextRestart()
	a.log.WithError(err).WithField("attempts", a.startFailures).Warn("plugin process failed to start")
	if a.startFailures == 1 {
		a.setHealth(false, fmt.Sprintf("failed to start: %s; retrying in %s", why, delay))
	} else {
		a.setHealth(false, fmt.Sprintf("cannot start plugin (%d attempts): %s; retrying in %s", a.startFailures, why, delay))
	}
}

// nextRestart schedules the next start of the process after the next
// backoff delay, and returns the delay (rounded to the millisecond).
func (a *Actor) nextRestart() time.Duration {
	a.restartStep++
	delay := a.cfg.RestartBackoff.Next(a.restartStep)
	a.rerun.Reset(delay)
	return delay.Round(time.Millisecond)
}

// startErrorText is what the health says about a launcher error: the
// error from the system (fork/exec or the PATH lookup), which names the
// command, without the wrapping.
func startErrorText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Error()
	}
	var ee *exec.Error
	if errors.As(err, &ee) {
		return ee.Error()
	}
	return err.Error()
}

func (a *Actor) onRestartProcess(ctx actor.Context) {
	if a.done || a.proc != nil {
		return
	}
	a.startProcess()
	a.report(ctx)
}
