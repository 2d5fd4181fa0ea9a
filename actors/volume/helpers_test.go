package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/persistence"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	leakcheck.VerifyTestMain(m)
}

const testPlugin = "fake"

// countingClient wraps a csi.Client and records the most RPCs that were in
// flight at once.
type countingClient struct {
	csi.Client
	cur, max atomic.Int64
}

func (c *countingClient) enter() func() {
	n := c.cur.Add(1)
	for {
		m := c.max.Load()
		if n <= m || c.max.CompareAndSwap(m, n) {
			break
		}
	}
	return func() { c.cur.Add(-1) }
}

func (c *countingClient) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) error {
	defer c.enter()()
	return c.Client.NodePublishVolume(ctx, req)
}

func (c *countingClient) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) error {
	defer c.enter()()
	return c.Client.NodeStageVolume(ctx, req)
}

// testPlugins is a hand-written Plugins: one monolith plugin behind one
// client, with a health switch.
type testPlugins struct {
	client *countingClient
	facts  claim.Facts

	mu      sync.Mutex
	down    bool          // guarded by mu
	up      chan struct{} // guarded by mu; closed while healthy
	clients atomic.Int64  // Client calls
	// cachedHits counts CachedClient answers (cachedTestPlugins only).
	cachedHits atomic.Int64
}

func newTestPlugins(c csi.Client, f claim.Facts) *testPlugins {
	up := make(chan struct{})
	close(up)
	return &testPlugins{client: &countingClient{Client: c}, facts: f, up: up}
}

var errDown = errors.New("test: plugin down")

func (p *testPlugins) Client(_ context.Context, plugin string, _ claim.PluginType) (csi.Client, claim.Facts, error) {
	p.clients.Add(1)
	if plugin != testPlugin {
		return nil, claim.Facts{}, fmt.Errorf("unknown plugin %q", plugin)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return nil, claim.Facts{}, errDown
	}
	return p.client, p.facts, nil
}

func (p *testPlugins) WaitHealthy(ctx context.Context, _ string, _ claim.PluginType) error {
	p.mu.Lock()
	up := p.up
	p.mu.Unlock()
	select {
	case <-up:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// cachedTestPlugins is testPlugins as a claim.CachedPlugins: it answers
// CachedClient from memory while the plugin is up.
type cachedTestPlugins struct{ *testPlugins }

var _ claim.CachedPlugins = cachedTestPlugins{}

func (p cachedTestPlugins) CachedClient(plugin string, _ claim.PluginType) (csi.Client, claim.Facts, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down || plugin != testPlugin {
		return nil, claim.Facts{}, false
	}
	p.cachedHits.Add(1)
	return p.client, p.facts, true
}

func (p *testPlugins) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if down == p.down {
		return
	}
	p.down = down
	if down {
		p.up = make(chan struct{})
	} else {
		close(p.up)
	}
}

// env is a manager on a real bbolt store and a real fake plugin socket.
type env struct {
	t       testing.TB
	dataDir string
	store   *persistence.Store
	plugin  *fakeplugin.Plugin
	client  csi.Client
	plugins *testPlugins
	system  *actor.ActorSystem
	reg     *prometheus.Registry
	m       *Manager
	cfg     Config
	hook    func(point, volume string)
	root    string      // parent of the data dir; "" is os.TempDir
	durable bool        // fsync on commit
	cached  bool        // the manager gets cachedTestPlugins
	dbDir   string      // directory of the store file; "" is the data dir
	facts   claim.Facts // the plugin's facts when it is not a fake plugin
	// storeReg receives the store's metrics; nil registers none.
	storeReg prometheus.Registerer

	closeOnce sync.Once
}

type envOpt func(*env)

func withConfig(f func(*Config)) envOpt { return func(e *env) { f(&e.cfg) } }
func withHook(h func(point, volume string)) envOpt {
	return func(e *env) { e.hook = h }
}
func withRoot(dir string) envOpt { return func(e *env) { e.root = dir } }

// withCachedPlugins gives the manager plugins that answer CachedClient, so
// new claims take the path without a lookup goroutine.
func withCachedPlugins() envOpt { return func(e *env) { e.cached = true } }

// withFacts gives the facts of a plugin that is not a fake plugin.
func withFacts(f claim.Facts) envOpt { return func(e *env) { e.facts = f } }

// withDurableStore turns fsync on (tests run with it off) and keeps the
// store file in dbDir ("" for the data dir).
func withDurableStore(dbDir string) envOpt {
	return func(e *env) { e.durable, e.dbDir = true, dbDir }
}

// fullPlugin is a monolith with every step: controller publish and staging.
var fullPlugin = fakeplugin.Config{ControllerPublish: true, CreateDelete: true, StageUnstage: true}

func quietLogger() *logrus.Entry {
	l := logrus.New()
	l.Out = discardWriter{}
	if os.Getenv("CSIACTOR_TEST_LOG") != "" {
		l.Out = os.Stderr
		l.Level = logrus.DebugLevel
	}
	return logrus.NewEntry(l)
}

type discardWriter struct{}

func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }

