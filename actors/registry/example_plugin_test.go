package registry

import (
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
)

// buildExamplePlugin builds the example CSI plugin into a temporary
// directory and returns the binary's path.
func buildExamplePlugin(t testing.TB) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go toolchain to build the example plugin: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "csiactor-example-plugin")
	out, err := exec.Command(goBin, "build", "-o", bin, "github.com/csiactor/csiactor/examples/csiplugin/cmd/csiactor-example-plugin").CombinedOutput()
	if err != nil {
		t.Fatalf("build the example plugin: %v\n%s", err, out)
	}
	return bin
}

// The real example plugin as an exec-managed monolith: fingerprinted,
// restarted after SIGKILL, stopped on shutdown.
func TestHandle_ExamplePlugin(t *testing.T) {
	defer leakcheck.Check(t)()
	bin := buildExamplePlugin(t)
	e := newEnv(t, func(c *Config) { c.Plugin.HeartbeatInterval = time.Hour })
	state := filepath.Join(e.data, "example-state")
	e.register(plugin.Spec{ID: "ex1", Plugin: "example", Type: plugin.Monolith,
		Command: []string{bin, "-state-dir", state, "-node-id", "host-1", "-endpoint", "{endpoint}"}})
	m := e.waitHealthy("ex1")
	a := m["ex1"]
	if a.Provider != "example.csi.csiactor.dev" || a.NodeID != "host-1" || a.PID == 0 {
		t.Errorf("allocation = %+v, want the example plugin's provider, node host-1 and a PID", a)
	}
	s, err := e.h.Plugin(ctx(t), "example")
	if err != nil || s.ControllersHealthy != 1 || s.NodesHealthy != 1 {
		t.Errorf("Plugin = %+v, %v; want 1/1 controllers and nodes", s, err)
	}

	if err := syscall.Kill(a.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	m = e.waitUntil("restarted", func(m map[string]AllocationInfo) bool {
		return m["ex1"].Healthy && m["ex1"].Exits == 1 && m["ex1"].PID != a.PID
	})
	e.close()
	for _, pid := range []int{a.PID, m["ex1"].PID} {
		if st, ok := children(t)[pid]; ok {
			t.Errorf("plugin process %d left behind (state %s)", pid, st)
		}
	}
}
