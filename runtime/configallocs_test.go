package runtime_test

import (
	"context"
	"testing"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// The config file is authoritative for the allocations it lists: a restart
// with a changed spec replaces the stored allocation (it used to refuse to
// start), an allocation dropped from the config is removed, and one
// registered through the API survives both.
func TestRuntime_Restart_ConfigAllocationsAuthoritative(t *testing.T) {
	ctx := context.Background()
	a, _ := fakeplugin.Start(t, fakeplugin.Config{Name: "csi.a"})
	b, _ := fakeplugin.Start(t, fakeplugin.Config{Name: "csi.b"})
	c, _ := fakeplugin.Start(t, fakeplugin.Config{Name: "csi.c"})

	e := &testEnv{t: t, dataDir: shortDir(t, "csiactor-rt-")}
	e.cfg = testConfig(e.dataDir)
	e.cfg.Allocations = []runtime.AllocationConfig{
		{ID: "cfg-1", AllocationSpec: runtime.AllocationSpec{Plugin: "p", Type: runtime.TypeNode, Socket: a.SocketPath()}},
		{ID: "cfg-2", AllocationSpec: runtime.AllocationSpec{Plugin: "q", Type: runtime.TypeNode, Socket: c.SocketPath()}},
	}
	e.start()
	if _, err := e.rt.RegisterAllocation(ctx, "api-1", runtime.AllocationSpec{Plugin: "r", Type: runtime.TypeNode, Socket: b.SocketPath() + ".unused"}); err != nil {
		t.Fatal(err)
	}
	e.stop()

	// cfg-1 now points at another socket; cfg-2 is gone from the config.
	e.cfg.Allocations = []runtime.AllocationConfig{
		{ID: "cfg-1", AllocationSpec: runtime.AllocationSpec{Plugin: "p", Type: runtime.TypeNode, Socket: b.SocketPath()}},
	}
	e.start()
	allocs, err := e.rt.Allocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]runtime.Allocation{}
	for _, al := range allocs {
		got[al.ID] = al
	}
	if al, ok := got["cfg-1"]; !ok || al.Socket != b.SocketPath() || al.Source != "config" {
		t.Errorf("cfg-1 after restart = %+v, want socket %s from the config", al, b.SocketPath())
	}
	if _, ok := got["cfg-2"]; ok {
		t.Errorf("cfg-2 is still registered after it left the config: %+v", got["cfg-2"])
	}
	if al, ok := got["api-1"]; !ok || al.Source != "api" {
		t.Errorf("api-1 after restart = %+v (present %v), want it kept, source api", al, ok)
	}
	e.waitAllocHealthy("cfg-1")
}