func testConfig(dataDir string) Config {
	return Config{
		DataDir:     dataDir,
		Backoff:     csi.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond, Multiplier: 2},
		IdleTimeout: -1,
		Restart:     actorkit.BackoffConfig{Initial: time.Millisecond, Max: 10 * time.Millisecond, MaxFailures: 50, Window: time.Minute},
	}
}

func newEnv(t testing.TB, pc fakeplugin.Config, opts ...envOpt) *env {
	t.Helper()
	var probe env
	for _, o := range opts {
		o(&probe)
	}
	dir, err := os.MkdirTemp(probe.root, "csivol-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	plugin, endpoint := fakeplugin.Start(t, pc)
	return newEnvWith(t, dir, plugin, endpoint, opts...)
}

// newEnvWith starts a manager with its data dir in dir, talking to the
// plugin at endpoint: plugin, or another one (plugin nil; the facts then
// come from withFacts).
func newEnvWith(t testing.TB, dir string, plugin *fakeplugin.Plugin, endpoint string, opts ...envOpt) *env {
	t.Helper()
	e := &env{t: t, dataDir: dir, plugin: plugin, cfg: testConfig(dir)}
	for _, o := range opts {
		o(e)
	}
	dbDir := e.dbDir
	if dbDir == "" {
		dbDir = dir
	}
	store, err := persistence.Open(filepath.Join(dbDir, "state.db"), persistence.Config{NoSync: !e.durable, Registerer: e.storeReg})
	if err != nil {
		t.Fatal(err)
	}
	e.store = store
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := csi.Dial(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	e.client = client
	facts := e.facts
	if plugin != nil {
		pcfg := plugin.Config()
		facts = claim.Facts{
			NodeID:                   pcfg.NodeID,
			ControllerRequired:       pcfg.ControllerPublish,
			StageUnstage:             pcfg.StageUnstage,
			ControllerService:        pcfg.Controller,
			ControllerExpand:         pcfg.ControllerExpand,
			NodeExpand:               pcfg.NodeExpand,
			OnlineExpansion:          (pcfg.ControllerExpand || pcfg.NodeExpand) && !pcfg.OfflineExpansion,
			OfflineExpansion:         pcfg.OfflineExpansion,
			Topology:                 pcfg.Topology,
			MaxVolumesPerNode:        pcfg.MaxVolumesPerNode,
			AccessibilityConstraints: len(pcfg.Topology) > 0,
			VolumeStats:              pcfg.VolumeStats,
			NodeCondition:            pcfg.VolumeStats && pcfg.NodeCondition,
			NodeHealth:               pcfg.VolumeHealth,
			ControllerCondition:      pcfg.GetVolume && pcfg.ControllerCondition,
			ControllerHealth:         pcfg.VolumeHealth && pcfg.Controller,
			ControllerModify:         pcfg.ControllerModify,
		}
	}
	e.plugins = newTestPlugins(client, facts)
	e.system = actorkit.NewSystem(quietLogger())
	e.startManager()
	t.Cleanup(e.close)
	return e
}

func (e *env) startManager() {
	e.t.Helper()
	if e.cfg.Logger == nil {
		e.cfg.Logger = quietLogger()
	}
	e.startManagerWithLogger()
}

func (e *env) startManagerWithLogger() {
	e.t.Helper()
	e.reg = prometheus.NewRegistry()
	cfg := e.cfg
	cfg.Registerer = e.reg
	var plugins Plugins = e.plugins
	if e.cached {
		plugins = cachedTestPlugins{e.plugins}
	}
	m, err := NewManager(e.system.Root, cfg, e.store, plugins)
	if err != nil {
		e.t.Fatal(err)
	}
	m.hook = e.hook
	if err := m.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.m = m
}

// restart shuts the manager down and starts a new one on the same store.
func (e *env) restart() {
	e.t.Helper()
	if err := e.m.Shutdown(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.startManager()
}

func (e *env) close() { e.closeOnce.Do(e.closeNow) }

func (e *env) closeNow() {
	if e.m != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := e.m.Shutdown(ctx); err != nil {
			e.t.Errorf("shutdown: %s", err)
		}
	}
	_ = e.client.Close()
	_ = e.store.Close()
	e.system.Shutdown()
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func fsCap(am csi.AccessMode) csi.VolumeCapability {
	return csi.VolumeCapability{AccessMode: am, AttachmentMode: csi.AttachmentModeFileSystem}
}

func spec(id string, caps ...csi.VolumeCapability) Spec {
	if len(caps) == 0 {
		caps = []csi.VolumeCapability{fsCap(csi.AccessModeSingleNodeWriter)}
	}
	return Spec{
		ID: id, Plugin: testPlugin, ExternalID: "ext-" + id, Capabilities: caps,
		MountOptions: &csi.MountOptions{FSType: "ext4", MountFlags: []string{"noatime", "password=hunter2"}},
		Context:      map[string]string{"ctx": "1"},
		Secrets:      map[string]string{"token": "s3cr3t"},
	}
}

func (e *env) register(id string, caps ...csi.VolumeCapability) {
	e.t.Helper()
	if _, err := e.m.Register(ctxT(e.t), spec(id, caps...)); err != nil {
		e.t.Fatalf("register %s: %s", id, err)
	}
}

func claimReq(vol, alloc string, mode claim.Mode, am csi.AccessMode) ClaimRequest {
	return ClaimRequest{VolumeID: vol, Alloc: alloc, Mode: mode, AccessMode: am, AttachmentMode: csi.AttachmentModeFileSystem}
}

// waitFor polls cond until it holds, failing the test after 20 s. It is a
// wait, not a timing assertion: nothing depends on how long it takes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitFreed waits until the volume has no past claims left.
func (e *env) waitFreed(id string) Volume {
	e.t.Helper()
	var v Volume
	waitFor(e.t, "past claims of "+id+" freed", func() bool {
		var err error
		v, err = e.m.Get(context.Background(), id)
		if err != nil {
			e.t.Fatalf("get %s: %s", id, err)
		}
		return len(v.PastClaims) == 0
	})
	return v
}

// checkAgree fails the test unless the store and the plugin's own view
// agree: every published target, staging and controller publish the plugin
// has is owned by a claim in the store, and every published claim is
// published on the plugin.
func (e *env) checkAgree() {
	e.t.Helper()
	type want struct{ targets, staged map[string]bool }
	owned := map[string]*want{} // external id → paths owned by claims
	ctrl := map[string]bool{}
	err := e.store.ForEachVolume(context.Background(), func(v persistence.Volume) error {
		w := &want{targets: map[string]bool{}, staged: map[string]bool{}}
		owned[v.ExternalID] = w
		for _, cs := range [][]persistence.Claim{v.Claims, v.PastClaims} {
			for _, c := range cs {
				w.targets[c.TargetPath] = true
				if c.StagingPath != "" {
					w.staged[c.StagingPath] = true
				}
				if c.ControllerRequired {
					ctrl[v.ExternalID] = true
				}
			}
		}
		if v.ControllerPublished {
			ctrl[v.ExternalID] = true
		}
		for _, c := range v.Claims {
			if c.State != claim.StatePublished {
				continue
			}
			found := false
			for _, p := range e.plugin.Published()[v.ExternalID] {
				found = found || p == c.TargetPath
			}
			if !found {
				e.t.Errorf("volume %s: claim of %s is published in the store but not on the plugin", v.ID, c.Alloc)
			}
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	for ext, targets := range e.plugin.Published() {
		for _, p := range targets {
			if w := owned[ext]; w == nil || !w.targets[p] {
				e.t.Errorf("plugin has %s published at %s, owned by no claim", ext, p)
			}
		}
	}
	for ext, p := range e.plugin.Staged() {
		if w := owned[ext]; w == nil || !w.staged[p] {
			e.t.Errorf("plugin has %s staged at %s, owned by no claim", ext, p)
		}
	}
	for ext := range e.plugin.ControllerPublished() {
		if !ctrl[ext] {
			e.t.Errorf("plugin has %s controller-published, owned by no claim", ext)
		}
	}
}

// checkClean fails unless the plugin has nothing published, staged or
// controller-published.
func (e *env) checkClean() {
	e.t.Helper()
	if p := e.plugin.Published(); len(p) > 0 {
		for ext, ts := range p {
			if len(ts) > 0 {
				e.t.Errorf("plugin still has %s published at %v", ext, ts)
			}
		}
	}
	if s := e.plugin.Staged(); len(s) > 0 {
		e.t.Errorf("plugin still has staged: %v", s)
	}
	if c := e.plugin.ControllerPublished(); len(c) > 0 {
		e.t.Errorf("plugin still has controller-published: %v", c)
	}
}

// restartWith restarts the manager with a changed config.
func (e *env) restartWith(f func(*Config)) {
	e.t.Helper()
	if err := e.m.Shutdown(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	f(&e.cfg)
	e.startManagerWithLogger()
}
