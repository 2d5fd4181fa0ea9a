package acceptance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/leakcheck"

	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
)

// Deadlines of waits for things that happen on their own (an agent up, a
// plugin healthy again). They bound a wait, they assert no speed: a loaded
// 2-core box must still pass.
const (
	startDeadline = 60 * time.Second
	waitDeadline  = 60 * time.Second
)

// binary is the csiactor binary under test, built once with `go build`.
var binary = &testbin.Binary{Kind: "acceptance test", Prefix: "csiacc-bin-"}

func TestMain(m *testing.M) { binary.Main(m) }

// host is one test's machine: a short base directory under /tmp (unix
// socket paths are limited to 107 bytes) that is also the agents' TMPDIR,
// so that a -dev data dir lands in it.
type host struct {
	t      *testing.T
	bin    string
	base   string
	starts int // agents started, for log file names
}

func newHost(t *testing.T) *host {
	t.Helper()
	h := &host{t: t, bin: binary.Path(t)}
	// Registered first, so it runs last: after the cleanups that stop
	// the processes whose Wait goroutines the tests start.
	t.Cleanup(leakcheck.Check(t))
	base, err := os.MkdirTemp("", "csiacc-")
	if err != nil {
		t.Fatal(err)
	}
	h.base = base
	t.Cleanup(func() {
		// Whatever a failed test left: mounts first (removing through
		// a bind mount would delete what it shows), then the tree.
		for _, m := range mountsUnder(base) {
			_ = syscall.Unmount(m, syscall.MNT_DETACH)
		}
		testbin.KillProcessesWith(base)
		if err := os.RemoveAll(base); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	return h
}

// env is the environment of the processes the tests start: no CSIACTOR_*
// from the caller, TMPDIR in base.
func (h *host) env(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CSIACTOR_") && !strings.HasPrefix(kv, "TMPDIR=") {
			env = append(env, kv)
		}
	}
	return append(append(env, "TMPDIR="+h.base), extra...)
}

func (h *host) write(name, content string, mode os.FileMode) string {
	h.t.Helper()
	p := filepath.Join(h.base, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		h.t.Fatal(err)
	}
	return p
}

// agent is a running `csiactor agent`.
type agent struct {
	h        *host
	cmd      *exec.Cmd
	stdout   string // file
	stderr   string // file
	done     <-chan struct{}
	state    *os.ProcessState // set before done closes
	unixAddr string           // unix:///.../api.sock
	tcpAddr  string           // http://127.0.0.1:port, https:// with api.tls
}

var (
	apiLine = regexp.MustCompile(`API on (unix://\S+)`)
	tcpLine = regexp.MustCompile(`on (https?://\S+)`)
)

// startAgent runs `csiactor agent args...` and waits until it prints its
// addresses.
func (h *host) startAgent(args ...string) *agent {
	h.t.Helper()
	h.starts++
	a := &agent{
		h:      h,
		stdout: filepath.Join(h.base, fmt.Sprintf("agent%d.out", h.starts)),
		stderr: filepath.Join(h.base, fmt.Sprintf("agent%d.err", h.starts)),
	}
	out, err := os.Create(a.stdout)
	if err != nil {
		h.t.Fatal(err)
	}
	defer out.Close()
	errf, err := os.Create(a.stderr)
	if err != nil {
		h.t.Fatal(err)
	}
	defer errf.Close()
	a.cmd = exec.Command(h.bin, append([]string{"agent"}, args...)...)
	a.cmd.Env = h.env()
	a.cmd.Stdout, a.cmd.Stderr = out, errf
	// A process group of its own, as a shell gives a foreground job: see
	// interrupt.
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	a.done, err = testbin.Start(h.t, a.cmd, func() { a.state = a.cmd.ProcessState })
	if err != nil {
		h.t.Fatal(err)
	}
	h.eventually("the agent prints its addresses", startDeadline, func() (bool, string) {
		if a.exited() {
			h.t.Fatalf("agent exited early: %s\nstdout:\n%s\nstderr:\n%s", a.state, readFile(a.stdout), testbin.Tail(readFile(a.stderr), 20))
		}
		s := readFile(a.stdout)
		if m := apiLine.FindStringSubmatch(s); m != nil {
			a.unixAddr = m[1]
		}
		if m := tcpLine.FindStringSubmatch(s); m != nil {
			a.tcpAddr = m[1]
		}
		return a.unixAddr != "" && a.tcpAddr != "", s
	})
	return a
}

// runAgent runs `csiactor agent args...` that is expected to fail, and
// returns its result.
func (h *host) runAgent(args ...string) result {
	h.t.Helper()
	return h.cli(nil, append([]string{"agent"}, args...)...)
}

func (a *agent) exited() bool { return testbin.Closed(a.done) }

func (a *agent) signal(sig syscall.Signal) {
	a.h.t.Helper()
	if err := a.cmd.Process.Signal(sig); err != nil && !a.exited() {
		a.h.t.Fatal(err)
	}
}

