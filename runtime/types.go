// Package runtime assembles csiactor's actor system and is its public Go API
// for embedding: the types below are both the embedding API's values and the
// HTTP API's JSON bodies (snake_case fields).
package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/csiactor/csiactor/actors/plugin/container"
	"github.com/csiactor/csiactor/actors/registry"
	"github.com/csiactor/csiactor/actors/volume"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/secretfile"
	"github.com/csiactor/csiactor/persistence"
)

// Allocation types.
const (
	// TypeController is an allocation that serves only the controller
	// service of its plugin.
	TypeController = "controller"
	// TypeNode is an allocation that serves only the node service.
	TypeNode = "node"
	// TypeMonolith is an allocation that serves both; it counts as a
	// controller and as a node.
	TypeMonolith = "monolith"
)

// Claim modes.
const (
	// ModeRead is a claim that only reads the volume.
	ModeRead = "read"
	// ModeWrite is a claim that may write the volume.
	ModeWrite = "write"
)

// Claim states. A current claim goes reserved → controller-published →
// staged → published (skipping steps the plugin does not need); a released
// (past) claim goes taken → node-detached → controller-detached →
// ready-to-free → freed.
const (
	ClaimReserved            = "reserved"
	ClaimControllerPublished = "controller-published"
	ClaimStaged              = "staged"
	ClaimPublished           = "published"
	// ClaimLost: the host was found missing what the claim published; the
	// plugin's record of it is reset (NodeUnpublishVolume) before it goes
	// through its publish steps again from reserved.
	ClaimLost = "lost"

	ClaimTaken              = "taken"
	ClaimNodeDetached       = "node-detached"
	ClaimControllerDetached = "controller-detached"
	ClaimReadyToFree        = "ready-to-free"
	ClaimFreed              = "freed"
)

// Event types.
const (
	EventAllocationRegistered   = "allocation-registered"
	EventAllocationDeregistered = "allocation-deregistered"
	EventHealthChanged          = "health-changed"
	EventSingletonChanged       = "singleton-changed"
	// EventActiveChanged: operations of a plugin's controller or node side
	// now go to another allocation (an older healthy one while the
	// singleton is unhealthy, or back to the singleton).
	EventActiveChanged = "active-changed"
	// EventNodeInfoChanged: a fingerprint of a healthy node allocation
	// found NodeGetInfo's answer changed; Message has the new
	// max_volumes_per_node, which new claims are held to from now on.
	EventNodeInfoChanged = "node-info-changed"
	// EventPluginHung: an allocation answered Probe while its node RPCs
	// kept ending in DeadlineExceeded (plugins.hung_rpc_restart in a
	// row); Message says how many, and that an exec-managed plugin is
	// being restarted (an attached one is reported unhealthy).
	EventPluginHung         = "plugin-hung"
	EventVolumeRegistered   = "volume-registered"
	EventVolumeDeregistered = "volume-deregistered"
	EventVolumeCreated      = "volume-created"
	EventVolumeDeleted      = "volume-deleted"
	EventClaimPublished     = "claim-published"
	EventClaimReleased      = "claim-released"
	EventClaimFreed         = "claim-freed"
	EventClaimFailed        = "claim-failed"
	// EventClaimRepaired: a claim whose volume the host was missing (its
	// target or staging path not mounted, or the host rebooted) is
	// published again; Message names what was missing.
	EventClaimRepaired = "claim-repaired"
	// EventRegistrationRefused: a driver announced in the registration
	// directory was not registered; Message is the reason, also told to
	// its registrar.
	EventRegistrationRefused = "registration-refused"
	// EventClaimStep: a claim reached a step short of published: reserved
	// (Message "write claim reserved (ACCESS/ATTACHMENT)"),
	// controller-published or staged (Message the state).
	EventClaimStep = "claim-step"
	// EventClaimRetrying: a claim's step failed and is retried with
	// backoff; Message has the attempt and the error, which names the RPC.
	EventClaimRetrying = "claim-retrying"
	// EventClaimStalled: a claim or past claim has not changed state for
	// volumes.stall_after (its condition is ClaimStalled); Message names
	// the state and its last error. Once per stall.
	EventClaimStalled = volume.EventClaimStalled
	// EventMountBroken: a published claim's target or staging path was in
	// the mount table but dead (ENOTCONN: a FUSE mount whose plugin died;
	// EIO, ESTALE, or a probe that did not answer: timeout); the claim's
	// condition is ClaimBroken and it is published again. Message names
	// the path and the cause.
	EventMountBroken = volume.EventMountBroken
	// EventMountHealed: a claim whose mount was found dead is published
	// again; Message says how long the heal took, and whether the agent
	// unmounted the dead mount itself because the plugin could not.
	EventMountHealed = volume.EventMountHealed
	// EventUIAction: the web UI forced a release or fenced a host (the
	// audit of its only actions); Message names the action, its target
	// and how the API answered, Volume and Alloc the claim, if any.
	EventUIAction = "ui-action"
	// EventAPIWrite: a request of the API that changes something (any
	// method but GET and HEAD) was answered; Token names its token and
	// the message has the method, path and status.
	EventAPIWrite = "api-write"
	// EventsDropped tells a subscriber that it fell behind and lost events;
	// Message says how many.
	EventsDropped = "events-dropped"
)

