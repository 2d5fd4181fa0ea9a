package volume

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/persistence"
)

// Store is what the volume manager needs from the store; *persistence.Store
// implements it. Volume returns an error wrapping persistence.ErrNotFound
// for an unknown ID. PutVolume returns once the write is durable;
// PutVolumes writes many in one durable commit, all or none;
// PutVolumeDeferred once reads see it (the steps of a claim between its
// durable intent and its durable outcome: a crash may lose them, and
// resuming sends their idempotent calls again).
type Store interface {
	PutVolume(ctx context.Context, v persistence.Volume) error
	PutVolumeDeferred(ctx context.Context, v persistence.Volume) error
	PutVolumes(ctx context.Context, vs []persistence.Volume) error
	Volume(ctx context.Context, id string) (persistence.Volume, error)
	DeleteVolume(ctx context.Context, id string) error
	ForEachVolume(ctx context.Context, fn func(persistence.Volume) error) error
	ForEachVolumeFrom(ctx context.Context, from string, fn func(persistence.Volume) error) error
}

// Plugins gives volumes the CSI clients of plugin singletons; see
// claim.Plugins.
type Plugins = claim.Plugins

// extKey names a plugin's volume: the plugin and the plugin's ID for it.
// One plugin volume is registered under one ID at most, so that the claim
// limits of its access mode hold.
type extKey struct{ plugin, ext string }

func keyOf(v *persistence.Volume) extKey { return extKey{v.Plugin, v.ExternalID} }

// maxResends bounds how often one request is sent again to a volume actor
// whose incarnation ended before it answered.
const maxResends = 5

// Manager runs one actor per volume that has work or was used recently, and
// answers for the others from the store. All methods are safe for
// concurrent use; the blocking ones take a context first and return its
// error when it ends first (the request itself may still complete: every
// request is idempotent, so call again to learn the outcome).
//
// Call Start once before anything else, and Shutdown at the end.
type Manager struct {
	cfg      Config
	log      *logrus.Entry
	root     *actor.RootContext
	store    Store
	plugins  Plugins
	runner   *claim.Runner
	pool     *jobs
	volSup   *actorkit.Supervisor
	claimSup *actorkit.Supervisor

	inflight   prometheus.Gauge
	repairs    *prometheus.CounterVec
	broken     *brokenBook
	collectors []prometheus.Collector

	// stats holds the last usage and condition of the volumes with a
	// published claim; poller polls them (nil when off). See stats.go.
	stats  *statsBook
	poller *statsPoller // set by Start, read by Shutdown after m.closed
	// stalls follows the unfinished claims; stallWatch marks the ones
	// that stall. See stall.go.
	stalls     *stallBook
	stallWatch *stallWatch // set by Start, read by Shutdown after m.closed

	// hook, when set, is called at every point where a crash matters; see
	// crashPoints in the tests. Tests set it; a binary built with the
	// crashpoints tag sets it from CrashPointEnv.
	hook func(point, volume string)

	mu    sync.Mutex
	index map[string]struct{}            // guarded by mu; every registered volume
	byExt map[extKey]string              // guarded by mu; plugin volume → the ID it is registered as
	names map[string]string              // guarded by mu; plugin names of byExt, interned
	live  map[string]*handle             // guarded by mu; volumes with an actor
	inUse map[string]map[string]struct{} // guarded by mu; by plugin: volumes with claims on this host
	// batching holds the new volumes a RegisterBatch is writing; no
	// actor starts for them meanwhile. Guarded by mu.
	batching map[string]struct{}
	started  bool // guarded by mu
	closed   bool // guarded by mu

	countsMu sync.Mutex
	counts   map[countKey]int               // guarded by countsMu
	orphans  map[string]*persistence.Volume // guarded by countsMu; counted records of crashed-out actors
	// repairing holds the volumes with a claim being repaired; guarded
	// by countsMu.
	repairing map[string]struct{}

	actors sync.WaitGroup // one per spawned volume actor, done when it has stopped

	waits *waitSet // callers of ClaimWait, woken when their volume changes

	shutdownOnce sync.Once
	shutdownDone chan struct{}
}

