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
	"github.com/csiactor/csiactor/csi"
)

// procDir is the allocation's directory: its socket, its output files
// and its process State.
func (a *Actor) procDir() string { return filepath.Dir(a.spec.Socket) }

// startProcess starts the plugin process of an exec-managed allocation,
// or, the first time, adopts the one a previous agent left running. A
// failure to start is retried with the same backoff as an exit, but is
// counted and described as a failed start, not as an exit.
func (a *Actor) startProcess() {
	if !a.adoptTried {
		a.adoptTried = true
		if a.adopt() {
			return
		}
	}
	a.killListener()
	if err := a.prepareSocketDir(); err != nil {
		a.startFailed(err, err.Error())
		return
	}
	p, err := a.cfg.Launcher.Start(a.ctx, proc.Spec{
		Command:   a.spec.command(),
		Env:       a.spec.environ(a.cfg.BaseEnv),
		OutputDir: a.procDir(),
		Log:       a.log,
	})
	if err != nil {
		a.startFailed(err, startErrorText(err))
		return
	}
	// At once: an agent killed from here on leaves a process the next one
	// must know of.
	if err := proc.WriteState(a.procDir(), p.State()); err != nil {
		a.log.WithError(err).Error("cannot record the plugin process for the next agent")
	}
	a.failures = 0
	a.startFailures = 0
	a.setHealth(false, fmt.Sprintf("starting: process %d started", p.PID()))
	a.log.WithField("pid", p.PID()).Info("plugin process started")
	a.watchProcess(p)
	// Connected already (a restart): gRPC reconnects on its own and the
	// watcher reports READY; fingerprint soon in case it never left READY.
	if a.client != nil {
		a.heart.Reset(a.cfg.UnhealthyRetry)
	}
}

// watchProcess makes p the allocation's process and sends procExited when
// it exits.
func (a *Actor) watchProcess(p *proc.Process) {
	a.proc = p
	a.status.PID, a.status.PIDStart = p.PID(), p.StartTicks()
	a.watchExit(p.Exited(), func() {
		a.send(&procExited{owner: a, p: p})
		_ = p.Wait(context.Background()) // output drained; bounded by proc
	})
}

// watchExit starts the health clock and the hung-RPC count of a new
// process or container, and calls exited, in a goroutine the actor waits
// for, when exitedCh closes (not once the actor stops).
func (a *Actor) watchExit(exitedCh <-chan struct{}, exited func()) {
	a.killedFor = ""
	a.nodeTimeouts, a.hungCheck = 0, false
	a.restartHealthClock()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		select {
		case <-exitedCh:
			exited()
		case <-a.ctx.Done():
		}
	}()
}

// adopt takes over the plugin process and log shim a previous agent left
// running, as recorded in the State file (or, for an agent that wrote
// none, in the store). It reports whether it did; if not, whatever is left
// of them has been killed. An adopted process still has to answer on its
// socket (see answered).
func (a *Actor) adopt() bool {
	dir := a.procDir()
	st, err := proc.ReadState(dir)
	if err != nil {
		a.log.WithError(err).Warn("cannot read the recorded plugin process")
	}
	if st.PID == 0 && a.stale.PID != 0 {
		st = proc.State{PID: a.stale.PID, PIDStart: a.stale.PIDStart}
	}
	if st.PID == 0 {
		return false
	}
	log := a.log.WithField("pid", st.PID)
	p, err := proc.Adopt(proc.Adopted{State: st, OutputDir: dir, Log: a.log})
	if err == nil {
		a.adopting = true
		a.setHealth(false, fmt.Sprintf("starting: adopted process %d left running by the previous agent", p.PID()))
		log.Info("adopted the plugin process left running by the previous agent")
		a.watchProcess(p)
		return true
	}
	log.WithError(err).Info("not adopting the plugin process of the previous agent")
	a.killLeftover(st)
	return false
}

// killLeftover kills what is left of the processes the State file names
// (st, for the log) and of the stale process, so that two copies of the
// plugin never run.
func (a *Actor) killLeftover(st proc.State) {
	ctx, cancel := context.WithTimeout(a.ctx, 10*time.Second)
	defer cancel()
	killed, err := proc.KillLeftover(ctx, a.procDir(), a.stale.PID, a.stale.PIDStart)
	switch {
	case err != nil:
		a.log.WithError(err).WithField("pid", st.PID).Error("could not kill the plugin process left by a previous agent")
	case killed:
		a.log.WithField("pid", st.PID).Warn("killed the plugin process left by a previous agent")
	}
	a.stale = StaleProcess{}
}