// Limits on input.
const (
	// MaxIDLength is the longest allocation ID, volume ID or plugin name.
	MaxIDLength = 128
	// MaxSocketPathLength is the longest unix socket path Linux accepts
	// (sun_path is 108 bytes including the terminating NUL).
	MaxSocketPathLength = 107
	// MaxExternalIDLength is the longest external volume ID.
	MaxExternalIDLength = 1024
)

// Plugin is one CSI plugin as the registry sees it: every allocation of it
// on this host, and which of them are healthy.
type Plugin struct {
	// Name is the plugin name allocations were registered under.
	Name string `json:"name"`
	// Provider and Version come from GetPluginInfo of the singleton.
	Provider string `json:"provider"`
	Version  string `json:"version"`
	// ControllerRequired is true when the plugin has a controller service
	// that supports ControllerPublishVolume, so claims go through it.
	ControllerRequired  bool `json:"controller_required"`
	ControllersHealthy  int  `json:"controllers_healthy"`
	ControllersExpected int  `json:"controllers_expected"`
	NodesHealthy        int  `json:"nodes_healthy"`
	NodesExpected       int  `json:"nodes_expected"`
	// Allocations are the plugin's allocations, newest first.
	Allocations []Allocation `json:"allocations"`
	// ProxySocket is the plugin's CSI proxy socket, with plugins.proxy
	// on; ProxyError says why it has none (a socket path over the unix
	// limit, for one).
	ProxySocket string `json:"proxy_socket,omitempty"`
	ProxyError  string `json:"proxy_error,omitempty"`
}

// Allocation is one running (or expected) instance of a plugin.
type Allocation struct {
	ID     string `json:"id"`
	Plugin string `json:"plugin"`
	// Type is TypeController, TypeNode or TypeMonolith.
	Type string `json:"type"`
	// Socket is the plugin's unix socket path: given for an attached
	// allocation, chosen by the agent for an exec-managed one.
	Socket string `json:"socket"`
	// Command and Env are set for an exec-managed allocation.
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Healthy bool              `json:"healthy"`
	// HealthDescription says why the allocation is (un)healthy.
	HealthDescription string `json:"health_description"`
	// Singleton is true for the allocation that operations of its plugin
	// and type go to.
	Singleton bool `json:"singleton"`
	// NodeID is what NodeGetInfo returned, for node and monolith types.
	NodeID string `json:"node_id,omitempty"`
	// Source is where the allocation was registered: "config" (the config
	// file, which is authoritative for it on every start), "api", or
	// "registration" (a CSI driver announced in plugins.registration_dir,
	// deregistered when its registration socket goes).
	Source string `json:"source,omitempty"`
	// PID is the plugin process of an exec-managed allocation, started or
	// adopted by this agent; 0 while none runs.
	PID int `json:"pid,omitempty"`
	// Image, Engine, ImageDigest and ContainerID describe a
	// container-managed allocation: the image reference, the engine that
	// runs it, the digest (image ID) of the image its container runs and
	// the running container's ID (empty while none runs).
	Image       string `json:"image,omitempty"`
	Engine      string `json:"engine,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
	// Capabilities is what the plugin announced at the allocation's last
	// fingerprint; nil until it was fingerprinted since the agent started.
	Capabilities *Capabilities `json:"capabilities,omitempty"`
}

// Capabilities is what an allocation's plugin can do, by CSI names (like
// CREATE_DELETE_VOLUME): its plugin capabilities (CONTROLLER_SERVICE,
// VOLUME_ACCESSIBILITY_CONSTRAINTS, EXPANSION_ONLINE, EXPANSION_OFFLINE),
// its controller's and node's RPC capabilities by its type, and the node's
// topology (Topology, its accessible segments) and volume limit
// (MaxVolumesPerNode, 0 for none) from NodeGetInfo.
type Capabilities = registry.Capabilities

// AllocationSpec is the body of a register-allocation request: an attached
// allocation gives Socket, an exec-managed one gives Command (and Env).
// The allocation ID is given beside it (the URL path, or
// [AllocationConfig.ID]).
type AllocationSpec struct {
	Plugin  string            `json:"plugin" yaml:"plugin"`
	Type    string            `json:"type" yaml:"type"`
	Socket  string            `json:"socket,omitempty" yaml:"socket,omitempty"`
	Command []string          `json:"command,omitempty" yaml:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty" yaml:"env,omitempty"`
	// Image makes the allocation container-managed: the agent runs the
	// plugin in a container of this image, with the engine it names.
	Image *container.Image `json:"image,omitempty" yaml:"image,omitempty"`
}

