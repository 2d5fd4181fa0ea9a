package registry

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/plugin/proc"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/persistence"
)

// key is one plugin in one role.
type key struct {
	plugin string
	role   plugin.Role
}

// choice is the outcome of an election for one key.
type choice struct {
	singleton string // newest allocation; "" when none
	active    string // newest healthy allocation; "" when none
}

// entry is the registry's record of one allocation.
type entry struct {
	rec    persistence.Allocation // as last persisted
	spec   plugin.Spec
	pid    *actor.PID // the allocation actor; nil when it is not running
	pidID  string     // the last actor's ID, kept after it stopped
	status plugin.Status

	stopping  bool         // deregistered; waiting for Stopped
	waiters   []*actor.PID // Deregister callers to answer once stopped
	awaitStop bool         // counted in the shutdown's pending stops
	failed    string       // the actor gave up or could not start
}

// shared is what outlives a restart of the registry actor. Its broker,
// snapshot, supervisor and launcher are safe for concurrent use;
// transitions, hung and spawned are only touched by the registry actor's
// goroutine.
type shared struct {
	broker      *actorkit.Broker[Event]
	snap        atomic.Pointer[snapshot]
	sup         *actorkit.Supervisor
	launcher    *proc.Launcher
	transitions map[key]uint64
	hung        map[string]uint64 // by plugin: allocations found with hung node RPCs
	// spawned numbers allocation actors, so that no two actors ever have
	// the same name, even across registry restarts (their messages are
	// told apart by sender).
	spawned uint64
}

// snapshot is a read-only copy of the registry's state for metrics.
type snapshot struct {
	allocs      []AllocationInfo
	transitions map[key]uint64
	hung        map[string]uint64
}

// candidates returns the allocations of k that take part in elections
// (deregistered ones do not), newest first.
func candidates(allocs map[string]*entry, k key) []*entry {
	var out []*entry
	for _, e := range allocs {
		if e.spec.Plugin == k.plugin && e.spec.Type.Serves(k.role) && !e.stopping {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *entry) int { return cmp.Compare(b.rec.Seq, a.rec.Seq) })
	return out
}

// elect picks the singleton (the newest) and the active allocation (the
// newest healthy one) among cands, sorted newest first.
func elect(cands []*entry) choice {
	var c choice
	for _, e := range cands {
		if c.singleton == "" {
			c.singleton = e.spec.ID
		}
		if e.status.Healthy && e.pid != nil {
			c.active = e.spec.ID
			break
		}
	}
	return c
}

// keys returns the plugin and role pairs to elect: those of the given
// plugins (every plugin when none is given), including pairs that had an
// election before (so a role that lost its last allocation is elected to
// nothing).
func (r *Actor) keys(plugins []string) map[key]bool {
	want := func(p string) bool { return len(plugins) == 0 || slices.Contains(plugins, p) }
	ks := map[key]bool{}
	for _, e := range r.allocs {
		if want(e.spec.Plugin) {
			for _, role := range e.spec.Type.Roles() {
				ks[key{e.spec.Plugin, role}] = true
			}
		}
	}
	for k := range r.elected {
		if want(k.plugin) {
			ks[k] = true
		}
	}
	return ks
}

// reelect runs the elections of the given plugins (all when none is
// given) and emits singleton_changed and active_changed for every plugin
// and role whose outcome changed.
func (r *Actor) reelect(plugins ...string) {
	for k := range r.keys(plugins) {
		old := r.elected[k]
		now := elect(candidates(r.allocs, k))
		if now == (choice{}) {
			delete(r.elected, k)
		} else {
			r.elected[k] = now
		}
		if now.singleton != old.singleton {
			r.emit(Event{Type: EventSingletonChanged, Plugin: k.plugin, Role: k.role, Alloc: now.singleton,
				Healthy: r.healthy(now.singleton), Message: singletonMessage(k.role, old.singleton, now.singleton)})
		}
		if now.active != old.active {
			r.emit(Event{Type: EventActiveChanged, Plugin: k.plugin, Role: k.role, Alloc: now.active,
				Healthy: now.active != "", Message: activeMessage(k.role, old.active, now.active)})
		}
	}
}

func (r *Actor) healthy(id string) bool {
	e := r.allocs[id]
	return e != nil && e.status.Healthy
}

// singletonMessage says, as a sentence, that the singleton of role changed
// from one allocation to another ("" for none).
func singletonMessage(role plugin.Role, from, to string) string {
	switch {
	case to == "":
		return fmt.Sprintf("no %s allocation is left (%s was the singleton)", role, from)
	case from == "":
		return fmt.Sprintf("%s is now the %s singleton", to, role)
	}
	return fmt.Sprintf("%s is now the %s singleton, replacing %s", to, role, from)
}

