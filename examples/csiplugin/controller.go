package csiplugin

import (
	"context"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Publish context keys returned by ControllerPublishVolume.
const (
	PublishContextNodeID   = "node_id"
	PublishContextReadonly = "readonly"
)

// controllerServer is the CSI Controller service. A volume is a directory
// StateDir/volumes/<id>; its capacity is recorded, not enforced.
type controllerServer struct {
	csipb.UnimplementedControllerServer
	p *Plugin
}

func (s *controllerServer) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	var caps []*csipb.ControllerServiceCapability
	for _, t := range []csipb.ControllerServiceCapability_RPC_Type{
		csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csipb.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csipb.ControllerServiceCapability_RPC_GET_CAPACITY,
		csipb.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csipb.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csipb.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csipb.ControllerServiceCapability_RPC_PUBLISH_READONLY,
		csipb.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csipb.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csipb.ControllerServiceCapability_RPC_MODIFY_VOLUME,
	} {
		caps = append(caps, &csipb.ControllerServiceCapability{
			Type: &csipb.ControllerServiceCapability_Rpc{Rpc: &csipb.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// CreateVolume creates the volume directory. The id is derived from the
// name, so a retry after a crash finds the same directory. A second call
// with the same name returns the volume when capacity and parameters are
// compatible, AlreadyExists otherwise.
func (s *controllerServer) CreateVolume(_ context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities is required")
	}
	for i, vc := range req.GetVolumeCapabilities() {
		if _, err := checkCapability("volume_capabilities["+strconv.Itoa(i)+"]", vc); err != nil {
			return nil, err
		}
	}
	if err := s.p.checkMutable(req.GetMutableParameters()); err != nil {
		return nil, err
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if required < 0 || limit < 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity_range: bytes must not be negative")
	}
	if limit > 0 && limit < required {
		return nil, status.Errorf(codes.OutOfRange, "capacity_range: limit_bytes %d is below required_bytes %d", limit, required)
	}
	capacity := required
	if capacity == 0 {
		capacity = limit
	}
	if err := s.p.checkZone(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}

	p := s.p
	p.lockState()
	defer p.unlockState()
	id := volumeIDFor(req.GetName())
	if v, ok := p.st.Volumes[id]; ok {
		switch {
		case v.Name != req.GetName():
			return nil, status.Errorf(codes.AlreadyExists, "volume id %s is taken by another name", id)
		case v.CapacityBytes < required || (limit > 0 && v.CapacityBytes > limit):
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with capacity %d bytes, outside the requested range", req.GetName(), v.CapacityBytes)
		case !maps.Equal(v.Parameters, req.GetParameters()):
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with different parameters", req.GetName())
		case !sameSource(v.Source, req.GetVolumeContentSource()):
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with another content source", req.GetName())
		}
		return &csipb.CreateVolumeResponse{Volume: v.csi()}, nil
	}
	source, from, size, err := p.contentOfLocked(req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}
	if limit > 0 && size > limit {
		return nil, status.Errorf(codes.OutOfRange, "the content source holds %d bytes, above limit_bytes %d", size, limit)
	}
	capacity = max(capacity, size)

	// A directory without a state entry is left from a create or delete
	// that died half-way; nobody was told about it, so start afresh.
	dir := p.volDir(id)
	if err := os.RemoveAll(dir); err != nil {
		return nil, status.Errorf(codes.Internal, "clear volume directory: %s", err.Error())
	}
	if from != "" {
		if err := copyFresh(from, dir); err != nil {
			return nil, status.Errorf(codes.Internal, "copy the content source: %s", err.Error())
		}
	} else if err := os.Mkdir(dir, 0o777); err != nil {
		return nil, status.Errorf(codes.Internal, "create volume directory: %s", err.Error())
	}
	// The mode is set explicitly so the process umask does not narrow it:
	// workloads of any uid may write into a published volume.
	if err := os.Chmod(dir, 0o777); err != nil {
		return nil, status.Errorf(codes.Internal, "create volume directory: %s", err.Error())
	}
	v := &volume{ID: id, Name: req.GetName(), CapacityBytes: capacity, Zone: p.cfg.Zone, Source: source}
	if len(req.GetParameters()) > 0 {
		v.Parameters = maps.Clone(req.GetParameters())
	}
	if len(req.GetMutableParameters()) > 0 {
		v.MutableParameters = maps.Clone(req.GetMutableParameters())
	}
	p.st.Volumes[id] = v
	if err := p.saveLocked(); err != nil {
		delete(p.st.Volumes, id)
		os.RemoveAll(dir)
		return nil, err
	}
	p.log.WithField("volume", id).Info("volume created")
	return &csipb.CreateVolumeResponse{Volume: v.csi()}, nil
}

// DeleteVolume removes the volume and its data. An unknown id succeeds; a
// volume still published or staged anywhere is FailedPrecondition.
func (s *controllerServer) DeleteVolume(_ context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	p := s.p
	p.lockState()
	defer p.unlockState()
	v, err := p.volumeLocked(req.GetVolumeId())
	if err != nil {
		return &csipb.DeleteVolumeResponse{}, nil // already gone
	}
	if v.inUse() {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is in use (%d node publications, %d stagings, %d targets)",
			v.ID, len(v.Published), len(v.Staged), len(v.Targets))
	}
	// Data first, then the record: a crash in between leaves a record whose
	// retried delete finishes the job, never a record of a half-empty volume
	// that a new CreateVolume would hand out.
	if err := os.RemoveAll(p.volDir(v.ID)); err != nil {
		return nil, status.Errorf(codes.Internal, "remove volume directory: %s", err.Error())
	}
	delete(p.st.Volumes, v.ID)
	if err := p.saveLocked(); err != nil {
		p.st.Volumes[v.ID] = v
		return nil, err
	}
	p.log.WithField("volume", v.ID).Info("volume deleted")
	return &csipb.DeleteVolumeResponse{}, nil
}

// ControllerPublishVolume records that the volume is published to the
// node. This plugin knows one node, its own (with a shared dir, those of
// every instance sharing it); any other is NotFound. A volume published
// to another node with a single-node access mode (either one) is
// FailedPrecondition.
func (s *controllerServer) ControllerPublishVolume(_ context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "node_id is required")
	}
	if _, err := checkCapability("volume_capability", req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	p := s.p
	p.lockState()
	defer p.unlockState()
	v, err := p.volumeLocked(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if !p.knowsNodeLocked(req.GetNodeId()) {
		return nil, status.Errorf(codes.NotFound, "node %q not found", req.GetNodeId())
	}
	if err := publishedElsewhereLocked(v, req.GetNodeId(), req.GetVolumeCapability().GetAccessMode().GetMode()); err != nil {
		return nil, err
	}
	pub := controllerPublication{
		AccessMode: req.GetVolumeCapability().GetAccessMode().GetMode(),
		Readonly:   req.GetReadonly(),
	}
	if old, ok := v.Published[req.GetNodeId()]; ok {
		if old != pub {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is already published to node %q with another access mode or readonly setting", v.ID, req.GetNodeId())
		}
		return &csipb.ControllerPublishVolumeResponse{PublishContext: publishContext(req.GetNodeId(), pub)}, nil
	}
	maxVols := p.cfg.MaxVolumesPerNode
	if a := p.cfg.MaxAttached; a > 0 && (maxVols == 0 || a < maxVols) {
		maxVols = a
	}
	if maxVols > 0 {
		var n int64
		for _, other := range p.st.Volumes {
			if _, ok := other.Published[req.GetNodeId()]; ok {
				n++
			}
		}
		if n >= maxVols {
			return nil, status.Errorf(codes.ResourceExhausted, "node %q already has %d volumes published, the maximum", req.GetNodeId(), n)
		}
	}
	if v.Published == nil {
		v.Published = map[string]controllerPublication{}
	}
	v.Published[req.GetNodeId()] = pub
	if err := p.saveLocked(); err != nil {
		delete(v.Published, req.GetNodeId())
		return nil, err
	}
	return &csipb.ControllerPublishVolumeResponse{PublishContext: publishContext(req.GetNodeId(), pub)}, nil
}

func publishContext(node string, pub controllerPublication) map[string]string {
	return map[string]string{
		PublishContextNodeID:   node,
		PublishContextReadonly: strconv.FormatBool(pub.Readonly),
	}
}

// ControllerUnpublishVolume forgets the publication to the node (to every
// node when node_id is empty). Not being published, an unknown volume and
// an unknown node are success.
func (s *controllerServer) ControllerUnpublishVolume(_ context.Context, req *csipb.ControllerUnpublishVolumeRequest) (*csipb.ControllerUnpublishVolumeResponse, error) {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	p := s.p
	p.lockState()
	defer p.unlockState()
	// An unknown volume or node "can be safely regarded as
	// ControllerUnpublished" (CSI spec), so both succeed.
	v, err := p.volumeLocked(req.GetVolumeId())
	if err != nil {
		return &csipb.ControllerUnpublishVolumeResponse{}, nil
	}
	node := req.GetNodeId()
	old := maps.Clone(v.Published)
	if node == "" {
		clear(v.Published)
	} else {
		delete(v.Published, node)
	}
	if len(old) == len(v.Published) {
		return &csipb.ControllerUnpublishVolumeResponse{}, nil
	}
	if err := p.saveLocked(); err != nil {
		v.Published = old
		return nil, err
	}
	return &csipb.ControllerUnpublishVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms the capabilities when this plugin
// supports all of them for the volume (any access mode, mount access).
func (s *controllerServer) ValidateVolumeCapabilities(_ context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities is required")
	}
	for i, vc := range req.GetVolumeCapabilities() {
		if vc == nil || vc.GetAccessMode() == nil {
			return nil, status.Errorf(codes.InvalidArgument, "volume_capabilities[%d].access_mode is required", i)
		}
	}
	p := s.p
	p.lockState()
	v, err := p.volumeLocked(req.GetVolumeId())
	var params map[string]string
	if err == nil {
		params = maps.Clone(v.Parameters)
	}
	p.unlockState()
	if err != nil {
		return nil, err
	}
	for i, vc := range req.GetVolumeCapabilities() {
		if _, err := checkCapability("volume_capabilities["+strconv.Itoa(i)+"]", vc); err != nil {
			return &csipb.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
		}
	}
	if len(req.GetParameters()) > 0 && !maps.Equal(req.GetParameters(), params) {
		return &csipb.ValidateVolumeCapabilitiesResponse{Message: "parameters differ from the volume's"}, nil
	}
	if err := p.checkMutable(req.GetMutableParameters()); err != nil {
		return &csipb.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	return &csipb.ValidateVolumeCapabilitiesResponse{Confirmed: &csipb.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ListVolumes pages through the volumes in id order. The token is the id
// to start at, so a page stays valid when volumes are deleted; a token
// that is not a volume id is Aborted, as the spec asks.
func (s *controllerServer) ListVolumes(_ context.Context, req *csipb.ListVolumesRequest) (*csipb.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	token := req.GetStartingToken()
	if token != "" && !volumeIDRE.MatchString(token) {
		return nil, status.Errorf(codes.Aborted, "starting_token %q is not a token from this plugin", token)
	}
	p := s.p
	p.lockState()
	defer p.unlockState()
	ids := p.st.sortedIDs()
	start := sort.SearchStrings(ids, token)
	end := len(ids)
	if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
		end = start + m
	}
	resp := &csipb.ListVolumesResponse{}
	for _, id := range ids[start:end] {
		resp.Entries = append(resp.Entries, &csipb.ListVolumesResponse_Entry{Volume: p.st.Volumes[id].csi()})
	}
	if end < len(ids) {
		resp.NextToken = ids[end]
	}
	return resp, nil
}

// ControllerExpandVolume records the volume's new capacity (capacities are
// recorded, not enforced) and asks for NodeExpandVolume, as a plugin with a
// file system to grow would. A required size at or below the volume's is
// a success that changes nothing. Expansion is online: the volume may be
// published.
func (s *controllerServer) ControllerExpandVolume(_ context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error) {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	cr := req.GetCapacityRange()
	if cr == nil {
		return nil, status.Error(codes.InvalidArgument, "capacity_range is required")
	}
	required, limit := cr.GetRequiredBytes(), cr.GetLimitBytes()
	if required < 0 || limit < 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity_range: bytes must not be negative")
	}
	if limit > 0 && limit < required {
		return nil, status.Errorf(codes.OutOfRange, "capacity_range: limit_bytes %d is below required_bytes %d", limit, required)
	}
	if required == 0 {
		required = limit
	}
	p := s.p
	p.lockState()
	defer p.unlockState()
	v, err := p.volumeLocked(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if required > v.CapacityBytes {
		old := v.CapacityBytes
		v.CapacityBytes = required
		if err := p.saveLocked(); err != nil {
			v.CapacityBytes = old
			return nil, err
		}
		p.log.WithField("volume", v.ID).WithField("capacity_bytes", required).Info("volume expanded")
	}
	return &csipb.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes, NodeExpansionRequired: true}, nil
}

// ControllerModifyVolume merges mutable_parameters into the volume's
// (recorded, not enforced). A name not in Config.AcceptedMutableParameters
// is InvalidArgument naming it, and nothing changes; no parameter at all
// is a success that changes nothing.
func (s *controllerServer) ControllerModifyVolume(_ context.Context, req *csipb.ControllerModifyVolumeRequest) (*csipb.ControllerModifyVolumeResponse, error) {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	p := s.p
	if err := p.checkMutable(req.GetMutableParameters()); err != nil {
		return nil, err
	}
	p.lockState()
	defer p.unlockState()
	v, err := p.volumeLocked(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if len(req.GetMutableParameters()) == 0 {
		return &csipb.ControllerModifyVolumeResponse{}, nil
	}
	old := v.MutableParameters
	v.MutableParameters = maps.Clone(old)
	if v.MutableParameters == nil {
		v.MutableParameters = map[string]string{}
	}
	maps.Copy(v.MutableParameters, req.GetMutableParameters())
	if err := p.saveLocked(); err != nil {
		v.MutableParameters = old
		return nil, err
	}
	p.log.WithField("volume", v.ID).WithField("mutable_parameters", strings.Join(slices.Sorted(maps.Keys(req.GetMutableParameters())), ",")).Info("volume modified")
	return &csipb.ControllerModifyVolumeResponse{}, nil
}

// checkMutable refuses, with InvalidArgument naming it, the first mutable
// parameter (in name order) not in Config.AcceptedMutableParameters.
func (p *Plugin) checkMutable(params map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(params)) {
		if !slices.Contains(p.cfg.AcceptedMutableParameters, k) {
			return status.Errorf(codes.InvalidArgument, "mutable parameter %q is not supported (accepted: %s)", k, strings.Join(p.cfg.AcceptedMutableParameters, ", "))
		}
	}
	return nil
}

// GetCapacity answers Config.Capacity less the capacities of the volumes,
// or, without a configured capacity, the free space of the file system
// that holds the volumes. Capabilities, when given, must be valid.
func (s *controllerServer) GetCapacity(_ context.Context, req *csipb.GetCapacityRequest) (*csipb.GetCapacityResponse, error) {
	for i, vc := range req.GetVolumeCapabilities() {
		if _, err := checkCapability("volume_capabilities["+strconv.Itoa(i)+"]", vc); err != nil {
			return nil, err
		}
	}
	p := s.p
	if z := req.GetAccessibleTopology().GetSegments(); len(z) > 0 && (p.cfg.Zone == "" || z[TopologyKeyZone] != p.cfg.Zone || len(z) > 1) {
		return &csipb.GetCapacityResponse{}, nil // not a topology of this plugin: nothing there
	}
	var avail int64
	if p.cfg.Capacity > 0 {
		p.lockState()
		avail = p.cfg.Capacity
		for _, v := range p.st.Volumes {
			avail -= v.CapacityBytes
		}
		p.unlockState()
	} else {
		var fs syscall.Statfs_t
		if err := syscall.Statfs(p.dataDir, &fs); err != nil {
			return nil, status.Errorf(codes.Internal, "statfs %s: %s", p.dataDir, err.Error())
		}
		avail = int64(fs.Bavail) * fs.Bsize
	}
	avail = max(avail, 0)
	return &csipb.GetCapacityResponse{AvailableCapacity: avail, MaximumVolumeSize: wrapperspb.Int64(avail)}, nil
}

// checkZone refuses accessibility requirements this plugin cannot meet:
// requisite topologies none of which is its zone. A plugin without a zone
// ignores them, as its volumes are reachable from everywhere.
func (p *Plugin) checkZone(ar *csipb.TopologyRequirement) error {
	if p.cfg.Zone == "" || len(ar.GetRequisite()) == 0 {
		return nil
	}
	for _, t := range ar.GetRequisite() {
		if z, ok := t.GetSegments()[TopologyKeyZone]; ok && z == p.cfg.Zone {
			return nil
		}
	}
	return status.Errorf(codes.ResourceExhausted, "no requisite topology is in zone %q (%s) where this plugin provisions", p.cfg.Zone, TopologyKeyZone)
}

// sameSource reports whether a volume created from have was asked for with
// want.
func sameSource(have *contentSource, want *csipb.VolumeContentSource) bool {
	switch {
	case have == nil:
		return want == nil
	case have.Kind == contentSnap:
		return want.GetSnapshot().GetSnapshotId() == have.ID
	}
	return want.GetVolume().GetVolumeId() == have.ID
}
