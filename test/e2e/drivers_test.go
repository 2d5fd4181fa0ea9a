package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/persistence"
	"github.com/csiactor/csiactor/runtime"
)

// driver is a CSI plugin the tests run the agent with, as one exec-managed
// monolith allocation: the example plugin, and the kubernetes-csi hostpath
// driver (the reference driver Kubernetes tests with, which keeps its own
// bookkeeping of what is staged, published and attached).
type driver struct {
	// plugin is the plugin's name in the config, in volume create -plugin
	// and in the host paths; alloc is its allocation's ID.
	plugin, alloc string
	// create is what volume create needs beside -plugin and -capability.
	create []string
	// dir returns the plugin's state dir (named on its command line).
	dir func(h *host) string
	// allocation returns the config entry (a YAML list item).
	allocation func(h *host) string
	// state reads what the plugin records as staged, published and
	// attached, in the hostpath driver's terms.
	state func(h *host) hostpath.State
}

var (
	exampleDriver = driver{
		plugin: "example", alloc: "example",
		dir:        func(h *host) string { return h.stateDir },
		allocation: func(h *host) string { return h.exampleAllocation(0) },
		state:      (*host).exampleState,
	}
	hostpathDriver = driver{
		plugin: hostpath.PluginName, alloc: "hostpath",
		create:     []string{"-capacity", "1MiB"},
		dir:        (*host).hostpathDir,
		allocation: func(h *host) string { return h.hostpathAllocation() },
		state: func(h *host) hostpath.State {
			h.t.Helper()
			s, err := hostpath.ReadState(h.hostpathDir())
			if err != nil {
				h.t.Fatalf("the hostpath driver's state: %v", err)
			}
			return s
		},
	}
	// drivers are the plugins the lifecycle, crash and repair tests run
	// with, each in a subtest named after its allocation.
	drivers = []driver{exampleDriver, hostpathDriver}
)

// hostpathAllocation is the config entry of the hostpath driver's
// allocation, its command line ending with extra.
func (h *host) hostpathAllocation(extra ...string) string {
	cmd := append(hostpath.Command(hostpath.Binary(h.t), "e2e-node", h.hostpathDir()), extra...)
	for i, a := range cmd {
		cmd[i] = fmt.Sprintf("%q", a)
	}
	return fmt.Sprintf("  - id: hostpath\n    plugin: %s\n    type: monolith\n    command: [%s]\n", hostpath.PluginName, strings.Join(cmd, ", "))
}

// forEachDriver runs test in a subtest per driver, each on its own host
// (the hostpath one skips where $CSIACTOR_HOSTPATH_PLUGIN is unset).
func forEachDriver(t *testing.T, test func(t *testing.T, d driver)) {
	for _, d := range drivers {
		t.Run(d.alloc, func(t *testing.T) { test(t, d) })
	}
}

// startWith writes a config with d's allocation alone, starts the agent
// and waits until d is healthy.
func (h *host) startWith(d driver) *agent {
	h.t.Helper()
	h.writeConfig(d.allocation(h))
	a := h.startAgent()
	h.waitPluginHealthy(d)
	return a
}

// hostpathDir is the hostpath driver's state dir: its state.json and the
// volumes' data.
func (h *host) hostpathDir() string { return filepath.Join(h.base, "hostpath") }

// createVolume creates vol on d with one capability (an access mode).
func (h *host) createVolume(d driver, vol, capability string) {
	h.t.Helper()
	h.ok(append(append([]string{"volume", "create", "-plugin", d.plugin}, d.create...), "-capability", capability, vol)...)
}

// target is the target path of alloc's claim on vol with the given usage
// (like rw-file-system-single-node-writer).
func (h *host) target(d driver, alloc, vol, usage string) string {
	return filepath.Join(h.dataDir, "volumes", d.plugin, "per-alloc", alloc, vol, usage)
}

// waitPluginHealthy waits until d's controller and node are healthy, as
// `csiactor plugin status -json` shows.
func (h *host) waitPluginHealthy(d driver) {
	h.t.Helper()
	h.eventually("plugin "+d.plugin+" is healthy", readyDeadline, func() (bool, string) {
		r := h.cli("plugin", "status", d.plugin, "-json")
		if r.code != 0 {
			return false, r.String()
		}
		var p runtime.Plugin
		if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
			return false, err.Error()
		}
		return p.ControllersHealthy == 1 && p.NodesHealthy == 1 && len(p.Allocations) == 1 &&
			p.Allocations[0].Singleton && p.Allocations[0].NodeID == "e2e-node", r.stdout
	})
}

