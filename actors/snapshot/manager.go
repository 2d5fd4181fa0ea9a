package snapshot

import (
	"context"
	"fmt"
	"github.com/csiactor/csiactor/internal/kinderr"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/persistence"
)

// Store is what the snapshot manager needs from the store;
// *persistence.Store implements it.
type Store interface {
	PutSnapshot(ctx context.Context, sn persistence.Snapshot) error
	DeleteSnapshot(ctx context.Context, id string) error
	Snapshots(ctx context.Context) ([]persistence.Snapshot, error)
}

// Volumes tells the snapshot manager about registered volumes.
type Volumes interface {
	// Source returns the plugin and the plugin's ID of the registered
	// volume id; found is false when no volume id is registered.
	Source(ctx context.Context, id string) (plugin, externalID string, found bool, err error)
}

// Manager runs the snapshot actor. All methods are safe for concurrent
// use; the blocking ones take a context first and return its error when it
// ends first (a create or delete under way goes on: ask again to learn
// the outcome). Call Start once before anything else, and Shutdown at the
// end.
type Manager struct {
	cfg     Config
	log     *logrus.Entry
	root    *actor.RootContext
	store   Store
	volumes Volumes
	plugins claim.Plugins
	runner  *claim.Runner
	sup     *actorkit.Supervisor
	// hook, when set, is called at every point where a crash matters; a
	// binary built with the crashpoints tag sets it from CrashPointEnv.
	hook func(point, snapshot string)

	// holds counts the restores under way, by snapshot. Only the
	// snapshot actor touches it; it lives here so that it survives the
	// actor's restart.
	holds map[string]int

	mu      sync.Mutex
	pid     *actor.PID    // guarded by mu; set by Start
	stopped chan struct{} // closed when the actor has stopped for good
	closed  bool          // guarded by mu

	shutdownOnce sync.Once
}

// NewManager returns a Manager that spawns its actor from root. store,
// volumes and plugins are required.
func NewManager(root *actor.RootContext, cfg Config, store Store, volumes Volumes, plugins claim.Plugins) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if root == nil || store == nil || volumes == nil || plugins == nil {
		return nil, kinderr.Errorf(ErrInvalid, "root, store, volumes and plugins are required")
	}
	log := cfg.Logger
	if log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		log = logrus.NewEntry(l)
	}
	m := &Manager{
		cfg: cfg, log: log, root: root, store: store, volumes: volumes, plugins: plugins,
		hook:    crashHook(),
		holds:   map[string]int{},
		stopped: make(chan struct{}),
	}
	m.runner = claim.NewRunner(plugins, claim.RunnerConfig{
		MaxInFlightPerPlugin: cfg.MaxInFlightPerPlugin,
		RetryMetrics:         cfg.RetryMetrics,
		Logger:               log,
	})
	var err error
	if m.sup, err = actorkit.NewSupervisor("snapshot", cfg.Restart, log, cfg.Restarts, actorkit.Hooks{}); err != nil {
		return nil, kinderr.Errorf(ErrInvalid, "%w", err)
	}
	return m, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Start spawns the snapshot actor, which loads every record and resumes