// NewManager returns a Manager that spawns its actors from root. It
// registers its metrics on cfg.Registerer. store and plugins are required.
func NewManager(root *actor.RootContext, cfg Config, store Store, plugins Plugins) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case root == nil:
		return nil, fmt.Errorf("%w: root context is nil", ErrInvalidConfig)
	case store == nil:
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidConfig)
	case plugins == nil:
		return nil, fmt.Errorf("%w: plugins is nil", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	m := &Manager{
		cfg:          cfg,
		log:          cfg.Logger,
		root:         root,
		hook:         crashHook(),
		store:        store,
		plugins:      plugins,
		index:        map[string]struct{}{},
		byExt:        map[extKey]string{},
		inUse:        map[string]map[string]struct{}{},
		names:        map[string]string{},
		live:         map[string]*handle{},
		counts:       map[countKey]int{},
		orphans:      map[string]*persistence.Volume{},
		repairing:    map[string]struct{}{},
		stats:        newStatsBook(),
		stalls:       newStallBook(cfg.StallAfter),
		shutdownDone: make(chan struct{}),
		waits:        newWaitSet(),
	}
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "csiactor_volume_operations_in_flight",
		Help: "Volume RPCs (publish, stage, unpublish, create, ...) in flight to plugins.",
	})
	m.repairs = newRepairsCounter()
	m.broken = newBrokenBook()
	failures := claim.NewStepFailures()
	m.pool = &jobs{pool: claim.NewPool(0)}
	m.runner = claim.NewRunner(plugins, claim.RunnerConfig{
		MaxInFlightPerPlugin: cfg.MaxInFlightPerPlugin,
		InFlight:             m.inflight,
		RetryMetrics:         cfg.RetryMetrics,
		StepFailures:         failures,
		Logger:               m.log,
		MountProbe:           cfg.MountProbe,
	})
	var err error
	if m.volSup, err = actorkit.NewSupervisor("volume", cfg.Restart, m.log, cfg.Restarts, actorkit.Hooks{}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if m.claimSup, err = actorkit.NewSupervisor("claim", cfg.Restart, m.log, cfg.Restarts, actorkit.Hooks{}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{newClaimsCollector(m), m.inflight, m.repairs, newStatsCollector(m.stats),
			failures, newStalledCollector(m.stalls), m.broken.total, m.broken.probes, newBrokenCollector(m.broken)} {
			if err := cfg.Registerer.Register(c); err != nil {
				m.unregister()
				return nil, fmt.Errorf("register metrics: %w", err)
			}
			m.collectors = append(m.collectors, c)
		}
	}
	return m, nil
}

func (m *Manager) unregister() {
	for _, c := range m.collectors {
		m.cfg.Registerer.Unregister(c)
	}
	m.collectors = nil
}

