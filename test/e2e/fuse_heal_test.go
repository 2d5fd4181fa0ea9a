package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/engines"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// claimMany creates vols volumes on d (multi-node-multi-writer) and makes
// perVol write claims on each, writing a file of its own through each
// claim's target.
func (h *host) claimMany(d driver, vols, perVol int) []published {
	h.t.Helper()
	var out []published
	for v := range vols {
		vol := fmt.Sprintf("vol%d", v)
		h.createVolume(d, vol, "multi-node-multi-writer")
		for k := range perVol {
			alloc := fmt.Sprintf("w%d-%d", v, k)
			target := strings.TrimSpace(h.ok("volume", "claim", "-alloc", alloc, "-mode", "write", "-access-mode", "multi-node-multi-writer", vol))
			c := published{alloc: alloc, vol: vol, target: target, file: alloc + ".txt", data: "written by " + alloc + "\n"}
			if err := os.WriteFile(filepath.Join(target, c.file), []byte(c.data), 0o644); err != nil {
				h.t.Fatalf("write through %s: %v", target, err)
			}
			out = append(out, c)
		}
	}
	return out
}

// unreadable returns the claims whose file cannot be read back with its
// data through their target, and the first error seen.
func unreadable(claims []published) (n int, first string) {
	for _, c := range claims {
		b, err := os.ReadFile(filepath.Join(c.target, c.file))
		if err != nil || string(b) != c.data {
			if n == 0 {
				first = fmt.Sprintf("%s: %q, %v", c.target, b, err)
			}
			n++
		}
	}
	return n, first
}

// killPlugin SIGKILLs d's one plugin process and returns its PID.
func (h *host) killPlugin(d driver) int {
	h.t.Helper()
	return h.signalPlugin(d, syscall.SIGKILL)
}

// signalPlugin sends sig to d's one plugin process and returns its PID.
func (h *host) signalPlugin(d driver, sig syscall.Signal) int {
	h.t.Helper()
	pids := testbin.ProcessesWith(d.dir(h))
	if len(pids) != 1 {
		h.t.Fatalf("want one %s process, found %v", d.plugin, pids)
	}
	if err := syscall.Kill(pids[0], sig); err != nil {
		h.t.Fatal(err)
	}
	return pids[0]
}

// waitNewPlugin waits for a plugin process of d other than old.
func (h *host) waitNewPlugin(d driver, old int) {
	h.t.Helper()
	h.eventually("a new plugin process", settleDeadline, func() (bool, string) {
		now := testbin.ProcessesWith(d.dir(h))
		return len(now) == 1 && now[0] != old, fmt.Sprint(now)
	})
}

// waitDead waits until the claims' targets answer ENOTCONN: the plugin's
// FUSE mounts died with it.
func (h *host) waitDead(claims []published) {
	h.t.Helper()
	h.eventually("the FUSE mounts dead", settleDeadline, func() (bool, string) {
		_, err := os.Stat(claims[0].target)
		return errors.Is(err, syscall.ENOTCONN), fmt.Sprint(err)
	})
}

// healTime waits until every claim's data reads back through its target
// and returns how long that took from since.
func (h *host) healTime(claims []published, since time.Time) time.Duration {
	h.t.Helper()
	h.eventually("every target readable with its data", settleDeadline, func() (bool, string) {
		n, first := unreadable(claims)
		return n == 0, fmt.Sprintf("%d unreadable, first %s", n, first)
	})
	return time.Since(since)
}

// eventRecorder keeps every event of the agent from when it was started:
// the agent keeps only its 256 most recent, too few for heals of 50
// claims one after another.
type eventRecorder struct {
	mu   sync.Mutex
	evs  []runtime.Event // guarded by mu
	lost bool            // guarded by mu: the agent dropped some for us
}

// recordEvents follows the agent's events until the test ends, from the
// recent ones on.
func (h *host) recordEvents() *eventRecorder {
	h.t.Helper()
	c, err := api.NewClient(h.address())
	if err != nil {
		h.t.Fatal(err)
	}
	r := &eventRecorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.FollowEvents(ctx, func(ev runtime.Event) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.evs = append(r.evs, ev)
			r.lost = r.lost || ev.Type == runtime.EventsDropped
			return nil
		})
	}()
	h.t.Cleanup(func() { cancel(); <-done })
	h.eventually("the event stream", settleDeadline, func() (bool, string) { return len(r.events()) > 0, "no event yet" })
	return r
}

func (r *eventRecorder) events() []runtime.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

