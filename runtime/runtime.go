package runtime

import (
	"context"
	"errors"
	"fmt"
	"github.com/csiactor/csiactor/internal/mountprobe"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/plugin/container"
	"github.com/csiactor/csiactor/actors/registry"
	"github.com/csiactor/csiactor/actors/snapshot"
	"github.com/csiactor/csiactor/actors/volume"
	"github.com/csiactor/csiactor/cluster"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/seal"
	"github.com/csiactor/csiactor/persistence"
	"github.com/csiactor/csiactor/registration"
)

// StoreFileName is the name of the bbolt file in the data directory.
const StoreFileName = "state.db"

// RecentEvents is how many past events Events returns and a new
// subscription starts with.
const RecentEvents = 256

// Options are the runtime's dependencies that are not configuration: where
// it logs and where it registers its metrics. Zero values mean a logger that
// discards everything and no metrics.
type Options struct {
	// Log receives every log line of the runtime and its actors.
	Log *logrus.Entry
	// Registerer receives every csiactor_* metric. The runtime never uses
	// the global registry.
	Registerer prometheus.Registerer
}

// Runtime is one csiactor agent: the store, the actor system with the
// registry and the volume manager, and the event stream. Create it with
// [New], run it with [Runtime.Start], stop it with [Runtime.Shutdown].
//
// All methods are safe for concurrent use. The blocking ones take a context
// first; they return errors that wrap [ErrInvalid], [ErrNotFound],
// [ErrConflict], [ErrPluginUnavailable] or [ErrShutdown] where one applies.
type Runtime struct {
	// containers runs the plugins of image allocations; set in Start.
	containers *container.Launcher
	cfg        Config
	log        *logrus.Entry
	reg        prometheus.Registerer
	life       sync.Mutex // serializes Start and Shutdown

	// Set by Start, read-only afterwards until Shutdown.
	started  bool
	keys     *seal.Keyring // secrets.key_file's keyring; nil seals nothing
	store    *persistence.Store
	system   *actor.ActorSystem
	registry *registry.Handle
	volumes  *volume.Manager
	snaps    *snapshot.Manager
	restarts *actorkit.RestartCounter
	csiStats *csi.Metrics
	plugins  *pluginsAdapter
	regSub   *actorkit.Subscription[registry.Event]
	events   *eventLog
	host     *hostCheck
	done     chan struct{} // closed by Shutdown
	isReady  atomic.Bool   // latched by Ready once nothing is pending
	// clusterListed: in cluster mode, the volume watch has read every
	// definition in etcd once (Ready waits for it).
	clusterListed atomic.Bool
	wg            sync.WaitGroup
	stopped       bool

	// registration watches plugins.registration_dir, when set.
	registration *registration.Watcher
	// proxy serves the CSI proxy sockets with plugins.proxy, else nil.
	proxy *proxies

	// cluster is the cluster session in cluster mode, else nil;
	// clusterCancel ends its volume watch.
	cluster       *cluster.Session
	clusterCancel context.CancelFunc
	// ctrl is the volume manager's plugins in cluster mode; ctrlKick
	// wakes followControllers.
	ctrl     *clusterPlugins
	ctrlKick chan struct{}
	// deleting holds the volumes this runtime is deregistering: the
	// cluster watch leaves them to it. Guarded by deletingMu.
	deletingMu sync.Mutex
	deleting   map[string]int
	// mirrored holds, by volume, the etcd revision of the cluster's
	// definition last mirrored here: an older one is not mirrored over
	// it. mirrorMu, held across each mirror, guards it.
	mirrorMu sync.Mutex
	mirrored map[string]int64
	// cache orders the volumes this host keeps in cluster mode, and
	// bounds the ones it has no claim on (cluster.volume_cache).
	cache      *volumeCache
	cacheGauge prometheus.Collector // csiactor_cluster_volumes_kept, when registered
}

// New validates cfg (with defaults applied) and returns a runtime that has
// not started yet: nothing is opened, spawned or listened on until Start.
func New(cfg Config, opts Options) (*Runtime, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Log
	if log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		log = logrus.NewEntry(l)
	}
	return &Runtime{cfg: cfg, log: log, reg: opts.Registerer, done: make(chan struct{}), ctrlKick: make(chan struct{}, 1)}, nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Config returns the configuration the runtime runs with (defaults applied).
