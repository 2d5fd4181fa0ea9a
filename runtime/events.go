package runtime

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/csiactor/csiactor/internal/actorkit"
)

// eventLog keeps the most recent events and fans every new one out to
// subscribers through a broker that never blocks the publisher.
type eventLog struct {
	mu     sync.Mutex
	ring   []Event // guarded by mu; a circular buffer of the last events
	next   int     // guarded by mu; where the next event goes
	full   bool    // guarded by mu; ring has wrapped around
	size   int
	broker *actorkit.Broker[Event]
}

func newEventLog(size int) *eventLog {
	return &eventLog{
		ring: make([]Event, size),
		size: size,
		broker: actorkit.NewBroker(func(dropped uint64) Event {
			return Event{Time: time.Now(), Type: EventsDropped, Message: fmt.Sprintf("subscriber fell behind and lost %d events", dropped)}
		}),
	}
}

// publish records e and sends it to every subscriber. Recording and
// sending happen under mu, so a new subscription sees each event exactly
// once: in its backlog or live.
func (l *eventLog) publish(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring[l.next] = e
	l.next++
	if l.next == l.size {
		l.next, l.full = 0, true
	}
	l.broker.Publish(e)
}

func (l *eventLog) recent() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recentLocked()
}

// recentLocked returns a copy of the recorded events, oldest first.
func (l *eventLog) recentLocked() []Event {
	if !l.full {
		return append([]Event(nil), l.ring[:l.next]...)
	}
	out := make([]Event, 0, l.size)
	out = append(out, l.ring[l.next:]...)
	return append(out, l.ring[:l.next]...)
}

// subscribe returns a channel with the backlog, then live events, closed
// when ctx ends or the log closes. The broker's goroutine feeds it
// directly: each event is one hand-over from the publisher to the
// subscriber's goroutine and one to the subscriber.
func (l *eventLog) subscribe(ctx context.Context) (<-chan Event, error) {
	l.mu.Lock()
	backlog := l.recentLocked()
	// Room for the whole backlog and for l.size live events behind it.
	sub, err := l.broker.SubscribeFrom(l.size+len(backlog), backlog)
	l.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrShutdown, err)
	}
	context.AfterFunc(ctx, sub.Cancel)
	return sub.C, nil
}

// close ends every subscription.
func (l *eventLog) close() { l.broker.Close() }
