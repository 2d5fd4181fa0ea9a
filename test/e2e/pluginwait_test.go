package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// The plugin-crash run's size.
const (
	waitKills    = 8
	waitWorkers  = 4
	waitVolumes  = 4
	waitDeadline = time.Minute // each claim's and release's; far longer than a restart
)

// TestAgent_ClaimsWaitOutPluginRestart SIGKILLs the exec-managed plugin
// waitKills times while waitWorkers workers claim and release volumes
// through the API, each request with a deadline far longer than the
// restart. Every claim must be published and no request answered 503:
// those that find the plugin restarting wait for it (volumes.plugin_wait).
// With plugin_wait 0s, the same run reports how many claims were 503s (the
// behaviour before the wait), which it only logs; a release is never a
// 503 (it answers once the past claim is recorded). After the run, every
// claim is released and the driver's state and the mount table must hold
// nothing.
func TestAgent_ClaimsWaitOutPluginRestart(t *testing.T) {
	defer leakcheck.Check(t)()
	forEachDriver(t, func(t *testing.T, d driver) {
		for _, wait := range []string{"30s", "0s"} {
			t.Run("plugin_wait="+wait, func(t *testing.T) {
				claims, releases := crashRun(t, d, wait)
				t.Logf("%s, plugin_wait %s: %d of %d claims and %d of %d releases answered 503 over %d plugin SIGKILLs",
					d.alloc, wait, claims.unavailable.Load(), claims.sent.Load(), releases.unavailable.Load(), releases.sent.Load(), waitKills)
				if n := claims.unavailable.Load(); wait != "0s" && n > 0 {
					t.Errorf("%d of %d claims answered 503 though their deadline outlasts every restart", n, claims.sent.Load())
				}
				if n := releases.unavailable.Load(); n > 0 {
					t.Errorf("%d of %d releases answered 503", n, releases.sent.Load())
				}
			})
		}
	})
}

// requestCount counts the requests of one kind that a crash run sent, and
// their 503 answers.
type requestCount struct{ sent, unavailable atomic.Int64 }