// Validate checks s; the error is a *FieldError naming the bad field.
func (s AllocationSpec) Validate() error {
	if err := ValidateID("plugin", s.Plugin); err != nil {
		return err
	}
	if err := ValidateAllocationType("type", s.Type); err != nil {
		return err
	}
	if s.Image != nil {
		switch {
		case s.Socket != "":
			return fieldErr("image", "give one of socket (an attached plugin), command (an exec-managed plugin) or image (a plugin the agent runs in a container), not socket and image")
		case len(s.Command) > 0:
			return fieldErr("image", "give one of socket (an attached plugin), command (an exec-managed plugin) or image (a plugin the agent runs in a container), not command and image")
		case len(s.Env) > 0:
			return fieldErr("env", "only valid with command; give a container's environment as image.env")
		}
		var fe *container.FieldError
		if err := s.Image.Validate(); errors.As(err, &fe) {
			return fieldErr("image."+fe.Field, fe.Msg)
		}
		return nil
	}
	switch {
	case s.Socket != "" && len(s.Command) > 0:
		return fieldErr("socket", "give either socket (an attached plugin) or command (an exec-managed plugin), not both")
	case s.Socket == "" && len(s.Command) == 0:
		return fieldErr("socket", "give socket (an attached plugin), command (an exec-managed plugin) or image (a plugin the agent runs in a container)")
	case s.Socket != "":
		if err := ValidateSocketPath("socket", s.Socket); err != nil {
			return err
		}
		if len(s.Env) > 0 {
			return fieldErr("env", "only valid with command (an exec-managed plugin)")
		}
		return nil
	}
	if s.Command[0] == "" {
		return fieldErr("command[0]", "must not be empty")
	}
	if c := s.Command[0]; !filepath.IsAbs(c) && strings.ContainsRune(c, '/') {
		return fieldErr("command[0]", fmt.Sprintf("%q is a relative path; give an absolute path, or a bare name found in the agent's PATH", c))
	}
	for i, a := range s.Command {
		if strings.ContainsRune(a, 0) {
			return fieldErr(fmt.Sprintf("command[%d]", i), "must not contain a NUL byte")
		}
	}
	for _, k := range sortedKeys(s.Env) {
		switch {
		case k == "":
			return fieldErr("env", "variable names must not be empty")
		case strings.ContainsAny(k, "=\x00"):
			return fieldErr("env", fmt.Sprintf("variable name %q must not contain '=' or NUL", k))
		case strings.ContainsRune(s.Env[k], 0):
			return fieldErr("env."+k, "must not contain a NUL byte")
		}
	}
	return nil
}

// Capability is one way a volume can be used, by the kebab-case names of
// package csi: access_mode like "single-node-writer", attachment_mode
// "file-system" or "block-device".
//
// Its fields are the persisted record's ([persistence.Capability]); the
// type adds Parse.
type Capability volume.Capability

// Parse returns c in the csi package's form; the error is a *FieldError
// naming access_mode or attachment_mode.
func (c Capability) Parse() (csi.VolumeCapability, error) {
	am, err := csi.ParseAccessMode(c.AccessMode)
	if err != nil {
		return csi.VolumeCapability{}, &FieldError{Field: "access_mode", Msg: err.Error(), Err: err}
	}
	at, err := csi.ParseAttachmentMode(c.AttachmentMode)
	if err != nil {
		return csi.VolumeCapability{}, &FieldError{Field: "attachment_mode", Msg: err.Error(), Err: err}
	}
	return csi.VolumeCapability{AccessMode: am, AttachmentMode: at}, nil
}

// MountOptions are the file-system options of a volume's mounts, as given in
// a register or create request: FSType (fs_type) and MountFlags
// (mount_flags), the fields of the persisted record
// ([persistence.MountOptions]). Mount flags often carry credentials:
// String, GoString and MarshalJSON show only how many there are. Use
// [VolumeSpec.RequestJSON] to send them.
type MountOptions persistence.MountOptions

// Redacted returns o as it may be shown: the file-system type and the number
// of mount flags. It returns nil for nil.
func (o *MountOptions) Redacted() *RedactedMountOptions {
	return volume.RedactMountOptions((*persistence.MountOptions)(o))
}

// String prints the file-system type and the number of mount flags.
func (o *MountOptions) String() string {
	if o == nil {
		return "<nil>"
	}
	return fmt.Sprintf("fs_type=%q mount_flags=[%d redacted]", o.FSType, len(o.MountFlags))
}

// GoString is String, so that %#v redacts too.
func (o *MountOptions) GoString() string { return o.String() }

// MarshalJSON writes the redacted form, {"fs_type", "mount_flag_count"}.
func (o *MountOptions) MarshalJSON() ([]byte, error) { return json.Marshal(o.Redacted()) }

// CSI returns o in the csi package's form (nil for nil).
func (o *MountOptions) CSI() *csi.MountOptions {
	if o == nil {
		return nil
	}
	return &csi.MountOptions{FSType: o.FSType, MountFlags: append([]string(nil), o.MountFlags...)}
}

// RedactedMountOptions are mount options as the API shows them: never the
// flags, only their count.
type RedactedMountOptions = volume.RedactedMountOptions

