package claim

import (
	"context"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// The states of a Job. A job started at once is running from the start.
const (
	jobRunning int32 = iota // its function runs, or has run
	jobQueued               // waiting for a place at a plugin's gate
	jobDropped              // stopped while queued: its function never runs
)

// Job is one goroutine owned by an actor: Stop cancels it and waits for it.
// A step job (Runner.StartStep) may first wait for a place in the plugin's
// gate, without a goroutine.
type Job struct {
	cancel context.CancelFunc
	done   chan struct{}
	state  atomic.Int32
	start  func() // what the gate calls when it hands a queued job a place
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
	j, run := newJob(root, pid, fn)
	goOn(pool, run)
	return j
}

// newJob returns a job for fn and the function that runs it.
func newJob(root *actor.RootContext, pid *actor.PID, fn func(ctx context.Context) any) (*Job, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	j := &Job{cancel: cancel, done: make(chan struct{})}
	return j, func() {
		msg := fn(ctx)
		close(j.done)
		if msg != nil && ctx.Err() == nil {
			root.Send(pid, msg)
		}
	}
}

func goOn(pool *Pool, fn func()) {
	if pool == nil {
		go fn()
		return
	}
	pool.Go(fn)
}

// Stop cancels the job and waits for its function to return; a job still
// waiting for a place never runs. It is safe on a nil job and idempotent.
func (j *Job) Stop() {
	if j == nil {
		return
	}
	j.cancel()
	if j.state.CompareAndSwap(jobQueued, jobDropped) {
		close(j.done)
		return
	}
	<-j.done
}
