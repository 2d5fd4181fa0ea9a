package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/persistence"
)

// storeTimeout bounds each store call made by the registry.
const storeTimeout = 30 * time.Second

func storeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), storeTimeout)
}

// onStarted restores every stored allocation. A store that cannot be read
// makes the registry fail; its supervisor restarts it with backoff.
func (r *Actor) onStarted(ctx actor.Context) {
	sctx, cancel := storeCtx()
	recs, err := r.cfg.Store.Allocations(sctx)
	cancel()
	if err != nil {
		panic(fmt.Errorf("restore allocations: %w", err))
	}
	for _, rec := range recs {
		spec := specFromRecord(rec)
		e := &entry{rec: rec, spec: spec}
		r.allocs[rec.ID] = e
		if spec.ExecManaged() {
			spec.Socket = "" // recomputed from this run's data dir
		}
		spec, err := spec.WithSocket(r.cfg.DataDir)
		if err != nil {
			e.fail("failed: cannot restore: " + err.Error())
			r.log.WithError(err).WithField("alloc", rec.ID).Error("cannot restore allocation")
			continue
		}
		e.spec = spec
		r.spawn(ctx, e, plugin.StaleProcess{PID: rec.PID, PIDStart: rec.PIDStart})
		r.emit(Event{Type: EventRegistered, Plugin: spec.Plugin, Alloc: spec.ID,
			Message: fmt.Sprintf("%s allocation restored (seq %d, from the %s)", spec.Type, rec.Seq, sourceText(e.rec))})
	}
	if len(recs) > 0 {
		r.log.WithField("allocations", len(recs)).Info("restored plugin allocations")
	}
	r.reelect()
	r.publish()
}

// spawn starts the allocation actor of e.
func (r *Actor) spawn(ctx actor.Context, e *entry, stale plugin.StaleProcess) {
	var opts []actor.PropsOption
	if len(r.cfg.ChildMiddleware) > 0 {
		opts = append(opts, actor.WithReceiverMiddleware(r.cfg.ChildMiddleware...))
	}
	props, err := plugin.Props(r.cfg.Plugin, e.spec, stale, opts...)
	if err != nil {
		e.fail("failed: " + err.Error())
		return
	}
	r.sh.spawned++
	pid, err := ctx.SpawnNamed(props, fmt.Sprintf("alloc-%s-%d", e.spec.ID, r.sh.spawned))
	if err != nil {
		e.fail("failed: " + err.Error())
		return
	}
	e.pid, e.pidID = pid, pid.Id
	e.failed = ""
	e.status = plugin.Status{Description: "starting", Since: time.Now()}
}

// fail marks e as not running for good (until registered again).
func (e *entry) fail(why string) {
	e.failed = why
	e.pid = nil
	e.status.Healthy = false
	e.status.Description = why
	e.status.Client = nil
	e.status.Since = time.Now()
}

