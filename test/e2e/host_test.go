package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/cmd/csiactor/cli"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// bootSeam points the agent's boot ID check at a file in the base dir
// that the test writes: a simulated reboot changes it.
func (h *host) bootSeam(id string) {
	h.t.Helper()
	f := filepath.Join(h.base, "boot_id")
	if err := os.WriteFile(f, []byte(id+"\n"), 0o600); err != nil {
		h.t.Fatal(err)
	}
	env := slices.DeleteFunc(h.agentEnv, func(kv string) bool { return strings.HasPrefix(kv, cli.BootIDFileEnv+"=") })
	h.agentEnv = append(env, cli.BootIDFileEnv+"="+f)
}

// exampleAllocationWith is exampleAllocation (no volume limit) with more
// arguments for the example plugin.
func (h *host) exampleAllocationWith(extra ...string) string {
	args := []string{fmt.Sprintf("%q", h.bin), "example-plugin", "-state-dir", fmt.Sprintf("%q", h.stateDir), "-node-id", "e2e-node"}
	for _, a := range extra {
		args = append(args, fmt.Sprintf("%q", a))
	}
	return fmt.Sprintf("  - id: example\n    plugin: example\n    type: monolith\n    command: [%s]\n", strings.Join(args, ", "))
}

// published is a claim the test made and the file it wrote through it.
type published struct{ alloc, vol, target, file, data string }

// claimAll creates data1 and logs on d and claims them (web1 writes data1,
// web2 writes logs and web3 reads it), writing a file through each write
// claim.
func (h *host) claimAll(d driver) []published {
	h.t.Helper()
	h.createVolume(d, "data1", "single-node-writer")
	h.createVolume(d, "logs", "multi-node-multi-writer")
	var out []published
	for _, c := range []struct{ alloc, vol, mode, access, file string }{
		{"web1", "data1", "write", "single-node-writer", "hello.txt"},
		{"web2", "logs", "write", "multi-node-multi-writer", "log.txt"},
		{"web3", "logs", "read", "multi-node-multi-writer", "log.txt"},
	} {
		target := strings.TrimSpace(h.ok("volume", "claim", "-alloc", c.alloc, "-mode", c.mode, "-access-mode", c.access, c.vol))
		data := "written through " + c.vol + "\n"
		if c.mode == "write" {
			if err := os.WriteFile(filepath.Join(target, c.file), []byte(data), 0o644); err != nil {
				h.t.Fatalf("write through %s: %v", target, err)
			}
		}
		out = append(out, published{alloc: c.alloc, vol: c.vol, target: target, file: c.file, data: data})
	}
	return out
}

// checkPublished checks that every claim is published, its target mounted
// (as root; a live link otherwise) and its data visible. Each volume's
// status is read once (one CLI run per volume, not per claim: with 50
// claims on 10 volumes checked 11 times, the runs per claim took most of
// TestAgent_FUSEPluginKilled_MountsHealed's time on a loaded machine).
func (h *host) checkPublished(when string, claims []published) {
	h.t.Helper()
	vols := map[string]runtime.Volume{}
	for _, c := range claims {
		v, ok := vols[c.vol]
		if !ok {
			v = h.volume(c.vol)
			vols[c.vol] = v
		}
		if cl, ok := claimOf(v, c.alloc); !ok || cl.State != runtime.ClaimPublished || cl.Condition != "" {
			h.t.Errorf("%s: claim %s on %s = %+v (present %t); want published", when, c.alloc, c.vol, cl, ok)
		}
		if isRoot() && !mountinfo.IsMountPoint(c.target) {
			h.t.Errorf("%s: %s is not a mount point", when, c.target)
		}
		if b, err := os.ReadFile(filepath.Join(c.target, c.file)); err != nil || string(b) != c.data {
			h.t.Errorf("%s: %s through %s: %q, %v; want %q", when, c.file, c.target, b, err, c.data)
		}
	}
}

// loseEverything does to the host what a reboot does to the data dir: no
// mount left under it (as root), no link at the targets (otherwise).
func (h *host) loseEverything(claims []published) {
	h.t.Helper()
	mounts := mountsUnder(h.dataDir)
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			h.t.Fatalf("unmount %s: %v", m, err)
		}
	}
	for _, c := range claims {
		if fi, err := os.Lstat(c.target); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			if err := os.Remove(c.target); err != nil {
				h.t.Fatal(err)
			}
		}
		if _, err := os.ReadFile(filepath.Join(c.target, c.file)); err == nil {
			h.t.Fatalf("%s is still readable through %s after the simulated reboot", c.file, c.target)
		}
	}
	if m := mountsUnder(h.dataDir); len(m) > 0 {
		h.t.Fatalf("mounts left under the data dir: %v", m)
	}
}

