package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/leakcheck"

	"github.com/csiactor/csiactor/internal/testbin"
)

// TestAgent_SecondSignal_ExitsAtOnce stops an agent whose shutdown is
// slow (an exec-managed plugin that ignores SIGTERM, with a ten-minute
// kill_timeout), then interrupts again: the second signal must end the
// agent at once, as operators expect of a daemon stuck in its shutdown.
// What it leaves is safe: the plugin keeps running (the next agent adopts
// it, or replaces it if it does not answer), and the store resumes
// everything on the next start.
func TestAgent_SecondSignal_ExitsAtOnce(t *testing.T) {
	defer leakcheck.Check(t)()
	h := newHost(t)
	h.killTimeout = "10m"
	h.pluginsExtra = "  stop_on_agent_exit: true\n" // a slow shutdown
	marker := "stubborn-" + h.base
	h.writeConfig(fmt.Sprintf(`  - id: stubborn
    plugin: stubborn
    type: monolith
    command: [/bin/sh, -c, "trap '' TERM INT; while :; do sleep 1; done", %q]
`, marker))

	a := h.startAgent()
	h.eventually("the stubborn plugin runs", readyDeadline, func() (bool, string) {
		return len(testbin.ProcessesWith(marker)) > 0, a.logs()
	})

	a.signal(syscall.SIGTERM)
	h.eventually("the agent is stopping its plugins", readyDeadline, func() (bool, string) {
		if a.exited() {
			t.Fatalf("the agent exited before the second signal: %s", a.state)
		}
		return strings.Contains(a.logs(), "stopping plugin allocations"), testbin.Tail(a.logs(), 10)
	})
	a.signal(syscall.SIGINT)

	// Without the second signal the agent would wait for its two-minute
	// runtime shutdown bound; half of that is "at once" on any machine.
	st := a.wait(time.Minute)
	ws := st.Sys().(syscall.WaitStatus)
	if st.Success() {
		t.Errorf("after a second signal the agent exited 0; want a failure code, since its shutdown did not finish")
	}
	if ws.Signaled() && ws.Signal() != syscall.SIGINT {
		t.Errorf("agent ended by %s, want exit or SIGINT", ws.Signal())
	}
	if !strings.Contains(a.logs(), "again") {
		t.Errorf("the agent does not say why it exited early:\n%s", testbin.Tail(a.logs(), 5))
	}
	a.checkNoRace()
	if left := testbin.ProcessesWith(marker); len(left) == 0 {
		t.Errorf("the stubborn plugin did not outlive the agent's early exit")
	}
}
