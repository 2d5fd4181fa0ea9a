package acceptance

import (
	"strings"
	"testing"

	"github.com/csiactor/csiactor/internal/testbin"
)

// TestAgent_Dev_ExitStopsPlugin: plugins outlive an agent, but not an
// `agent -dev`: its exit on Ctrl-C stops the example plugin and its log
// shim.
func TestAgent_Dev_ExitStopsPlugin(t *testing.T) {
	h := newHost(t)
	a := h.startAgent("-dev", "-http-addr", "127.0.0.1:0")
	waitHealthy(t, a)
	dataDir := a.dataDir()
	procs := testbin.ProcessesWith(dataDir) // the plugin and its shim
	if len(procs) != 2 {
		t.Fatalf("processes under the -dev data dir: %v, want the plugin and its log shim", procs)
	}
	a.interrupt() // as Ctrl-C does: to the agent's whole process group
	if code := a.wait(); code != 0 {
		t.Errorf("agent exit code after SIGINT: %d\n%s", code, testbin.Tail(a.logs(), 10))
	}
	// One SIGTERM reaches the plugin, which stops gracefully: the
	// example plugin (the same binary) takes a second one as "exit now".
	logs := a.logs()
	if strings.Contains(logs, "again: exiting without waiting") {
		t.Errorf("the plugin got a second signal at the stop:\n%s", testbin.Tail(logs, 20))
	}
	if !strings.Contains(logs, "exit status 0") {
		t.Errorf("the plugin did not exit 0 at the stop:\n%s", testbin.Tail(logs, 20))
	}
	if left := testbin.ProcessesWith(dataDir); len(left) > 0 {
		t.Errorf("processes %v outlived agent -dev (plugin and shim were %v)", left, procs)
	}
}
