package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// TestAgent_StopAndKill_PluginOutlivesAndIsAdopted stops the agent with
// SIGTERM, then kills the next one with SIGKILL, each time with a
// published claim: the plugin process (and its log shim) keeps running, the
// next agent adopts the same PID and is healthy at once (no new process,
// no failed first fingerprint),
// the mount and its data are intact, and no second plugin process ever
// exists. The plugin's output, with the lines of every run, is served by
// `alloc logs`. Deregistration stops the plugin and its shim.
func TestAgent_StopAndKill_PluginOutlivesAndIsAdopted(t *testing.T) {
	defer leakcheck.Check(t)()
	h := newHost(t)
	h.writeConfig(h.exampleAllocation(0))
	pluginDir := filepath.Join(h.dataDir, "plugins", "example")

	// Watches for a second plugin process from now to the end.
	watch := watchPlugins(h.stateDir)
	defer watch.stop(t)

	a1 := h.startAgent()
	h.waitHealthy()
	h.ok("volume", "create", "-plugin", "example", "-capability", "single-node-writer", "data1")
	target := strings.TrimSpace(h.ok("volume", "claim", "-alloc", "web1", "-mode", "write", "-access-mode", "single-node-writer", "data1"))
	if err := os.WriteFile(filepath.Join(target, "hello.txt"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	plugins := testbin.ProcessesWith(h.stateDir)
	if len(plugins) != 1 {
		t.Fatalf("plugin processes %v, want one", plugins)
	}
	pid := plugins[0]
	shims := testbin.ProcessesWith("csiactor-log-shim -dir " + pluginDir)
	if len(shims) != 1 {
		t.Fatalf("log shims %v, want one", shims)
	}

	intact := func(when string) {
		t.Helper()
		if now := testbin.ProcessesWith(h.stateDir); len(now) != 1 || now[0] != pid {
			t.Errorf("%s: plugin processes %v, want %d alone", when, now, pid)
		}
		if now := testbin.ProcessesWith("csiactor-log-shim -dir " + pluginDir); len(now) != 1 || now[0] != shims[0] {
			t.Errorf("%s: log shims %v, want %d alone", when, now, shims[0])
		}
		if isRoot() && !mountinfo.IsMountPoint(target) {
			t.Errorf("%s: %s is not mounted", when, target)
		}
		if b, err := os.ReadFile(filepath.Join(target, "hello.txt")); err != nil || string(b) != "hello\n" {
			t.Errorf("%s: hello.txt = %q, %v", when, b, err)
		}
	}

	// --- SIGTERM: an orderly stop leaves the plugin running ---------------
	a1.signal(syscall.SIGTERM)
	if st := a1.wait(shutdownDeadline); st.ExitCode() != 0 {
		t.Fatalf("agent exit after SIGTERM: %s\n%s", st, testbin.Tail(a1.logs(), 20))
	}
	a1.checkNoRace()
	intact("after SIGTERM")

	a2 := h.startAgent()
	h.waitHealthy()
	checkHealthyAtOnce(t, a2)
	intact("after the restart from SIGTERM")
	if c, ok := claimOf(h.volume("data1"), "web1"); !ok || c.State != runtime.ClaimPublished || c.TargetPath != target {
		t.Errorf("after restart: claim %+v (present %t), want published at %s", c, ok, target)
	}

	// --- SIGKILL: the same -----------------------------------------------
	a2.signal(syscall.SIGKILL)
	a2.wait(shutdownDeadline)
	a2.checkNoRace()
	intact("after SIGKILL")
	a3 := h.startAgent()
	h.waitHealthy()
	checkHealthyAtOnce(t, a3)
	intact("after the restart from SIGKILL")

	// The plugin's output of all three runs is kept and served.
	// The example plugin logs to stderr, which `alloc logs` prints on
	// stderr: its first line (first run) and the claim's (first run too).
	if r := h.cli("alloc", "logs", "example"); r.code != 0 || !strings.Contains(r.stderr, "msg=serving") || !strings.Contains(r.stderr, `msg="volume published"`) {
		t.Errorf("alloc logs: %s\nwant the plugin's lines of the first run", r)
	}
	if tail := h.ok("alloc", "logs", "-tail", "2", "-json", "example"); strings.Count(tail, "\n") != 2 || !strings.Contains(tail, `"stream":"std`) {
		t.Errorf("alloc logs -tail 2 -json:\n%s", tail)
	}
	if fi, err := os.Stat(filepath.Join(pluginDir, "output.log")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("output.log: %v, want mode 0600", err)
	}
	// And followed: a new line shows up (the claim's RPCs make the plugin
	// log). The follow is in place once it has printed the last line.
	follow, printed := h.background("alloc", "logs", "-f", "-tail", "1", "example")
	h.eventually("alloc logs -f printed the last line", settleDeadline, func() (bool, string) {
		return printed() != "", "nothing printed"
	})
	h.ok("volume", "release", "-alloc", "web1", "data1")
	h.eventually("web1's claim is freed", settleDeadline, func() (bool, string) {
		v := h.volume("data1")
		return len(v.Claims) == 0 && len(v.PastClaims) == 0, describe(v)
	})

	// --- Deregistration stops the plugin and its shim ---------------------
	h.ok("alloc", "deregister", "example")
	if r := follow(); r.code != 0 || !strings.Contains(r.stderr, `msg="volume unpublished"`) || strings.Contains(r.stderr, "msg=serving") {
		t.Errorf("alloc logs -f: %s; want exit 0 once deregistered, with the release's lines", r)
	}
	h.eventually("the plugin and its shim are gone", settleDeadline, func() (bool, string) {
		left := append(testbin.ProcessesWith(h.stateDir), testbin.ProcessesWith(pluginDir)...)
		return len(left) == 0, fmt.Sprintf("still running: %v", left)
	})
	h.fails(1, "not found", "alloc", "logs", "example")
	a3.signal(syscall.SIGTERM)
	a3.wait(shutdownDeadline)
	a3.checkNoRace()
}

// checkHealthyAtOnce checks, from the agent's own log, that the adopted
// plugin's allocation became healthy at once: the agent adopted the
// process, started none, and its first health verdict for the allocation
// is healthy (no failed connection or fingerprint, so no backoff before
// it). How fast that is, is a benchmark's business, not this test's.
func checkHealthyAtOnce(t *testing.T, a *agent) {
	t.Helper()
	var adopted, healthy bool
	sc := bufio.NewScanner(strings.NewReader(a.logs()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() && !healthy {
		line := sc.Text()
		if !strings.Contains(line, "alloc=example") {
			continue
		}
		switch {
		case strings.Contains(line, "adopted the plugin process"):
			adopted = true
		case strings.Contains(line, `msg="plugin process started"`),
			strings.Contains(line, "does not answer on its socket"),
			strings.Contains(line, `msg="plugin allocation unhealthy"`),
			strings.Contains(line, `msg="allocation actor restarting after a failure"`):
			t.Errorf("before the adopted allocation was healthy, the agent logged: %s", line)
		case strings.Contains(line, `msg="plugin allocation healthy"`):
			healthy = true
		}
	}
	if !adopted {
		t.Errorf("the agent did not adopt the plugin:\n%s", testbin.Tail(a.logs(), 30))
	}
	if !healthy {
		t.Errorf("no healthy line for the allocation in the agent's log:\n%s", testbin.Tail(a.logs(), 30))
	}
}

// pluginWatch samples the processes whose command line has marker until
// stopped, and remembers the largest number seen at once.
type pluginWatch struct {
	done chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	most []int // guarded by mu
}

func watchPlugins(marker string) *pluginWatch {
	w := &pluginWatch{done: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for {
			if now := testbin.ProcessesWith(marker); len(now) > 1 {
				w.mu.Lock()
				if len(now) > len(w.most) {
					w.most = now
				}
				w.mu.Unlock()
			}
			select {
			case <-w.done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *pluginWatch) stop(t *testing.T) {
	close(w.done)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.most) > 1 {
		t.Errorf("two plugin processes ran at once: %v", w.most)
	}
}
