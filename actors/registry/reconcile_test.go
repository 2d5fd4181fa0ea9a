package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/plugin/proc"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/persistence"
)

// leftover is a plugin process that a killed agent left running for an
// allocation: started here, its PID and start time written into the
// allocation's record, as the agent would have persisted them.
type leftover struct {
	cmd    *exec.Cmd
	waited chan struct{}
}

// leaveProcess runs spec's fake plugin on its socket outside any registry
// and records it in e's store (e is stopped, its store open).
func leaveProcess(t *testing.T, e *env, spec plugin.Spec) *leftover {
	t.Helper()
	cmd := exec.Command(spec.Command[0], spec.Command[1:]...)
	cmd.Env = []string{fakePluginEnv + "=1", "CSI_ENDPOINT=unix://" + plugin.SocketPath(e.data, spec.ID)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	l := &leftover{cmd: cmd, waited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(l.waited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-l.waited
	})
	st, err := proc.ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := e.store.Allocation(ctx(t), spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec.PID, rec.PIDStart = cmd.Process.Pid, st.StartTicks
	if _, err := e.store.PutAllocation(ctx(t), rec); err != nil {
		t.Fatal(err)
	}
	return l
}

// waitKilled waits until the leftover is gone and checks it was SIGKILLed.
// The guard only turns a hang into a failure.
func (l *leftover) waitKilled(t *testing.T) {
	t.Helper()
	select {
	case <-l.waited:
	case <-time.After(30 * time.Second):
		t.Fatal("the leftover process was not killed")
	}
	if ws := l.cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGKILL {
		t.Errorf("leftover ended with %s, want SIGKILL", l.cmd.ProcessState)
	}
}

// liveChildren returns the PIDs of this test's child processes that run
// (zombies and the plugins' log shims left out), sorted.
func liveChildren(t *testing.T) []int {
	var out []int
	for pid, state := range children(t) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if state != "Z" && !strings.HasPrefix(string(cmdline), "csiactor-log-shim\x00") {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

func logged(e *env, msg string) bool {
	for _, entry := range e.hook.AllEntries() {
		if strings.Contains(entry.Message, msg) {
			return true
		}
	}
	return false
}

// The bug this guards against: an agent whose config allocation changed
// while it was down (a new binary path, as with `go run`) failed to start
// with ErrConflict. Now the config's new spec replaces the stored one,
// keeps its Seq (so a newer API allocation of the plugin stays the
// singleton), and the process the old spec left behind is killed before
// the new one starts: one process for the allocation, never two.
func TestStart_ConfigAllocations_ChangedSpecReplaces(t *testing.T) {
	defer leakcheck.Check(t)()
	v1 := execSpec(t, "c1", "p", plugin.Node)
	configured := []plugin.Spec{v1}
	e := newEnv(t, func(c *Config) { c.ConfigAllocations = configured })
	defer e.close()
	first := e.waitHealthy("c1")["c1"]
	if first.Source != SourceConfig {
		t.Errorf("c1 source = %q, want config", first.Source)
	}
	api := e.register(execSpec(t, "a1", "p", plugin.Node))
	if api.Source != SourceAPI || api.Seq <= first.Seq {
		t.Fatalf("a1 = source %q seq %d; want an API allocation newer than c1 (seq %d)", api.Source, api.Seq, first.Seq)
	}
	e.waitHealthy("c1", "a1")
	e.stop()

	// Killed agent: the old spec's process still runs. Then the config
	// changes c1's command and environment.
	old := leaveProcess(t, e, v1)
	v2 := v1
	v2.Command = append(slices.Clone(v1.Command), "-test.count=1")
	v2.Env = maps.Clone(v1.Env)
	v2.Env["FAKE_NODE_ID"] = "node-c1-v2"
	configured = []plugin.Spec{v2}
	e.start()

	m := e.waitUntil("c1 replaced and healthy", func(m map[string]AllocationInfo) bool {
		return m["c1"].Healthy && m["c1"].NodeID == "node-c1-v2" && m["a1"].Healthy
	})
	old.waitKilled(t)
	c1 := m["c1"]
	if c1.Seq != first.Seq || c1.Source != SourceConfig || !slices.Equal(c1.Command, v2.Command) {
		t.Errorf("c1 = seq %d source %q command %q; want seq %d kept, config, the new command", c1.Seq, c1.Source, c1.Command, first.Seq)
	}
	if c1.PID == 0 || c1.PID == old.cmd.Process.Pid {
		t.Errorf("c1 PID = %d (leftover %d); want its own new process", c1.PID, old.cmd.Process.Pid)
	}
	if got, want := liveChildren(t), slices.Sorted(slices.Values([]int{c1.PID, m["a1"].PID})); !slices.Equal(got, want) {
		t.Errorf("running plugin processes %v, want exactly c1's and a1's %v", got, want)
	}
	if got := e.active("p", plugin.Node); got != "a1" || !m["a1"].Singleton || c1.Singleton {
		t.Errorf("active %s, singletons a1 %v c1 %v; want a1, the newer API allocation", got, m["a1"].Singleton, c1.Singleton)
	}
	rec, err := e.store.Allocation(ctx(t), "c1")
	if err != nil || rec.Source != "config" || rec.Seq != first.Seq {
		t.Errorf("stored c1 = %+v, %v; want source config, seq %d", rec, err, first.Seq)
	}
	if !logged(e, "allocation replaced: its spec changed in the config file") {
		t.Error("the replacement was not logged")
	}

	// The same config again changes nothing.
	e.restart()
	m = e.waitHealthy("c1", "a1")
	if m["c1"].Seq != first.Seq || logged(e, "allocation replaced") {
		t.Errorf("restart with the same config: c1 seq %d (want %d), replaced logged %v", m["c1"].Seq, first.Seq, logged(e, "allocation replaced"))
	}
}

// A config allocation the config file no longer lists is deregistered on
// start: its leftover process killed, its socket directory and record
// removed. API allocations survive whatever the config says.
func TestStart_ConfigAllocations_RemovedDeregistered(t *testing.T) {
	defer leakcheck.Check(t)()
	fc, fa := startFake(t, fakeplugin.Config{}), startFake(t, fakeplugin.Config{})
	defer fc.Stop()
	defer fa.Stop()
	c1 := execSpec(t, "c1", "p", plugin.Node)
	c2 := attachedSpec("c2", "q", plugin.Node, fc)
	configured := []plugin.Spec{c1, c2}
	e := newEnv(t, func(c *Config) { c.ConfigAllocations = configured })
	defer e.close()
	e.register(attachedSpec("a1", "q", plugin.Node, fa))
	e.waitHealthy("c1", "c2", "a1")
	e.stop()

	old := leaveProcess(t, e, c1)
	configured = []plugin.Spec{c2}
	e.start()
	m := e.waitHealthy("c2", "a1")
	old.waitKilled(t)
	if _, ok := m["c1"]; ok || len(m) != 2 {
		t.Errorf("allocations %v, want c2 and a1 only", slices.Collect(maps.Keys(m)))
	}
	if m["c2"].Source != SourceConfig || m["a1"].Source != SourceAPI {
		t.Errorf("sources c2 %q a1 %q, want config and api", m["c2"].Source, m["a1"].Source)
	}
	if _, err := e.store.Allocation(ctx(t), "c1"); !errors.Is(err, persistence.ErrNotFound) {
		t.Errorf("stored c1: %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(filepath.Dir(plugin.SocketPath(e.data, "c1"))); !os.IsNotExist(err) {
		t.Errorf("c1's socket directory: %v, want it removed", err)
	}
	if got := liveChildren(t); len(got) != 0 {
		t.Errorf("plugin processes %v still run; c1's was the only exec-managed one", got)
	}
	if _, err := e.h.Client(ctx(t), "p", plugin.Node); !errors.Is(err, ErrPluginNotFound) {
		t.Errorf("Client(p) = %v, want ErrPluginNotFound", err)
	}
	if !logged(e, "allocation deregistered: it is no longer in the config file") {
		t.Error("the deregistration was not logged")
	}

	// An empty config removes the rest of its allocations, not the API's.
	configured = nil
	e.restart()
	m = e.waitHealthy("a1")
	if len(m) != 1 {
		t.Errorf("allocations %v, want a1 only", slices.Collect(maps.Keys(m)))
	}
}

// The config wins over the API on start: an API allocation with a listed
// ID becomes the config's (keeping its Seq, replaced when its spec
// differs), and one whose socket a listed allocation uses is deregistered.
// While the agent runs, the API can register a config allocation's ID
// again only with the config's spec, and can deregister it until the next
// start.
func TestStart_ConfigAllocations_WinOverAPI(t *testing.T) {
	defer leakcheck.Check(t)()
	fx, fy, fz := startFake(t, fakeplugin.Config{}), startFake(t, fakeplugin.Config{ControllerPublish: true}), startFake(t, fakeplugin.Config{})
	defer fx.Stop()
	defer fy.Stop()
	defer fz.Stop()
	var configured []plugin.Spec
	e := newEnv(t, func(c *Config) { c.ConfigAllocations = configured })
	defer e.close()
	x := e.register(attachedSpec("x", "p", plugin.Node, fx))
	y := e.register(attachedSpec("y", "p", plugin.Node, fy))
	e.register(attachedSpec("z", "p", plugin.Node, fz))
	e.waitHealthy("x", "y", "z")
	e.stop()

	configured = []plugin.Spec{
		attachedSpec("x", "p", plugin.Node, fx),       // same spec
		attachedSpec("y", "p", plugin.Controller, fy), // other type
		attachedSpec("w", "p", plugin.Node, fz),       // z's socket
	}
	e.start()
	m := e.waitHealthy("x", "y", "w")
	if _, ok := m["z"]; ok {
		t.Error("z, whose socket the config gives to w, is still registered")
	}
	if !logged(e, `allocation deregistered: config allocation "w" uses its socket`) {
		t.Error("z's deregistration was not logged")
	}
	for id, seq := range map[string]uint64{"x": x.Seq, "y": y.Seq} {
		if m[id].Source != SourceConfig || m[id].Seq != seq {
			t.Errorf("%s = source %q seq %d; want config, seq %d kept", id, m[id].Source, m[id].Seq, seq)
		}
	}
	if m["y"].Type != plugin.Controller {
		t.Errorf("y type %s, want the config's controller", m["y"].Type)
	}

	again, err := e.h.Register(ctx(t), attachedSpec("x", "p", plugin.Node, fx))
	if err != nil || again.Source != SourceConfig || again.Seq != x.Seq {
		t.Errorf("API register of x with the config's spec = %+v, %v; want the config's allocation unchanged", again, err)
	}
	_, err = e.h.Register(ctx(t), attachedSpec("x", "p", plugin.Controller, fx))
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "comes from the config file, with a different type; change it there") {
		t.Errorf("API register of x with another spec = %v, want ErrConflict pointing at the config file", err)
	}

	sub, err := e.h.Subscribe(64)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Cancel()
	if err := e.h.Deregister(ctx(t), "x"); err != nil {
		t.Fatal(err)
	}
	for ev := range sub.C {
		if ev.Type == EventDeregistered {
			if ev.Alloc != "x" || !strings.Contains(ev.Message, "it is in the config file, so it comes back when the agent restarts") {
				t.Errorf("deregistered event %+v, want x's saying it comes back", ev)
			}
			break
		}
	}
	e.restart()
	m = e.waitHealthy("x", "y", "w")
	if m["x"].Source != SourceConfig {
		t.Errorf("x after restart: source %q, want config", m["x"].Source)
	}
}

func TestConfig_Validate_ConfigAllocations(t *testing.T) {
	data := shortDir(t)
	exec1 := plugin.Spec{ID: "c1", Plugin: "p", Type: plugin.Node, Command: []string{"/bin/true"}}
	tests := []struct {
		name  string
		specs []plugin.Spec
		want  []string // what the error says; nil: valid
	}{
		{"valid", []plugin.Spec{exec1, {ID: "c2", Plugin: "p", Type: plugin.Node, Command: []string{"sh"}}}, nil},
		{"relative command", []plugin.Spec{{ID: "c1", Plugin: "p", Type: plugin.Node, Command: []string{"relative/cmd"}}},
			[]string{`config allocation "c1"`, `command[0] "relative/cmd" is a relative path`}},
		{"bare name not in PATH", []plugin.Spec{{ID: "c1", Plugin: "p", Type: plugin.Node, Command: []string{"csiactor-no-such-plugin"}}},
			[]string{`config allocation "c1"`, `command[0] "csiactor-no-such-plugin" is not found in the agent's PATH`}},
		{"no id", []plugin.Spec{exec1, {Plugin: "p", Type: plugin.Node, Command: []string{"/bin/true"}}},
			[]string{"config allocation #2", "id is required"}},
		{"listed twice", []plugin.Spec{exec1, exec1}, []string{`config allocation "c1" is listed twice`}},
		{"same socket", []plugin.Spec{
			{ID: "a", Plugin: "p", Type: plugin.Node, Socket: "/run/s.sock"},
			{ID: "b", Plugin: "p", Type: plugin.Node, Socket: "unix:///run/s.sock"},
		}, []string{`config allocation "b": socket "/run/s.sock" is also the socket of config allocation "a"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &env{t: t, data: data}
			cfg := e.config()
			cfg.Store = nopStore{}
			cfg.ConfigAllocations = tt.specs
			err := cfg.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v, want it to say %q", err, w)
				}
			}
		})
	}
}

// A config that does not validate fails Start before the store is touched.
func TestStart_ConfigAllocations_InvalidLeavesStoreAlone(t *testing.T) {
	defer leakcheck.Check(t)()
	e := newEnv(t, nil)
	defer e.close()
	a := e.register(execSpec(t, "c1", "p", plugin.Node))
	e.waitHealthy("c1")
	e.stop()

	cfg := e.config()
	cfg.ConfigAllocations = []plugin.Spec{{ID: "c1", Plugin: "p", Type: plugin.Node, Command: []string{"bin/plugin"}}}
	sys := actorkit.NewSystem(cfg.Log)
	defer sys.Shutdown()
	if _, err := Start(context.Background(), sys, cfg); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `command[0] "bin/plugin"`) {
		t.Fatalf("Start = %v, want ErrInvalidConfig naming command[0]", err)
	}
	rec, err := e.store.Allocation(ctx(t), "c1")
	if err != nil || rec.Seq != a.Seq || rec.Source != "api" || len(rec.Command) == 0 || rec.Command[0] == "bin/plugin" {
		t.Errorf("stored c1 = %+v, %v; want it as it was", rec, err)
	}
	e.start()
}

// nopStore is a Store for tests that never reach it.
type nopStore struct{}

func (nopStore) PutAllocation(context.Context, persistence.Allocation) (persistence.Allocation, error) {
	return persistence.Allocation{}, errors.New("nopStore")
}
func (nopStore) DeleteAllocation(context.Context, string) error { return errors.New("nopStore") }
func (nopStore) Allocations(context.Context) ([]persistence.Allocation, error) {
	return nil, errors.New("nopStore")
}

// A config allocation whose plugin was left running by the last agent
// (plugins outlive it) and that the config file no longer lists is
// stopped, with its log shim, before anything starts.
func TestStart_ConfigAllocations_RemovedStopsRunningPlugin(t *testing.T) {
	defer leakcheck.Check(t)()
	configured := []plugin.Spec{execSpec(t, "c1", "p", plugin.Node)}
	e := newEnv(t, func(c *Config) {
		c.ConfigAllocations = configured
		c.Plugin.StopOnShutdown = false
	})
	defer e.close()
	first := e.waitHealthy("c1")["c1"]
	e.stop()
	st, err := proc.ReadState(filepath.Join(e.data, "plugins", "c1"))
	if err != nil || st.PID != first.PID || st.ShimPID == 0 {
		t.Fatalf("recorded %+v, %v; want the running plugin %d and its shim", st, err, first.PID)
	}
	configured = nil
	e.start()
	for _, pid := range []int{st.PID, st.ShimPID} {
		if state, ok := children(t)[pid]; ok && state != "Z" {
			t.Errorf("process %d still runs (state %s) after its allocation left the config", pid, state)
		}
	}
	if _, err := e.h.Allocation(ctx(t), "c1"); !errors.Is(err, ErrAllocationNotFound) {
		t.Errorf("c1 after removal: %v, want ErrAllocationNotFound", err)
	}
	if _, err := os.Stat(filepath.Join(e.data, "plugins", "c1")); !os.IsNotExist(err) {
		t.Errorf("c1's directory: %v, want removed", err)
	}
}
