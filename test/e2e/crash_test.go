package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/runtime"
)

// crashPoints are the persisted steps of a claim and of a release at which
// crashPoints are the persisted steps of a claim and of a release at which
// TestAgent_SIGKILLAtEveryStep kills the agent: just before a step's record
// is written (the plugin acted, the store does not know), just after (the
// store knows, nothing else happened yet), and in a claim actor just before
// it reports a release step to its volume.
var crashPoints = []struct {
	point   string
	release bool // reached by a release (else by a claim)
}{
	{"persist:reserve", false}, {"persisted:reserve", false},
	{"persist:ControllerPublishVolume", false}, {"persisted:ControllerPublishVolume", false},
	{"persist:NodeStageVolume", false}, {"persisted:NodeStageVolume", false},
	{"persist:NodePublishVolume", false}, {"persisted:NodePublishVolume", false},
	{"persist:release", true}, {"persisted:release", true},
	{"claim-done:NodeUnpublishVolume", true},
	{"persist:NodeUnpublishVolume", true}, {"persisted:NodeUnpublishVolume", true},
	{"claim-done:NodeUnstageVolume", true},
	{"persist:NodeUnstageVolume", true}, {"persisted:NodeUnstageVolume", true},
	{"claim-done:ControllerUnpublishVolume", true},
	{"persist:ControllerUnpublishVolume", true}, {"persisted:ControllerUnpublishVolume", true},
}

// TestAgent_SIGKILLAtEveryStep kills the agent binary itself with SIGKILL
// (through its crash points, built in with the crashpoints tag) at every
// persisted step of a claim and of a release in turn, each on its own
// volume, and starts it again, with each driver. After every restart the
// interrupted claim, retried by its caller, ends published with its mount
// in place and its data writable, and the interrupted release ends freed;
// then the volume is released, and the store, the driver's own record and
// the mount table must agree that nothing is staged, published, attached
// or mounted.
func TestAgent_SIGKILLAtEveryStep(t *testing.T) {
	defer leakcheck.Check(t)()
	forEachDriver(t, func(t *testing.T, d driver) {
		h := newHost(t)
		h.writeConfig(d.allocation(h))
		const alloc = "w"
		claimArgs := func(vol string) []string {
			return []string{"volume", "claim", "-alloc", alloc, "-mode", "write", "-access-mode", "single-node-writer", vol}
		}

		// finish takes the volume the last run was killed on to its end
		// and checks it: a claim is retried (the caller saw its agent die)
		// and must be published and usable; then the volume is released
		// (again, for a release the kill interrupted) and must reach
		// freed, and everything must agree that nothing is left.
		finish := func(vol string, released bool) {
			t.Helper()
			if !released {
				got := strings.TrimSpace(h.ok(claimArgs(vol)...))
				if want := h.target(d, alloc, vol, "rw-file-system-single-node-writer"); got != want {
					t.Errorf("%s: the retried claim printed %q, want %q", vol, got, want)
				}
				if isRoot() && !mountinfo.IsMountPoint(got) {
					t.Errorf("%s: the claim is published but %s is not a mount point", vol, got)
				}
				if err := os.WriteFile(filepath.Join(got, "data"), []byte(vol), 0o644); err != nil {
					t.Errorf("%s: write through the target path: %v", vol, err)
				}
				if c, ok := claimOf(h.volume(vol), alloc); !ok || c.State != runtime.ClaimPublished {
					t.Errorf("%s: claim after the retry: %+v (present %t), want published", vol, c, ok)
				}
				h.checkSettled(d, vol+": after the retried claim")
			}
			// The caller of a release cut off by the kill retries it; one
			// that was answered may repeat it, and hears "not found" once
			// the claim is freed. Either way it must end freed.
			if r := h.cli("volume", "release", "-alloc", alloc, vol); r.code != 0 &&
				!(released && r.code == 1 && strings.Contains(r.stderr, "holds no claim")) {
				t.Errorf("%s: release: %s", vol, r)
			}
			for _, v := range h.checkSettled(d, vol+": after the release") {
				if len(v.Claims) > 0 {
					t.Errorf("%s: after the release: %s", vol, describe(v))
				}
			}
		}

		prev, prevReleased := "", false
		for i, cp := range crashPoints {
			vol := fmt.Sprintf("v%d", i)
			h.agentEnv = []string{"CSIACTOR_CRASH_AT=" + cp.point + "@" + vol}
			a := h.startAgent()
			h.waitPluginHealthy(d)
			if prev != "" {
				finish(prev, prevReleased)
			}
			h.createVolume(d, vol, "single-node-writer")
			if cp.release {
				got := strings.TrimSpace(h.ok(claimArgs(vol)...))
				if err := os.WriteFile(filepath.Join(got, "data"), []byte(vol), 0o644); err != nil {
					t.Errorf("%s: write through the target path: %v", vol, err)
				}
				h.cli("volume", "release", "-alloc", alloc, vol) // answered or cut off by the kill
			} else {
				if r := h.cli(claimArgs(vol)...); r.code == 0 {
					t.Errorf("%s: the claim succeeded although the agent was to be killed at %s: %s", vol, cp.point, r)
				}
			}
			if st := a.wait(shutdownDeadline); st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("%s: agent ended with %s, want killed at %s", vol, st, cp.point)
			}
			a.checkNoRace()
			prev, prevReleased = vol, cp.release
		}
		h.agentEnv = nil
		a := h.startAgent()
		h.waitPluginHealthy(d)
		finish(prev, prevReleased)

		a.stop()
	})
}

