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
	"github.com/csiactor/csiactor/runtime"
)

// snapshotCreateCrashPoints and snapshotDeleteCrashPoints are the
// persisted steps of taking and deleting a snapshot.
var (
	snapshotCreateCrashPoints = []string{
		"persist:snapshot-create", "persisted:snapshot-create",
		"persist:snapshot-created", "persisted:snapshot-created",
	}
	snapshotDeleteCrashPoints = []string{
		"persist:snapshot-delete", "persisted:snapshot-delete",
		"persist:snapshot-deleted", "persisted:snapshot-deleted",
	}
)

// pluginSnapshots lists the example plugin's own snapshots through the
// agent (ListSnapshots), by external ID.
func (h *host) pluginSnapshots() map[string]runtime.Snapshot {
	h.t.Helper()
	var list []runtime.Snapshot
	if err := json.Unmarshal([]byte(h.ok("snapshot", "list", "-plugin", "example", "-json")), &list); err != nil {
		h.t.Fatal(err)
	}
	out := map[string]runtime.Snapshot{}
	for _, s := range list {
		if _, dup := out[s.ExternalID]; dup {
			h.t.Errorf("snapshot %s listed twice", s.ExternalID)
		}
		out[s.ExternalID] = s
	}
	return out
}

// TestAgent_SIGKILLDuringSnapshot kills the agent at every persisted step
// of taking a snapshot and of deleting one, and starts it again: each
// snapshot ends taken exactly once (resumed by the agent, or asked again
// by its caller) and restores the data written before it, through real
// mounts when run as root; each delete ends with the snapshot gone from
// the agent and the plugin. Then, with the agent left running, data
// written after a snapshot is in a clone of the volume but not in the
// volume restored from the snapshot.
func TestAgent_SIGKILLDuringSnapshot(t *testing.T) {
	defer leakcheck.Check(t)()
	h := newHost(t)
	h.writeConfig(h.exampleAllocation(0))
	claim := func(vol, alloc string) string {
		t.Helper()
		return strings.TrimSpace(h.ok("volume", "claim", "-alloc", alloc, "-mode", "write", "-access-mode", "single-node-writer", vol))
	}
	release := func(vol, alloc string) {
		t.Helper()
		h.ok("volume", "release", "-alloc", alloc, vol)
		h.eventually(vol+": every claim freed", settleDeadline, func() (bool, string) {
			v := h.volume(vol)
			return len(v.Claims) == 0 && len(v.PastClaims) == 0, describe(v)
		})
		h.checkNothingLeft(vol)
	}
	create := func(vol string) {
		t.Helper()
		h.ok("volume", "create", "-plugin", "example", "-capacity", "1GiB", "-capability", "single-node-writer", vol)
		if err := os.WriteFile(filepath.Join(claim(vol, "w"), "data"), []byte(vol), 0o644); err != nil {
			t.Errorf("%s: write through the target path: %v", vol, err)
		}
	}
	type step struct{ kind, id, vol string }
	finish := func(s step) {
		t.Helper()
		switch s.kind {
		case "create":
			h.ok("snapshot", "create", "-volume", s.vol, s.id) // done already, waits for it, or takes it
			var sn runtime.Snapshot
			if err := json.Unmarshal([]byte(h.ok("snapshot", "status", "-json", s.id)), &sn); err != nil || sn.State != "ready" || sn.ExternalID == "" {
				t.Errorf("%s: after the restart: %+v, %v", s.id, sn, err)
			}
			n := 0
			for _, ps := range h.pluginSnapshots() {
				if ps.SourceVolume == s.vol {
					n++
					if !ps.Registered || ps.ID != s.id {
						t.Errorf("%s: listed as %+v", s.id, ps)
					}
				}
			}
			if n != 1 {
				t.Errorf("%s: the plugin has %d snapshots of %s, want 1", s.id, n, s.vol)
			}
			restored := "r-" + s.id
			h.ok("volume", "create", "-plugin", "example", "-capability", "single-node-writer", "-from-snapshot", s.id, restored)
			if b, err := os.ReadFile(filepath.Join(claim(restored, "r"), "data")); err != nil || string(b) != s.vol {
				t.Errorf("%s: data in the restored volume = %q, %v; want %q", s.id, b, err, s.vol)
			}
			release(restored, "r")
		case "delete":
			if r := h.cli("snapshot", "delete", s.id); r.code != 0 && !strings.Contains(r.stderr, "not found") {
				t.Errorf("%s: delete again: %s", s.id, r)
			}
			h.eventually(s.id+" gone from the agent and the plugin", settleDeadline, func() (bool, string) {
				r := h.cli("snapshot", "status", s.id)
				for _, ps := range h.pluginSnapshots() {
					if ps.SourceVolume == s.vol {
						return false, fmt.Sprintf("the plugin still has %+v", ps)
					}
				}
				return r.code == 1 && strings.Contains(r.stderr, "not found"), r.String()
			})
		}
		release(s.vol, "w")
	}
	var steps []step
	for i, p := range snapshotCreateCrashPoints {
		steps = append(steps, step{"create:" + p, fmt.Sprintf("c%d", i), fmt.Sprintf("cv%d", i)})
	}
	for i, p := range snapshotDeleteCrashPoints {
		steps = append(steps, step{"delete:" + p, fmt.Sprintf("d%d", i), fmt.Sprintf("dv%d", i)})
	}
	var prev *step
	for _, s := range steps {
		kind, point, _ := strings.Cut(s.kind, ":")
		h.agentEnv = []string{"CSIACTOR_CRASH_AT=" + point + "@" + s.id}
		a := h.startAgent()
		h.waitHealthy()
		if prev != nil {
			finish(*prev)
		}
		create(s.vol)
		var r result
		if kind == "create" {
			r = h.cli("snapshot", "create", "-volume", s.vol, s.id)
		} else {
			h.ok("snapshot", "create", "-volume", s.vol, s.id)
			r = h.cli("snapshot", "delete", s.id)
		}
		if r.code == 0 {
			t.Errorf("%s: succeeded although the agent was to be killed at %s: %s", s.id, point, r)
		}
		if st := a.wait(shutdownDeadline); st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("%s: agent ended with %s, want killed at %s", s.id, st, point)
		}
		a.checkNoRace()
		prev = &step{kind, s.id, s.vol}
	}
	h.agentEnv = nil
	a := h.startAgent()
	h.waitHealthy()
	finish(*prev)

	// Data written after the snapshot is in a clone, not in the restore.
	create("src")
	h.ok("snapshot", "create", "-volume", "src", "snap")
	v := h.volume("src")
	c, _ := claimOf(v, "w")
	if err := os.WriteFile(filepath.Join(c.TargetPath, "after"), []byte("after"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.ok("volume", "create", "-plugin", "example", "-capability", "single-node-writer", "-from-snapshot", "snap", "restored")
	h.ok("volume", "create", "-plugin", "example", "-capability", "single-node-writer", "-clone-of", "src", "clone")
	for vol, want := range map[string]map[string]string{
		"restored": {"data": "src", "after": ""},
		"clone":    {"data": "src", "after": "after"},
	} {
		target := claim(vol, "k")
		if isRoot() && len(mountsUnder(target)) == 0 {
			t.Errorf("%s: %s is not a mount point", vol, target)
		}
		for name, data := range want {
			b, err := os.ReadFile(filepath.Join(target, name))
			if data == "" && !os.IsNotExist(err) || data != "" && (err != nil || string(b) != data) {
				t.Errorf("%s: %s = %q, %v; want %q", vol, name, b, err, data)
			}
		}
		release(vol, "k")
	}
	h.fails(1, `snapshot "nope"`, "snapshot", "delete", "nope")
	h.fails(1, `content_source.snapshot: snapshot "nope"`, "volume", "create", "-plugin", "example", "-capability", "single-node-writer", "-from-snapshot", "nope", "bad")
	release("src", "w")
	h.ok("snapshot", "delete", "snap")
	a.stop()
}