// VolumeSpec is the body of a register-volume request (PUT /v1/volumes/{id}):
// an existing volume of the plugin, known to it as ExternalID.
//
// Secrets and mount flags are input only: String, GoString and MarshalJSON
// leave them out (MarshalJSON writes secret_count and mount_flag_count), so
// a spec can be printed or logged safely. [VolumeSpec.RequestJSON] writes the
// full body for sending.
type VolumeSpec struct {
	Plugin       string            `json:"plugin"`
	ExternalID   string            `json:"external_id,omitempty"`
	Capabilities []Capability      `json:"capabilities"`
	MountOptions *MountOptions     `json:"mount_options,omitempty"`
	Parameters   map[string]string `json:"parameters,omitempty"`
	Context      map[string]string `json:"context,omitempty"`
	Secrets      map[string]string `json:"secrets,omitempty"`
	// SecretsFrom, instead of Secrets, names where the secrets are read
	// at each RPC that carries them; only the reference is stored.
	SecretsFrom *SecretsFrom `json:"secrets_from,omitempty"`
}

// SecretsFrom is where a volume's secrets are read from (see
// internal/secretfile): File is an absolute path to a JSON or YAML map, or
// to a directory with one file per key, or $CREDENTIALS_DIRECTORY/NAME (a
// systemd credential). It is a reference, not a secret: status shows it.
type SecretsFrom struct {
	File string `json:"file"`
}

// validateSecretsFrom checks s.SecretsFrom's form and that s does not
// also give literal secrets.
func (s VolumeSpec) validateSecretsFrom() error {
	if s.SecretsFrom == nil {
		return nil
	}
	if len(s.Secrets) > 0 {
		return fieldErr("secrets_from", "cannot be combined with secrets: give the secrets or where to read them, not both")
	}
	if s.SecretsFrom.File == "" {
		return fieldErr("secrets_from.file", "must not be empty (a file or directory of secrets, or $CREDENTIALS_DIRECTORY/NAME)")
	}
	if err := secretfile.Check(s.SecretsFrom.File); err != nil {
		return fieldErr("secrets_from.file", err.Error())
	}
	return nil
}

// secretsRef is the reference of s.SecretsFrom, "" for none.
func (s VolumeSpec) secretsRef() string {
	if s.SecretsFrom == nil {
		return ""
	}
	return s.SecretsFrom.File
}

// Validate checks s as a register request; the error is a *FieldError
// naming the bad field.
func (s VolumeSpec) Validate() error {
	if err := s.validate(); err != nil {
		return err
	}
	if s.ExternalID == "" {
		return fieldErr("external_id", "must not be empty (the plugin's ID of the volume)")
	}
	return nil
}

func (s VolumeSpec) validate() error {
	if err := ValidateID("plugin", s.Plugin); err != nil {
		return err
	}
	if len(s.ExternalID) > MaxExternalIDLength {
		return fieldErr("external_id", fmt.Sprintf("longer than %d bytes", MaxExternalIDLength))
	}
	if !utf8.ValidString(s.ExternalID) || strings.ContainsRune(s.ExternalID, 0) {
		return fieldErr("external_id", "must be UTF-8 without NUL bytes")
	}
	if len(s.Capabilities) == 0 {
		return fieldErr("capabilities", "give at least one {access_mode, attachment_mode}")
	}
	fileSystem := false
	for i, c := range s.Capabilities {
		vc, err := c.Parse()
		if err != nil {
			return prefixed(fmt.Sprintf("capabilities[%d]", i), err)
		}
		for j := range i {
			if s.Capabilities[j] == c {
				return fieldErr(fmt.Sprintf("capabilities[%d]", i), fmt.Sprintf("duplicate of capabilities[%d]", j))
			}
		}
		fileSystem = fileSystem || vc.AttachmentMode == csi.AttachmentModeFileSystem
	}
	if o := s.MountOptions; o != nil {
		if !fileSystem && (o.FSType != "" || len(o.MountFlags) > 0) {
			return fieldErr("mount_options", "only valid with a file-system capability")
		}
		if o.FSType != "" && !validFSType(o.FSType) {
			return fieldErr("mount_options.fs_type", fmt.Sprintf("%q is not a file-system type name", o.FSType))
		}
		if err := validateMountFlags("mount_options.mount_flags", o.MountFlags); err != nil {
			return err
		}
	}
	for _, m := range []struct {
		field  string
		values map[string]string
		secret bool
	}{{"parameters", s.Parameters, false}, {"context", s.Context, false}, {"secrets", s.Secrets, true}} {
		if err := validateMap(m.field, m.values, m.secret); err != nil {
			return err
		}
	}
	return s.validateSecretsFrom()
}

// String prints s without secrets and mount flags.
func (s VolumeSpec) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "plugin=%q external_id=%q capabilities=%v", s.Plugin, s.ExternalID, s.Capabilities)
	if s.MountOptions != nil {
		fmt.Fprintf(&b, " mount_options={%s}", s.MountOptions)
	}
	if len(s.Parameters) > 0 {
		fmt.Fprintf(&b, " parameters=%v", s.Parameters)
	}
	if len(s.Context) > 0 {
		fmt.Fprintf(&b, " context=%v", s.Context)
	}
	if len(s.Secrets) > 0 {
		fmt.Fprintf(&b, " secrets=[%d redacted]", len(s.Secrets))
	}
	if s.SecretsFrom != nil {
		fmt.Fprintf(&b, " secrets_from=%q", s.SecretsFrom.File)
	}
	return "{" + b.String() + "}"
}

