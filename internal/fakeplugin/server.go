package fakeplugin

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// server implements the three CSI services on a Plugin's state. Every
// handler takes p.mu for its whole body: the fake is about semantics, not
// throughput under contention. Methods that need a capability the Config
// lacks never reach their handler (see Config.lacking).
type server struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedControllerServer
	csipb.UnimplementedNodeServer
	p *Plugin
}

// publishContextKey is the key of the publish context ControllerPublishVolume
// returns and node RPCs check.
const publishContextKey = "device"

func devicePath(volumeID string) string { return "/dev/fake/" + volumeID }

func invalidArg(field string) error {
	return status.Errorf(codes.InvalidArgument, "%s is required", field)
}

// required returns InvalidArgument for the first field whose value is
// empty. Its arguments alternate field name and value.
func required(fieldValues ...string) error {
	for i := 0; i+1 < len(fieldValues); i += 2 {
		if fieldValues[i+1] == "" {
			return invalidArg(fieldValues[i])
		}
	}
	return nil
}

// firstError returns the first of errs that is not nil. Handlers list
// their argument checks in it in the order the errors take precedence; the
// checks are cheap and have no effects, so evaluating all of them first
// changes nothing.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkCapability rejects a capability without access mode or access type.
func checkCapability(field string, vc *csipb.VolumeCapability) error {
	switch {
	case vc == nil:
		return invalidArg(field)
	case vc.GetAccessMode() == nil || vc.GetAccessMode().GetMode() == csipb.VolumeCapability_AccessMode_UNKNOWN:
		return invalidArg(field + ".access_mode")
	case vc.GetBlock() == nil && vc.GetMount() == nil:
		return invalidArg(field + ".access_type")
	}
	return nil
}

// checkCapabilities requires at least one capability and checks each.
func checkCapabilities(vcs []*csipb.VolumeCapability) error {
	if len(vcs) == 0 {
		return invalidArg("volume_capabilities")
	}
	for _, vc := range vcs {
		if err := checkCapability("volume_capabilities", vc); err != nil {
			return err
		}
	}
	return nil
}

// lockVolume is the start of every RPC on an existing volume: it returns
// the first failed argument check (see firstError), then takes p.mu and
// applies Config.StrictVolumes to id. On success the caller holds p.mu and
// must unlock it.
func (p *Plugin) lockVolume(id string, checks ...error) error {
	if err := firstError(checks...); err != nil {
		return err
	}
	p.mu.Lock()
	if err := p.knownLocked(id); err != nil {
		p.mu.Unlock()
		return err
	}
	return nil
}

// knownLocked applies Config.StrictVolumes.
func (p *Plugin) knownLocked(volumeID string) error {
	if !p.cfg.StrictVolumes {
		return nil
	}
	if _, ok := p.volumes[volumeID]; !ok {
		return status.Errorf(codes.NotFound, "volume %q does not exist", volumeID)
	}
	return nil
}

// checkPublishContextLocked requires the publish context of
// ControllerPublishVolume when the plugin has PUBLISH_UNPUBLISH.
func (p *Plugin) checkPublishContextLocked(volumeID string, pc map[string]string) error {
	if !p.cfg.ControllerPublish {
		return nil
	}
	if pc[publishContextKey] != devicePath(volumeID) {
		return status.Errorf(codes.FailedPrecondition,
			"volume %q: publish_context lacks %q from ControllerPublishVolume", volumeID, publishContextKey)
	}
	return nil
}

// pluginService, controllerRPC and nodeRPC build one capability of a
// GetPluginCapabilities, ControllerGetCapabilities or NodeGetCapabilities
// answer.
func pluginService(t csipb.PluginCapability_Service_Type) *csipb.PluginCapability {
	return &csipb.PluginCapability{Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{Type: t}}}
}

