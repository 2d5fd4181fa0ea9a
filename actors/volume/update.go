package volume

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/persistence"
)

// The fields of a volume's definition, as updates name them (the API's
// field names).
const (
	FieldPlugin       = "plugin"
	FieldExternalID   = "external_id"
	FieldCapabilities = "capabilities"
	FieldMountOptions = "mount_options"
	FieldParameters   = "parameters"
	FieldContext      = "context"
	FieldSecrets      = "secrets"
	// FieldCapacity and FieldAccessibleTopology change only through
	// Mirror, as the cluster's definition of the volume has them.
	FieldCapacity           = "capacity_bytes"
	FieldAccessibleTopology = "accessible_topology"
	// FieldMutableParameters changes through Modify, and through Mirror
	// at any time.
	FieldMutableParameters = "mutable_parameters"
)

// EventVolumeUpdated: Register changed a registered volume's definition;
// the message names the fields that changed, never their values.
const EventVolumeUpdated = "volume-updated"

// changedFields returns the fields of v's definition that s (a Register
// spec) changes, in a fixed order; none when s is v's definition.
func (s Spec) changedFields(v *persistence.Volume) []string {
	w := s.record(v.CreatedAt)
	var out []string
	if w.Plugin != v.Plugin {
		out = append(out, FieldPlugin)
	}
	if w.ExternalID != v.ExternalID {
		out = append(out, FieldExternalID)
	}
	if !slices.Equal(w.Capabilities, v.Capabilities) {
		out = append(out, FieldCapabilities)
	}
	mo := func(m *persistence.MountOptions) persistence.MountOptions {
		if m == nil {
			return persistence.MountOptions{}
		}
		return *m
	}
	if a, b := mo(w.MountOptions), mo(v.MountOptions); a.FSType != b.FSType || !slices.Equal(a.MountFlags, b.MountFlags) {
		out = append(out, FieldMountOptions)
	}
	if !maps.Equal(w.Parameters, v.Parameters) {
		out = append(out, FieldParameters)
	}
	if !maps.Equal(w.Context, v.Context) {
		out = append(out, FieldContext)
	}
	if !maps.Equal(w.Secrets, v.Secrets) || w.SecretsFrom != v.SecretsFrom {
		out = append(out, FieldSecrets)
	}
	return out
}

// mirroredFields returns the fields of v that a Mirror of s changes
// besides changedFields': the capacity when s has more, and the
// accessible topology.
func (s Spec) mirroredFields(v *persistence.Volume) []string {
	var out []string
	if s.CapacityBytes > v.CapacityBytes {
		out = append(out, FieldCapacity)
	}
	if !slices.EqualFunc(s.AccessibleTopology, v.AccessibleTopology, maps.Equal) {
		out = append(out, FieldAccessibleTopology)
	}
	if !applied(v.MutableParameters, s.MutableParameters) {
		out = append(out, FieldMutableParameters)
	}
	return out
}

// cloneTopology returns a deep copy of ts; nil for none.
func cloneTopology(ts []map[string]string) []map[string]string {
	var out []map[string]string
	for _, t := range ts {
		out = append(out, maps.Clone(t))
	}
	return out
}

// fixedFieldErr is the ErrInvalid of changing field of volume id, whose
// record is v, when field can never change (the plugin, the external ID);
// nil for another field.
func fixedFieldErr(id, field string, v *persistence.Volume) error {
	switch field {
	case FieldPlugin:
		return kinderr.Errorf(ErrInvalid,
			"plugin: volume %q is registered with plugin %q; the plugin of a volume cannot change (deregister it and register it again)", id, v.Plugin)
	case FieldExternalID:
		return kinderr.Errorf(ErrInvalid,
			"external_id: volume %q is registered with external_id %q; the external ID of a volume cannot change (deregister it and register it again)", id, v.ExternalID)
	}
	return nil
}