// Start loads the index of registered volumes (by ID and by plugin volume)
// and the claim counts from the store, and starts the actor of every volume
// with an unfinished step: claims go forward to published, past claims to
// freed. Before that, with Config.Host or Config.HostRebooted, it checks
// the claims against the host and records the ones to repair (see
// Reconcile); a host that cannot be looked at is logged and not checked.
// It returns when the manager is ready to serve; the resumed steps run on
// in the background.
//
// A store written before one plugin volume could be registered under one
// ID only may hold two IDs for the same plugin volume: both are loaded, the
// first in ID order holds the plugin volume in the index, and a warning
// names both.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrShutdown
	}
	if m.started {
		m.mu.Unlock()
		return fmt.Errorf("%w: Start called twice", ErrInvalid)
	}
	m.mu.Unlock()

	// One walk over every record builds both indexes and the counts. The
	// decoded strings share their record's memory, so the ones kept are
	// copied: the index must not pin whole records.
	index := map[string]struct{}{}
	byExt := map[extKey]string{}
	names := map[string]string{}
	counts := map[countKey]int{}
	repairing := map[string]struct{}{}
	var resume []string
	var used []extKey // plugin and volume ID of the volumes in use here
	var repairs []*persistence.Volume
	active := 0
	var view claim.HostView
	asOf := time.Now()
	switch {
	case m.cfg.HostRebooted:
		view = noHost{}
	case m.cfg.Host != nil:
		v, err := m.cfg.Host.Look(ctx)
		if err != nil {
			m.log.WithError(err).Error("cannot look at the host's mounts; the claims are not checked against them")
			break
		}
		view = v
	}
	err := m.store.ForEachVolume(ctx, func(v persistence.Volume) error {
		if view != nil && len(v.Claims) > 0 {
			r := claim.CloneVolume(&v)
			if _, changed := claim.CheckHost(r, view, m.cfg.HostRebooted, asOf, asOf); changed {
				r.Revision++
				r.UpdatedAt = asOf
				repairs = append(repairs, r)
				v = *r
			}
		}
		id := strings.Clone(v.ID)
		index[id] = struct{}{}
		k := extKey{intern(names, v.Plugin), strings.Clone(v.ExternalID)}
		if other, dup := byExt[k]; v.ExternalID == "" {
			// An ephemeral volume not created yet: no plugin volume.
		} else if dup {
			m.log.WithFields(logrus.Fields{"volume": id, "other": other, "plugin": k.plugin, "external_id": k.ext}).
				Warn("two volume IDs are registered for the same plugin volume, so the claim limits of its access mode do not hold across them; deregister one")
		} else {
			byExt[k] = id
		}
		if v.Active() {
			active++
			addCounts(counts, &v, 1)
			if len(v.Claims)+len(v.PastClaims) > 0 {
				used = append(used, extKey{intern(names, v.Plugin), id})
			}
		}
		if claim.Unfinished(&v) || ephemeralPending(&v) {
			resume = append(resume, id)
		}
		if claim.Repairing(&v) {
			repairing[id] = struct{}{}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load volumes: %w", err)
	}
	if err := m.writeRepairs(ctx, repairs); err != nil {
		return err
	}

	m.countsMu.Lock()
	for k, n := range counts {
		m.counts[k] += n
	}
	for id := range repairing {
		m.repairing[id] = struct{}{}
	}
	m.countsMu.Unlock()

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrShutdown
	}
	m.index, m.byExt, m.names = index, byExt, names
	for _, u := range used {
		m.noteUseLocked(u.plugin, u.ext, true)
	}
	resumed := 0
	for _, id := range resume {
		if _, ok := m.live[id]; !ok {
			m.spawnLocked(id)
			resumed++
		}
	}
	m.started = true
	if m.cfg.StatsInterval > 0 {
		m.poller = m.startStatsPoller()
	}
	m.stallWatch = m.startStallWatch()
	m.log.WithFields(logrus.Fields{"volumes": len(index), "active": active, "resumed": resumed, "repairing": len(repairing)}).Info("volume manager started")
	return nil
}

// writeRepairs persists the records Start sent back through their publish
// steps (see claim.CheckHost), before any actor runs.
func (m *Manager) writeRepairs(ctx context.Context, repairs []*persistence.Volume) error {
	if len(repairs) == 0 {
		return nil
	}
	ids := make([]string, len(repairs))
	byID := make(map[string]*persistence.Volume, len(repairs))
	for i, v := range repairs {
		ids[i], byID[v.ID] = v.ID, v
	}
	res, err := forEachParallel(ctx, ids, func(id string) (int, error) {
		v := byID[id]
		if err := m.store.PutVolume(ctx, *v); err != nil {
			return 0, err
		}
		n := 0
		for i := range v.Claims {
			if c := &v.Claims[i]; c.Repair != "" {
				n++
				m.log.WithFields(logrus.Fields{"volume": id, "alloc": c.Alloc, "missing": c.Repair, "target": c.TargetPath}).
					Warn("the host is missing a published claim's volume; publishing it again")
			}
		}
		return n, nil
	})
	if err != nil {
		return fmt.Errorf("record the claims to repair: %w", err)
	}
	m.log.WithFields(logrus.Fields{"volumes": res.Volumes, "claims": res.Claims, "host_rebooted": m.cfg.HostRebooted}).
		Warn("claims the host is missing are being published again")
	return nil
}

// Repairing returns the IDs of the volumes with a claim that goes through
// its publish steps again because the host was missing its volume (see
// Reconcile), in no order.
func (m *Manager) Repairing() []string {
	m.countsMu.Lock()
	defer m.countsMu.Unlock()
	out := make([]string, 0, len(m.repairing))
	for id := range m.repairing {
		out = append(out, id)
	}
	return out
}

