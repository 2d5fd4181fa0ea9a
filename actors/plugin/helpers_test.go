package plugin

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/csiactor/csiactor/actors/plugin/proc"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/testbin"
)

// fakePluginEnv makes the test binary run as an exec-managed CSI plugin: a
// fakeplugin server on $CSI_ENDPOINT. Its first argument must be the
// socket path (the test passes "{socket}", which the actor substitutes).
const fakePluginEnv = "CSIACTOR_TEST_FAKE_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(fakePluginEnv) != "" {
		os.Exit(runFakePlugin())
	}
	os.Exit(m.Run())
}

func runFakePlugin() int {
	ep := os.Getenv("CSI_ENDPOINT")
	path := strings.TrimPrefix(ep, "unix://")
	if len(os.Args) < 2 || os.Args[len(os.Args)-1] != path {
		fmt.Fprintf(os.Stderr, "socket argument %q does not match CSI_ENDPOINT %q\n", os.Args[1:], ep)
		return 3
	}
	p := fakeplugin.New(fakeplugin.Config{
		Name:              os.Getenv("FAKE_NAME"),
		NodeID:            os.Getenv("FAKE_NODE_ID"),
		ControllerPublish: true,
	})
	p.SetHangs(os.Getenv("FAKE_HANG")) // methods (or Method@volume) that hang until the call's deadline
	// With FAKE_SIGNAL_LOG, every stop signal is recorded there (see
	// fakeplugin.SignalRecorder); the first stops the plugin gracefully.
	stopped := func() {}
	var first <-chan struct{}
	if path := os.Getenv("FAKE_SIGNAL_LOG"); path != "" {
		r, err := fakeplugin.RecordSignals(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		first, stopped = r.First(), func() { r.Close(time.Second) }
	} else {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { <-sig; close(done) }()
		first = done
	}
	if err := p.Serve(path); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("fake plugin serving on", path)
	<-first
	p.Stop()
	stopped()
	fmt.Println("fake plugin stopped")
	return 0
}

// startFake serves a fake plugin on a fresh short socket path. The caller
// defers Stop (after leakcheck.Check, so the check runs after it).
func startFake(t *testing.T, cfg fakeplugin.Config) (*fakeplugin.Plugin, string) {
	t.Helper()
	p := fakeplugin.New(cfg)
	if err := p.Serve(fakeplugin.SocketPath(t)); err != nil {
		t.Fatal(err)
	}
	return p, p.Endpoint()
}

// fakeCommand is the command of an exec-managed allocation running the
// fake plugin.
func fakeCommand(t testing.TB) []string {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{self, "-test.run=^$", "{socket}"}
}

func fakeEnv(name string) map[string]string {
	return map[string]string{fakePluginEnv: "1", "FAKE_NAME": name, "FAKE_NODE_ID": "node-" + name}
}

// shortDir returns a temporary directory with a short path (t.TempDir
// paths can exceed the unix socket limit). When the test ends, every
// process whose command line names the directory is killed (plugin
// processes and their log shims outlive an actor's shutdown by design),
// then the directory is removed.
func shortDir(t testing.TB) string {
	d, err := os.MkdirTemp("", "pa-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testbin.KillProcessesWith(d)
		_ = os.RemoveAll(d)
	})
	return d
}

func testConfig(log *logrus.Entry, l *proc.Launcher) Config {
	return Config{
		Log:                log,
		HeartbeatInterval:  time.Second,
		UnhealthyRetry:     10 * time.Millisecond,
		ProbeTimeout:       2 * time.Second,
		FingerprintTimeout: 5 * time.Second,
		DialTimeout:        500 * time.Millisecond,
		StopGrace:          5 * time.Second,
		Launcher:           l,
		RestartBackoff: actorkit.BackoffConfig{
			Initial: 20 * time.Millisecond,
			Max:     200 * time.Millisecond,
			Window:  time.Minute,
		},
	}
}

// parent is the test's stand-in for the registry: it spawns one allocation
// actor and forwards what it reports.
type parent struct {
	props   *actor.Props
	updates chan<- any
	child   *actor.PID
}

type getChild struct{}

func (p *parent) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		p.child = ctx.Spawn(p.props)
	case *getChild:
		ctx.Respond(p.child)
	case *StatusChanged, *Stopped:
		select {
		case p.updates <- m:
		default:
			panic("test parent: update buffer full")
		}
	}
}

type harness struct {
	t        *testing.T
	sys      *actor.ActorSystem
	parent   *actor.PID
	child    *actor.PID
	updates  chan any
	hook     *test.Hook
	launcher *proc.Launcher
	last     Status
	stopped  *Stopped
}

// newHarness starts an allocation actor for spec under a test parent.
// Defer h.close() after leakcheck.Check.
func newHarness(t *testing.T, spec Spec, stale StaleProcess, mod func(*Config)) *harness {
	t.Helper()
	logger, hook := test.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	log := logrus.NewEntry(logger)
	h := &harness{t: t, updates: make(chan any, 10000), hook: hook, launcher: proc.NewLauncher()}
	cfg := testConfig(log, h.launcher)
	if mod != nil {
		mod(&cfg)
	}
	props, err := Props(cfg, spec, stale)
	if err != nil {
		h.launcher.Close()
		t.Fatal(err)
	}
	h.sys = actorkit.NewSystem(log)
	h.parent = h.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &parent{props: props, updates: h.updates}
	}))
	r, err := actorkit.Request(context.Background(), h.sys, h.parent, &getChild{}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	h.child = r.(*actor.PID)
	return h
}

func (h *harness) close() {
	_ = h.sys.Root.StopFuture(h.parent).Wait()
	h.sys.Shutdown()
	h.launcher.Close()
}

// next returns the next update. The guard only turns a hang into a
// failure; it measures nothing.
func (h *harness) next() any {
	h.t.Helper()
	select {
	case u := <-h.updates:
		switch m := u.(type) {
		case *StatusChanged:
			h.last = m.Status
		case *Stopped:
			h.last = m.Status
			h.stopped = m
		}
		return u
	case <-time.After(30 * time.Second):
		h.t.Fatalf("no status update; last: %+v", h.last)
		return nil
	}
}

// waitFor consumes updates until one satisfies ok.
func (h *harness) waitFor(what string, ok func(Status) bool) Status {
	h.t.Helper()
	for {
		u := h.next()
		if s, isStatus := u.(*StatusChanged); isStatus && ok(s.Status) {
			return s.Status
		}
		if _, isStop := u.(*Stopped); isStop {
			h.t.Fatalf("actor stopped while waiting for %s; last: %+v", what, h.last)
		}
	}
}

func (h *harness) waitHealthy() Status {
	h.t.Helper()
	return h.waitFor("healthy", func(s Status) bool { return s.Healthy })
}

func (h *harness) waitUnhealthy(contains string) Status {
	h.t.Helper()
	return h.waitFor("unhealthy: "+contains, func(s Status) bool {
		return !s.Healthy && strings.Contains(s.Description, contains)
	})
}

// shutdown sends Shutdown and returns the Stopped message.
func (h *harness) shutdown(reason string) *Stopped {
	h.t.Helper()
	h.sys.Root.Send(h.child, &Shutdown{Reason: reason})
	for h.stopped == nil {
		h.next()
	}
	return h.stopped
}

// alive reports whether pid runs (not absent, not a zombie).
func alive(pid int) bool {
	st, err := proc.ReadStat(pid)
	return err == nil && st.State != "Z"
}
