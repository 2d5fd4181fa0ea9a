package volume

import (
	"maps"
	"slices"
	"time"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/persistence"
)

// Spec defines a volume: what Register and Create take.
type Spec struct {
	// ID is csiactor's name for the volume; it becomes a path component
	// on the host and, for Create, the CreateVolume name.
	ID string
	// Plugin is the name of the CSI plugin that serves the volume.
	Plugin string
	// ExternalID is the plugin's ID for the volume. Register requires it;
	// Create must leave it empty (the plugin assigns it).
	ExternalID string
	// Capabilities are the ways the volume may be claimed (access mode and
	// attachment mode; their mount options are ignored). At least one.
	Capabilities []csi.VolumeCapability
	// MountOptions apply to every file-system claim. Their flags never
	// appear in logs, errors or status.
	MountOptions *csi.MountOptions
	// Parameters go to CreateVolume; Context to every publish RPC.
	Parameters map[string]string
	Context    map[string]string
	// Secrets go to the controller and node RPCs. They never appear in
	// logs, errors or status.
	Secrets map[string]string
	// SecretsFrom, instead of Secrets, is where the secrets are read at
	// each RPC that carries them (internal/secretfile): only this
	// reference is stored.
	SecretsFrom string
	// CapacityBytes is the capacity asked of CreateVolume (0: plugin's
	// default). Register ignores it.
	CapacityBytes int64
	// Topology is where a created volume must be reachable from: the
	// requisite (and preferred) topologies of CreateVolume, each one's
	// segments. Empty: this host's node topology, when the plugin has
	// VOLUME_ACCESSIBILITY_CONSTRAINTS. Register ignores it.
	Topology []map[string]string
	// CloneOf is the ID of a registered volume of the same plugin that
	// Create copies (CreateVolume's volume_content_source); "" for an
	// empty volume. Register ignores it.
	CloneOf string
	// cloneSource is CloneOf's external ID, resolved by Create.
	cloneSource string
	// FromSnapshot is the ID of a snapshot (see Config.Snapshots) of the
	// same plugin that Create restores (CreateVolume's
	// volume_content_source); "" for none. Register ignores it.
	FromSnapshot string
	// snapshotSource is FromSnapshot's external ID, resolved by Create.
	snapshotSource string
	// AccessibleTopology is where the volume is reachable from, as its
	// plugin said when it created the volume. Only Mirror takes it (with
	// CapacityBytes as the volume's capacity); Create learns it from the
	// plugin, and Register ignores it.
	AccessibleTopology []map[string]string
	// MutableParameters are what ControllerModifyVolume applied to the
	// volume on some host of the cluster. Only Mirror takes it, merged
	// into the volume's; Modify changes them, Register ignores them.
	MutableParameters map[string]string
}

func (s Spec) validate(create bool) error {
	if err := claim.CheckName("id", s.ID); err != nil {
		return err
	}
	if err := claim.CheckName("plugin", s.Plugin); err != nil {
		return err
	}
	switch {
	case !create && s.ExternalID == "":
		return kinderr.Errorf(ErrInvalid, "external_id is empty")
	case create && s.ExternalID != "":
		return kinderr.Errorf(ErrInvalid, "external_id is set by the plugin on create; leave it empty")
	case len(s.Capabilities) == 0:
		return kinderr.Errorf(ErrInvalid, "capabilities is empty")
	case s.CapacityBytes < 0:
		return kinderr.Errorf(ErrInvalid, "capacity_bytes %d is negative", s.CapacityBytes)
	}
	fs := false
	for i, c := range s.Capabilities {
		c.MountOptions = nil
		if err := c.Validate(); err != nil {
			return kinderr.Errorf(ErrInvalid, "capabilities[%d]: %w", i, err)
		}
		fs = fs || c.AttachmentMode == csi.AttachmentModeFileSystem
	}
	if mo := s.MountOptions; mo != nil && (mo.FSType != "" || len(mo.MountFlags) > 0) && !fs {
		return kinderr.Errorf(ErrInvalid, "mount_options need a file-system capability")
	}
	return nil
}

// record builds the persisted volume of s.
func (s Spec) record(now time.Time) *persistence.Volume {
	v := &persistence.Volume{
		ID:            s.ID,
		Plugin:        s.Plugin,
		ExternalID:    s.ExternalID,
		Parameters:    maps.Clone(s.Parameters),
		Context:       maps.Clone(s.Context),
		Secrets:       maps.Clone(s.Secrets),
		SecretsFrom:   s.SecretsFrom,
		CapacityBytes: s.CapacityBytes,
		CreatedAt:     now,
	}
	for _, c := range s.Capabilities {
		v.Capabilities = append(v.Capabilities, persistence.Capability{
			AccessMode: c.AccessMode.String(), AttachmentMode: c.AttachmentMode.String(),
		})
	}
	if mo := s.MountOptions; mo != nil && (mo.FSType != "" || len(mo.MountFlags) > 0) {
		v.MountOptions = &persistence.MountOptions{FSType: mo.FSType, MountFlags: slices.Clone(mo.MountFlags)}
	}
	return v
}

