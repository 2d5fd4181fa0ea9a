package actorkit

import (
	"errors"
	"sync"
)

// ErrBrokerClosed is returned by Broker.Subscribe after Close.
var ErrBrokerClosed = errors.New("actorkit: broker closed")

// Broker fans values out to subscribers without ever blocking the
// publisher: each subscriber has its own bounded queue and a goroutine that
// feeds its channel. When a subscriber falls more than its buffer behind,
// the oldest undelivered values are dropped and, in their place, the
// subscriber receives one value made by the lagged function with the number
// dropped. A lagging subscriber therefore loses the oldest values it had
// not received yet (never newer ones) and learns how many; it should
// re-read the current state if it needs to.
//
// Publish and Subscribe are safe for concurrent use. Close ends every
// subscription and waits for their goroutines.
type Broker[T any] struct {
	lagged func(dropped uint64) T

	mu     sync.Mutex
	subs   map[*Subscription[T]]struct{} // guarded by mu
	closed bool                          // guarded by mu
}

// NewBroker returns a broker; lagged makes the marker value a lagging
// subscriber receives in place of the values it lost.
func NewBroker[T any](lagged func(dropped uint64) T) *Broker[T] {
	return &Broker[T]{lagged: lagged, subs: map[*Subscription[T]]struct{}{}}
}

// Subscription is one subscriber's feed. Receive from C until it is
// closed; call Cancel when done (it is idempotent, and C is closed after).
type Subscription[T any] struct {
	// C delivers the values in publish order, with lag markers in place of
	// dropped ones. It is closed by Cancel and by the broker's Close.
	C <-chan T

	b      *Broker[T]
	out    chan T
	notify chan struct{} // cap 1: "the queue is not empty"
	done   chan struct{}
	exited chan struct{}
	once   sync.Once

	mu      sync.Mutex
	queue   []T    // guarded by mu; at most size
	dropped uint64 // guarded by mu; not yet reported
	total   uint64 // guarded by mu; all drops
	size    int
}

// Subscribe returns a subscription that queues at most buffer values
// (at least 1).
func (b *Broker[T]) Subscribe(buffer int) (*Subscription[T], error) {
	return b.SubscribeFrom(buffer, nil)
}

// SubscribeFrom is Subscribe for a subscriber that is to receive first
// before the values published from now on: they are queued at once, as
// if published, and count against buffer like them.
func (b *Broker[T]) SubscribeFrom(buffer int, first []T) (*Subscription[T], error) {
	if buffer < 1 {
		buffer = 1
	}
	out := make(chan T)
	s := &Subscription[T]{
		C:      out,
		b:      b,
		out:    out,
		notify: make(chan struct{}, 1),
		done:   make(chan struct{}),
		exited: make(chan struct{}),
		size:   buffer,
	}
	for _, v := range first {
		s.push(v)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrBrokerClosed
	}
	b.subs[s] = struct{}{}
	go s.pump()
	return s, nil
}

// Publish queues v for every subscriber. It never blocks on a subscriber.
func (b *Broker[T]) Publish(v T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.subs {
		s.push(v)
	}
}

// Subscribers returns the number of live subscriptions.
func (b *Broker[T]) Subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

// Close cancels every subscription and refuses new ones. It is idempotent.
func (b *Broker[T]) Close() {
	b.mu.Lock()
	b.closed = true
	subs := make([]*Subscription[T], 0, len(b.subs))
	for s := range b.subs {
		subs = append(subs, s)
	}
	b.mu.Unlock()
	for _, s := range subs {
		s.Cancel()
	}
}

func (s *Subscription[T]) push(v T) {
	s.mu.Lock()
	if len(s.queue) >= s.size {
		s.queue = s.queue[1:]
		s.dropped++
		s.total++
	}
	s.queue = append(s.queue, v)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// next takes the next value to deliver: a lag marker first if values were
// dropped since the last delivery.
func (s *Subscription[T]) next() (T, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dropped > 0 {
		n := s.dropped
		s.dropped = 0
		return s.b.lagged(n), true
	}
	if len(s.queue) == 0 {
		var zero T
		return zero, false
	}
	v := s.queue[0]
	var zero T
	s.queue[0] = zero
	s.queue = s.queue[1:]
	return v, true
}

func (s *Subscription[T]) pump() {
	defer close(s.exited)
	defer close(s.out)
	for {
		select {
		case <-s.notify:
		case <-s.done:
			return
		}
		for {
			v, ok := s.next()
			if !ok {
				break
			}
			select {
			case s.out <- v:
			case <-s.done:
				return
			}
		}
	}
}

// Dropped returns how many values this subscriber lost so far.
func (s *Subscription[T]) Dropped() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Cancel ends the subscription: C is closed and the feeding goroutine has
// exited when Cancel returns. Values still queued are discarded.
func (s *Subscription[T]) Cancel() {
	s.once.Do(func() {
		s.b.mu.Lock()
		delete(s.b.subs, s)
		s.b.mu.Unlock()
		close(s.done)
	})
	<-s.exited
}
