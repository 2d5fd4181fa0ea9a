package cluster_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// The process-level tests run agents as real processes (the csiactor
// binary, with -race when the tests have it, so the agents' own races fail
// the tests) on the embedded etcd of the test process, and SIGKILL them.

// procBinaryEnv names an environment variable that, when set, is the path
// of the csiactor binary to run instead of building one.
const procBinaryEnv = "CSIACTOR_CLUSTER_BINARY"

var procBinary = &testbin.Binary{Kind: "process-level cluster test", Prefix: "csicl-bin-", Race: raceEnabled, Env: procBinaryEnv}

// procDeadline bounds each wait for an agent process (start, exit, a claim
// settling); generous, since three race-enabled agents share a loaded
// machine. It asserts no speed.
const procDeadline = 2 * time.Minute

// procCluster is a test's hosts: a base dir under /tmp (short: unix socket
// paths) holding each agent's data dir, config and logs, and whatever its
// plugin keeps. Its cleanup, registered first, kills every process whose
// command line names the base dir, unmounts what is mounted under it and
// removes it.
type procCluster struct {
	t        *testing.T
	bin      string
	base     string
	endpoint string
	// leaseTTL is the agents' cluster.lease_ttl; empty means 2s.
	leaseTTL string
}

func newProcCluster(t *testing.T, endpoint string) *procCluster {
	t.Helper()
	bin := procBinary.Path(t)
	base, err := os.MkdirTemp("", "csicl")
	if err != nil {
		t.Fatal(err)
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
	return &procCluster{t: t, bin: bin, base: base, endpoint: endpoint}
}

// mountsUnder returns the mount points at or below dir.
func mountsUnder(dir string) []string {
	ms, _ := mountinfo.Under(dir)
	return ms
}

// procAgent is one host: `csiactor agent -config FILE` run again after
// each kill on the same data dir and node ID.
type procAgent struct {
	c       *procCluster
	node    string
	dir     string
	dataDir string
	config  string
	addr    string

	mu   sync.Mutex
	runs int
	cmd  *exec.Cmd
	done <-chan struct{}
	cl   *api.Client   // nil while down; guarded by mu
	up   chan struct{} // closed when cl is set; guarded by mu
	logs []string      // stderr files of every run
}

// addAgent writes an agent's config file: short heartbeats and retries, a
// 2 s lease (c.leaseTTL), the TCP listener on a port the kernel picks, and the given
// allocations (YAML list items).
func (c *procCluster) addAgent(node, allocations string) *procAgent {
	c.t.Helper()
	dir := filepath.Join(c.base, node)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		c.t.Fatal(err)
	}
	a := &procAgent{c: c, node: node, dir: dir, dataDir: filepath.Join(dir, "data"), config: filepath.Join(dir, "csiactor.yaml"), up: make(chan struct{})}
	a.addr = "unix://" + filepath.Join(a.dataDir, runtime.APISocketName)
	cfg := fmt.Sprintf(`data_dir: %s
api:
  http_addr: 127.0.0.1:0
log:
  level: info
plugins:
  heartbeat_interval: 500ms
  probe_timeout: 500ms
  rpc_timeout: 20s
  restart_backoff:
    initial: 100ms
    max: 1s
volumes:
  retry:
    initial: 50ms
    max: 1s
store:
  no_sync: true
cluster:
  node_id: %s
  lease_ttl: %s
  etcd:
    endpoints: [%q]
    dial_timeout: 5s
allocations:
%s`, a.dataDir, node, cmp.Or(c.leaseTTL, "2s"), c.endpoint, allocations)
	if err := os.WriteFile(a.config, []byte(cfg), 0o600); err != nil {
		c.t.Fatal(err)
	}
	return a
}