func controllerRPC(t csipb.ControllerServiceCapability_RPC_Type) *csipb.ControllerServiceCapability {
	return &csipb.ControllerServiceCapability{Type: &csipb.ControllerServiceCapability_Rpc{Rpc: &csipb.ControllerServiceCapability_RPC{Type: t}}}
}

func nodeRPC(t csipb.NodeServiceCapability_RPC_Type) *csipb.NodeServiceCapability {
	return &csipb.NodeServiceCapability{Type: &csipb.NodeServiceCapability_Rpc{Rpc: &csipb.NodeServiceCapability_RPC{Type: t}}}
}

// Identity service.

func (s *server) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{
		Name:          s.p.cfg.Name,
		VendorVersion: s.p.cfg.VendorVersion,
		Manifest:      map[string]string{"fake": "true"},
	}, nil
}

func (s *server) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	resp := &csipb.GetPluginCapabilitiesResponse{}
	if s.p.cfg.Controller {
		resp.Capabilities = append(resp.Capabilities, pluginService(csipb.PluginCapability_Service_CONTROLLER_SERVICE))
	}
	if len(s.p.cfg.Topology) > 0 {
		resp.Capabilities = append(resp.Capabilities, pluginService(csipb.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS))
	}
	if s.p.cfg.ControllerExpand || s.p.cfg.NodeExpand {
		t := csipb.PluginCapability_VolumeExpansion_ONLINE
		if s.p.cfg.OfflineExpansion {
			t = csipb.PluginCapability_VolumeExpansion_OFFLINE
		}
		resp.Capabilities = append(resp.Capabilities, &csipb.PluginCapability{
			Type: &csipb.PluginCapability_VolumeExpansion_{VolumeExpansion: &csipb.PluginCapability_VolumeExpansion{Type: t}},
		})
	}
	return resp, nil
}

func (s *server) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	if s.p.cfg.OmitReady {
		return &csipb.ProbeResponse{}, nil
	}
	s.p.mu.Lock()
	ready := s.p.ready
	s.p.mu.Unlock()
	return &csipb.ProbeResponse{Ready: wrapperspb.Bool(ready)}, nil
}

// Controller service.

func (s *server) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	resp := &csipb.ControllerGetCapabilitiesResponse{}
	if s.p.cfg.CreateDelete {
		resp.Capabilities = append(resp.Capabilities, controllerRPC(csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME))
	}
	if s.p.cfg.ControllerPublish {
		resp.Capabilities = append(resp.Capabilities, controllerRPC(csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME))
	}
	if s.p.cfg.ControllerExpand {
		resp.Capabilities = append(resp.Capabilities, controllerRPC(csipb.ControllerServiceCapability_RPC_EXPAND_VOLUME))
	}
	if s.p.cfg.ControllerModify {
		resp.Capabilities = append(resp.Capabilities, controllerRPC(csipb.ControllerServiceCapability_RPC_MODIFY_VOLUME))
	}
	if s.p.cfg.GetCapacity {
		resp.Capabilities = append(resp.Capabilities, controllerRPC(csipb.ControllerServiceCapability_RPC_GET_CAPACITY))
	}
	if s.p.cfg.ListVolumes {
		resp.Capabilities = append(resp.Capabilities, controllerRPC(csipb.ControllerServiceCapability_RPC_LIST_VOLUMES))
	}
	resp.Capabilities = append(resp.Capabilities, s.p.cfg.controllerHealthCaps()...)
	if s.p.cfg.Clone {
		resp.Capabilities = append(resp.Capabilities, controllerRPC(csipb.ControllerServiceCapability_RPC_CLONE_VOLUME))
	}
	if s.p.cfg.Snapshots {
		resp.Capabilities = append(resp.Capabilities,
			controllerRPC(csipb.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT),
			controllerRPC(csipb.ControllerServiceCapability_RPC_LIST_SNAPSHOTS))
	}
	return resp, nil
}

