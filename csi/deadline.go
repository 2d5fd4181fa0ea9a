package csi

import (
	"container/list"
	"context"
	"sync"
	"time"
)

// deadlines gives RPCs their timeouts without one runtime timer per RPC.
//
// context.WithTimeout arms a timer for every call and stops it when the call
// returns. Arming a timer earlier than any other wakes the netpoller thread,
// so on a small machine each RPC paid about a thread wake-up for a timeout
// that almost never fires (measured: ~7 µs of the ~13 µs a deadline added
// to a ~100 µs unix-socket RPC). Here, calls of one timeout wait in a FIFO
// (their deadlines only grow), and one timer is armed for the earliest
// deadline of all; a new call re-arms it only when its deadline is earlier,
// which with few distinct timeouts is almost never. When the timer fires it
// ends the expired calls and re-arms for the next deadline.
//
// The context of a call still reports its deadline (gRPC sends it to the
// plugin as grpc-timeout, so the plugin can plan with it), and once expired
// its Err is context.DeadlineExceeded, like a context.WithTimeout.
type deadlines struct {
	mu      sync.Mutex
	queues  map[time.Duration]*list.List // of *watched, oldest first
	timer   *time.Timer                  // nil when no call is watched
	armedAt time.Time                    // when timer fires
	stopped bool
}

type watched struct {
	deadline time.Time
	cancel   context.CancelCauseFunc
}

// errTimedOut is the cancel cause of a call that reached its deadline.
var errTimedOut = context.DeadlineExceeded

func newDeadlines() *deadlines {
	return &deadlines{queues: map[time.Duration]*list.List{}}
}

// deadlineCtx is a cancelable context that reports a deadline. Its Done
// channel closes when the watchdog ends it, its parent ends, or done is
// called.
type deadlineCtx struct {
	context.Context
	deadline time.Time
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *deadlineCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		if context.Cause(c.Context) == errTimedOut {
			return context.DeadlineExceeded
		}
		return err
	}
	return nil
}

// start returns a context for one call that ends timeout from now, and the
// function to call when the call returns.
func (d *deadlines) start(parent context.Context, timeout time.Duration) (context.Context, func()) {
	deadline := time.Now().Add(timeout)
	if pd, ok := parent.Deadline(); ok && !pd.After(deadline) {
		// The caller's deadline comes first: nothing to watch.
		return parent, func() {}
	}
	inner, cancel := context.WithCancelCause(parent)
	w := &watched{deadline: deadline, cancel: cancel}
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		// Closing: the call fails on the closed connection anyway.
		return &deadlineCtx{Context: inner, deadline: deadline}, func() { cancel(context.Canceled) }
	}
	q := d.queues[timeout]
	if q == nil {
		q = list.New()
		d.queues[timeout] = q
	}
	e := q.PushBack(w)
	switch {
	case d.timer == nil:
		d.timer = time.AfterFunc(timeout, d.fire)
		d.armedAt = deadline
	case deadline.Before(d.armedAt):
		d.timer.Reset(time.Until(deadline))
		d.armedAt = deadline
	}
	d.mu.Unlock()
	return &deadlineCtx{Context: inner, deadline: deadline}, func() {
		d.mu.Lock()
		if e.Value != nil {
			q.Remove(e)
			e.Value = nil
		}
		d.mu.Unlock()
		cancel(context.Canceled)
	}
}

// fire ends every call past its deadline and re-arms the timer for the
// earliest deadline left, or drops it when no call is left.
func (d *deadlines) fire() {
	now := time.Now()
	var expired []*watched
	d.mu.Lock()
	var next time.Time
	for _, q := range d.queues {
		for e := q.Front(); e != nil; e = q.Front() {
			w := e.Value.(*watched)
			if w.deadline.After(now) {
				if next.IsZero() || w.deadline.Before(next) {
					next = w.deadline
				}
				break
			}
			q.Remove(e)
			e.Value = nil
			expired = append(expired, w)
		}
	}
	switch {
	case d.stopped:
	case next.IsZero():
		if d.timer != nil {
			d.timer.Stop()
			d.timer = nil
		}
	case d.timer == nil:
		// Another fire (after a Reset) dropped the timer meanwhile.
		d.timer = time.AfterFunc(next.Sub(now), d.fire)
		d.armedAt = next
	default:
		d.timer.Reset(next.Sub(now))
		d.armedAt = next
	}
	d.mu.Unlock()
	for _, w := range expired {
		w.cancel(errTimedOut)
	}
}

// stop ends every watched call and stops the timer; calls started later
// are not watched.
func (d *deadlines) stop() {
	d.mu.Lock()
	d.stopped = true
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	var all []*watched
	for _, q := range d.queues {
		for e := q.Front(); e != nil; e = e.Next() {
			all = append(all, e.Value.(*watched))
		}
		q.Init()
	}
	d.mu.Unlock()
	for _, w := range all {
		w.cancel(context.Canceled)
	}
}
