package plugin

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
)

// TestActor_Exec_Stop_OneSIGTERM stops an exec-managed plugin that records
// every stop signal it receives, each way the agent stops one: it must
// get exactly one SIGTERM (many plugins take a second one as "exit now")
// and exit 0 after its graceful stop, not be killed.
func TestActor_Exec_Stop_OneSIGTERM(t *testing.T) {
	tests := []struct {
		name string
		// stop stops the allocation's plugin; h runs it, or adopts it.
		stop func(t *testing.T, h *harness, spec Spec, mod func(*Config)) *harness
	}{
		{"deregistration", func(t *testing.T, h *harness, _ Spec, _ func(*Config)) *harness {
			h.shutdown(ReasonDeregistered)
			return h
		}},
		{"agent exit with stop_on_agent_exit", func(t *testing.T, h *harness, _ Spec, _ func(*Config)) *harness {
			h.shutdown(ReasonShutdown)
			return h
		}},
		{"deregistration of an adopted process", func(t *testing.T, h *harness, spec Spec, mod func(*Config)) *harness {
			first := h.last
			st := h.shutdown(ReasonShutdown) // without StopOnShutdown: left running
			h.close()
			if !alive(first.PID) {
				t.Fatal("the plugin process did not outlive the shutdown")
			}
			h2 := newHarness(t, spec, StaleProcess{PID: st.Status.PID, PIDStart: st.Status.PIDStart}, mod)
			if again := h2.waitHealthy(); again.PID != first.PID {
				t.Fatalf("PID %d after the restart, want %d adopted", again.PID, first.PID)
			}
			h2.shutdown(ReasonDeregistered)
			return h2
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer leakcheck.Check(t)()
			dir := shortDir(t)
			signals := filepath.Join(dir, "signals")
			env := fakeEnv("sig")
			env["FAKE_SIGNAL_LOG"] = signals
			spec, err := Spec{ID: "s1", Plugin: "fake", Type: Node, Command: fakeCommand(t), Env: env}.WithSocket(dir)
			if err != nil {
				t.Fatal(err)
			}
			mod := func(c *Config) { c.StopOnShutdown = tt.name == "agent exit with stop_on_agent_exit" }
			h := newHarness(t, spec, StaleProcess{}, mod)
			pid := h.waitHealthy().PID
			h = tt.stop(t, h, spec, mod)
			h.close()
			if alive(pid) {
				t.Fatalf("plugin process %d survived the stop", pid)
			}
			got, err := fakeplugin.ReadSignals(signals)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, []string{"SIGTERM"}) {
				t.Errorf("the plugin received %q, want exactly one SIGTERM", got)
			}
			var status any
			for _, e := range h.hook.AllEntries() {
				if e.Message == "plugin process stopped" {
					status = e.Data["status"]
				}
			}
			// An adopted process's status is known only to its parent.
			want := "exit status 0"
			if tt.name == "deregistration of an adopted process" {
				want = "unknown status (adopted process)"
			}
			if status != want {
				t.Errorf("the plugin process stopped with %v, want %q (a graceful stop, not SIGKILL)", status, want)
			}
		})
	}
}
