package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

// TestAgent_Lifecycle runs a volume's life through the CLI with each
// driver: create, claim (a single-node-writer volume by one writer, a
// multi-node-multi-writer one by a writer and a reader), a SIGKILL of the
// agent and a restart (which repairs nothing: nothing was lost), release
// and delete. After every step that settles,
// the driver's own bookkeeping and the mount table hold exactly what the
// claims own. With plugins.hung_rpc_restart at its strictest (one node RPC
// that times out restarts the plugin), the normal lifecycle restarts
// nothing.
func TestAgent_Lifecycle(t *testing.T) {
	defer leakcheck.Check(t)()
	forEachDriver(t, func(t *testing.T, d driver) {
		h := newHost(t)
		h.pluginsExtra = "  hung_rpc_restart: 1\n"
		a := h.startWith(d)
		claims := h.claimAll(d)
		for i, usage := range []string{"rw-file-system-single-node-writer", "rw-file-system-multi-node-multi-writer", "ro-file-system-multi-node-multi-writer"} {
			if c := claims[i]; c.target != h.target(d, c.alloc, c.vol, usage) {
				t.Errorf("claim %s on %s printed %q, want %q", c.alloc, c.vol, c.target, h.target(d, c.alloc, c.vol, usage))
			}
		}
		if isRoot() {
			if err := os.WriteFile(filepath.Join(claims[2].target, "x"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
				t.Errorf("writing through read claim web3's target: got %v, want EROFS", err)
			}
		}
		h.fails(1, `access mode single-node-writer allows one claim and alloc "web1" holds it`,
			"volume", "claim", "-alloc", "web2", "-mode", "write", "-access-mode", "single-node-writer", "data1")
		h.checkSettled(d, "after the claims")
		h.checkPublished("after the claims", claims)

		a.signal(syscall.SIGKILL)
		if st := a.wait(shutdownDeadline); st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("agent ended with %s, want killed by SIGKILL", st)
		}
		a.checkNoRace()
		a = h.startAgent()
		h.waitPluginHealthy(d)
		h.checkSettled(d, "after the restart")
		h.checkPublished("after the restart", claims)
		// Nothing was lost: nothing is repaired (a staging the driver
		// never mounted is not a lost one).
		for _, ev := range h.events() {
			if ev.Type == runtime.EventClaimRepaired {
				t.Errorf("a claim repaired after a restart that lost nothing: %s %s: %s", ev.Alloc, ev.Volume, ev.Message)
			}
		}

		h.releaseAll(d, claims)
		for _, vol := range []string{"data1", "logs"} {
			h.ok("volume", "delete", vol)
			h.fails(1, "not found", "volume", "status", vol)
		}
		for _, ev := range h.events() {
			if ev.Type == runtime.EventPluginHung {
				t.Errorf("the normal lifecycle found the plugin hung: %s: %s", ev.Alloc, ev.Message)
			}
		}
		if n, ok := value(a.metrics(), "csiactor_plugin_hung_restarts_total", map[string]string{"plugin": d.plugin}); ok && n != 0 {
			t.Errorf("csiactor_plugin_hung_restarts_total = %v after the normal lifecycle, want 0", n)
		}
		if s := d.state(h); len(s.Volumes) > 0 {
			t.Errorf("%s still has volumes after every delete: %+v", d.plugin, s.Volumes)
		}
		a.stop()
	})
}
