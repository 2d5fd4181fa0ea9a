package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

func TestMain(m *testing.M) {
	if os.Getenv(scaleJoinEnv) != "" {
		os.Exit(scaleJoinChild())
	}
	code := leakcheck.Run(m)
	procBinary.Remove() // built by the process-level tests (proc_test.go)
	os.Exit(code)
}

// waitLimit bounds every wait for something that happens in the
// background; a safety net against a hung test, not a speed assertion.
const waitLimit = 30 * time.Second

const testPlugin = "fake"

// shortDir returns a new directory removed when t ends (t.TempDir paths
// are too long for unix sockets).
func shortDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// eventually calls cond until it returns true, failing t on its error or
// after waitLimit.
func eventually(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	waitFor(t, what, waitLimit, 10*time.Millisecond, cond)
}

// waitFor calls cond every interval until it returns true, failing t on
// its error or after limit.
func waitFor(t testing.TB, what string, limit, every time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %s", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s after %s", what, limit)
		}
		time.Sleep(every)
	}
}

// agent is one runtime of a test cluster, with its own data dir, node ID
// and fake plugin (a monolith allocation "plugin-<node>").
type agent struct {
	t    testing.TB
	node string
	cfg  runtime.Config
	reg  *prometheus.Registry
	rt   *runtime.Runtime
	// plugin is the agent's fake plugin.
	plugin *fakeplugin.Plugin
}

