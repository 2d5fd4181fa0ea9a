package claim

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/csi"
)

func (a *Actor) askTurn(ctx actor.Context) {
	ctx.Send(ctx.Parent(), &TurnRequest{Alloc: a.cfg.Alloc})
}

func (a *Actor) run(ctx actor.Context, s Step) {
	if a.job != nil {
		// Cannot happen: the volume grants one turn at a time. Keep the
		// step that is running.
		a.log.WithField("method", s.Method.String()).Warn("turn granted while a step is running; ignoring it")
		return
	}
	a.job = a.cfg.Runner.StartStep(a.cfg.Pool, ctx.ActorSystem().Root, ctx.Self(), s, func(res Result) any {
		return &stepFinished{owner: a, step: s, res: res}
	})
}

func (a *Actor) finished(ctx actor.Context, msg *stepFinished) {
	if msg.owner != a {
		return // from an incarnation before a restart
	}
	a.job.Stop()
	a.job = nil
	if a.cfg.Hook != nil {
		a.cfg.Hook("claim-done:"+msg.step.Method.String(), a.cfg.Volume)
	}
	ctx.Send(ctx.Parent(), &StepDone{Alloc: a.cfg.Alloc, Step: msg.step, Result: msg.res})
	if msg.res.OK() {
		a.attempt = 0
		return // the volume answers with the next Turn or Freed
	}
	delay := a.cfg.Backoff.Delay(a.attempt)
	a.attempt++
	a.cfg.Runner.Retrying(a.cfg.Plugin, msg.step.Method.String())
	log := a.log.WithError(msg.res.Err).WithFields(logrus.Fields{
		"method": msg.step.Method.String(), "attempt": a.attempt, "delay": delay,
	})
	if msg.res.Outcome == csi.Final {
		// Teardown never gives up: the step stays in its state and is
		// retried, slowly, until an operator fixes what the plugin refuses.
		log.Error("release step refused by the plugin; retrying with backoff")
	} else {
		log.Info("release step failed; retrying with backoff")
	}
	self, root, runner := ctx.Self(), ctx.ActorSystem().Root, a.cfg.Runner
	plugin, typ := a.cfg.Plugin, msg.step.Method.PluginType()
	a.job = StartJob(a.cfg.Pool, root, self, func(jctx context.Context) any {
		if runner.Pause(jctx, plugin, typ, delay) != nil {
			return nil
		}
		return &pauseOver{owner: a}
	})
}

func (a *Actor) paused(ctx actor.Context, msg *pauseOver) {
	if msg.owner != a {
		return
	}
	a.job.Stop()
	a.job = nil
	a.askTurn(ctx)
}

func (a *Actor) freed(ctx actor.Context) {
	a.stopWork()
	ctx.Stop(ctx.Self())
}

func (a *Actor) stopWork() {
	a.job.Stop()
	a.job = nil
}