// killListener kills a process that listens on the allocation's socket
// although no record names it: one started by an agent killed before it
// wrote the State file. Two copies of the plugin never run.
func (a *Actor) killListener() {
	ctx, cancel := context.WithTimeout(a.ctx, 10*time.Second)
	defer cancel()
	pid, err := proc.KillListener(ctx, a.spec.Socket)
	switch {
	case err != nil:
		a.log.WithError(err).WithField("pid", pid).Error("could not kill the unrecorded process on the plugin's socket")
	case pid != 0:
		a.log.WithField("pid", pid).Warn("killed an unrecorded plugin process that listened on the allocation's socket")
	}
}

// answered settles an adoption with the result of the first call to the
// adopted process: one that does not answer at all is hung, and is
// replaced by a new process. It reports whether it replaced it.
func (a *Actor) answered(err error) bool {
	if !a.adopting {
		return false
	}
	a.adopting = false
	if err == nil || !csi.Unanswered(err) {
		return false
	}
	if a.ctr != nil {
		a.log.WithError(err).WithField("container", shortID(a.ctr.ID())).Warn("the adopted plugin container does not answer on its socket: killing it to start a new one")
		a.killedFor = "it did not answer when adopted"
		a.killContainer()
		return true
	}
	p := a.proc
	a.log.WithError(err).WithField("pid", p.PID()).Warn("the adopted plugin process does not answer on its socket: killing it and starting a new one")
	p.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.StopGrace+5*time.Second)
	if err := p.Stop(ctx, 0); err != nil {
		a.log.WithError(err).Error("the adopted plugin process did not stop")
	}
	cancel()
	a.proc = nil
	a.status.PID, a.status.PIDStart = 0, 0
	a.startProcess()
	return true
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
	a.adopting = false
	a.status.PID, a.status.PIDStart = 0, 0
	a.status.Exits++
	if err := proc.RemoveState(a.procDir()); err != nil {
		a.log.WithError(err).Debug("remove the recorded plugin process")
	}
	if time.Since(m.p.Started()) >= a.cfg.RestartBackoff.Window {
		a.restartStep = 0 // it ran well for a while: start the backoff over
	}
	status := m.p.Status()
	if a.killedFor != "" {
		status = "signal: killed after " + a.killedFor
	}
	a.log.WithField("status", status).Warn("plugin process exited")
	a.processExited(status)
	a.hung.Stop() // the restart starts the clock again
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

// startPlugin starts the plugin process or container of a managed
// allocation.
func (a *Actor) startPlugin() {
	if a.spec.ContainerManaged() {
		a.startContainer()
		return
	}
	a.startProcess()
}

func (a *Actor) onRestartProcess(ctx actor.Context) {
	if a.done || a.proc != nil || a.ctr != nil {
		return
	}
	a.startPlugin()
	a.report(ctx)
}

// restartHealthClock starts HealthTimeout over: on every start, adoption
// and transition to unhealthy.
func (a *Actor) restartHealthClock() {
	a.unhealthySince = time.Now()
	a.hung.Reset(a.cfg.HealthTimeout)
}

// onHealthTimedOut acts on an allocation unhealthy for HealthTimeout: the
// process of an exec-managed one is killed (its exit restarts it with the
// backoff); an attached one is described as overdue.
func (a *Actor) onHealthTimedOut(ctx actor.Context) {
	if a.done || a.status.Healthy || a.unhealthySince.IsZero() || a.procDown() {
		return
	}
	if left := a.cfg.HealthTimeout - time.Since(a.unhealthySince); left > 0 {
		a.hung.Reset(left)
		return
	}
	if a.spec.ContainerManaged() {
		if a.killedFor != "" {
			return
		}
		a.log.WithField("container", shortID(a.ctr.ID())).WithField("reason", a.status.Description).
			Warnf("plugin not healthy for %s: killing its container to restart it", a.cfg.HealthTimeout)
		a.killedFor = fmt.Sprintf("it was not healthy for %s", a.cfg.HealthTimeout)
		a.killContainer()
		return
	}
	if a.spec.ExecManaged() {
		if a.killedFor != "" {
			return
		}
		a.log.WithField("pid", a.proc.PID()).WithField("reason", a.status.Description).
			Warnf("plugin not healthy for %s: killing its process to restart it", a.cfg.HealthTimeout)
		a.killedFor = fmt.Sprintf("it was not healthy for %s", a.cfg.HealthTimeout)
		a.proc.Kill()
		return
	}
	if !a.overdue {
		a.overdue = true
		a.log.WithField("reason", a.status.Description).Warnf("attached plugin not healthy for %s; it runs outside the agent, which only reports it", a.cfg.HealthTimeout)
		a.setHealth(false, a.status.Description)
		a.report(ctx)
	}
}