func (s *server) CreateVolume(_ context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	if err := firstError(required("name", req.GetName()), checkCapabilities(req.GetVolumeCapabilities())); err != nil {
		return nil, err
	}
	size := req.GetCapacityRange().GetRequiredBytes()
	limit := req.GetCapacityRange().GetLimitBytes()
	if size < 0 || limit < 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity_range must not be negative")
	}
	if size == 0 {
		size = DefaultCapacity
		if limit > 0 && limit < size {
			size = limit
		}
	}
	if limit > 0 && limit < size {
		return nil, status.Errorf(codes.OutOfRange, "limit_bytes %d is below required_bytes %d", limit, size)
	}
	id := "vol-" + req.GetName()

	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkContentSourceLocked(req.GetVolumeContentSource()); err != nil {
		return nil, err
	}
	if v, ok := p.volumes[id]; ok {
		if v.CapacityBytes != size {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with capacity %d", req.GetName(), v.CapacityBytes)
		}
	} else {
		src := req.GetVolumeContentSource()
		p.volumes[id] = &Volume{ID: id, Name: req.GetName(), CapacityBytes: size, Parameters: maps.Clone(req.GetParameters()),
			Source: src.GetSnapshot().GetSnapshotId() + src.GetVolume().GetVolumeId()}
	}
	vol := &csipb.Volume{
		VolumeId:      id,
		CapacityBytes: size,
		VolumeContext: map[string]string{"name": req.GetName()},
	}
	if len(p.cfg.Topology) > 0 {
		// Where it was asked for (the first preferred, else the first
		// requisite topology), else this node's topology.
		t := p.cfg.Topology
		if ar := req.GetAccessibilityRequirements(); len(ar.GetPreferred()) > 0 {
			t = ar.GetPreferred()[0].GetSegments()
		} else if len(ar.GetRequisite()) > 0 {
			t = ar.GetRequisite()[0].GetSegments()
		}
		vol.AccessibleTopology = []*csipb.Topology{{Segments: maps.Clone(t)}}
	}
	return &csipb.CreateVolumeResponse{Volume: vol}, nil
}

func (s *server) DeleteVolume(_ context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := required("volume_id", id); err != nil {
		return nil, err
	}
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.ctrl[id]; ok {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is still controller-published", id)
	}
	if err := p.inUseOnNodeLocked(id); err != nil {
		return nil, err
	}
	delete(p.volumes, id) // deleting an unknown volume is OK (spec)
	return &csipb.DeleteVolumeResponse{}, nil
}

// inUseOnNodeLocked fails when the volume is staged or published on this
// node.
func (p *Plugin) inUseOnNodeLocked(id string) error {
	if _, ok := p.staged[id]; ok {
		return status.Errorf(codes.FailedPrecondition, "volume %q is still staged on node %q", id, p.cfg.NodeID)
	}
	if len(p.pubs[id]) > 0 {
		return status.Errorf(codes.FailedPrecondition, "volume %q is still published on node %q", id, p.cfg.NodeID)
	}
	return nil
}

func (s *server) ControllerPublishVolume(_ context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	p, id := s.p, req.GetVolumeId()
	if err := p.lockVolume(id,
		required("volume_id", id, "node_id", req.GetNodeId()),
		checkCapability("volume_capability", req.GetVolumeCapability()),
	); err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	if c, ok := p.ctrl[id]; ok {
		if c.node != req.GetNodeId() {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q is published to another node", id)
		}
		if c.readonly != req.GetReadonly() || !proto.Equal(c.cap, req.GetVolumeCapability()) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q is published to node %q with another capability or readonly flag", id, c.node)
		}
	} else {
		p.ctrl[id] = ctrlPub{node: req.GetNodeId(), readonly: req.GetReadonly(), cap: req.GetVolumeCapability()}
	}
	return &csipb.ControllerPublishVolumeResponse{
		PublishContext: map[string]string{publishContextKey: devicePath(id)},
	}, nil
}

