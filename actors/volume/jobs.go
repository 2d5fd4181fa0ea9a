package volume

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/csiactor/csiactor/actors/claim"
)

// jobs holds the pool that runs the goroutines volume actors own (see
// claim.StartJob) and dispatches their mailboxes.
type jobs struct {
	pool *claim.Pool
}

// pauseThen starts a job that waits out delay and then for the plugin's
// typ to be healthy (see claim.Runner.Pause), and then sends due.
func (a *volumeActor) pauseThen(ctx actor.Context, plugin string, typ claim.PluginType, delay time.Duration, due any) *claim.Job {
	runner := a.m.runner
	return claim.StartJob(a.m.pool.pool, ctx.ActorSystem().Root, ctx.Self(), func(jctx context.Context) any {
		if runner.Pause(jctx, plugin, typ, delay) != nil {
			return nil
		}
		return due
	})
}