// sameAs reports whether v was registered (or created) from s: everything
// the caller gives must match (see changedFields). For a created volume the
// external ID and the context come from the plugin, so they are not
// compared, and the plugin may have given more capacity than asked.
func (s Spec) sameAs(v *persistence.Volume, create bool) bool {
	if create != v.Created || create && s.CapacityBytes != 0 && s.CapacityBytes > v.CapacityBytes {
		return false
	}
	for _, f := range s.changedFields(v) {
		if !create || f != FieldExternalID && f != FieldContext {
			return false
		}
	}
	return true
}

// ClaimRequest asks for a claim on a volume by an allocation.
type ClaimRequest struct {
	VolumeID string
	Alloc    string
	// Mode is claim.ModeRead or claim.ModeWrite.
	Mode claim.Mode
	// AccessMode and AttachmentMode must be one of the volume's
	// capabilities.
	AccessMode     csi.AccessMode
	AttachmentMode csi.AttachmentMode
	// Options are the claim's own publish options (read-only, mount
	// flags, mount group, SELinux context).
	Options claim.Options
}

func (r ClaimRequest) claim() claim.Request {
	return claim.Request{
		Alloc: r.Alloc,
		Mode:  r.Mode,
		Capability: csi.VolumeCapability{
			AccessMode: r.AccessMode, AttachmentMode: r.AttachmentMode,
		},
		Options: r.Options,
	}
}

func (r ClaimRequest) validate() error {
	if err := claim.CheckName("volume", r.VolumeID); err != nil {
		return err
	}
	return r.claim().Validate()
}

// Capability is an access mode and an attachment mode, by kebab-case
// names: the persisted record's, which has nothing to hide.
type Capability = persistence.Capability

// Staging is one staging path of a volume and the allocations that use it,
// as the record holds it.
type Staging = persistence.Staging

// RedactedMountOptions are a volume's mount options as they may be shown:
// the file-system type and how many mount flags there are, never the flags.
type RedactedMountOptions struct {
	FSType         string `json:"fs_type,omitempty"`
	MountFlagCount int    `json:"mount_flag_count"`
}

// RedactMountOptions returns o as it may be shown; nil for nil.
func RedactMountOptions(o *persistence.MountOptions) *RedactedMountOptions {
	if o == nil {
		return nil
	}
	return &RedactedMountOptions{FSType: o.FSType, MountFlagCount: len(o.MountFlags)}
}

// Volume is a volume's status: its record without its secrets, mount
// flags and publish context (the type has no field for them), with the
// usage and condition its plugin last reported.
type Volume struct {
	ID           string       `json:"id"`
	Plugin       string       `json:"plugin"`
	ExternalID   string       `json:"external_id"`
	Capabilities []Capability `json:"capabilities"`
	// MountOptions describe the mount options; nil when there are none
	// (no file-system type and no flag).
	MountOptions  *RedactedMountOptions `json:"mount_options,omitempty"`
	Parameters    map[string]string     `json:"parameters,omitempty"`
	Context       map[string]string     `json:"context,omitempty"`
	CapacityBytes int64                 `json:"capacity_bytes,omitempty"`
	// Created is true for a volume made through CreateVolume.
	Created bool `json:"created,omitempty"`
	// ControllerPublished is true while the volume is published to this
	// host by the controller.
	ControllerPublished bool      `json:"controller_published,omitempty"`
	Claims              []Claim   `json:"claims"`
	PastClaims          []Claim   `json:"past_claims"`
	Stagings            []Staging `json:"stagings,omitempty"`
	Revision            uint64    `json:"revision"`
	CreatedAt           time.Time `json:"created_at"`
	UpdatedAt           time.Time `json:"updated_at"`
	// Expansion is the expansion in progress; nil when none.
	Expansion *Expansion `json:"expansion,omitempty"`
	// AccessibleTopology is where the volume can be reached from (see
	// persistence.Volume.AccessibleTopology).
	AccessibleTopology []map[string]string `json:"accessible_topology,omitempty"`
	// Usage and Condition are what the plugin last reported while the
	// volume has a published claim (see Config.StatsInterval); nil
	// before the first poll, or when the plugin reports neither.
	Usage     *Usage     `json:"usage,omitempty"`
	Condition *Condition `json:"condition,omitempty"`
	// UsageStatus and ConditionStatus say, while the volume has a
	// published claim on this host, whether Usage and Condition are
	// reported (StatsReported), not polled yet (StatsPending) or never
	// reported by the plugin (StatsUnsupported); "" otherwise.
	UsageStatus     string `json:"usage_status,omitempty"`
	ConditionStatus string `json:"condition_status,omitempty"`
	// SecretsFrom is the reference the secrets are read from; "" for
	// none.
	SecretsFrom string `json:"secrets_from,omitempty"`
	// Ephemeral is true for a volume a claim created for itself (see
	// Manager.ClaimEphemeral); EphemeralPhase is its phase: creating,
	// ready or deleting (persistence.Volume.Ephemeral).
	Ephemeral      bool   `json:"ephemeral,omitempty"`
	EphemeralPhase string `json:"ephemeral_phase,omitempty"`
	// MutableParameters are the mutable parameters ControllerModifyVolume
	// applied, merged; Modifying are those of the modification in
	// progress (none when empty).
	MutableParameters map[string]string `json:"mutable_parameters,omitempty"`
	Modifying         map[string]string `json:"modifying,omitempty"`
}