func (r *Actor) onRegister(ctx actor.Context, m *Register) *RegisterResult {
	if r.shutting {
		return &RegisterResult{Err: ErrStopped}
	}
	spec, err := m.Spec.WithSocket(r.cfg.DataDir)
	if err != nil {
		return &RegisterResult{Err: err}
	}
	if err := spec.Validate(); err != nil { // the PATH lookup WithSocket leaves out
		return &RegisterResult{Err: err}
	}
	src := m.Source
	if src == "" {
		src = SourceAPI
	}
	if e := r.allocs[spec.ID]; e != nil {
		switch {
		case e.stopping:
			return &RegisterResult{Err: kinderr.Errorf(ErrBusy, "allocation %q is being deregistered; register it again when that is done", spec.ID)}
		case src == SourceRegistration && sourceOf(e.rec.Source) != SourceRegistration:
			return &RegisterResult{Err: kinderr.Errorf(ErrConflict, "allocation %q was registered from the %s; deregister it first",
				spec.ID, sourceText(e.rec))}
		case !e.spec.Equal(spec) && sourceOf(e.rec.Source) == SourceConfig:
			return &RegisterResult{Err: kinderr.Errorf(ErrConflict,
				"allocation %q comes from the config file, with a different %s; change it there", spec.ID, specDiff(e.spec, spec))}
		case !e.spec.Equal(spec):
			return &RegisterResult{Err: kinderr.Errorf(ErrConflict,
				"allocation %q is registered with a different %s; deregister it first", spec.ID, specDiff(e.spec, spec))}
		case e.pid == nil:
			r.spawn(ctx, e, plugin.StaleProcess{})
			r.emit(Event{Type: EventRegistered, Plugin: spec.Plugin, Alloc: spec.ID,
				Message: fmt.Sprintf("%s allocation restarted by a new registration", spec.Type)})
			r.reelect(spec.Plugin)
			r.publish()
		}
		return &RegisterResult{Alloc: r.info(e)}
	}
	for _, o := range r.allocs {
		if o.spec.Socket == spec.Socket && !o.stopping {
			return &RegisterResult{Err: kinderr.Errorf(ErrConflict, "socket %q is already used by allocation %q", spec.Socket, o.spec.ID)}
		}
	}
	now := time.Now()
	rec := recordFromSpec(spec)
	rec.Source = string(src)
	rec.HealthMsg = "starting"
	rec.CreatedAt, rec.UpdatedAt = now, now
	sctx, cancel := storeCtx()
	rec, err = r.cfg.Store.PutAllocation(sctx, rec)
	cancel()
	if err != nil {
		return &RegisterResult{Err: kinderr.Errorf(ErrStore, "cannot record allocation %q: %w", spec.ID, err)}
	}
	e := &entry{rec: rec, spec: spec}
	r.allocs[spec.ID] = e
	r.spawn(ctx, e, plugin.StaleProcess{})
	r.log.WithField("alloc", spec.ID).WithField("plugin", spec.Plugin).WithField("seq", rec.Seq).Info("allocation registered")
	msg := fmt.Sprintf("%s allocation registered (seq %d)", spec.Type, rec.Seq)
	if src != SourceAPI {
		msg = fmt.Sprintf("%s allocation registered (seq %d, from the %s)", spec.Type, rec.Seq, sourceText(rec))
	}
	r.emit(Event{Type: EventRegistered, Plugin: spec.Plugin, Alloc: spec.ID, Message: msg})
	r.reelect(spec.Plugin)
	r.publish()
	return &RegisterResult{Alloc: r.info(e), Created: true}
}

// specDiff names the first field in which a and b differ.
func specDiff(a, b plugin.Spec) string {
	switch {
	case a.Plugin != b.Plugin:
		return "plugin"
	case a.Type != b.Type:
		return "type"
	case a.Socket != b.Socket:
		return "socket"
	case !plugin.Spec{Command: a.Command}.Equal(plugin.Spec{Command: b.Command}):
		return "command"
	case !plugin.Spec{Image: a.Image}.Equal(plugin.Spec{Image: b.Image}):
		return "image"
	}
	return "env"
}

func (r *Actor) onDeregister(ctx actor.Context, m *Deregister) {
	e := r.allocs[m.ID]
	if e == nil {
		ctx.Respond(&DeregisterResult{Err: kinderr.Errorf(ErrAllocationNotFound, "allocation %q not found", m.ID)})
		return
	}
	if e.stopping {
		e.waiters = append(e.waiters, ctx.Sender())
		return
	}
	sctx, cancel := storeCtx()
	err := r.cfg.Store.DeleteAllocation(sctx, m.ID)
	cancel()
	if err != nil && !errors.Is(err, persistence.ErrNotFound) {
		ctx.Respond(&DeregisterResult{Err: kinderr.Errorf(ErrStore, "cannot record the deregistration of allocation %q: %w", m.ID, err)})
		return
	}
	e.stopping = true
	msg := fmt.Sprintf("%s allocation deregistered", e.spec.Type)
	if sourceOf(e.rec.Source) == SourceConfig {
		msg += "; it is in the config file, so it comes back when the agent restarts"
	}
	r.log.WithField("alloc", m.ID).WithField("plugin", e.spec.Plugin).Info(msg)
	r.emit(Event{Type: EventDeregistered, Plugin: e.spec.Plugin, Alloc: m.ID, Message: msg})
	r.reelect(e.spec.Plugin) // hand over at once
	r.publish()
	if e.pid == nil {
		delete(r.allocs, m.ID)
		ctx.Respond(&DeregisterResult{})
		return
	}
	e.waiters = append(e.waiters, ctx.Sender())
	if r.shutting {
		return // already told to stop
	}
	ctx.Send(e.pid, &plugin.Shutdown{Reason: plugin.ReasonDeregistered})
}

