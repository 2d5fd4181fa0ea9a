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
	if !maps.Equal(w.Secrets, v.Secrets) {
		out = append(out, FieldSecrets)
	}
	return out
}

// update handles a Register of a registered volume with another
// definition: the secrets may change at any time (the next RPCs use
// them), the capabilities, mount options, parameters and context only
// while the volume has no claim, the plugin and the external ID never.
// The slot is free: no RPC of the volume is in flight, so every later one
// is built from the updated record.
func (a *volumeActor) update(req *registerRequest) {
	changed := req.spec.changedFields(a.rec)
	if len(changed) == 0 {
		answer(req.reply, reply{vol: a.rec})
		return
	}
	for _, f := range changed {
		switch f {
		case FieldPlugin:
			answer(req.reply, reply{err: kinderr.Errorf(ErrInvalid,
				"plugin: volume %q is registered with plugin %q; the plugin of a volume cannot change (deregister it and register it again)", a.h.id, a.rec.Plugin)})
			return
		case FieldExternalID:
			answer(req.reply, reply{err: kinderr.Errorf(ErrInvalid,
				"external_id: volume %q is registered with external_id %q; the external ID of a volume cannot change (deregister it and register it again)", a.h.id, a.rec.ExternalID)})
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
	if err := a.persist(v, "update"); err != nil {
		answer(req.reply, reply{err: err})
		return
	}
	a.log.WithField("changed", strings.Join(changed, ",")).Info("volume definition updated")
	a.m.recordUpdated(a.rec, changed)
	answer(req.reply, reply{vol: a.rec})
}

// definitionFields returns the fields of changed that a claim depends on:
// every one but the secrets.
func definitionFields(changed []string) []string {
	var out []string
	for _, f := range changed {
		if f != FieldSecrets {
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
