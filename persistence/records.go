package persistence

import (
	"time"

	"github.com/csiactor/csiactor/actors/plugin/container"
)

// Allocation is the persisted record of one plugin allocation.
type Allocation struct {
	ID     string `json:"id"`
	Plugin string `json:"plugin"`
	// Type is "controller", "node" or "monolith".
	Type string `json:"type"`
	// Socket is the unix socket path of an attached allocation, or the path
	// the agent chose for an exec-managed one.
	Socket string `json:"socket,omitempty"`
	// Command and Env are set for exec-managed allocations.
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// Image is set for a container-managed allocation.
	Image *container.Image `json:"image,omitempty"`
	// Seq is the creation sequence. PutAllocation assigns it the first time
	// an ID is stored and keeps it on every later put of the same ID, so the
	// order of allocations survives restarts and re-registration.
	Seq uint64 `json:"seq"`
	// Source is where the allocation was registered from: "config" (the
	// agent's config file, which is authoritative for it) or "api". Empty
	// in records written before the field existed, which count as "api".
	Source string `json:"source,omitempty"`

	// Process identity of a running exec-managed plugin, so that a restarted
	// agent can find (and stop) a process it started before it was killed.
	PID       int    `json:"pid,omitempty"`
	PIDStart  uint64 `json:"pid_start,omitempty"` // start time in clock ticks from /proc/<pid>/stat
	Healthy   bool   `json:"healthy"`
	HealthMsg string `json:"health_description,omitempty"`

	// Fingerprint, as last seen.
	Provider           string `json:"provider,omitempty"`
	Version            string `json:"version,omitempty"`
	NodeID             string `json:"node_id,omitempty"`
	ControllerRequired bool   `json:"controller_required,omitempty"`

	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Capability is a persisted volume capability, by kebab-case names.
type Capability struct {
	AccessMode     string `json:"access_mode"`
	AttachmentMode string `json:"attachment_mode"`
}

// MountOptions is a persisted set of mount options.
type MountOptions struct {
	FSType     string   `json:"fs_type,omitempty"`
	MountFlags []string `json:"mount_flags,omitempty"`
}

// Volume is the persisted record of one volume: its registration, its
// current claims, its past claims still being torn down, and the usage of
// its staging paths. The volume actor owns it and writes it whole after each
// step, so a record is always one consistent state.
type Volume struct {
	ID            string            `json:"id"`
	Plugin        string            `json:"plugin"`
	ExternalID    string            `json:"external_id"`
	Capabilities  []Capability      `json:"capabilities"`
	MountOptions  *MountOptions     `json:"mount_options,omitempty"`
	Parameters    map[string]string `json:"parameters,omitempty"`
	Context       map[string]string `json:"context,omitempty"`
	Secrets       map[string]string `json:"secrets,omitempty"`
	CapacityBytes int64             `json:"capacity_bytes,omitempty"`
	// Created is true for volumes made through CreateVolume.
	Created bool `json:"created,omitempty"`

	// PublishContext is what ControllerPublishVolume returned for this host,
	// kept for NodeStage/NodePublish; ControllerPublished says it is valid.
	ControllerPublished bool              `json:"controller_published,omitempty"`
	PublishContext      map[string]string `json:"publish_context,omitempty"`

	Claims     []Claim   `json:"claims,omitempty"`
	PastClaims []Claim   `json:"past_claims,omitempty"`
	Stagings   []Staging `json:"stagings,omitempty"`

	// Revision increases by one on every write of the record.
	Revision  uint64    `json:"revision"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`

	// Expansion is the expansion in progress: recorded before its first
	// RPC, removed when it is done or has failed for good; nil when none.
	Expansion *Expansion `json:"expansion,omitempty"`
	// AccessibleTopology is where the volume can be reached from, as
	// CreateVolume answered: each element is one topology's segments. Empty
	// means everywhere (or unknown).
	AccessibleTopology []map[string]string `json:"accessible_topology,omitempty"`
	// NodeExpandPending is the capacity a NodeExpandVolume still owes the
	// volume: the controller expanded it and asked for a node expansion
	// that could not run then (no published claim, or a node plugin that
	// expands only offline). The next publish runs it; 0 for none.
	NodeExpandPending int64 `json:"node_expand_pending,omitempty"`
	// SecretsFrom is the file the volume's secrets are read from at each
	// RPC that carries them (see internal/secretfile), instead of
	// Secrets: only this reference is stored, never the values.
	SecretsFrom string `json:"secrets_from,omitempty"`
	// Ephemeral is the phase of a volume a claim created for itself (an
	// ephemeral volume), "" for any other: EphemeralCreating (the intent,
	// recorded before CreateVolume; ExternalID is empty until it
	// answers), EphemeralReady (created; claimed like any volume), and
	// EphemeralDeleting (its last claim was freed; recorded before
	// DeleteVolume, the record goes when it succeeds).
	Ephemeral string `json:"ephemeral,omitempty"`
	// ClaimMountFlags are the mount flags of the current claims' own, by
	// alloc, joined with NUL bytes (a flag holds none). Like the volume's
	// they may carry credentials: never shown. Replaced, never changed in
	// place (see claim.CloneVolume).
	ClaimMountFlags map[string]string `json:"claim_mount_flags,omitempty"`
	// MutableParameters are the mutable parameters ControllerModifyVolume
	// applied to the volume, each modification merged into the ones
	// before; empty when it was never modified.
	MutableParameters map[string]string `json:"mutable_parameters,omitempty"`
	// Modifying is the modification in progress: the mutable parameters
	// asked for, recorded before the first ControllerModifyVolume and
	// removed (merged into MutableParameters) when it is done, or when it
	// has failed for good; empty when none.
	Modifying map[string]string `json:"modifying,omitempty"`
}

// The phases of an ephemeral volume (Volume.Ephemeral).
const (
	EphemeralCreating = "creating"
	EphemeralReady    = "ready"
	EphemeralDeleting = "deleting"
)

// Expansion is a volume's expansion in progress, as its steps left it.
type Expansion struct {
	// CapacityBytes is the capacity asked for.
	CapacityBytes int64 `json:"capacity_bytes"`
	// Controller: ControllerExpandVolume is still to be done.
	Controller bool `json:"controller,omitempty"`
	// NodeCapable: the node plugin has EXPAND_VOLUME, so NodeExpandVolume
	// runs when the controller says it is required (or when the plugin has
	// no controller expansion at all).
	NodeCapable bool `json:"node_capable,omitempty"`
	// Node: NodeExpandVolume is still to be done on every published claim.
	Node bool `json:"node,omitempty"`
	// LastError is the last failure of the current step, without secrets.
	LastError string `json:"last_error,omitempty"`
	Attempts  int    `json:"attempts,omitempty"`
	// NodeOffline: the node plugin expands volumes only OFFLINE, so a
	// node expansion the controller asks for while the volume is
	// published waits for the next publish (Volume.NodeExpandPending).
	NodeOffline bool `json:"node_offline,omitempty"`
}

// Claim is a current or past claim on a volume by one allocation.
type Claim struct {
	Alloc          string `json:"alloc"`
	Mode           string `json:"mode"` // "read" or "write"
	AccessMode     string `json:"access_mode"`
	AttachmentMode string `json:"attachment_mode"`
	// State is a claim step ("reserved", "controller-published", "staged",
	// "published") for a current claim, or a release state ("taken",
	// "node-detached", "controller-detached", "ready-to-free", "freed") for a
	// past one.
	State       string `json:"state"`
	Usage       string `json:"usage"`
	TargetPath  string `json:"target_path"`
	StagingPath string `json:"staging_path,omitempty"`
	// LastError is the last failure of the current step, with secrets and
	// mount flags already removed.
	LastError string    `json:"last_error,omitempty"`
	Attempts  int       `json:"attempts,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// NodeID is the node plugin's ID for this host when the claim was
	// reserved; ControllerPublishVolume and ControllerUnpublishVolume use it.
	NodeID string `json:"node_id,omitempty"`
	// ControllerRequired is true when the plugin needed
	// ControllerPublishVolume when the claim was reserved, so teardown runs
	// ControllerUnpublishVolume even if the publish's outcome was never
	// recorded.
	ControllerRequired bool `json:"controller_required,omitempty"`
	// Repair names what the host was found missing for this claim (a
	// published claim's "target path", its "staging path", or "boot ID
	// changed") while it goes through its publish steps again; empty
	// otherwise. Set on current claims only.
	Repair string `json:"repair,omitempty"`
	// ReadOnly, MountGroup and SELinuxContext are the claim's own
	// publish options (see runtime.ClaimRequest), kept so that a resume or
	// repair publishes with the same ones; MountGroup is a decimal gid,
	// empty for none. The claim's own mount flags are kept on the volume
	// (Volume.ClaimMountFlags), so that the claim record, which is shown,
	// never holds one; MountFlagCount says how many there are.
	ReadOnly       bool   `json:"read_only,omitempty"`
	MountFlagCount int    `json:"mount_flag_count,omitempty"`
	MountGroup     string `json:"mount_group,omitempty"`
	SELinuxContext string `json:"selinux_context,omitempty"`
}

// Staging records who uses one staging path of a volume (one per usage).
type Staging struct {
	Usage string   `json:"usage"`
	Path  string   `json:"path"`
	Users []string `json:"users"` // alloc IDs
	// Staged is true once NodeStageVolume succeeded.
	Staged bool `json:"staged"`
	// Mounted is true when the staging path was a mount point after
	// NodeStageVolume last succeeded: only such a staging can be found
	// lost in the mount table (a plugin may stage without mounting
	// anything, as the hostpath driver does).
	Mounted bool `json:"mounted,omitempty"`
	// Lost is true when the host was found missing the staging: the
	// plugin's own record of it is reset (NodeUnstageVolume) before it is
	// staged again.
	Lost bool `json:"lost,omitempty"`
}
