package claim

import (
	"context"
	"fmt"
	"strconv"

	"github.com/csiactor/csiactor/csi"
)

// PluginType is the side of a plugin an RPC goes to.
type PluginType string

// The plugin types a claim talks to. A monolith allocation serves both.
const (
	ControllerPlugin PluginType = "controller"
	NodePlugin       PluginType = "node"
)

// Facts are what the registry knows about the current singleton of a plugin
// and type, from its last fingerprint.
type Facts struct {
	// NodeID is the node plugin's ID for this host (NodeGetInfo).
	NodeID string
	// ControllerRequired: the plugin needs a controller and the controller
	// supports PUBLISH_UNPUBLISH_VOLUME, so claims go through
	// ControllerPublishVolume.
	ControllerRequired bool
	// StageUnstage: the node plugin has STAGE_UNSTAGE_VOLUME.
	StageUnstage bool

	// What an expansion needs: the plugin has CONTROLLER_SERVICE; the
	// controller (when the type asked for is the controller) and the node
	// plugin (when it is the node, or the answer includes one) have
	// EXPAND_VOLUME; the plugin expands volumes ONLINE or OFFLINE.
	ControllerService bool
	ControllerExpand  bool
	NodeExpand        bool
	OnlineExpansion   bool
	OfflineExpansion  bool

	// What placement needs: the node plugin's topology segments and
	// volume limit (NodeGetInfo), and whether the plugin says volumes are
	// not equally reachable from every node
	// (VOLUME_ACCESSIBILITY_CONSTRAINTS).
	Topology                 map[string]string
	MaxVolumesPerNode        int64
	AccessibilityConstraints bool

	// CloneVolume: the controller (when the type asked for is the
	// controller) has CLONE_VOLUME.
	CloneVolume bool

	// What usage and condition polling needs: the node plugin has
	// GET_VOLUME_STATS (VolumeStats), reports the volume's condition in
	// its stats (NodeCondition: VOLUME_CONDITION, spec before v1.13) or
	// through NodeGetVolumeHealth (NodeHealth: GET_VOLUME_HEALTH); the
	// controller (when the type asked for is the controller) has GET_VOLUME
	// and VOLUME_CONDITION (ControllerCondition) or GET_VOLUME_HEALTH
	// (ControllerHealth).
	VolumeStats         bool
	NodeCondition       bool
	NodeHealth          bool
	ControllerCondition bool
	ControllerHealth    bool
	// CreateDeleteSnapshot and ListSnapshots: the controller (when the
	// type asked for is the controller) has CREATE_DELETE_SNAPSHOT and
	// LIST_SNAPSHOTS.
	CreateDeleteSnapshot bool
	ListSnapshots        bool
	// VolumeMountGroup: the node plugin has VOLUME_MOUNT_GROUP (a claim's
	// mount group goes to it as volume_mount_group).
	VolumeMountGroup bool
	// ControllerModify: the controller (when the type asked for is the
	// controller) has MODIFY_VOLUME.
	ControllerModify bool
}

// Plugins gives a claim the CSI client of a plugin's current singleton.
// The runtime implements it on top of the registry. Facts must be complete
// whatever the type asked for: a new claim asks for the node type and takes
// NodeID, StageUnstage and the plugin-level ControllerRequired from that one
// answer. Client is called before every RPC, so it should be cheap (a
// lookup, not a fingerprint).
type Plugins interface {
	// Client returns the client of the current singleton of plugin and typ
	// (a monolith allocation counts as both types) and its facts. The
	// client is shared and owned by the registry: callers never close it.
	// An error means no usable allocation (unknown plugin, none healthy).
	Client(ctx context.Context, plugin string, typ PluginType) (csi.Client, Facts, error)
	// WaitHealthy blocks until plugin and typ have a healthy allocation,
	// or ctx ends (it then returns ctx's error). It may return another
	// error at once (the plugin is unknown); callers then rely on their
	// backoff alone.
	WaitHealthy(ctx context.Context, plugin string, typ PluginType) error
}

// CachedPlugins is a Plugins that keeps its answers at hand (the runtime's
// does). A volume actor asks CachedClient first when a new claim needs the
// node plugin's facts: a hit saves starting a goroutine for Client, which
// may block.
type CachedPlugins interface {
	Plugins
	// CachedClient returns what Client would return for plugin and typ
	// when it can answer without blocking; ok is false otherwise (the
	// caller then calls Client). It never blocks.
	CachedClient(plugin string, typ PluginType) (c csi.Client, f Facts, ok bool)
}