// repairs returns csiactor_claim_repairs_total{plugin,result}.
func repairs(a *agent, d driver, result string) float64 {
	v, _ := value(a.metrics(), "csiactor_claim_repairs_total", map[string]string{"plugin": d.plugin, "result": result})
	return v
}

// releaseAll releases every claim and checks that the host settles with
// nothing left: no claim, nothing the driver records, nothing mounted.
func (h *host) releaseAll(d driver, claims []published) {
	h.t.Helper()
	for _, c := range claims {
		h.ok("volume", "release", "-alloc", c.alloc, c.vol)
	}
	for _, v := range h.checkSettled(d, "after every release") {
		if len(v.Claims) > 0 {
			h.t.Errorf("after every release: %s", describe(v))
		}
	}
	if m := mountsUnder(h.dataDir); len(m) > 0 {
		h.t.Errorf("mounts left under the data dir after every release: %v", m)
	}
}

// stop stops the agent with SIGTERM and checks that it exits cleanly.
func (a *agent) stop() {
	a.h.t.Helper()
	a.signal(syscall.SIGTERM)
	if st := a.wait(shutdownDeadline); st.ExitCode() != 0 {
		a.h.t.Errorf("agent exit after SIGTERM: %s", st)
	}
	a.checkNoRace()
}

// TestAgent_Reboot_RepublishesBeforeReady simulates a reboot, with each
// driver: the agent and its plugin stop, every mount under the data dir
// goes, the boot ID changes. The next agent publishes every claim again
// before GET /v1/ready answers 200: at that moment every target is mounted
// with its data, and the driver records each once. Then every claim
// releases to the end.
func TestAgent_Reboot_RepublishesBeforeReady(t *testing.T) {
	defer leakcheck.Check(t)()
	forEachDriver(t, func(t *testing.T, d driver) {
		h := newHost(t)
		h.bootSeam("boot-before")
		h.writeConfig(d.allocation(h))
		a1 := h.startAgent()
		h.waitPluginHealthy(d)
		claims := h.claimAll(d)
		h.checkPublished("first run", claims)

		a1.stop()
		// A reboot ends every process: the plugin, which outlives the
		// agent, and anything else of this host (its log shim).
		testbin.KillProcessesWith(h.base)
		h.eventually("no process of the host left", settleDeadline, func() (bool, string) {
			left := testbin.ProcessesWith(h.base)
			return len(left) == 0, fmt.Sprint(left)
		})
		h.loseEverything(claims)
		h.bootSeam("boot-after")

		a2 := h.startAgent()
		sawStarting := false
		h.eventually("GET /v1/ready answers 200", readyDeadline, func() (bool, string) {
			body, code, err := httpGet("http://" + a2.httpAddr + "/v1/ready")
			if code == http.StatusServiceUnavailable && strings.Contains(body, `"status":"starting"`) {
				sawStarting = true
			}
			return err == nil && code == http.StatusOK && body == `{"status":"ok"}`+"\n", fmt.Sprintf("%d %s %v", code, body, err)
		})
		// Ready: everything is back, before anything else is waited for.
		h.checkPublished("when /v1/ready first says ok", claims)
		t.Logf("saw /v1/ready starting before ok: %t", sawStarting)
		h.checkSettled(d, "after the reboot")

		evs := h.events()
		for _, c := range claims {
			found := false
			for _, ev := range evs {
				if ev.Type == runtime.EventClaimRepaired && ev.Alloc == c.alloc && ev.Volume == c.vol && strings.Contains(ev.Message, "boot ID changed") {
					found = true
				}
			}
			if !found {
				t.Errorf("no claim-repaired event naming the reboot for %s on %s: %+v", c.alloc, c.vol, evs)
			}
		}
		if n := repairs(a2, d, "success"); n != float64(len(claims)) {
			t.Errorf("csiactor_claim_repairs_total{result=success} = %g, want %d", n, len(claims))
		}
		if out := h.ok("status"); !strings.Contains(out, "Ready    yes") {
			t.Errorf("status after ready:\n%s", out)
		}
		// The same claim again is the same claim, answered without a
		// repair.
		if again := strings.TrimSpace(h.ok("volume", "claim", "-alloc", "web1", "-mode", "write", "-access-mode", "single-node-writer", "data1")); again != claims[0].target {
			t.Errorf("claiming web1 again printed %q, want %q", again, claims[0].target)
		}

		h.releaseAll(d, claims)
		a2.stop()
	})
}

