package registry

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
)

func TestHandle_Client_NewestWins(t *testing.T) {
	defer leakcheck.Check(t)()
	f1, f2 := startFake(t, fakeplugin.Config{}), startFake(t, fakeplugin.Config{})
	defer f1.Stop()
	defer f2.Stop()
	e := newEnv(t, nil)
	defer e.close()

	a1 := e.register(attachedSpec("a1", "p", plugin.Node, f1))
	a2 := e.register(attachedSpec("a2", "p", plugin.Node, f2))
	if a2.Seq <= a1.Seq {
		t.Fatalf("seq a1 %d a2 %d, want a2 newer", a1.Seq, a2.Seq)
	}
	m := e.waitHealthy("a1", "a2")
	if !m["a2"].Singleton || m["a1"].Singleton {
		t.Errorf("singleton flags a1 %v a2 %v, want only a2", m["a1"].Singleton, m["a2"].Singleton)
	}
	tg, err := e.h.Client(ctx(t), "p", plugin.Node)
	if err != nil || tg.Alloc != "a2" || !tg.Singleton || tg.Client == nil {
		t.Fatalf("Client = %+v, %v; want a2, the singleton", tg, err)
	}
	if _, err := tg.Client.Probe(ctx(t)); err != nil {
		t.Errorf("Probe through the target's client: %v", err)
	}
	if f2.Calls("Probe") == 0 {
		t.Error("a2's plugin never probed")
	}
}

func TestHandle_Client_Errors(t *testing.T) {
	defer leakcheck.Check(t)()
	f := startFake(t, fakeplugin.Config{NotReady: true})
	defer f.Stop()
	e := newEnv(t, nil)
	defer e.close()
	e.register(attachedSpec("n1", "p", plugin.Node, f))
	e.waitUntil("not ready", func(m map[string]AllocationInfo) bool {
		return strings.Contains(m["n1"].HealthDescription, "not ready")
	})

	tests := []struct {
		name   string
		plugin string
		role   plugin.Role
		want   error
		msg    string
	}{
		{"unknown plugin", "nope", plugin.Node, ErrPluginNotFound, `"nope"`},
		{"no allocation in role", "p", plugin.Controller, ErrPluginNotFound, "controller"},
		{"never ready", "p", plugin.Node, ErrNoHealthyPlugin, "not ready"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.h.Client(ctx(t), tt.plugin, tt.role)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err = %v, want %v mentioning %q", err, tt.want, tt.msg)
			}
		})
	}
	s, err := e.h.Plugin(ctx(t), "p")
	if err != nil || s.NodesExpected != 1 || s.NodesHealthy != 0 {
		t.Errorf("Plugin = %+v, %v; want 0 of 1 nodes healthy", s, err)
	}
	if _, err := e.h.Plugin(ctx(t), "nope"); !errors.Is(err, ErrPluginNotFound) {
		t.Errorf("Plugin(nope) err = %v, want ErrPluginNotFound", err)
	}
	wctx, cancel := context.WithTimeout(ctx(t), 50*time.Millisecond)
	defer cancel()
	if err := e.h.WaitHealthy(wctx, "p", plugin.Node); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitHealthy on a never-ready plugin = %v, want the deadline", err)
	}
	if err := e.h.WaitHealthy(ctx(t), "nope", plugin.Node); !errors.Is(err, ErrPluginNotFound) {
		t.Errorf("WaitHealthy(nope) = %v, want ErrPluginNotFound at once", err)
	}
	f.SetReady(true)
	if err := e.h.WaitHealthy(ctx(t), "p", plugin.Node); err != nil {
		t.Errorf("WaitHealthy after SetReady: %v", err)
	}
}

