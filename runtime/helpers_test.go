package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

// fakePluginEnv makes the test binary run as an exec-managed CSI plugin
// (see runFakePlugin).
const fakePluginEnv = "CSIACTOR_RT_FAKE_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(fakePluginEnv) != "" {
		os.Exit(runFakePlugin())
	}
	if os.Getenv(examplePluginEnv) != "" {
		os.Exit(runExamplePlugin())
	}
	leakcheck.VerifyTestMain(m)
}

// runFakePlugin serves a fake plugin on $CSI_ENDPOINT until SIGTERM,
// saying so on stdout and stderr.
func runFakePlugin() int {
	path := strings.TrimPrefix(os.Getenv("CSI_ENDPOINT"), "unix://")
	p := fakeplugin.New(fullPlugin)
	p.SetHangs(os.Getenv("FAKE_HANG")) // methods (or Method@volume) that hang until the call's deadline
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	if err := p.Serve(path); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("fake plugin serving on", path)
	fmt.Fprintln(os.Stderr, "a line on stderr")
	<-sig
	p.Stop()
	fmt.Println("fake plugin stopped")
	return 0
}

// waitLimit bounds every wait for something that happens in the
// background (a plugin turning healthy, a release reaching freed). It is a
// safety net against a hung test, not a speed assertion.
const waitLimit = 30 * time.Second

// fullPlugin is a fake plugin with every step of a claim: controller
// publish, stage and publish, and create/delete.
var fullPlugin = fakeplugin.Config{ControllerPublish: true, StageUnstage: true, CreateDelete: true}

const testPlugin = "fake"

// shortDir returns a new directory removed when t ends. t.TempDir is not
// used: its name, built from the test name, makes socket paths in it too
// long for the 107-byte unix limit.
func shortDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// testConfig is a configuration for a runtime in dataDir: fast heartbeats
// and retries, store sync off.
func testConfig(dataDir string) runtime.Config {
	return runtime.Config{
		DataDir: dataDir,
		Plugins: runtime.PluginsConfig{
			HeartbeatInterval: 500 * time.Millisecond,
			ProbeTimeout:      500 * time.Millisecond,
			RPCTimeout:        10 * time.Second,
			KillTimeout:       2 * time.Second,
			RestartBackoff:    runtime.BackoffConfig{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2},
		},
		Volumes: runtime.VolumesConfig{Retry: runtime.BackoffConfig{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2}},
		Store:   runtime.StoreConfig{NoSync: true},
		// The fake plugin mounts nothing: the mount table would show
		// every published claim missing. The host tests turn it on.
		Host: runtime.HostConfig{SkipMountCheck: true},
	}
}

// testEnv is a started runtime on a fresh data dir and its registry.
type testEnv struct {
	t       testing.TB
	dataDir string
	cfg     runtime.Config
	reg     *prometheus.Registry
	rt      *runtime.Runtime
}

// newEnv starts a runtime on a fresh data dir; it is shut down when t ends.
func newEnv(t testing.TB) *testEnv {
	t.Helper()
	e := &testEnv{t: t, dataDir: shortDir(t, "csiactor-rt-")}
	e.cfg = testConfig(e.dataDir)
	e.start()
	return e
}

// start starts a new runtime on e's data dir and config, with a new
// registry.
func (e *testEnv) start() {
	e.t.Helper()
	e.reg = prometheus.NewRegistry()
	rt, err := runtime.New(e.cfg, runtime.Options{Registerer: e.reg})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.rt = rt
	e.t.Cleanup(func() { _ = rt.Shutdown(context.Background()) })
}

// stop shuts the runtime down.
func (e *testEnv) stop() {
	e.t.Helper()
	if err := e.rt.Shutdown(context.Background()); err != nil {
		e.t.Fatal(err)
	}
}