// current returns the entry of a message from an allocation actor, or nil
// when the sender is not the entry's current actor (a message from a
// previous incarnation of the registry's children).
func (r *Actor) current(ctx actor.Context, id string) *entry {
	e := r.allocs[id]
	if e == nil || ctx.Sender() == nil || ctx.Sender().Id != e.pidID {
		return nil
	}
	return e
}

func (r *Actor) onStatusChanged(ctx actor.Context, m *plugin.StatusChanged) {
	e := r.current(ctx, m.ID)
	if e == nil || e.pid == nil {
		return
	}
	old := e.status
	e.status = m.Status
	if e.stopping {
		return
	}
	r.hungEvent(e, old)
	r.healthEvent(e, old)
	r.nodeInfoEvent(e, old)
	r.persistStatus(e)
	if old.Healthy != e.status.Healthy {
		r.reelect(e.spec.Plugin)
		r.publish()
	}
}

// healthEvent counts a health transition and emits health_changed when the
// health or its description changed.
func (r *Actor) healthEvent(e *entry, old plugin.Status) {
	if old.Healthy == e.status.Healthy && old.Description == e.status.Description {
		return
	}
	if old.Healthy != e.status.Healthy {
		for _, role := range e.spec.Type.Roles() {
			r.sh.transitions[key{e.spec.Plugin, role}]++
		}
	}
	r.emit(Event{Type: EventHealthChanged, Plugin: e.spec.Plugin, Alloc: e.spec.ID, Healthy: e.status.Healthy, Message: e.status.Description})
}

// hungEvent counts an allocation found with hung node RPCs and emits
// plugin_hung, before the health change it brings.
func (r *Actor) hungEvent(e *entry, old plugin.Status) {
	if e.status.Hung <= old.Hung {
		return // the same, or a new incarnation of the actor counting anew
	}
	r.sh.hung[e.spec.Plugin] += uint64(e.status.Hung - old.Hung)
	r.publish() // before the event: who sees the event sees the count
	r.emit(Event{Type: EventPluginHung, Plugin: e.spec.Plugin, Alloc: e.spec.ID, Healthy: e.status.Healthy, Message: e.status.Description})
}

// nodeInfoEvent emits node_info_changed when the fingerprint's NodeGetInfo
// answer changed and the health did not (a health change has its event).
func (r *Actor) nodeInfoEvent(e *entry, old plugin.Status) {
	n, o := e.status.Fingerprint.NodeInfo, old.Fingerprint.NodeInfo
	if n == nil || o == nil || old.Healthy != e.status.Healthy {
		return
	}
	if n.NodeID == o.NodeID && n.MaxVolumesPerNode == o.MaxVolumesPerNode && maps.Equal(n.AccessibleTopology, o.AccessibleTopology) {
		return
	}
	r.emit(Event{Type: EventNodeInfoChanged, Plugin: e.spec.Plugin, Alloc: e.spec.ID, Healthy: e.status.Healthy,
		Message: fmt.Sprintf("max_volumes_per_node %d", n.MaxVolumesPerNode)})
}

