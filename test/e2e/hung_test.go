package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

// TestAgent_HealthTimeout_HungPluginRestarted: an exec-managed plugin that
// runs but never answers (Nomad #25293) is killed and restarted after
// plugins.health_timeout; an attached one that never answers is only
// reported, in its health description and an event.
func TestAgent_HealthTimeout_HungPluginRestarted(t *testing.T) {
	defer leakcheck.Check(t)()
	h := newHost(t)
	h.pluginsExtra = "  health_timeout: 2s\n"
	marker := "hung-" + h.base
	h.writeConfig(fmt.Sprintf(`  - id: hung
    plugin: hung
    type: node
    command: [/bin/sh, -c, "echo started; exec sleep 600", %q]
  - id: away
    plugin: away
    type: node
    socket: %s
`, marker, filepath.Join(h.base, "nobody.sock")))
	a := h.startAgent()

	allocs := func() map[string]runtime.Allocation {
		var as []runtime.Allocation
		out := h.ok("alloc", "list", "-json")
		if err := json.Unmarshal([]byte(out), &as); err != nil {
			t.Fatalf("alloc list -json: %v\n%s", err, out)
		}
		m := map[string]runtime.Allocation{}
		for _, x := range as {
			m[x.ID] = x
		}
		return m
	}
	var firstPID int
	h.eventually("the hung plugin runs", readyDeadline, func() (bool, string) {
		m := allocs()
		firstPID = m["hung"].PID
		return firstPID != 0, fmt.Sprintf("%+v", m["hung"])
	})
	h.eventually("the hung plugin is killed and restarted after health_timeout", readyDeadline, func() (bool, string) {
		m := allocs()
		return m["hung"].PID != 0 && m["hung"].PID != firstPID, fmt.Sprintf("%+v", m["hung"])
	})
	h.eventually("an event saying the hung plugin was killed for staying unhealthy", readyDeadline, func() (bool, string) {
		evs := h.events()
		for _, e := range evs {
			if e.Alloc == "hung" && strings.Contains(e.Message, "killed after it was not healthy for 2s") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", evs)
	})
	h.eventually("the attached allocation is reported", readyDeadline, func() (bool, string) {
		d := allocs()["away"].HealthDescription
		return strings.HasPrefix(d, "not healthy for over 2s: "), d
	})
	// Events reach the agent's list after the registry's state changed.
	h.eventually("a health-changed event for the attached allocation", readyDeadline, func() (bool, string) {
		evs := h.events()
		return hasEvent(evs, runtime.EventHealthChanged, "away", ""), fmt.Sprint(evs)
	})
	// Its lines are kept across the restart.
	if r := h.cli("alloc", "logs", "hung"); r.code != 0 || strings.Count(r.stdout, "started\n") < 2 {
		t.Errorf("alloc logs hung: %s; want a 'started' line per start", r)
	}
	a.signal(syscall.SIGTERM)
	a.wait(shutdownDeadline)
	a.checkNoRace()
}
