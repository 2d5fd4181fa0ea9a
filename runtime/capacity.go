package runtime

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/registry"
	"github.com/csiactor/csiactor/internal/kinderr"
)

// MaxListEntries is the largest page ListExternalVolumes asks a plugin for.
const MaxListEntries = 1000

// Capacity is a plugin controller's answer to GetCapacity.
type Capacity struct {
	Plugin string `json:"plugin"`
	// Alloc is the controller allocation that answered.
	Alloc string `json:"alloc"`
	// Topology is the topology asked about (none: the whole plugin).
	Topology               map[string]string `json:"topology,omitempty"`
	AvailableCapacityBytes int64             `json:"available_capacity_bytes"`
	// MaximumVolumeSizeBytes and MinimumVolumeSizeBytes are set when the
	// plugin says them.
	MaximumVolumeSizeBytes *int64 `json:"maximum_volume_size_bytes,omitempty"`
	MinimumVolumeSizeBytes *int64 `json:"minimum_volume_size_bytes,omitempty"`
}

// CapacityQuery says what PluginCapacity asks about.
type CapacityQuery struct {
	// Topology is the topology segments to ask about; none for the whole
	// plugin.
	Topology map[string]string
}

// ParseTopology parses topology segments written "key=value,key=value"
// (the API's topology query parameter and the CLI's -topology flag). An
// empty string is no topology.
func ParseTopology(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case !ok || k == "":
			return nil, fieldErr("topology", fmt.Sprintf("%q: want key=value pairs separated by commas", kv))
		case v == "":
			return nil, fieldErr("topology", fmt.Sprintf("%q has no value", k))
		case out[k] != "":
			return nil, fieldErr("topology", fmt.Sprintf("%q given twice", k))
		}
		out[k] = v
	}
	return out, nil
}

// validateTopologies checks topologies: at most 16, each with at least one
// segment, keys and values not empty and at most 128 bytes (CSI's limits
// are 63 for a key's name and 63 for a value).
func validateTopologies(field string, ts []map[string]string) error {
	if len(ts) > 16 {
		return fieldErr(field, fmt.Sprintf("%d topologies, limit 16", len(ts)))
	}
	for i, t := range ts {
		f := fmt.Sprintf("%s[%d]", field, i)
		if len(t) == 0 {
			return fieldErr(f, "has no segments")
		}
		for k, v := range t {
			if k == "" || v == "" || len(k) > 128 || len(v) > 128 {
				return fieldErr(f, fmt.Sprintf("segment %q=%q: keys and values are 1 to 128 bytes", k, v))
			}
		}
	}
	return nil
}

// FormatTopology writes segments as ParseTopology reads them, keys sorted.
func FormatTopology(t map[string]string) string {
	kv := make([]string, 0, len(t))
	for _, k := range slices.Sorted(maps.Keys(t)) {
		kv = append(kv, k+"="+t[k])
	}
	return strings.Join(kv, ",")
}

// ExternalVolumesQuery pages through ListExternalVolumes.
type ExternalVolumesQuery struct {
	// MaxEntries is the page size; 0 lets the plugin choose. At most
	// MaxListEntries.
	MaxEntries int
	// StartingToken is the NextToken of the page before; "" for the first.
	StartingToken string
}

// Validate checks q; the error is a *FieldError naming the bad field.
func (q ExternalVolumesQuery) Validate() error {
	if q.MaxEntries < 0 || q.MaxEntries > MaxListEntries {
		return fieldErr("max_entries", fmt.Sprintf("%d: want 0 to %d", q.MaxEntries, MaxListEntries))
	}
	if len(q.StartingToken) > MaxExternalIDLength {
		return fieldErr("starting_token", fmt.Sprintf("is %d bytes, limit %d", len(q.StartingToken), MaxExternalIDLength))
	}
	return nil
}

// ExternalVolume is one volume as the plugin's controller lists it.
type ExternalVolume struct {
	ExternalID    string            `json:"external_id"`
	CapacityBytes int64             `json:"capacity_bytes"`
	Context       map[string]string `json:"context,omitempty"`
	// AccessibleTopology is where the volume can be reached from.
	AccessibleTopology []map[string]string `json:"accessible_topology,omitempty"`
	// PublishedNodeIDs are the nodes the plugin says it is published to.
	PublishedNodeIDs []string `json:"published_node_ids,omitempty"`
	// RegisteredAs is the ID the volume is registered under on this
	// agent (in cluster mode: in the cluster, by any host); "" when it
	// is not registered.
	RegisteredAs string `json:"registered_as,omitempty"`
}

// ExternalVolumes is one page of a plugin's volumes.
type ExternalVolumes struct {
	Plugin  string           `json:"plugin"`
	Volumes []ExternalVolume `json:"volumes"`
	// NextToken is the StartingToken of the next page; "" on the last.
	NextToken string `json:"next_token,omitempty"`
}