func (r *Runtime) Config() Config { return r.cfg }

// Start opens the store in the data directory, starts the actor system,
// restores every persisted allocation (adopting the exec-managed plugins a
// previous run left running, starting the others) and registers the
// configured ones, then checks the claims against the host (after a reboot,
// every claim is published again; a published claim whose target or
// staging path is not mounted is too; see HostConfig) and resumes every
// unfinished claim and release. It returns once all of that is under way;
// plugins become healthy in the background (see WaitHealthy), and Ready
// says when the repairs are done.
//
// On error everything started so far is stopped again and the runtime is
// spent: make a new one to try again. A data dir whose store another agent
// holds fails, after persistence.DefaultLockTimeout, with an error wrapping
// ErrDataDirInUse (and persistence.ErrInUse) that names the data dir.
func (r *Runtime) Start(ctx context.Context) (err error) {
	r.life.Lock()
	defer r.life.Unlock()
	if r.stopped {
		return ErrShutdown
	}
	if r.started {
		return errors.New("runtime already started")
	}
	defer func() {
		if err != nil {
			r.teardownLocked(context.Background())
		}
	}()

	if err := os.MkdirAll(r.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	if err := checkStoreNotLost(r.cfg.DataDir); err != nil {
		return err
	}
	if r.keys, err = r.cfg.Secrets.keyring(); err != nil {
		return err
	}
	r.store, err = persistence.Open(filepath.Join(r.cfg.DataDir, StoreFileName), persistence.Config{
		NoSync:     r.cfg.Store.NoSync,
		Keyring:    r.keys,
		Registerer: r.reg,
		Logger:     r.log.WithField("component", "store"),
	})
	if errors.Is(err, persistence.ErrInUse) {
		return &kindError{kind: ErrDataDirInUse, err: fmt.Errorf("data dir %s is in use by another csiactor agent: open store: %w", r.cfg.DataDir, err)}
	}
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}

	metrics, err := csi.NewMetrics(r.reg)
	if err != nil {
		return fmt.Errorf("csi metrics: %w", err)
	}
	r.csiStats = metrics
	r.restarts = actorkit.NewRestartCounter()
	if r.reg != nil {
		if err := r.reg.Register(r.restarts); err != nil {
			return fmt.Errorf("register restart counter: %w", err)
		}
	}
	// etcd that does not answer fails Start before any plugin starts.
	if r.cfg.Cluster != nil {
		if err := r.startCluster(ctx); err != nil {
			return err
		}
	}
	r.events = newEventLog(RecentEvents)
	r.system = actorkit.NewSystem(r.log.WithField("component", "actors"))

	// The config file is authoritative for the allocations it lists: the
	// registry replaces a stored one whose spec changed and removes the
	// config's former allocations that are no longer listed, before any
	// plugin process starts.
	configured := make([]plugin.Spec, 0, len(r.cfg.Allocations))
	for _, a := range r.cfg.Allocations {
		configured = append(configured, plugin.Spec{ID: a.ID, Plugin: a.Plugin, Type: plugin.Type(a.Type),
			Socket: a.Socket, Command: a.Command, Env: a.Env, Image: a.Image.Clone()})
	}
	pc := r.cfg.Plugins
	r.containers, err = container.NewLauncher(container.Config{
		DockerSocket: pc.Engines.Docker, PodmanSocket: pc.Engines.Podman,
		DataDir: r.cfg.DataDir, VolumesDir: filepath.Join(r.cfg.DataDir, "volumes"),
	})
	if err != nil {
		return err
	}
	// Subscribed before the registry actor starts: the events of the
	// allocations it registers and restores as it starts are the first.
	r.registry, r.regSub, err = registry.StartSubscribed(ctx, r.system, registry.Config{
		Log:     r.log.WithField("component", "registry"),
		Store:   r.store,
		DataDir: r.cfg.DataDir,
		Plugin: plugin.Config{
			HeartbeatInterval: pc.HeartbeatInterval,
			ProbeTimeout:      pc.ProbeTimeout,
			RPCTimeout:        pc.RPCTimeout,
			StopGrace:         pc.KillTimeout,
			StopOnShutdown:    pc.StopOnAgentExit,
			HealthTimeout:     pc.HealthTimeout,
			HungRPCRestart:    pc.HungRPCRestart,
			RestartBackoff:    actorBackoff(pc.RestartBackoff),
			Metrics:           metrics,
			Containers:        r.containers,
		},
		Registerer:        r.reg,
		Restarts:          r.restarts,
		ConfigAllocations: configured,
	}, RecentEvents)
	if err != nil {
		return fmt.Errorf("start registry: %w", mapErr(err))
	}
	r.plugins = newPluginsAdapter(r.registry, pc.HeartbeatInterval)
	if pc.Proxy {
		r.proxy = newProxies(r)
	}
	r.host = newHostCheck(r.cfg.Host, r.cfg.Volumes.MountCheckInterval, r.log.WithField("component", "host"))
	r.wg.Add(1)
	go r.forwardRegistryEvents(r.regSub)
	// The restored allocations reach forwardRegistryEvents as registered
	// events, but later: their plugins' retry counters exist at 0 before
	// Start returns.
	restored, err := r.registry.Allocations(ctx)
	if err != nil {
		return fmt.Errorf("list restored allocations: %w", err)
	}
	for _, a := range restored {
		r.csiStats.InitRetries(a.Plugin, retriedMethods...)
	}

	// The host is checked before any claim resumes: after a reboot every
	// claim is published again, and a published claim the mount table
	// does not show is too.
	bootID, rebooted := r.host.bootChanged(ctx, r.store)
	var host volume.Host
	var probe *mountprobe.Prober
	if !r.cfg.Host.SkipMountCheck {
		host = volume.MountTable{File: r.cfg.Host.MountTable, Dir: filepath.Join(r.cfg.DataDir, "volumes")}
		probe = mountprobe.New(mountprobe.Config{})
	}
	vb := r.cfg.Volumes.Retry
	var arbiter volume.Arbiter
	var plugins claim.Plugins = r.plugins
	if r.cluster != nil {
		arbiter = r.cluster
		r.ctrl = newClusterPlugins(r.plugins, r.cluster, r.keys, pc.RPCTimeout, pc.HeartbeatInterval)
		plugins = r.ctrl
	}
	r.volumes, err = volume.NewManager(r.system.Root, volume.Config{
		Arbiter:              arbiter,
		Host:                 host,
		MountProbe:           probe,
		HostRebooted:         rebooted,
		DataDir:              r.cfg.DataDir,
		Backoff:              csi.Backoff{Initial: vb.Initial, Max: vb.Max, Multiplier: vb.Multiplier, Jitter: vb.Jitter},
		MaxInFlightPerPlugin: pc.MaxInFlight,
		MaxClaimAttempts:     r.cfg.Volumes.MaxClaimAttempts,
		StatsInterval:        r.cfg.Volumes.StatsInterval,
		StallAfter:           r.cfg.Volumes.StallAfter,
		Restarts:             r.restarts,
		RetryMetrics:         metrics,
		Logger:               r.log.WithField("component", "volumes"),
		Registerer:           r.reg,
		OnEvent:              r.volumeEvent,
		Snapshots:            snapshotHolder{r},
	}, r.store, plugins)
	if err != nil {
		return fmt.Errorf("volume manager: %w", err)
	}
	if err := r.volumes.Start(ctx); err != nil {
		return fmt.Errorf("resume volumes: %w", err)
	}
	if err := r.startSnapshots(ctx); err != nil {
		return err
	}
	if r.cluster != nil {
		if err := r.afterVolumesStarted(ctx); err != nil {
			return err
		}
	}
	// Recorded once the repairs it calls for are: a crash before this
	// line makes the next start redo them.
	if bootID != "" {
		if err := r.store.PutBootID(ctx, bootID); err != nil {
			return fmt.Errorf("record boot id: %w", err)
		}
	}
	// Last: its drivers are registered like the API's, on a running
	// runtime.
	if err := r.startRegistration(ctx); err != nil {
		return err
	}
	r.wg.Add(2)
	go r.host.run(r.done, r.volumes, &r.wg)
	r.started = true
	go r.watchReady()
	r.log.WithField("data_dir", r.cfg.DataDir).Info("runtime started")
	return nil
}