// checkHealEvents checks a mount-broken and a mount-healed event for
// every claim among evs (the agent's recent ones when nil), and returns
// how many of each there were.
func (h *host) checkHealEvents(claims []published, evs []runtime.Event) (broken, healed int) {
	h.t.Helper()
	if evs == nil {
		evs = h.events()
	}
	for _, e := range evs {
		switch e.Type {
		case runtime.EventMountBroken:
			broken++
		case runtime.EventMountHealed:
			healed++
		}
	}
	for _, c := range claims {
		if !hasEvent(evs, runtime.EventMountBroken, c.alloc, c.vol) || !hasEvent(evs, runtime.EventMountHealed, c.alloc, c.vol) {
			h.t.Errorf("claim %s on %s: no mount-broken and mount-healed events", c.alloc, c.vol)
		}
	}
	return broken, healed
}

// healBreakdown splits a heal that began after since by the agent's
// events: from since to the first mount-broken event (the probe found
// the mounts dead), and from there to the last mount-healed one (the
// claims published again).
func healBreakdown(evs []runtime.Event, since time.Time) (detect, repair time.Duration) {
	var first, last time.Time
	for _, e := range evs {
		if e.Time.Before(since) {
			continue
		}
		switch e.Type {
		case runtime.EventMountBroken:
			if first.IsZero() || e.Time.Before(first) {
				first = e.Time
			}
		case runtime.EventMountHealed:
			if e.Time.After(last) {
				last = e.Time
			}
		}
	}
	if first.IsZero() || last.IsZero() {
		return 0, 0
	}
	return first.Sub(since), last.Sub(first)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestAgent_FUSEPluginKilled_MountsHealed: 50 claims on 10 volumes of the
// example plugin in its FUSE mode, each written through its target. The
// plugin is SIGKILLed ten times: each time its mounts die (ENOTCONN, still
// in the mount table), the agent starts it again, finds the mounts dead
// when it is healthy, and publishes every claim again: every target reads
// its data back. The heal times (from the new allocation healthy to every
// target readable) are logged. Then every claim releases to the end with
// nothing left mounted.
func TestAgent_FUSEPluginKilled_MountsHealed(t *testing.T) {
	testbin.RequireFUSE(t)
	defer leakcheck.Check(t)()
	const rounds = 10
	h := newHost(t)
	a := h.startWith(fuseDriver)
	claims := h.claimMany(fuseDriver, 10, 5)
	h.checkPublished("after the claims", claims)
	rec := h.recordEvents()

	var heals []time.Duration
	for round := range rounds {
		killed := time.Now()
		old := h.killPlugin(fuseDriver)
		h.waitDead(claims)
		h.waitNewPlugin(fuseDriver, old)
		h.waitPluginHealthy(fuseDriver)
		seen := time.Now()
		readable := seen.Add(h.healTime(claims, seen))
		evs := rec.events()
		// The heal is timed from the agent's own health-changed event
		// (the CLI sees the allocation healthy a little later).
		healthy := seen
		for _, e := range evs {
			if e.Type == runtime.EventHealthChanged && e.Plugin == fuseDriver.plugin && e.Message == "healthy" && e.Time.After(killed) {
				healthy = e.Time
				break
			}
		}
		heal := readable.Sub(healthy)
		heals = append(heals, heal)
		detect, repair := healBreakdown(evs, killed)
		t.Logf("round %d: every target readable %s after the new allocation became healthy (%s after the CLI saw it healthy, %s after the kill); the agent's events: dead mounts found %s after the kill, the last healed %s later",
			round+1, heal.Round(time.Millisecond), readable.Sub(seen).Round(time.Millisecond), readable.Sub(killed).Round(time.Millisecond),
			detect.Round(time.Millisecond), repair.Round(time.Millisecond))
		h.checkSettled(fuseDriver, fmt.Sprintf("after round %d", round+1))
		h.checkPublished(fmt.Sprintf("after round %d", round+1), claims)
	}
	t.Logf("heal times (new allocation healthy to every target readable) over %d kills of a FUSE plugin with %d claims: median %s, worst %s",
		rounds, len(claims), median(heals).Round(time.Millisecond), slices.Max(heals).Round(time.Millisecond))
	broken, healed := h.checkHealEvents(claims, rec.events())
	t.Logf("events: %d mount-broken, %d mount-healed", broken, healed)
	rec.mu.Lock()
	lost := rec.lost
	rec.mu.Unlock()
	if want := rounds * len(claims); !lost && (broken != want || healed != want) {
		t.Errorf("%d mount-broken and %d mount-healed events, want %d of each (one per claim and kill)", broken, healed, want)
	}
	samples := a.metrics()
	if v, _ := value(samples, "csiactor_mounts_broken_total", map[string]string{"plugin": "example", "cause": "ENOTCONN"}); v < float64(rounds*len(claims)) {
		t.Errorf("csiactor_mounts_broken_total{cause=ENOTCONN} = %g, want at least %d", v, rounds*len(claims))
	}
	if v, ok := value(samples, "csiactor_mounts_broken", map[string]string{"plugin": "example"}); !ok || v != 0 {
		t.Errorf("csiactor_mounts_broken = %g (present %t), want 0 once healed", v, ok)
	}
	h.releaseAll(fuseDriver, claims)
	a.stop()
}

// TestAgent_FUSEPluginKilledWithAgent_MountsHealed: the plugin dies with
// the agent (both SIGKILLed), or while the agent is down (stopped, then the
// plugin killed); the next agent starts a new plugin, finds its mounts dead
// and heals them.
func TestAgent_FUSEPluginKilledWithAgent_MountsHealed(t *testing.T) {
	testbin.RequireFUSE(t)
	defer leakcheck.Check(t)()
	for _, tc := range []struct {
		name string
		down func(h *host, a *agent) int
	}{
		{"agent and plugin SIGKILLed", func(h *host, a *agent) int {
			a.signal(syscall.SIGKILL)
			a.wait(shutdownDeadline)
			return h.killPlugin(fuseDriver)
		}},
		{"plugin killed while the agent is down", func(h *host, a *agent) int {
			a.stop()
			return h.killPlugin(fuseDriver)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			a := h.startWith(fuseDriver)
			claims := h.claimMany(fuseDriver, 2, 3)
			old := tc.down(h, a)
			h.waitDead(claims)
			a = h.startAgent()
			h.waitNewPlugin(fuseDriver, old)
			h.waitPluginHealthy(fuseDriver)
			t.Logf("every target readable %s after the new allocation was seen healthy", h.healTime(claims, time.Now()))
			h.checkSettled(fuseDriver, "after the heal")
			h.checkPublished("after the heal", claims)
			h.checkHealEvents(claims, nil)
			h.releaseAll(fuseDriver, claims)
			a.stop()
		})
	}
}

// TestAgent_FUSEPluginFailsOnDeadMount_AgentUnmounts: the plugin's
// NodeUnpublishVolume and NodeUnstageVolume fail on a dead mount (as many
// FUSE drivers' do); the agent unmounts the dead mounts itself, asks the
// plugin again, and the claims heal; mount-healed says so.
func TestAgent_FUSEPluginFailsOnDeadMount_AgentUnmounts(t *testing.T) {
	testbin.RequireFUSE(t)
	defer leakcheck.Check(t)()
	h := newHost(t)
	d := fuseDriver
	d.allocation = func(h *host) string { return h.fuseAllocation("-fuse-fail-dead-unmount") }
	a := h.startWith(d)
	claims := h.claimMany(d, 2, 2)
	old := h.killPlugin(d)
	h.waitDead(claims)
	h.waitNewPlugin(d, old)
	h.waitPluginHealthy(d)
	t.Logf("every target readable %s after the new allocation was seen healthy", h.healTime(claims, time.Now()))
	h.checkSettled(d, "after the heal")
	h.checkPublished("after the heal", claims)
	h.checkHealEvents(claims, nil)
	agentUnmounted := 0
	for _, e := range h.events() {
		if e.Type == runtime.EventMountHealed && strings.Contains(e.Message, "the agent unmounted it") {
			agentUnmounted++
		}
	}
	if agentUnmounted == 0 {
		t.Errorf("no mount-healed event says the agent unmounted the dead mount itself")
	}
	if !strings.Contains(a.logs(), "the plugin failed on a dead mount; the agent unmounted it") {
		t.Errorf("the agent's log does not say it unmounted a dead mount")
	}
	h.releaseAll(d, claims)
	a.stop()
}

// TestAgent_FUSEPluginStopped_HungMount: the plugin process is SIGSTOPped,
// so every access to its mounts hangs. The agent's periodic probe finds
// them dead without hanging itself (the API answers while the probes
// hang), the plugin's Probe goes unanswered until health_timeout restarts
// it, and the claims heal.
func TestAgent_FUSEPluginStopped_HungMount(t *testing.T) {
	testbin.RequireFUSE(t)
	defer leakcheck.Check(t)()
	h := newHost(t)
	h.pluginsExtra = "  health_timeout: 10s\n"
	h.volumesExtra = "  mount_check_interval: 1s\n"
	h.killTimeout = "1s"
	a := h.startWith(fuseDriver)
	claims := h.claimMany(fuseDriver, 1, 2)
	pid := h.signalPlugin(fuseDriver, syscall.SIGSTOP)
	// The API answers while the probes of the hung mounts wait.
	var slowest time.Duration
	h.eventually("a mount-broken event", settleDeadline, func() (bool, string) {
		start := time.Now()
		r := h.cli("volume", "list", "-json")
		slowest = max(slowest, time.Since(start))
		if r.code != 0 {
			return false, r.String()
		}
		return hasEvent(h.events(), runtime.EventMountBroken, claims[0].alloc, claims[0].vol), r.stdout
	})
	t.Logf("slowest volume list while the plugin's mounts hung: %s", slowest)
	if slowest > commandTimeout/4 {
		t.Errorf("volume list took %s while the mounts hung", slowest)
	}
	h.waitNewPlugin(fuseDriver, pid)
	h.waitPluginHealthy(fuseDriver)
	h.healTime(claims, time.Now())
	h.checkSettled(fuseDriver, "after the heal")
	h.checkPublished("after the heal", claims)
	h.checkHealEvents(claims, nil)
	h.releaseAll(fuseDriver, claims)
	a.stop()
}

// TestDocker_FUSEPluginKilled_Containers: a Docker container holds a volume
// of the FUSE example plugin through the agent's Docker volume plugin when
// the plugin is SIGKILLed. The agent heals the claim on the host; what the
// running container sees after the heal, and what a new container sees,
// are logged and checked: the running container keeps the dead mount it
// bound at its start (Docker binds the target privately), a new container
// gets the healed one. docs/operations.md says so.
func TestDocker_FUSEPluginKilled_Containers(t *testing.T) {
	testbin.RequireFUSE(t)
	var dk *engines.Docker
	h, a, _, name := startDockerHost(t, fuseDriver, func(string) containerEngine {
		dk = engines.StartDocker(t, engines.DockerOptions{})
		return dk
	})
	vol := "dk-fuse"
	// sharing=all: the container started after the heal claims the
	// volume beside the running one.
	dk.MustRun("volume", "create", "-d", name, "-o", "size=1MiB", "-o", "sharing=all", vol)
	dk.MustRun("run", "-d", "--network", "none", "--name", "c1", "-v", vol+":/data", engines.Image, "sh", "-c", "echo kept > /data/f; "+engines.Idle)
	c := h.waitDockerPublished(vol)
	h.eventually("c1's file on the host", settleDeadline, func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(c.TargetPath, "f"))
		return err == nil && string(b) == "kept\n", fmt.Sprintf("%q %v", b, err)
	})
	claims := []published{{alloc: c.Alloc, vol: vol, target: c.TargetPath, file: "f", data: "kept\n"}}

	old := h.killPlugin(fuseDriver)
	h.waitDead(claims)
	h.waitNewPlugin(fuseDriver, old)
	h.waitPluginHealthy(fuseDriver)
	t.Logf("the host's target readable %s after the new allocation was seen healthy", h.healTime(claims, time.Now()))
	h.checkHealEvents(claims, nil)

	running, err := dk.Run("exec", "c1", "cat", "/data/f")
	t.Logf("the running container after the heal: %q, %v", running, err)
	if err == nil || !strings.Contains(running+err.Error(), "not connected") {
		t.Errorf("the running container reads %q (%v) after the heal; want the dead mount it bound (transport endpoint is not connected)", running, err)
	}
	fresh := dk.MustRun("run", "--rm", "--network", "none", "-v", vol+":/data", engines.Image, "cat", "/data/f")
	t.Logf("a new container after the heal: %q", fresh)
	if fresh != "kept\n" {
		t.Errorf("a new container reads %q, want the data through the healed mount", fresh)
	}
	dk.MustRun("rm", "-f", "c1")
	h.waitNoClaims(vol, "after docker rm -f")
	h.checkSettled(fuseDriver, "after docker rm -f")
	a.stop()
}

