package volume

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/persistence"
)

// placeCreate fills spec.Topology for CreateVolume's accessibility
// requirements: the topology asked for, or else this host's node topology,
// when the plugin says volumes are not reachable from everywhere
// (VOLUME_ACCESSIBILITY_CONSTRAINTS). A topology asked of a plugin without
// that capability is ErrInvalid. When no allocation of the plugin answers,
// spec is returned as it is: the create then fails on the plugin.
func (m *Manager) placeCreate(ctx context.Context, spec Spec) (Spec, error) {
	_, f, err := m.plugins.Client(ctx, spec.Plugin, claim.NodePlugin)
	node := err == nil
	if !node {
		if _, f, err = m.plugins.Client(ctx, spec.Plugin, claim.ControllerPlugin); err != nil {
			return spec, nil
		}
	}
	if !f.AccessibilityConstraints {
		if len(spec.Topology) > 0 {
			return spec, kinderr.Errorf(ErrInvalid,
				"topology: plugin %q does not constrain where volumes are reachable (no VOLUME_ACCESSIBILITY_CONSTRAINTS capability)", spec.Plugin)
		}
		return spec, nil
	}
	if len(spec.Topology) == 0 && node && len(f.Topology) > 0 {
		spec.Topology = []map[string]string{maps.Clone(f.Topology)}
	}
	return spec, nil
}

// checkTopology refuses a claim on this host when volume v is not
// reachable from it: none of v's accessible topologies is a subset of the
// node plugin's topology. A volume without accessible topology is
// reachable from everywhere.
func checkTopology(v *persistence.Volume, f claim.Facts) error {
	if len(v.AccessibleTopology) == 0 {
		return nil
	}
	for _, t := range v.AccessibleTopology {
		if within(t, f.Topology) {
			return nil
		}
	}
	parts := make([]string, len(v.AccessibleTopology))
	for i, t := range v.AccessibleTopology {
		parts[i] = formatSegments(t)
	}
	return kinderr.Errorf(ErrOutsideTopology,
		"volume %q is reachable from topology %s, and this host's node topology is %s", v.ID, strings.Join(parts, " or "), formatSegments(f.Topology))
}

// within reports whether every segment of t is in node.
func within(t, node map[string]string) bool {
	for k, v := range t {
		if nv, ok := node[k]; !ok || nv != v {
			return false
		}
	}
	return true
}

// formatSegments writes segments as {k=v,k=v}, keys sorted; {} for none.
func formatSegments(t map[string]string) string {
	kv := make([]string, 0, len(t))
	for _, k := range slices.Sorted(maps.Keys(t)) {
		kv = append(kv, k+"="+t[k])
	}
	return "{" + strings.Join(kv, ",") + "}"
}

// takeNodeSlot counts volume id among the volumes of its plugin in use on
// this host, refusing with ErrNodeVolumeLimit when the node plugin's
// max_volumes_per_node (f) is reached by others. A volume already in use
// here takes no new slot.
func (m *Manager) takeNodeSlot(v *persistence.Volume, f claim.Facts) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	set := m.inUse[v.Plugin]
	if _, ok := set[v.ID]; ok {
		return nil
	}
	if limit := f.MaxVolumesPerNode; limit > 0 && int64(len(set)) >= limit {
		return kinderr.Errorf(ErrNodeVolumeLimit,
			"plugin %q has %d volumes in use on this host, its max_volumes_per_node of %d: volume %q cannot be staged here until one is released", v.Plugin, len(set), limit, v.ID)
	}
	if set == nil {
		set = map[string]struct{}{}
		m.inUse[v.Plugin] = set
	}
	set[v.ID] = struct{}{}
	return nil
}

// noteUse records whether v is in use on this host (it has claims or past
// claims), for takeNodeSlot. It is called with every record written whose
// use changed, and after a reserve that could not be written.
func (m *Manager) noteUse(v *persistence.Volume) {
	if v == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.noteUseLocked(v.Plugin, v.ID, inUse(v))
}

// inUse reports whether v has claims or past claims on this host.
func inUse(v *persistence.Volume) bool {
	return v != nil && len(v.Claims)+len(v.PastClaims) > 0
}

func (m *Manager) noteUseLocked(plugin, id string, used bool) {
	set := m.inUse[plugin]
	if !used {
		delete(set, id)
		return
	}
	if set == nil {
		set = map[string]struct{}{}
		m.inUse[plugin] = set
	}
	set[id] = struct{}{}
}

// admitHere checks that a new claim of the volume may be staged on this
// host: its topology (checkTopology) and the node's volume limit
// (takeNodeSlot, which counts the volume as in use here when it passes).
func (a *volumeActor) admitHere(f claim.Facts) error {
	if err := checkTopology(a.rec, f); err != nil {
		return err
	}
	return a.m.takeNodeSlot(a.rec, f)
}

// topologyRequirement is CreateVolume's accessibility requirements for
// topologies: each one requisite, and preferred in the order given; nil
// for none.
func topologyRequirement(ts []map[string]string) *csipb.TopologyRequirement {
	if len(ts) == 0 {
		return nil
	}
	req := &csipb.TopologyRequirement{}
	for _, t := range ts {
		req.Requisite = append(req.Requisite, &csipb.Topology{Segments: maps.Clone(t)})
		req.Preferred = append(req.Preferred, &csipb.Topology{Segments: maps.Clone(t)})
	}
	return req
}

// resolveClone checks spec.CloneOf, the volume Create copies: registered,
// of the same plugin, and a controller with CLONE_VOLUME. It fills in the
// source's external ID.
func (m *Manager) resolveClone(ctx context.Context, spec Spec) (Spec, error) {
	if spec.CloneOf == "" {
		return spec, nil
	}
	src, err := m.Get(ctx, spec.CloneOf)
	if err != nil {
		return spec, fmt.Errorf("content_source.volume: %w", err)
	}
	if src.Plugin != spec.Plugin {
		return spec, kinderr.Errorf(ErrInvalid, "content_source.volume: volume %q is of plugin %q, not %q", src.ID, src.Plugin, spec.Plugin)
	}
	_, f, err := m.plugins.Client(ctx, spec.Plugin, claim.ControllerPlugin)
	if err != nil {
		return spec, kinderr.Errorf(ErrPluginUnavailable, "plugin %q (controller): %w", spec.Plugin, err)
	}
	if !f.CloneVolume {
		return spec, kinderr.Errorf(ErrInvalid, "content_source.volume: plugin %q cannot clone volumes (no CLONE_VOLUME capability)", spec.Plugin)
	}
	spec.cloneSource = src.ExternalID
	return spec, nil
}