// intern returns the copy of s kept in names, adding one: the index holds
// one string per plugin name, not one per volume.
func intern(names map[string]string, s string) string {
	if n, ok := names[s]; ok {
		return n
	}
	n := strings.Clone(s)
	names[n] = n
	return n
}

// spawnLocked starts the actor of volume id. m.mu must be held.
func (m *Manager) spawnLocked(id string) *handle {
	h := newHandle(id)
	m.countsMu.Lock()
	if c, ok := m.orphans[id]; ok {
		h.counted, h.baselined = c, true
		delete(m.orphans, id)
	}
	m.countsMu.Unlock()
	// Not inline until started: the Started message is posted here, under
	// m.mu, which the actor's start takes.
	h.disp = m.pool.pool.Dispatcher(false)
	props := actor.PropsFromProducer(func() actor.Actor { return newVolumeActor(m, h) },
		actor.WithGuardian(m.volSup), actor.WithSupervisor(m.claimSup), actor.WithDispatcher(h.disp))
	m.actors.Add(1)
	h.pid = m.root.SpawnPrefix(props, "volume-")
	m.live[id] = h
	return h
}

// acquire returns the live handle of volume id, spawning its actor when
// needed (create: even for a volume that is not registered yet), and counts
// one pending request on it.
func (m *Manager) acquire(id string, create bool) (*handle, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrShutdown
	}
	if !m.started {
		return nil, fmt.Errorf("%w: manager not started", ErrInvalid)
	}
	h := m.live[id]
	if h == nil {
		if _, ok := m.batching[id]; ok {
			return nil, kinderr.Errorf(ErrConflict, "volume %q is being registered by a batch; try again", id)
		}
		if _, ok := m.index[id]; !ok && !create {
			return nil, kinderr.Errorf(ErrNotFound, "volume %q not found", id)
		}
		h = m.spawnLocked(id)
	}
	h.pending++
	return h, nil
}

func (m *Manager) done(h *handle) {
	m.mu.Lock()
	h.pending--
	m.mu.Unlock()
}

// ask sends the request mk builds to volume id's actor and waits for the
// reply. When the actor's incarnation ends before it answers (a crash, a
// stop), the request is sent again: requests are idempotent.
func (m *Manager) ask(ctx context.Context, id string, create bool, mk func(chan<- reply) any) (reply, error) {
	for attempt := 0; ; attempt++ {
		h, err := m.acquire(id, create)
		if err != nil {
			return reply{}, err
		}
		lost := h.lostCh()
		ch := make(chan reply, 1)
		m.root.Send(h.pid, mk(ch))
		select {
		case r := <-ch:
			m.done(h)
			return r, nil
		case <-ctx.Done():
			m.done(h)
			return reply{}, ctx.Err()
		case <-lost:
			m.done(h)
			select {
			case r := <-ch:
				return r, nil
			default:
			}
			if attempt >= maxResends {
				return reply{}, kinderr.Errorf(ErrVolumeFailed, "the actor of volume %q kept failing; its state is intact, try again", id)
			}
			m.log.WithField("volume", id).Debug("volume actor restarted or stopped before answering; sending the request again")
		}
	}
}

// tryPassivate removes h from the live set if no request is pending on it;
// the idle actor then stops.
func (m *Manager) tryPassivate(h *handle) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h.pending > 0 || m.live[h.id] != h {
		return false
	}
	delete(m.live, h.id)
	h.gone = true
	return true
}

// detach removes h from the live set (its actor is stopping); the next
// request for the volume starts a new actor.
func (m *Manager) detach(h *handle) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live[h.id] == h {
		delete(m.live, h.id)
	}
	h.gone = true
}

// extConflict returns the ErrConflict of registering k as id when k is
// registered as another ID, and nil otherwise.
func (m *Manager) extConflict(k extKey, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.extConflictLocked(k, id)
}

func (m *Manager) extConflictLocked(k extKey, id string) error {
	if other, ok := m.byExt[k]; ok && other != id {
		return kinderr.Errorf(ErrConflict, "external_id %q of plugin %q is already registered as volume %q", k.ext, k.plugin, other)
	}
	return nil
}