// GoString is String, so that %#v redacts too.
func (s VolumeSpec) GoString() string { return "runtime.VolumeSpec" + s.String() }

// MarshalJSON writes s without secrets and mount flags: secrets become
// secret_count and mount options their redacted form. Decoding that
// output back into a VolumeSpec fails on the unknown fields, so a redacted
// spec is never sent by mistake.
func (s VolumeSpec) MarshalJSON() ([]byte, error) { return json.Marshal(redactVolumeSpec(s)) }

// RequestJSON returns the full JSON body of s, secrets and mount flags
// included, for sending to the agent. Never log it.
func (s VolumeSpec) RequestJSON() ([]byte, error) { return json.Marshal(wireVolumeSpec(s)) }

// CreateVolumeSpec is the body of a create-volume request (POST /v1/volumes):
// the register body without external_id (the plugin chooses it), plus the
// new volume's ID and capacity. The ID is also the name given to the
// plugin's CreateVolume.
type CreateVolumeSpec struct {
	ID string `json:"id"`
	VolumeSpec
	// CapacityBytes is the requested size; 0 lets the plugin choose.
	CapacityBytes int64 `json:"capacity_bytes,omitempty"`
	// Topology is where the volume must be reachable from: each element
	// one topology's segments, sent to CreateVolume as requisite and
	// preferred. Empty: this host's node topology, when the plugin has
	// VOLUME_ACCESSIBILITY_CONSTRAINTS.
	Topology []map[string]string `json:"topology,omitempty"`
	// ContentSource is what the new volume starts as a copy of; nil for
	// an empty volume.
	ContentSource *ContentSource `json:"content_source,omitempty"`
}

// ContentSource is what a created volume starts as a copy of: a snapshot
// taken through this agent (a restore; the plugin's controller needs
// CREATE_DELETE_SNAPSHOT) or a registered volume (a clone; CLONE_VOLUME),
// either of the same plugin. Give one of the two.
type ContentSource struct {
	Snapshot string `json:"snapshot,omitempty"`
	Volume   string `json:"volume,omitempty"`
}

// Validate checks c; the error is a *FieldError naming the bad field.
func (c *ContentSource) Validate() error {
	switch {
	case c == nil:
		return nil
	case c.Snapshot != "" && c.Volume != "":
		return fieldErr("content_source", "give snapshot or volume, not both")
	case c.Snapshot != "":
		return ValidateID("content_source.snapshot", c.Snapshot)
	case c.Volume == "":
		return fieldErr("content_source", "give snapshot or volume")
	}
	return ValidateID("content_source.volume", c.Volume)
}

// Validate checks s as a create request; the error is a *FieldError naming
// the bad field.
func (s CreateVolumeSpec) Validate() error {
	if err := ValidateID("id", s.ID); err != nil {
		return err
	}
	if s.ExternalID != "" {
		return fieldErr("external_id", "is chosen by the plugin on create; leave it out")
	}
	if s.CapacityBytes < 0 {
		return fieldErr("capacity_bytes", "must not be negative")
	}
	if err := validateTopologies("topology", s.Topology); err != nil {
		return err
	}
	if err := s.ContentSource.Validate(); err != nil {
		return err
	}
	return s.validate()
}

// String prints s without secrets and mount flags.
func (s CreateVolumeSpec) String() string {
	return fmt.Sprintf("{id=%q capacity_bytes=%d topology=%v %s}", s.ID, s.CapacityBytes, s.Topology, strings.TrimPrefix(s.VolumeSpec.String(), "{"))
}

// GoString is String, so that %#v redacts too.
func (s CreateVolumeSpec) GoString() string { return "runtime.CreateVolumeSpec" + s.String() }

// MarshalJSON writes s without secrets and mount flags, like
// [VolumeSpec.MarshalJSON].
func (s CreateVolumeSpec) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ID string `json:"id"`
		redactedVolumeSpec
		CapacityBytes int64               `json:"capacity_bytes,omitempty"`
		Topology      []map[string]string `json:"topology,omitempty"`
		ContentSource *ContentSource      `json:"content_source,omitempty"`
	}{s.ID, redactVolumeSpec(s.VolumeSpec), s.CapacityBytes, s.Topology, s.ContentSource})
}

// RequestJSON returns the full JSON body of s, secrets and mount flags
// included, for sending to the agent. Never log it.
func (s CreateVolumeSpec) RequestJSON() ([]byte, error) {
	return json.Marshal(struct {
		ID string `json:"id"`
		volumeSpecWire
		CapacityBytes int64               `json:"capacity_bytes,omitempty"`
		Topology      []map[string]string `json:"topology,omitempty"`
		ContentSource *ContentSource      `json:"content_source,omitempty"`
	}{s.ID, wireVolumeSpec(s.VolumeSpec), s.CapacityBytes, s.Topology, s.ContentSource})
}

