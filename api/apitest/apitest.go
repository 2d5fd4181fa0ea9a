// Package apitest is a hand-written, in-memory fake of [api.Backend] and a
// helper that serves it on a real unix socket, for tests of the API, the
// CLI and programs that embed the client.
//
// The fake keeps the contract's visible rules: validation with field-naming
// errors, the claim limits per access mode, idempotent registration and
// claims, 409 for deleting a claimed volume, 503 for a plugin without
// allocations, and an event stream with subscribers. It does not talk to
// any plugin.
package apitest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/runtime"
)

// Backend is the fake. Its zero value is not usable; call NewBackend.
type Backend struct {
	// DataDir is used for the socket paths of exec-managed allocations and
	// for claims' target paths.
	DataDir string
	// NodeID is the node ID of every node and monolith allocation.
	NodeID string

	mu        sync.Mutex                          // guards everything below
	seq       int                                 // last allocation sequence number
	allocs    map[string]*alloc                   // by ID
	volumes   map[string]*volume                  // by ID
	events    []runtime.Event                     // newest last, at most maxEvents
	subs      map[*subscriber]struct{}            // live subscribers
	fail      map[string]error                    // method name → error to return
	logs      map[string][]runtime.LogLine        // by allocation ID
	following map[string]int                      // follows in place, by allocation ID
	now       func() time.Time                    // clock for events
	pending   []string                            // what Ready says is pending
	capacity  map[string]int64                    // by plugin: what PluginCapacity answers
	external  map[string][]runtime.ExternalVolume // by plugin: volumes not registered here
	snaps     map[string]runtime.Snapshot         // by ID; made on first use
}

type alloc struct {
	seq  int
	spec runtime.AllocationSpec
	a    runtime.Allocation
}

type volume struct {
	spec runtime.VolumeSpec // as received, secrets included
	v    runtime.Volume
}

type subscriber struct {
	ch     chan runtime.Event
	closed bool
}

const maxEvents = 1000

// NewBackend returns an empty fake with DataDir /var/lib/csiactor and
// NodeID "node-1".
func NewBackend() *Backend {
	return &Backend{
		DataDir: "/var/lib/csiactor",
		NodeID:  "node-1",
		allocs:  map[string]*alloc{},
		volumes: map[string]*volume{},
		subs:    map[*subscriber]struct{}{},
		fail:    map[string]error{},
		now:     time.Now,
	}
}

var _ api.Backend = (*Backend)(nil)

// FailWith makes the method named method (like "Claim") return err from
// now on; a nil err clears it.
func (b *Backend) FailWith(method string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		delete(b.fail, method)
		return
	}
	b.fail[method] = err
}

// SetPending sets what Ready says is still pending; none means ready.
func (b *Backend) SetPending(pending ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending = slices.Clone(pending)
}

// Ready implements api.Backend: starting while SetPending left something
// pending, ok otherwise.
func (b *Backend) Ready(context.Context) (runtime.Readiness, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("Ready"); err != nil {
		return runtime.Readiness{}, err
	}
	if len(b.pending) > 0 {
		return runtime.Readiness{Status: runtime.ReadyStarting, Pending: slices.Clone(b.pending)}, nil
	}
	return runtime.Readiness{Status: runtime.ReadyOK}, nil
}

// SetClock replaces the clock that stamps events.
func (b *Backend) SetClock(now func() time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.now = now
}

// ReceivedVolumeSpec returns the spec volume id was registered or created
// with, secrets and mount flags included, as the backend received it.
func (b *Backend) ReceivedVolumeSpec(id string) (runtime.VolumeSpec, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.volumes[id]
	if !ok {
		return runtime.VolumeSpec{}, false
	}
	return v.spec, true
}

// SetHealth sets the health of allocation id.
func (b *Backend) SetHealth(id string, healthy bool, description string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if a, ok := b.allocs[id]; ok {
		a.a.Healthy, a.a.HealthDescription = healthy, description
		b.publishLocked(runtime.Event{Type: runtime.EventHealthChanged, Plugin: a.spec.Plugin, Alloc: id, Message: description})
	}
}

