package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/runtime"
)

// ephemeralClaim is the CLI claim of alloc on vol with -ephemeral d.plugin.
func ephemeralClaim(d driver, alloc, vol string) []string {
	return []string{"volume", "claim", "-alloc", alloc, "-mode", "write", "-access-mode", "single-node-writer",
		"-ephemeral", d.plugin, "-ephemeral-capacity", "1MiB", vol}
}

// driverVolume returns the driver's record of the plugin volume ext.
func driverVolume(s hostpath.State, ext string) (hostpath.Volume, bool) {
	for _, v := range s.Volumes {
		if v.VolID == ext {
			return v, true
		}
	}
	return hostpath.Volume{}, false
}

// waitEphemeralGone waits until vol is deregistered and the driver no
// longer has its plugin volume ext.
func (h *host) waitEphemeralGone(d driver, vol, ext string) {
	h.t.Helper()
	h.eventually(vol+" deleted through the controller and deregistered", readyDeadline, func() (bool, string) {
		r := h.cli("volume", "status", vol)
		s := hostpath.State{}
		if d.plugin == hostpath.PluginName {
			// The driver rewrites state.json in place: a read may catch
			// it half written.
			var err error
			if s, err = hostpath.ReadState(d.dir(h)); err != nil {
				return false, err.Error()
			}
		} else {
			s = d.state(h)
		}
		_, still := driverVolume(s, ext)
		return r.code == 1 && strings.Contains(r.stderr, "not found") && !still, fmt.Sprintf("%s; driver still has it: %t", r, still)
	})
}

// TestAgent_EphemeralVolume claims ephemeral volumes through the CLI and
// the HTTP API with each driver: the claim creates the volume through the
// controller and publishes it (the driver records it published at the
// target), listing shows it ephemeral, and the release deletes it from
// the driver and the mount table. Each refusal changes nothing.
func TestAgent_EphemeralVolume(t *testing.T) {
	forEachDriver(t, func(t *testing.T, d driver) {
		h := newHost(t)
		h.startWith(d)
		target := strings.TrimSpace(h.ok(ephemeralClaim(d, "w", "eph1")...))
		if want := h.target(d, "w", "eph1", "rw-file-system-single-node-writer"); target != want {
			t.Fatalf("ephemeral claim printed %q, want %q", target, want)
		}
		if isRoot() && !mountinfo.IsMountPoint(target) {
			t.Errorf("%s is not a mount point", target)
		}
		if err := os.WriteFile(filepath.Join(target, "data"), []byte("x"), 0o644); err != nil {
			t.Errorf("write through the target path: %v", err)
		}
		v := h.volume("eph1")
		if !v.Ephemeral || v.EphemeralPhase != "ready" || !v.Created || v.ExternalID == "" {
			t.Fatalf("volume after the ephemeral claim: %+v", v)
		}
		if dv, ok := driverVolume(d.state(h), v.ExternalID); !ok || !strings.Contains(strings.Join(dv.Published, " "), target) {
			t.Errorf("driver's record of %s: %+v (present %t), want published at %s", v.ExternalID, dv, ok, target)
		}
		if out := h.ok("volume", "list"); !strings.Contains(out, "EPHEMERAL") || !strings.Contains(out, "ready") {
			t.Errorf("volume list does not show the ephemeral volume:\n%s", out)
		}
		if out := h.ok("volume", "status", "eph1"); !strings.Contains(out, "Ephemeral") {
			t.Errorf("volume status does not say ephemeral:\n%s", out)
		}
		// The same claim again is the same claim.
		if got := strings.TrimSpace(h.ok(ephemeralClaim(d, "w", "eph1")...)); got != target {
			t.Errorf("claim again printed %q, want %q", got, target)
		}

		// Refusals.
		h.createVolume(d, "plain", "single-node-writer")
		h.fails(1, `volume "plain" is registered and not ephemeral`, ephemeralClaim(d, "w", "plain")...)
		h.fails(1, "not found", "volume", "claim", "-alloc", "w", "-mode", "write", "-access-mode", "single-node-writer", "nosuch")
		h.fails(1, `volume "eph1" is an ephemeral volume`, "volume", "deregister", "eph1")
		h.fails(1, `volume "eph1" is an ephemeral volume`, "volume", "delete", "eph1")
		h.fails(2, "need -ephemeral PLUGIN", "volume", "claim", "-alloc", "w", "-mode", "write", "-access-mode", "single-node-writer",
			"-ephemeral-capacity", "1MiB", "eph2")
		h.fails(2, "-wait is not available with -ephemeral", append([]string{"volume", "claim", "-wait", "10s"}, ephemeralClaim(d, "w", "eph2")[2:]...)...)
		h.fails(1, `access mode single-node-writer allows one claim`, ephemeralClaim(d, "other", "eph1")...)
		if r := h.cli("volume", "status", "eph2"); r.code != 1 {
			t.Errorf("refused ephemeral claims left a volume eph2: %s", r)
		}
		if p := h.volume("plain"); p.Ephemeral || len(p.Claims) != 0 {
			t.Errorf("plain volume changed by a refused claim: %+v", p)
		}

		// Through the HTTP API: a capability that is not the claim's is
		// a 400 naming the field; then a claim and its release.
		c, err := api.NewClient(h.address())
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		req := runtime.ClaimRequest{Alloc: "api", Mode: "write", AccessMode: "single-node-writer", AttachmentMode: "file-system",
			Ephemeral: &runtime.EphemeralSpec{Plugin: d.plugin, CapacityBytes: 1 << 20,
				Capability: runtime.EphemeralCapability{AccessMode: "multi-node-multi-writer"}}}
		var ae *api.Error
		if _, err := c.Claim(ctx, "eph3", req); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest ||
			!strings.Contains(err.Error(), "ephemeral.capability.access_mode") {
			t.Errorf("API claim with another capability: %v, want 400 naming ephemeral.capability.access_mode", err)
		}
		req.Ephemeral.Capability = runtime.EphemeralCapability{}
		apiClaim, err := c.Claim(ctx, "eph3", req)
		if err != nil || apiClaim.State != runtime.ClaimPublished {
			t.Fatalf("API ephemeral claim: %+v, %v", apiClaim, err)
		}
		plain := req
		plain.Ephemeral = &runtime.EphemeralSpec{Plugin: d.plugin}
		if _, err := c.Claim(ctx, "plain", plain); !errors.As(err, &ae) || ae.Status != http.StatusConflict {
			t.Errorf("API ephemeral claim on a plain volume: %v, want 409", err)
		}
		ext3 := h.volume("eph3").ExternalID
		if _, err := c.Release(ctx, "eph3", "api"); err != nil {
			t.Fatal(err)
		}
		h.waitEphemeralGone(d, "eph3", ext3)

		h.ok("volume", "release", "-alloc", "w", "eph1")
		h.waitEphemeralGone(d, "eph1", v.ExternalID)
		if isRoot() {
			if ms := mountsUnder(h.dataDir); len(ms) > 0 {
				t.Errorf("mounts left after the releases: %v", ms)
			}
		}
		evs := h.events()
		for _, typ := range []string{runtime.EventVolumeCreated, runtime.EventVolumeDeleted} {
			if !hasEvent(evs, typ, "", "eph1") {
				t.Errorf("no %s event for eph1", typ)
			}
		}
		h.checkSettled(d, "after the releases")
	})
}

