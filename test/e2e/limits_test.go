package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/runtime"
)

// hostpathWith is the hostpath driver started with extra flags.
func hostpathWith(extra ...string) driver {
	d := hostpathDriver
	d.allocation = func(h *host) string {
		cmd := append(hostpath.Command(hostpath.Binary(h.t), "e2e-node", h.hostpathDir()), extra...)
		for i, a := range cmd {
			cmd[i] = fmt.Sprintf("%q", a)
		}
		return fmt.Sprintf("  - id: hostpath\n    plugin: %s\n    type: monolith\n    command: [%s]\n", hostpath.PluginName, strings.Join(cmd, ", "))
	}
	return d
}

// The hostpath driver with an attach limit of 1 announces it as
// max_volumes_per_node: `plugin status` shows it, a second volume's claim
// through the CLI is refused naming the limit, and the driver's state.json
// shows the second volume neither attached, staged nor published.
func TestHostpath_NodeVolumeLimit(t *testing.T) {
	h := newHost(t)
	d := hostpathWith("-attach-limit=1", "-maxvolumespernode=1")
	h.startWith(d)

	var p runtime.Plugin
	if err := json.Unmarshal([]byte(h.ok("plugin", "status", d.plugin, "-json")), &p); err != nil {
		t.Fatal(err)
	}
	if c := p.Allocations[0].Capabilities; c == nil || c.MaxVolumesPerNode != 1 {
		t.Fatalf("plugin status shows capabilities %+v, want max_volumes_per_node 1", c)
	}
	h.createVolume(d, "lim1", "single-node-writer")
	h.createVolume(d, "lim2", "single-node-writer")
	claim := func(alloc, vol string) []string {
		return []string{"volume", "claim", "-alloc", alloc, "-mode", "write", "-access-mode", "single-node-writer", vol}
	}
	h.ok(claim("a1", "lim1")...)
	h.fails(1, fmt.Sprintf(`plugin %q has 1 volumes in use on this host, its max_volumes_per_node of 1: volume "lim2" cannot be staged here`, d.plugin), claim("a2", "lim2")...)

	lim2 := h.volume("lim2")
	if len(lim2.Claims)+len(lim2.PastClaims) != 0 {
		t.Errorf("lim2 holds claims after the refusal: %s", describe(lim2))
	}
	for _, v := range d.state(h).Volumes {
		if v.VolID == lim2.ExternalID && (v.Attached || len(v.Staged) > 0 || len(v.Published) > 0) {
			t.Errorf("the driver has the refused volume attached/staged/published: %+v", v)
		}
	}
	h.checkSettled(d, "after the refused claim")

	// Released, the slot is free for the other volume.
	h.ok("volume", "release", "-alloc", "a1", "lim1")
	h.eventually("lim1 freed", settleDeadline, func() (bool, string) {
		v := h.volume("lim1")
		return len(v.Claims)+len(v.PastClaims) == 0, describe(v)
	})
	h.ok(claim("a2", "lim2")...)
	h.checkSettled(d, "after claiming the other volume")
	h.ok("volume", "release", "-alloc", "a2", "lim2")
}
