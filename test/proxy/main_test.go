package proxy_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// examplePluginEnv makes the test binary run as the example CSI plugin,
// with the flags it is given (see testbin.RunExamplePlugin).
const examplePluginEnv = "CSIACTOR_PROXY_TEST_EXAMPLE_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(examplePluginEnv) != "" {
		os.Exit(testbin.RunExamplePlugin(os.Args[1:]))
	}
	leakcheck.VerifyTestMain(m)
}

// waitLimit bounds every wait for something that happens in the
// background; a safety net against a hung test, never a speed assertion.
const waitLimit = 2 * time.Minute

// shortDir returns a new directory under /tmp, removed when t ends: the
// sockets go in it (107-byte limit).
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// env is a started runtime with plugins.proxy on.
type env struct {
	t   testing.TB
	dir string
	rt  *runtime.Runtime
}

func newEnv(t testing.TB) *env {
	t.Helper()
	dir := shortDir(t)
	backoff := runtime.BackoffConfig{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2}
	rt, err := runtime.New(runtime.Config{
		DataDir: filepath.Join(dir, "d"),
		Plugins: runtime.PluginsConfig{
			HeartbeatInterval: 500 * time.Millisecond,
			ProbeTimeout:      500 * time.Millisecond,
			RPCTimeout:        time.Minute,
			KillTimeout:       10 * time.Second,
			RestartBackoff:    backoff,
			StopOnAgentExit:   true,
			Proxy:             true,
		},
		Volumes: runtime.VolumesConfig{Retry: backoff},
		Store:   runtime.StoreConfig{NoSync: true},
		Host:    runtime.HostConfig{SkipMountCheck: true},
	}, runtime.Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return &env{t: t, dir: dir, rt: rt}
}

// exampleSpec is a monolith allocation of the example plugin "example",
// with its state in stateDir (and shared with the other instances given
// the same sharedDir, when not empty).
func (e *env) exampleSpec(stateDir, sharedDir string) runtime.AllocationSpec {
	e.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := []string{exe, "-endpoint", "{endpoint}", "-state-dir", stateDir, "-node-id", "host-1",
		"-mount-mode", "symlink", "-max-volumes-per-node", "4", "-capacity", "107374182400"}
	if sharedDir != "" {
		cmd = append(cmd, "-shared-dir", sharedDir)
	}
	return runtime.AllocationSpec{Plugin: "example", Type: runtime.TypeMonolith, Command: cmd,
		Env: map[string]string{examplePluginEnv: "1"}}
}

// hostpathSpec is a monolith allocation of the hostpath driver, plugin
// "hostpath"; it skips t where the driver is not available.
func (e *env) hostpathSpec() runtime.AllocationSpec {
	bin := hostpath.Binary(e.t)
	return runtime.AllocationSpec{Plugin: "hostpath", Type: runtime.TypeMonolith,
		Command: hostpath.Command(bin, "node1", filepath.Join(e.dir, "hp"))}
}

// register registers the allocation id and waits until its plugin has a
// healthy controller and node.
func (e *env) register(id string, spec runtime.AllocationSpec) {
	e.t.Helper()
	ctx := context.Background()
	if _, err := e.rt.RegisterAllocation(ctx, id, spec); err != nil {
		e.t.Fatal(err)
	}
	e.waitAllocation(id, "healthy", func(a runtime.Allocation) bool { return a.Healthy })
}

// waitAllocation waits until the allocation id is registered and cond
// holds for it; what says what cond waits for.
func (e *env) waitAllocation(id, what string, cond func(runtime.Allocation) bool) {
	e.t.Helper()
	e.waitFor("allocation "+id+" "+what, func() bool {
		as, err := e.rt.Allocations(context.Background())
		if err != nil {
			return false
		}
		i := slices.IndexFunc(as, func(a runtime.Allocation) bool { return a.ID == id })
		return i >= 0 && cond(as[i])
	})
}

func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	for deadline := time.Now().Add(waitLimit); !cond(); {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// proxySocket waits for plugin name's proxy socket in its status and
// returns it.
func (e *env) proxySocket(name string) string {
	e.t.Helper()
	var sock string
	e.waitFor("the proxy socket of "+name, func() bool {
		p, err := e.rt.Plugin(context.Background(), name)
		sock = p.ProxySocket
		return err == nil && sock != ""
	})
	return sock
}

// dial connects to a proxy socket.
func dial(t testing.TB, sock string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// runtimeCall is a PluginCall of method with the JSON request req.
func runtimeCall(method, req string) runtime.PluginCall {
	c := runtime.PluginCall{Method: method}
	if req != "" {
		c.Request = []byte(req)
	}
	return c
}
