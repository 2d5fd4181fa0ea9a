package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/csiactor/csiactor/actors/plugin/proc"
	"github.com/csiactor/csiactor/csi"
)

// send delivers a message to the actor from one of its goroutines.
func (a *Actor) send(m any) { a.system.Root.Send(a.self, m) }

func (a *Actor) onStarted(ctx actor.Context) {
	a.system, a.self = ctx.ActorSystem(), ctx.Self()
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.status = Status{Description: "starting: connecting to " + a.spec.Socket, Since: time.Now()}
	a.heart = startTimer(a.ctx, &a.wg, func() { a.send(&heartbeat{a}) })
	a.heart.Reset(a.cfg.HeartbeatInterval)
	a.hung = startTimer(a.ctx, &a.wg, func() { a.send(&healthTimedOut{a}) })
	a.restartHealthClock()
	if a.spec.Managed() {
		a.rerun = startTimer(a.ctx, &a.wg, func() { a.send(&restartProcess{a}) })
		a.startPlugin()
	}
	a.dial()
	a.log.WithField("socket", a.spec.Socket).Debug("allocation actor started")
	a.report(ctx)
}

// onRestarting tears the failed incarnation down; the next one starts from
// the spec. The parent hears that the client is gone.
func (a *Actor) onRestarting(ctx actor.Context) {
	a.log.Warn("allocation actor restarting after a failure")
	a.teardown("actor restarting after a failure")
	a.report(ctx)
}

func (a *Actor) onStopping(ctx actor.Context) {
	a.teardown(ReasonShutdown)
	a.sendStopped(ctx, ReasonShutdown)
}

func (a *Actor) onShutdown(ctx actor.Context, m *Shutdown) {
	reason := m.Reason
	if reason == "" {
		reason = ReasonShutdown
	}
	a.teardown(reason)
	a.sendStopped(ctx, reason)
	ctx.Stop(ctx.Self())
}

func (a *Actor) sendStopped(ctx actor.Context, reason string) {
	if a.sentLast {
		return
	}
	a.sentLast = true
	a.reported = a.status
	if p := ctx.Parent(); p != nil {
		ctx.Request(p, &Stopped{ID: a.spec.ID, Status: a.status, Reason: reason})
	}
}

// teardown stops the process, ends every goroutine and waits for them,
// closes the client and runs the last fingerprint with it closed, so that
// the final status is unhealthy with reason as its description. It blocks
// the actor for at most StopGrace plus a few seconds.
func (a *Actor) teardown(reason string) {
	if a.done || a.cancel == nil {
		return
	}
	a.done = true
	a.cancel()
	keep := reason == ReasonShutdown && !a.cfg.StopOnShutdown
	switch {
	case a.proc != nil && keep:
		a.proc.Detach()
		a.log.WithField("pid", a.proc.PID()).Info("plugin process left running for the next agent")
		a.proc = nil
	case a.proc != nil:
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.StopGrace+5*time.Second)
		if err := a.proc.Stop(ctx, a.cfg.StopGrace); err != nil {
			a.log.WithError(err).Error("plugin process did not stop")
		} else {
			a.log.WithField("status", a.proc.Status()).Info("plugin process stopped")
			if err := proc.RemoveState(a.procDir()); err != nil {
				a.log.WithError(err).Warn("remove the recorded plugin process")
			}
		}
		cancel()
		a.proc = nil
		a.status.PID, a.status.PIDStart = 0, 0
	}
	if a.spec.ContainerManaged() {
		a.stopContainer(keep, reason == ReasonDeregistered)
	}
	a.wg.Wait()
	if c := a.handoff.take(); c != nil {
		if a.client == nil {
			a.client = c
		} else {
			_ = c.Close()
		}
	}
	if a.client != nil {
		_ = a.client.Close()
		// The last fingerprint, with the closed client: it fails at once
		// (ErrClosed) and leaves the allocation unhealthy with its last
		// known plugin info, which is what the registry persists.
		if _, err := fingerprint(context.Background(), a.client, a.spec.Type); err != nil && !errors.Is(err, csi.ErrClosed) {
			a.log.WithError(err).Debug("last fingerprint")
		}
	}
	a.status.Client = nil
	a.setHealth(false, reason)
	if reason == ReasonDeregistered && a.spec.Managed() {
		if err := os.RemoveAll(filepath.Dir(a.spec.Socket)); err != nil {
			a.log.WithError(err).Warn("remove socket directory")
		}
	}
}

// setHealth sets health and description, logging transitions, and keeps
// the HealthTimeout clock.
func (a *Actor) setHealth(healthy bool, desc string) {
	switch {
	case healthy:
		a.unhealthySince = time.Time{}
		a.overdue = false
		if a.hung != nil {
			a.hung.Stop()
		}
	case a.unhealthySince.IsZero() && !a.done && a.hung != nil:
		a.restartHealthClock()
	}
	if a.overdue && !healthy && !a.done {
		desc = fmt.Sprintf("not healthy for over %s: %s", a.cfg.HealthTimeout, strings.TrimPrefix(desc, "not healthy for over "+a.cfg.HealthTimeout.String()+": "))
	}
	if a.status.Healthy != healthy {
		a.status.Since = time.Now()
		switch {
		case healthy:
			a.log.Info("plugin allocation healthy")
		case a.done:
			// The allocation stops (agent shutdown, deregistration): an
			// expected end, not a problem to warn about.
			a.log.WithField("reason", desc).Info("plugin allocation stopped")
		default:
			a.log.WithField("reason", desc).Warn("plugin allocation unhealthy")
		}
	}
	a.status.Healthy = healthy
	a.status.Description = desc
}

// report sends StatusChanged to the parent when the status differs from
// the last one sent (the fingerprint's timestamp aside).
func (a *Actor) report(ctx actor.Context) {
	if sameStatus(a.status, a.reported) {
		return
	}
	a.reported = a.status
	if p := ctx.Parent(); p != nil {
		ctx.Request(p, &StatusChanged{ID: a.spec.ID, Status: a.status})
	}
}

func sameStatus(x, y Status) bool {
	x.Fingerprint.At, y.Fingerprint.At = time.Time{}, time.Time{}
	return reflect.DeepEqual(x, y)
}