// SetContainer sets the image digest and container ID the image
// allocation id shows, as the agent does once its container runs.
func (b *Backend) SetContainer(id, digest, containerID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if a, ok := b.allocs[id]; ok {
		a.a.ImageDigest, a.a.ContainerID = digest, containerID
	}
}

// AllocationSpec returns the spec allocation id was registered with.
func (b *Backend) AllocationSpec(id string) (runtime.AllocationSpec, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a, ok := b.allocs[id]
	if !ok {
		return runtime.AllocationSpec{}, false
	}
	return a.spec, true
}

// SetCapacity sets what PluginCapacity answers for plugin: available
// bytes, whatever the topology. A plugin without one set has no
// GET_CAPACITY capability (ErrInvalid).
func (b *Backend) SetCapacity(plugin string, available int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.capacity == nil {
		b.capacity = map[string]int64{}
	}
	b.capacity[plugin] = available
}

// PluginCapacity implements api.Backend.
func (b *Backend) PluginCapacity(_ context.Context, name string, q runtime.CapacityQuery) (runtime.Capacity, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("PluginCapacity"); err != nil {
		return runtime.Capacity{}, err
	}
	if len(b.allocationsLocked(name)) == 0 {
		return runtime.Capacity{}, kinderr.Errorf(runtime.ErrNotFound, "plugin %q has no controller allocation", name)
	}
	avail, ok := b.capacity[name]
	if !ok {
		return runtime.Capacity{}, kinderr.Errorf(runtime.ErrInvalid, "plugin %s: its controller has no GET_CAPACITY capability", name)
	}
	return runtime.Capacity{Plugin: name, Alloc: b.allocationsLocked(name)[0].ID, Topology: q.Topology, AvailableCapacityBytes: avail}, nil
}