// expandCrashPoints are the persisted steps of an expansion.
var expandCrashPoints = []string{
	"persist:expand", "persisted:expand",
	"persist:expand-controller", "persisted:expand-controller",
	"persist:expand-node", "persisted:expand-node",
}

// TestAgent_SIGKILLDuringExpansion kills the agent at every persisted step
// of an expansion of a claimed volume and starts it again: the expansion
// ends done (resumed by the agent, or asked again by its caller), the new
// capacity is stored by the agent and by the plugin, the data written
// before is there, and the volume releases cleanly.
func TestAgent_SIGKILLDuringExpansion(t *testing.T) {
	defer leakcheck.Check(t)()
	h := newHost(t)
	h.writeConfig(h.exampleAllocation(0))
	const alloc, newSize = "w", int64(2) << 30
	finish := func(vol string) {
		t.Helper()
		h.ok("volume", "expand", "-capacity", "2GiB", vol) // done already, waits for it, or starts it
		v := h.volume(vol)
		if v.CapacityBytes != newSize || v.Expansion != nil {
			t.Errorf("%s: after the restart: capacity %d, expansion %+v", vol, v.CapacityBytes, v.Expansion)
		}
		for _, pv := range h.pluginVolumes() {
			if len(pv.Targets) > 0 && pv.CapacityBytes != newSize {
				t.Errorf("%s: the plugin records %d bytes, want %d", vol, pv.CapacityBytes, newSize)
			}
		}
		c, ok := claimOf(v, alloc)
		if b, err := os.ReadFile(filepath.Join(c.TargetPath, "data")); !ok || err != nil || string(b) != vol {
			t.Errorf("%s: data after the expansion = %q, %v (claim present %t)", vol, b, err, ok)
		}
		h.ok("volume", "release", "-alloc", alloc, vol)
		h.eventually(vol+": every claim freed", settleDeadline, func() (bool, string) {
			v := h.volume(vol)
			return len(v.Claims) == 0 && len(v.PastClaims) == 0, describe(v)
		})
		h.checkNothingLeft(vol)
	}
	prev := ""
	for i, point := range expandCrashPoints {
		vol := fmt.Sprintf("x%d", i)
		h.agentEnv = []string{"CSIACTOR_CRASH_AT=" + point + "@" + vol}
		a := h.startAgent()
		h.waitHealthy()
		if prev != "" {
			finish(prev)
		}
		h.ok("volume", "create", "-plugin", "example", "-capacity", "1GiB", "-capability", "single-node-writer", vol)
		got := strings.TrimSpace(h.ok("volume", "claim", "-alloc", alloc, "-mode", "write", "-access-mode", "single-node-writer", vol))
		if err := os.WriteFile(filepath.Join(got, "data"), []byte(vol), 0o644); err != nil {
			t.Errorf("%s: write through the target path: %v", vol, err)
		}
		if r := h.cli("volume", "expand", "-capacity", "2GiB", vol); r.code == 0 {
			t.Errorf("%s: the expansion succeeded although the agent was to be killed at %s: %s", vol, point, r)
		}
		if st := a.wait(shutdownDeadline); st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("%s: agent ended with %s, want killed at %s", vol, st, point)
		}
		a.checkNoRace()
		prev = vol
	}
	h.agentEnv = nil
	a := h.startAgent()
	h.waitHealthy()
	finish(prev)
	a.stop()
}

// pluginVolume is what the example plugin records of one volume in its
// state.json: where the controller published it, where the node staged
// and published it.
type pluginVolume struct {
	CapacityBytes int64                      `json:"capacity_bytes"`
	Published     map[string]json.RawMessage `json:"published"`
	Staged        map[string]json.RawMessage `json:"staged"`
	Targets       map[string]json.RawMessage `json:"targets"`
}

// pluginVolumes reads the example plugin's state.json: its volumes by ID.
func (h *host) pluginVolumes() map[string]pluginVolume {
	h.t.Helper()
	var st struct {
		Volumes map[string]pluginVolume `json:"volumes"`
	}
	b, err := os.ReadFile(filepath.Join(h.stateDir, "state.json"))
	if err != nil {
		h.t.Fatalf("read the example plugin's state: %v", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		h.t.Fatalf("parse the example plugin's state: %v\n%s", err, b)
	}
	return st.Volumes
}

// checkNothingLeft checks that the agent, the plugin and the mount table
// agree that volume vol (with no claims left) is neither staged nor
// published anywhere.
func (h *host) checkNothingLeft(vol string) {
	h.t.Helper()
	v := h.volume(vol)
	if len(v.Claims)+len(v.PastClaims) > 0 {
		h.t.Errorf("%s: claims left: %s", vol, describe(v))
	}
	for _, dir := range []string{
		filepath.Join(h.dataDir, "volumes", "example", "staging", vol),
		filepath.Join(h.dataDir, "volumes", "example", "per-alloc"),
	} {
		for _, m := range mountsUnder(dir) {
			if strings.Contains(m, "/"+vol+"/") || strings.HasSuffix(m, "/"+vol) {
				h.t.Errorf("%s: %s is still mounted", vol, m)
			}
		}
	}
	pv, ok := h.pluginVolumes()[v.ExternalID]
	if !ok {
		h.t.Errorf("%s: the plugin does not know its volume %s", vol, v.ExternalID)
		return
	}
	if len(pv.Published)+len(pv.Staged)+len(pv.Targets) > 0 {
		h.t.Errorf("%s: no claim is left but the plugin still holds it: %+v", vol, pv)
	}
}
