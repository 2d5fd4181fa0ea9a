// Command cluster runs a csiactor cluster on this machine: an embedded etcd
// on 127.0.0.1 and three agents (csiactor agent -dev, each with its own
// temporary data dir, node ID, API socket and example plugin) that share
// it. It prints how to drive them, and on Ctrl-C (SIGINT or SIGTERM) stops
// the agents (each removes its data dir and stops its plugin), then etcd,
// and removes etcd's directory: nothing is left behind.
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
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

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
	if *n < 1 || *n > 9 {
		return fmt.Errorf("-agents %d: want 1 to 9", *n)
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
	defer os.RemoveAll(dir)
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
	fmt.Println("Drive them with the CLI, for example:")
	fmt.Println()
	for _, a := range agents {
		fmt.Printf("    export CSIACTOR_ADDR=%s   # %s\n", a.addr, a.node)
	}
	fmt.Printf(`
    %[1]s node list
    %[1]s volume create -plugin example -capability single-node-writer demo
    %[1]s volume claim -alloc app -mode write -access-mode single-node-writer demo
    %[1]s volume status demo

The agents share etcd, not storage: each runs its own example plugin,
which knows only the volumes it created. A volume created through one agent
is offered to all of them, and the others refuse it (their plugin says it
does not exist; their logs say so). Real plugins share the storage.

Each agent's log is in %[2]s/<node>.log. Ctrl-C stops everything.
`, binPath, dir)
	select {
	case <-ctx.Done():
	case err := <-etcd.Err():
		return fmt.Errorf("etcd: %w", err)
	}
	fmt.Println("\nstopping the agents and etcd")
	return nil
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

// agent is one `csiactor agent -dev` process.
type agent struct {
	node string
	addr string // its CSIACTOR_ADDR
	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
}

func startAgent(ctx context.Context, bin, dir, node, endpoint string) (*agent, error) {
	cfgPath := filepath.Join(dir, node+".yaml")
	cfg := fmt.Sprintf("cluster:\n  node_id: %s\n  etcd:\n    endpoints: [%q]\n  lease_ttl: 5s\n", node, endpoint)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, node+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "agent", "-dev", "-config", cfgPath, "-http-addr", "127.0.0.1:0")
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
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "export CSIACTOR_ADDR="); ok {
				addrc <- v
			}
		}
		_, _ = io.Copy(logf, out)
	}()
	go func() {
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

// stop sends the agent SIGINT (as Ctrl-C would) and waits for it: -dev
// then stops its plugin and removes its data dir. After 30 s it is killed.
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