// CallPlugin implements api.Backend: a valid call to a plugin with an
// allocation answers an empty response from its newest allocation.
func (b *Backend) CallPlugin(_ context.Context, name string, c runtime.PluginCall) (runtime.PluginCallResult, error) {
	if err := c.Validate(); err != nil {
		return runtime.PluginCallResult{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("CallPlugin"); err != nil {
		return runtime.PluginCallResult{}, err
	}
	as := b.allocationsLocked(name)
	if len(as) == 0 {
		return runtime.PluginCallResult{}, kinderr.Errorf(runtime.ErrNotFound, "plugin %q has no allocation", name)
	}
	m, _ := csi.LookupMethod(c.Method)
	return runtime.PluginCallResult{Plugin: name, Alloc: as[0].ID, Method: m.Name, Type: as[0].Type,
		Request: json.RawMessage("{}"), Response: json.RawMessage("{}")}, nil
}

// ListExternalVolumes implements api.Backend: the plugin's volumes are
// those registered or created here, by external ID, in pages whose token
// is the external ID to start at.
func (b *Backend) ListExternalVolumes(_ context.Context, name string, q runtime.ExternalVolumesQuery) (runtime.ExternalVolumes, error) {
	if err := q.Validate(); err != nil {
		return runtime.ExternalVolumes{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("ListExternalVolumes"); err != nil {
		return runtime.ExternalVolumes{}, err
	}
	if len(b.allocationsLocked(name)) == 0 {
		return runtime.ExternalVolumes{}, kinderr.Errorf(runtime.ErrNotFound, "plugin %q has no controller allocation", name)
	}
	var all []runtime.ExternalVolume
	for _, v := range b.volumes {
		if v.v.Plugin == name {
			all = append(all, runtime.ExternalVolume{ExternalID: v.v.ExternalID, CapacityBytes: v.v.CapacityBytes, RegisteredAs: v.v.ID})
		}
	}
	all = append(all, b.external[name]...)
	sort.Slice(all, func(i, j int) bool { return all[i].ExternalID < all[j].ExternalID })
	start := sort.Search(len(all), func(i int) bool { return all[i].ExternalID >= q.StartingToken })
	end := len(all)
	if q.MaxEntries > 0 && start+q.MaxEntries < end {
		end = start + q.MaxEntries
	}
	out := runtime.ExternalVolumes{Plugin: name, Volumes: append([]runtime.ExternalVolume{}, all[start:end]...)}
	if end < len(all) {
		out.NextToken = all[end].ExternalID
	}
	return out, nil
}

// AddExternalVolume adds a volume that plugin has but that is not
// registered here, for ListExternalVolumes.
func (b *Backend) AddExternalVolume(plugin string, v runtime.ExternalVolume) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.external == nil {
		b.external = map[string][]runtime.ExternalVolume{}
	}
	b.external[plugin] = append(b.external[plugin], v)
}

// SetCapabilities sets what allocation id's plugin announced, as its
// fingerprint would (nil: not fingerprinted). Unknown IDs are ignored.
func (b *Backend) SetCapabilities(id string, c *runtime.Capabilities) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if a := b.allocs[id]; a != nil {
		a.a.Capabilities = c
	}
}

// Publish records ev (stamped with the clock if it has no time) and sends
// it to every subscriber that has room.
func (b *Backend) Publish(ev runtime.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.publishLocked(ev)
}

// Subscribers returns how many subscriptions are live.
func (b *Backend) Subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

func (b *Backend) publishLocked(ev runtime.Event) {
	if ev.Time.IsZero() {
		ev.Time = b.now().UTC()
	}
	b.events = append(b.events, ev)
	if len(b.events) > maxEvents {
		b.events = b.events[len(b.events)-maxEvents:]
	}
	for s := range b.subs {
		select {
		case s.ch <- ev:
		default: // a slow subscriber loses events
		}
	}
}

func (b *Backend) failLocked(method string) error { return b.fail[method] }

// RegisterAllocation implements api.Backend.
func (b *Backend) RegisterAllocation(_ context.Context, id string, spec runtime.AllocationSpec) (runtime.Allocation, error) {
	if err := runtime.ValidateID("id", id); err != nil {
		return runtime.Allocation{}, err
	}
	if err := spec.Validate(); err != nil {
		return runtime.Allocation{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("RegisterAllocation"); err != nil {
		return runtime.Allocation{}, err
	}
	if old, ok := b.allocs[id]; ok {
		if !reflect.DeepEqual(old.spec, spec) {
			return runtime.Allocation{}, kinderr.Errorf(runtime.ErrConflict, "allocation %q is registered with a different definition", id)
		}
		return b.viewLocked(old), nil
	}
	b.seq++
	a := &alloc{seq: b.seq, spec: spec, a: runtime.Allocation{
		ID: id, Plugin: spec.Plugin, Type: spec.Type, Socket: spec.Socket,
		Command: spec.Command, Env: spec.Env, Healthy: true, HealthDescription: "healthy", Source: "api",
	}}
	if spec.Socket == "" {
		a.a.Socket = filepath.Join(b.DataDir, "plugins", id, "csi.sock")
	}
	if spec.Image != nil {
		a.a.Image, a.a.Engine = spec.Image.Image, spec.Image.EngineName()
	}
	if spec.Type != runtime.TypeController {
		a.a.NodeID = b.NodeID
	}
	b.allocs[id] = a
	b.publishLocked(runtime.Event{Type: runtime.EventAllocationRegistered, Plugin: spec.Plugin, Alloc: id, Message: "registered " + spec.Type})
	return b.viewLocked(a), nil
}

// viewLocked returns a's allocation with its singleton flag: the newest
// allocation of its plugin and type.
func (b *Backend) viewLocked(a *alloc) runtime.Allocation {
	out := a.a
	out.Singleton = true
	for _, o := range b.allocs {
		if o.spec.Plugin == a.spec.Plugin && o.spec.Type == a.spec.Type && o.seq > a.seq {
			out.Singleton = false
		}
	}
	return out
}

// AppendLogs adds lines to the output of the exec-managed allocation id,
// as its plugin would write them.
func (b *Backend) AppendLogs(id string, lines ...runtime.LogLine) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.logs == nil {
		b.logs = map[string][]runtime.LogLine{}
	}
	b.logs[id] = append(b.logs[id], lines...)
}

// Following returns how many follows of the output of allocation id are
// in place: each gets every line appended from now on.
func (b *Backend) Following(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.following[id]
}

// AllocationLogs implements api.Backend: the lines given to AppendLogs;
// a follow polls for more until ctx ends or the allocation is
// deregistered.
func (b *Backend) AllocationLogs(ctx context.Context, id string, q runtime.LogsQuery, fn func(runtime.LogLine) error) error {
	if err := runtime.ValidateID("id", id); err != nil {
		return err
	}
	next, err := func() (int, error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if err := b.failLocked("AllocationLogs"); err != nil {
			return 0, err
		}
		a, ok := b.allocs[id]
		if !ok {
			return 0, kinderr.Errorf(runtime.ErrNotFound, "allocation %q not found", id)
		}
		if len(a.spec.Command) == 0 {
			return 0, kinderr.Errorf(runtime.ErrNotFound, "allocation %q has no logs: it is attached", id)
		}
		if q.Follow {
			if b.following == nil {
				b.following = map[string]int{}
			}
			b.following[id]++
		}
		n := len(b.logs[id])
		if q.Tail >= 0 && n > q.Tail {
			return n - q.Tail, nil
		}
		return 0, nil
	}()
	if err != nil {
		return err
	}
	if q.Follow {
		defer func() {
			b.mu.Lock()
			b.following[id]--
			b.mu.Unlock()
		}()
	}
	for {
		b.mu.Lock()
		_, exists := b.allocs[id]
		lines := append([]runtime.LogLine(nil), b.logs[id][min(next, len(b.logs[id])):]...)
		b.mu.Unlock()
		for _, l := range lines {
			if err := fn(l); err != nil {
				return err
			}
		}
		next += len(lines)
		if !q.Follow || !exists {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// DeregisterAllocation implements api.Backend.
func (b *Backend) DeregisterAllocation(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("DeregisterAllocation"); err != nil {
		return err
	}
	a, ok := b.allocs[id]
	if !ok {
		return kinderr.Errorf(runtime.ErrNotFound, "allocation %q not found", id)
	}
	delete(b.allocs, id)
	b.publishLocked(runtime.Event{Type: runtime.EventAllocationDeregistered, Plugin: a.spec.Plugin, Alloc: id, Message: "deregistered"})
	return nil
}

// Allocations implements api.Backend.
func (b *Backend) Allocations(context.Context) ([]runtime.Allocation, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("Allocations"); err != nil {
		return nil, err
	}
	return b.allocationsLocked(""), nil
}

func (b *Backend) allocationsLocked(plugin string) []runtime.Allocation {
	as := make([]*alloc, 0, len(b.allocs))
	for _, a := range b.allocs {
		if plugin == "" || a.spec.Plugin == plugin {
			as = append(as, a)
		}
	}
	sort.Slice(as, func(i, j int) bool {
		if as[i].spec.Plugin != as[j].spec.Plugin {
			return as[i].spec.Plugin < as[j].spec.Plugin
		}
		if as[i].spec.Type != as[j].spec.Type {
			return as[i].spec.Type < as[j].spec.Type
		}
		return as[i].seq > as[j].seq
	})
	out := make([]runtime.Allocation, 0, len(as))
	for _, a := range as {
		out = append(out, b.viewLocked(a))
	}
	return out
}

// Plugins implements api.Backend.
func (b *Backend) Plugins(context.Context) ([]runtime.Plugin, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("Plugins"); err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for _, a := range b.allocs {
		names[a.spec.Plugin] = true
	}
	out := []runtime.Plugin{}
	for _, n := range slices.Sorted(maps.Keys(names)) {
		out = append(out, b.pluginLocked(n))
	}
	return out, nil
}

// Plugin implements api.Backend.
func (b *Backend) Plugin(_ context.Context, name string) (runtime.Plugin, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("Plugin"); err != nil {
		return runtime.Plugin{}, err
	}
	p := b.pluginLocked(name)
	if len(p.Allocations) == 0 {
		return runtime.Plugin{}, kinderr.Errorf(runtime.ErrNotFound, "plugin %q not found", name)
	}
	return p, nil
}

func (b *Backend) pluginLocked(name string) runtime.Plugin {
	p := runtime.Plugin{Name: name, Provider: "fake.csi.csiactor.dev", Version: "1.0.0", Allocations: b.allocationsLocked(name)}
	for _, a := range p.Allocations {
		if a.Type != runtime.TypeNode {
			p.ControllersExpected++
			if a.Healthy {
				p.ControllersHealthy++
			}
		}
		if a.Type != runtime.TypeController {
			p.NodesExpected++
			if a.Healthy {
				p.NodesHealthy++
			}
		}
	}
	return p
}

func (b *Backend) hasAllocLocked(plugin string, controller bool) bool {
	for _, a := range b.allocs {
		if a.spec.Plugin == plugin && a.a.Healthy && (!controller || a.spec.Type != runtime.TypeNode) {
			return true
		}
	}
	return false
}

// RegisterVolume implements api.Backend.
func (b *Backend) RegisterVolume(_ context.Context, id string, spec runtime.VolumeSpec) (runtime.Volume, error) {
	if err := runtime.ValidateID("id", id); err != nil {
		return runtime.Volume{}, err
	}
	if err := spec.Validate(); err != nil {
		return runtime.Volume{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("RegisterVolume"); err != nil {
		return runtime.Volume{}, err
	}
	if old, ok := b.volumes[id]; ok {
		if !reflect.DeepEqual(old.spec, spec) {
			return runtime.Volume{}, kinderr.Errorf(runtime.ErrConflict, "volume %q is already registered with a different definition", id)
		}
		return copyVolume(old.v), nil
	}
	if !b.hasAllocLocked(spec.Plugin, false) {
		return runtime.Volume{}, kinderr.Errorf(runtime.ErrPluginUnavailable, "plugin %q has no healthy allocation", spec.Plugin)
	}
	v := &volume{spec: spec, v: runtime.Volume{
		ID: id, Plugin: spec.Plugin, ExternalID: spec.ExternalID, Capabilities: spec.Capabilities,
		MountOptions: spec.MountOptions.Redacted(), Parameters: spec.Parameters, Context: spec.Context,
		SecretsFrom: spec.SecretsFrom, Claims: []runtime.Claim{}, PastClaims: []runtime.Claim{},
	}}
	b.volumes[id] = v
	b.publishLocked(runtime.Event{Type: runtime.EventVolumeRegistered, Plugin: spec.Plugin, Volume: id, Message: "registered"})
	return copyVolume(v.v), nil
}

// CreateVolume implements api.Backend.
func (b *Backend) CreateVolume(_ context.Context, spec runtime.CreateVolumeSpec) (runtime.Volume, error) {
	if err := spec.Validate(); err != nil {
		return runtime.Volume{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("CreateVolume"); err != nil {
		return runtime.Volume{}, err
	}
	if _, ok := b.volumes[spec.ID]; ok {
		return runtime.Volume{}, kinderr.Errorf(runtime.ErrConflict, "volume %q is already registered", spec.ID)
	}
	if !b.hasAllocLocked(spec.Plugin, true) {
		return runtime.Volume{}, kinderr.Errorf(runtime.ErrPluginUnavailable, "plugin %q has no healthy controller allocation", spec.Plugin)
	}
	s := spec.VolumeSpec
	s.ExternalID = "ext-" + spec.ID
	v := &volume{spec: s, v: runtime.Volume{
		ID: spec.ID, Plugin: s.Plugin, ExternalID: s.ExternalID, Capabilities: s.Capabilities,
		MountOptions: s.MountOptions.Redacted(), Parameters: s.Parameters, Context: s.Context,
		CapacityBytes: spec.CapacityBytes, Claims: []runtime.Claim{}, PastClaims: []runtime.Claim{},
	}}
	b.volumes[spec.ID] = v
	b.publishLocked(runtime.Event{Type: runtime.EventVolumeCreated, Plugin: s.Plugin, Volume: spec.ID, Message: "created"})
	return copyVolume(v.v), nil
}

// DeleteVolume implements api.Backend.
func (b *Backend) DeleteVolume(_ context.Context, id string, deleteToo bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("DeleteVolume"); err != nil {
		return err
	}
	v, ok := b.volumes[id]
	if !ok {
		return kinderr.Errorf(runtime.ErrNotFound, "volume %q not found", id)
	}
	if n := len(v.v.Claims) + len(v.v.PastClaims); n > 0 {
		return kinderr.Errorf(runtime.ErrConflict, "volume %q is in use: it has %d claims and past claims", id, n)
	}
	delete(b.volumes, id)
	typ, msg := runtime.EventVolumeDeregistered, "deregistered"
	if deleteToo {
		typ, msg = runtime.EventVolumeDeleted, "deleted"
	}
	b.publishLocked(runtime.Event{Type: typ, Plugin: v.v.Plugin, Volume: id, Message: msg})
	return nil
}

// Volumes implements api.Backend. The node filter matches volumes with
// claims when it equals NodeID.
func (b *Backend) Volumes(_ context.Context, f runtime.VolumeFilter) ([]runtime.Volume, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("Volumes"); err != nil {
		return nil, err
	}
	out := []runtime.Volume{}
	for _, id := range slices.Sorted(maps.Keys(b.volumes)) {
		v := b.volumes[id].v
		if f.Plugin != "" && v.Plugin != f.Plugin {
			continue
		}
		if f.Node != "" && (f.Node != b.NodeID || len(v.Claims) == 0) {
			continue
		}
		out = append(out, copyVolume(v))
	}
	return out, nil
}

// VolumesPage implements api.Backend: the volumes of Volumes from token
// (an ID) on, perPage at a time.
func (b *Backend) VolumesPage(ctx context.Context, f runtime.VolumeFilter, perPage int, token string) ([]runtime.Volume, string, error) {
	if err := runtime.ValidatePage(perPage, token); err != nil {
		return nil, "", err
	}
	vs, err := b.Volumes(ctx, f)
	if err != nil {
		return nil, "", err
	}
	i, _ := slices.BinarySearchFunc(vs, token, func(v runtime.Volume, id string) int { return strings.Compare(v.ID, id) })
	vs = vs[i:]
	if len(vs) > perPage {
		return vs[:perPage], vs[perPage].ID, nil
	}
	return vs, "", nil
}

// Volume implements api.Backend.
func (b *Backend) Volume(_ context.Context, id string) (runtime.Volume, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("Volume"); err != nil {
		return runtime.Volume{}, err
	}
	v, ok := b.volumes[id]
	if !ok {
		return runtime.Volume{}, kinderr.Errorf(runtime.ErrNotFound, "volume %q not found", id)
	}
	return copyVolume(v.v), nil
}

// ExpandVolume implements api.Backend: the capacity grows at once;
// shrinking is ErrInvalid.
func (b *Backend) ExpandVolume(_ context.Context, id string, req runtime.ExpandRequest) (runtime.Volume, error) {
	if err := req.Validate(); err != nil {
		return runtime.Volume{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("ExpandVolume"); err != nil {
		return runtime.Volume{}, err
	}
	v, ok := b.volumes[id]
	if !ok {
		return runtime.Volume{}, kinderr.Errorf(runtime.ErrNotFound, "volume %q not found", id)
	}
	if req.CapacityBytes < v.v.CapacityBytes {
		return runtime.Volume{}, kinderr.Errorf(runtime.ErrInvalid, "capacity_bytes %d is less than volume %q's %d bytes: volumes cannot shrink",
			req.CapacityBytes, id, v.v.CapacityBytes)
	}
	if req.CapacityBytes > v.v.CapacityBytes {
		v.v.CapacityBytes = req.CapacityBytes
		b.publishLocked(runtime.Event{Type: runtime.EventVolumeExpanded, Plugin: v.v.Plugin, Volume: id,
			Message: fmt.Sprintf("expanded to %d bytes", req.CapacityBytes)})
	}
	return copyVolume(v.v), nil
}

// ModifyVolume implements api.Backend: the parameters are merged at once.
func (b *Backend) ModifyVolume(_ context.Context, id string, req runtime.ModifyRequest) (runtime.Volume, error) {
	if err := req.Validate(); err != nil {
		return runtime.Volume{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("ModifyVolume"); err != nil {
		return runtime.Volume{}, err
	}
	v, ok := b.volumes[id]
	if !ok {
		return runtime.Volume{}, kinderr.Errorf(runtime.ErrNotFound, "volume %q not found", id)
	}
	merged := maps.Clone(v.v.MutableParameters)
	if merged == nil {
		merged = map[string]string{}
	}
	maps.Copy(merged, req.MutableParameters)
	v.v.MutableParameters = merged
	b.publishLocked(runtime.Event{Type: runtime.EventVolumeModified, Plugin: v.v.Plugin, Volume: id, Message: "volume modified"})
	return copyVolume(v.v), nil
}

// Claim implements api.Backend with the runtime's claim limits per access mode.
func (b *Backend) Claim(_ context.Context, volumeID string, req runtime.ClaimRequest) (runtime.Claim, error) {
	if err := req.Validate(); err != nil {
		return runtime.Claim{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("Claim"); err != nil {
		return runtime.Claim{}, err
	}
	v, ok := b.volumes[volumeID]
	if !ok {
		return runtime.Claim{}, kinderr.Errorf(runtime.ErrNotFound, "volume %q not found", volumeID)
	}
	capOK := false
	for _, c := range v.v.Capabilities {
		capOK = capOK || (c.AccessMode == req.AccessMode && c.AttachmentMode == req.AttachmentMode)
	}
	if !capOK {
		return runtime.Claim{}, kinderr.Errorf(runtime.ErrInvalid, "volume %q has no capability %s/%s", volumeID, req.AccessMode, req.AttachmentMode)
	}
	readers, writers := 0, 0
	for _, c := range v.v.Claims {
		if c.Alloc == req.Alloc {
			if c.Mode == req.Mode && c.AccessMode == req.AccessMode && c.AttachmentMode == req.AttachmentMode {
				return c, nil // the same claim again
			}
			return runtime.Claim{}, kinderr.Errorf(runtime.ErrConflict, "alloc %q already claims volume %q for %s", req.Alloc, volumeID, c.Mode)
		}
		if c.Mode == runtime.ModeWrite {
			writers++
		} else {
			readers++
		}
	}
	if err := claimLimit(req, readers, writers); err != nil {
		return runtime.Claim{}, kinderr.Errorf(runtime.ErrConflict, "volume %q: %s", volumeID, err.Error())
	}
	rw := "rw"
	if req.Mode == runtime.ModeRead {
		rw = "ro"
	}
	usage := rw + "-" + req.AttachmentMode + "-" + req.AccessMode
	c := runtime.Claim{
		Alloc: req.Alloc, Mode: req.Mode, AccessMode: req.AccessMode, AttachmentMode: req.AttachmentMode,
		State:      runtime.ClaimPublished,
		TargetPath: filepath.Join(b.DataDir, "volumes", v.v.Plugin, "per-alloc", req.Alloc, volumeID, usage),
	}
	v.v.Claims = append(v.v.Claims, c)
	b.publishLocked(runtime.Event{Type: runtime.EventClaimPublished, Plugin: v.v.Plugin, Alloc: req.Alloc, Volume: volumeID, Message: "published at " + c.TargetPath})
	return c, nil
}

// claimLimit applies the per-access-mode limits to a new claim, given the
// other claims' counts.
func claimLimit(req runtime.ClaimRequest, readers, writers int) error {
	switch req.AccessMode {
	case "single-node-reader-only":
		if readers > 0 {
			return errors.New("single-node-reader-only allows one reader")
		}
	case "single-node-writer", "single-node-single-writer":
		if readers+writers > 0 {
			return fmt.Errorf("%s allows one claim in all", req.AccessMode)
		}
	case "multi-node-single-writer":
		if req.Mode == runtime.ModeWrite && writers > 0 {
			return errors.New("multi-node-single-writer allows one writer")
		}
	}
	return nil
}

// Release implements api.Backend: the claim becomes a past claim in state
// taken.
func (b *Backend) Release(_ context.Context, volumeID, allocID string) (runtime.Claim, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("Release"); err != nil {
		return runtime.Claim{}, err
	}
	v, ok := b.volumes[volumeID]
	if !ok {
		return runtime.Claim{}, kinderr.Errorf(runtime.ErrNotFound, "volume %q not found", volumeID)
	}
	for i, c := range v.v.Claims {
		if c.Alloc == allocID {
			v.v.Claims = slices.Delete(v.v.Claims, i, i+1)
			c.State = runtime.ClaimTaken
			v.v.PastClaims = append(v.v.PastClaims, c)
			b.publishLocked(runtime.Event{Type: runtime.EventClaimReleased, Plugin: v.v.Plugin, Alloc: allocID, Volume: volumeID, Message: "released"})
			return c, nil
		}
	}
	for _, c := range v.v.PastClaims {
		if c.Alloc == allocID {
			return c, nil // released already: the same past claim
		}
	}
	return runtime.Claim{}, kinderr.Errorf(runtime.ErrNotFound, "alloc %q holds no claim on volume %q", allocID, volumeID)
}

// Events implements api.Backend.
func (b *Backend) Events(context.Context) ([]runtime.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("Events"); err != nil {
		return nil, err
	}
	return slices.Clone(b.events), nil
}

// Subscribe implements api.Backend: the channel gets the recent events and
// then new ones, and is closed when ctx is done.
func (b *Backend) Subscribe(ctx context.Context) (<-chan runtime.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("Subscribe"); err != nil {
		return nil, err
	}
	s := &subscriber{ch: make(chan runtime.Event, len(b.events)+64)}
	for _, ev := range b.events {
		s.ch <- ev
	}
	b.subs[s] = struct{}{}
	context.AfterFunc(ctx, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.subs, s)
		if !s.closed {
			s.closed = true
			close(s.ch)
		}
	})
	return s.ch, nil
}

// SetVolumeStats makes volume id show usage u and condition c, as the
// runtime does for a volume with a published claim.
func (b *Backend) SetVolumeStats(id string, u *runtime.VolumeUsage, c *runtime.VolumeCondition) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if v, ok := b.volumes[id]; ok {
		v.v.Usage, v.v.Condition = u, c
	}
}

// SetClaimCondition makes the claim or past claim of alloc on volume id
// show condition and lastError, as the runtime does for a claim being
// repaired or stalled.
func (b *Backend) SetClaimCondition(id, alloc, condition, lastError string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.volumes[id]
	if !ok {
		return
	}
	for _, cs := range [][]runtime.Claim{v.v.Claims, v.v.PastClaims} {
		for i := range cs {
			if cs[i].Alloc == alloc {
				cs[i].Condition, cs[i].LastError = condition, lastError
			}
		}
	}
}

func copyVolume(v runtime.Volume) runtime.Volume {
	v.Claims = append([]runtime.Claim{}, v.Claims...)
	v.PastClaims = append([]runtime.Claim{}, v.PastClaims...)
	return v
}

// Serve serves the full API handler over b on a real unix socket in a
// temporary directory, and returns its address ("unix:///…/api.sock"). The
// server is closed, and its goroutines waited for, when t ends.
func Serve(t testing.TB, b api.Backend, opts api.Options) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "api.sock")
	l, err := api.ListenUnix(path)
	if err != nil {
		t.Fatalf("apitest: %v", err)
	}
	ServeListener(t, l, api.NewHandler(b, opts))
	return "unix://" + path
}

// ServeListener serves h on l until t ends; then it closes the server and
// waits for Serve to return.
func ServeListener(t testing.TB, l net.Listener, h http.Handler) {
	t.Helper()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
}
