package csi

import (
	"context"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/protobuf/proto"
)

// Client is the set of CSI RPCs csiactor uses on one plugin socket. Every
// method applies the client's timeout (ProbeTimeout for Probe, RPCTimeout
// for the others) on top of ctx. Errors are gRPC status errors from the
// plugin, wrapped with the method name; use [Classify] on them.
//
// A Client is safe for concurrent use. Close releases the connection; calls
// after Close fail with ErrClosed.
type Client interface {
	// Probe asks the plugin whether it is ready. A response with ready unset
	// counts as ready; ready=false means the plugin is still starting.
	Probe(ctx context.Context) (ready bool, err error)
	// PluginInfo calls GetPluginInfo.
	PluginInfo(ctx context.Context) (PluginInfo, error)
	// PluginCapabilities calls GetPluginCapabilities.
	PluginCapabilities(ctx context.Context) (PluginCapabilities, error)

	// ControllerCapabilities calls ControllerGetCapabilities.
	ControllerCapabilities(ctx context.Context) (ControllerCapabilities, error)
	CreateVolume(ctx context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error)
	DeleteVolume(ctx context.Context, req *csipb.DeleteVolumeRequest) error
	ControllerPublishVolume(ctx context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error)
	ControllerUnpublishVolume(ctx context.Context, req *csipb.ControllerUnpublishVolumeRequest) error
	ValidateVolumeCapabilities(ctx context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error)
	// GetCapacity asks the controller how much it can provision, for the
	// topology, parameters and capabilities in req.
	GetCapacity(ctx context.Context, req *csipb.GetCapacityRequest) (*csipb.GetCapacityResponse, error)
	// ListVolumes lists the controller's volumes, one page at a time.
	ListVolumes(ctx context.Context, req *csipb.ListVolumesRequest) (*csipb.ListVolumesResponse, error)
	// CreateSnapshot takes a snapshot of a volume (idempotent by name);
	// DeleteSnapshot removes one; ListSnapshots lists them, one page at a
	// time.
	CreateSnapshot(ctx context.Context, req *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error)
	DeleteSnapshot(ctx context.Context, req *csipb.DeleteSnapshotRequest) error
	ListSnapshots(ctx context.Context, req *csipb.ListSnapshotsRequest) (*csipb.ListSnapshotsResponse, error)
	// ControllerExpandVolume grows a volume on the storage side; the answer
	// says the new capacity and whether NodeExpandVolume is needed.
	ControllerExpandVolume(ctx context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error)
	// ControllerModifyVolume changes a volume's mutable parameters on the
	// storage side (MODIFY_VOLUME, CSI 1.9+).
	ControllerModifyVolume(ctx context.Context, req *csipb.ControllerModifyVolumeRequest) (*csipb.ControllerModifyVolumeResponse, error)
	// ControllerGetVolume asks the controller about one volume (GET_VOLUME):
	// its status, with the volume's condition when the controller has
	// VOLUME_CONDITION.
	ControllerGetVolume(ctx context.Context, req *csipb.ControllerGetVolumeRequest) (VolumeHealth, error)
	// ControllerGetVolumeHealth asks the controller for the volume's
	// health (GET_VOLUME_HEALTH).
	ControllerGetVolumeHealth(ctx context.Context, req *csipb.ControllerGetVolumeHealthRequest) (VolumeCondition, error)

	// NodeCapabilities calls NodeGetCapabilities.
	NodeCapabilities(ctx context.Context) (NodeCapabilities, error)
	// NodeInfo calls NodeGetInfo.
	NodeInfo(ctx context.Context) (NodeInfo, error)
	NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) error
	NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) error
	NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) error
	NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) error
	// NodeExpandVolume grows a published volume's file system (or device)
	// on this node.
	NodeExpandVolume(ctx context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error)
	// NodeGetVolumeStats asks the node plugin how full the volume
	// published (or staged) at req's volume_path is (GET_VOLUME_STATS),
	// and its condition when the node plugin has VOLUME_CONDITION.
	NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (VolumeStats, error)
	// NodeGetVolumeHealth asks the node plugin for the volume's health
	// (GET_VOLUME_HEALTH).
	NodeGetVolumeHealth(ctx context.Context, req *csipb.NodeGetVolumeHealthRequest) (VolumeCondition, error)

	// Invoke sends one RPC by its gRPC name (Method.FullName), req and
	// resp of that method's types (Method.NewRequest, NewResponse), with
	// RPCTimeout on top of ctx, through the same logging and metrics as
	// the typed methods. The error is the plugin's status error as the
	// plugin gave it (with the request's secrets scrubbed), not wrapped,
	// or one wrapping ErrClosed. The agent's CSI proxy and `plugin call`
	// use it.
	Invoke(ctx context.Context, fullMethod string, req, resp proto.Message) error

	// State returns the gRPC connection state.
	State() connectivity.State
	// WaitForStateChange blocks until the state differs from s or ctx ends;
	// it returns false when ctx ended first.
	WaitForStateChange(ctx context.Context, s connectivity.State) bool

	// Close closes the connection. It is idempotent.
	Close() error
}

