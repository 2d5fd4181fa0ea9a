package e2e

import (
	"os"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/internal/leakcheck"
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
	requireFUSE(t)
	defer leakcheck.Check(t)()
	h := newHost(t)
	a := h.startWith(fuseDriver)
	claims := h.claimAll(fuseDriver)
	h.checkPublished("after the claims", claims)
	for _, c := range claims {
		if typ := mountType(t, c.target); typ != "fuse.csiplugin" {
			t.Errorf("target %s is mounted as %q, want fuse.csiplugin", c.target, typ)
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

// mountType returns the file system type of the top mount at path ("" when
// path is not a mount point), from /proc/self/mountinfo.
func mountType(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatalf("mountinfo: %v", err)
	}
	typ := ""
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		fields, rest := strings.Fields(pre), strings.Fields(post)
		if ok && len(fields) >= 5 && len(rest) >= 1 && fields[4] == path {
			typ = rest[0]
		}
	}
	return typ
}