// onRefingerprint asks the running node-serving allocations of m.Plugin
// to fingerprint now.
func (r *Actor) onRefingerprint(ctx actor.Context, m *Refingerprint) {
	for _, e := range r.allocs {
		if e.spec.Plugin == m.Plugin && e.pid != nil && !e.stopping && e.spec.Type.Serves(plugin.Node) {
			ctx.Send(e.pid, &plugin.Refingerprint{})
		}
	}
}

// persistStatus writes the status fields of the record when they changed.
func (r *Actor) persistStatus(e *entry) {
	rec := e.rec
	fp := e.status.Fingerprint
	rec.Healthy, rec.HealthMsg = e.status.Healthy, e.status.Description
	rec.PID, rec.PIDStart = e.status.PID, e.status.PIDStart
	if !fp.At.IsZero() {
		rec.Provider, rec.Version, rec.ControllerRequired = fp.Provider, fp.Version, fp.ControllerRequired
		if fp.NodeInfo != nil {
			rec.NodeID = fp.NodeInfo.NodeID
		}
	}
	if sameRecord(rec, e.rec) {
		return
	}
	rec.UpdatedAt = time.Now()
	sctx, cancel := storeCtx()
	saved, err := r.cfg.Store.PutAllocation(sctx, rec)
	cancel()
	if err != nil {
		r.log.WithError(err).WithField("alloc", e.spec.ID).Error("persist allocation status")
		return
	}
	e.rec = saved
}

func sameRecord(a, b persistence.Allocation) bool {
	return a.Healthy == b.Healthy && a.HealthMsg == b.HealthMsg && a.PID == b.PID && a.PIDStart == b.PIDStart &&
		a.Provider == b.Provider && a.Version == b.Version && a.NodeID == b.NodeID &&
		a.ControllerRequired == b.ControllerRequired
}

func (r *Actor) onStopped(ctx actor.Context, m *plugin.Stopped) {
	e := r.current(ctx, m.ID)
	if e == nil {
		return
	}
	old := e.status
	e.status = m.Status
	e.pid = nil
	switch {
	case e.stopping:
		delete(r.allocs, m.ID)
		for _, w := range e.waiters {
			if w != nil {
				ctx.Send(w, &DeregisterResult{})
			}
		}
	case r.shutting:
		r.persistStatus(e) // the final "agent shutting down"
	default:
		// Stopped without being asked: its supervisor gave up on it.
		if e.failed == "" {
			e.failed = "failed: allocation actor stopped"
		}
		e.status.Description = e.failed
		r.healthEvent(e, old)
		r.persistStatus(e)
	}
	if e.awaitStop {
		e.awaitStop = false
		r.pending--
		if r.pending == 0 && r.shutdownReply != nil {
			ctx.Send(r.shutdownReply, &shutdownDone{})
			r.shutdownReply = nil
		}
	}
	if r.shutting {
		if r.pending == 0 {
			r.reelect()
			r.publish()
		}
		return // elect and publish once, after the last one
	}
	r.reelect(e.spec.Plugin)
	r.publish()
}

// onChildGaveUp records why the supervisor stopped an allocation actor for
// good. The allocation is marked failed when its actor has stopped (its
// Stopped may come before or after this message), so that registering it
// again never starts a second actor beside one still tearing down.
func (r *Actor) onChildGaveUp(m *actorkit.ChildGaveUp) {
	for _, e := range r.allocs {
		if e.pidID != m.Child.Id {
			continue
		}
		why := fmt.Sprintf("failed: allocation actor gave up after %d failures: %s", m.Failures, reasonText(m.Reason))
		r.log.WithField("alloc", e.spec.ID).Error(why)
		e.failed = why
		if e.pid != nil || e.stopping {
			return // onStopped marks it
		}
		old := e.status
		e.status.Healthy, e.status.Description, e.status.Client = false, why, nil
		r.healthEvent(e, old)
		r.persistStatus(e)
		r.publish()
		return
	}
}