// crashRun is one run of TestAgent_ClaimsWaitOutPluginRestart; it returns
// the counts of its claims and its releases.
func crashRun(t *testing.T, d driver, wait string) (claims, releases *requestCount) {
	claims, releases = &requestCount{}, &requestCount{}
	h := newHost(t)
	h.volumesExtra = "  plugin_wait: " + wait + "\n"
	a := h.startWith(d)
	defer a.stop()
	var vols []string
	for i := range waitVolumes {
		v := fmt.Sprintf("%s-%d", d.alloc, i)
		h.createVolume(d, v, "multi-node-multi-writer")
		vols = append(vols, v)
	}
	c, err := api.NewClient(h.address())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var published atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var errs []string
	fail := func(format string, args ...any) {
		errMu.Lock()
		defer errMu.Unlock()
		if len(errs) < 10 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	// call sends one request and counts it and its 503 in n; it says
	// whether it succeeded.
	call := func(n *requestCount, what string, fn func(ctx context.Context) error) bool {
		ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
		defer cancel()
		n.sent.Add(1)
		err := fn(ctx)
		var ae *api.Error
		switch {
		case err == nil:
			return true
		case errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable:
			n.unavailable.Add(1)
			if wait != "0s" || n == releases {
				fail("%s: %v", what, err)
			}
			// A caller's pause before it tries again (not a wait for a
			// condition): the count stays one of requests, not of spins.
			time.Sleep(100 * time.Millisecond)
		default:
			fail("%s: %v", what, err)
		}
		return false
	}
	for w := range waitWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				vol, alloc := vols[(w+n)%len(vols)], fmt.Sprintf("w%d-%d", w, n)
				req := runtime.ClaimRequest{Alloc: alloc, Mode: "write", AccessMode: "multi-node-multi-writer", AttachmentMode: "file-system"}
				var cl runtime.Claim
				if !call(claims, "claim "+alloc, func(ctx context.Context) (err error) { cl, err = c.Claim(ctx, vol, req); return err }) {
					continue
				}
				if cl.State != runtime.ClaimPublished {
					fail("claim %s on %s answered in state %s", alloc, vol, cl.State)
				}
				published.Add(1)
				// Released while the claim is answered: the release of a
				// restarting plugin's claim must not be a 503 either.
				call(releases, "release "+alloc, func(ctx context.Context) error { _, err := c.Release(ctx, vol, alloc); return err })
			}
		}()
	}
	// The plugin-wait events, counted as they come (the recent events
	// the agent keeps are too few for a whole run).
	var waits atomic.Int64
	fctx, stopFollow := context.WithCancel(context.Background())
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		_ = c.FollowEvents(fctx, func(ev runtime.Event) error {
			if ev.Type == runtime.EventPluginWait {
				waits.Add(1)
			}
			return nil
		})
	}()
	for k := range waitKills {
		before := published.Load()
		pid := h.killPluginAtWholeState(c, d)
		// The agent restarts it; then claims go on before the next kill.
		h.eventually(fmt.Sprintf("kill %d: %s restarted", k, d.plugin), readyDeadline, func() (bool, string) {
			now := h.pluginPID(c, d)
			return now != 0 && now != pid, fmt.Sprint(now)
		})
		h.waitPluginHealthy(d)
		h.eventually(fmt.Sprintf("kill %d: claims go on", k), readyDeadline, func() (bool, string) {
			return published.Load() >= before+waitWorkers, fmt.Sprint(published.Load())
		})
	}
	close(stop)
	wg.Wait()
	stopFollow()
	<-followed
	t.Logf("%d %s events", waits.Load(), runtime.EventPluginWait)
	for _, e := range errs {
		t.Error(e)
	}
	if published.Load() == 0 {
		t.Error("no claim was published")
	}
	// Every claim was released: once the teardowns are done, the driver
	// and the mount table hold nothing.
	for _, v := range h.checkSettled(d, "after the kills") {
		if len(v.Claims) > 0 {
			t.Errorf("volume %s still has claims: %s", v.ID, describe(v))
		}
	}
	return claims, releases
}

// pluginPID is the PID of d's allocation, as the agent reports it; 0 when
// it has none (restarting).
func (h *host) pluginPID(c *api.Client, d driver) int {
	h.t.Helper()
	as, err := c.Allocations(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	for _, a := range as {
		if a.ID == d.alloc {
			return a.PID
		}
	}
	return 0
}

// killPluginAtWholeState SIGKILLs d's plugin process (stopped by
// stopPluginAtWholeState first) and returns its PID.
func (h *host) killPluginAtWholeState(c *api.Client, d driver) int {
	h.t.Helper()
	pid := h.stopPluginAtWholeState(c, d)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		h.t.Fatalf("kill %s (PID %d): %v", d.plugin, pid, err)
	}
	return pid
}

// stopPluginAtWholeState SIGSTOPs d's plugin process and returns its PID.
// The hostpath driver rewrites its state.json in place (truncate, write)
// and does not start again from a torn one; so it is stopped only when
// its state file is whole (continued and tried again otherwise): a kill
// that follows tests the agent, not the driver's writes.
func (h *host) stopPluginAtWholeState(c *api.Client, d driver) int {
	h.t.Helper()
	var pid int
	h.eventually("a whole state file to stop "+d.plugin+" at", readyDeadline, func() (bool, string) {
		pid = h.pluginPID(c, d)
		if pid == 0 {
			return false, "no PID"
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return false, err.Error()
		}
		// The stop takes effect after kill returns; until then the
		// driver may still be writing.
		if !testbin.Stopped(pid) {
			return false, "stopping"
		}
		if d.alloc == hostpathDriver.alloc {
			if _, err := hostpath.ReadState(h.hostpathDir()); err != nil {
				_ = syscall.Kill(pid, syscall.SIGCONT)
				return false, err.Error()
			}
		}
		return true, ""
	})
	return pid
}

