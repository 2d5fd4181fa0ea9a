package registry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/plugin/proc"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/kinderr"
)

// Handle is the registry as seen from outside the actor system. Its
// methods block until the registry answered, ctx ended, or
// Config.RequestTimeout passed (when ctx has no deadline). It is safe for
// concurrent use.
type Handle struct {
	system  *actor.ActorSystem
	pid     *actor.PID
	cfg     Config
	sh      *shared
	guard   *actorkit.Supervisor
	ownsL   bool
	reg     prometheus.Registerer
	metrics []prometheus.Collector

	stopOnce sync.Once
	stopErr  error
	stopped  chan struct{}
}

// Start spawns the registry actor in system and returns its handle. It
// first applies Config.ConfigAllocations to the store (see there); the
// registry then restores every stored allocation as it starts. An error
// wraps ErrInvalidConfig (naming the field or the config allocation) or
// ErrStore. Call Shutdown before shutting the actor system down.
func Start(ctx context.Context, system *actor.ActorSystem, cfg Config) (*Handle, error) {
	h, _, err := start(ctx, system, cfg, false, 0)
	return h, err
}

// StartSubscribed is Start with a subscription (see Handle.Subscribe)
// taken before the registry actor starts, so that it has every event the
// registry publishes, those of the allocations Start itself registers and
// restores too, which a Subscribe after Start may miss.
func StartSubscribed(ctx context.Context, system *actor.ActorSystem, cfg Config, buffer int) (*Handle, *actorkit.Subscription[Event], error) {
	return start(ctx, system, cfg, true, buffer)
}

func start(ctx context.Context, system *actor.ActorSystem, cfg Config, subscribe bool, buffer int) (*Handle, *actorkit.Subscription[Event], error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	cfg = cfg.withDefaults()
	if err := reconcile(ctx, cfg); err != nil {
		return nil, nil, err
	}
	h := &Handle{system: system, cfg: cfg, reg: cfg.Registerer, stopped: make(chan struct{})}
	restarts := cfg.Restarts
	if restarts == nil {
		restarts = actorkit.NewRestartCounter()
		h.metrics = append(h.metrics, restarts)
	}
	sh := &shared{
		broker: actorkit.NewBroker(func(n uint64) Event {
			return Event{Time: time.Now(), Type: EventLagged, Dropped: n, Message: fmt.Sprintf("%d events dropped", n)}
		}),
		transitions: map[key]uint64{},
		hung:        map[string]uint64{},
	}
	h.sh = sh
	h.metrics = append(h.metrics, newCollector(sh))
	if h.reg != nil {
		for i, c := range h.metrics {
			if err := h.reg.Register(c); err != nil {
				for _, done := range h.metrics[:i] {
					h.reg.Unregister(done)
				}
				return nil, nil, fmt.Errorf("registry: register metrics: %w", err)
			}
		}
	}
	var err error
	sh.sup, err = actorkit.NewSupervisor("plugin", cfg.Supervisor, cfg.Log, restarts, actorkit.Hooks{})
	if err != nil {
		h.unregister()
		return nil, nil, err
	}
	h.guard, err = actorkit.NewSupervisor("registry", cfg.Supervisor, cfg.Log, restarts, actorkit.Hooks{})
	if err != nil {
		h.unregister()
		return nil, nil, err
	}
	if cfg.Plugin.Launcher == nil {
		cfg.Plugin.Launcher = proc.NewLauncher()
		h.ownsL = true
	}
	sh.launcher = cfg.Plugin.Launcher
	h.cfg = cfg
	var sub *actorkit.Subscription[Event]
	if subscribe {
		if buffer <= 0 {
			buffer = cfg.EventBuffer
		}
		// The broker is new and open: Subscribe cannot fail here.
		sub, _ = sh.broker.Subscribe(buffer)
	}
	props := actor.PropsFromProducer(func() actor.Actor { return newActor(cfg, sh) },
		actor.WithSupervisor(sh.sup), actor.WithGuardian(h.guard))
	h.pid, err = system.Root.SpawnNamed(props, cfg.Name)
	if err != nil {
		if sub != nil {
			sub.Cancel()
		}
		h.release()
		return nil, nil, fmt.Errorf("registry: spawn: %w", err)
	}
	return h, sub, nil
}

// PID returns the registry actor, for actors that message it directly.
func (h *Handle) PID() *actor.PID { return h.pid }