// clusterConfig is a runtime config for node in cluster mode on endpoint:
// fast heartbeats and retries, store sync off, a 5 s lease (tests of a
// lease's expiry set a shorter one: a 2 s lease can lapse on a loaded
// machine, and tests that expect no etcd outage would see one).
//
// Every agent has the same secrets.key_file (32 bytes of 42), which seals
// the secrets in etcd and the stores: cluster mode refuses literal secrets
// without one.
func clusterConfig(t testing.TB, node, endpoint string) runtime.Config {
	backoff := runtime.BackoffConfig{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2}
	keyFile := filepath.Join(shortDir(t, "csiactor-key-"), "secrets.key")
	if err := os.WriteFile(keyFile, bytes.Repeat([]byte{42}, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	return runtime.Config{
		Secrets: &runtime.SecretsConfig{KeyFile: keyFile},
		DataDir: shortDir(t, "csiactor-cl-"),
		API:     runtime.APIConfig{HTTPAddr: "127.0.0.1:0"},
		Plugins: runtime.PluginsConfig{
			HeartbeatInterval: 500 * time.Millisecond,
			ProbeTimeout:      500 * time.Millisecond,
			RPCTimeout:        10 * time.Second,
			KillTimeout:       2 * time.Second,
			RestartBackoff:    backoff,
		},
		Volumes: runtime.VolumesConfig{Retry: backoff},
		Store:   runtime.StoreConfig{NoSync: true},
		Host:    runtime.HostConfig{SkipMountCheck: true},
		Cluster: &runtime.ClusterConfig{
			NodeID:   node,
			Etcd:     runtime.EtcdConfig{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second},
			LeaseTTL: 5 * time.Second,
		},
	}
}

// startAgent starts a runtime for node on endpoint with a fake plugin
// attached; it is shut down when t ends.
func startAgent(t testing.TB, node, endpoint string) *agent {
	t.Helper()
	return startAgentWith(t, node, clusterConfig(t, node, endpoint))
}

// startAgentWith is startAgent with cfg.
func startAgentWith(t testing.TB, node string, cfg runtime.Config) *agent {
	t.Helper()
	a := &agent{t: t, node: node, cfg: cfg}
	a.start()
	p, ep := fakeplugin.Start(t, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, NodeID: "csi-" + node})
	a.plugin = p
	if _, err := a.rt.RegisterAllocation(context.Background(), "plugin-"+node, runtime.AllocationSpec{
		Plugin: testPlugin, Type: runtime.TypeMonolith, Socket: ep[len("unix://"):],
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := a.rt.WaitHealthy(ctx, testPlugin, runtime.TypeMonolith); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *agent) start() {
	a.t.Helper()
	a.reg = prometheus.NewRegistry()
	rt, err := runtime.New(a.cfg, runtime.Options{Registerer: a.reg})
	if err != nil {
		a.t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		a.t.Fatal(err)
	}
	a.rt = rt
	a.t.Cleanup(func() { _ = rt.Shutdown(context.Background()) })
}

func (a *agent) stop() {
	a.t.Helper()
	if err := a.rt.Shutdown(context.Background()); err != nil {
		a.t.Fatal(err)
	}
}

// waitVolume waits until volume id is registered on a.
func (a *agent) waitVolume(id string) {
	a.t.Helper()
	eventually(a.t, fmt.Sprintf("volume %s on %s", id, a.node), func() (bool, error) {
		_, err := a.rt.Volume(context.Background(), id)
		if errors.Is(err, runtime.ErrNotFound) {
			return false, nil
		}
		return err == nil, err
	})
}

// waitFreed waits until a has no claim or past claim of alloc on vol.
func (a *agent) waitFreed(vol, alloc string) {
	a.t.Helper()
	eventually(a.t, fmt.Sprintf("claim of %s on %s freed on %s", alloc, vol, a.node), func() (bool, error) {
		v, err := a.rt.Volume(context.Background(), vol)
		if err != nil {
			return false, err
		}
		for _, c := range append(v.Claims, v.PastClaims...) {
			if c.Alloc == alloc {
				return false, nil
			}
		}
		return true, nil
	})
}

func volSpec(id, accessMode string) runtime.VolumeSpec {
	return runtime.VolumeSpec{
		Plugin:       testPlugin,
		ExternalID:   "ext-" + id,
		Capabilities: []runtime.Capability{{AccessMode: accessMode, AttachmentMode: "file-system"}},
	}
}

func claimReq(alloc, mode, accessMode string) runtime.ClaimRequest {
	return runtime.ClaimRequest{Alloc: alloc, Mode: mode, AccessMode: accessMode, AttachmentMode: "file-system"}
}

// proxy forwards TCP connections to target until blocked: then it drops
// every connection it carries and holds new ones open without forwarding
// a byte (a partition, not a refusal).
type proxy struct {
	l      net.Listener
	target string

	mu      sync.Mutex
	blocked bool                  // guarded by mu
	frozen  bool                  // guarded by mu
	conns   map[net.Conn]struct{} // guarded by mu
	wg      sync.WaitGroup
}

func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Endpoint returns the proxy's URL.
func (p *proxy) Endpoint() string { return "http://" + p.l.Addr().String() }

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			_ = c.Close()
			return
		}
		p.mu.Lock()
		blocked := p.blocked
		p.mu.Unlock()
		if blocked {
			continue // held open, never answered, closed by unblock or close
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(u) {
			_ = u.Close()
			_ = c.Close()
			return
		}
		p.wg.Add(2)
		go p.pipe(c, u)
		go p.pipe(u, c)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.isFrozen() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
}

func (p *proxy) isFrozen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.frozen
}

// freeze starts a silent partition: the connections stay open, and what
// either side sends is dropped (as when a network drops packets, the
// client's connection looks up until its keepalive gives up); new
// connections are held as by block.
func (p *proxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen, p.blocked = true, true
}

// dropAll closes every connection; p.mu is held.
func (p *proxy) dropAllLocked() {
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// block starts the partition.
func (p *proxy) block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = true
	p.dropAllLocked()
}

// unblock ends it: held connections are closed, so clients dial again.
func (p *proxy) unblock() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked, p.frozen = false, false
	p.dropAllLocked()
}

func (p *proxy) close() {
	_ = p.l.Close()
	p.mu.Lock()
	p.dropAllLocked()
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