// waitPluginUnhealthy waits until d has no healthy controller or node, as
// `csiactor plugin status -json` shows.
func (h *host) waitPluginUnhealthy(d driver) {
	h.t.Helper()
	h.eventually("plugin "+d.plugin+" is unhealthy", readyDeadline, func() (bool, string) {
		r := h.cli("plugin", "status", d.plugin, "-json")
		var p runtime.Plugin
		if err := json.Unmarshal([]byte(r.stdout), &p); err != nil {
			return false, r.String()
		}
		return p.NodesHealthy == 0 && p.ControllersHealthy == 0, r.stdout
	})
}

func hasEventType(evs []runtime.Event, typ string) bool {
	for _, e := range evs {
		if e.Type == typ {
			return true
		}
	}
	return false
}

// TestAgent_PluginWaitEndsAtDeadline stops the plugin (SIGSTOP: it stays
// unhealthy until plugins.health_timeout) and claims through the API and
// the CLI with deadlines shorter than that: each is a 503 that names the
// plugin and how long it waited, and the CLI says on stderr that it is
// waiting, leaving -json's stdout empty. With volumes.plugin_wait 0s the
// claim is a 503 at once, with no wait.
func TestAgent_PluginWaitEndsAtDeadline(t *testing.T) {
	defer leakcheck.Check(t)()
	for _, wait := range []string{"30s", "0s"} {
		t.Run("plugin_wait="+wait, func(t *testing.T) {
			d := exampleDriver
			h := newHost(t)
			h.volumesExtra = "  plugin_wait: " + wait + "\n"
			a := h.startWith(d)
			defer a.stop()
			h.createVolume(d, "data1", "multi-node-multi-writer")
			c, err := api.NewClient(h.address())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			pid := h.stopPluginAtWholeState(c, d)
			defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
			h.waitPluginUnhealthy(d)

			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err = c.Claim(ctx, "data1", runtime.ClaimRequest{Alloc: "web1", Mode: "write", AccessMode: "multi-node-multi-writer", AttachmentMode: "file-system"})
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || !strings.Contains(ae.Message, `"example"`) {
				t.Fatalf("claim while the plugin is stopped: %v; want a 503 naming plugin \"example\"", err)
			}
			waited := strings.Contains(ae.Message, "waited")
			if waited != (wait != "0s") {
				t.Errorf("plugin_wait %s: the 503 says %q", wait, ae.Message)
			}
			if wait == "0s" {
				if hasEventType(h.events(), runtime.EventPluginWait) {
					t.Errorf("plugin_wait 0s: a %s event was sent", runtime.EventPluginWait)
				}
				return
			}
			if !hasEvent(h.events(), runtime.EventPluginWait, "web1", "data1") {
				t.Errorf("no %s event for web1 on data1: %+v", runtime.EventPluginWait, h.events())
			}
			// The CLI: -json keeps stdout for the answer; the wait is told
			// on stderr.
			r := h.cli("volume", "claim", "-json", "-timeout", "3s", "-alloc", "web2", "-mode", "write",
				"-access-mode", "multi-node-multi-writer", "data1")
			if r.code == 0 || r.stdout != "" || !strings.Contains(r.stderr, "waits up to") || !strings.Contains(r.stderr, "waited") {
				t.Errorf("volume claim -json while the plugin is stopped: %s", r)
			}
		})
	}
}