func (h *Handle) ask(ctx context.Context, msg any, timeout time.Duration) (any, error) {
	select {
	case <-h.stopped:
		return nil, ErrStopped
	default:
	}
	if _, ok := ctx.Deadline(); ok {
		timeout = 0 // ctx decides
	}
	r, err := actorkit.Request(ctx, h.system, h.pid, msg, timeout)
	if errors.Is(err, actorkit.ErrNoActor) {
		return nil, fmt.Errorf("%w: %w", ErrStopped, err)
	}
	return r, err
}

// Register registers an allocation through the API (its source is
// SourceAPI; see the package doc for idempotency) and returns it as
// registered. spec must pass plugin.Spec.Validate, which looks a bare
// command name up in the agent's PATH. The allocation's actor is started;
// it is healthy once its first fingerprint succeeds (see WaitHealthy).
//
// An ID the config file owns (SourceConfig) can be registered again with
// its spec, which changes nothing; with another spec it is ErrConflict:
// change it in the config file.
func (h *Handle) Register(ctx context.Context, spec plugin.Spec) (AllocationInfo, error) {
	r, err := h.ask(ctx, &Register{Spec: spec}, h.cfg.RequestTimeout)
	if err != nil {
		return AllocationInfo{}, fmt.Errorf("register %s: %w", spec.ID, err)
	}
	res := r.(*RegisterResult)
	return res.Alloc, res.Err
}

// RegisterFrom is Register for an allocation from src: SourceAPI, or
// SourceRegistration (a driver of the watched registration directory,
// shown as such, and refused with ErrConflict when the ID was registered
// from another source).
func (h *Handle) RegisterFrom(ctx context.Context, spec plugin.Spec, src Source) (AllocationInfo, error) {
	if src != SourceAPI && src != SourceRegistration {
		return AllocationInfo{}, fmt.Errorf("register %s: source %q cannot register allocations", spec.ID, src)
	}
	r, err := h.ask(ctx, &Register{Spec: spec, Source: src}, h.cfg.RequestTimeout)
	if err != nil {
		return AllocationInfo{}, fmt.Errorf("register %s: %w", spec.ID, err)
	}
	res := r.(*RegisterResult)
	return res.Alloc, res.Err
}

// Deregister removes the allocation id and returns when its actor has
// stopped: its process (if exec-managed) is gone and its client closed.
// An allocation of the config file can be deregistered too; it is
// registered again on the next Start unless the config drops it.
// Operations go to another allocation from the moment the registry handles
// the request. When ctx ends first, the deregistration still completes.
func (h *Handle) Deregister(ctx context.Context, id string) error {
	timeout := max(h.cfg.RequestTimeout, h.cfg.Plugin.StopGrace+15*time.Second)
	r, err := h.ask(ctx, &Deregister{ID: id}, timeout)
	if err != nil {
		return fmt.Errorf("deregister %s: %w", id, err)
	}
	return r.(*DeregisterResult).Err
}

// Allocations lists every registered allocation, by plugin, newest first.
func (h *Handle) Allocations(ctx context.Context) ([]AllocationInfo, error) {
	r, err := h.ask(ctx, &ListAllocations{}, h.cfg.RequestTimeout)
	if err != nil {
		return nil, fmt.Errorf("list allocations: %w", err)
	}
	return r.(*AllocationsResult).Allocs, nil
}

// Allocation returns one allocation; the error wraps ErrAllocationNotFound
// when there is none with that ID.
func (h *Handle) Allocation(ctx context.Context, id string) (AllocationInfo, error) {
	all, err := h.Allocations(ctx)
	if err != nil {
		return AllocationInfo{}, err
	}
	for _, a := range all {
		if a.ID == id {
			return a, nil
		}
	}
	return AllocationInfo{}, kinderr.Errorf(ErrAllocationNotFound, "allocation %q not found", id)
}

// Plugins summarizes every plugin, by name.
func (h *Handle) Plugins(ctx context.Context) ([]PluginSummary, error) {
	r, err := h.ask(ctx, &GetPlugins{}, h.cfg.RequestTimeout)
	if err != nil {
		return nil, fmt.Errorf("list plugins: %w", err)
	}
	res := r.(*PluginsResult)
	return res.Plugins, res.Err
}

// Plugin summarizes one plugin; the error wraps ErrPluginNotFound when it
// has no allocation.
func (h *Handle) Plugin(ctx context.Context, name string) (PluginSummary, error) {
	r, err := h.ask(ctx, &GetPlugins{Name: name}, h.cfg.RequestTimeout)
	if err != nil {
		return PluginSummary{}, fmt.Errorf("get plugin %s: %w", name, err)
	}
	res := r.(*PluginsResult)
	if res.Err != nil {
		return PluginSummary{}, res.Err
	}
	return res.Plugins[0], nil
}