// volumes returns d's volumes as `csiactor volume list -json` shows them.
func (h *host) volumes(d driver) []runtime.Volume {
	h.t.Helper()
	var vs []runtime.Volume
	out := h.ok("volume", "list", "-plugin", d.plugin, "-json")
	if err := json.Unmarshal([]byte(out), &vs); err != nil {
		h.t.Fatalf("volume list -json: %v\n%s", err, out)
	}
	return vs
}

// unsettled describes the claims of vols that are not at an end: a past
// claim not yet freed, a claim not published or under repair. None means
// every claim is published or freed.
func unsettled(vols []runtime.Volume) []string {
	var out []string
	for _, v := range vols {
		bad := len(v.PastClaims) > 0
		for _, c := range v.Claims {
			bad = bad || c.State != runtime.ClaimPublished || c.Condition != ""
		}
		if bad {
			out = append(out, describe(v))
		}
	}
	return out
}

// driverDiff compares what d records and what is mounted under its host
// paths with what the published claims of vols own (hostpath.Compare);
// none means they agree.
func (h *host) driverDiff(d driver, vols []runtime.Volume) []string {
	h.t.Helper()
	st := d.state(h)
	var w hostpath.Want
	for _, v := range vols {
		var cs []persistence.Claim
		for _, c := range v.Claims {
			// Both plugins stage and need ControllerPublishVolume.
			cs = append(cs, persistence.Claim{State: c.State, TargetPath: c.TargetPath, StagingPath: h.staging(d, st, v), ControllerRequired: true})
		}
		w.Add(v.ExternalID, cs)
	}
	return hostpath.Compare(st, filepath.Join(h.dataDir, "volumes", d.plugin), w)
}

// staging is the staging path the claims of v share. The API does not
// show it: it is the one made for the usage of the claim that staged
// first, which may since have been released. So the first one the driver
// records under v's staging directory is it; where it records none, the
// first claim's (which the comparison then names as missing).
func (h *host) staging(d driver, st hostpath.State, v runtime.Volume) string {
	dir := filepath.Join(h.dataDir, "volumes", d.plugin, "staging", v.ID)
	for _, dv := range st.Volumes {
		for _, p := range dv.Staged {
			if dv.VolID == v.ExternalID && filepath.Dir(p) == dir {
				return p
			}
		}
	}
	if len(v.Claims) == 0 {
		return ""
	}
	return filepath.Join(dir, filepath.Base(v.Claims[0].TargetPath))
}

// settle waits until every claim on d's volumes is published or freed,
// failing the test (and going on) when they are not within
// settleDeadline. Then, settled or not, it checks that d's bookkeeping and
// the mount table agree with the published claims and that no
// single-node-writer volume has more than one claim. It returns the
// volumes, and whether they settled.
func (h *host) settle(d driver, when string) ([]runtime.Volume, bool) {
	h.t.Helper()
	var vols []runtime.Volume
	var u []string
	for end := time.Now().Add(settleDeadline); ; time.Sleep(pollInterval) {
		vols = h.volumes(d)
		if u = unsettled(vols); len(u) == 0 {
			break
		}
		if time.Now().After(end) {
			h.t.Errorf("%s: waited %s for every claim on %s to be published or freed; still:\n%s", when, settleDeadline, d.plugin, strings.Join(u, "\n"))
			break
		}
	}
	if diff := h.driverDiff(d, vols); len(diff) > 0 {
		h.t.Errorf("%s: %s and the mount table disagree with the claims:\n  %s", when, d.plugin, strings.Join(diff, "\n  "))
	}
	for _, v := range vols {
		if len(v.Claims) > 1 && slices.ContainsFunc(v.Capabilities, func(c runtime.Capability) bool { return c.AccessMode == "single-node-writer" }) {
			h.t.Errorf("%s: single-node-writer limit exceeded: %s", when, describe(v))
		}
	}
	return vols, len(u) == 0
}

// checkSettled is settle, and stops the test when the claims did not
// settle (nothing after would).
func (h *host) checkSettled(d driver, when string) []runtime.Volume {
	h.t.Helper()
	vols, ok := h.settle(d, when)
	if !ok {
		h.t.FailNow()
	}
	return vols
}

// exampleState reads the example plugin's state.json in the hostpath
// driver's terms: attached when the controller published it anywhere.
func (h *host) exampleState() hostpath.State {
	h.t.Helper()
	var s hostpath.State
	for id, pv := range h.pluginVolumes() {
		v := hostpath.Volume{VolID: id, VolName: id, Attached: len(pv.Published) > 0}
		for p := range pv.Staged {
			v.Staged = append(v.Staged, p)
		}
		for p := range pv.Targets {
			v.Published = append(v.Published, p)
		}
		s.Volumes = append(s.Volumes, v)
	}
	return s
}