// Volume is a registered volume as the API shows it. It never holds secrets
// or mount flags.
type Volume struct {
	ID           string                `json:"id"`
	Plugin       string                `json:"plugin"`
	ExternalID   string                `json:"external_id"`
	Capabilities []Capability          `json:"capabilities"`
	MountOptions *RedactedMountOptions `json:"mount_options,omitempty"`
	Parameters   map[string]string     `json:"parameters,omitempty"`
	Context      map[string]string     `json:"context,omitempty"`
	// CapacityBytes is the size the plugin reported on create (0 when
	// unknown).
	CapacityBytes int64 `json:"capacity_bytes"`
	// Created is true for a volume made through its plugin's CreateVolume
	// (deleting it destroys it), false for one registered.
	Created bool `json:"created,omitempty"`
	// CreatedAt is when the volume was registered or created here.
	CreatedAt time.Time `json:"created_at,omitzero"`
	// Claims are the current claims; PastClaims the released ones still
	// being torn down.
	Claims     []Claim `json:"claims"`
	PastClaims []Claim `json:"past_claims"`
	// Expansion is the expansion in progress; nil when none.
	Expansion *Expansion `json:"expansion,omitempty"`
	// AccessibleTopology is where the volume can be reached from, as its
	// plugin said on create; empty means everywhere (or unknown).
	AccessibleTopology []map[string]string `json:"accessible_topology,omitempty"`
	// Usage and Condition are what the plugin last reported while the
	// volume has a published claim; nil before the first poll, after the
	// last claim is released, or when the plugin reports neither.
	Usage     *VolumeUsage     `json:"usage,omitempty"`
	Condition *VolumeCondition `json:"condition,omitempty"`
	// UsageStatus and ConditionStatus say, while the volume has a
	// published claim on this host, whether Usage and Condition are
	// reported (StatsReported), not polled yet (StatsPending: the first
	// poll comes within volumes.stats_interval), or never reported by
	// the plugin (StatsUnsupported); "" otherwise.
	UsageStatus     string `json:"usage_status,omitempty"`
	ConditionStatus string `json:"condition_status,omitempty"`
	// SecretsFrom is where the volume's secrets are read from at each
	// RPC; nil when it has literal secrets or none.
	SecretsFrom *SecretsFrom `json:"secrets_from,omitempty"`
	// Ephemeral is true for a volume a claim created for itself
	// ([ClaimRequest.Ephemeral]): it is deleted through its plugin's
	// controller once its last claim is freed. EphemeralPhase is where
	// that stands: "creating" (recorded before CreateVolume), "ready", or
	// "deleting" (recorded before DeleteVolume).
	Ephemeral      bool   `json:"ephemeral,omitempty"`
	EphemeralPhase string `json:"ephemeral_phase,omitempty"`
	// MutableParameters are the mutable parameters the plugin applied
	// (ControllerModifyVolume), every modification merged into the ones
	// before; Modifying are those of the modification in progress. Both
	// empty when none.
	MutableParameters map[string]string `json:"mutable_parameters,omitempty"`
	Modifying         map[string]string `json:"modifying,omitempty"`
}

// Claim is a current or past claim of a volume by one allocation.
type Claim struct {
	// Host is the cluster node that holds the claim (cluster mode only).
	Host           string `json:"host,omitempty"`
	Alloc          string `json:"alloc"`
	Mode           string `json:"mode"`
	AccessMode     string `json:"access_mode"`
	AttachmentMode string `json:"attachment_mode"`
	// State is one of the Claim* constants.
	State string `json:"state"`
	// TargetPath is where the volume is (or was) published for the alloc.
	TargetPath string `json:"target_path"`
	// LastError is the last failure of the current step, if it is being
	// retried, with secrets and mount flags removed.
	LastError string `json:"last_error,omitempty"`
	// Repair names what the host was missing while the claim is published
	// again: "target path", "staging path" or "boot ID changed"; a mount
	// point found dead rather than missing adds the cause: "target path
	// broken (ENOTCONN)".
	Repair string `json:"repair,omitempty"`
	// Condition is ClaimStalled when the claim or past claim has not
	// changed state for volumes.stall_after, otherwise ClaimBroken,
	// ClaimRepairing or ClaimDegraded while Repair is set; a claim with a condition is never
	// in state published.
	Condition string `json:"condition,omitempty"`
	// ReadOnly, MountGroup and SELinuxContext are the claim's options
	// as asked for; MountFlagCount how many mount flags of its own it has
	// (the flags are never shown).
	ReadOnly       bool   `json:"read_only,omitempty"`
	MountFlagCount int    `json:"mount_flag_count,omitempty"`
	MountGroup     *int64 `json:"mount_group,omitempty"`
	SELinuxContext string `json:"selinux_context,omitempty"`
}

