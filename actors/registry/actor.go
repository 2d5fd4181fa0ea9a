package registry

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/internal/actorkit"
)

// Actor is the registry actor. Its fields belong to its goroutine.
type Actor struct {
	cfg Config
	log *logrus.Entry
	sh  *shared

	allocs  map[string]*entry
	elected map[key]choice

	shutting      bool
	shutdownReply *actor.PID
	pending       int // allocation actors still to stop during shutdown
}

func newActor(cfg Config, sh *shared) *Actor {
	return &Actor{
		cfg:     cfg,
		log:     cfg.Log,
		sh:      sh,
		allocs:  map[string]*entry{},
		elected: map[key]choice{},
	}
}

// Receive handles one message.
func (r *Actor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		r.onStarted(ctx)
	case *Register:
		ctx.Respond(r.onRegister(ctx, m))
	case *Deregister:
		r.onDeregister(ctx, m)
	case *ListAllocations:
		ctx.Respond(&AllocationsResult{Allocs: r.infos()})
	case *GetPlugins:
		ctx.Respond(r.onGetPlugins(m))
	case *GetClient:
		ctx.Respond(r.onGetClient(m))
	case *Refingerprint:
		r.onRefingerprint(ctx, m)
	case *plugin.StatusChanged:
		r.onStatusChanged(ctx, m)
	case *plugin.Stopped:
		r.onStopped(ctx, m)
	case *actorkit.ChildGaveUp:
		r.onChildGaveUp(m)
	case *shutdownAll:
		r.onShutdown(ctx)
	}
}