// retriedMethods are the CSI methods the volume and claim actors retry,
// as csiactor_csi_retries_total names them.
var retriedMethods = func() []string {
	var ms []string
	for m := claim.ControllerPublish; m <= claim.ControllerUnpublish; m++ {
		ms = append(ms, m.String())
	}
	return append(ms, "CreateVolume", "DeleteVolume", "CreateSnapshot", "DeleteSnapshot")
}()

func actorBackoff(b BackoffConfig) actorkit.BackoffConfig {
	return actorkit.BackoffConfig{Initial: b.Initial, Max: b.Max, Multiplier: b.Multiplier, Jitter: b.Jitter}
}

// Shutdown stops the runtime: the volume manager first (in-flight steps end
// and stay persisted, to resume on the next start), then every allocation
// actor (each runs its last fingerprint, "agent shutting down", which is
// persisted), then the actor system and the store. Exec-managed plugin
// processes keep running, with their log shims, for the next Start to
// adopt, unless Config.Plugins.StopOnAgentExit is set: then they are
// stopped too. It returns when every goroutine and socket it owned is
// gone, and every process it stops. It is idempotent; calls after the
// first return nil at once.
func (r *Runtime) Shutdown(ctx context.Context) error {
	r.life.Lock()
	defer r.life.Unlock()
	if r.stopped {
		return nil
	}
	wasStarted := r.started
	err := r.teardownLocked(ctx)
	if wasStarted {
		r.log.Info("runtime stopped")
	}
	return err
}