// TestAgent_VolumeRequestsWaitOutAStoppedPlugin stops the plugin
// (SIGSTOP) and sends, through the CLI with -json, a create, an expansion,
// a modification and a claim: each waits (its plugin-wait event is sent
// and the CLI says on stderr that it is waiting) and, once the plugin is
// continued, succeeds with its answer alone on stdout. A release sent
// while the plugin is stopped answers at once, without a wait, and its
// teardown finishes once the plugin is back. The driver's state and the
// mount table then hold what the claims own, and nothing once they are
// released.
func TestAgent_VolumeRequestsWaitOutAStoppedPlugin(t *testing.T) {
	defer leakcheck.Check(t)()
	forEachDriver(t, func(t *testing.T, d driver) {
		d = modifyDriver(d)
		h := newHost(t)
		a := h.startWith(d) // volumes.plugin_wait at its default, 30s
		defer a.stop()
		const mode = "multi-node-multi-writer"
		for _, v := range []string{"grow", "tune", "use"} {
			h.createVolume(d, v, mode)
		}
		h.ok("volume", "claim", "-alloc", "old", "-mode", "write", "-access-mode", mode, "use")
		grown := h.volume("grow").CapacityBytes + 1<<20
		c, err := api.NewClient(h.address())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		pid := h.stopPluginAtWholeState(c, d)
		continued := false
		defer func() {
			if !continued {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		}()
		h.waitPluginUnhealthy(d)

		// A release needs no plugin to answer: the past claim is recorded.
		var released runtime.Claim
		if err := json.Unmarshal([]byte(h.ok("volume", "release", "-json", "-alloc", "old", "use")), &released); err != nil {
			t.Fatal(err)
		}
		if released.State != runtime.ClaimTaken {
			t.Errorf("released while the plugin is stopped: state %s, want %s", released.State, runtime.ClaimTaken)
		}

		type request struct {
			volume, alloc string
			wait          func() result
			printed       func() string
		}
		start := func(volume, alloc string, args ...string) request {
			wait, printed := h.background(args...)
			return request{volume: volume, alloc: alloc, wait: wait, printed: printed}
		}
		reqs := []request{
			start("new", "", append(append([]string{"volume", "create", "-json", "-plugin", d.plugin}, d.create...), "-capability", mode, "new")...),
			start("grow", "", "volume", "expand", "-json", "-capacity", fmt.Sprint(grown), "grow"),
			start("tune", "", "volume", "modify", "-json", "-param", "iops=3000", "tune"),
			start("use", "web", "volume", "claim", "-json", "-alloc", "web", "-mode", "write", "-access-mode", mode, "use"),
		}
		// Each waits for the plugin: its event is sent and the CLI tells it.
		for _, r := range reqs {
			h.eventually(fmt.Sprintf("a %s event for %s and the CLI's notice", runtime.EventPluginWait, r.volume), readyDeadline, func() (bool, string) {
				ok := hasEvent(h.events(), runtime.EventPluginWait, r.alloc, r.volume) && strings.Contains(r.printed(), "; waiting")
				return ok, r.printed()
			})
		}
		if hasEvent(h.events(), runtime.EventPluginWait, "old", "use") {
			t.Errorf("the release waited for the plugin")
		}
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		continued = true

		for _, r := range reqs {
			res := r.wait()
			if res.code != 0 || !strings.Contains(res.stderr, "waits up to") {
				t.Errorf("want exit 0 with the wait told on stderr; got %s", res)
				continue
			}
			if r.alloc != "" {
				var cl runtime.Claim
				if err := json.Unmarshal([]byte(res.stdout), &cl); err != nil || cl.State != runtime.ClaimPublished {
					t.Errorf("claim: stdout is not the published claim (%v): %s", err, res)
				}
				continue
			}
			var v runtime.Volume
			if err := json.Unmarshal([]byte(res.stdout), &v); err != nil || v.ID != r.volume {
				t.Errorf("stdout is not volume %s (%v): %s", r.volume, err, res)
			}
		}
		if got := h.volume("grow").CapacityBytes; got < grown {
			t.Errorf("volume grow has %d bytes after its expansion to %d", got, grown)
		}
		if got := h.volume("tune").MutableParameters["iops"]; got != "3000" {
			t.Errorf("volume tune's iops = %q after its modification, want 3000", got)
		}
		// The old claim's teardown finished once the plugin was back; the
		// driver and the mount table hold the new claim alone.
		for _, v := range h.checkSettled(d, "after the plugin continued") {
			want := 0
			if v.ID == "use" {
				want = 1
			}
			if len(v.Claims) != want {
				t.Errorf("volume %s: %s; want %d claims", v.ID, describe(v), want)
			}
		}
		h.ok("volume", "release", "-alloc", "web", "use")
		for _, v := range h.checkSettled(d, "after the release") {
			if len(v.Claims) > 0 {
				t.Errorf("volume %s still has claims: %s", v.ID, describe(v))
			}
		}
	})
}
