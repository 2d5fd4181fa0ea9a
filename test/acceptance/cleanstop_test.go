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

	"github.com/csiactor/csiactor/actors/plugin/proc"
	"github.com/csiactor/csiactor/internal/hostpath"
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

	// The plugin wrote its start-up line before it answered; once its log
	// shim has written it to the output file, the stop must forward it,
	// however soon it comes.
	waitOutput(h, a, "example", "serving")
	stop(a)
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

// waitOutput waits until the output file of the exec-managed allocation
// alloc holds text: the plugin wrote it and its log shim passed it on.
func waitOutput(h *host, a *agent, alloc, text string) {
	h.t.Helper()
	path := filepath.Join(a.dataDir(), "plugins", alloc, "output.log")
	h.eventually(fmt.Sprintf("%q in %s", text, path), waitDeadline, func() (bool, string) {
		out := readFile(path)
		return strings.Contains(out, text), out
	})
}

// stop stops the agent with SIGTERM and fails the test unless it exits 0.
func stop(a *agent) {
	a.h.t.Helper()
	a.signal(syscall.SIGTERM)
	if code := a.wait(); code != 0 {
		a.h.t.Fatalf("agent exit code after SIGTERM: %d\n%s", code, testbin.Tail(a.logs(), 20))
	}
}

// TestAgent_CleanStop_HostpathStartupLines runs the kubernetes-csi hostpath
// driver as an exec-managed allocation and stops agents soon after they
// start: the driver's start-up lines, which an operator reads first when
// it fails to start, reach the agents' logs, each exactly once, whether
// the agent that started the driver lived long enough to see them or
// the next one, which takes the driver over, logs them.
func TestAgent_CleanStop_HostpathStartupLines(t *testing.T) {
	bin := hostpath.Binary(t)
	h := newHost(t)
	command, _ := json.Marshal(hostpath.Command(bin, "node1", filepath.Join(h.base, "hostpath-state")))
	cfg := h.write("agent.yaml", fmt.Sprintf(`data_dir: %s
api: {http_addr: "127.0.0.1:0"}
allocations:
  - {id: hostpath, plugin: %s, type: monolith, command: %s}
`, filepath.Join(h.base, "data"), hostpath.PluginName, command), 0o600)
	startup := []string{"Driver: " + hostpath.PluginName, "Listening for connections"}
	count := func(text string, agents ...*agent) (n int) {
		for _, a := range agents {
			n += strings.Count(a.logs(), text)
		}
		return n
	}

	// One agent: the driver wrote its lines before the stop.
	a1 := h.startAgent("-config", cfg)
	waitOutput(h, a1, "hostpath", startup[1])
	stop(a1)
	for _, line := range startup {
		if n := count(line, a1); n != 1 {
			t.Errorf("%q in the log of the agent that stopped after the driver wrote it: %d times, want once\n%s", line, n, testbin.Tail(a1.logs(), 20))
		}
	}

	// The driver ends while no agent runs: the next agent starts a new
	// one and is stopped at once, maybe before the new driver writes
	// anything; the agent after it takes that driver over.
	st, err := proc.ReadState(filepath.Join(a1.dataDir(), "plugins", "hostpath"))
	if err != nil || st.PID == 0 {
		t.Fatalf("the driver left running: %+v, %v", st, err)
	}
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a2 := h.startAgent("-config", cfg)
	stop(a2)
	a3 := h.startAgent("-config", cfg)
	h.eventually("the second driver's start-up lines in its output file", waitDeadline, func() (bool, string) {
		out := readFile(filepath.Join(a3.dataDir(), "plugins", "hostpath", "output.log"))
		return strings.Count(out, startup[1]) == 2, out
	})
	stop(a3)
	for _, line := range startup {
		if n := count(line, a2, a3); n != 1 {
			t.Errorf("%q in the logs of the agents after the driver's restart: %d times, want once\nagent 2:\n%s\nagent 3:\n%s",
				line, n, testbin.Tail(a2.logs(), 20), testbin.Tail(a3.logs(), 20))
		}
	}
}