// teardownLocked stops whatever Start got to. r.life is held.
func (r *Runtime) teardownLocked(ctx context.Context) error {
	r.stopped = true
	close(r.done)
	if r.registration != nil {
		// First: nothing registers or deregisters while the rest stops.
		r.registration.Shutdown()
	}
	if r.proxy != nil {
		// Before the registry: a call waiting for a handover ends now.
		r.proxy.close()
	}
	if r.clusterCancel != nil {
		r.clusterCancel()
	}
	var errs []error
	if r.snaps != nil {
		if err := r.snaps.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop snapshots: %w", err))
		}
	}
	if r.volumes != nil {
		if err := r.volumes.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop volumes: %w", err))
		}
	}
	if r.registry != nil {
		if err := r.registry.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop registry: %w", err))
		}
	}
	if r.regSub != nil {
		r.regSub.Cancel()
	}
	if r.events != nil {
		r.events.close() // ends every subscription goroutine
	}
	r.wg.Wait()
	if r.cluster != nil {
		// After the volumes: a claim freed as they stopped is still
		// handed to etcd (or left to the next start's prune).
		if err := r.cluster.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("leave cluster: %w", err))
		}
	}
	if r.system != nil {
		r.system.Shutdown()
	}
	if r.containers != nil {
		r.containers.Close()
	}
	if r.restarts != nil && r.reg != nil {
		r.reg.Unregister(r.restarts)
	}
	if r.cacheGauge != nil {
		r.reg.Unregister(r.cacheGauge)
	}
	if r.store != nil {
		if err := r.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store: %w", err))
		}
	}
	return errors.Join(errs...)
}

// ready returns ErrShutdown unless the runtime has started and not stopped.
func (r *Runtime) ready() error {
	select {
	case <-r.done:
		return ErrShutdown
	default:
	}
	r.life.Lock()
	started := r.started
	r.life.Unlock()
	if !started {
		return fmt.Errorf("%w: runtime not started", ErrShutdown)
	}
	return nil
}