func (s *server) ControllerUnpublishVolume(_ context.Context, req *csipb.ControllerUnpublishVolumeRequest) (*csipb.ControllerUnpublishVolumeResponse, error) {
	p, id := s.p, req.GetVolumeId()
	if err := p.lockVolume(id, required("volume_id", id)); err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	c, ok := p.ctrl[id]
	if !ok || (req.GetNodeId() != "" && req.GetNodeId() != c.node) {
		return &csipb.ControllerUnpublishVolumeResponse{}, nil // already unpublished from that node
	}
	if c.node == p.cfg.NodeID {
		if err := p.inUseOnNodeLocked(id); err != nil {
			return nil, err
		}
	}
	delete(p.ctrl, id)
	return &csipb.ControllerUnpublishVolumeResponse{}, nil
}

func (s *server) ValidateVolumeCapabilities(_ context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	p := s.p
	if err := p.lockVolume(req.GetVolumeId(),
		required("volume_id", req.GetVolumeId()),
		checkCapabilities(req.GetVolumeCapabilities()),
	); err != nil {
		return nil, err
	}
	p.mu.Unlock()
	return &csipb.ValidateVolumeCapabilitiesResponse{Confirmed: &csipb.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// Node service.

func (s *server) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	resp := &csipb.NodeGetCapabilitiesResponse{}
	if s.p.cfg.StageUnstage {
		resp.Capabilities = append(resp.Capabilities, nodeRPC(csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME))
	}
	if s.p.cfg.NodeExpand {
		resp.Capabilities = append(resp.Capabilities, nodeRPC(csipb.NodeServiceCapability_RPC_EXPAND_VOLUME))
	}
	if s.p.cfg.VolumeMountGroup {
		resp.Capabilities = append(resp.Capabilities, nodeRPC(csipb.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP))
	}
	resp.Capabilities = append(resp.Capabilities, s.p.cfg.nodeHealthCaps()...)
	return resp, nil
}

func (s *server) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	resp := &csipb.NodeGetInfoResponse{
		NodeId: s.p.cfg.NodeID,
	}
	s.p.mu.Lock()
	resp.MaxVolumesPerNode = s.p.maxVols
	s.p.mu.Unlock()
	if len(s.p.cfg.Topology) > 0 {
		resp.AccessibleTopology = &csipb.Topology{Segments: maps.Clone(s.p.cfg.Topology)}
	}
	return resp, nil
}

func (s *server) NodeStageVolume(_ context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	p, id, path := s.p, req.GetVolumeId(), req.GetStagingTargetPath()
	if err := p.lockVolume(id,
		required("volume_id", id, "staging_target_path", path),
		checkCapability("volume_capability", req.GetVolumeCapability()),
	); err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	if err := p.checkPublishContextLocked(id, req.GetPublishContext()); err != nil {
		return nil, err
	}
	if p.cfg.CheckPaths {
		if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
			return nil, status.Errorf(codes.FailedPrecondition, "staging_target_path %q is not an existing directory", path)
		}
	}
	if st, ok := p.staged[id]; ok {
		if st.path != path {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q is staged at another path", id)
		}
		if !proto.Equal(st.cap, req.GetVolumeCapability()) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q is staged with another capability", id)
		}
		return &csipb.NodeStageVolumeResponse{}, nil
	}
	p.staged[id] = stage{path: path, cap: req.GetVolumeCapability()}
	return &csipb.NodeStageVolumeResponse{}, nil
}

func (s *server) NodeUnstageVolume(_ context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	p, id, path := s.p, req.GetVolumeId(), req.GetStagingTargetPath()
	if err := p.lockVolume(id, required("volume_id", id, "staging_target_path", path)); err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	st, ok := p.staged[id]
	if !ok || st.path != path {
		return &csipb.NodeUnstageVolumeResponse{}, nil // not staged there: done
	}
	if n := len(p.pubs[id]); n > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is still published at %d target path(s)", id, n)
	}
	delete(p.staged, id)
	return &csipb.NodeUnstageVolumeResponse{}, nil
}

