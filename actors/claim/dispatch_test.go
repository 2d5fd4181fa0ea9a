package claim

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// goid returns the current goroutine's ID from its stack header (tests only).
func goid() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := strings.Fields(string(buf))
	return f[1]
}

func TestDispatcher_InlineRunsOnPoster(t *testing.T) {
	p := NewPool(time.Minute)
	defer p.Close()
	d := p.Dispatcher(true)
	me := goid()
	var ran string
	d.Schedule(func() { ran = goid() })
	if ran != me {
		t.Fatalf("inline dispatcher ran on goroutine %q, want the poster's %q", ran, me)
	}
	d.SetInline(false)
	got := make(chan string, 1)
	d.Schedule(func() { got <- goid() })
	if g := <-got; g == me {
		t.Fatal("dispatcher with inline off ran on the poster's goroutine, want a pool worker")
	}
}

// jobOwner starts a job and, when the job's message arrives, stops the job
// from its handler: with an inline mailbox that handler runs on the job's
// own goroutine, so the job must count as done before it sends.
type jobOwner struct {
	pool *Pool
	job  *Job
	got  chan string
}

type jobResult struct{ goroutine string }

func (o *jobOwner) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		o.job = StartJob(o.pool, ctx.ActorSystem().Root, ctx.Self(), func(context.Context) any {
			return &jobResult{goroutine: goid()}
		})
	case *jobResult:
		o.job.Stop() // must not wait for itself
		o.got <- msg.goroutine + " " + goid()
	}
}

// The job's message runs inline only when the owner's mailbox is idle when
// the job posts it; a job that finishes while Started is still being
// handled is queued and handled by the goroutine running Started. So the
// scenario is tried until the handler ran inline (almost always the first
// time); a deadlock fails at once.
func TestStartJob_OwnerStopsJobFromInlineHandler(t *testing.T) {
	p := NewPool(time.Minute)
	defer p.Close()
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	const tries = 50
	for range tries {
		o := &jobOwner{pool: p, got: make(chan string, 1)}
		pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return o },
			actor.WithDispatcher(p.Dispatcher(true))))
		var ids []string
		select {
		case s := <-o.got:
			ids = strings.Fields(s)
		case <-time.After(10 * time.Second):
			t.Fatal("job message never handled (Stop from the inline handler deadlocked?)")
		}
		sys.Root.Stop(pid)
		if ids[0] == ids[1] {
			return
		}
	}
	t.Fatalf("in %d tries the job's message was never handled inline on the job's goroutine", tries)
}
