package volume

import (
	"context"

	"github.com/csiactor/csiactor/actors/claim"
)

// jobs starts the goroutines volume actors own, on the manager's pool.
type jobs struct {
	pool *claim.Pool
}

// job is one goroutine owned by an actor: stop cancels it and waits for it.
type job struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// start runs fn on a pooled goroutine with a context that stop cancels.
func (js *jobs) start(fn func(ctx context.Context)) *job {
	ctx, cancel := context.WithCancel(context.Background())
	j := &job{cancel: cancel, done: make(chan struct{})}
	js.pool.Go(func() {
		defer close(j.done)
		fn(ctx)
	})
	return j
}

// stop cancels the job and waits for its goroutine to return. It is safe on
// a nil job and idempotent.
func (j *job) stop() {
	if j == nil {
		return
	}
	j.cancel()
	<-j.done
}
