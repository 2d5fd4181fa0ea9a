package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/persistence"
	"github.com/csiactor/csiactor/runtime"
)

// TestRuntime_Claim_Lifecycle runs a whole claim through a runtime and a
// fake plugin on a real socket: register an attached monolith allocation,
// register a volume, claim (controller publish, stage, publish), release
// (unpublish, unstage, controller unpublish) until freed, shut down. It
// checks the plugin's own view at each end and that no goroutine is left.
func TestRuntime_Claim_Lifecycle(t *testing.T) {
	defer leakcheck.Check(t)()
	ctx := context.Background()
	e := newEnv(t)
	p := e.attach("mono-1", testPlugin, runtime.TypeMonolith, fullPlugin)

	pl := e.waitHealthy(testPlugin, runtime.TypeMonolith)
	if pl.Provider != fakeplugin.DefaultName || !pl.ControllerRequired || len(pl.Allocations) != 1 || !pl.Allocations[0].Singleton {
		t.Fatalf("plugin = %+v", pl)
	}
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("single-node-writer")); err != nil {
		t.Fatal(err)
	}
	c, err := e.rt.Claim(ctx, "vol-1", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer"))
	if err != nil {
		t.Fatal(err)
	}
	wantTarget := filepath.Join(e.dataDir, "volumes", testPlugin, "per-alloc", "alloc-1", "vol-1", "rw-file-system-single-node-writer")
	if c.State != runtime.ClaimPublished || c.TargetPath != wantTarget || c.Alloc != "alloc-1" || c.Mode != runtime.ModeWrite {
		t.Fatalf("claim = %+v; want published at %s", c, wantTarget)
	}
	if got := p.Published()["ext-1"]; !slices.Equal(got, []string{wantTarget}) {
		t.Errorf("plugin's published targets = %v, want [%s]", got, wantTarget)
	}
	if staging := p.Staged()["ext-1"]; !underDir(staging, filepath.Join(e.dataDir, "volumes", testPlugin, "staging")) {
		t.Errorf("plugin's staging path = %q, want one under the data dir's staging", staging)
	}
	if node := p.ControllerPublished()["ext-1"]; node != fakeplugin.DefaultNodeID {
		t.Errorf("controller-published to %q, want %q", node, fakeplugin.DefaultNodeID)
	}

	r, err := e.rt.Release(ctx, "vol-1", "alloc-1")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != runtime.ClaimTaken || r.TargetPath != wantTarget {
		t.Errorf("release = %+v; want state taken at %s", r, wantTarget)
	}
	v := e.waitFreed("vol-1", "alloc-1")
	if len(v.Claims) != 0 || len(v.PastClaims) != 0 {
		t.Errorf("volume after release = %+v; want no claims", v)
	}
	if len(p.Published()) != 0 || len(p.Staged()) != 0 || len(p.ControllerPublished()) != 0 {
		t.Errorf("plugin still holds the volume: published %v, staged %v, controller %v", p.Published(), p.Staged(), p.ControllerPublished())
	}
	want := []string{"ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume"}
	var got []string
	for _, m := range p.History() {
		if slices.Contains(want, m) {
			got = append(got, m)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("volume RPCs = %v, want %v", got, want)
	}

	e.stop()
	p.Stop()
}

// TestRuntime_Claim_LifecycleBehindNoTimer runs whole lifecycles (claim,
// release, until the claim-freed event) with every interval and backoff of
// the config at an hour: step retries, restarts, heartbeats, health and
// stats polls. None of them may stand between two steps of a lifecycle
// that goes well (a released claim's first NodeUnpublish included), so
// each lifecycle ends long before any of them could fire; one that waited
// for one would not end within the test's safety limit. Each RPC is sent
// once: no step was retried.
func TestRuntime_Claim_LifecycleBehindNoTimer(t *testing.T) {
	defer leakcheck.Check(t)()
	const hour = time.Hour
	e := &testEnv{t: t, dataDir: shortDir(t, "csiactor-rt-")}
	e.cfg = testConfig(e.dataDir)
	e.cfg.Plugins.HeartbeatInterval = hour
	e.cfg.Plugins.HealthTimeout = hour
	e.cfg.Plugins.RestartBackoff = runtime.BackoffConfig{Initial: hour, Max: hour, Multiplier: 2}
	e.cfg.Volumes.Retry = runtime.BackoffConfig{Initial: hour, Max: hour, Multiplier: 2}
	e.cfg.Volumes.StatsInterval = hour
	e.start()
	p := e.attach("mono-1", testPlugin, runtime.TypeMonolith, fullPlugin)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := e.rt.WaitHealthy(ctx, testPlugin, runtime.TypeMonolith); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("single-node-writer")); err != nil {
		t.Fatal(err)
	}
	events, err := e.rt.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const lifecycles = 3
	for i := range lifecycles {
		alloc := fmt.Sprintf("alloc-%d", i)
		if _, err := e.rt.Claim(ctx, "vol-1", claimReq(alloc, runtime.ModeWrite, "single-node-writer")); err != nil {
			t.Fatal(err)
		}
		if _, err := e.rt.Release(ctx, "vol-1", alloc); err != nil {
			t.Fatal(err)
		}
	wait:
		for {
			select {
			case ev := <-events:
				switch {
				case ev.Type == runtime.EventClaimFreed && ev.Alloc == alloc:
					break wait
				case ev.Type == runtime.EventClaimFailed, ev.Type == runtime.EventsDropped:
					t.Fatalf("%s: %s", ev.Type, ev.Message)
				}
			case <-ctx.Done():
				t.Fatalf("claim of %s not freed within %s: a step waits for a timer", alloc, waitLimit)
			}
		}
	}
	counts := map[string]int{}
	for _, m := range p.History() {
		counts[m]++
	}
	for _, m := range []string{"ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume"} {
		if counts[m] != lifecycles {
			t.Errorf("%s sent %d times, want %d (once a lifecycle)", m, counts[m], lifecycles)
		}
	}
	cancel()
	e.stop()
	p.Stop()
}

