package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/persistence"
	"github.com/csiactor/csiactor/runtime"

	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
)

// Deadlines. Each bounds a wait for something that takes milliseconds on
// an idle machine; they are generous so that a loaded 2-core machine
// running everything with -race never trips them. No test asserts how fast
// anything happens.
const (
	readyDeadline    = 2 * time.Minute // agent up and its plugin healthy
	settleDeadline   = 2 * time.Minute // a claim or release reaching its end state
	commandTimeout   = 2 * time.Minute // one CLI command
	shutdownDeadline = 3 * time.Minute // SIGTERM to exit; the agent bounds it at 2m10s
	pollInterval     = 50 * time.Millisecond
)

// BinaryEnv names an environment variable that, when set, is the path of
// the csiactor binary to test instead of building one (to test a release
// build, or to run the compiled tests as another user).
const BinaryEnv = "CSIACTOR_E2E_BINARY"

// binary is the csiactor binary under test, built on first use with `go
// build` (with -race when the tests run with -race, so the agent's own data
// races fail the tests too), or the one $CSIACTOR_E2E_BINARY names. It is
// built with the crashpoints tag, whose crash points do nothing unless
// $CSIACTOR_CRASH_AT names one (see TestAgent_SIGKILLAtEveryStep).
var binary = &testbin.Binary{Kind: "end-to-end test", Prefix: "csiae2e-bin-", Race: raceEnabled, Env: BinaryEnv,
	Tags: []string{"crashpoints"}}

func TestMain(m *testing.M) { binary.Main(m) }

// host is one test's machine: a base directory under /tmp (short, since
// unix socket paths are limited to 107 bytes) holding the agent's data dir,
// the example plugin's state dir, the config file and the agent's logs.
type host struct {
	t        *testing.T
	bin      string
	base     string
	dataDir  string
	config   string
	starts   int
	stateDir string
	// killTimeout is plugins.kill_timeout in the config file.
	killTimeout string
	// agentEnv is added to the environment of the agents started next.
	agentEnv []string
	// pluginsExtra is added to the plugins section of the config file
	// (indented lines).
	pluginsExtra string
	// retryInitial and retryMax are volumes.retry in the config file.
	retryInitial, retryMax string
	// volumesExtra is added to the volumes section of the config file
	// (indented lines).
	volumesExtra string
	// configExtra is added at the end of the config file (top-level
	// sections).
	configExtra string
}

