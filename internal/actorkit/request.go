package actorkit

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// replyProcess is a one-shot mailbox for a reply: a process in the actor
// system's registry whose user messages go to a buffered channel.
type replyProcess struct {
	ch chan any
}

func (p *replyProcess) SendUserMessage(_ *actor.PID, m any) {
	_, msg, _ := actor.UnwrapEnvelope(m)
	select {
	case p.ch <- msg:
	default: // only the first reply counts
	}
}

func (p *replyProcess) SendSystemMessage(*actor.PID, any) {}

func (p *replyProcess) Stop(*actor.PID) {}

// Request sends msg to pid with a reply address and waits for the first
// reply. It returns ctx's error when ctx ends first, [ErrTimeout] when
// timeout passes first (timeout <= 0 means wait for ctx alone), and
// [ErrNoActor] when pid does not exist. The target answers with
// ctx.Respond(reply).
//
// Unlike a protoactor Future, Request honours ctx cancellation and leaves
// no goroutine or timer behind.
func Request(ctx context.Context, system *actor.ActorSystem, pid *actor.PID, msg any, timeout time.Duration) (any, error) {
	p := &replyProcess{ch: make(chan any, 1)}
	self, ok := system.ProcessRegistry.Add(p, "request"+system.ProcessRegistry.NextId())
	if !ok {
		return nil, fmt.Errorf("actorkit: could not register a reply address")
	}
	defer system.ProcessRegistry.Remove(self)

	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	system.Root.RequestWithCustomSender(pid, msg, self)
	select {
	case r := <-p.ch:
		if _, dead := r.(*actor.DeadLetterResponse); dead {
			return nil, fmt.Errorf("%w: %s", ErrNoActor, pid.Id)
		}
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-expired:
		return nil, fmt.Errorf("%w after %s", ErrTimeout, timeout)
	}
}