// TestRuntime_Shutdown_Idempotent checks that Shutdown can be called again
// (and concurrently) and that every call after it fails with ErrShutdown.
func TestRuntime_Shutdown_Idempotent(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.attach("mono-1", testPlugin, runtime.TypeMonolith, fullPlugin)
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("single-node-writer")); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- e.rt.Shutdown(ctx) }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("Shutdown = %v", err)
		}
	}
	if err := e.rt.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown again = %v", err)
	}
	if err := e.rt.Start(ctx); !errors.Is(err, runtime.ErrShutdown) {
		t.Errorf("Start after Shutdown = %v, want ErrShutdown", err)
	}

	calls := []struct {
		name string
		call func() error
	}{
		{"RegisterAllocation", func() error {
			_, err := e.rt.RegisterAllocation(ctx, "mono-2", runtime.AllocationSpec{Plugin: testPlugin, Type: runtime.TypeNode, Socket: "/tmp/x.sock"})
			return err
		}},
		{"DeregisterAllocation", func() error { return e.rt.DeregisterAllocation(ctx, "mono-1") }},
		{"Allocations", func() error { _, err := e.rt.Allocations(ctx); return err }},
		{"Plugins", func() error { _, err := e.rt.Plugins(ctx); return err }},
		{"Plugin", func() error { _, err := e.rt.Plugin(ctx, testPlugin); return err }},
		{"RegisterVolume", func() error { _, err := e.rt.RegisterVolume(ctx, "vol-2", volSpec("single-node-writer")); return err }},
		{"CreateVolume", func() error {
			_, err := e.rt.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "vol-3", VolumeSpec: runtime.VolumeSpec{Plugin: testPlugin,
				Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}})
			return err
		}},
		{"DeleteVolume", func() error { return e.rt.DeleteVolume(ctx, "vol-1", false) }},
		{"Volumes", func() error { _, err := e.rt.Volumes(ctx, runtime.VolumeFilter{}); return err }},
		{"Volume", func() error { _, err := e.rt.Volume(ctx, "vol-1"); return err }},
		{"Claim", func() error {
			_, err := e.rt.Claim(ctx, "vol-1", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer"))
			return err
		}},
		{"Release", func() error { _, err := e.rt.Release(ctx, "vol-1", "alloc-1"); return err }},
		{"Events", func() error { _, err := e.rt.Events(ctx); return err }},
		{"Subscribe", func() error { _, err := e.rt.Subscribe(ctx); return err }},
		{"WaitHealthy", func() error { return e.rt.WaitHealthy(ctx, testPlugin, runtime.TypeNode) }},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, runtime.ErrShutdown) {
			t.Errorf("%s after Shutdown = %v, want ErrShutdown", c.name, err)
		}
	}
}