// takeExt makes k registered as id, unless it is registered as another ID
// (ErrConflict). The volume actor calls it just before it persists a new
// record, and dropExt when that fails: two IDs racing for one plugin
// volume cannot both get it.
func (m *Manager) takeExt(k extKey, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.extConflictLocked(k, id); err != nil {
		return err
	}
	m.addExtLocked(k, id)
	return nil
}

// addExtLocked records k as id's, copying its strings: they may share the
// memory of a whole decoded record. An entry that is there already is
// kept as it is (assigning would replace its key).
func (m *Manager) addExtLocked(k extKey, id string) {
	if _, ok := m.byExt[k]; ok {
		return
	}
	m.byExt[extKey{intern(m.names, k.plugin), strings.Clone(k.ext)}] = id
}

// dropExt forgets k if it is registered as id.
func (m *Manager) dropExt(k extKey, id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropExtLocked(k, id)
}

func (m *Manager) dropExtLocked(k extKey, id string) {
	if m.byExt[k] == id {
		delete(m.byExt, k)
	}
}

// registered adds volume id, whose record is v, to the index (again: a
// volume actor calls it whenever it loads a record, which repairs the index
// after a crash between a record's write and the index update). A plugin
// volume already registered as another ID keeps that ID.
func (m *Manager) registered(id string, v *persistence.Volume) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.index[id]; !ok {
		m.index[id] = struct{}{}
	}
	if k := keyOf(v); v.ExternalID != "" && m.extConflictLocked(k, id) == nil {
		m.addExtLocked(k, id)
	}
}

// removed forgets volume h.id, whose last record was v: index, live set and
// counts.
func (m *Manager) removed(h *handle, v *persistence.Volume) {
	m.mu.Lock()
	delete(m.index, h.id)
	m.dropExtLocked(keyOf(v), h.id)
	if m.live[h.id] == h {
		delete(m.live, h.id)
	}
	h.gone = true
	m.mu.Unlock()
	m.countsMu.Lock()
	if h.baselined {
		addCounts(m.counts, h.counted, -1)
	}
	h.counted, h.baselined = nil, true
	delete(m.repairing, h.id)
	m.countsMu.Unlock()
	m.noteStalls(h.id, nil)
	m.waits.changed(h.id)
}

// orphaned keeps the counted record of an actor that stopped without
// passivating or being removed, so the next actor of the volume counts from
// it.
func (m *Manager) orphaned(h *handle) {
	m.countsMu.Lock()
	defer m.countsMu.Unlock()
	if h.baselined && h.counted != nil {
		m.orphans[h.id] = h.counted
	}
}

// publish makes rec the snapshot of h and updates the claim counts.
func (m *Manager) publish(h *handle, rec *persistence.Volume) {
	h.snap.Store(&snapshot{rec: rec})
	m.noteStalls(h.id, rec)
	defer m.waits.changed(h.id)
	m.countsMu.Lock()
	defer m.countsMu.Unlock()
	if h.baselined {
		addCounts(m.counts, h.counted, -1)
		addCounts(m.counts, rec, 1)
	}
	h.counted, h.baselined = rec, true
	if rec != nil && claim.Repairing(rec) {
		m.repairing[h.id] = struct{}{}
	} else {
		delete(m.repairing, h.id)
	}
}

// faultPoint calls the test hook with the point prefix+name; the name is
// only put together when there is a hook.
func (m *Manager) faultPoint(prefix, name, volume string) {
	if m.hook != nil {
		m.hook(prefix+name, volume)
	}
}

