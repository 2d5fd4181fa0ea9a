package partition

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/cluster"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// Deadlines bound waits for things that take milliseconds to seconds on
// an idle machine; they are generous so that a loaded 2-core machine
// running everything with -race never trips them. They assert no speed.
const (
	deadline     = 2 * time.Minute
	pollInterval = 20 * time.Millisecond
)

// leaseTTL is the agents' cluster.lease_ttl: short, so that a cut agent's
// lease expires within seconds.
const leaseTTL = 3 * time.Second

// testCluster is one test's machines: three etcd members and three
// agents, each in its own network namespace, with everything they keep in
// a base dir under /tmp (short: unix socket paths).
type testCluster struct {
	t       *testing.T
	net     *network
	bin     string
	base    string
	members []*member
	agents  []*agent
	// hostpath is the kubernetes-csi hostpath driver each agent also
	// runs, or "" where $CSIACTOR_HOSTPATH_PLUGIN is unset.
	hostpath string
}

// member is one etcd member: the test binary in member mode (see
// runMember) in its namespace, and a client of it on its unix socket.
type member struct {
	name, addr, dir string
	cli             *clientv3.Client
}

// agent is `csiactor agent` in its namespace, with the example plugin on
// the shared storage (and the hostpath driver), and its API client.
type agent struct {
	node, dir, dataDir, hpState, log string
	cmd                              *exec.Cmd
	done                             <-chan struct{}
	cl                               *api.Client
}

// newCluster makes the network, starts the members and the agents, and
// registers the cleanups (in reverse: agents, plugins and members killed,
// mounts under base unmounted, base removed, namespaces deleted).
func newCluster(t *testing.T) *testCluster {
	t.Helper()
	nw := newNetwork(t)
	c := &testCluster{t: t, net: nw, bin: binary.Path(t)}
	if p := os.Getenv(hostpath.Env); p != "" {
		c.hostpath = hostpath.Binary(t)
	} else {
		t.Logf("the hostpath driver is not available ($%s unset): the agents run the example plugin only", hostpath.Env)
	}
	base, err := os.MkdirTemp("", "csipt")
	if err != nil {
		t.Fatal(err)
	}
	c.base = base
	testbin.CleanupDir(t, base)
	c.startMembers(3)
	for i := 1; i <= 3; i++ {
		c.agents = append(c.agents, c.startAgent(fmt.Sprintf("n%d", i), 20+i))
	}
	return c
}

// startMembers starts n members together (each waits for the others to
// be ready) and dials each on its unix socket.
func (c *testCluster) startMembers(n int) {
	t := c.t
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var peers []string
	for i := 1; i <= n; i++ {
		m := &member{name: fmt.Sprintf("m%d", i)}
		m.addr = c.net.addHost(m.name, 10+i)
		m.dir = filepath.Join(c.base, m.name)
		peers = append(peers, fmt.Sprintf("%s=http://%s:2380", m.name, m.addr))
		c.members = append(c.members, m)
	}
	var outs []string
	for _, m := range c.members {
		if err := os.MkdirAll(m.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		mc, _ := json.Marshal(memberConfig{Name: m.name, Dir: filepath.Join(m.dir, "data"), Addr: m.addr,
			Socket: filepath.Join(m.dir, "client.sock"), Cluster: strings.Join(peers, ",")})
		out := filepath.Join(m.dir, "member.log")
		f, err := os.Create(out)
		if err != nil {
			t.Fatal(err)
		}
		// The base dir in the command line: the cleanup finds it.
		cmd := c.net.command(m.name, self, "partition-member", m.dir)
		cmd.Env = append(os.Environ(), memberEnv+"="+string(mc))
		cmd.Stdout, cmd.Stderr = f, f
		// Its stdin is a pipe that ends when this process does: the
		// member then exits, even if no cleanup ran.
		if _, err := cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if _, err := testbin.Start(t, cmd, nil); err != nil {
			t.Fatalf("start member %s: %v", m.name, err)
		}
		f.Close()
		outs = append(outs, out)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("member %s log:\n%s", m.name, testbin.Tail(readFile(out), 20))
			}
		})
	}
	for i, m := range c.members {
		testbin.Eventually(t, "etcd member "+m.name+" ready", deadline, pollInterval, func() (bool, string) {
			s := readFile(outs[i])
			return strings.Contains(s, "ready\n"), s
		})
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + filepath.Join(m.dir, "client.sock")},
			DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		m.cli = cli
	}
}

// endpoints are the members' client URLs, as the agents reach them.
func (c *testCluster) endpoints() string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, fmt.Sprintf("%q", "http://"+m.addr+":2379"))
	}
	return strings.Join(eps, ", ")
}