// Claim is a current or past claim's status: its record (which holds no
// secret: its LastError has them removed already), the volume it is on,
// and its condition.
type Claim struct {
	Volume string `json:"volume"`
	persistence.Claim
	// Condition is ConditionStalled when the claim has not changed state
	// for Config.StallAfter (status reads set it, see stall.go), else
	// ConditionBroken, ConditionRepairing or ConditionDegraded while
	// Repair is set, empty
	// otherwise.
	Condition string `json:"condition,omitempty"`
}

// Filter selects volumes for List. Empty fields match everything.
type Filter struct {
	// Plugin keeps the volumes of this plugin.
	Plugin string
	// NodeID keeps the volumes with a claim or past claim on this node.
	NodeID string
}

func (f Filter) match(v *persistence.Volume) bool {
	if f.Plugin != "" && v.Plugin != f.Plugin {
		return false
	}
	if f.NodeID == "" {
		return true
	}
	for _, cs := range [][]persistence.Claim{v.Claims, v.PastClaims} {
		for i := range cs {
			if cs[i].NodeID == f.NodeID {
				return true
			}
		}
	}
	return false
}

// Matches reports whether f matches the volume status v, as List
// selects records.
func (f Filter) Matches(v Volume) bool {
	if f.Plugin != "" && v.Plugin != f.Plugin {
		return false
	}
	if f.NodeID == "" {
		return true
	}
	for _, cs := range [][]Claim{v.Claims, v.PastClaims} {
		for i := range cs {
			if cs[i].NodeID == f.NodeID {
				return true
			}
		}
	}
	return false
}

// viewOf is the status of the record v; it shares no map or slice with v.
func viewOf(v *persistence.Volume) Volume {
	out := Volume{
		ID:                  v.ID,
		Plugin:              v.Plugin,
		ExternalID:          v.ExternalID,
		Capabilities:        slices.Clone(v.Capabilities),
		Parameters:          maps.Clone(v.Parameters),
		Context:             maps.Clone(v.Context),
		CapacityBytes:       v.CapacityBytes,
		Created:             v.Created,
		ControllerPublished: v.ControllerPublished,
		Claims:              make([]Claim, 0, len(v.Claims)),
		PastClaims:          make([]Claim, 0, len(v.PastClaims)),
		Revision:            v.Revision,
		CreatedAt:           v.CreatedAt,
		UpdatedAt:           v.UpdatedAt,
		Expansion:           expansionOf(v.Expansion),
		SecretsFrom:         v.SecretsFrom,
		Ephemeral:           v.Ephemeral != "",
		EphemeralPhase:      v.Ephemeral,
		MutableParameters:   maps.Clone(v.MutableParameters),
		Modifying:           maps.Clone(v.Modifying),
	}
	if mo := v.MountOptions; mo != nil && (mo.FSType != "" || len(mo.MountFlags) > 0) {
		out.MountOptions = RedactMountOptions(mo)
	}
	for i := range v.Claims {
		out.Claims = append(out.Claims, claimOf(v.ID, &v.Claims[i]))
	}
	for i := range v.PastClaims {
		out.PastClaims = append(out.PastClaims, claimOf(v.ID, &v.PastClaims[i]))
	}
	for _, st := range v.Stagings {
		st.Users = slices.Clone(st.Users)
		out.Stagings = append(out.Stagings, st)
	}
	for _, t := range v.AccessibleTopology {
		out.AccessibleTopology = append(out.AccessibleTopology, maps.Clone(t))
	}
	return out
}

// claimOf is the status of the claim record c on volume.
func claimOf(volume string, c *persistence.Claim) Claim {
	return Claim{Volume: volume, Claim: *c, Condition: conditionOf(c)}
}

// The conditions of a claim the host was found missing (Claim.Condition).
const (
	// ConditionRepairing: the claim goes through its publish steps again
	// and no attempt has failed yet.
	ConditionRepairing = "repairing"
	// ConditionDegraded: an attempt of the repair failed (LastError says
	// why); it is retried with backoff.
	ConditionDegraded = "degraded"
	// ConditionBroken: the claim's mount point was in the mount table but
	// dead (a FUSE mount whose plugin died: ENOTCONN; EIO, ESTALE, or a
	// probe that did not answer); it is being unmounted and mounted again.
	ConditionBroken = "broken"
)

func conditionOf(c *persistence.Claim) string {
	switch {
	case c.Repair == "":
		return ""
	case claim.BrokenCause(c.Repair) != "":
		return ConditionBroken
	case c.LastError != "" || c.Attempts > 0:
		return ConditionDegraded
	}
	return ConditionRepairing
}