// Register registers a volume the plugin already has (spec.ExternalID
// set). Registering the same spec again returns the volume. A different
// spec under the same ID updates the volume's definition (event
// EventVolumeUpdated, naming the changed fields): the secrets at any time
// (the next RPCs use them), the capabilities, mount options, parameters
// and context only while the volume has no claim (ErrInUse naming the
// claims otherwise), the plugin and the external ID never (ErrInvalid
// naming the field); an update is not validated with the plugin, and
// the first claim after it finds out. A created volume is updated the
// same way (its spec gives the external ID and context the plugin
// chose). A plugin volume (spec.Plugin and spec.ExternalID) that is
// registered under another ID is ErrConflict (the error names it): claims
// through two IDs would get past the limits of the volume's access mode,
// and deleting one would delete the other's data.
//
// When a controller of the plugin can be asked (Plugins.Client gives one),
// Register of a new volume first sends ValidateVolumeCapabilities with the
// volume's capabilities, context, parameters and secrets: a volume the plugin says
// does not exist (NotFound) is ErrNotFound; capabilities it does not confirm
// are ErrInvalid, naming them, with the plugin's message; InvalidArgument
// is ErrInvalid and another final code ErrPluginCall, wrapping the
// plugin's error; Unimplemented registers the volume. When no controller
// can be asked now (the plugin is not registered yet, has no healthy
// allocation, or only node allocations), or the call ends unavailable or
// timed out, the volume is registered without validation and an info line
// says so: a plugin may come up after its volumes are registered, and the
// order of the agent's config and API calls must not matter. The first
// claim then finds out.
func (m *Manager) Register(ctx context.Context, spec Spec) (Volume, error) {
	if err := spec.validate(false); err != nil {
		return Volume{}, err
	}
	return m.register(ctx, &registerRequest{ctx: ctx, spec: spec})
}

// Mirror registers volume spec.ID as another host of the cluster defined
// it, or brings this host's record of it up to that definition. Unlike
// Register it never asks the plugin: the host that registered or created
// the volume did, and with node-local storage this host's plugin does not
// know the volume at all. Only a claim here asks it: one outside the
// volume's accessible topology is refused first (ErrOutsideTopology,
// naming the volume's topology and this host's), and the plugin's own
// refusal fails the claim with the plugin's error.
//
// The record takes spec.AccessibleTopology, and spec.CapacityBytes when it
// is more than the record's (volumes do not shrink). A registered volume is
// updated as Register updates it (event EventVolumeUpdated, naming the
// changed fields): the capacity and the secrets at any time, every other
// field a claim depends on only while the volume has no claim here
// (ErrInUse naming the claims), the plugin and the external ID never
// (ErrInvalid).
func (m *Manager) Mirror(ctx context.Context, spec Spec) (Volume, error) {
	if err := spec.validate(false); err != nil {
		return Volume{}, err
	}
	return m.register(ctx, &registerRequest{ctx: ctx, spec: spec, mirror: true})
}

// Create creates a volume through the plugin's controller (CreateVolume,
// named spec.ID, so a retried Create finds the same volume) and registers
// it. Creating the same spec again returns the volume. When the plugin
// answers with a volume that is registered under another ID, Create fails
// with ErrConflict naming it, and leaves that volume alone.
func (m *Manager) Create(ctx context.Context, spec Spec) (Volume, error) {
	if err := spec.validate(true); err != nil {
		return Volume{}, err
	}
	spec, err := m.placeCreate(ctx, spec)
	if err != nil {
		return Volume{}, err
	}
	if spec, err = m.resolveClone(ctx, spec); err != nil {
		return Volume{}, err
	}
	spec, release, err := m.resolveSnapshot(ctx, spec)
	if err != nil {
		return Volume{}, err
	}
	defer release()
	return m.register(ctx, &registerRequest{ctx: ctx, spec: spec, create: true})
}

// register sends req (without its reply channel) to the volume's actor.
func (m *Manager) register(ctx context.Context, req *registerRequest) (Volume, error) {
	r, err := m.ask(ctx, req.spec.ID, true, func(ch chan<- reply) any {
		rq := *req
		rq.reply = ch
		return &rq
	})
	if err == nil {
		err = r.err
	}
	if err != nil {
		return Volume{}, err
	}
	return viewOf(r.vol), nil
}

// Deregister forgets volume id. It fails with ErrInUse while the volume has
// claims or past claims not yet freed.
func (m *Manager) Deregister(ctx context.Context, id string) error {
	return m.deregister(ctx, id, false)
}

// Delete deletes volume id through the plugin's controller (DeleteVolume;
// a volume the plugin no longer has counts as deleted) and deregisters it;
// the event is EventVolumeDeleted. It fails with ErrInUse while the volume
// has claims or past claims.
func (m *Manager) Delete(ctx context.Context, id string) error {
	return m.deregister(ctx, id, true)
}