// TestRuntime_Calls_BeforeStart checks that a runtime that was never
// started refuses calls with ErrShutdown ("not started") and that Shutdown
// of it is harmless.
func TestRuntime_Calls_BeforeStart(t *testing.T) {
	ctx := context.Background()
	rt, err := runtime.New(testConfig(shortDir(t, "csiactor-rt-")), runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Volumes(ctx, runtime.VolumeFilter{}); !errors.Is(err, runtime.ErrShutdown) {
		t.Errorf("Volumes before Start = %v, want ErrShutdown", err)
	}
	if _, err := rt.RegisterAllocation(ctx, "a", runtime.AllocationSpec{Plugin: "p", Type: runtime.TypeNode, Socket: "/tmp/x.sock"}); !errors.Is(err, runtime.ErrShutdown) {
		t.Errorf("RegisterAllocation before Start = %v, want ErrShutdown", err)
	}
	if err := rt.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown of a runtime never started = %v", err)
	}
}

// TestRuntime_Start_DataDirInUse checks that a second runtime on a data dir
// in use fails to start with persistence.ErrInUse, naming the data dir,
// and leaves the first one working.
func TestRuntime_Start_DataDirInUse(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	second, err := runtime.New(e.cfg, runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = second.Start(ctx)
	if !errors.Is(err, persistence.ErrInUse) || !errors.Is(err, runtime.ErrDataDirInUse) {
		t.Fatalf("second Start = %v, want ErrDataDirInUse wrapping persistence.ErrInUse", err)
	}
	if msg := err.Error(); !strings.Contains(msg, e.dataDir) || !strings.Contains(msg, "in use") {
		t.Errorf("error %q does not name the data dir", msg)
	}
	if err := second.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown of the failed runtime = %v", err)
	}
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("single-node-writer")); err != nil {
		t.Errorf("first runtime after the second failed: %v", err)
	}
}

// TestRuntime_Restart_KeepsState restarts the runtime on the same data dir
// and checks that allocations keep their order and singleton (whatever
// order they are registered again in), and volumes and claims are kept:
// the same claim again answers with the same target path, and a release
// after the restart goes to freed.
func TestRuntime_Restart_KeepsState(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	older := e.attach("node-old", testPlugin, runtime.TypeNode, fakeplugin.Config{StageUnstage: true})
	newer := e.attach("node-new", testPlugin, runtime.TypeNode, fakeplugin.Config{StageUnstage: true})
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("single-node-writer")); err != nil {
		t.Fatal(err)
	}
	req := claimReq("alloc-1", runtime.ModeWrite, "single-node-writer")
	first, err := e.rt.Claim(ctx, "vol-1", req)
	if err != nil {
		t.Fatal(err)
	}
	if got := newer.Published()["ext-1"]; len(got) != 1 || len(older.Published()) != 0 {
		t.Fatalf("published on newer %v, older %v; want the newer allocation only", got, older.Published())
	}
	before := allocIDs(t, e.rt)
	e.stop()

	// The old allocation registers again first, as a restart in any order
	// may do; it must not take over.
	e.cfg.Allocations = []runtime.AllocationConfig{{ID: "node-old", AllocationSpec: runtime.AllocationSpec{
		Plugin: testPlugin, Type: runtime.TypeNode, Socket: older.SocketPath()}}}
	e.start()
	e.waitAllocHealthy("node-old")
	e.waitAllocHealthy("node-new")
	if after := allocIDs(t, e.rt); !slices.Equal(after, before) {
		t.Errorf("allocations after restart = %v, before = %v", after, before)
	}
	allocs, err := e.rt.Allocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range allocs {
		if a.Singleton != (a.ID == "node-new") {
			t.Errorf("after restart %s singleton = %t", a.ID, a.Singleton)
		}
	}
	v, err := e.rt.Volume(ctx, "vol-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Claims) != 1 || v.Claims[0].State != runtime.ClaimPublished || v.Claims[0].TargetPath != first.TargetPath {
		t.Fatalf("volume after restart = %+v", v)
	}
	again, err := e.rt.Claim(ctx, "vol-1", req)
	if err != nil {
		t.Fatal(err)
	}
	if again != first {
		t.Errorf("claim again after restart = %+v, want %+v", again, first)
	}
	if _, err := e.rt.Release(ctx, "vol-1", "alloc-1"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("vol-1", "alloc-1")
	if len(newer.Published()) != 0 || len(newer.Staged()) != 0 {
		t.Errorf("plugin still holds the volume: published %v, staged %v", newer.Published(), newer.Staged())
	}
}

