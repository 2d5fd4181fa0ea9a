package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/csiactor/csiactor/actors/plugin/proc"
)

// startProcess starts the plugin process of an exec-managed allocation.
// A failure to start counts as an exit: it is retried with backoff.
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
		a.processFailed("failed to start: " + err.Error())
		return
	}
	p, err := a.cfg.Launcher.Start(a.ctx, proc.Spec{
		Command: a.spec.command(),
		Env:     a.spec.environ(a.cfg.BaseEnv),
		Log:     a.log,
	})
	if err != nil {
		a.processFailed("failed to start: " + err.Error())
		return
	}
	a.proc = p
	a.failures = 0
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
	a.processFailed("exited: " + m.p.Status())
	a.report(ctx)
}

// processFailed records an exit (or a failed start), sets the health
// description and schedules the restart.
func (a *Actor) processFailed(what string) {
	now := time.Now()
	kept := a.exits[:0]
	for _, t := range a.exits {
		if now.Sub(t) < a.cfg.RestartBackoff.Window {
			kept = append(kept, t)
		}
	}
	a.exits = append(kept, now)
	a.restartStep++
	delay := a.cfg.RestartBackoff.Next(a.restartStep)
	delayStr := delay.Round(time.Millisecond).String()
	if n := len(a.exits); n >= a.cfg.CrashLoopExits {
		a.setHealth(false, fmt.Sprintf("crash-looping: exited %d times in %s, last: %s; restarting in %s",
			n, a.cfg.RestartBackoff.Window, what, delayStr))
	} else {
		a.setHealth(false, fmt.Sprintf("plugin process %s; restarting in %s", what, delayStr))
	}
	a.rerun.Reset(delay)
}

func (a *Actor) onRestartProcess(ctx actor.Context) {
	if a.done || a.proc != nil {
		return
	}
	a.startProcess()
	a.report(ctx)
}
