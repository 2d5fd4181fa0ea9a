package e2e

import (
	"testing"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
)

// fuseDriver is the example plugin in its FUSE mode (see fuseAllocation):
// the same plugin name, allocation and state as exampleDriver.
var fuseDriver = driver{
	plugin: exampleDriver.plugin, alloc: exampleDriver.alloc,
	dir:        exampleDriver.dir,
	allocation: func(h *host) string { return h.fuseAllocation() },
	state:      exampleDriver.state,
}

// TestAgent_FUSEPlugin_ClaimWriteRelease runs the agent with the example
// plugin in its FUSE mode as an exec-managed allocation: claims are
// published through FUSE mounts served by the plugin process, data written
// through a target reaches the volume, and once every claim is released
// nothing is left mounted and the plugin records nothing.
func TestAgent_FUSEPlugin_ClaimWriteRelease(t *testing.T) {
	testbin.RequireFUSE(t)
	defer leakcheck.Check(t)()
	h := newHost(t)
	a := h.startWith(fuseDriver)
	claims := h.claimAll(fuseDriver)
	h.checkPublished("after the claims", claims)
	for _, c := range claims {
		if typ, err := mountinfo.FSType(c.target); err != nil || typ != "fuse.csiplugin" {
			t.Errorf("target %s is mounted as %q (%v), want fuse.csiplugin", c.target, typ, err)
		}
	}
	h.releaseAll(fuseDriver, claims)
	for _, v := range fuseDriver.state(h).Volumes {
		if len(v.Staged)+len(v.Published) > 0 {
			t.Errorf("the plugin still records volume %s: staged %v, published %v", v.VolID, v.Staged, v.Published)
		}
	}
	a.stop()
}
