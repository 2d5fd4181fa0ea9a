package plugin

import (
	"context"
	"sync"
	"time"
)

// timer is a resettable one-shot timer owned by an actor: a goroutine that
// calls fire when the timer expires. It replaces protoactor's scheduler,
// whose cancel races. The goroutine ends when ctx ends; the actor waits for
// it through wg.
type timer struct {
	reset chan time.Duration // buffered 1; only the actor writes
}

func startTimer(ctx context.Context, wg *sync.WaitGroup, fire func()) *timer {
	t := &timer{reset: make(chan time.Duration, 1)}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tm := time.NewTimer(time.Hour)
		tm.Stop()
		defer tm.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case d := <-t.reset:
				tm.Stop()
				if d >= 0 {
					tm.Reset(d)
				}
			case <-tm.C:
				fire()
			}
		}
	}()
	return t
}

// Reset makes the timer fire once after d, replacing any earlier setting.
// It never blocks.
func (t *timer) Reset(d time.Duration) {
	for {
		select {
		case t.reset <- d:
			return
		default:
			select { // drop the older pending setting
			case <-t.reset:
			default:
			}
		}
	}
}

// Stop cancels a pending fire. It never blocks.
func (t *timer) Stop() { t.Reset(-1) }
