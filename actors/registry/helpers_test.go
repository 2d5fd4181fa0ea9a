package registry

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/persistence"
)

// fakePluginEnv makes the test binary run as an exec-managed CSI plugin:
// a fakeplugin server on $CSI_ENDPOINT (see runFakePlugin).
const fakePluginEnv = "CSIACTOR_TEST_FAKE_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(fakePluginEnv) != "" {
		os.Exit(runFakePlugin())
	}
	if spec := os.Getenv(manySocketsEnv); spec != "" {
		os.Exit(runManySockets(spec))
	}
	os.Exit(m.Run())
}

func runFakePlugin() int {
	path := strings.TrimPrefix(os.Getenv("CSI_ENDPOINT"), "unix://")
	p := fakeplugin.New(fakeplugin.Config{
		Name:              os.Getenv("FAKE_NAME"),
		NodeID:            os.Getenv("FAKE_NODE_ID"),
		ControllerPublish: os.Getenv("FAKE_CONTROLLER") != "",
	})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	if err := p.Serve(path); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	<-sig
	p.Stop()
	return 0
}

func fakeCommand(t testing.TB) []string {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{self, "-test.run=^$"}
}

func execSpec(t testing.TB, id, pluginName string, typ plugin.Type) plugin.Spec {
	env := map[string]string{fakePluginEnv: "1", "FAKE_NAME": "provider." + pluginName, "FAKE_NODE_ID": "node-" + id}
	if typ.Serves(plugin.Controller) {
		env["FAKE_CONTROLLER"] = "1"
	}
	return plugin.Spec{ID: id, Plugin: pluginName, Type: typ, Command: fakeCommand(t), Env: env}
}

func shortDir(t testing.TB) string {
	d, err := os.MkdirTemp("", "reg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// startFake serves a fake plugin; the caller defers Stop after
// leakcheck.Check.
func startFake(t testing.TB, cfg fakeplugin.Config) *fakeplugin.Plugin {
	t.Helper()
	p := fakeplugin.New(cfg)
	if err := p.Serve(fakeplugin.SocketPath(t)); err != nil {
		t.Fatal(err)
	}
	return p
}

func attachedSpec(id, pluginName string, typ plugin.Type, p *fakeplugin.Plugin) plugin.Spec {
	return plugin.Spec{ID: id, Plugin: pluginName, Type: typ, Socket: p.Endpoint()}
}

// env is one agent's worth of registry: a data dir and store that outlive
// restarts of the actor system and registry.
type env struct {
	t     testing.TB
	data  string
	store *persistence.Store
	sys   *actor.ActorSystem
	h     *Handle
	reg   *prometheus.Registry
	hook  *test.Hook
	mod   func(*Config)
}

func newEnv(t testing.TB, mod func(*Config)) *env {
	t.Helper()
	e := &env{t: t, data: shortDir(t), mod: mod}
	st, err := persistence.Open(filepath.Join(e.data, "state.db"), persistence.Config{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	e.store = st
	e.start()
	return e
}

func (e *env) config() Config {
	logger, hook := test.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	e.hook = hook
	e.reg = prometheus.NewRegistry()
	cfg := Config{
		Log:        logrus.NewEntry(logger),
		Store:      e.store,
		DataDir:    e.data,
		Registerer: e.reg,
		Plugin: plugin.Config{
			HeartbeatInterval:  time.Second,
			UnhealthyRetry:     10 * time.Millisecond,
			ProbeTimeout:       2 * time.Second,
			FingerprintTimeout: 5 * time.Second,
			DialTimeout:        500 * time.Millisecond,
			StopGrace:          5 * time.Second,
			// Most tests want a restart to start from nothing; see
			// TestHandle_Restart_AdoptsRunningPlugin for the default.
			StopOnShutdown: true,
			RestartBackoff: actorkit.BackoffConfig{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond, Window: time.Minute},
		},
		Supervisor: actorkit.BackoffConfig{Initial: time.Millisecond, Max: 10 * time.Millisecond},
	}
	if e.mod != nil {
		e.mod(&cfg)
	}
	return cfg
}

// start starts an actor system and a registry on the env's store.
func (e *env) start() {
	e.t.Helper()
	cfg := e.config()
	e.sys = actorkit.NewSystem(cfg.Log)
	h, err := Start(context.Background(), e.sys, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.h = h
}

// stop shuts the registry and the actor system down, keeping the store.
func (e *env) stop() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.h.Shutdown(ctx); err != nil {
		e.t.Errorf("Shutdown: %v", err)
	}
	e.sys.Shutdown()
}

func (e *env) restart() {
	e.t.Helper()
	e.stop()
	e.start()
}

// close stops everything; defer it after leakcheck.Check.
func (e *env) close() {
	e.stop()
	if err := e.store.Close(); err != nil {
		e.t.Errorf("close store: %v", err)
	}
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func (e *env) register(spec plugin.Spec) AllocationInfo {
	e.t.Helper()
	a, err := e.h.Register(ctx(e.t), spec)
	if err != nil {
		e.t.Fatalf("register %s: %v", spec.ID, err)
	}
	return a
}

// waitUntil re-evaluates cond over the allocations after every registry
// event until it holds. The guard only turns a hang into a failure.
func (e *env) waitUntil(what string, cond func(map[string]AllocationInfo) bool) map[string]AllocationInfo {
	e.t.Helper()
	sub, err := e.h.Subscribe(1024)
	if err != nil {
		e.t.Fatal(err)
	}
	defer sub.Cancel()
	guard := time.NewTimer(60 * time.Second)
	defer guard.Stop()
	for {
		all, err := e.h.Allocations(ctx(e.t))
		if err != nil {
			e.t.Fatal(err)
		}
		m := map[string]AllocationInfo{}
		for _, a := range all {
			m[a.ID] = a
		}
		if cond(m) {
			return m
		}
		select {
		case <-sub.C:
		case <-guard.C:
			e.t.Fatalf("timed out waiting for %s; allocations: %+v", what, all)
		}
	}
}

func (e *env) waitHealthy(ids ...string) map[string]AllocationInfo {
	e.t.Helper()
	return e.waitUntil("healthy "+strings.Join(ids, ","), func(m map[string]AllocationInfo) bool {
		for _, id := range ids {
			if !m[id].Healthy {
				return false
			}
		}
		return true
	})
}

func (e *env) active(pluginName string, role plugin.Role) string {
	e.t.Helper()
	tg, err := e.h.Client(ctx(e.t), pluginName, role)
	if err != nil {
		e.t.Fatalf("Client(%s, %s): %v", pluginName, role, err)
	}
	return tg.Alloc
}

// children returns the processes whose parent is this test process, with
// their state ("Z" for a zombie).
func children(t testing.TB) map[int]string {
	t.Helper()
	self := os.Getpid()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(self) {
			out[pid] = f[0]
		}
	}
	return out
}
