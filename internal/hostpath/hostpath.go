// Package hostpath runs the kubernetes-csi hostpath driver in tests, and
// compares what the driver keeps in its own bookkeeping (state.json) and
// what the mount table holds with what the agent's claims own.
//
// The driver is not a Go module we can depend on: tests find a build of it
// through $CSIACTOR_HOSTPATH_PLUGIN (CI points it at
// ../shared/bin/hostpathplugin) and skip with a clear message where it is
// unset.
package hostpath

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/persistence"
)

// Env names the environment variable with the driver's path.
const Env = "CSIACTOR_HOSTPATH_PLUGIN"

// PluginName is the name the driver reports in GetPluginInfo.
const PluginName = "hostpath.csi.k8s.io"

// Binary returns the driver's path from $CSIACTOR_HOSTPATH_PLUGIN. It
// skips tb where the variable is unset, and fails it where the variable
// names no executable file (a CI set-up error must not pass as a skip).
func Binary(tb testing.TB) string {
	tb.Helper()
	p := os.Getenv(Env)
	if p == "" {
		tb.Skipf("the hostpath driver is not available: set $%s to a build of it (CI uses ../shared/bin/hostpathplugin)", Env)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		tb.Fatalf("$%s=%q: %v", Env, p, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		tb.Fatalf("$%s=%q: %v", Env, p, err)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		tb.Fatalf("$%s=%q is not an executable file", Env, p)
	}
	return abs
}

// Command is the command of an exec-managed monolith allocation running
// the driver at bin as node nodeID, with its state in stateDir and attach
// enabled (so claims go through ControllerPublishVolume). The agent
// substitutes {endpoint}.
func Command(bin, nodeID, stateDir string) []string {
	return []string{bin, "-endpoint={endpoint}", "-nodeid=" + nodeID, "-statedir=" + stateDir, "-enable-attach", "-v=2"}
}

// State is the driver's state.json: what it believes is staged, published
// and attached.
type State struct {
	Volumes   []Volume   `json:"Volumes"`
	Snapshots []Snapshot `json:"Snapshots"`
}

// Snapshot is one snapshot in State: its ID and its source volume's.
type Snapshot struct {
	ID    string `json:"Id"`
	Name  string `json:"Name"`
	VolID string `json:"VolID"`
}

// Volume is one volume in State.
type Volume struct {
	VolID   string `json:"VolID"`
	VolName string `json:"VolName"`
	NodeID  string `json:"NodeID"`
	// ParentSnapID or ParentVolID is what the volume was created from.
	ParentSnapID string   `json:"ParentSnapID"`
	ParentVolID  string   `json:"ParentVolID"`
	Attached     bool     `json:"Attached"`
	Staged       []string `json:"Staged"`
	Published    []string `json:"Published"`
}

// ReadState reads stateDir/state.json; a driver that has not written it
// yet has an empty state.
func ReadState(stateDir string) (State, error) {
	var s State
	b, err := os.ReadFile(filepath.Join(stateDir, "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("hostpath state.json: %w", err)
	}
	return s, nil
}

// Want is what the agent's claims own on one host: the volumes (by the
// driver's volume ID) attached to it, and the staging and target paths.
type Want struct {
	Attached  map[string]bool
	Staged    map[string]bool
	Published map[string]bool
}

// Add adds what the claims of the volume with the driver's ID externalID
// own: every published claim owns its target path, its staging path (when
// it has one) and, when it needed ControllerPublishVolume, the attachment.
// Claims in any other state own nothing: a settled host has none.
func (w *Want) Add(externalID string, claims []persistence.Claim) {
	if w.Attached == nil {
		w.Attached, w.Staged, w.Published = map[string]bool{}, map[string]bool{}, map[string]bool{}
	}
	for _, c := range claims {
		if c.State != "published" {
			continue
		}
		w.Published[c.TargetPath] = true
		if c.StagingPath != "" {
			w.Staged[c.StagingPath] = true
		}
		if c.ControllerRequired {
			w.Attached[externalID] = true
		}
	}
}

// Diff compares the driver's state in stateDir and the mount points under
// dataDir with w, and describes every difference: an attachment, staging,
// publication or mount that no claim owns, one entry recorded twice, and
// what a claim owns that the driver or the mount table lacks. None means
// they agree.
func Diff(stateDir, dataDir string, w Want) []string {
	s, err := ReadState(stateDir)
	if err != nil {
		return []string{err.Error()}
	}
	return Compare(s, dataDir, w)
}

// Compare is Diff with the driver's state already read (or converted from
// another driver's bookkeeping, such as the example plugin's).
func Compare(s State, dataDir string, w Want) []string {
	mounts, err := mountinfo.Read("", dataDir)
	if err != nil {
		return []string{"mount table: " + err.Error()}
	}
	under, err := mountinfo.Under(realDir(dataDir))
	if err != nil {
		return []string{"mount table: " + err.Error()}
	}
	var out []string
	staged, published := map[string]bool{}, map[string]bool{}
	for _, v := range s.Volumes {
		if v.Attached && !w.Attached[v.VolID] {
			out = append(out, fmt.Sprintf("driver: volume %s (%s) attached, no claim owns it", v.VolName, v.VolID))
		}
		// Each path once, and owned.
		check := func(what string, paths []string, seen, owned map[string]bool) {
			for _, p := range paths {
				if seen[p] {
					out = append(out, fmt.Sprintf("driver: %s %s twice", p, what))
				}
				seen[p] = true
				if !owned[p] {
					out = append(out, fmt.Sprintf("driver: volume %s %s at %s, no claim owns it", v.VolName, what, p))
				}
			}
		}
		check("staged", v.Staged, staged, w.Staged)
		check("published", v.Published, published, w.Published)
	}
	for id := range w.Attached {
		if !slices.ContainsFunc(s.Volumes, func(v Volume) bool { return v.VolID == id && v.Attached }) {
			out = append(out, fmt.Sprintf("driver: volume %s not attached, a claim owns it", id))
		}
	}
	for p := range w.Staged {
		if !staged[p] {
			out = append(out, fmt.Sprintf("driver: %s not staged, a claim owns it", p))
		}
	}
	for p := range w.Published {
		if !published[p] {
			out = append(out, fmt.Sprintf("driver: %s not published, a claim owns it", p))
		}
		if !mounts.Has(p) {
			out = append(out, fmt.Sprintf("mount table: %s not mounted, a claim owns it", p))
		}
	}
	seen := map[string]bool{}
	for _, mp := range under {
		if seen[mp] {
			out = append(out, fmt.Sprintf("mount table: %s mounted twice", mp))
		}
		seen[mp] = true
		if !ownedMount(mp, w) {
			out = append(out, fmt.Sprintf("mount table: %s mounted, no claim owns it", mp))
		}
	}
	sort.Strings(out)
	return out
}

// ownedMount reports whether the mount point mp (a real path, as the
// kernel shows it) is a target or staging path in w.
func ownedMount(mp string, w Want) bool {
	for _, set := range []map[string]bool{w.Published, w.Staged} {
		for p := range set {
			if realDir(p) == mp {
				return true
			}
		}
	}
	return false
}

// realDir is p resolved through symlinks where it exists (the mount table
// shows real paths), else p cleaned.
func realDir(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return filepath.Clean(p)
}