// TestAgent_FUSEPluginStopped_PeriodicProbeTimesOut: with the plugin
// SIGSTOPped and health_timeout far away, only the periodic probe
// (volumes.mount_check_interval) can find its hung mounts: it does, with
// cause timeout, while the API keeps answering. The plugin is then killed;
// the agent starts it again and the claims heal.
func TestAgent_FUSEPluginStopped_PeriodicProbeTimesOut(t *testing.T) {
	testbin.RequireFUSE(t)
	defer leakcheck.Check(t)()
	h := newHost(t)
	h.pluginsExtra = "  health_timeout: 1h\n"
	h.volumesExtra = "  mount_check_interval: 1s\n"
	a := h.startWith(fuseDriver)
	claims := h.claimMany(fuseDriver, 1, 2)
	pid := h.signalPlugin(fuseDriver, syscall.SIGSTOP)
	var slowest time.Duration
	h.eventually("a mount-broken event with cause timeout", settleDeadline, func() (bool, string) {
		start := time.Now()
		r := h.cli("status")
		slowest = max(slowest, time.Since(start))
		if r.code != 0 {
			return false, r.String()
		}
		for _, e := range h.events() {
			if e.Type == runtime.EventMountBroken && strings.Contains(e.Message, "(timeout)") {
				return true, e.Message
			}
		}
		return false, "no mount-broken event with cause timeout"
	})
	t.Logf("slowest csiactor status while the mounts hung: %s", slowest)
	if slowest > commandTimeout/4 {
		t.Errorf("csiactor status took %s while the mounts hung", slowest)
	}
	if v, _ := value(a.metrics(), "csiactor_mounts_broken_total", map[string]string{"plugin": "example", "cause": "timeout"}); v < 1 {
		t.Errorf("csiactor_mounts_broken_total{cause=timeout} = %g, want at least 1", v)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.waitNewPlugin(fuseDriver, pid)
	h.waitPluginHealthy(fuseDriver)
	h.healTime(claims, time.Now())
	h.checkSettled(fuseDriver, "after the heal")
	h.checkPublished("after the heal", claims)
	h.releaseAll(fuseDriver, claims)
	a.stop()
}

// probes returns csiactor_mount_probes_total of d's plugin with result
// ("" sums every result).
func probes(a *agent, d driver, result string) float64 {
	var n float64
	for _, s := range find(a.metrics(), "csiactor_mount_probes_total", map[string]string{"plugin": d.plugin}) {
		if result == "" || s.labels["result"] == result {
			n += s.value
		}
	}
	return n
}

// TestAgent_HostpathPluginKilled_NothingBroken: the hostpath driver's bind
// mounts survive its process. It is SIGKILLed three times with 9 claims
// published; each time, once the new allocation is healthy and the agent
// has probed every target twice since (the check after the restart and
// the periodic one), every claim is still published with its data, the
// driver's state.json and the mount table agree with the claims, and
// nothing was found broken or repaired.
func TestAgent_HostpathPluginKilled_NothingBroken(t *testing.T) {
	defer leakcheck.Check(t)()
	d := hostpathDriver
	h := newHost(t)
	h.volumesExtra = "  mount_check_interval: 1s\n"
	a := h.startWith(d)
	claims := h.claimMany(d, 3, 3)
	h.checkSettled(d, "after the claims")
	for round := range 3 {
		when := fmt.Sprintf("after kill %d", round+1)
		old := h.killPlugin(d)
		h.waitNewPlugin(d, old)
		h.waitPluginHealthy(d)
		// Checks run one after another: once two whole checks' worth
		// of probes are counted after this, one started after it.
		base := probes(a, d, "")
		h.eventually("two checks' probes after the restart", settleDeadline, func() (bool, string) {
			n := probes(a, d, "")
			return n >= base+float64(2*len(claims)), fmt.Sprintf("%g probes, %g before", n, base)
		})
		h.checkPublished(when, claims)
		h.checkSettled(d, when)
	}
	if n := probes(a, d, "dead") + probes(a, d, "unknown"); n != 0 {
		t.Errorf("csiactor_mount_probes_total{result=dead or unknown} = %g, want 0", n)
	}
	t.Logf("probes of the hostpath driver's mounts: %g alive", probes(a, d, "alive"))
	if n := repairs(a, d, "success") + repairs(a, d, "failure"); n != 0 {
		t.Errorf("csiactor_claim_repairs_total = %g, want 0: nothing was lost", n)
	}
	for _, e := range h.events() {
		if e.Type == runtime.EventMountBroken || e.Type == runtime.EventClaimRepaired {
			t.Errorf("event %s %s: nothing was broken", e.Type, e.Message)
		}
	}
	h.releaseAll(d, claims)
	a.stop()
}
