package csi

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/protobuf/proto"
)

// client is the Client returned by Dial: one gRPC connection and the three
// CSI service stubs on it.
type client struct {
	cc         *grpc.ClientConn
	identity   csipb.IdentityClient
	controller csipb.ControllerClient
	node       csipb.NodeClient
	path       string
	opts       options
	deadlines  *deadlines

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var _ Client = (*client)(nil)

func newClient(cc *grpc.ClientConn, path string, o options) *client {
	return &client{
		cc:         cc,
		identity:   csipb.NewIdentityClient(cc),
		controller: csipb.NewControllerClient(cc),
		node:       csipb.NewNodeClient(cc),
		path:       path,
		opts:       o,
		deadlines:  newDeadlines(),
	}
}

// invoke runs one RPC with the given timeout on top of ctx and wraps its
// error with the method name.
func invoke[Req, Resp any](ctx context.Context, c *client, method string, timeout time.Duration, req Req,
	call func(context.Context, Req, ...grpc.CallOption) (Resp, error),
) (Resp, error) {
	var zero Resp
	if c.closed.Load() {
		return zero, fmt.Errorf("%s: %w", method, ErrClosed)
	}
	ctx, done := c.deadlines.start(ctx, timeout)
	defer done()
	resp, err := call(ctx, req)
	if err != nil {
		if c.closed.Load() {
			return zero, fmt.Errorf("%s: %w", method, ErrClosed)
		}
		return zero, fmt.Errorf("%s: %w", method, err)
	}
	return resp, nil
}

// invalid is the error for a plugin answer that breaks the spec.
func invalid(method, what string) error {
	return fmt.Errorf("%s: %w: %s", method, ErrInvalidResponse, what)
}

func (c *client) Probe(ctx context.Context) (bool, error) {
	resp, err := invoke(ctx, c, "Probe", c.opts.probeTimeout, &csipb.ProbeRequest{}, c.identity.Probe)
	if err != nil {
		return false, err
	}
	if r := resp.GetReady(); r != nil {
		return r.GetValue(), nil
	}
	return true, nil // ready unset counts as ready (CSI spec)
}

func (c *client) PluginInfo(ctx context.Context) (PluginInfo, error) {
	resp, err := invoke(ctx, c, "GetPluginInfo", c.opts.rpcTimeout, &csipb.GetPluginInfoRequest{}, c.identity.GetPluginInfo)
	if err != nil {
		return PluginInfo{}, err
	}
	switch {
	case resp.GetName() == "":
		return PluginInfo{}, invalid("GetPluginInfo", "name is empty")
	case resp.GetVendorVersion() == "":
		return PluginInfo{}, invalid("GetPluginInfo", "vendor_version is empty")
	}
	return PluginInfo{
		Name:          resp.GetName(),
		VendorVersion: resp.GetVendorVersion(),
		Manifest:      maps.Clone(resp.GetManifest()),
	}, nil
}

func (c *client) PluginCapabilities(ctx context.Context) (PluginCapabilities, error) {
	resp, err := invoke(ctx, c, "GetPluginCapabilities", c.opts.rpcTimeout,
		&csipb.GetPluginCapabilitiesRequest{}, c.identity.GetPluginCapabilities)
	if err != nil {
		return PluginCapabilities{}, err
	}
	var caps PluginCapabilities
	for _, pc := range resp.GetCapabilities() {
		if svc := pc.GetService(); svc != nil {
			switch svc.GetType() {
			case csipb.PluginCapability_Service_CONTROLLER_SERVICE:
				caps.ControllerService = true
			case csipb.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS:
				caps.VolumeAccessibilityConstraints = true
			}
		}
		if exp := pc.GetVolumeExpansion(); exp != nil {
			switch exp.GetType() {
			case csipb.PluginCapability_VolumeExpansion_ONLINE:
				caps.OnlineExpansion = true
			case csipb.PluginCapability_VolumeExpansion_OFFLINE:
				caps.OfflineExpansion = true
			}
		}
	}
	return caps, nil
}

func (c *client) ControllerCapabilities(ctx context.Context) (ControllerCapabilities, error) {
	resp, err := invoke(ctx, c, "ControllerGetCapabilities", c.opts.rpcTimeout,
		&csipb.ControllerGetCapabilitiesRequest{}, c.controller.ControllerGetCapabilities)
	if err != nil {
		return ControllerCapabilities{}, err
	}
	var caps ControllerCapabilities
	for _, cc := range resp.GetCapabilities() {
		switch cc.GetRpc().GetType() {
		case csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME:
			caps.CreateDeleteVolume = true
		case csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME:
			caps.PublishUnpublishVolume = true
		case csipb.ControllerServiceCapability_RPC_LIST_VOLUMES:
			caps.ListVolumes = true
		case csipb.ControllerServiceCapability_RPC_GET_CAPACITY:
			caps.GetCapacity = true
		case csipb.ControllerServiceCapability_RPC_PUBLISH_READONLY:
			caps.PublishReadonly = true
		case csipb.ControllerServiceCapability_RPC_EXPAND_VOLUME:
			caps.ExpandVolume = true
		case csipb.ControllerServiceCapability_RPC_GET_VOLUME:
			caps.GetVolume = true
		case csipb.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER:
			caps.SingleNodeMultiWriter = true
		case csipb.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT:
			caps.CreateDeleteSnapshot = true
		case csipb.ControllerServiceCapability_RPC_LIST_SNAPSHOTS:
			caps.ListSnapshots = true
		case csipb.ControllerServiceCapability_RPC_CLONE_VOLUME:
			caps.CloneVolume = true
		case csipb.ControllerServiceCapability_RPC_MODIFY_VOLUME:
			caps.ModifyVolume = true
		case controllerVolumeCondition:
			caps.VolumeCondition = true
		case csipb.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH:
			caps.GetVolumeHealth = true
		}
	}
	return caps, nil
}

func (c *client) CreateVolume(ctx context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	resp, err := invoke(ctx, c, "CreateVolume", c.opts.rpcTimeout, req, c.controller.CreateVolume)
	if err != nil {
		return nil, err
	}
	switch v := resp.GetVolume(); {
	case v == nil:
		return nil, invalid("CreateVolume", "volume is missing")
	case v.GetVolumeId() == "":
		return nil, invalid("CreateVolume", "volume.volume_id is empty")
	case v.GetCapacityBytes() < 0:
		return nil, invalid("CreateVolume", fmt.Sprintf("volume.capacity_bytes is negative (%d)", v.GetCapacityBytes()))
	}
	return resp, nil
}

func (c *client) DeleteVolume(ctx context.Context, req *csipb.DeleteVolumeRequest) error {
	_, err := invoke(ctx, c, "DeleteVolume", c.opts.rpcTimeout, req, c.controller.DeleteVolume)
	return err
}

func (c *client) ControllerPublishVolume(ctx context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	return invoke(ctx, c, "ControllerPublishVolume", c.opts.rpcTimeout, req, c.controller.ControllerPublishVolume)
}

func (c *client) ControllerUnpublishVolume(ctx context.Context, req *csipb.ControllerUnpublishVolumeRequest) error {
	_, err := invoke(ctx, c, "ControllerUnpublishVolume", c.opts.rpcTimeout, req, c.controller.ControllerUnpublishVolume)
	return err
}

func (c *client) ValidateVolumeCapabilities(ctx context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	return invoke(ctx, c, "ValidateVolumeCapabilities", c.opts.rpcTimeout, req, c.controller.ValidateVolumeCapabilities)
}

func (c *client) GetCapacity(ctx context.Context, req *csipb.GetCapacityRequest) (*csipb.GetCapacityResponse, error) {
	return invoke(ctx, c, "GetCapacity", c.opts.rpcTimeout, req, c.controller.GetCapacity)
}

func (c *client) ListVolumes(ctx context.Context, req *csipb.ListVolumesRequest) (*csipb.ListVolumesResponse, error) {
	return invoke(ctx, c, "ListVolumes", c.opts.rpcTimeout, req, c.controller.ListVolumes)
}

func (c *client) CreateSnapshot(ctx context.Context, req *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error) {
	return invoke(ctx, c, "CreateSnapshot", c.opts.rpcTimeout, req, c.controller.CreateSnapshot)
}

func (c *client) DeleteSnapshot(ctx context.Context, req *csipb.DeleteSnapshotRequest) error {
	_, err := invoke(ctx, c, "DeleteSnapshot", c.opts.rpcTimeout, req, c.controller.DeleteSnapshot)
	return err
}

func (c *client) ListSnapshots(ctx context.Context, req *csipb.ListSnapshotsRequest) (*csipb.ListSnapshotsResponse, error) {
	return invoke(ctx, c, "ListSnapshots", c.opts.rpcTimeout, req, c.controller.ListSnapshots)
}

func (c *client) ControllerExpandVolume(ctx context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error) {
	return invoke(ctx, c, "ControllerExpandVolume", c.opts.rpcTimeout, req, c.controller.ControllerExpandVolume)
}

func (c *client) ControllerModifyVolume(ctx context.Context, req *csipb.ControllerModifyVolumeRequest) (*csipb.ControllerModifyVolumeResponse, error) {
	return invoke(ctx, c, "ControllerModifyVolume", c.opts.rpcTimeout, req, c.controller.ControllerModifyVolume)
}

func (c *client) NodeCapabilities(ctx context.Context) (NodeCapabilities, error) {
	resp, err := invoke(ctx, c, "NodeGetCapabilities", c.opts.rpcTimeout,
		&csipb.NodeGetCapabilitiesRequest{}, c.node.NodeGetCapabilities)
	if err != nil {
		return NodeCapabilities{}, err
	}
	var caps NodeCapabilities
	for _, nc := range resp.GetCapabilities() {
		switch nc.GetRpc().GetType() {
		case csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME:
			caps.StageUnstageVolume = true
		case csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS:
			caps.GetVolumeStats = true
		case csipb.NodeServiceCapability_RPC_EXPAND_VOLUME:
			caps.ExpandVolume = true
		case csipb.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER:
			caps.SingleNodeMultiWriter = true
		case csipb.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP:
			caps.VolumeMountGroup = true
		case nodeVolumeCondition:
			caps.VolumeCondition = true
		case csipb.NodeServiceCapability_RPC_GET_VOLUME_HEALTH:
			caps.GetVolumeHealth = true
		}
	}
	return caps, nil
}

func (c *client) NodeInfo(ctx context.Context) (NodeInfo, error) {
	resp, err := invoke(ctx, c, "NodeGetInfo", c.opts.rpcTimeout, &csipb.NodeGetInfoRequest{}, c.node.NodeGetInfo)
	if err != nil {
		return NodeInfo{}, err
	}
	switch {
	case resp.GetNodeId() == "":
		return NodeInfo{}, invalid("NodeGetInfo", "node_id is empty")
	case resp.GetMaxVolumesPerNode() < 0:
		return NodeInfo{}, invalid("NodeGetInfo", fmt.Sprintf("max_volumes_per_node is negative (%d)", resp.GetMaxVolumesPerNode()))
	}
	return NodeInfo{
		NodeID:             resp.GetNodeId(),
		MaxVolumesPerNode:  resp.GetMaxVolumesPerNode(),
		AccessibleTopology: maps.Clone(resp.GetAccessibleTopology().GetSegments()),
	}, nil
}

func (c *client) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) error {
	_, err := invoke(ctx, c, "NodeStageVolume", c.opts.rpcTimeout, req, c.node.NodeStageVolume)
	return err
}

