package volume

import "context"

// job is one goroutine owned by an actor: stop cancels it and waits for it.
type job struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startJob runs fn in a new goroutine with a context that stop cancels.
func startJob(fn func(ctx context.Context)) *job {
	ctx, cancel := context.WithCancel(context.Background())
	j := &job{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(j.done)
		fn(ctx)
	}()
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