// RegisterAllocation registers the allocation id, or re-registers it with
// the same spec (a no-op). An exec-managed allocation's process is started;
// an attached one's socket is dialed. It returns the allocation as now known.
func (r *Runtime) RegisterAllocation(ctx context.Context, id string, spec AllocationSpec) (Allocation, error) {
	if err := ValidateID("id", id); err != nil {
		return Allocation{}, err
	}
	if err := spec.Validate(); err != nil {
		return Allocation{}, err
	}
	if err := r.ready(); err != nil {
		return Allocation{}, err
	}
	return r.registerAllocation(ctx, id, spec)
}

// registerAllocation registers a validated allocation; Start uses it for
// the configured ones before the runtime counts as started.
func (r *Runtime) registerAllocation(ctx context.Context, id string, spec AllocationSpec) (Allocation, error) {
	if spec.Image != nil {
		// An image the engine says it lacks, with pull never, is refused
		// before anything starts; an engine that does not answer is
		// retried by the allocation.
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := r.containers.HasImage(cctx, *spec.Image)
		cancel()
		if err != nil {
			return Allocation{}, fieldErr("image.image", err.Error())
		}
	}
	ps := plugin.Spec{ID: id, Plugin: spec.Plugin, Type: plugin.Type(spec.Type), Socket: spec.Socket, Command: spec.Command, Env: spec.Env, Image: spec.Image.Clone()}
	info, err := r.registry.Register(ctx, ps)
	r.plugins.invalidate()
	if err != nil {
		return Allocation{}, mapErr(err)
	}
	return allocationFromInfo(info), nil
}

// DeregisterAllocation removes the allocation id (both roles of a monolith)
// and returns when its actor has stopped and its process, if any, is gone.
// It fails with ErrConflict, naming them, when claims (published, being
// published, or being released) depend on it: it is the last healthy
// node (or controller) allocation of its plugin that they need. See
// ForceDeregisterAllocation.
func (r *Runtime) DeregisterAllocation(ctx context.Context, id string) error {
	if err := r.ready(); err != nil {
		return err
	}
	deps, err := r.allocationDependents(ctx, id)
	if err != nil {
		return err
	}
	if deps != nil {
		return errAllocationInUse(deps)
	}
	return r.deregisterAllocation(ctx, id)
}

// Allocations lists every allocation, ordered by plugin, then type, newest
// first.
func (r *Runtime) Allocations(ctx context.Context) ([]Allocation, error) {
	if err := r.ready(); err != nil {
		return nil, err
	}
	infos, err := r.registry.Allocations(ctx)
	if err != nil {
		return nil, mapErr(err)
	}
	out := make([]Allocation, 0, len(infos))
	for _, i := range infos {
		out = append(out, allocationFromInfo(i))
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Plugin != out[j].Plugin {
			return out[i].Plugin < out[j].Plugin
		}
		return out[i].Type < out[j].Type
	})
	return out, nil
}