func (m *Manager) deregister(ctx context.Context, id string, del bool) error {
	if err := claim.CheckName("id", id); err != nil {
		return err
	}
	r, err := m.ask(ctx, id, false, func(ch chan<- reply) any {
		return &deregisterRequest{ctx: ctx, delete: del, reply: ch}
	})
	if err == nil {
		err = r.err
	}
	return err
}

// Evict forgets this host's record of volume id without an event and
// without asking the plugin: the volume stays wherever else it is defined
// (in cluster mode, in etcd, from where Mirror brings it back). It fails
// with ErrInUse while the volume has claims or past claims here, and
// with ErrNotFound for a volume this host does not know.
func (m *Manager) Evict(ctx context.Context, id string) error {
	if err := claim.CheckName("id", id); err != nil {
		return err
	}
	r, err := m.ask(ctx, id, false, func(ch chan<- reply) any {
		return &deregisterRequest{ctx: ctx, evict: true, reply: ch}
	})
	if err == nil {
		err = r.err
	}
	return err
}

// Known reports whether volume id is registered on this host. It never
// blocks on the volume's actor.
func (m *Manager) Known(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.index[id]
	return ok
}

// IDs returns the IDs of the volumes registered on this host, unordered.
func (m *Manager) IDs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.index))
	for id := range m.index {
		out = append(out, id)
	}
	return out
}

// Count returns how many volumes are registered on this host.
func (m *Manager) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.index)
}

// Claim claims the volume for an allocation and publishes it to the
// allocation's target path, one persisted step at a time; it returns the
// published claim. Claiming again with the same allocation and mode returns
// the same claim (and waits for it if it is still being published); with
// Config.Host, a published claim is answered only once the mount table
// shows its target (otherwise it is published again first, see
// Reconcile). A claim the access mode does not allow is ErrClaimLimit. If
// ctx ends first the claim goes on: call again to get it.
func (m *Manager) Claim(ctx context.Context, req ClaimRequest) (Claim, error) {
	if err := req.validate(); err != nil {
		return Claim{}, err
	}
	r, err := m.ask(ctx, req.VolumeID, false, func(ch chan<- reply) any {
		return &claimRequest{req: req.claim(), reply: ch}
	})
	if err == nil {
		err = r.err
	}
	if err != nil {
		return Claim{}, err
	}
	return claimOf(req.VolumeID, &r.claim), nil
}

// Release releases alloc's claim on the volume: it records the claim as a
// past claim and returns it (state taken) at once; a claim actor then
// unpublishes, unstages and detaches it in the background until it is
// freed. Releasing again returns the past claim's current state; a claim
// that is gone (or never was) is ErrNotFound.
func (m *Manager) Release(ctx context.Context, volumeID, alloc string) (Claim, error) {
	if err := claim.CheckName("volume", volumeID); err != nil {
		return Claim{}, err
	}
	if err := claim.CheckName("alloc", alloc); err != nil {
		return Claim{}, err
	}
	r, err := m.ask(ctx, volumeID, false, func(ch chan<- reply) any {
		return &releaseRequest{alloc: alloc, reply: ch}
	})
	if err == nil {
		err = r.err
	}
	if err != nil {
		return Claim{}, err
	}
	c := claimOf(volumeID, &r.claim)
	m.stalls.overlayClaim(volumeID, &c, true)
	return c, nil
}

// Get returns volume id's status. It never waits for a volume's work: it
// reads the last snapshot its actor published, or the store.
func (m *Manager) Get(ctx context.Context, id string) (Volume, error) {
	if err := claim.CheckName("id", id); err != nil {
		return Volume{}, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return Volume{}, ErrShutdown
	}
	h := m.live[id]
	_, known := m.index[id]
	m.mu.Unlock()
	if h != nil {
		if s := h.snap.Load(); s != nil {
			if s.rec == nil {
				return Volume{}, kinderr.Errorf(ErrNotFound, "volume %q not found", id)
			}
			return m.withStats(ctx, viewOf(s.rec), nil), nil
		}
	}
	if !known {
		return Volume{}, kinderr.Errorf(ErrNotFound, "volume %q not found", id)
	}
	v, err := m.store.Volume(ctx, id)
	if errors.Is(err, persistence.ErrNotFound) {
		return Volume{}, kinderr.Errorf(ErrNotFound, "volume %q not found", id)
	}
	if err != nil {
		return Volume{}, fmt.Errorf("read volume %q: %w", id, err)
	}
	return m.withStats(ctx, viewOf(&v), nil), nil
}

