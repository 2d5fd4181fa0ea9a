package claim

import (
	"context"
	"sync"
)

// gate bounds the RPCs in flight to one plugin. Places are handed over in
// the order they were asked for. A step job waiting for a place (StartStep)
// waits in the queue without a goroutine of its own: it gets a pool worker
// only once it holds a place. With a thousand volumes claiming at once,
// the pool then keeps about as many busy workers as the gate allows, whose
// stacks stay grown for gRPC calls, instead of a thousand goroutines that
// mostly sit on a semaphore while the garbage collector shrinks their
// stacks and scans them.
type gate struct {
	mu    sync.Mutex
	free  int    // places not held; guarded by mu
	queue []*Job // waiting, oldest first from head; guarded by mu
	head  int
}

func newGate(places int) *gate { return &gate{free: places} }

// admit takes a place for j at once and returns true, or queues j and
// returns false: release then hands it a place and calls j.start, unless
// j was dropped meanwhile (Job.Stop, or a blocking caller whose context
// ended).
func (g *gate) admit(j *Job) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.free > 0 {
		g.free--
		return true
	}
	j.state.Store(jobQueued)
	g.queue = append(g.queue, j)
	return false
}

// release gives a place back: to the oldest job still waiting, or to the
// free places.
func (g *gate) release() {
	g.mu.Lock()
	for g.head < len(g.queue) {
		j := g.queue[g.head]
		g.queue[g.head] = nil
		g.head++
		if j.state.CompareAndSwap(jobQueued, jobRunning) {
			g.compact()
			g.mu.Unlock()
			j.start()
			return
		}
	}
	g.queue, g.head = g.queue[:0], 0
	g.free++
	g.mu.Unlock()
}

// compact drops the taken head of the queue once it is most of it.
func (g *gate) compact() {
	switch {
	case g.head == len(g.queue):
		g.queue, g.head = g.queue[:0], 0
	case g.head >= 64 && g.head*2 >= len(g.queue):
		n := copy(g.queue, g.queue[g.head:])
		clear(g.queue[n:])
		g.queue, g.head = g.queue[:n], 0
	}
}

// acquire waits for a place, in turn, or until ctx ends.
func (g *gate) acquire(ctx context.Context) error {
	g.mu.Lock()
	if g.free > 0 {
		g.free--
		g.mu.Unlock()
		return nil
	}
	granted := make(chan struct{})
	j := &Job{start: func() { close(granted) }}
	j.state.Store(jobQueued)
	g.queue = append(g.queue, j)
	g.mu.Unlock()
	select {
	case <-granted:
		return nil
	case <-ctx.Done():
		if j.state.CompareAndSwap(jobQueued, jobDropped) {
			return ctx.Err()
		}
		<-granted // handed over meanwhile: give it back
		g.release()
		return ctx.Err()
	}
}