func (c *client) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) error {
	_, err := invoke(ctx, c, "NodeUnstageVolume", c.opts.rpcTimeout, req, c.node.NodeUnstageVolume)
	return err
}

func (c *client) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) error {
	_, err := invoke(ctx, c, "NodePublishVolume", c.opts.rpcTimeout, req, c.node.NodePublishVolume)
	return err
}

func (c *client) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) error {
	_, err := invoke(ctx, c, "NodeUnpublishVolume", c.opts.rpcTimeout, req, c.node.NodeUnpublishVolume)
	return err
}

func (c *client) NodeExpandVolume(ctx context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
	return invoke(ctx, c, "NodeExpandVolume", c.opts.rpcTimeout, req, c.node.NodeExpandVolume)
}

func (c *client) Invoke(ctx context.Context, fullMethod string, req, resp proto.Message) error {
	if c.closed.Load() {
		return fmt.Errorf("%s: %w", shortMethod(fullMethod), ErrClosed)
	}
	ctx, done := c.deadlines.start(ctx, c.opts.rpcTimeout)
	defer done()
	err := c.cc.Invoke(ctx, fullMethod, req, resp)
	if err != nil && c.closed.Load() {
		return fmt.Errorf("%s: %w", shortMethod(fullMethod), ErrClosed)
	}
	return err
}

func (c *client) State() connectivity.State { return c.cc.GetState() }

func (c *client) WaitForStateChange(ctx context.Context, s connectivity.State) bool {
	return c.cc.WaitForStateChange(ctx, s)
}

func (c *client) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		if err := c.cc.Close(); err != nil {
			c.closeErr = fmt.Errorf("close %s: %w", c.path, err)
		}
		c.deadlines.stop()
	})
	return c.closeErr
}