// attach serves a fake plugin with cfg and registers it as an attached
// allocation of plugin name of type typ; it waits until it is healthy.
func (e *testEnv) attach(alloc, name, typ string, cfg fakeplugin.Config) *fakeplugin.Plugin {
	e.t.Helper()
	p, endpoint := fakeplugin.Start(e.t, cfg)
	a, err := e.rt.RegisterAllocation(context.Background(), alloc, runtime.AllocationSpec{
		Plugin: name, Type: typ, Socket: endpoint[len("unix://"):],
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if a.ID != alloc || a.Plugin != name || a.Type != typ {
		e.t.Fatalf("RegisterAllocation = %+v", a)
	}
	e.waitAllocHealthy(alloc)
	return p
}

// waitAllocHealthy polls until allocation id is healthy.
func (e *testEnv) waitAllocHealthy(id string) {
	e.t.Helper()
	eventually(e.t, fmt.Sprintf("allocation %s healthy", id), func() (bool, error) {
		allocs, err := e.rt.Allocations(context.Background())
		if err != nil {
			return false, err
		}
		for _, a := range allocs {
			if a.ID == id {
				return a.Healthy, nil
			}
		}
		return false, fmt.Errorf("allocation %s is not registered", id)
	})
}

// waitHealthy polls until plugin name has a healthy allocation of typ.
func (e *testEnv) waitHealthy(name, typ string) runtime.Plugin {
	e.t.Helper()
	var p runtime.Plugin
	eventually(e.t, fmt.Sprintf("plugin %s healthy as %s", name, typ), func() (bool, error) {
		var err error
		p, err = e.rt.Plugin(context.Background(), name)
		if errors.Is(err, runtime.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		switch typ {
		case runtime.TypeController:
			return p.ControllersHealthy > 0, nil
		case runtime.TypeNode:
			return p.NodesHealthy > 0, nil
		}
		return p.ControllersHealthy > 0 && p.NodesHealthy > 0, nil
	})
	return p
}

// waitFreed polls until the volume has no past claim of alloc.
func (e *testEnv) waitFreed(vol, alloc string) runtime.Volume {
	e.t.Helper()
	var v runtime.Volume
	eventually(e.t, fmt.Sprintf("past claim of %s on %s freed", alloc, vol), func() (bool, error) {
		var err error
		v, err = e.rt.Volume(context.Background(), vol)
		if err != nil {
			return false, err
		}
		for _, c := range v.PastClaims {
			if c.Alloc == alloc {
				return false, nil
			}
		}
		return true, nil
	})
	return v
}

// eventually calls cond until it returns true, failing t on its error or
// after waitLimit.
func eventually(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %s", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// volSpec is a registered volume of the test plugin with one capability.
// volSpecFor is volSpec for volume id, with an external ID of its own: one
// plugin volume can be registered under one ID only.
func volSpecFor(id, accessMode string) runtime.VolumeSpec {
	s := volSpec(accessMode)
	s.ExternalID = "ext-" + id
	return s
}

func volSpec(accessMode string) runtime.VolumeSpec {
	return runtime.VolumeSpec{
		Plugin:       testPlugin,
		ExternalID:   "ext-1",
		Capabilities: []runtime.Capability{{AccessMode: accessMode, AttachmentMode: "file-system"}},
	}
}

// claimReq is a file-system claim request.
func claimReq(alloc, mode, accessMode string) runtime.ClaimRequest {
	return runtime.ClaimRequest{Alloc: alloc, Mode: mode, AccessMode: accessMode, AttachmentMode: "file-system"}
}

// underDir reports whether p is inside dir.
func underDir(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && !filepath.IsAbs(rel) && rel[:min(len(rel), 3)] != "../"
}

// toJSON returns v as JSON, as the HTTP API would show it.
func toJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// hostpathEnv starts a runtime that runs the hostpath driver as the
// monolith allocation hp (its state in <dir>/hp, stopped with the
// runtime) and waits for it to be healthy. dir is a new short directory
// that holds the data dir (<dir>/d); setup, when not nil, changes the
// config first. It skips the test without the driver.
func hostpathEnv(t testing.TB, prefix string, setup func(dir string, c *runtime.Config)) (*testEnv, string) {
	t.Helper()
	bin := hostpath.Binary(t)
	dir := shortDir(t, prefix)
	e := &testEnv{t: t, dataDir: filepath.Join(dir, "d")}
	e.cfg = testConfig(e.dataDir)
	e.cfg.Plugins.StopOnAgentExit = true
	e.cfg.Allocations = []runtime.AllocationConfig{{ID: "hp", AllocationSpec: runtime.AllocationSpec{
		Plugin: hostpath.PluginName, Type: runtime.TypeMonolith, Command: hostpath.Command(bin, "node1", filepath.Join(dir, "hp"))}}}
	if setup != nil {
		setup(dir, &e.cfg)
	}
	e.start()
	e.waitHealthy(hostpath.PluginName, runtime.TypeMonolith)
	return e, dir
}
