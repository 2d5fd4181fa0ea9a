package claim

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/csi"
)

// Config is what a claim actor needs. The volume actor fills it in.
type Config struct {
	// Volume, Alloc and Plugin name the past claim.
	Volume string
	Alloc  string
	Plugin string
	// Runner sends the steps; shared by every actor of a manager.
	Runner *Runner
	// Backoff paces retries of a failed step.
	Backoff csi.Backoff
	// Pool, when set, runs the actor's goroutines and dispatches its
	// mailbox.
	Pool *Pool
	// Logger is scoped by the caller; the actor adds volume and alloc.
	Logger *logrus.Entry
	// Hook, when set, is called with a point name at each place a crash
	// matters ("claim-done:<method>" just before a result is reported).
	// Tests use it to inject faults; it must be nil in production.
	Hook func(point, volume string)
}

// NewProps returns the props of a claim actor for cfg. Spawn it as a child
// of the volume actor that owns the claim's record.
func NewProps(cfg Config, opts ...actor.PropsOption) *actor.Props {
	log := cfg.Logger.WithFields(logrus.Fields{"volume": cfg.Volume, "alloc": cfg.Alloc})
	if cfg.Pool != nil {
		// Inline from the start: a claim actor's messages come from its
		// volume actor's handlers and its own jobs, none holding a lock.
		opts = append([]actor.PropsOption{actor.WithDispatcher(cfg.Pool.Dispatcher(true))}, opts...)
	}
	return actor.PropsFromProducer(func() actor.Actor {
		return &Actor{cfg: cfg, log: log}
	}, opts...)
}
