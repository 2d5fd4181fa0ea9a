package claim

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// stepDone is what the step jobs of these tests send their owner.
type stepDone struct {
	volume string
	res    Result
}

// collector is an owner of step jobs that hands their messages to a test.
type collector struct{ got chan *stepDone }

func (c *collector) Receive(ctx actor.Context) {
	if msg, ok := ctx.Message().(*stepDone); ok {
		c.got <- msg
	}
}

func newCollector(t *testing.T) (*actor.RootContext, *actor.PID, chan *stepDone) {
	t.Helper()
	log := logrus.New()
	log.Out = discard{}
	system := actorkit.NewSystem(logrus.NewEntry(log))
	t.Cleanup(system.Shutdown)
	got := make(chan *stepDone, 64)
	pid := system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &collector{got: got} }))
	return system.Root, pid, got
}

func doneMsg(s Step) func(Result) any {
	return func(res Result) any { return &stepDone{volume: s.Volume, res: res} }
}

func receive(t *testing.T, got <-chan *stepDone) *stepDone {
	t.Helper()
	select {
	case d := <-got:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no step finished within 10s")
		return nil
	}
}

// Step jobs beyond the plugin's in-flight bound wait in line without a
// goroutine, and get their places in the order they were started.
func TestRunner_StartStep_WaitsInLineWithoutGoroutine(t *testing.T) {
	plugin, plugins := dialFake(t, fakeplugin.Config{StageUnstage: true})
	// The first call holds the only place long enough for the others to
	// line up behind it.
	plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Delay: 500 * time.Millisecond, Times: 1})
	r := NewRunner(plugins, RunnerConfig{MaxInFlightPerPlugin: 1})
	pool := NewPool(time.Minute)
	defer pool.Close()
	root, pid, got := newCollector(t)
	dir := t.TempDir()

	vols := []string{"v0", "v1", "v2", "v3"}
	for i, v := range vols {
		s := stageStep(dir, v)
		r.StartStep(pool, root, pid, s, doneMsg(s))
		for i == 0 && plugin.Calls("NodeStageVolume") == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if n := pool.started.Load(); n != 1 {
		t.Errorf("%d pool workers started for 4 steps with one place, want 1: the others wait without one", n)
	}
	// The places are handed over in order; the messages may not come in
	// that order (a place is given back before its message is sent).
	finished := map[string]bool{}
	for range vols {
		d := receive(t, got)
		if finished[d.volume] || !d.res.OK() {
			t.Fatalf("finished %s (%+v) again or not succeeded", d.volume, d.res)
		}
		finished[d.volume] = true
	}
	if order := plugins.stagedOrder(); !slices.Equal(order, vols) {
		t.Errorf("NodeStageVolume sent for %q, want %q: in the order started", order, vols)
	}
	if m := plugins.max.Load(); m != 1 {
		t.Errorf("%d stage calls in flight at once, want the bound 1", m)
	}
}

// Stop on a job that waits in line returns without waiting for the step
// ahead of it; its step never runs, and the line goes on past it.
func TestRunner_StartStep_StopWhileQueued(t *testing.T) {
	plugin, plugins := dialFake(t, fakeplugin.Config{StageUnstage: true})
	plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Hang: true, Times: 1})
	r := NewRunner(plugins, RunnerConfig{MaxInFlightPerPlugin: 1})
	pool := NewPool(time.Minute)
	defer pool.Close()
	root, pid, got := newCollector(t)
	dir := t.TempDir()

	first, queued, last := stageStep(dir, "first"), stageStep(dir, "queued"), stageStep(dir, "last")
	hung := r.StartStep(pool, root, pid, first, doneMsg(first))
	for plugin.Calls("NodeStageVolume") == 0 { // the plugin holds it
		time.Sleep(time.Millisecond)
	}
	j := r.StartStep(pool, root, pid, queued, doneMsg(queued))
	r.StartStep(pool, root, pid, last, doneMsg(last))
	stopped := make(chan struct{})
	go func() { j.Stop(); j.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop of a queued job waits for the hung step ahead of it")
	}
	if n := plugins.cur.Load(); n != 1 {
		t.Fatalf("%d stage calls in flight after the Stop, want the hung one", n)
	}
	hung.Stop() // ends the hung call; its place goes to "last"
	if d := receive(t, got); d.volume != "last" || !d.res.OK() {
		t.Fatalf("finished %s (%+v), want last", d.volume, d.res)
	}
	if n := plugin.Calls("NodeStageVolume"); n != 2 {
		t.Errorf("NodeStageVolume called %d times, want 2: the stopped step must not run", n)
	}
}