func TestHandle_Register_Validation(t *testing.T) {
	defer leakcheck.Check(t)()
	f := startFake(t, fakeplugin.Config{})
	defer f.Stop()
	e := newEnv(t, nil)
	defer e.close()
	e.register(attachedSpec("a1", "p", plugin.Node, f))

	tests := []struct {
		name string
		spec plugin.Spec
		want error
		msg  string
	}{
		{"missing id", plugin.Spec{Plugin: "p", Type: plugin.Node, Socket: "/x.sock"}, plugin.ErrInvalidSpec, "id is required"},
		{"bad id", plugin.Spec{ID: "../x", Plugin: "p", Type: plugin.Node, Socket: "/x.sock"}, plugin.ErrInvalidSpec, "id"},
		{"missing plugin", plugin.Spec{ID: "b", Type: plugin.Node, Socket: "/x.sock"}, plugin.ErrInvalidSpec, "plugin is required"},
		{"bad type", plugin.Spec{ID: "b", Plugin: "p", Type: "both", Socket: "/x.sock"}, plugin.ErrInvalidSpec, "type"},
		{"no socket nor command", plugin.Spec{ID: "b", Plugin: "p", Type: plugin.Node}, plugin.ErrInvalidSpec, "socket, command or image"},
		{"relative socket", plugin.Spec{ID: "b", Plugin: "p", Type: plugin.Node, Socket: "x.sock"}, plugin.ErrInvalidSpec, "socket"},
		{"socket too long", plugin.Spec{ID: "b", Plugin: "p", Type: plugin.Node, Socket: "/" + strings.Repeat("s", 120)}, plugin.ErrInvalidSpec, "107"},
		{"both socket and command", plugin.Spec{ID: "b", Plugin: "p", Type: plugin.Node, Socket: "/x.sock", Command: []string{"x"}}, plugin.ErrInvalidSpec, "both"},
		{"env without command", plugin.Spec{ID: "b", Plugin: "p", Type: plugin.Node, Socket: "/x.sock", Env: map[string]string{"A": "1"}}, plugin.ErrInvalidSpec, "env"},
		{"CSI_ENDPOINT in env", plugin.Spec{ID: "b", Plugin: "p", Type: plugin.Node, Command: []string{"x"}, Env: map[string]string{"CSI_ENDPOINT": "1"}}, plugin.ErrInvalidSpec, "CSI_ENDPOINT"},
		{"relative command", plugin.Spec{ID: "b", Plugin: "p", Type: plugin.Node, Command: []string{"relative/cmd"}}, plugin.ErrInvalidSpec, `command[0] "relative/cmd" is a relative path`},
		{"command not in PATH", plugin.Spec{ID: "b", Plugin: "p", Type: plugin.Node, Command: []string{"csiactor-no-such-plugin"}}, plugin.ErrInvalidSpec, `command[0] "csiactor-no-such-plugin" is not found in the agent's PATH`},
		{"same id other spec", attachedSpec("a1", "p", plugin.Controller, f), ErrConflict, "registered with a different type; deregister it first"},
		{"socket in use", attachedSpec("b", "p", plugin.Node, f), ErrConflict, "already used by allocation \"a1\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.h.Register(ctx(t), tt.spec)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err = %v, want %v mentioning %q", err, tt.want, tt.msg)
			}
		})
	}
	all, _ := e.h.Allocations(ctx(t))
	if len(all) != 1 {
		t.Errorf("bad registrations changed something: %d allocations", len(all))
	}
	// The same spec again is a no-op.
	a, err := e.h.Register(ctx(t), attachedSpec("a1", "p", plugin.Node, f))
	if err != nil || a.ID != "a1" {
		t.Errorf("idempotent register = %+v, %v", a, err)
	}
}