// Plugins lists every plugin, by name.
func (r *Runtime) Plugins(ctx context.Context) ([]Plugin, error) {
	if err := r.ready(); err != nil {
		return nil, err
	}
	sums, err := r.registry.Plugins(ctx)
	if err != nil {
		return nil, mapErr(err)
	}
	out := make([]Plugin, 0, len(sums))
	for _, s := range sums {
		out = append(out, r.withProxy(pluginFromSummary(s)))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Plugin returns one plugin, or an error wrapping ErrNotFound.
func (r *Runtime) Plugin(ctx context.Context, name string) (Plugin, error) {
	if err := r.ready(); err != nil {
		return Plugin{}, err
	}
	s, err := r.registry.Plugin(ctx, name)
	if err != nil {
		return Plugin{}, mapErr(err)
	}
	return r.withProxy(pluginFromSummary(s)), nil
}

// RegisterVolume registers an existing volume of a plugin as id. The same id
// with the same spec again is a no-op. Another spec for a registered id is
// an update of its definition (event EventVolumeUpdated, naming the
// changed fields, never their values): the secrets at any time (the next
// RPCs use them), the capabilities, mount options, parameters and context
// only while the volume has no claim (ErrConflict naming the claims), the
// plugin and the external ID never (ErrInvalid naming the field). An
// update is not checked with ValidateVolumeCapabilities; the first claim
// after it finds out. In cluster mode the definition lives in etcd: a
// volume new to the cluster is validated by this host's plugin, then
// shared; an update is written to etcd by compare-and-swap (the fields a
// claim depends on only while no host holds a claim, ErrConflict naming
// them otherwise) and reaches every host's record; see registerShared.
func (r *Runtime) RegisterVolume(ctx context.Context, id string, spec VolumeSpec) (Volume, error) {
	if err := ValidateID("id", id); err != nil {
		return Volume{}, err
	}
	if err := spec.Validate(); err != nil {
		return Volume{}, err
	}
	if err := r.checkLiteralSecrets("secrets", spec.Secrets); err != nil {
		return Volume{}, err
	}
	if err := r.ready(); err != nil {
		return Volume{}, err
	}
	vs, err := volumeSpec(id, spec)
	if err != nil {
		return Volume{}, err
	}
	register := r.volumes.Register
	if r.cluster != nil {
		register = func(ctx context.Context, vs volume.Spec) (volume.Volume, error) {
			return r.registerShared(ctx, id, spec, vs)
		}
	}
	v, err := register(ctx, vs)
	if err != nil {
		return Volume{}, mapErr(err)
	}
	return r.withHosts(volumeFromManager(v), nil), nil
}

// CreateVolume creates a volume through the plugin's controller
// (CreateVolume, idempotent by name) and registers it.
func (r *Runtime) CreateVolume(ctx context.Context, spec CreateVolumeSpec) (Volume, error) {
	if err := spec.Validate(); err != nil {
		return Volume{}, err
	}
	if err := r.checkLiteralSecrets("secrets", spec.Secrets); err != nil {
		return Volume{}, err
	}
	if err := r.ready(); err != nil {
		return Volume{}, err
	}
	vs, err := volumeSpec(spec.ID, spec.VolumeSpec)
	if err != nil {
		return Volume{}, err
	}
	vs.CapacityBytes = spec.CapacityBytes
	vs.Topology = spec.Topology
	if spec.ContentSource != nil && spec.ContentSource.Volume != "" {
		release, err := r.hold(ctx, spec.ContentSource.Volume)
		if err != nil {
			return Volume{}, err
		}
		defer release()
	}
	if spec.ContentSource != nil {
		vs.CloneOf = spec.ContentSource.Volume
		vs.FromSnapshot = spec.ContentSource.Snapshot
	}
	v, err := waitOut(ctx, pluginWaiter{r: r, op: "create", vol: spec.ID}, func() (volume.Volume, error) {
		return r.volumes.Create(ctx, vs)
	})
	if err != nil {
		return Volume{}, mapErr(err)
	}
	if r.cluster != nil {
		// The other hosts mirror the volume the plugin created, with
		// what the plugin said of it.
		shared := spec.VolumeSpec
		shared.ExternalID, shared.Context = v.ExternalID, v.Context
		if err := r.shareVolume(ctx, clusterVolume{ID: spec.ID, Spec: shared, Created: true,
			CapacityBytes: v.CapacityBytes, AccessibleTopology: v.AccessibleTopology}); err != nil {
			return Volume{}, err
		}
	}
	return r.withHosts(volumeFromManager(v), nil), nil
}

// DeleteVolume deregisters the volume id and, with deleteToo, deletes it
// through the controller first. It fails with ErrConflict while the volume
// has claims or unfinished past claims.
func (r *Runtime) DeleteVolume(ctx context.Context, id string, deleteToo bool) error {
	if err := ValidateID("id", id); err != nil {
		return err
	}
	if err := r.ready(); err != nil {
		return err
	}
	if r.cluster != nil {
		// Checked across every host first: deleting through the
		// controller destroys the data another host may use.
		defer r.markDeleting(id, 1)()
		release, err := r.hold(ctx, id)
		if err != nil {
			return err
		}
		defer release()
		plugin, ext := r.externalOf(ctx, id)
		if err := r.cluster.DeleteVolume(ctx, id); err != nil {
			return mapErr(err)
		}
		r.forgetExternal(ctx, id, plugin, ext)
	}
	var err error
	if deleteToo {
		err = r.volumes.Delete(ctx, id)
	} else {
		err = r.volumes.Deregister(ctx, id)
	}
	return mapErr(err)
}

// Volume returns one volume with its claims and past claims, or an error
// wrapping ErrNotFound.
func (r *Runtime) Volume(ctx context.Context, id string) (Volume, error) {
	if err := ValidateID("id", id); err != nil {
		return Volume{}, err
	}
	if err := r.ready(); err != nil {
		return Volume{}, err
	}
	release, err := r.hold(ctx, id)
	if err != nil {
		return Volume{}, err
	}
	defer release()
	v, err := r.volumes.Get(ctx, id)
	if err != nil {
		return Volume{}, mapErr(err)
	}
	var recorded []cluster.HostClaim
	if r.cluster != nil {
		recorded, _ = r.cluster.Claims(ctx, id) // unreachable: this host's claims only
	}
	return r.withHosts(volumeFromManager(v), recorded), nil
}

// Claim claims the volume for req.Alloc and publishes it, returning when the
// claim is published (with its target path) or has failed finally (and is
// being torn down). The same request again returns the same claim.
func (r *Runtime) Claim(ctx context.Context, volumeID string, req ClaimRequest) (Claim, error) {
	if req.Ephemeral != nil {
		return r.claimEphemeral(ctx, volumeID, req)
	}
	vr, err := r.claimRequest(volumeID, req)
	if err != nil {
		return Claim{}, err
	}
	release, err := r.hold(ctx, volumeID)
	if err != nil {
		return Claim{}, err
	}
	defer release()
	c, err := waitOut(ctx, pluginWaiter{r: r, op: "claim", vol: volumeID, alloc: req.Alloc}, func() (volume.Claim, error) {
		return r.claimApplied(ctx, func() (volume.Claim, error) { return r.volumes.Claim(ctx, vr) })
	})
	if err != nil {
		return Claim{}, mapErr(err)
	}
	return claimFromManager(c), nil
}

// claimRequest checks a claim of Claim and ClaimWait and that the runtime
// is ready, and returns it as the volume manager takes it.
func (r *Runtime) claimRequest(volumeID string, req ClaimRequest) (volume.ClaimRequest, error) {
	if err := ValidateID("volume", volumeID); err != nil {
		return volume.ClaimRequest{}, err
	}
	if err := req.Validate(); err != nil {
		return volume.ClaimRequest{}, err
	}
	if err := r.ready(); err != nil {
		return volume.ClaimRequest{}, err
	}
	if err := r.checkSELinux(req); err != nil {
		return volume.ClaimRequest{}, err
	}
	// Validate parsed these already; parse again for the typed values.
	am, _ := csi.ParseAccessMode(req.AccessMode)
	at, _ := csi.ParseAttachmentMode(req.AttachmentMode)
	mode, _ := claim.ParseMode(req.Mode)
	return volume.ClaimRequest{
		VolumeID: volumeID, Alloc: req.Alloc, Mode: mode,
		AccessMode: am, AttachmentMode: at, Options: req.options(),
	}, nil
}

// Release releases alloc's claim on the volume. It returns as soon as the
// claim is recorded as a past claim, with its state; the teardown goes on in
// the background and survives restarts.
func (r *Runtime) Release(ctx context.Context, volumeID, alloc string) (Claim, error) {
	if err := ValidateID("volume", volumeID); err != nil {
		return Claim{}, err
	}
	if err := ValidateID("alloc", alloc); err != nil {
		return Claim{}, err
	}
	if err := r.ready(); err != nil {
		return Claim{}, err
	}
	c, err := waitOut(ctx, pluginWaiter{r: r, op: "release", vol: volumeID, alloc: alloc}, func() (volume.Claim, error) {
		return r.volumes.Release(ctx, volumeID, alloc)
	})
	if err != nil {
		return Claim{}, mapErr(err)
	}
	return claimFromManager(c), nil
}

// WaitHealthy blocks until plugin name has a healthy allocation serving typ
// (TypeController or TypeNode; a monolith serves both, and TypeMonolith
// waits for both), or ctx ends. It fails at once with ErrNotFound when the
// plugin has no allocation of that type. Claims and creates fail with
// ErrPluginUnavailable rather than wait, so an embedder that has just
// registered an allocation calls this first.
func (r *Runtime) WaitHealthy(ctx context.Context, name, typ string) error {
	if err := ValidateID("plugin", name); err != nil {
		return err
	}
	if err := ValidateAllocationType("type", typ); err != nil {
		return err
	}
	if err := r.ready(); err != nil {
		return err
	}
	for _, role := range plugin.Type(typ).Roles() {
		if err := r.registry.WaitHealthy(ctx, name, role); err != nil {
			return mapErr(err)
		}
	}
	return nil
}

// Events returns the most recent events (at most RecentEvents), oldest first.
func (r *Runtime) Events(ctx context.Context) ([]Event, error) {
	if err := r.ready(); err != nil {
		return nil, err
	}
	return r.events.recent(), nil
}

// RecordEvent adds e to the event list and sends it to subscribers, for
// components built on the runtime that report their own events (package
// dockerplugin). A zero Time is now. It fails with a *FieldError when
// e.Type is empty, and with ErrShutdown once the runtime shuts down.
func (r *Runtime) RecordEvent(e Event) error {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if err := e.Validate(); err != nil {
		return err
	}
	if err := r.ready(); err != nil {
		return err
	}
	r.events.publish(e)
	return nil
}

// Subscribe returns a channel that receives the recent events, oldest first,
// then every later event with no gap. It is closed when ctx is done or the
// runtime shuts down. A subscriber that falls more than RecentEvents behind
// loses its oldest undelivered events and receives one EventsDropped event
// in their place; it never slows the runtime.
func (r *Runtime) Subscribe(ctx context.Context) (<-chan Event, error) {
	if err := r.ready(); err != nil {
		return nil, err
	}
	return r.events.subscribe(ctx)
}

// forwardRegistryEvents turns registry events into runtime events until
// the subscription ends.
func (r *Runtime) forwardRegistryEvents(sub *actorkit.Subscription[registry.Event]) {
	defer r.wg.Done()
	for e := range sub.C {
		// Any change of an allocation can change where operations go.
		r.plugins.invalidate()
		r.kickControllers()
		if r.proxy != nil && (e.Type == registry.EventRegistered || e.Type == registry.EventDeregistered || e.Type == registry.EventLagged) {
			r.proxy.sync(context.Background())
		}
		ev := Event{Time: e.Time, Plugin: e.Plugin, Alloc: e.Alloc, Message: e.Message}
		switch e.Type {
		case registry.EventRegistered:
			ev.Type = EventAllocationRegistered
			r.csiStats.InitRetries(e.Plugin, retriedMethods...)
		case registry.EventDeregistered:
			ev.Type = EventAllocationDeregistered
			r.host.deregistered(e.Alloc)
		case registry.EventHealthChanged:
			ev.Type = EventHealthChanged
			r.host.healthChanged(r.done, e.Alloc, e.Plugin, e.Healthy)
		case registry.EventSingletonChanged, registry.EventActiveChanged:
			ev.Type = EventSingletonChanged
			if e.Type == registry.EventActiveChanged {
				ev.Type = EventActiveChanged
			}
		case registry.EventNodeInfoChanged:
			ev.Type = EventNodeInfoChanged
		case registry.EventPluginHung:
			ev.Type = EventPluginHung
		case registry.EventLagged:
			r.host.lagged(r.done)
			ev.Type = EventsDropped
			ev.Message = fmt.Sprintf("runtime fell behind the registry and lost %d events", e.Dropped)
		default:
			continue
		}
		if ev.Time.IsZero() {
			ev.Time = time.Now()
		}
		r.events.publish(ev)
	}
}

// volumeEvent receives the volume manager's events.
func (r *Runtime) volumeEvent(e volume.Event) {
	r.events.publish(Event{
		Time: e.Time, Type: e.Type, Plugin: e.Plugin, Alloc: e.Alloc,
		Volume: e.Volume, Message: e.Message,
	})
}
