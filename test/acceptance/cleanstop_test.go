package acceptance

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// TestAgent_CleanStop_NoWarnings runs an agent as the sample config sets
// it up (the example plugin exec-managed, with the sample's arguments),
// takes a volume through a claim and a release, and stops the agent with
// SIGTERM: a clean stop logs no warning or error, and the plugin's own log
// lines come out as fields of the agent's lines, not nested inside them.
func TestAgent_CleanStop_NoWarnings(t *testing.T) {
	h := newHost(t)
	// The sample's exec-managed allocation, with this test's binary and a
	// state dir under the test's base directory.
	type allocation struct {
		ID      string   `yaml:"id"`
		Command []string `yaml:"command"`
	}
	var sample struct {
		Allocations []allocation `yaml:"allocations"`
	}
	data, err := os.ReadFile("../../examples/config/csiactor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &sample); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(sample.Allocations, func(a allocation) bool { return a.ID == "example" })
	if i < 0 {
		t.Fatal("the sample config has no allocation \"example\"")
	}
	command := []string{h.bin}
	for _, arg := range sample.Allocations[i].Command[1:] {
		if strings.HasPrefix(arg, "-state-dir=") {
			arg = "-state-dir=" + filepath.Join(h.base, "example-state")
		}
		command = append(command, arg)
	}
	quoted, _ := json.Marshal(command)
	cfg := h.write("agent.yaml", fmt.Sprintf(`data_dir: %s
api: {http_addr: "127.0.0.1:0"}
allocations:
  - {id: example, plugin: example, type: monolith, command: %s}
`, filepath.Join(h.base, "data"), quoted), 0o600)

	a := h.startAgent("-config", cfg)
	waitHealthy(t, a)
	a.ok("volume", "create", "-plugin", "example", "-capacity", "1MiB", "-capability", "single-node-writer", "data1")
	a.ok("volume", "claim", "-alloc", "web1", "-mode", "write", "-access-mode", "single-node-writer", "data1")
	a.ok("volume", "release", "-alloc", "web1", "data1")
	h.eventually("the past claim freed", waitDeadline, func() (bool, string) {
		var v runtime.Volume
		a.okJSON(&v, "volume", "status", "data1")
		return len(v.Claims) == 0 && len(v.PastClaims) == 0, describe(v)
	})

	a.signal(syscall.SIGTERM)
	if code := a.wait(); code != 0 {
		t.Fatalf("agent exit code after SIGTERM: %d\n%s", code, testbin.Tail(a.logs(), 20))
	}
	logs := a.logs()
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "level=warning") || strings.Contains(line, "level=error") || strings.Contains(line, "level=fatal") {
			t.Errorf("a clean stop logged: %s", line)
		}
		if strings.Contains(line, "stream=stderr") && strings.Contains(line, `msg="time=`) {
			t.Errorf("a plugin line nested in the agent's: %s", line)
		}
	}
	if !strings.Contains(logs, "plugin.endpoint=") {
		t.Errorf("the plugin's log lines are not the agent's fields (no plugin.endpoint=):\n%s", testbin.Tail(logs, 20))
	}
	if !strings.Contains(logs, `msg="agent stopped"`) {
		t.Errorf("the agent did not log its stop:\n%s", testbin.Tail(logs, 20))
	}
}
