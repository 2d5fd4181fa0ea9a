package claim

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// DefaultPoolIdle is how long an idle worker of a Pool waits for work
// before it exits.
const DefaultPoolIdle = 10 * time.Second

// Pool runs functions on reused goroutines. Volume and claim actors use it
// for the goroutines that run their RPCs, and through Dispatcher for their
// mailboxes when these are not run inline: a worker that already grew its
// stack for a gRPC call or a record encoding does not grow a new one each
// time, and no goroutine is created per message burst.
//
// Idle workers are reused last in, first out. The worker that finished
// last has its stack grown and its memory in the CPU's caches; one that has
// been idle longer has likely had its stack shrunk by the garbage collector
// and would grow it again on the next gRPC call. With a thousand volumes
// persisting at once the pool grows to as many workers, and handing work
// round-robin among them (what a shared channel does) made most RPCs start
// on a shrunk stack. The workers at the bottom of the stack, unused for the
// pool's idle time, exit.
//
// A Pool is safe for concurrent use. Close it after every actor and job
// using it has stopped.
type Pool struct {
	idle time.Duration

	mu     sync.Mutex
	stack  []*worker   // idle workers, the most recently idle last; guarded by mu
	reaper *time.Timer // armed while stack is not empty; guarded by mu
	closed bool        // guarded by mu

	wg sync.WaitGroup

	started atomic.Int64 // workers started, for tests
	live    atomic.Int64 // workers not exited, for tests
}

// worker is one goroutine of a Pool, parked on work while idle.
type worker struct {
	work      chan func() // nil tells the worker to exit
	idleSince time.Time
}

var _ actor.Dispatcher = (*Pool)(nil)

// NewPool returns a Pool whose idle workers exit after idle (zero means
// DefaultPoolIdle).
func NewPool(idle time.Duration) *Pool {
	if idle <= 0 {
		idle = DefaultPoolIdle
	}
	return &Pool{idle: idle}
}

// Go runs fn on the most recently idle worker, or on a new one when none is
// idle.
func (p *Pool) Go(fn func()) {
	p.mu.Lock()
	if n := len(p.stack); n > 0 {
		w := p.stack[n-1]
		p.stack[n-1] = nil
		p.stack = p.stack[:n-1]
		p.mu.Unlock()
		w.work <- fn
		return
	}
	p.mu.Unlock()
	p.wg.Add(1)
	p.started.Add(1)
	p.live.Add(1)
	go p.run(&worker{work: make(chan func(), 1)}, fn)
}

func (p *Pool) run(w *worker, fn func()) {
	defer p.wg.Done()
	defer p.live.Add(-1)
	for fn != nil {
		fn()
		if !p.park(w) {
			return
		}
		fn = <-w.work
	}
}

// park puts w on top of the idle stack; false means the pool is closed.
func (p *Pool) park(w *worker) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	w.idleSince = time.Now()
	p.stack = append(p.stack, w)
	if p.reaper == nil {
		p.reaper = time.AfterFunc(p.idle, p.reap)
	}
	return true
}

// reap tells the workers idle for the pool's idle time to exit (they are at
// the bottom of the stack) and arms itself for the next one.
func (p *Pool) reap() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	cutoff := time.Now().Add(-p.idle)
	n := 0
	for n < len(p.stack) && !p.stack[n].idleSince.After(cutoff) {
		p.stack[n].work <- nil
		n++
	}
	if n > 0 {
		k := copy(p.stack, p.stack[n:])
		clear(p.stack[k:])
		p.stack = p.stack[:k]
	}
	if len(p.stack) == 0 {
		p.reaper = nil
		return
	}
	p.reaper.Reset(time.Until(p.stack[0].idleSince.Add(p.idle)))
}

// Schedule implements actor.Dispatcher.
func (p *Pool) Schedule(fn func()) { p.Go(fn) }

// Throughput implements actor.Dispatcher: messages per mailbox run.
func (p *Pool) Throughput() int { return 300 }

// Close makes every idle worker exit and waits for all workers, busy ones
// included. It is idempotent.
func (p *Pool) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		for _, w := range p.stack {
			w.work <- nil
		}
		p.stack = nil
		if p.reaper != nil {
			p.reaper.Stop()
			p.reaper = nil
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Dispatcher is the mailbox dispatcher of one actor. While inline is off it
// runs the actor's mailbox on the pool, like the Pool itself. Once inline
// is on, it runs the mailbox on the goroutine that posted the message that
// woke it: a job finishing its RPC, a caller waiting for an answer, or
// another actor. That saves a hand-off to another goroutine per message,
// which is most of what a message costs on a small machine. The actor's
// semantics do not change: one message at a time, in order.
//
// Inline is only safe when no goroutine posts to the actor while holding a
// lock that the actor's handlers take, or while waiting for something those
// handlers do. Jobs (StartJob) count as done before they post.
type Dispatcher struct {
	pool   *Pool
	inline atomic.Bool
}

var _ actor.Dispatcher = (*Dispatcher)(nil)

// Dispatcher returns a new Dispatcher on p for one actor.
func (p *Pool) Dispatcher(inline bool) *Dispatcher {
	d := &Dispatcher{pool: p}
	d.inline.Store(inline)
	return d
}

// SetInline turns inline dispatch on or off.
func (d *Dispatcher) SetInline(on bool) { d.inline.Store(on) }

// Schedule implements actor.Dispatcher.
func (d *Dispatcher) Schedule(fn func()) {
	if d.inline.Load() {
		fn()
		return
	}
	d.pool.Go(fn)
}

// Throughput implements actor.Dispatcher.
func (d *Dispatcher) Throughput() int { return d.pool.Throughput() }