// Refingerprinter is a Plugins that can ask a plugin's node allocations to
// fingerprint at once (the runtime's can). The Runner asks it after a
// ControllerPublishVolume answered ResourceExhausted, so that a lowered
// max_volumes_per_node is seen before the next claim rather than at the
// next heartbeat. It must not block.
type Refingerprinter interface {
	Refingerprint(plugin string)
}

// Method is one of the CSI RPCs a claim runs.
type Method int

// The claim RPCs, in the order of a claim's life.
const (
	ControllerPublish Method = iota + 1
	NodeStage
	NodePublish
	NodeUnpublish
	NodeUnstage
	ControllerUnpublish
)

var methodNames = [...]string{
	ControllerPublish:   "ControllerPublishVolume",
	NodeStage:           "NodeStageVolume",
	NodePublish:         "NodePublishVolume",
	NodeUnpublish:       "NodeUnpublishVolume",
	NodeUnstage:         "NodeUnstageVolume",
	ControllerUnpublish: "ControllerUnpublishVolume",
}

// String returns the CSI name of the RPC.
func (m Method) String() string {
	if m <= 0 || int(m) >= len(methodNames) {
		return "method(" + strconv.Itoa(int(m)) + ")"
	}
	return methodNames[m]
}

// Kind returns the classification column of the RPC.
func (m Method) Kind() csi.RPCKind {
	if m >= NodeUnpublish {
		return csi.UnpublishKind
	}
	return csi.PublishKind
}

// PluginType returns the side of the plugin the RPC goes to.
func (m Method) PluginType() PluginType {
	if m == ControllerPublish || m == ControllerUnpublish {
		return ControllerPlugin
	}
	return NodePlugin
}

// Step is one RPC of a claim, with everything needed to send it. It holds
// the volume's secrets: never log a Step with %#v or as a struct; String
// leaves them out.
type Step struct {
	Method Method
	Plugin string
	// Volume and Alloc name the claim (for logs and to match results).
	Volume string
	Alloc  string
	// Usage is the claim's usage (selects the staging).
	Usage string

	ExternalID     string
	NodeID         string
	Capability     csi.VolumeCapability
	Readonly       bool
	StagingPath    string
	TargetPath     string
	PublishContext map[string]string
	VolumeContext  map[string]string
	Secrets        map[string]string
	// SecretsFrom, when set, is where Secrets are read just before the
	// RPC (see internal/secretfile).
	SecretsFrom string
	// MountGroup is the claim's mount group (a decimal gid), empty for
	// none: the runner passes it as volume_mount_group when the node
	// plugin has VOLUME_MOUNT_GROUP, else applies it to the published
	// target itself (ApplyGroup).
	MountGroup string
}

// String names the RPC, the volume and the allocation; it never shows
// secrets or mount flags.
func (s Step) String() string {
	return fmt.Sprintf("%s volume=%s alloc=%s", s.Method, s.Volume, s.Alloc)
}

// GoString is String, so that %#v cannot print secrets.
func (s Step) GoString() string { return "claim.Step{" + s.String() + "}" }

// Result is the outcome of running a Step (or any plugin call through a
// Runner).
type Result struct {
	// Err is the error of the call, nil on success. For an unpublish-type
	// RPC that answered NotFound, Err is kept but Outcome is Success.
	Err error
	// Outcome is csi.Classify of Err for the call's kind.
	Outcome csi.Outcome
	// Unavailable is true when no client could be had: nothing was sent.
	Unavailable bool
	// PublishContext is ControllerPublishVolume's answer.
	PublishContext map[string]string
	// Unmounted is set when the plugin's NodeUnpublishVolume or
	// NodeUnstageVolume failed on a dead mount, which the agent then
	// unmounted itself before asking again: the probe's cause (ENOTCONN,
	// EIO, ESTALE, timeout).
	Unmounted string
}

// OK reports whether the call succeeded (Outcome is Success).
func (r Result) OK() bool { return r.Outcome == csi.Success }

type stepKey struct{}

// WithStep returns ctx carrying s. The Runner sends every claim step's
// Plugins.Client call with it, so that a Plugins implementation can tell
// which step a client is for (the runtime, in cluster mode, sends
// ControllerPublishVolume and ControllerUnpublishVolume to another host's
// controller when this host has none).
func WithStep(ctx context.Context, s Step) context.Context {
	return context.WithValue(ctx, stepKey{}, s)
}

// StepFrom returns the step ctx carries (see WithStep).
func StepFrom(ctx context.Context) (Step, bool) {
	s, ok := ctx.Value(stepKey{}).(Step)
	return s, ok
}