// CheckUpdate checks an update of a volume's definition from old to next
// by Register's rules, for a caller that keeps the definition elsewhere
// (the cluster): a change of the plugin or the external ID is ErrInvalid
// naming the field. It returns the changed fields a claim depends on
// (every one but the secrets), which may change only while the volume has
// no claim, in a fixed order; none when only the secrets change.
func CheckUpdate(old, next Spec) ([]string, error) {
	rec := old.record(time.Time{})
	changed := next.changedFields(rec)
	for _, f := range changed {
		if err := fixedFieldErr(old.ID, f, rec); err != nil {
			return nil, err
		}
	}
	return definitionFields(changed), nil
}

// update handles a Register (or Mirror) of a registered volume with
// another definition: the secrets may change at any time (the next RPCs
// use them), the capabilities, mount options, parameters and context only
// while the volume has no claim, the plugin and the external ID never. A
// Mirror also brings the capacity and the mutable parameters (at any
// time, merged) and the accessible
// topology (only while the volume has no claim). The slot is free: no RPC
// of the volume is in flight, so every later one is built from the
// updated record.
func (a *volumeActor) update(req *registerRequest) {
	changed := req.spec.changedFields(a.rec)
	if req.mirror {
		changed = append(changed, req.spec.mirroredFields(a.rec)...)
	}
	if len(changed) == 0 {
		answer(req.reply, reply{vol: a.rec})
		return
	}
	for _, f := range changed {
		if err := fixedFieldErr(a.h.id, f, a.rec); err != nil {
			answer(req.reply, reply{err: err})
			return
		}
	}
	if held := definitionFields(changed); len(held) > 0 && len(a.rec.Claims) > 0 {
		allocs := make([]string, len(a.rec.Claims))
		for i := range a.rec.Claims {
			allocs[i] = fmt.Sprintf("%q", a.rec.Claims[i].Alloc)
		}
		answer(req.reply, reply{err: kinderr.Errorf(ErrInUse,
			"volume %q is claimed by alloc %s: %s cannot change while it has claims (only secrets can); release them first", a.h.id, strings.Join(allocs, ", "), strings.Join(held, ", "))})
		return
	}
	spec := req.spec
	w := spec.record(a.rec.CreatedAt)
	v := claim.CloneVolume(a.rec)
	// New maps and slices: the old record (and any step built from it)
	// shares its own, which are never changed in place.
	v.Capabilities = w.Capabilities
	v.MountOptions = w.MountOptions
	v.Parameters = w.Parameters
	v.Context = w.Context
	v.Secrets = w.Secrets
	v.SecretsFrom = w.SecretsFrom
	if req.mirror {
		v.CapacityBytes = max(v.CapacityBytes, req.spec.CapacityBytes)
		v.AccessibleTopology = cloneTopology(req.spec.AccessibleTopology)
		v.MutableParameters = mergeParams(v.MutableParameters, req.spec.MutableParameters)
	}
	if err := a.persist(v, "update"); err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	a.log.WithField("changed", strings.Join(changed, ",")).Info("volume definition updated")
	a.m.recordUpdated(a.rec, changed)
	answer(req.reply, reply{vol: a.rec})
}

// definitionFields returns the fields of changed that a claim depends on:
// every one but the secrets, the capacity and the mutable parameters.
func definitionFields(changed []string) []string {
	var out []string
	for _, f := range changed {
		if f != FieldSecrets && f != FieldCapacity && f != FieldMutableParameters {
			out = append(out, f)
		}
	}
	return out
}

// recordUpdated reports an updated volume, naming the changed fields.
func (m *Manager) recordUpdated(v *persistence.Volume, changed []string) {
	if m.cfg.OnEvent == nil || v == nil {
		return
	}
	m.cfg.OnEvent(Event{Time: time.Now(), Type: EventVolumeUpdated, Plugin: v.Plugin, Volume: v.ID,
		Message: "volume updated: " + strings.Join(changed, ", ") + " changed"})
}