// TestAgent_EphemeralSIGKILL kills the agent (crash points, SIGKILL) while
// an ephemeral volume is created and while it is deleted, with each
// driver: after the restart, the claim retried by its caller is published,
// and the release ends with the volume deleted from the driver and
// deregistered. Nothing is leaked: no plugin volume without a record.
func TestAgent_EphemeralSIGKILL(t *testing.T) {
	points := []struct {
		point   string
		release bool // killed during the release, not the claim
	}{
		{"persisted:ephemeral-intent", false}, {"persist:ephemeral-created", false}, {"persisted:ephemeral-created", false},
		{"persisted:ephemeral-deleting", true}, {"persist:ephemeral-forget", true},
	}
	forEachDriver(t, func(t *testing.T, d driver) {
		h := newHost(t)
		h.writeConfig(d.allocation(h))
		for i, cp := range points {
			vol := fmt.Sprintf("e%d", i)
			h.agentEnv = []string{"CSIACTOR_CRASH_AT=" + cp.point + "@" + vol}
			a := h.startAgent()
			h.waitPluginHealthy(d)
			ext := ""
			if cp.release {
				h.ok(ephemeralClaim(d, "w", vol)...)
				ext = h.volume(vol).ExternalID
				h.cli("volume", "release", "-alloc", "w", vol) // answered or cut off by the kill
			} else if r := h.cli(ephemeralClaim(d, "w", vol)...); r.code == 0 {
				t.Errorf("%s: the claim succeeded although the agent was to be killed at %s: %s", vol, cp.point, r)
			}
			if st := a.wait(shutdownDeadline); st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("%s: agent ended with %s, want killed at %s", vol, st, cp.point)
			}
			a.checkNoRace()
			h.agentEnv = nil
			a = h.startAgent()
			h.waitPluginHealthy(d)
			if !cp.release {
				target := strings.TrimSpace(h.ok(ephemeralClaim(d, "w", vol)...))
				if isRoot() && !mountinfo.IsMountPoint(target) {
					t.Errorf("%s: the retried claim is published but %s is not a mount point", vol, target)
				}
				ext = h.volume(vol).ExternalID
				h.ok("volume", "release", "-alloc", "w", vol)
			} else if r := h.cli("volume", "release", "-alloc", "w", vol); r.code != 0 &&
				!strings.Contains(r.stderr, "not found") && !strings.Contains(r.stderr, "holds no claim") {
				t.Errorf("%s: release after the restart: %s", vol, r)
			}
			h.waitEphemeralGone(d, vol, ext)
			if s := d.state(h); len(s.Volumes) != 0 {
				t.Errorf("%s: the driver keeps volumes after the release: %+v", vol, s.Volumes)
			}
			a.stop()
		}
	})
}