// PluginInfo is the answer to GetPluginInfo.
type PluginInfo struct {
	// Name is the plugin's own name, like "csi.example.com"; it is shown as
	// the provider.
	Name string
	// VendorVersion is the plugin's version string.
	VendorVersion string
	Manifest      map[string]string
}

// PluginCapabilities is the answer to GetPluginCapabilities.
type PluginCapabilities struct {
	// ControllerService: the plugin provides controller RPCs, and volumes
	// need them (RequiresControllerPlugin in Nomad's terms).
	ControllerService bool
	// VolumeAccessibilityConstraints: volumes may not be equally reachable
	// from all nodes.
	VolumeAccessibilityConstraints bool
	// OnlineExpansion and OfflineExpansion: the plugin can expand volumes.
	OnlineExpansion  bool
	OfflineExpansion bool
}

// ControllerCapabilities is the answer to ControllerGetCapabilities.
type ControllerCapabilities struct {
	CreateDeleteVolume     bool
	PublishUnpublishVolume bool
	ListVolumes            bool
	GetCapacity            bool
	PublishReadonly        bool
	ExpandVolume           bool
	GetVolume              bool
	SingleNodeMultiWriter  bool
	// VolumeCondition: ControllerGetVolume (GET_VOLUME) reports the
	// volume's condition (spec before v1.13). GetVolumeHealth:
	// ControllerGetVolumeHealth does (spec v1.13, alpha).
	VolumeCondition bool
	GetVolumeHealth bool
	// CreateDeleteSnapshot, ListSnapshots and CloneVolume: the controller
	// takes snapshots, lists them, and creates a volume from another.
	CreateDeleteSnapshot bool
	ListSnapshots        bool
	CloneVolume          bool
	// ModifyVolume: the controller changes a volume's mutable parameters
	// (MODIFY_VOLUME, ControllerModifyVolume).
	ModifyVolume bool
}

// NodeCapabilities is the answer to NodeGetCapabilities.
type NodeCapabilities struct {
	StageUnstageVolume    bool
	GetVolumeStats        bool
	ExpandVolume          bool
	SingleNodeMultiWriter bool
	VolumeMountGroup      bool
	// VolumeCondition: NodeGetVolumeStats reports the volume's condition
	// (spec before v1.13). GetVolumeHealth: NodeGetVolumeHealth does
	// (spec v1.13, alpha).
	VolumeCondition bool
	GetVolumeHealth bool
}

// NodeInfo is the answer to NodeGetInfo.
type NodeInfo struct {
	NodeID            string
	MaxVolumesPerNode int64
	// AccessibleTopology is the segments of the node's topology, if any.
	AccessibleTopology map[string]string
}

// RPCKind says which column of the classification table an RPC uses.
type RPCKind int

const (
	// PublishKind is for RPCs that create or attach: CreateVolume,
	// ControllerPublishVolume, NodeStageVolume, NodePublishVolume, and
	// those that change a volume: ControllerExpandVolume,
	// ControllerModifyVolume, NodeExpandVolume, CreateSnapshot.
	PublishKind RPCKind = iota + 1
	// UnpublishKind is for RPCs that remove or detach: DeleteVolume,
	// ControllerUnpublishVolume, NodeUnstageVolume, NodeUnpublishVolume,
	// DeleteSnapshot.
	UnpublishKind
)

// Outcome is what a caller should do with an RPC's result.
type Outcome int

const (
	// Success: the RPC did what was asked (or, for unpublish-type RPCs,
	// the thing was already gone).
	Success Outcome = iota
	// Retry: a transient failure; try again after a backoff.
	Retry
	// Uncertain: the plugin may or may not have done it (deadline,
	// cancellation, unavailable). Retry with backoff; if the caller gives
	// up, it must still run teardown.
	Uncertain
	// Final: do not retry; the request itself is wrong or refused.
	Final
)
