package actorkit

import (
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/internal/leakcheck"
)

// event is what the test actors report to the test.
type event struct {
	who  string
	what string // "started", "restarting", "got:<msg>", "gaveup:<child>", "terminated:<child>"
}

type boom struct{}

type ping struct{ n int }

// child panics on boom and reports the rest.
type child struct {
	name   string
	events chan<- event
}

func (c *child) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		c.events <- event{c.name, "started"}
	case *actor.Restarting:
		c.events <- event{c.name, "restarting"}
	case *boom:
		panic(fmt.Sprintf("%s exploded", c.name))
	case *ping:
		c.events <- event{c.name, fmt.Sprintf("got:%d", m.n)}
	}
}

type spawnChild struct{ name string }

type childPID struct{ pid *actor.PID }

// parent spawns children and reports give-ups and terminations.
type parent struct {
	events   chan<- event
	children map[string]string // pid id → name
}

func (p *parent) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *spawnChild:
		pid, err := ctx.SpawnNamed(actor.PropsFromProducer(func() actor.Actor {
			return &child{name: m.name, events: p.events}
		}), m.name)
		if err != nil {
			panic(err)
		}
		p.children[pid.Id] = m.name
		ctx.Respond(&childPID{pid})
	case *ChildGaveUp:
		p.events <- event{"parent", "gaveup:" + p.children[m.Child.Id]}
	case *actor.Terminated:
		p.events <- event{"parent", "terminated:" + p.children[m.Who.Id]}
	}
}

type supFixture struct {
	t      *testing.T
	sys    *actor.ActorSystem
	sup    *Supervisor
	parent *actor.PID
	events chan event
	fails  chan Failure
}

func newSupFixture(t *testing.T, cfg BackoffConfig, restarts *RestartCounter) *supFixture {
	t.Helper()
	f := &supFixture{t: t, events: make(chan event, 100), fails: make(chan Failure, 100)}
	log := logrus.NewEntry(logrus.New())
	log.Logger.SetLevel(logrus.PanicLevel)
	sup, err := NewSupervisor("test", cfg, log, restarts, Hooks{
		OnRestart: func(fl Failure) { f.fails <- fl },
		OnGiveUp:  func(fl Failure) { f.fails <- fl },
	})
	if err != nil {
		t.Fatal(err)
	}
	sup.rand = func() float64 { return 0.5 } // no jitter: exact delays
	f.sup = sup
	f.sys = NewSystem(log)
	f.parent = f.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &parent{events: f.events, children: map[string]string{}}
	}, actor.WithSupervisor(sup)))
	t.Cleanup(func() {
		sup.Close()
		_ = f.sys.Root.StopFuture(f.parent).Wait()
		f.sys.Shutdown()
	})
	return f
}

func (f *supFixture) spawn(name string) *actor.PID {
	f.t.Helper()
	r, err := f.sys.Root.RequestFuture(f.parent, &spawnChild{name}, 5*time.Second).Result()
	if err != nil {
		f.t.Fatal(err)
	}
	f.expect(event{name, "started"})
	return r.(*childPID).pid
}

// expect waits for the next event and fails if it is not want. The 10 s
// guard only turns a deadlock into a failure; it measures nothing.
func (f *supFixture) expect(want event) {
	f.t.Helper()
	select {
	case got := <-f.events:
		if got != want {
			f.t.Fatalf("got event %+v, want %+v", got, want)
		}
	case <-time.After(10 * time.Second):
		f.t.Fatalf("no event, want %+v", want)
	}
}

func (f *supFixture) failure() Failure {
	f.t.Helper()
	select {
	case fl := <-f.fails:
		return fl
	case <-time.After(10 * time.Second):
		f.t.Fatal("no failure reported to hooks")
		return Failure{}
	}
}

func TestSupervisor_HandleFailure_RestartsOnlyTheFailingChild(t *testing.T) {
	defer leakcheck.Check(t)()
	restarts := NewRestartCounter()
	f := newSupFixture(t, BackoffConfig{Initial: time.Millisecond}, restarts)
	a := f.spawn("a")
	b := f.spawn("b")

	f.sys.Root.Send(a, &boom{})
	f.sys.Root.Send(a, &ping{1}) // queued while a waits for its restart
	f.expect(event{"a", "restarting"})
	f.expect(event{"a", "started"})
	f.expect(event{"a", "got:1"})
	f.sys.Root.Send(b, &ping{2})
	f.expect(event{"b", "got:2"}) // b was neither restarted nor stopped

	if fl := f.failure(); fl.Failures != 1 || fl.Delay != time.Millisecond || fl.Child.Id != a.Id {
		t.Errorf("failure = %+v, want first failure of a with a 1ms delay", fl)
	}
	if got := restarts.Value("test"); got != 1 {
		t.Errorf("restarts{kind=test} = %v, want 1", got)
	}
}

func TestSupervisor_HandleFailure_ExponentialThenGivesUp(t *testing.T) {
	defer leakcheck.Check(t)()
	restarts := NewRestartCounter()
	f := newSupFixture(t, BackoffConfig{Initial: time.Millisecond, Max: 3 * time.Millisecond, MaxFailures: 3, Window: time.Hour}, restarts)
	a := f.spawn("a")

	wantDelays := []time.Duration{1, 2, 3} // doubled, then capped at 3ms
	for i, d := range wantDelays {
		f.sys.Root.Send(a, &boom{})
		f.expect(event{"a", "restarting"})
		f.expect(event{"a", "started"})
		fl := f.failure()
		if fl.Failures != i+1 || fl.Delay != d*time.Millisecond {
			t.Errorf("failure %d = failures %d delay %s, want %d and %s", i+1, fl.Failures, fl.Delay, i+1, d*time.Millisecond)
		}
	}
	f.sys.Root.Send(a, &boom{}) // the fourth within the window: give up
	fl := f.failure()
	if fl.Failures != 4 || fl.Delay != 0 {
		t.Errorf("give-up failure = %+v, want 4 failures and no delay", fl)
	}
	got := map[string]bool{}
	for range 2 {
		select {
		case e := <-f.events:
			got[e.what] = true
		case <-time.After(10 * time.Second):
			t.Fatal("parent was not told")
		}
	}
	if !got["gaveup:a"] || !got["terminated:a"] {
		t.Errorf("parent got %v, want gaveup:a and terminated:a", got)
	}
	if v := restarts.Value("test"); v != 3 {
		t.Errorf("restarts = %v, want 3 (the give-up is not a restart)", v)
	}
}

func TestSupervisor_Close_CancelsPendingRestart(t *testing.T) {
	defer leakcheck.Check(t)()
	f := newSupFixture(t, BackoffConfig{Initial: time.Hour, Max: time.Hour}, nil)
	a := f.spawn("a")
	f.sys.Root.Send(a, &boom{})
	f.failure()
	// OnRestart runs as the restart is scheduled, just before its timer is
	// counted: wait for the count.
	for deadline := time.Now().Add(10 * time.Second); f.sup.Pending() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Pending() = %d, want 1", f.sup.Pending())
		}
	}
	f.sup.Close()
	f.sup.Close() // idempotent
	if n := f.sup.Pending(); n != 0 {
		t.Fatalf("Pending() after Close = %d, want 0", n)
	}
	// The suspended child still stops cleanly.
	if err := f.sys.Root.StopFuture(a).Wait(); err != nil {
		t.Fatal(err)
	}
	f.expect(event{"parent", "terminated:a"})
}