// startAgent starts node's agent in its own namespace (address
// subnet.<octet>) and waits until its plugins are healthy.
func (c *testCluster) startAgent(node string, octet int) *agent {
	t := c.t
	t.Helper()
	c.net.addHost(node, octet)
	a := &agent{node: node, dir: filepath.Join(c.base, node)}
	a.dataDir = filepath.Join(a.dir, "data")
	a.hpState = filepath.Join(a.dir, "hostpath")
	a.log = filepath.Join(a.dir, "agent.log")
	if err := os.MkdirAll(a.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	allocs := fmt.Sprintf(`  - id: example
    plugin: example
    type: monolith
    command: [%q, example-plugin, -state-dir, %q, -shared-dir, %q, -node-id, %s]
`, c.bin, filepath.Join(a.dir, "example"), filepath.Join(c.base, "storage"), node)
	if c.hostpath != "" {
		cmd, _ := json.Marshal(hostpath.Command(c.hostpath, node, a.hpState))
		allocs += fmt.Sprintf("  - id: hostpath\n    plugin: %s\n    type: monolith\n    command: %s\n", hostpath.PluginName, cmd)
	}
	// dial_timeout bounds each etcd request too: a request stuck in the
	// partition fails after it, with 503.
	cfg := fmt.Sprintf(`data_dir: %s
api:
  http_addr: 127.0.0.1:0
log:
  level: info
plugins:
  heartbeat_interval: 500ms
  probe_timeout: 500ms
  rpc_timeout: 20s
  stop_on_agent_exit: true
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
    endpoints: [%s]
    dial_timeout: 2s
allocations:
%s`, a.dataDir, node, leaseTTL, c.endpoints(), allocs)
	config := filepath.Join(a.dir, "csiactor.yaml")
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(a.log)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd = c.net.command(node, c.bin, "agent", "-config", config)
	a.cmd.Stdout, a.cmd.Stderr = f, f
	a.cmd.Env = append(os.Environ(), "GORACE=halt_on_error=0")
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	done, err := testbin.Start(t, a.cmd, nil)
	f.Close()
	if err != nil {
		t.Fatalf("start agent %s: %v", node, err)
	}
	a.done = done
	t.Cleanup(func() { a.checkLog(t) })
	if a.cl, err = api.NewClient("unix://" + filepath.Join(a.dataDir, runtime.APISocketName)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.cl.Close)
	plugins := []string{"example"}
	if c.hostpath != "" {
		plugins = append(plugins, hostpath.PluginName)
	}
	testbin.Eventually(t, node+"'s plugins healthy", deadline, pollInterval, func() (bool, string) {
		if testbin.Closed(done) {
			t.Fatalf("agent %s exited while starting:\n%s", node, testbin.Tail(readFile(a.log), 40))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ps, err := a.cl.Plugins(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, name := range plugins {
			if !slices.ContainsFunc(ps, func(p runtime.Plugin) bool { return p.Name == name && p.NodesHealthy > 0 && p.ControllersHealthy > 0 }) {
				return false, fmt.Sprintf("%+v", ps)
			}
		}
		return true, ""
	})
	return a
}

// stop sends SIGTERM and waits for a clean exit.
func (a *agent) stop(t *testing.T) {
	t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s: %v", a.node, err)
	}
	select {
	case <-a.done:
	case <-time.After(deadline):
		t.Fatalf("agent %s did not exit within %s of SIGTERM", a.node, deadline)
	}
	if !a.cmd.ProcessState.Success() {
		t.Errorf("agent %s exited with %s on SIGTERM:\n%s", a.node, a.cmd.ProcessState, testbin.Tail(readFile(a.log), 40))
	}
}

// checkLog fails t if the agent reported a data race, and shows its log's
// tail when t failed.
func (a *agent) checkLog(t *testing.T) {
	l := readFile(a.log)
	if i := strings.Index(l, "WARNING: DATA RACE"); i >= 0 {
		t.Errorf("agent %s reported a data race:\n%s", a.node, l[i:])
	}
	if t.Failed() {
		t.Logf("agent %s log (tail):\n%s", a.node, testbin.Tail(l, 40))
	}
}

// memberStatus asks member m for its status.
func (c *testCluster) memberStatus(ctx context.Context, m *member) (*clientv3.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return m.cli.Status(ctx, m.cli.Endpoints()[0])
}

// leader returns the member every member in ms names as the leader, or
// nil and what they said when they do not agree or have none.
func (c *testCluster) leader(ms ...*member) (*member, string) {
	ids := map[uint64]*member{}
	var leaders []uint64
	var said []string
	for _, m := range ms {
		st, err := c.memberStatus(context.Background(), m)
		if err != nil {
			said = append(said, fmt.Sprintf("%s: %v", m.name, err))
			continue
		}
		ids[st.Header.MemberId] = m
		leaders = append(leaders, st.Leader)
		said = append(said, fmt.Sprintf("%s (%x): leader %x", m.name, st.Header.MemberId, st.Leader))
	}
	if len(leaders) != len(ms) || leaders[0] == 0 || slices.ContainsFunc(leaders, func(l uint64) bool { return l != leaders[0] }) {
		return nil, strings.Join(said, "; ")
	}
	l := ids[leaders[0]]
	if l == nil { // the leader is not among ms: look it up
		for _, m := range c.members {
			if st, err := c.memberStatus(context.Background(), m); err == nil && st.Header.MemberId == leaders[0] {
				l = m
			}
		}
	}
	return l, strings.Join(said, "; ")
}

// waitLeader waits until the members in ms agree on a leader, and returns
// it.
func (c *testCluster) waitLeader(what string, ms ...*member) *member {
	c.t.Helper()
	var l *member
	testbin.Eventually(c.t, what, deadline, pollInterval, func() (bool, string) {
		var said string
		l, said = c.leader(ms...)
		return l != nil, said
	})
	return l
}

// claimsInEtcd returns the claims etcd holds, as "volume: host/alloc",
// read on member m.
func (c *testCluster) claimsInEtcd(m *member) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	prefix := cluster.DefaultPrefix + "/claims/"
	resp, err := m.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	var out []string
	for _, kv := range resp.Kvs {
		var d struct {
			Claims []cluster.HostClaim `json:"claims"`
		}
		if err := json.Unmarshal(kv.Value, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", kv.Key, err)
		}
		for _, hc := range d.Claims {
			out = append(out, fmt.Sprintf("%s: %s/%s", strings.TrimPrefix(string(kv.Key), prefix), hc.Host, hc.Alloc))
		}
	}
	sort.Strings(out)
	return out, nil
}

// aliveWatch records when each host's liveness key is deleted (its lease
// expired on the server) and put again, as member m sees it.
type aliveWatch struct {
	events chan aliveEvent
	cancel context.CancelFunc
}

type aliveEvent struct {
	node    string
	deleted bool
	at      time.Time
}

func (c *testCluster) watchAlive(m *member) *aliveWatch {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &aliveWatch{events: make(chan aliveEvent, 1000), cancel: cancel}
	prefix := cluster.DefaultPrefix + "/alive/"
	wch := m.cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix())
	go func() {
		for resp := range wch {
			at := time.Now()
			for _, ev := range resp.Events {
				select {
				case w.events <- aliveEvent{node: strings.TrimPrefix(string(ev.Kv.Key), prefix), deleted: ev.Type == clientv3.EventTypeDelete, at: at}:
				default:
				}
			}
		}
	}()
	// The watch is established once a write is seen through it: the
	// agents write nothing to their liveness keys while their leases
	// live, so write a probe key under the prefix.
	probe := prefix + "~watch-probe"
	testbin.Eventually(c.t, "the liveness watch on "+m.name, deadline, pollInterval, func() (bool, string) {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		defer pcancel()
		if _, err := m.cli.Put(pctx, probe, "x"); err != nil {
			return false, err.Error()
		}
		select {
		case ev := <-w.events:
			return ev.node == "~watch-probe", fmt.Sprint(ev)
		case <-time.After(500 * time.Millisecond):
			return false, "no event"
		}
	})
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	defer dcancel()
	if _, err := m.cli.Delete(dctx, probe); err != nil {
		c.t.Fatal(err)
	}
	for ev := range w.events {
		if ev.node == "~watch-probe" && ev.deleted {
			break
		}
	}
	return w
}

// drain returns the events seen so far.
func (w *aliveWatch) drain() []aliveEvent {
	var out []aliveEvent
	for {
		select {
		case ev := <-w.events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// mountedFileWorks checks that target is in the mount table, holds file
// with want, and can be written and read back; it returns the new
// content, or an error.
func mountedFileWorks(target, want string) (string, error) {
	ms, err := mountinfo.Read("", target)
	if err != nil {
		return "", err
	}
	if !ms.Has(target) {
		return "", fmt.Errorf("%s is not in the mount table", target)
	}
	p := filepath.Join(target, "data.txt")
	got, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	if string(got) != want {
		return "", fmt.Errorf("%s holds %q, want %q", p, got, want)
	}
	next := want + "+"
	if err := os.WriteFile(p, []byte(next), 0o600); err != nil {
		return "", err
	}
	if got, err := os.ReadFile(p); err != nil || string(got) != next {
		return "", fmt.Errorf("%s read back %q, %v; want %q", p, got, err, next)
	}
	return next, nil
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