// Blocking callers (Run, Do) and step jobs share one line and one bound.
func TestRunner_RunAndStartStep_ShareTheBound(t *testing.T) {
	plugin, plugins := dialFake(t, fakeplugin.Config{StageUnstage: true})
	plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Delay: 10 * time.Millisecond})
	r := NewRunner(plugins, RunnerConfig{MaxInFlightPerPlugin: 2})
	pool := NewPool(time.Minute)
	defer pool.Close()
	root, pid, got := newCollector(t)
	dir := t.TempDir()

	var wg sync.WaitGroup
	for i := range 4 {
		s := stageStep(dir, "job"+string(rune('a'+i)))
		r.StartStep(pool, root, pid, s, doneMsg(s))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res := r.Run(context.Background(), stageStep(dir, "run"+string(rune('a'+i)))); !res.OK() {
				t.Errorf("Run: %s", res.Err)
			}
		}()
	}
	wg.Wait()
	for range 4 {
		if d := receive(t, got); !d.res.OK() {
			t.Errorf("step %s: %s", d.volume, d.res.Err)
		}
	}
	if m := plugins.max.Load(); m != 2 {
		t.Errorf("%d stage calls in flight at once, want exactly the bound 2", m)
	}
}

// A blocking caller whose context ends while it waits gets the context's
// error as an unavailable result, and takes no place with it.
func TestRunner_Run_ContextEndsInLine(t *testing.T) {
	plugin, plugins := dialFake(t, fakeplugin.Config{StageUnstage: true})
	plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Delay: 50 * time.Millisecond, Times: 1})
	r := NewRunner(plugins, RunnerConfig{MaxInFlightPerPlugin: 1})
	dir := t.TempDir()
	held := make(chan Result, 1)
	go func() { held <- r.Run(context.Background(), stageStep(dir, "slow")) }()
	for plugins.cur.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	res := r.Run(ctx, stageStep(dir, "late"))
	if !res.Unavailable || !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Errorf("Run whose context ended in line: %+v, want unavailable with the context's error", res)
	}
	if res := <-held; !res.OK() {
		t.Fatalf("slow stage: %s", res.Err)
	}
	if res := r.Run(context.Background(), stageStep(dir, "after")); !res.OK() {
		t.Errorf("Run after the line emptied: %s (a place was lost)", res.Err)
	}
}

// Many holders with contexts that end at random moments never exceed the
// bound, and every place comes back.
func TestGate_NoPlaceLostUnderCancellation(t *testing.T) {
	const places = 3
	g := newGate(places)
	var cur, max atomic.Int32
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(300))*time.Microsecond)
			defer cancel()
			if i%2 == 0 {
				ctx = context.Background()
			}
			if g.acquire(ctx) != nil {
				return
			}
			n := cur.Add(1)
			for m := max.Load(); n > m && !max.CompareAndSwap(m, n); m = max.Load() {
			}
			time.Sleep(time.Duration(rand.IntN(100)) * time.Microsecond)
			cur.Add(-1)
			g.release()
		}()
	}
	wg.Wait()
	if m := max.Load(); m > places {
		t.Errorf("%d holders at once, want at most %d", m, places)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.free != places || g.head != len(g.queue) {
		t.Errorf("after all left: %d free places, %d waiting; want %d free, none waiting", g.free, len(g.queue)-g.head, places)
	}
}