// withStats adds the volume's last usage and condition to v, whether they
// are reported yet, and the condition of its stalled claims. support
// caches what each plugin reports across the volumes of one listing (nil:
// no cache).
func (m *Manager) withStats(ctx context.Context, v Volume, support map[string]statsSupport) Volume {
	m.stats.overlay(&v)
	m.stalls.overlay(&v)
	m.setStatsStatus(ctx, &v, support)
	return v
}

// List returns the status of every registered volume that f matches, in ID
// order, read from the store.
func (m *Manager) List(ctx context.Context, f Filter) ([]Volume, error) {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, ErrShutdown
	}
	var out []Volume
	err := m.store.ForEachVolume(ctx, func(v persistence.Volume) error {
		if f.match(&v) {
			out = append(out, viewOf(&v))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	// Outside the store's transaction: the plugins' facts may take an
	// ask of the registry.
	support := map[string]statsSupport{}
	for i := range out {
		out[i] = m.withStats(ctx, out[i], support)
	}
	return out, nil
}

// ListPage is List for one page: at most limit volumes (all when limit is
// 0) that f matches, in ID order, from the first ID at or after from. next
// is the ID of the first matching volume after the page, empty on the
// last page.
func (m *Manager) ListPage(ctx context.Context, f Filter, from string, limit int) (vs []Volume, next string, err error) {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, "", ErrShutdown
	}
	errFull := errors.New("page full")
	err = m.store.ForEachVolumeFrom(ctx, from, func(v persistence.Volume) error {
		if !f.match(&v) {
			return nil
		}
		if limit > 0 && len(vs) == limit {
			next = strings.Clone(v.ID)
			return errFull
		}
		vs = append(vs, viewOf(&v))
		return nil
	})
	if err != nil && !errors.Is(err, errFull) {
		return nil, "", fmt.Errorf("list volumes: %w", err)
	}
	// Outside the store's transaction, as in List.
	support := map[string]statsSupport{}
	for i := range vs {
		vs[i] = m.withStats(ctx, vs[i], support)
	}
	return vs, next, nil
}

// MirrorView is the status a volume of spec would have on a host that
// mirrored it (see Mirror) and holds no claim on it, without registering
// it: for listing the cluster's volumes this host does not hold.
func MirrorView(spec Spec) Volume {
	v := spec.record(time.Time{})
	v.AccessibleTopology = cloneTopology(spec.AccessibleTopology)
	v.MutableParameters = maps.Clone(spec.MutableParameters)
	return viewOf(v)
}

// Live returns the number of volume actors in memory (for status and
// tests); idle ones stop after Config.IdleTimeout.
func (m *Manager) Live() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

// Shutdown stops every volume and claim actor and waits for them and the
// goroutines they own; unfinished steps are resumed by the next Start. It
// is idempotent; later calls wait for the first to finish. It returns ctx's
// error if ctx ends first.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.shutdownOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		m.waits.close()
		hs := make([]*handle, 0, len(m.live))
		for _, h := range m.live {
			hs = append(hs, h)
		}
		poller, stalls := m.poller, m.stallWatch
		m.mu.Unlock()
		go func() {
			defer close(m.shutdownDone)
			poller.shutdown() // its requests end with ErrShutdown now
			stalls.shutdown()
			// No restart may fire once actors are told to stop.
			m.volSup.Close()
			m.claimSup.Close()
			for _, h := range hs {
				m.root.Stop(h.pid)
			}
			// Actors that passivated or were deregistered just before
			// are stopping on their own; wait for them too.
			m.actors.Wait()
			m.pool.pool.Close()
			if m.cfg.Registerer != nil {
				m.unregister()
			}
			m.log.Info("volume manager stopped")
		}()
	})
	select {
	case <-m.shutdownDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
