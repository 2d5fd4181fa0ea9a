package actorkit

import (
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"
)

// SystemOptions returns the options csiactor builds every actor system
// with: protoactor's log records go to log (with the field lib=protoactor),
// its built-in metrics stay off (they slow every message many times over),
// and dead letters are logged at most a few times per second.
func SystemOptions(log *logrus.Entry) []actor.ConfigOption {
	l := log.WithField("lib", "protoactor")
	return []actor.ConfigOption{
		actor.WithLoggerFactory(func(system *actor.ActorSystem) *slog.Logger {
			return slog.New(NewSlogHandler(l.WithField("actor_system", system.ID)))
		}),
		actor.WithMetricProviders(nil),
		actor.WithDeadLetterThrottleCount(3),
		actor.WithDeadLetterThrottleInterval(time.Second),
		actor.WithDeadLetterRequestLogging(false),
	}
}

// NewSystem returns a new actor system configured with SystemOptions.
// Shut it down with its Shutdown method once every actor in it has stopped.
func NewSystem(log *logrus.Entry) *actor.ActorSystem {
	return actor.NewActorSystem(SystemOptions(log)...)
}
