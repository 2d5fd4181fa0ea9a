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
// A Pool is safe for concurrent use. Close it after every actor and job
// using it has stopped.
type Pool struct {
	idle time.Duration
	work chan func() // unbuffered: a send succeeds only into an idle worker
	quit chan struct{}
	wg   sync.WaitGroup
	once sync.Once

	started atomic.Int64 // workers started, for tests
}

var _ actor.Dispatcher = (*Pool)(nil)

// NewPool returns a Pool whose idle workers exit after idle (zero means
// DefaultPoolIdle).
func NewPool(idle time.Duration) *Pool {
	if idle <= 0 {
		idle = DefaultPoolIdle
	}
	return &Pool{idle: idle, work: make(chan func()), quit: make(chan struct{})}
}

// Go runs fn on an idle worker, or on a new one when none is idle.
func (p *Pool) Go(fn func()) {
	select {
	case p.work <- fn:
		return
	default:
	}
	p.wg.Add(1)
	p.started.Add(1)
	go p.worker(fn)
}

func (p *Pool) worker(fn func()) {
	defer p.wg.Done()
	fn()
	t := time.NewTimer(p.idle)
	defer t.Stop()
	for {
		select {
		case fn := <-p.work:
			fn()
			t.Reset(p.idle)
		case <-t.C:
			return
		case <-p.quit:
			return
		}
	}
}

// Schedule implements actor.Dispatcher.
func (p *Pool) Schedule(fn func()) { p.Go(fn) }

// Throughput implements actor.Dispatcher: messages per mailbox run.
func (p *Pool) Throughput() int { return 300 }

// Close makes every idle worker exit and waits for all workers, busy ones
// included. It is idempotent.
func (p *Pool) Close() {
	p.once.Do(func() { close(p.quit) })
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