// Claim conditions: ClaimRepairing and ClaimDegraded are set while a
// claim whose volume the host was missing goes through its publish steps
// again; ClaimStalled on a claim or past claim that has not changed state
// for volumes.stall_after (it comes first: a stuck repair is stalled).
const (
	// ClaimRepairing: no attempt of the repair has failed yet.
	ClaimRepairing = "repairing"
	// ClaimDegraded: an attempt failed (LastError says why); it is
	// retried with backoff.
	ClaimDegraded = "degraded"
	// ClaimStalled: the claim or past claim has not changed state for
	// volumes.stall_after; LastError says why when a step failed. It
	// goes on retrying, and the condition goes when it moves.
	ClaimStalled = volume.ConditionStalled
	// ClaimBroken: the claim's target or staging was found dead (in the
	// mount table, but a stat failed with ENOTCONN, EIO or ESTALE, or did
	// not answer); it is unmounted and published again.
	ClaimBroken = volume.ConditionBroken
)

// ClaimRequest is the body of a claim request
// (POST /v1/volumes/{id}/claims).
//
// MountFlags are input only, as a volume's: String, GoString and
// MarshalJSON show how many there are (mount_flag_count), never the
// flags. [ClaimRequest.RequestJSON] writes the full body for sending.
type ClaimRequest struct {
	Alloc          string `json:"alloc"`
	Mode           string `json:"mode"`
	AccessMode     string `json:"access_mode"`
	AttachmentMode string `json:"attachment_mode"`
	// Ephemeral, on a claim of a volume ID that is not registered, creates
	// the volume first through its plugin's controller, marked ephemeral:
	// it is deleted through the controller once its last claim is freed.
	// On a registered ephemeral volume the claim is a claim like any other;
	// on a registered volume that is not ephemeral it is ErrConflict. Not
	// available in cluster mode (ErrInvalid). See [EphemeralSpec].
	Ephemeral *EphemeralSpec `json:"ephemeral,omitempty"`
	// ReadOnly publishes the volume read-only, whatever the mode and
	// access mode. It is part of the claim's identity.
	ReadOnly bool `json:"read_only,omitempty"`
	// MountFlags are added to the volume's for this claim's publish
	// (file-system claims only).
	MountFlags []string `json:"mount_flags,omitempty"`
	// MountGroup is a gid the published volume is made writable by
	// (Kubernetes' fsGroup); nil for none.
	MountGroup *int64 `json:"mount_group,omitempty"`
	// SELinuxContext mounts the volume with context="..." (one per
	// volume on a host); a host without SELinux refuses it.
	SELinuxContext string `json:"selinux_context,omitempty"`
}

// Validate checks r; the error is a *FieldError naming the bad field.
func (r ClaimRequest) Validate() error {
	if err := r.validate(); err != nil {
		return err
	}
	if r.Ephemeral != nil {
		if _, err := r.Ephemeral.volumeSpec(r); err != nil {
			return prefixed("ephemeral", err)
		}
	}
	return nil
}

func (r ClaimRequest) validate() error {
	if err := ValidateID("alloc", r.Alloc); err != nil {
		return err
	}
	if r.Mode != ModeRead && r.Mode != ModeWrite {
		return fieldErr("mode", fmt.Sprintf("%q: want read or write", r.Mode))
	}
	vc, err := Capability{AccessMode: r.AccessMode, AttachmentMode: r.AttachmentMode}.Parse()
	if err != nil {
		return err
	}
	if r.Mode == ModeWrite && vc.AccessMode.ReadOnly() {
		return fieldErr("mode", fmt.Sprintf("write is not allowed with access mode %s", vc.AccessMode))
	}
	return r.validateOptions(vc.AttachmentMode)
}

// VolumeFilter selects volumes in a list; empty fields match everything.
type VolumeFilter struct {
	// Plugin keeps the volumes of this plugin.
	Plugin string
	// Node keeps the volumes claimed by allocations on this node ID.
	Node string
	// AllHosts adds to each volume, in cluster mode, the claims other
	// hosts hold (state ClaimRemote), as Volume does, read from etcd in
	// one request for the whole list. Without it a list shows this host's
	// claims only.
	AllHosts bool
}

// Validate checks f; the error is a *FieldError naming the bad field.
func (f VolumeFilter) Validate() error {
	if f.Plugin != "" {
		if err := ValidateID("plugin", f.Plugin); err != nil {
			return err
		}
	}
	if len(f.Node) > MaxIDLength*2 || strings.ContainsRune(f.Node, 0) {
		return fieldErr("node", "not a node ID")
	}
	return nil
}

// Event is something that happened in the agent, as the event stream shows
// it.
type Event struct {
	Time time.Time `json:"time"`
	// Type is one of the Event* constants.
	Type   string `json:"type"`
	Plugin string `json:"plugin,omitempty"`
	Alloc  string `json:"alloc,omitempty"`
	Volume string `json:"volume,omitempty"`
	// Snapshot is set on the snapshot events (the source volume is
	// Volume).
	Snapshot string `json:"snapshot,omitempty"`
	// Token is the name (never the value) of the API token that made the
	// write an EventAPIWrite or EventUIAction records ("unix" for the
	// unix socket).
	Token   string `json:"token,omitempty"`
	Message string `json:"message"`
}

