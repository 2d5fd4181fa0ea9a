// Command cluster runs a csiactor cluster on this machine: an embedded etcd
// on 127.0.0.1 and three agents (csiactor agent, each with its own data
// dir, node ID, API socket and example plugin) that share it. The example
// plugins share one storage directory (-shared-dir), as the hosts of a
// real cluster share a SAN or a cloud's disks, so a volume created through
// one agent can be claimed through any, and a single-node-writer volume
// claimed on one host is refused (409) on the others. It prints how to
// drive them, and on Ctrl-C (SIGINT or SIGTERM) stops the agents (each
// stops its plugin: plugins.stop_on_agent_exit), then etcd, unmounts what
// is still mounted under its directory and removes it: nothing is left
// behind, and it exits 0, so make reports no error.
//
//	make run-cluster
//	go run ./examples/cluster -bin bin/csiactor [-agents 3]
//
// It links the etcd server, which the agent binary never does.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/csiactor/csiactor/internal/mountinfo"
)

// ReadyLine is what the program prints once everything runs and the
// instructions are out.
const ReadyLine = "Ctrl-C stops everything."

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func run() error {
	bin := flag.String("bin", "bin/csiactor", "the csiactor binary the agents run")
	n := flag.Int("agents", 3, "how many agents to start")
	flag.Parse()
	if *n < 3 || *n > 9 {
		return fmt.Errorf("-agents %d: want 3 to 9 (the demo's commands use three)", *n)
	}
	binPath, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(binPath); err != nil {
		return fmt.Errorf("-bin: %w (run make build first)", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	dir, err := os.MkdirTemp("", "csiactor-cluster-")
	if err != nil {
		return err
	}
	defer cleanDir(dir)
	etcd, endpoint, err := startEtcd(filepath.Join(dir, "etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()
	fmt.Printf("etcd on %s (data in %s)\n\n", endpoint, dir)

	var agents []*agent
	defer func() {
		for _, a := range agents {
			a.stop()
		}
	}()
	for i := 1; i <= *n; i++ {
		a, err := startAgent(ctx, binPath, dir, fmt.Sprintf("node%d", i), endpoint)
		if err != nil {
			return err
		}
		agents = append(agents, a)
	}
	var vars []string
	for i, a := range agents {
		vars = append(vars, fmt.Sprintf("N%d=%s", i+1, a.addr))
	}
	fmt.Printf(`
Drive them with the CLI. The agents' API addresses, for the commands below:

    export %[3]s

A single-node-writer volume, created through node1, claimed for writing on
node2; node3's claim is refused with a 409 naming node2, the holder:

    %[1]s volume create -address $N1 -plugin example -capability single-node-writer demo
    %[1]s volume claim -address $N2 -alloc app -mode write -access-mode single-node-writer demo
    %[1]s volume claim -address $N3 -alloc web -mode write -access-mode single-node-writer demo
    %[1]s volume status -address $N1 demo
    %[1]s node list -address $N1

Release it on node2 and node3 can claim it:

    %[1]s volume release -address $N2 -alloc app demo

The example plugins share their storage (%[2]s/storage); each
agent's log is in %[2]s/<node>.log. Kill an agent (kill -9 PID) to see
its host go down, its claims stay, and "node fence" free them.
%[4]s
`, binPath, dir, strings.Join(vars, " "), ReadyLine)
	select {
	case <-ctx.Done():
	case err := <-etcd.Err():
		return fmt.Errorf("etcd: %w", err)
	}
	fmt.Println("\nstopping the agents and etcd")
	return nil
}

// cleanDir stops the processes still running from dir (the plugin of an
// agent that was killed outlives it, by design), unmounts whatever is still
// mounted under dir (volumes stay published when their agent stops) and
// removes dir.
func cleanDir(dir string) {
	stopProcessesWith(dir)
	mounts, _ := mountinfo.Under(dir)
	sort.SliceStable(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			fmt.Fprintf(os.Stderr, "cluster: unmount %s: %s\n", m, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(os.Stderr, "cluster: %s\n", err)
	}
}

// stopProcessesWith sends SIGTERM to the processes whose command line
// contains dir, and SIGKILL to those still there after 10 s.
func stopProcessesWith(dir string) {
	sig := syscall.SIGTERM
	for i := 0; i < 110; i++ {
		pids := processesWith(dir)
		if len(pids) == 0 {
			return
		}
		if i == 100 {
			sig = syscall.SIGKILL
		}
		if i == 0 || i == 100 {
			for _, pid := range pids {
				_ = syscall.Kill(pid, sig)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// processesWith returns the live processes, other than this one, whose
// command line contains s.
func processesWith(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(strings.ReplaceAll(string(cmdline), "\x00", " "), s) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if i := strings.LastIndexByte(string(stat), ')'); err != nil || i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// startEtcd starts a single-member etcd in dir on two free loopback ports.
func startEtcd(dir string) (*embed.Etcd, string, error) {
	cfg := embed.NewConfig()
	cfg.Name = "csiactor-cluster"
	cfg.Dir = dir
	client, peer, err := freeURL(), freeURL(), error(nil)
	if client.Host == "" || peer.Host == "" {
		return nil, "", errors.New("no free loopback port")
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(time.Minute):
		e.Close()
		return nil, "", errors.New("etcd not ready after a minute")
	}
	return e, client.String(), nil
}

func freeURL() url.URL {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}
}

// agent is one `csiactor agent` process.
type agent struct {
	node string
	addr string // its CSIACTOR_ADDR
	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
}

// agentConfig is node's config: its data dir under dir, the example
// plugin on the shared storage, stopped with the agent.
const agentConfig = `data_dir: %[1]s
api:
  http_addr: 127.0.0.1:0
plugins:
  heartbeat_interval: 2s
  probe_timeout: 1s
  stop_on_agent_exit: true
cluster:
  node_id: %[2]s
  lease_ttl: 5s
  etcd:
    endpoints: [%[3]q]
allocations:
  - id: example
    plugin: example
    type: monolith
    command: [%[4]q, example-plugin, -state-dir, %[5]q, -shared-dir, %[6]q, -node-id, %[2]s]
`

func startAgent(ctx context.Context, bin, dir, node, endpoint string) (*agent, error) {
	nodeDir := filepath.Join(dir, node)
	if err := os.MkdirAll(nodeDir, 0o700); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(nodeDir, "csiactor.yaml")
	cfg := fmt.Sprintf(agentConfig, filepath.Join(nodeDir, "data"), node, endpoint, bin,
		filepath.Join(nodeDir, "plugin"), filepath.Join(dir, "storage"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, node+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "agent", "-config", cfgPath)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	// Its own process group: Ctrl-C in the terminal reaches this program
	// only, which stops the agents in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", node, err)
	}
	a := &agent{node: node, cmd: cmd, done: make(chan struct{})}
	addrc := make(chan string, 1)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "csiactor agent: API on "); ok {
				addrc <- v
			}
		}
		_, _ = io.Copy(logf, out)
	}()
	go func() {
		<-copied // Wait closes the pipe: read it all first
		_ = cmd.Wait()
		logf.Close()
		close(a.done)
	}()
	select {
	case a.addr = <-addrc:
		fmt.Printf("%s: agent pid %d, API %s\n", node, cmd.Process.Pid, a.addr)
		return a, nil
	case <-a.done:
		return nil, fmt.Errorf("%s exited at start; see %s", node, logf.Name())
	case <-ctx.Done():
		a.stop()
		return nil, ctx.Err()
	case <-time.After(time.Minute):
		a.stop()
		return nil, fmt.Errorf("%s did not start within a minute; see %s", node, logf.Name())
	}
}

// stop sends the agent SIGINT (as Ctrl-C would) and waits for it: it then
// stops its plugin. After 30 s it is killed.
func (a *agent) stop() {
	a.once.Do(func() {
		_ = a.cmd.Process.Signal(os.Interrupt)
		select {
		case <-a.done:
		case <-time.After(30 * time.Second):
			_ = a.cmd.Process.Kill()
			<-a.done
		}
	})
}