// start runs the agent and waits until its API answers.
func (a *procAgent) start() {
	t := a.c.t
	t.Helper()
	a.mu.Lock()
	a.runs++
	n := a.runs
	a.mu.Unlock()
	stderr := filepath.Join(a.dir, fmt.Sprintf("agent-%d.log", n))
	f, err := os.Create(stderr)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(a.c.bin, "agent", "-config", a.config)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), "GORACE=halt_on_error=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	done, err := testbin.Start(t, cmd, nil)
	f.Close()
	if err != nil {
		t.Fatalf("start agent %s: %v", a.node, err)
	}
	cl, err := api.NewClient(a.addr)
	if err != nil {
		t.Fatal(err)
	}
	testbin.Eventually(t, a.node+" answers on its API", procDeadline, 20*time.Millisecond, func() (bool, string) {
		if testbin.Closed(done) {
			t.Fatalf("agent %s exited while starting:\n%s", a.node, testbin.Tail(readFile(stderr), 40))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := cl.Health(ctx)
		return err == nil, fmt.Sprint(err)
	})
	a.mu.Lock()
	a.cmd, a.done, a.cl = cmd, done, cl
	a.logs = append(a.logs, stderr)
	close(a.up)
	a.mu.Unlock()
}

// client returns the API client of the running agent, waiting while it is
// down; nil after ctx ends. An agent is marked down before it is killed,
// so a request that failed in a kill gets the next run's client.
func (a *procAgent) client(ctx context.Context) *api.Client {
	for {
		a.mu.Lock()
		cl, up := a.cl, a.up
		a.mu.Unlock()
		if cl != nil {
			return cl
		}
		select {
		case <-up:
		case <-ctx.Done():
			return nil
		}
	}
}

// down marks the agent down for its clients and returns its process.
func (a *procAgent) down() (*exec.Cmd, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cl != nil {
		a.cl.Close()
	}
	a.cl, a.up = nil, make(chan struct{})
	return a.cmd, a.done
}

// kill SIGKILLs the agent and waits until it is gone.
func (a *procAgent) kill() {
	t := a.c.t
	t.Helper()
	cmd, done := a.down()
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("kill %s: %v", a.node, err)
	}
	select {
	case <-done:
	case <-time.After(procDeadline):
		t.Fatalf("agent %s did not die", a.node)
	}
}

// stop sends SIGTERM and waits for a clean exit; it returns the time
// from the signal to the exit.
func (a *procAgent) stop() time.Duration {
	t := a.c.t
	t.Helper()
	cmd, done := a.down()
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s: %v", a.node, err)
	}
	var took time.Duration
	select {
	case <-done:
		took = time.Since(start)
	case <-time.After(procDeadline):
		t.Fatalf("agent %s did not exit on SIGTERM", a.node)
	}
	if !cmd.ProcessState.Success() {
		t.Errorf("agent %s exited with %s on SIGTERM:\n%s", a.node, cmd.ProcessState, testbin.Tail(a.lastLog(), 40))
	}
	return took
}

func (a *procAgent) lastLog() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.logs) == 0 {
		return ""
	}
	return readFile(a.logs[len(a.logs)-1])
}

// checkLogs fails the test if any run of the agent reported a data race,
// and shows the tail of each run's log when the test failed.
func (a *procAgent) checkLogs() {
	t := a.c.t
	t.Helper()
	a.mu.Lock()
	logs := append([]string(nil), a.logs...)
	a.mu.Unlock()
	for i, p := range logs {
		l := readFile(p)
		if j := strings.Index(l, "WARNING: DATA RACE"); j >= 0 {
			t.Errorf("agent %s run %d reported a data race:\n%s", a.node, i+1, l[j:])
		}
		if t.Failed() {
			t.Logf("agent %s run %d log (tail):\n%s", a.node, i+1, testbin.Tail(l, 30))
		}
	}
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// mustClient returns the client of a running agent.
func (a *procAgent) mustClient() *api.Client {
	a.c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), procDeadline)
	defer cancel()
	cl := a.client(ctx)
	if cl == nil {
		a.c.t.Fatalf("agent %s is not up", a.node)
	}
	return cl
}