// Validate checks e (for producers and decoders of events).
func (e Event) Validate() error {
	if e.Time.IsZero() {
		return fieldErr("time", "must be set")
	}
	if e.Type == "" {
		return fieldErr("type", "must not be empty")
	}
	return nil
}

// ValidateID checks an allocation ID, volume ID or plugin name, which become
// path components on the host: 1 to MaxIDLength bytes of letters, digits,
// '.', '_', '-' and ':', starting with a letter or digit (so "." and ".."
// are out, and so is "/"). field names the field in the error.
func ValidateID(field, id string) error {
	if id == "" {
		return fieldErr(field, "must not be empty")
	}
	if len(id) > MaxIDLength {
		return fieldErr(field, fmt.Sprintf("longer than %d bytes", MaxIDLength))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-' || c == ':'):
		default:
			return fieldErr(field, fmt.Sprintf("%q: use letters, digits, '.', '_', '-' and ':', starting with a letter or digit", id))
		}
	}
	return nil
}

// ValidateAllocationType checks that t is controller, node or monolith.
func ValidateAllocationType(field, t string) error {
	switch t {
	case TypeController, TypeNode, TypeMonolith:
		return nil
	}
	return fieldErr(field, fmt.Sprintf("%q: want controller, node or monolith", t))
}

// ValidateSocketPath checks a unix socket path: absolute, clean, and at most
// MaxSocketPathLength bytes.
func ValidateSocketPath(field, p string) error {
	switch {
	case strings.HasPrefix(p, "unix:"):
		return fieldErr(field, "give the socket's path, without unix://")
	case !filepath.IsAbs(p):
		return fieldErr(field, fmt.Sprintf("%q is not an absolute path", p))
	case strings.ContainsRune(p, 0):
		return fieldErr(field, "must not contain a NUL byte")
	case filepath.Clean(p) != p:
		return fieldErr(field, fmt.Sprintf("%q is not a clean path (want %q)", p, filepath.Clean(p)))
	case len(p) > MaxSocketPathLength:
		return fieldErr(field, fmt.Sprintf("path is %d bytes, over the %d-byte unix socket limit", len(p), MaxSocketPathLength))
	}
	return nil
}

func validFSType(s string) bool {
	if len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// validateMap checks that keys are non-empty UTF-8 and values have no NUL;
// for secrets it names neither key nor value.
func validateMap(field string, m map[string]string, secret bool) error {
	for _, k := range sortedKeys(m) {
		if k == "" || !utf8.ValidString(k) || strings.ContainsRune(k, 0) {
			return fieldErr(field, "keys must be non-empty UTF-8 without NUL bytes")
		}
		if strings.ContainsRune(m[k], 0) {
			if secret {
				return fieldErr(field, "values must not contain NUL bytes")
			}
			return fieldErr(field+"."+k, "must not contain a NUL byte")
		}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// volumeSpecWire is VolumeSpec without its redacting methods: its mount
// options are the record's type, which has none.
type volumeSpecWire struct {
	Plugin       string                    `json:"plugin"`
	ExternalID   string                    `json:"external_id,omitempty"`
	Capabilities []Capability              `json:"capabilities"`
	MountOptions *persistence.MountOptions `json:"mount_options,omitempty"`
	Parameters   map[string]string         `json:"parameters,omitempty"`
	Context      map[string]string         `json:"context,omitempty"`
	Secrets      map[string]string         `json:"secrets,omitempty"`
	SecretsFrom  *SecretsFrom              `json:"secrets_from,omitempty"`
}

func wireVolumeSpec(s VolumeSpec) volumeSpecWire {
	return volumeSpecWire{
		Plugin: s.Plugin, ExternalID: s.ExternalID, Capabilities: s.Capabilities,
		MountOptions: (*persistence.MountOptions)(s.MountOptions),
		Parameters:   s.Parameters, Context: s.Context, Secrets: s.Secrets,
		SecretsFrom: s.SecretsFrom,
	}
}

type redactedVolumeSpec struct {
	Plugin       string                `json:"plugin"`
	ExternalID   string                `json:"external_id,omitempty"`
	Capabilities []Capability          `json:"capabilities"`
	MountOptions *RedactedMountOptions `json:"mount_options,omitempty"`
	Parameters   map[string]string     `json:"parameters,omitempty"`
	Context      map[string]string     `json:"context,omitempty"`
	SecretCount  int                   `json:"secret_count,omitempty"`
	SecretsFrom  *SecretsFrom          `json:"secrets_from,omitempty"`
}

func redactVolumeSpec(s VolumeSpec) redactedVolumeSpec {
	return redactedVolumeSpec{
		Plugin: s.Plugin, ExternalID: s.ExternalID, Capabilities: s.Capabilities,
		MountOptions: s.MountOptions.Redacted(), Parameters: s.Parameters, Context: s.Context,
		SecretCount: len(s.Secrets), SecretsFrom: s.SecretsFrom,
	}
}