// newHost makes the base directory and registers the cleanup that runs
// after the test whatever happened: stop leftover processes, unmount
// whatever is still mounted under base, remove base.
func newHost(t *testing.T) *host {
	t.Helper()
	bin := binary.Path(t)
	base, err := os.MkdirTemp("", "csiae2e")
	if err != nil {
		t.Fatal(err)
	}
	h := &host{
		t: t, bin: bin, base: base,
		dataDir:  filepath.Join(base, "data"),
		stateDir: filepath.Join(base, "plugin"),
		config:   filepath.Join(base, "csiactor.yaml"),

		killTimeout:  "10s",
		retryInitial: "1s", retryMax: "10s",
	}
	t.Cleanup(func() {
		testbin.KillProcessesWith(base)
		mounts := mountsUnder(base)
		sort.Sort(sort.Reverse(sort.StringSlice(mounts))) // children first
		for _, m := range mounts {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
				t.Errorf("cleanup: unmount %s: %v", m, err)
			}
		}
		if t.Failed() {
			t.Logf("left for inspection: %s", base)
			return
		}
		if err := os.RemoveAll(base); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return h
}

// writeConfig writes the agent's config file: the data dir, a TCP port
// chosen by the kernel (so it never collides with an agent on 7460), short
// heartbeats and retries, and the given allocations (YAML list items).
func (h *host) writeConfig(allocations string) {
	h.t.Helper()
	cfg := fmt.Sprintf(`# written by the e2e test
data_dir: %s
api:
  http_addr: 127.0.0.1:0
log:
  level: info
plugins:
  heartbeat_interval: 1s
  probe_timeout: 1s
  rpc_timeout: 30s
  kill_timeout: %s
  restart_backoff:
    initial: 100ms
    max: 2s
%svolumes:
  # A publish step that keeps failing is given up after 10 attempts; the
  # defaults (1s, 10s) make that about a minute, far longer than the test
  # keeps a claim waiting, with retries no more than 10 s apart.
  retry:
    initial: %s
    max: %s
%sallocations:
%s%s`, h.dataDir, h.killTimeout, h.pluginsExtra, h.retryInitial, h.retryMax, h.volumesExtra, allocations, h.configExtra)
	if err := os.WriteFile(h.config, []byte(cfg), 0o600); err != nil {
		h.t.Fatal(err)
	}
}

// exampleAllocation is the config entry of the example plugin as an
// exec-managed monolith, with its state outside the data dir and at most
// maxAttached volumes controller-published at once (0: no limit), a limit
// of the storage that the plugin does not report as max_volumes_per_node:
// a claim beyond it is retried, not refused.
func (h *host) exampleAllocation(maxAttached int) string {
	return fmt.Sprintf(`  - id: example
    plugin: example
    type: monolith
    command: [%q, example-plugin, -state-dir, %q, -node-id, e2e-node, -max-attached, "%d"]
`, h.bin, h.stateDir, maxAttached)
}

// address is the agent's API address, as CSIACTOR_ADDR.
func (h *host) address() string { return "unix://" + filepath.Join(h.dataDir, runtime.APISocketName) }

// agent is one run of `csiactor agent` as a child process in its own
// process group, its output going to files in the base dir.
type agent struct {
	h        *host
	cmd      *exec.Cmd
	stdout   string // log file paths
	stderr   string
	done     <-chan struct{}  // closed when the process has been waited for
	state    *os.ProcessState // set before done closes
	httpAddr string           // host:port of /metrics, from the agent's output
}

// startAgent starts the agent with the config file and waits until it
// serves its API and its health endpoint.
func (h *host) startAgent() *agent {
	h.t.Helper()
	h.starts++
	n := h.starts
	a := &agent{
		h:      h,
		stdout: filepath.Join(h.base, fmt.Sprintf("agent-%d.stdout", h.starts)),
		stderr: filepath.Join(h.base, fmt.Sprintf("agent-%d.stderr", h.starts)),
	}
	a.cmd = exec.Command(h.bin, "agent", "-config", h.config)
	a.cmd.Env = append(cleanEnv(), h.agentEnv...)
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var files []*os.File
	for _, p := range []string{a.stdout, a.stderr} {
		f, err := os.Create(p)
		if err != nil {
			h.t.Fatal(err)
		}
		files = append(files, f)
	}
	a.cmd.Stdout, a.cmd.Stderr = files[0], files[1]
	// Registered before Start's cleanup, so it runs after the agent is
	// gone and its logs are complete.
	h.t.Cleanup(func() {
		// The logs of the last runs only: a test that restarts the agent
		// many times leaves the others in the base dir.
		if h.t.Failed() && n > h.starts-3 {
			h.t.Logf("agent run %d stdout:\n%s", n, readFile(a.stdout))
			h.t.Logf("agent run %d stderr (last 80 lines):\n%s", n, testbin.Tail(readFile(a.stderr), 80))
		}
	})
	done, err := testbin.Start(h.t, a.cmd, func() { a.state = a.cmd.ProcessState })
	if err != nil {
		h.t.Fatalf("start agent: %v", err)
	}
	a.done = done
	for _, f := range files {
		f.Close() // the child has its own copies
	}

	// The agent prints its addresses once it serves them.
	tcpRE := regexp.MustCompile(`metrics and health on http://(\S+)`)
	h.eventually("the agent prints its addresses", readyDeadline, func() (bool, string) {
		if a.exited() {
			h.t.Fatalf("agent exited while starting: %s\nstderr:\n%s", a.state, testbin.Tail(readFile(a.stderr), 40))
		}
		out := readFile(a.stdout)
		m := tcpRE.FindStringSubmatch(out)
		if m == nil || !strings.Contains(out, "API on "+h.address()) {
			return false, out
		}
		a.httpAddr = m[1]
		return true, ""
	})
	h.eventually("GET /v1/health answers ok", readyDeadline, func() (bool, string) {
		body, code, err := httpGet("http://" + a.httpAddr + "/v1/health")
		return err == nil && code == http.StatusOK && strings.Contains(body, `"ok"`), fmt.Sprintf("%d %s %v", code, body, err)
	})
	return a
}

func (a *agent) exited() bool { return testbin.Closed(a.done) }

func (a *agent) signal(sig syscall.Signal) {
	a.h.t.Helper()
	if err := a.cmd.Process.Signal(sig); err != nil {
		a.h.t.Fatalf("signal %s to agent: %v", sig, err)
	}
}

// wait waits for the agent to exit and returns how it ended.
func (a *agent) wait(deadline time.Duration) *os.ProcessState {
	a.h.t.Helper()
	select {
	case <-a.done:
		return a.state
	case <-time.After(deadline):
		a.h.t.Fatalf("agent did not exit within %s\nstderr:\n%s", deadline, testbin.Tail(readFile(a.stderr), 40))
		return nil
	}
}

// logs returns what the agent wrote to stderr so far.
func (a *agent) logs() string { return readFile(a.stderr) }

// checkNoRace fails the test if the race-enabled agent reported a race.
func (a *agent) checkNoRace() {
	a.h.t.Helper()
	if l := a.logs(); strings.Contains(l, "WARNING: DATA RACE") {
		a.h.t.Errorf("the agent reported a data race:\n%s", l[strings.Index(l, "WARNING: DATA RACE"):])
	}
}

// metrics scrapes the agent's /metrics.
func (a *agent) metrics() []sample {
	a.h.t.Helper()
	body, code, err := httpGet("http://" + a.httpAddr + "/metrics")
	if err != nil || code != http.StatusOK {
		a.h.t.Fatalf("GET /metrics: %d %v", code, err)
	}
	s, err := parseMetrics(body)
	if err != nil {
		a.h.t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return s
}

// result is how one CLI command ended.
type result struct {
	args           []string
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("csiactor %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// cli runs the csiactor CLI against the agent, as a user would with
// CSIACTOR_ADDR exported.
func (h *host) cli(args ...string) result {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.bin, args...)
	cmd.Env = append(cleanEnv(), "CSIACTOR_ADDR="+h.address())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		h.t.Fatalf("run csiactor %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		h.t.Fatalf("csiactor %s did not finish within %s", strings.Join(args, " "), commandTimeout)
	}
	return result{args: args, stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}

// ok runs the CLI and fails the test unless it exits 0; it returns stdout.
func (h *host) ok(args ...string) string {
	h.t.Helper()
	r := h.cli(args...)
	if r.code != 0 {
		h.t.Fatalf("%s", r)
	}
	return r.stdout
}

// fails runs the CLI and fails the test unless it exits with code and
// stderr contains want.
func (h *host) fails(code int, want string, args ...string) {
	h.t.Helper()
	r := h.cli(args...)
	if r.code != code || !strings.Contains(r.stderr, want) {
		h.t.Errorf("want exit %d and %q on stderr; got %s", code, want, r)
	}
}

// background starts a CLI command and returns a function that waits for
// it, and one that returns what it has printed so far (both streams).
func (h *host) background(args ...string) (wait func() result, printed func() string) {
	h.t.Helper()
	cmd := exec.Command(h.bin, args...)
	cmd.Env = append(cleanEnv(), "CSIACTOR_ADDR="+h.address())
	var mu sync.Mutex
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = lockedWriter{&mu, &stdout}, lockedWriter{&mu, &stderr}
	done, err := testbin.Start(h.t, cmd, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	wait = func() result {
		h.t.Helper()
		select {
		case <-done:
		case <-time.After(commandTimeout):
			h.t.Fatalf("csiactor %s did not finish within %s", strings.Join(args, " "), commandTimeout)
		}
		mu.Lock()
		defer mu.Unlock()
		return result{args: args, stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
	}
	printed = func() string {
		mu.Lock()
		defer mu.Unlock()
		return stdout.String() + stderr.String()
	}
	return wait, printed
}

// lockedWriter writes to w under mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// volume returns the volume as `csiactor volume status -json` shows it.
func (h *host) volume(id string) runtime.Volume {
	h.t.Helper()
	var v runtime.Volume
	out := h.ok("volume", "status", "-json", id)
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		h.t.Fatalf("volume status -json %s: %v\n%s", id, err, out)
	}
	return v
}

// claimOf returns alloc's current claim on v, if any.
func claimOf(v runtime.Volume, alloc string) (runtime.Claim, bool) {
	for _, c := range v.Claims {
		if c.Alloc == alloc {
			return c, true
		}
	}
	return runtime.Claim{}, false
}

// events returns the agent's events as `csiactor events -json` prints them.
func (h *host) events() []runtime.Event {
	h.t.Helper()
	var evs []runtime.Event
	sc := bufio.NewScanner(strings.NewReader(h.ok("events", "-json")))
	for sc.Scan() {
		var e runtime.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			h.t.Fatalf("events -json: line %q: %v", sc.Text(), err)
		}
		if err := e.Validate(); err != nil {
			h.t.Errorf("events -json: event %+v: %v", e, err)
		}
		evs = append(evs, e)
	}
	return evs
}

// hasEvent reports whether evs has an event of type typ for alloc and
// volume (empty matches any).
func hasEvent(evs []runtime.Event, typ, alloc, volume string) bool {
	for _, e := range evs {
		if e.Type == typ && (alloc == "" || e.Alloc == alloc) && (volume == "" || e.Volume == volume) {
			return true
		}
	}
	return false
}

// eventually polls cond until it returns true, failing the test with the
// last state it described when deadline passes.
func (h *host) eventually(what string, deadline time.Duration, cond func() (bool, string)) {
	h.t.Helper()
	testbin.Eventually(h.t, what, deadline, pollInterval, cond)
}

// openStore opens the agent's store, which only works while no agent runs.
func (h *host) openStore() *persistence.Store {
	h.t.Helper()
	s, err := persistence.Open(filepath.Join(h.dataDir, runtime.StoreFileName), persistence.Config{})
	if err != nil {
		h.t.Fatalf("open the agent's store: %v", err)
	}
	h.t.Cleanup(func() { s.Close() })
	return s
}

// cleanEnv is the test's environment without CSIACTOR_* variables, so a
// developer's exported CSIACTOR_ADDR never points the tests at their agent.
// A race-enabled binary would sleep a second at every exit (GORACE's
// atexit_sleep_ms), which adds up over dozens of CLI commands; races are
// still reported.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CSIACTOR_") && !strings.HasPrefix(kv, "GORACE=") {
			env = append(env, kv)
		}
	}
	return append(env, "GORACE=atexit_sleep_ms=0")
}

func httpGet(url string) (string, int, error) {
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode, err
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// isRoot reports whether the example plugin bind-mounts (it does as root).
func isRoot() bool { return os.Geteuid() == 0 }

// mountsUnder returns the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	m, _ := mountinfo.Under(dir)
	return m
}

// sample is one line of the Prometheus text exposition format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics parses the Prometheus text format (the subset a
// client_golang registry writes: no timestamps, double-quoted label values
// with \\, \" and \n escapes).
func parseMetrics(text string) ([]sample, error) {
	var out []sample
	for n, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s := sample{labels: map[string]string{}}
		i := strings.IndexAny(line, "{ ")
		if i <= 0 {
			return nil, fmt.Errorf("line %d: %q: no metric name", n+1, line)
		}
		s.name, line = line[:i], line[i:]
		if line[0] == '{' {
			line = line[1:]
			for {
				if strings.HasPrefix(line, "}") {
					line = line[1:]
					break
				}
				eq := strings.Index(line, `="`)
				if eq <= 0 {
					return nil, fmt.Errorf("line %d: bad labels", n+1)
				}
				key := line[:eq]
				line = line[eq+2:]
				var val strings.Builder
				for {
					if line == "" {
						return nil, fmt.Errorf("line %d: unterminated label value", n+1)
					}
					c := line[0]
					line = line[1:]
					if c == '"' {
						break
					}
					if c == '\\' && line != "" {
						switch line[0] {
						case 'n':
							val.WriteByte('\n')
						default:
							val.WriteByte(line[0])
						}
						line = line[1:]
						continue
					}
					val.WriteByte(c)
				}
				s.labels[key] = val.String()
				line = strings.TrimPrefix(line, ",")
			}
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line), 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: value: %w", n+1, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out, nil
}

// find returns the samples named name whose labels include want.
func find(samples []sample, name string, want map[string]string) []sample {
	var out []sample
	for _, s := range samples {
		if s.name != name {
			continue
		}
		match := true
		for k, v := range want {
			if s.labels[k] != v {
				match = false
				break
			}
		}
		if match {
			out = append(out, s)
		}
	}
	return out
}

// value returns the sum of the samples named name whose labels include
// labels, and whether there was any.
func value(samples []sample, name string, labels map[string]string) (float64, bool) {
	ss := find(samples, name, labels)
	if len(ss) == 0 {
		return 0, false
	}
	var sum float64
	for _, s := range ss {
		sum += s.value
	}
	return sum, true
}

// describe prints a volume's claims and past claims for a failure message.
func describe(v runtime.Volume) string {
	var b strings.Builder
	fmt.Fprintf(&b, "volume %s:", v.ID)
	for _, c := range v.Claims {
		fmt.Fprintf(&b, "\n  claim %s %s %s %s last_error=%q", c.Alloc, c.Mode, c.State, c.TargetPath, c.LastError)
	}
	for _, c := range v.PastClaims {
		fmt.Fprintf(&b, "\n  past claim %s %s %s last_error=%q", c.Alloc, c.Mode, c.State, c.LastError)
	}
	return b.String()
}

func describeSamples(ss []sample) string {
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, "%s%v %g\n", s.name, s.labels, s.value)
	}
	return b.String()
}
