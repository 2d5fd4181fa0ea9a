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
// the caller gives must match. For a created volume the external ID and the
// context come from the plugin, so they are not compared.
func (s Spec) sameAs(v *persistence.Volume, create bool) bool {
	w := s.record(v.CreatedAt)
	if create != v.Created {
		return false
	}
	if !create && (w.ExternalID != v.ExternalID || !maps.Equal(w.Context, v.Context)) {
		return false
	}
	if create && w.CapacityBytes != 0 && w.CapacityBytes > v.CapacityBytes {
		return false
	}
	mo := func(m *persistence.MountOptions) persistence.MountOptions {
		if m == nil {
			return persistence.MountOptions{}
		}
		return *m
	}
	a, b := mo(w.MountOptions), mo(v.MountOptions)
	return w.Plugin == v.Plugin &&
		slices.Equal(w.Capabilities, v.Capabilities) &&
		a.FSType == b.FSType && slices.Equal(a.MountFlags, b.MountFlags) &&
		maps.Equal(w.Parameters, v.Parameters) &&
		maps.Equal(w.Secrets, v.Secrets)
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
}

func (r ClaimRequest) claim() claim.Request {
	return claim.Request{
		Alloc: r.Alloc,
		Mode:  r.Mode,
		Capability: csi.VolumeCapability{
			AccessMode: r.AccessMode, AttachmentMode: r.AttachmentMode,
		},
	}
}

func (r ClaimRequest) validate() error {
	if err := claim.CheckName("volume", r.VolumeID); err != nil {
		return err
	}
	return r.claim().Validate()
}

// Capability is an access mode and an attachment mode, by kebab-case names.
type Capability struct {
	AccessMode     string `json:"access_mode"`
	AttachmentMode string `json:"attachment_mode"`
}

// Volume is a volume's status: its definition (without secrets or mount
// flags), its claims, its past claims and its stagings.
type Volume struct {
	ID           string       `json:"id"`
	Plugin       string       `json:"plugin"`
	ExternalID   string       `json:"external_id"`
	Capabilities []Capability `json:"capabilities"`
	// FSType and MountFlagCount describe the mount options; the flags
	// themselves are never shown.
	FSType         string            `json:"fs_type,omitempty"`
	MountFlagCount int               `json:"mount_flag_count,omitempty"`
	Parameters     map[string]string `json:"parameters,omitempty"`
	Context        map[string]string `json:"context,omitempty"`
	CapacityBytes  int64             `json:"capacity_bytes,omitempty"`
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
}

// Claim is a current or past claim's status.
type Claim struct {
	Volume         string `json:"volume"`
	Alloc          string `json:"alloc"`
	Mode           string `json:"mode"`
	AccessMode     string `json:"access_mode"`
	AttachmentMode string `json:"attachment_mode"`
	// State is a claim step (claim.StateReserved … claim.StatePublished)
	// or a release state (claim.StateTaken … claim.StateFreed).
	State       string `json:"state"`
	Usage       string `json:"usage"`
	TargetPath  string `json:"target_path"`
	StagingPath string `json:"staging_path,omitempty"`
	NodeID      string `json:"node_id,omitempty"`
	// LastError is the last failure of the current step.
	LastError string `json:"last_error,omitempty"`
	Attempts  int    `json:"attempts,omitempty"`
	// Repair names what the host was missing (claim.RepairTarget,
	// RepairStaging, RepairBootID) while the claim is published again.
	Repair string `json:"repair,omitempty"`
	// Condition is ConditionRepairing or ConditionDegraded while Repair is
	// set, empty otherwise.
	Condition string    `json:"condition,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// ControllerRequired: the claim goes (or went) through
	// ControllerPublishVolume, so its teardown needs the controller.
	ControllerRequired bool `json:"controller_required,omitempty"`
}

// Staging is one staging path of a volume and the allocations that use it.
type Staging struct {
	Usage  string   `json:"usage"`
	Path   string   `json:"path"`
	Users  []string `json:"users"`
	Staged bool     `json:"staged"`
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

func viewOf(v *persistence.Volume) Volume {
	out := Volume{
		ID:                  v.ID,
		Plugin:              v.Plugin,
		ExternalID:          v.ExternalID,
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
	}
	for _, c := range v.Capabilities {
		out.Capabilities = append(out.Capabilities, Capability(c))
	}
	if v.MountOptions != nil {
		out.FSType = v.MountOptions.FSType
		out.MountFlagCount = len(v.MountOptions.MountFlags)
	}
	for i := range v.Claims {
		out.Claims = append(out.Claims, claimOf(v.ID, &v.Claims[i]))
	}
	for i := range v.PastClaims {
		out.PastClaims = append(out.PastClaims, claimOf(v.ID, &v.PastClaims[i]))
	}
	for _, st := range v.Stagings {
		out.Stagings = append(out.Stagings, Staging{Usage: st.Usage, Path: st.Path, Users: slices.Clone(st.Users), Staged: st.Staged})
	}
	out.Expansion = expansionOf(v.Expansion)
	for _, t := range v.AccessibleTopology {
		out.AccessibleTopology = append(out.AccessibleTopology, maps.Clone(t))
	}
	return out
}

func claimOf(volume string, c *persistence.Claim) Claim {
	out := claimFields(volume, c)
	out.ControllerRequired = c.ControllerRequired
	return out
}

func claimFields(volume string, c *persistence.Claim) Claim {
	return Claim{
		Volume:         volume,
		Alloc:          c.Alloc,
		Mode:           c.Mode,
		AccessMode:     c.AccessMode,
		AttachmentMode: c.AttachmentMode,
		State:          c.State,
		Usage:          c.Usage,
		TargetPath:     c.TargetPath,
		StagingPath:    c.StagingPath,
		NodeID:         c.NodeID,
		LastError:      c.LastError,
		Attempts:       c.Attempts,
		Repair:         c.Repair,
		Condition:      conditionOf(c),
		CreatedAt:      c.CreatedAt,
		UpdatedAt:      c.UpdatedAt,
	}
}

// The conditions of a claim the host was found missing (Claim.Condition).
const (
	// ConditionRepairing: the claim goes through its publish steps again
	// and no attempt has failed yet.
	ConditionRepairing = "repairing"
	// ConditionDegraded: an attempt of the repair failed (LastError says
	// why); it is retried with backoff.
	ConditionDegraded = "degraded"
)

func conditionOf(c *persistence.Claim) string {
	switch {
	case c.Repair == "":
		return ""
	case c.LastError != "" || c.Attempts > 0:
		return ConditionDegraded
	}
	return ConditionRepairing
}