// The newest exec-managed allocation is SIGKILLed: operations go to the
// older one at once, and back to the newest when its backoff restarted it.
func TestHandle_Client_FailoverAndBack(t *testing.T) {
	defer leakcheck.Check(t)()
	e := newEnv(t, func(c *Config) { c.Plugin.HeartbeatInterval = time.Hour })
	defer e.close()
	e.register(execSpec(t, "old", "p", plugin.Node))
	e.register(execSpec(t, "new", "p", plugin.Node))
	m := e.waitHealthy("old", "new")
	if got := e.active("p", plugin.Node); got != "new" {
		t.Fatalf("active = %s, want new", got)
	}
	sub, err := e.h.Subscribe(1024)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Cancel()

	if err := syscall.Kill(m["new"].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var actives []string
	for len(actives) < 2 {
		select {
		case ev := <-sub.C:
			if ev.Type == EventActiveChanged {
				actives = append(actives, ev.Alloc)
				if len(actives) == 1 {
					tg, err := e.h.Client(ctx(t), "p", plugin.Node)
					if err != nil || (tg.Alloc != "old" && tg.Alloc != "new") {
						t.Fatalf("Client during failover = %+v, %v", tg, err)
					}
				}
			}
			if ev.Type == EventSingletonChanged {
				t.Errorf("the singleton changed (%+v); a crash must not change it", ev)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("active changes so far: %v", actives)
		}
	}
	if !slices.Equal(actives, []string{"old", "new"}) {
		t.Errorf("active went %v, want [old new]", actives)
	}
	m = e.waitHealthy("new")
	if m["new"].Exits != 1 || !m["new"].Singleton {
		t.Errorf("new: exits %d singleton %v; want 1 and true", m["new"].Exits, m["new"].Singleton)
	}
}

// Allocations restored after an agent restart keep their creation order,
// whatever order they are registered in again.
func TestHandle_Register_RestoreInReverseOrderKeepsSingleton(t *testing.T) {
	defer leakcheck.Check(t)()
	fs := []*fakeplugin.Plugin{startFake(t, fakeplugin.Config{}), startFake(t, fakeplugin.Config{}), startFake(t, fakeplugin.Config{})}
	for _, f := range fs {
		defer f.Stop()
	}
	e := newEnv(t, nil)
	defer e.close()
	ids := []string{"a1", "a2", "a3"}
	for i, id := range ids {
		e.register(attachedSpec(id, "p", plugin.Node, fs[i]))
	}
	e.waitHealthy(ids...)

	e.restart()
	for i := len(ids) - 1; i >= 0; i-- {
		a := e.register(attachedSpec(ids[i], "p", plugin.Node, fs[i]))
		if a.ID != ids[i] {
			t.Fatalf("re-register %s = %+v", ids[i], a)
		}
	}
	m := e.waitHealthy(ids...)
	if !m["a3"].Singleton || m["a1"].Singleton || m["a2"].Singleton {
		t.Errorf("singleton after restore: a1 %v a2 %v a3 %v; want a3", m["a1"].Singleton, m["a2"].Singleton, m["a3"].Singleton)
	}
	if got := e.active("p", plugin.Node); got != "a3" {
		t.Errorf("active = %s, want a3", got)
	}
}

func TestHandle_Deregister(t *testing.T) {
	defer leakcheck.Check(t)()
	fc, fn, fm, fx := startFake(t, fakeplugin.Config{Controller: true}), startFake(t, fakeplugin.Config{}),
		startFake(t, fakeplugin.Config{Controller: true}), startFake(t, fakeplugin.Config{})
	for _, f := range []*fakeplugin.Plugin{fc, fn, fm, fx} {
		defer f.Stop()
	}
	e := newEnv(t, nil)
	defer e.close()
	e.register(attachedSpec("c1", "p", plugin.Controller, fc))
	e.register(attachedSpec("n1", "p", plugin.Node, fn))
	e.register(attachedSpec("m1", "p", plugin.Monolith, fm))
	e.register(attachedSpec("x1", "other", plugin.Node, fx))
	e.waitHealthy("c1", "n1", "m1", "x1")
	if c, n := e.active("p", plugin.Controller), e.active("p", plugin.Node); c != "m1" || n != "m1" {
		t.Fatalf("active controller %s node %s, want the monolith for both", c, n)
	}

	if err := e.h.Deregister(ctx(t), "m1"); err != nil {
		t.Fatal(err)
	}
	// Both roles handed over, at once.
	if c, n := e.active("p", plugin.Controller), e.active("p", plugin.Node); c != "c1" || n != "n1" {
		t.Errorf("after deregistering the monolith: controller %s node %s, want c1 and n1", c, n)
	}
	all, err := e.h.Allocations(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range all {
		got = append(got, a.ID)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"c1", "n1", "x1"}) {
		t.Errorf("allocations after deregistration: %v, want exactly c1 n1 x1", got)
	}
	recs, err := e.store.Allocations(ctx(t))
	if err != nil || len(recs) != 3 {
		t.Errorf("store has %d allocations (%v), want 3", len(recs), err)
	}
	if err := e.h.Deregister(ctx(t), "m1"); !errors.Is(err, ErrAllocationNotFound) {
		t.Errorf("second deregistration: %v, want ErrAllocationNotFound", err)
	}
	if err := e.h.Deregister(ctx(t), "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.h.Client(ctx(t), "p", plugin.Node); !errors.Is(err, ErrPluginNotFound) {
		t.Errorf("node after its last allocation left: %v, want ErrPluginNotFound", err)
	}
	if got := e.active("p", plugin.Controller); got != "c1" {
		t.Errorf("controller = %s, want c1 untouched", got)
	}
}

func TestHandle_Deregister_ExecStopsProcess(t *testing.T) {
	defer leakcheck.Check(t)()
	e := newEnv(t, nil)
	defer e.close()
	e.register(execSpec(t, "e1", "p", plugin.Monolith))
	m := e.waitHealthy("e1")
	pid := m["e1"].PID
	if err := e.h.Deregister(ctx(t), "e1"); err != nil {
		t.Fatal(err)
	}
	if st, ok := children(t)[pid]; ok {
		t.Errorf("plugin process %d still a child (state %s) after Deregister returned", pid, st)
	}
}

// A plugin whose socket goes away is unhealthy and an older healthy one
// serves; a plugin answering garbage is unhealthy with a description.
func TestHandle_Client_UnhealthySingleton(t *testing.T) {
	tests := []struct {
		name    string
		breakIt func(*fakeplugin.Plugin)
		desc    string
	}{
		{"socket disappears", (*fakeplugin.Plugin).Stop, ""},
		{"garbage answer", func(f *fakeplugin.Plugin) { f.SetFault("NodeGetInfo", fakeplugin.Fault{Garbage: true}) }, "invalid response"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer leakcheck.Check(t)()
			old, newer := startFake(t, fakeplugin.Config{}), startFake(t, fakeplugin.Config{})
			defer old.Stop()
			defer newer.Stop()
			e := newEnv(t, func(c *Config) { c.Plugin.HeartbeatInterval = 200 * time.Millisecond })
			defer e.close()
			e.register(attachedSpec("old", "p", plugin.Node, old))
			e.register(attachedSpec("new", "p", plugin.Node, newer))
			e.waitHealthy("old", "new")
			tt.breakIt(newer)
			m := e.waitUntil("new unhealthy", func(m map[string]AllocationInfo) bool {
				return !m["new"].Healthy && strings.Contains(m["new"].HealthDescription, tt.desc)
			})
			if !m["new"].Singleton {
				t.Error("the unhealthy newest allocation must stay the singleton")
			}
			tg, err := e.h.Client(ctx(t), "p", plugin.Node)
			if err != nil || tg.Alloc != "old" || tg.Singleton {
				t.Errorf("Client = %+v, %v; want old, not the singleton", tg, err)
			}
		})
	}
}

// A subscriber that never reads must not stall registrations.
func TestHandle_Subscribe_StuckSubscriber(t *testing.T) {
	defer leakcheck.Check(t)()
	f := startFake(t, fakeplugin.Config{})
	defer f.Stop()
	e := newEnv(t, nil)
	defer e.close()
	stuck, err := e.h.Subscribe(2)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Cancel()
	live, err := e.h.Subscribe(10000)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Cancel()

	const n = 30
	for i := range n {
		e.register(plugin.Spec{ID: fmt.Sprintf("a%02d", i), Plugin: fmt.Sprintf("p%02d", i), Type: plugin.Node, Socket: f.SocketPath() + fmt.Sprint(i)})
	}
	registered := 0
	for registered < n {
		select {
		case ev := <-live.C:
			if ev.Type == EventRegistered {
				registered++
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("live subscriber saw %d registrations", registered)
		}
	}
	var lagged uint64
	for lagged == 0 {
		select {
		case ev := <-stuck.C:
			lagged = ev.Dropped
		case <-time.After(60 * time.Second):
			t.Fatal("no lagged event for the stuck subscriber")
		}
	}
	if stuck.Dropped() == 0 {
		t.Error("Dropped() = 0")
	}
}

// boom makes the test middleware panic in the allocation actor it is sent to.
type boom struct{}

func TestHandle_PanickingAllocationRestartsAlone(t *testing.T) {
	defer leakcheck.Check(t)()
	f1, f2 := startFake(t, fakeplugin.Config{}), startFake(t, fakeplugin.Config{})
	defer f1.Stop()
	defer f2.Stop()
	starts := make(chan string, 100)
	e := newEnv(t, func(c *Config) {
		c.Supervisor.MaxFailures = 1
		c.Supervisor.Window = time.Hour
		c.ChildMiddleware = []actor.ReceiverMiddleware{func(next actor.ReceiverFunc) actor.ReceiverFunc {
			return func(ctx actor.ReceiverContext, env *actor.MessageEnvelope) {
				switch env.Message.(type) {
				case *boom:
					panic("boom")
				case *actor.Started:
					starts <- ctx.Self().Id
				}
				next(ctx, env)
			}
		}}
	})
	defer e.close()
	e.register(attachedSpec("a1", "p", plugin.Node, f1))
	e.register(attachedSpec("a2", "q", plugin.Node, f2))
	e.waitHealthy("a1", "a2")
	pids := map[string]string{}
	for len(pids) < 2 {
		id := <-starts
		pids[id[strings.Index(id, "alloc-")+6:strings.LastIndexByte(id, '-')]] = id
	}

	e.sys.Root.Send(actor.NewPID(e.sys.Address(), pids["a2"]), &boom{})
	if got := <-starts; got != pids["a2"] {
		t.Fatalf("restarted %s, want only a2's actor %s", got, pids["a2"])
	}
	e.waitHealthy("a2")
	select {
	case got := <-starts:
		t.Fatalf("another actor started: %s", got)
	default:
	}
	if v := e.h.sh.sup.Pending(); v != 0 {
		t.Errorf("pending restarts = %d", v)
	}
	if got := e.restartsValue(); got != 1 {
		t.Errorf("csiactor_actor_restarts_total{kind=plugin} = %v, want 1", got)
	}

	// A second failure within the window: the registry gives up on a2.
	e.sys.Root.Send(actor.NewPID(e.sys.Address(), pids["a2"]), &boom{})
	m := e.waitUntil("a2 failed", func(m map[string]AllocationInfo) bool {
		return strings.HasPrefix(m["a2"].HealthDescription, "failed: allocation actor gave up after 2 failures: boom")
	})
	if m["a2"].Healthy || !m["a1"].Healthy {
		t.Errorf("a1 healthy %v a2 healthy %v; want a1 untouched and a2 failed", m["a1"].Healthy, m["a2"].Healthy)
	}
	if _, err := e.h.Client(ctx(t), "q", plugin.Node); !errors.Is(err, ErrNoHealthyPlugin) {
		t.Errorf("Client(q) = %v, want ErrNoHealthyPlugin", err)
	}
	// Registering it again brings it back.
	e.register(attachedSpec("a2", "q", plugin.Node, f2))
	e.waitHealthy("a2")
}

func (e *env) restartsValue() float64 { return e.restartsOf("plugin") }

func (e *env) restartsOf(kind string) float64 {
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "csiactor_actor_restarts_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// Shutdown leaves every allocation persisted as "agent shutting down",
// with its plugin info, and no process or goroutine behind.
func TestHandle_Shutdown_PersistsFinalStateAndLeavesNothing(t *testing.T) {
	defer leakcheck.Check(t)()
	f := startFake(t, fakeplugin.Config{Name: "attached.csi"})
	defer f.Stop()
	before := children(t)
	e := newEnv(t, nil)
	e.register(attachedSpec("a1", "p", plugin.Node, f))
	e.register(execSpec(t, "e1", "p", plugin.Monolith))
	e.register(execSpec(t, "e2", "q", plugin.Controller))
	m := e.waitHealthy("a1", "e1", "e2")
	e.close()

	for _, pid := range []int{m["e1"].PID, m["e2"].PID} {
		if st, ok := children(t)[pid]; ok {
			t.Errorf("plugin process %d left behind (state %s)", pid, st)
		}
	}
	if after := children(t); len(after) > len(before) {
		t.Errorf("children before %v after %v", before, after)
	}

	st := reopen(t, e)
	defer st.Close()
	recs, err := st.Allocations(ctx(t))
	if err != nil || len(recs) != 3 {
		t.Fatalf("store: %d records, %v", len(recs), err)
	}
	for _, r := range recs {
		if r.Healthy || r.HealthMsg != plugin.ReasonShutdown || r.PID != 0 {
			t.Errorf("%s persisted healthy %v %q pid %d; want unhealthy %q without pid", r.ID, r.Healthy, r.HealthMsg, r.PID, plugin.ReasonShutdown)
		}
		if r.Provider == "" || r.NodeID == "" && r.Type != "controller" {
			t.Errorf("%s lost its plugin info: provider %q node %q", r.ID, r.Provider, r.NodeID)
		}
	}
}

// A binary that cannot be started says so, with the system's error, and
// then how many attempts failed; it is not described as crash-looping.
func TestHandle_Register_StartFailureDescribed(t *testing.T) {
	defer leakcheck.Check(t)()
	e := newEnv(t, nil)
	defer e.close()
	missing := filepath.Join(e.data, "no-such-plugin")
	e.register(plugin.Spec{ID: "m1", Plugin: "p", Type: plugin.Node, Command: []string{missing}})
	e.waitUntil("first failed start", func(m map[string]AllocationInfo) bool {
		return strings.HasPrefix(m["m1"].HealthDescription, "failed to start: fork/exec "+missing+": no such file or directory; retrying in ")
	})
	m := e.waitUntil("third failed start", func(m map[string]AllocationInfo) bool {
		return strings.HasPrefix(m["m1"].HealthDescription, "cannot start plugin (3 attempts): fork/exec "+missing+": no such file or directory; retrying in ")
	})
	if a := m["m1"]; a.Healthy || a.Exits != 0 || a.PID != 0 {
		t.Errorf("m1 = healthy %v exits %d pid %d; a binary that never started is unhealthy, without exits or PID", a.Healthy, a.Exits, a.PID)
	}
}

// Election events read as sentences an operator can take alone.
func TestHandle_Subscribe_ElectionMessages(t *testing.T) {
	defer leakcheck.Check(t)()
	f1, f2 := startFake(t, fakeplugin.Config{Controller: true}), startFake(t, fakeplugin.Config{})
	defer f1.Stop()
	defer f2.Stop()
	e := newEnv(t, nil)
	defer e.close()
	sub, err := e.h.Subscribe(1024)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Cancel()
	e.register(attachedSpec("a1", "p", plugin.Monolith, f1))
	e.waitHealthy("a1")
	e.register(attachedSpec("a2", "p", plugin.Node, f2))
	e.waitHealthy("a2")
	if err := e.h.Deregister(ctx(t), "a2"); err != nil {
		t.Fatal(err)
	}
	if err := e.h.Deregister(ctx(t), "a1"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"singleton_changed controller: a1 is now the controller singleton",
		"singleton_changed node: a1 is now the node singleton",
		"active_changed controller: controller operations now go to a1",
		"active_changed node: node operations now go to a1",
		"singleton_changed node: a2 is now the node singleton, replacing a1",
		"active_changed node: node operations now go to a2 instead of a1",
		"singleton_changed node: a1 is now the node singleton, replacing a2",
		"active_changed node: node operations now go to a1 instead of a2",
		"singleton_changed node: no node allocation is left (a1 was the singleton)",
		"active_changed node: node operations have no healthy allocation to go to (they went to a1)",
		"singleton_changed controller: no controller allocation is left (a1 was the singleton)",
	}
	var got []string
	guard := time.NewTimer(60 * time.Second)
	defer guard.Stop()
	for !containsAll(got, want) {
		select {
		case ev := <-sub.C:
			if ev.Type == EventSingletonChanged || ev.Type == EventActiveChanged {
				got = append(got, fmt.Sprintf("%s %s: %s", ev.Type, ev.Role, ev.Message))
			}
		case <-guard.C:
			t.Fatalf("election events:\n%s\nwant all of:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}

func containsAll(got, want []string) bool {
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}

// By default a restart of the agent leaves exec-managed plugins running:
// the store keeps the PID through the shutdown, and the next registry's
// actor adopts the same process.
func TestHandle_Restart_AdoptsRunningPlugin(t *testing.T) {
	defer leakcheck.Check(t)()
	e := newEnv(t, func(c *Config) { c.Plugin.StopOnShutdown = false })
	e.register(execSpec(t, "e1", "p", plugin.Monolith))
	first := e.waitHealthy("e1")["e1"]
	e.stop()
	if _, ok := children(t)[first.PID]; !ok {
		t.Fatalf("plugin process %d did not outlive the shutdown", first.PID)
	}
	rec, err := e.store.Allocation(ctx(t), "e1")
	if err != nil || rec.PID != first.PID || rec.HealthMsg != plugin.ReasonShutdown {
		t.Errorf("stored e1: pid %d %q, %v; want pid %d kept, %q", rec.PID, rec.HealthMsg, err, first.PID, plugin.ReasonShutdown)
	}
	e.start()
	again := e.waitHealthy("e1")["e1"]
	if again.PID != first.PID || again.Exits != 0 {
		t.Errorf("after restart PID %d exits %d; want the same process %d", again.PID, again.Exits, first.PID)
	}
	if err := e.h.Deregister(ctx(t), "e1"); err != nil {
		t.Fatal(err)
	}
	if st, ok := children(t)[first.PID]; ok && st != "Z" {
		t.Errorf("plugin process %d runs after deregistration (state %s)", first.PID, st)
	}
	e.close()
}
