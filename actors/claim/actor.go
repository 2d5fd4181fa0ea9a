package claim

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"
)

// Actor drives one past claim's release to the end, one Turn at a time. Its
// state is only the retry count and the goroutine it owns: the record is the
// volume actor's, so a restarted claim actor simply asks for a turn again.
type Actor struct {
	cfg     Config
	log     *logrus.Entry
	attempt int  // failed attempts of the current step
	job     *Job // the step's RPC, or the pause after a failure
}

// Receive handles the claim actor's messages.
func (a *Actor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.askTurn(ctx)
	case *Turn:
		a.run(ctx, msg.Step)
	case *stepFinished:
		a.finished(ctx, msg)
	case *pauseOver:
		a.paused(ctx, msg)
	case *Freed:
		a.freed(ctx)
	case *actor.Restarting, *actor.Stopping:
		a.stopWork()
	}
}
