package cli

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

// pluginWaitNoticeAfter is how long a volume command waits for its answer
// before it looks whether the agent is waiting for a restarting plugin.
const pluginWaitNoticeAfter = time.Second

// waitNotice runs call; when call has not returned after
// pluginWaitNoticeAfter, it follows the agent's events and prints to
// e.stderr (never stdout, which may carry -json) each plugin-wait event
// of volume (and alloc, when not empty) sent since call began: the agent
// is waiting for the volume's plugin to come back before it answers.
func waitNotice[T any](ctx context.Context, e *env, cl *api.Client, volume, alloc string, call func() (T, error)) (T, error) {
	began := time.Now()
	fctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTimer(pluginWaitNoticeAfter)
		defer t.Stop()
		select {
		case <-fctx.Done():
			return
		case <-t.C:
		}
		_ = cl.FollowEvents(fctx, func(ev runtime.Event) error {
			if isPluginWait(ev, volume, alloc, began) {
				fmt.Fprintf(e.stderr, "csiactor: %s; waiting\n", ev.Message)
			}
			return nil
		})
	}()
	v, err := call()
	stop()
	wg.Wait()
	return v, err
}

// isPluginWait says whether ev is a plugin-wait event of volume (and
// alloc, when not empty) sent after began (less a little, for the clocks
// of the agent and this command, on one host).
func isPluginWait(ev runtime.Event, volume, alloc string, began time.Time) bool {
	return ev.Type == runtime.EventPluginWait && ev.Volume == volume && (alloc == "" || ev.Alloc == alloc) &&
		ev.Time.After(began.Add(-100*time.Millisecond))
}