func reasonText(v any) string {
	if err, ok := v.(error); ok {
		return err.Error()
	}
	return fmt.Sprint(v)
}

func (r *Actor) onShutdown(ctx actor.Context) {
	r.shutting = true
	for _, e := range r.allocs {
		if e.pid == nil || e.awaitStop {
			continue
		}
		e.awaitStop = true
		r.pending++
		if !e.stopping {
			ctx.Send(e.pid, &plugin.Shutdown{Reason: plugin.ReasonShutdown})
		}
	}
	if r.pending == 0 {
		ctx.Respond(&shutdownDone{})
		return
	}
	r.shutdownReply = ctx.Sender()
	r.log.WithField("allocations", r.pending).Info("stopping plugin allocations")
}

func (r *Actor) onGetPlugins(m *GetPlugins) *PluginsResult {
	all := r.summaries(r.infos())
	if m.Name == "" {
		return &PluginsResult{Plugins: all}
	}
	for _, s := range all {
		if s.Name == m.Name {
			return &PluginsResult{Plugins: []PluginSummary{s}}
		}
	}
	return &PluginsResult{Err: kinderr.Errorf(ErrPluginNotFound, "plugin %q not found", m.Name)}
}

func (r *Actor) onGetClient(m *GetClient) *ClientResult {
	k := key{m.Plugin, m.Role}
	c, ok := r.elected[k]
	if !ok || c.singleton == "" {
		return &ClientResult{Err: kinderr.Errorf(ErrPluginNotFound, "plugin %q has no %s allocation", m.Plugin, m.Role)}
	}
	if c.active == "" {
		s := r.allocs[c.singleton]
		return &ClientResult{Err: &UnhealthyError{Plugin: m.Plugin, Role: m.Role,
			Msg: fmt.Sprintf("plugin %q has no healthy %s allocation (newest, %s: %s)", m.Plugin, m.Role, c.singleton, s.status.Description)}}
	}
	e := r.allocs[c.active]
	return &ClientResult{Target: Target{
		Alloc:              e.spec.ID,
		Client:             e.status.Client,
		Fingerprint:        e.status.Fingerprint,
		Singleton:          c.active == c.singleton,
		ControllerRequired: r.controllerRequired(m.Plugin),
	}}
}

// controllerRequired is the plugin-level controller_required: some
// allocation says the plugin needs a controller and some controller
// supports PUBLISH_UNPUBLISH_VOLUME (from fingerprints, or the persisted
// value before the first fingerprint).
func (r *Actor) controllerRequired(name string) bool {
	var requires, publishes bool
	for _, e := range r.allocs {
		if e.spec.Plugin != name || e.stopping {
			continue
		}
		fp := e.status.Fingerprint
		if fp.At.IsZero() && e.rec.ControllerRequired {
			return true
		}
		requires = requires || fp.RequiresController
		publishes = publishes || (fp.Controller != nil && fp.Controller.PublishUnpublishVolume)
	}
	return requires && publishes
}

func specFromRecord(rec persistence.Allocation) plugin.Spec {
	return plugin.Spec{
		ID:      rec.ID,
		Plugin:  rec.Plugin,
		Type:    plugin.Type(rec.Type),
		Socket:  rec.Socket,
		Command: rec.Command,
		Env:     rec.Env,
		Image:   rec.Image.Clone(),
	}
}

func recordFromSpec(s plugin.Spec) persistence.Allocation {
	return persistence.Allocation{
		ID:      s.ID,
		Plugin:  s.Plugin,
		Type:    string(s.Type),
		Socket:  s.Socket,
		Command: s.Command,
		Env:     s.Env,
		Image:   s.Image.Clone(),
	}
}

// sourceText says where rec came from, for messages.
func sourceText(rec persistence.Allocation) string {
	switch sourceOf(rec.Source) {
	case SourceConfig:
		return "config file"
	case SourceRegistration:
		return "registration directory"
	}
	return "API"
}