func (s *server) NodePublishVolume(_ context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	p, id, target, vc := s.p, req.GetVolumeId(), req.GetTargetPath(), req.GetVolumeCapability()
	if err := p.lockVolume(id,
		required("volume_id", id, "target_path", target),
		checkCapability("volume_capability", vc),
	); err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	if p.cfg.StageUnstage {
		if req.GetStagingTargetPath() == "" {
			return nil, status.Error(codes.FailedPrecondition, "staging_target_path is required: the plugin has STAGE_UNSTAGE_VOLUME")
		}
		if st, ok := p.staged[id]; !ok || st.path != req.GetStagingTargetPath() {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q is not staged at staging_target_path", id)
		}
	} else if err := p.checkPublishContextLocked(id, req.GetPublishContext()); err != nil {
		return nil, err
	}
	for other, targets := range p.pubs {
		if _, ok := targets[target]; ok && other != id {
			return nil, status.Errorf(codes.AlreadyExists, "target_path is in use by volume %q", other)
		}
	}
	if pb, ok := p.pubs[id][target]; ok {
		if pb.readonly != req.GetReadonly() || !proto.Equal(pb.cap, vc) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q is published at target_path with another capability or readonly flag", id)
		}
		return &csipb.NodePublishVolumeResponse{}, nil
	}
	if err := makeTarget(target, vc.GetBlock() != nil, p.cfg.CheckPaths); err != nil {
		return nil, err
	}
	if p.pubs[id] == nil {
		p.pubs[id] = map[string]pub{}
	}
	p.pubs[id][target] = pub{readonly: req.GetReadonly(), cap: vc}
	return &csipb.NodePublishVolumeResponse{}, nil
}

// makeTarget creates the target path: a directory for a mount, an empty
// file for a block device. With checkParent the parent must exist.
func makeTarget(target string, block, checkParent bool) error {
	parent := filepath.Dir(target)
	if checkParent {
		if fi, err := os.Stat(parent); err != nil || !fi.IsDir() {
			return status.Errorf(codes.FailedPrecondition, "parent of target_path %q is not an existing directory", target)
		}
	} else if err := os.MkdirAll(parent, 0o750); err != nil {
		return status.Errorf(codes.Internal, "create parent of target_path: %s", err)
	}
	if block {
		f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return status.Errorf(codes.Internal, "create target_path: %s", err)
		}
		_ = f.Close()
		return nil
	}
	if err := os.Mkdir(target, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
		return status.Errorf(codes.Internal, "create target_path: %s", err)
	}
	return nil
}

func (s *server) NodeUnpublishVolume(_ context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	p, id, target := s.p, req.GetVolumeId(), req.GetTargetPath()
	if err := p.lockVolume(id, required("volume_id", id, "target_path", target)); err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	if _, ok := p.pubs[id][target]; !ok {
		return &csipb.NodeUnpublishVolumeResponse{}, nil // not published there: done
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "remove target_path: %s", err)
	}
	delete(p.pubs[id], target)
	if len(p.pubs[id]) == 0 {
		delete(p.pubs, id)
	}
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// ControllerExpandVolume grows a volume the plugin knows (any volume without
// StrictVolumes: an unknown one is added). A required size below the
// volume's answers the current size, as the spec allows.
func (s *server) ControllerExpandVolume(_ context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error) {
	p, id := s.p, req.GetVolumeId()
	size := req.GetCapacityRange().GetRequiredBytes()
	var rangeErr error
	switch limit := req.GetCapacityRange().GetLimitBytes(); {
	case req.GetCapacityRange() == nil:
		rangeErr = invalidArg("capacity_range")
	case size <= 0:
		rangeErr = status.Error(codes.InvalidArgument, "capacity_range.required_bytes must be positive")
	case limit > 0 && limit < size:
		rangeErr = status.Errorf(codes.OutOfRange, "limit_bytes %d is below required_bytes %d", limit, size)
	}
	if err := p.lockVolume(id, required("volume_id", id), rangeErr); err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	v := p.volumes[id]
	if v == nil {
		v = &Volume{ID: id, CapacityBytes: size}
		p.volumes[id] = v
	}
	v.CapacityBytes = max(v.CapacityBytes, size)
	return &csipb.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes, NodeExpansionRequired: p.cfg.NodeExpansionRequired}, nil
}