// the creates and deletes that were under way. It returns once the
// records are loaded; the resumed RPCs run on in the background.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrShutdown
	}
	if m.pid != nil {
		return kinderr.Errorf(ErrInvalid, "Start called twice")
	}
	loaded := make(chan error, 1)
	props := actor.PropsFromProducer(func() actor.Actor { return newSnapActor(m, loaded) }, actor.WithGuardian(m.sup))
	m.pid = m.root.SpawnPrefix(props, "snapshots-")
	select {
	case err := <-loaded:
		if err != nil {
			return fmt.Errorf("load snapshots: %w", err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// faultPoint calls the test hook with the point prefix+name.
func (m *Manager) faultPoint(prefix, name, id string) {
	if m.hook != nil {
		m.hook(prefix+name, id)
	}
}

// ask sends the request mk builds to the actor and waits for the reply.
func (m *Manager) ask(ctx context.Context, mk func(chan<- reply) any) (reply, error) {
	m.mu.Lock()
	pid, closed := m.pid, m.closed
	m.mu.Unlock()
	switch {
	case closed:
		return reply{}, ErrShutdown
	case pid == nil:
		return reply{}, kinderr.Errorf(ErrInvalid, "snapshot manager not started")
	}
	ch := make(chan reply, 1)
	m.root.Send(pid, mk(ch))
	select {
	case r := <-ch:
		return r, r.err
	case <-ctx.Done():
		return reply{}, ctx.Err()
	case <-m.stopped:
		select {
		case r := <-ch:
			return r, r.err
		default:
			return reply{}, ErrShutdown
		}
	}
}

// Create takes a snapshot of the registered volume spec.SourceVolume
// (CreateSnapshot, named spec.ID, so a retried Create finds the same
// snapshot) and returns it once the plugin says it is ready to use. The
// snapshot is recorded before the first RPC: an agent that crashes
// meanwhile finishes it when it starts again. Creating the same spec again
// returns the snapshot (or waits for it); another spec under the same ID
// is ErrConflict.
//
// It fails with ErrNotFound (naming source_volume) for a volume that is
// not registered, with ErrInvalid for a volume of another plugin or a
// plugin whose controller has no CREATE_DELETE_SNAPSHOT capability, with
// ErrPluginUnavailable when the plugin has no usable controller, and with
// ErrPluginCall, wrapping the plugin's error, when the plugin refused it
// for good (the record is then gone).
func (m *Manager) Create(ctx context.Context, spec Spec) (Snapshot, error) {
	if err := spec.validate(); err != nil {
		return Snapshot{}, err
	}
	plugin, ext, found, err := m.volumes.Source(ctx, spec.SourceVolume)
	switch {
	case err != nil:
		return Snapshot{}, fmt.Errorf("source_volume: %w", err)
	case !found:
		return Snapshot{}, kinderr.Errorf(ErrNotFound, "source_volume: volume %q not found", spec.SourceVolume)
	case plugin != spec.Plugin:
		return Snapshot{}, kinderr.Errorf(ErrInvalid, "source_volume: volume %q is of plugin %q, not %q", spec.SourceVolume, plugin, spec.Plugin)
	}
	if err := m.checkCapability(ctx, spec.Plugin, "plugin"); err != nil {
		return Snapshot{}, err
	}
	r, err := m.ask(ctx, func(ch chan<- reply) any { return &createRequest{spec: spec, sourceExt: ext, reply: ch} })
	if err != nil {
		return Snapshot{}, err
	}
	return r.snap, nil
}

// checkCapability fails unless plugin's controller has
// CREATE_DELETE_SNAPSHOT; field names the request field it answers for.
func (m *Manager) checkCapability(ctx context.Context, plugin, field string) error {
	_, f, err := m.plugins.Client(ctx, plugin, claim.ControllerPlugin)
	if err != nil {
		return kinderr.Errorf(ErrPluginUnavailable, "plugin %q (controller): %w", plugin, err)
	}
	if !f.CreateDeleteSnapshot {
		return kinderr.Errorf(ErrInvalid, "%s: plugin %q cannot take or restore snapshots (no CREATE_DELETE_SNAPSHOT capability)", field, plugin)
	}
	return nil
}

// Delete deletes snapshot id through its plugin's controller
// (DeleteSnapshot; a snapshot the plugin no longer has counts as deleted)
// and forgets it. It is recorded as deleting before the first RPC and
// finished after a crash. It fails with ErrNotFound for an unknown
// snapshot, with ErrConflict while a volume is being restored from it or
// while it is being created, and with ErrPluginCall when the plugin
// refused it for good (the snapshot then stays, ready).
func (m *Manager) Delete(ctx context.Context, id string) error {
	if err := claim.CheckName("id", id); err != nil {
		return err
	}
	_, err := m.ask(ctx, func(ch chan<- reply) any { return &deleteRequest{id: id, reply: ch} })
	return err
}

// Get returns snapshot id, or an error wrapping ErrNotFound.
func (m *Manager) Get(ctx context.Context, id string) (Snapshot, error) {
	if err := claim.CheckName("id", id); err != nil {
		return Snapshot{}, err
	}
	r, err := m.ask(ctx, func(ch chan<- reply) any { return &getRequest{id: id, reply: ch} })
	if err != nil {
		return Snapshot{}, err
	}
	return r.snap, nil
}

// List returns the snapshots f matches, by ID.
func (m *Manager) List(ctx context.Context, f Filter) ([]Snapshot, error) {
	r, err := m.ask(ctx, func(ch chan<- reply) any { return &listRequest{filter: f, reply: ch} })
	if err != nil {
		return nil, err
	}
	return r.list, nil
}

// Hold takes snapshot id for a restore into a volume of plugin: it must
// be recorded here (ErrNotFound), of plugin (ErrInvalid) and ready
// (ErrConflict), and plugin's controller must have CREATE_DELETE_SNAPSHOT
// (ErrInvalid). Errors name content_source.snapshot. It returns the
// plugin's ID of the snapshot, and release, which must be called once the
// restore has ended; until then Delete refuses the snapshot.
func (m *Manager) Hold(ctx context.Context, id, plugin string) (externalID string, release func(), err error) {
	if err := claim.CheckName("content_source.snapshot", id); err != nil {
		return "", nil, err
	}
	if err := m.checkCapability(ctx, plugin, "content_source.snapshot"); err != nil {
		return "", nil, err
	}
	r, err := m.ask(ctx, func(ch chan<- reply) any { return &holdRequest{id: id, plugin: plugin, reply: ch} })
	if err != nil {
		return "", nil, err
	}
	var once sync.Once
	m.mu.Lock()
	pid := m.pid
	m.mu.Unlock()
	return r.snap.ExternalID, func() {
		once.Do(func() { m.root.Send(pid, &unholdRequest{id: id}) })
	}, nil
}

// Shutdown stops the actor and waits for it and the goroutines it owns;
// creates and deletes under way resume on the next Start. It is
// idempotent. It returns ctx's error if ctx ends first.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.shutdownOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		pid := m.pid
		m.mu.Unlock()
		m.sup.Close()
		if pid == nil {
			close(m.stopped)
			return
		}
		m.root.Stop(pid)
	})
	select {
	case <-m.stopped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