// interrupt sends SIGINT to the agent's process group, as Ctrl-C in a
// terminal does to the foreground job: whatever the agent runs in its
// group gets it too.
func (a *agent) interrupt() {
	a.h.t.Helper()
	if err := syscall.Kill(-a.cmd.Process.Pid, syscall.SIGINT); err != nil && !a.exited() {
		a.h.t.Fatal(err)
	}
}

// wait waits for the agent to exit and returns its exit code.
func (a *agent) wait() int {
	a.h.t.Helper()
	select {
	case <-a.done:
	case <-time.After(waitDeadline):
		a.h.t.Fatalf("agent still running after %s:\n%s", waitDeadline, testbin.Tail(readFile(a.stderr), 20))
	}
	return a.state.ExitCode()
}

func (a *agent) logs() string { return readFile(a.stderr) }

// dataDir is the agent's data dir: the directory of its API socket.
func (a *agent) dataDir() string { return filepath.Dir(strings.TrimPrefix(a.unixAddr, "unix://")) }

// result is what a CLI run printed and its exit code.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// cli runs the binary with args and the extra environment.
func (h *host) cli(extraEnv []string, args ...string) result {
	h.t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(h.bin, args...)
	cmd.Env = h.env(extraEnv...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		h.t.Fatalf("run csiactor %v: %v", args, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// at runs a client command against a.
func (a *agent) at(args ...string) result {
	a.h.t.Helper()
	return a.h.cli([]string{"CSIACTOR_ADDR=" + a.unixAddr}, args...)
}

// ok runs a client command that must succeed and returns its stdout.
func (a *agent) ok(args ...string) string {
	a.h.t.Helper()
	r := a.at(args...)
	if r.code != 0 {
		a.h.t.Fatalf("csiactor %s: %s", strings.Join(args, " "), r)
	}
	return r.stdout
}

// fails runs a client command that must exit with code and say want on
// stderr.
func (a *agent) fails(code int, want string, args ...string) {
	a.h.t.Helper()
	r := a.at(args...)
	if r.code != code || !strings.Contains(r.stderr, want) {
		a.h.t.Errorf("csiactor %s: want exit %d and %q on stderr; got %s", strings.Join(args, " "), code, want, r)
	}
}

// okJSON runs a client command with -json and decodes its output into v.
func (a *agent) okJSON(v any, args ...string) {
	a.h.t.Helper()
	out := a.ok(append(args, "-json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		a.h.t.Fatalf("csiactor %s -json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// unixGet GETs path from the agent's API socket and returns the status
// and body.
func (a *agent) unixGet(path string) (int, string) {
	a.h.t.Helper()
	sock := strings.TrimPrefix(a.unixAddr, "unix://")
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	defer tr.CloseIdleConnections()
	return httpDo(a.h.t, &http.Client{Transport: tr}, "GET", "http://csiactor"+path, nil)
}

// httpDo sends one request and returns the status and body.
func httpDo(t *testing.T, c *http.Client, method, url string, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp.StatusCode, string(body)
}

// background is a long-running CLI command (events -follow).
type background struct {
	cmd    *exec.Cmd
	stdout string
	stderr *bytes.Buffer
	done   <-chan struct{}
}

func (a *agent) background(name string, args ...string) *background {
	a.h.t.Helper()
	b := &background{stdout: filepath.Join(a.h.base, name+".out"), stderr: &bytes.Buffer{}}
	out, err := os.Create(b.stdout)
	if err != nil {
		a.h.t.Fatal(err)
	}
	defer out.Close()
	b.cmd = exec.Command(a.h.bin, args...)
	b.cmd.Env = a.h.env("CSIACTOR_ADDR=" + a.unixAddr)
	b.cmd.Stdout, b.cmd.Stderr = out, b.stderr
	if b.done, err = testbin.Start(a.h.t, b.cmd, nil); err != nil {
		a.h.t.Fatal(err)
	}
	return b
}

func (b *background) output() string { return readFile(b.stdout) }

// interrupt sends SIGINT and returns the exit code.
func (b *background) interrupt(t *testing.T) int {
	t.Helper()
	_ = b.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-b.done:
	case <-time.After(waitDeadline):
		t.Fatalf("%v still running %s after SIGINT", b.cmd.Args, waitDeadline)
	}
	return b.cmd.ProcessState.ExitCode()
}

// eventually polls cond until it holds, failing the test after deadline
// with the last detail cond gave.
func (h *host) eventually(what string, deadline time.Duration, cond func() (bool, string)) {
	h.t.Helper()
	testbin.Eventually(h.t, what, deadline, 25*time.Millisecond, cond)
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func isRoot() bool { return os.Geteuid() == 0 }

// mountsUnder returns the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	m, _ := mountinfo.Under(dir)
	return m
}

// exampleAllocation is an `allocations` section of the agent's config
// with one more example plugin, named name (its allocation too), run with
// flags, its state in <base>/<name>-state.
func (h *host) exampleAllocation(name string, flags ...string) string {
	command, _ := json.Marshal(append([]string{h.bin, "example-plugin", "-state-dir", filepath.Join(h.base, name+"-state"), "-node-id", "node1"}, flags...))
	return fmt.Sprintf("allocations:\n  - {id: %s, plugin: %s, type: monolith, command: %s}\n", name, name, command)
}