// Client returns where operations on plugin in role go now: the newest
// healthy allocation's client. The error wraps ErrPluginNotFound (no
// allocation in that role) or ErrNoHealthyPlugin (none healthy).
func (h *Handle) Client(ctx context.Context, pluginName string, role plugin.Role) (Target, error) {
	r, err := h.ask(ctx, &GetClient{Plugin: pluginName, Role: role}, h.cfg.RequestTimeout)
	if err != nil {
		return Target{}, fmt.Errorf("client for %s %s: %w", pluginName, role, err)
	}
	res := r.(*ClientResult)
	return res.Target, res.Err
}

// Refingerprint asks every running node-serving allocation of plugin to
// fingerprint at once (see the Refingerprint message). It does not wait.
func (h *Handle) Refingerprint(pluginName string) {
	select {
	case <-h.stopped:
		return
	default:
	}
	h.system.Root.Send(h.pid, &Refingerprint{Plugin: pluginName})
}

// WaitHealthy blocks until plugin has a healthy allocation in role, or ctx
// ends (it returns ctx's error). It returns at once with an error wrapping
// ErrPluginNotFound when the plugin has no allocation in that role.
func (h *Handle) WaitHealthy(ctx context.Context, pluginName string, role plugin.Role) error {
	return h.WaitUntil(ctx, pluginName, func() (bool, error) {
		_, err := h.Client(ctx, pluginName, role)
		return !errors.Is(err, ErrNoHealthyPlugin), err
	})
}

// WaitUntil calls check until it says done, again after each registry
// event about pluginName (or a lag, which may hide one), and returns
// check's error then; it returns ctx's error when ctx ends first, and
// ErrStopped when the registry stops. It subscribes before the first
// check, so that no change between a check and the wait is missed.
func (h *Handle) WaitUntil(ctx context.Context, pluginName string, check func() (done bool, err error)) error {
	sub, err := h.Subscribe(16)
	if err != nil {
		return err
	}
	defer sub.Cancel()
	for {
		if done, err := check(); done {
			return err
		}
	wait:
		for {
			select {
			case ev, ok := <-sub.C:
				if !ok {
					return ErrStopped
				}
				if ev.Type == EventLagged || ev.Plugin == pluginName {
					break wait
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// Subscribe returns a feed of registry events. buffer is how many events
// may wait for the subscriber (0 means Config.EventBuffer); beyond that the
// oldest are dropped and an EventLagged event says how many. Cancel the
// subscription when done; Shutdown closes it.
func (h *Handle) Subscribe(buffer int) (*actorkit.Subscription[Event], error) {
	if buffer <= 0 {
		buffer = h.cfg.EventBuffer
	}
	s, err := h.sh.broker.Subscribe(buffer)
	if errors.Is(err, actorkit.ErrBrokerClosed) {
		return nil, ErrStopped
	}
	return s, err
}

// Shutdown stops every allocation actor (each closes its client, runs its
// last fingerprint, and leaves its plugin process running for the next
// agent to adopt, or stops it when Config.Plugin.StopOnShutdown is set),
// waits until their final
// states are persisted, then stops the registry actor, closes every
// subscription and releases the launcher and metrics. It is idempotent;
// later calls return the first call's result. When ctx ends first, the
// registry is stopped anyway and ctx's error is returned.
func (h *Handle) Shutdown(ctx context.Context) error {
	h.stopOnce.Do(func() {
		_, err := actorkit.Request(ctx, h.system, h.pid, &shutdownAll{}, 0)
		if err != nil && !errors.Is(err, actorkit.ErrNoActor) {
			h.stopErr = fmt.Errorf("registry shutdown: %w", err)
		}
		close(h.stopped)
		// Stopping the registry stops any allocation actor still running
		// (after a ctx timeout) and waits for it.
		if err := h.system.Root.StopFuture(h.pid).Wait(); err != nil && h.stopErr == nil {
			h.stopErr = fmt.Errorf("registry shutdown: %w", err)
		}
		h.release()
	})
	return h.stopErr
}

func (h *Handle) release() {
	h.sh.sup.Close()
	h.guard.Close()
	h.sh.broker.Close()
	if h.ownsL {
		h.sh.launcher.Close()
	}
	h.unregister()
}

func (h *Handle) unregister() {
	if h.reg == nil {
		return
	}
	for _, c := range h.metrics {
		h.reg.Unregister(c)
	}
}