// ControllerModifyVolume merges mutable_parameters into a volume's (any
// volume without StrictVolumes: an unknown one is added); a name not in
// Config.AcceptedMutableParameters is InvalidArgument naming it, and
// nothing changes.
func (s *server) ControllerModifyVolume(_ context.Context, req *csipb.ControllerModifyVolumeRequest) (*csipb.ControllerModifyVolumeResponse, error) {
	p, id := s.p, req.GetVolumeId()
	var paramErr error
	if len(req.GetMutableParameters()) == 0 {
		paramErr = invalidArg("mutable_parameters")
	}
	for _, k := range slices.Sorted(maps.Keys(req.GetMutableParameters())) {
		if paramErr == nil && !slices.Contains(p.cfg.AcceptedMutableParameters, k) {
			paramErr = status.Errorf(codes.InvalidArgument, "mutable parameter %q is not supported", k)
		}
	}
	if err := p.lockVolume(id, required("volume_id", id), paramErr); err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	v := p.volumes[id]
	if v == nil {
		v = &Volume{ID: id}
		p.volumes[id] = v
	}
	if v.MutableParameters == nil {
		v.MutableParameters = map[string]string{}
	}
	maps.Copy(v.MutableParameters, req.GetMutableParameters())
	return &csipb.ControllerModifyVolumeResponse{}, nil
}

// NodeExpandVolume records the expansion of a volume published at
// volume_path; a path where it is not published is NotFound.
func (s *server) NodeExpandVolume(_ context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
	p, id, path := s.p, req.GetVolumeId(), req.GetVolumePath()
	if err := p.lockVolume(id, required("volume_id", id, "volume_path", path)); err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	if _, ok := p.pubs[id][path]; !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q is not published at %q", id, path)
	}
	size := req.GetCapacityRange().GetRequiredBytes()
	p.grown[path] = size
	return &csipb.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

// GetCapacity answers Config.Capacity less the capacity of every volume,
// whatever the topology asked for.
func (s *server) GetCapacity(_ context.Context, _ *csipb.GetCapacityRequest) (*csipb.GetCapacityResponse, error) {
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	avail := p.cfg.Capacity
	for _, v := range p.volumes {
		avail -= v.CapacityBytes
	}
	return &csipb.GetCapacityResponse{AvailableCapacity: max(avail, 0), MaximumVolumeSize: wrapperspb.Int64(max(avail, 0))}, nil
}

// ListVolumes pages through the volumes in ID order; the token is the ID
// to start at. An unknown token is Aborted, as the spec asks.
func (s *server) ListVolumes(_ context.Context, req *csipb.ListVolumesRequest) (*csipb.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := slices.Sorted(maps.Keys(p.volumes))
	start := 0
	if tok := req.GetStartingToken(); tok != "" {
		i, found := slices.BinarySearch(ids, tok)
		if !found {
			return nil, status.Errorf(codes.Aborted, "starting_token %q is not a volume", tok)
		}
		start = i
	}
	end := len(ids)
	if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
		end = start + m
	}
	resp := &csipb.ListVolumesResponse{}
	for _, id := range ids[start:end] {
		v := p.volumes[id]
		resp.Entries = append(resp.Entries, &csipb.ListVolumesResponse_Entry{Volume: &csipb.Volume{VolumeId: v.ID, CapacityBytes: v.CapacityBytes}})
	}
	if end < len(ids) {
		resp.NextToken = ids[end]
	}
	return resp, nil
}