func allocIDs(t *testing.T, rt *runtime.Runtime) []string {
	t.Helper()
	allocs, err := rt.Allocations(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, a := range allocs {
		ids = append(ids, a.ID)
	}
	return ids
}

// TestRuntime_Claim_ExamplePlugin runs the lifecycle against the real
// example plugin served in this process: create through its controller,
// claim (the target path becomes the plugin's symlink to the volume's
// directory), write through the target, release until freed, delete.
func TestRuntime_Claim_ExamplePlugin(t *testing.T) {
	defer leakcheck.Check(t)()
	ctx := context.Background()
	dir := shortDir(t, "csiactor-ex-")
	sock, stopPlugin := servePlugin(dir)
	defer stopPlugin()
	e := newEnv(t)
	defer e.stop()
	if _, err := e.rt.RegisterAllocation(ctx, "example-1", runtime.AllocationSpec{Plugin: "example", Type: runtime.TypeMonolith, Socket: sock}); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.WaitHealthy(ctx, "example", runtime.TypeMonolith); err != nil {
		t.Fatal(err)
	}
	v, err := e.rt.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "data-1", CapacityBytes: 1 << 20, VolumeSpec: runtime.VolumeSpec{
		Plugin: "example", Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if v.ExternalID == "" || v.CapacityBytes != 1<<20 {
		t.Fatalf("created volume = %+v", v)
	}
	c, err := e.rt.Claim(ctx, "data-1", claimReq("web-1", runtime.ModeWrite, "single-node-writer"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.TargetPath, "hello"), []byte("hi"), 0o600); err != nil {
		t.Fatalf("write through the published target: %v", err)
	}
	found := false
	_ = filepath.WalkDir(filepath.Join(dir, "plugin-state"), func(p string, d os.DirEntry, err error) error {
		found = found || (err == nil && d.Name() == "hello")
		return nil
	})
	if !found {
		t.Errorf("the file written at the target is not in the plugin's volume directory")
	}
	if _, err := e.rt.Release(ctx, "data-1", "web-1"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("data-1", "web-1")
	if _, err := os.Lstat(c.TargetPath); !os.IsNotExist(err) {
		t.Errorf("target path after release: %v, want it gone", err)
	}
	if err := e.rt.DeleteVolume(ctx, "data-1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.Volume(ctx, "data-1"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("volume after delete: %v, want ErrNotFound", err)
	}
}

// TestRuntime_Start_StoreLost checks that a missing or empty store file
// next to the plugin and volume directories of an earlier agent is refused
// with an error naming the file and what to do, and that nothing is
// created or overwritten; a fresh data dir still starts.
func TestRuntime_Start_StoreLost(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name, state string
		create      bool
	}{{"empty", "empty (0 bytes)", true}, {"missing", "missing", false}} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("single-node-writer")); err != nil {
				t.Fatal(err)
			}
			e.attach("node-1", testPlugin, runtime.TypeNode, fakeplugin.Config{})
			if _, err := e.rt.Claim(ctx, "vol-1", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer")); err != nil {
				t.Fatal(err)
			}
			e.stop()
			store := filepath.Join(e.dataDir, runtime.StoreFileName)
			if err := os.Remove(store); err != nil {
				t.Fatal(err)
			}
			if tt.create {
				if err := os.WriteFile(store, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			rt, err := runtime.New(e.cfg, runtime.Options{})
			if err != nil {
				t.Fatal(err)
			}
			err = rt.Start(ctx)
			if !errors.Is(err, runtime.ErrStoreLost) {
				t.Fatalf("Start on a data dir whose store is %s = %v, want ErrStoreLost", tt.name, err)
			}
			for _, want := range []string{store + " is " + tt.state, filepath.Join(e.dataDir, "volumes"), "restore state.db from a backup"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if err := rt.Shutdown(ctx); err != nil {
				t.Errorf("Shutdown of the refused runtime = %v", err)
			}
			fi, err := os.Stat(store)
			switch {
			case tt.create && (err != nil || fi.Size() != 0):
				t.Errorf("the empty store file was touched: %v, %v", fi, err)
			case !tt.create && !errors.Is(err, os.ErrNotExist):
				t.Errorf("a store file was created: %v", err)
			}
		})
	}
}