// activeMessage says, as a sentence, that operations in role now go to
// another allocation ("" for none).
func activeMessage(role plugin.Role, from, to string) string {
	switch {
	case to == "":
		return fmt.Sprintf("%s operations have no healthy allocation to go to (they went to %s)", role, from)
	case from == "":
		return fmt.Sprintf("%s operations now go to %s", role, to)
	}
	return fmt.Sprintf("%s operations now go to %s instead of %s", role, to, from)
}

// emit stamps and publishes an event.
func (r *Actor) emit(ev Event) {
	ev.Time = time.Now()
	r.sh.broker.Publish(ev)
}

// info describes e with its election roles.
func (r *Actor) info(e *entry) AllocationInfo {
	fp := e.status.Fingerprint
	in := AllocationInfo{
		ID:                 e.spec.ID,
		Plugin:             e.spec.Plugin,
		Type:               e.spec.Type,
		Socket:             e.spec.Socket,
		Command:            slices.Clone(e.spec.Command),
		ImageDigest:        e.status.ImageDigest,
		ContainerID:        e.status.ContainerID,
		Seq:                e.rec.Seq,
		Source:             sourceOf(e.rec.Source),
		Healthy:            e.status.Healthy,
		HealthDescription:  e.status.Description,
		HealthSince:        e.status.Since,
		Provider:           fp.Provider,
		Version:            fp.Version,
		ControllerRequired: fp.ControllerRequired,
		PID:                e.status.PID,
		Exits:              e.status.Exits,
		Capabilities:       capabilitiesOf(fp),
	}
	if fp.NodeInfo != nil {
		in.NodeID = fp.NodeInfo.NodeID
	}
	if im := e.spec.Image; im != nil {
		in.Image, in.Engine = im.Image, im.EngineName()
	}
	if fp.At.IsZero() { // not fingerprinted since start: what was persisted
		in.Provider, in.Version, in.NodeID = e.rec.Provider, e.rec.Version, e.rec.NodeID
		in.ControllerRequired = e.rec.ControllerRequired
	}
	for _, role := range e.spec.Type.Roles() {
		c := r.elected[key{e.spec.Plugin, role}]
		if c.singleton == e.spec.ID {
			in.SingletonFor = append(in.SingletonFor, role)
		}
		if c.active == e.spec.ID {
			in.ActiveFor = append(in.ActiveFor, role)
		}
	}
	in.Singleton = len(in.SingletonFor) > 0
	return in
}

// infos lists the allocations (deregistered ones excluded) by plugin, then
// newest first.
func (r *Actor) infos() []AllocationInfo {
	out := r.unsortedInfos()
	slices.SortFunc(out, func(a, b AllocationInfo) int {
		return cmp.Or(cmp.Compare(a.Plugin, b.Plugin), cmp.Compare(b.Seq, a.Seq))
	})
	return out
}

func (r *Actor) unsortedInfos() []AllocationInfo {
	out := make([]AllocationInfo, 0, len(r.allocs))
	for _, e := range r.allocs {
		if !e.stopping {
			out = append(out, r.info(e))
		}
	}
	return out
}

// summaries adds the allocations up by plugin.
func (r *Actor) summaries(infos []AllocationInfo) []PluginSummary {
	byName := map[string]*PluginSummary{}
	var names []string
	for _, in := range infos { // newest first within a plugin
		s := byName[in.Plugin]
		if s == nil {
			s = &PluginSummary{Name: in.Plugin}
			byName[in.Plugin] = s
			names = append(names, in.Plugin)
		}
		s.Allocations = append(s.Allocations, in)
		if s.Provider == "" && in.Provider != "" {
			s.Provider, s.Version = in.Provider, in.Version
		}
		if in.Type.Serves(plugin.Controller) {
			s.ControllersExpected++
			if in.Healthy {
				s.ControllersHealthy++
			}
		}
		if in.Type.Serves(plugin.Node) {
			s.NodesExpected++
			if in.Healthy {
				s.NodesHealthy++
			}
		}
	}
	out := make([]PluginSummary, 0, len(names))
	for _, n := range names {
		s := byName[n]
		s.ControllerRequired = r.controllerRequired(n)
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b PluginSummary) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// publish refreshes the snapshot the metrics read.
func (r *Actor) publish() {
	r.sh.snap.Store(&snapshot{allocs: r.unsortedInfos(), transitions: maps.Clone(r.sh.transitions), hung: maps.Clone(r.sh.hung)})
}