// controllerWith returns the active controller of plugin name, checked
// for a capability (capName, by its CSI name) that has(caps) reports.
func (r *Runtime) controllerWith(ctx context.Context, name, capName string, has func(registry.Target) bool) (registry.Target, error) {
	if err := ValidateID("plugin", name); err != nil {
		return registry.Target{}, err
	}
	if err := r.ready(); err != nil {
		return registry.Target{}, err
	}
	t, err := r.registry.Client(ctx, name, plugin.Controller)
	if err != nil {
		return registry.Target{}, mapErr(err)
	}
	if t.Fingerprint.Controller == nil || !has(t) {
		return registry.Target{}, kinderr.Errorf(ErrInvalid, "plugin %s: its controller (allocation %s) has no %s capability", name, t.Alloc, capName)
	}
	return t, nil
}

// PluginCapacity asks the active controller of plugin name how much it can
// provision (GetCapacity), in q.Topology when given. It fails with
// ErrInvalid when the controller has no GET_CAPACITY capability, with
// ErrNotFound for an unknown plugin and ErrPluginUnavailable when no
// controller is healthy; the plugin's own refusal is classified like every
// plugin error. It is a query: it is sent once, and not retried.
func (r *Runtime) PluginCapacity(ctx context.Context, name string, q CapacityQuery) (Capacity, error) {
	t, err := r.controllerWith(ctx, name, "GET_CAPACITY", func(t registry.Target) bool { return t.Fingerprint.Controller.GetCapacity })
	if err != nil {
		return Capacity{}, err
	}
	req := &csipb.GetCapacityRequest{}
	if len(q.Topology) > 0 {
		req.AccessibleTopology = &csipb.Topology{Segments: maps.Clone(q.Topology)}
	}
	resp, err := t.Client.GetCapacity(ctx, req)
	if err != nil {
		return Capacity{}, mapErr(fmt.Errorf("plugin %s: %w", name, err))
	}
	c := Capacity{Plugin: name, Alloc: t.Alloc, Topology: maps.Clone(q.Topology), AvailableCapacityBytes: resp.GetAvailableCapacity()}
	if m := resp.GetMaximumVolumeSize(); m != nil {
		v := m.GetValue()
		c.MaximumVolumeSizeBytes = &v
	}
	if m := resp.GetMinimumVolumeSize(); m != nil {
		v := m.GetValue()
		c.MinimumVolumeSizeBytes = &v
	}
	return c, nil
}

// ListExternalVolumes lists one page of the volumes the active controller
// of plugin name has (ListVolumes), each with the ID it is registered
// under here (in cluster mode: in the cluster), if any. It fails with ErrInvalid when the controller has no
// LIST_VOLUMES capability; a token the plugin no longer knows is
// ErrPluginUnavailable (Aborted: list again from the start). It is a
// query: it is sent once, and not retried.
func (r *Runtime) ListExternalVolumes(ctx context.Context, name string, q ExternalVolumesQuery) (ExternalVolumes, error) {
	if err := q.Validate(); err != nil {
		return ExternalVolumes{}, err
	}
	t, err := r.controllerWith(ctx, name, "LIST_VOLUMES", func(t registry.Target) bool { return t.Fingerprint.Controller.ListVolumes })
	if err != nil {
		return ExternalVolumes{}, err
	}
	resp, err := t.Client.ListVolumes(ctx, &csipb.ListVolumesRequest{MaxEntries: int32(q.MaxEntries), StartingToken: q.StartingToken})
	if err != nil {
		return ExternalVolumes{}, mapErr(fmt.Errorf("plugin %s: %w", name, err))
	}
	out := ExternalVolumes{Plugin: name, Volumes: make([]ExternalVolume, 0, len(resp.GetEntries())), NextToken: resp.GetNextToken()}
	for _, e := range resp.GetEntries() {
		v := e.GetVolume()
		ev := ExternalVolume{
			ExternalID: v.GetVolumeId(), CapacityBytes: v.GetCapacityBytes(), Context: maps.Clone(v.GetVolumeContext()),
			PublishedNodeIDs: slices.Clone(e.GetStatus().GetPublishedNodeIds()),
			RegisteredAs:     r.volumes.RegisteredAs(name, v.GetVolumeId()),
		}
		for _, tp := range v.GetAccessibleTopology() {
			ev.AccessibleTopology = append(ev.AccessibleTopology, maps.Clone(tp.GetSegments()))
		}
		out.Volumes = append(out.Volumes, ev)
	}
	if err := r.clusterOwners(ctx, name, out.Volumes); err != nil {
		return ExternalVolumes{}, err
	}
	return out, nil
}

// clusterOwners fills in, in cluster mode, the ID each of vs that this
// host does not keep is registered as in the cluster (one read of etcd
// for all of them): another host's volumes are registered too.
func (r *Runtime) clusterOwners(ctx context.Context, plugin string, vs []ExternalVolume) error {
	if r.cluster == nil {
		return nil
	}
	var unknown []string
	var at []int
	for i, v := range vs {
		if v.RegisteredAs == "" {
			unknown, at = append(unknown, v.ExternalID), append(at, i)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	owners, err := r.cluster.ExternalOwners(ctx, plugin, unknown)
	if err != nil {
		return mapErr(err)
	}
	for j, i := range at {
		vs[i].RegisteredAs = owners[j]
	}
	return nil
}
