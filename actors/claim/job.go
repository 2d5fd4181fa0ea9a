package claim

import "context"

// job is one goroutine owned by an actor: stop cancels it and waits for it.
type job struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startJob runs fn on a goroutine of pool (a new goroutine when pool is
// nil) with a context that stop cancels.
func startJob(pool *Pool, fn func(ctx context.Context)) *job {
	ctx, cancel := context.WithCancel(context.Background())
	j := &job{cancel: cancel, done: make(chan struct{})}
	run := func() {
		defer close(j.done)
		fn(ctx)
	}
	if pool == nil {
		go run()
	} else {
		pool.Go(run)
	}
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