// TestAgent_PluginLosesMounts_ClaimsRepaired kills the plugin after its
// mounts went (the example plugin, started with -lose-mounts-on-start,
// unmounts them as it starts again, as a FUSE plugin's mounts die with
// it; the hostpath driver's are unmounted behind its back first): the
// agent restarts it, and once it is healthy again every claim is
// published again, with its data, and releases to the end.
func TestAgent_PluginLosesMounts_ClaimsRepaired(t *testing.T) {
	defer leakcheck.Check(t)()
	forEachDriver(t, func(t *testing.T, d driver) {
		h := newHost(t)
		h.bootSeam("boot-1")
		cfg := d.allocation(h)
		if d.plugin == exampleDriver.plugin {
			cfg = h.exampleAllocationWith("-lose-mounts-on-start")
		}
		h.writeConfig(cfg)
		a := h.startAgent()
		h.waitPluginHealthy(d)
		claims := h.claimAll(d)
		h.checkPublished("before the plugin restart", claims)

		pids := testbin.ProcessesWith(d.dir(h))
		if len(pids) != 1 {
			t.Fatalf("want one %s process, found %v", d.plugin, pids)
		}
		if d.plugin != exampleDriver.plugin {
			h.unmountTargets(claims)
		}
		if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		h.eventually("a new plugin process", settleDeadline, func() (bool, string) {
			now := testbin.ProcessesWith(d.dir(h))
			return len(now) == 1 && now[0] != pids[0], fmt.Sprint(now)
		})
		h.eventually("every claim repaired", settleDeadline, func() (bool, string) {
			n := repairs(a, d, "success")
			return n >= float64(len(claims)), fmt.Sprintf("%g repairs", n)
		})
		h.checkSettled(d, "after the plugin came back")
		h.checkPublished("after the plugin came back", claims)
		evs := h.events()
		for _, c := range claims {
			if !hasEvent(evs, runtime.EventClaimRepaired, c.alloc, c.vol) {
				t.Errorf("no claim-repaired event for %s on %s: %+v", c.alloc, c.vol, evs)
			}
		}
		if out := h.ok("volume", "status", "data1"); !strings.Contains(out, "published") || strings.Contains(out, "degraded") {
			t.Errorf("volume status after the repair:\n%s", out)
		}

		h.releaseAll(d, claims)
		a.stop()
	})
}

// TestAgent_LostTarget_RepairedClaimReleases unmounts a published claim's
// target behind the agent's back, with each driver; the alloc claims
// again, which publishes it again (a repair), with its data. The driver
// must then record the target once, and the release must run to the end
// and leave the driver nothing.
func TestAgent_LostTarget_RepairedClaimReleases(t *testing.T) {
	defer leakcheck.Check(t)()
	forEachDriver(t, func(t *testing.T, d driver) {
		h := newHost(t)
		a := h.startWith(d)
		claims := h.claimAll(d)
		h.checkSettled(d, "after the claims")

		lost := claims[:1] // web1's target on data1
		h.unmountTargets(lost)
		again := strings.TrimSpace(h.ok("volume", "claim", "-alloc", "web1", "-mode", "write", "-access-mode", "single-node-writer", "data1"))
		if again != lost[0].target {
			t.Errorf("claiming web1 again printed %q, want %q", again, lost[0].target)
		}
		h.checkSettled(d, "after the repair")
		h.checkPublished("after the repair", claims)
		if !hasEvent(h.events(), runtime.EventClaimRepaired, "web1", "data1") {
			t.Errorf("no claim-repaired event for web1 on data1")
		}

		h.releaseAll(d, claims)
		a.stop()
	})
}

// unmountTargets unmounts the claims' target paths behind the agent's
// back (as root; the test needs real mounts).
func (h *host) unmountTargets(claims []published) {
	h.t.Helper()
	if !isRoot() {
		h.t.Skip("losing a mount needs root (the plugins bind-mount only as root)")
	}
	for _, c := range claims {
		if err := syscall.Unmount(c.target, 0); err != nil {
			h.t.Fatalf("unmount %s: %v", c.target, err)
		}
		if mountinfo.IsMountPoint(c.target) {
			h.t.Fatalf("%s is still a mount point", c.target)
		}
	}
}
