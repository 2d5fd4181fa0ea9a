package claim

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"
)

// Job is one goroutine owned by an actor: Stop cancels it and waits for it.
type Job struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// StartJob runs fn on a goroutine of pool (a new goroutine when pool is
// nil) with a context that Stop cancels. The message fn returns, if not
// nil, is sent to pid once the job counts as done, unless the job was
// stopped meanwhile: the owner may handle it on this very goroutine (see
// Pool.Dispatcher), and its handler may Stop the job that sent it.
//
// A message can still arrive after Stop returned (Stop between fn's end and
// the send); owners ignore messages of jobs they no longer hold.
func StartJob(pool *Pool, root *actor.RootContext, pid *actor.PID, fn func(ctx context.Context) any) *Job {
	ctx, cancel := context.WithCancel(context.Background())
	j := &Job{cancel: cancel, done: make(chan struct{})}
	run := func() {
		msg := fn(ctx)
		close(j.done)
		if msg != nil && ctx.Err() == nil {
			root.Send(pid, msg)
		}
	}
	if pool == nil {
		go run()
	} else {
		pool.Go(run)
	}
	return j
}

// Stop cancels the job and waits for its function to return. It is safe on
// a nil job and idempotent.
func (j *Job) Stop() {
	if j == nil {
		return
	}
	j.cancel()
	<-j.done
}
