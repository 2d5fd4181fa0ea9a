package fakeplugin

import (
	"context"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// Usage is what NodeGetVolumeStats answers for a volume (see SetUsage).
type Usage struct {
	TotalBytes, AvailableBytes, UsedBytes int64
	Inodes, InodesFree, InodesUsed        int64
}

// Condition is a volume's condition as the fake reports it (see
// SetCondition): abnormal with a message, or normal.
type Condition struct {
	Abnormal bool
	Message  string
}

// DefaultInodes is the inode count of a volume without SetUsage.
const DefaultInodes = 1000

// SetUsage makes NodeGetVolumeStats answer u for volume id.
func (p *Plugin) SetUsage(id string, u Usage) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.usage[id] = u
}

// SetCondition makes the plugin report c as volume id's condition (in
// NodeGetVolumeStats with Config.NodeCondition, ControllerGetVolume with
// Config.ControllerCondition, the health RPCs with Config.VolumeHealth).
func (p *Plugin) SetCondition(id string, c Condition) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conds[id] = c
}

// legacyVolumeCondition is the capability number of VOLUME_CONDITION,
// removed from the spec in v1.13: node 4, controller 11.
const (
	legacyNodeVolumeCondition       = csipb.NodeServiceCapability_RPC_Type(4)
	legacyControllerVolumeCondition = csipb.ControllerServiceCapability_RPC_Type(11)
)

func (c Config) nodeHealthCaps() []*csipb.NodeServiceCapability {
	var out []*csipb.NodeServiceCapability
	if c.VolumeStats {
		out = append(out, nodeRPC(csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS))
	}
	if c.NodeCondition {
		out = append(out, nodeRPC(legacyNodeVolumeCondition))
	}
	if c.VolumeHealth {
		out = append(out, nodeRPC(csipb.NodeServiceCapability_RPC_GET_VOLUME_HEALTH))
	}
	return out
}

func (c Config) controllerHealthCaps() []*csipb.ControllerServiceCapability {
	var out []*csipb.ControllerServiceCapability
	if c.GetVolume {
		out = append(out, controllerRPC(csipb.ControllerServiceCapability_RPC_GET_VOLUME))
	}
	if c.ControllerCondition {
		out = append(out, controllerRPC(legacyControllerVolumeCondition))
	}
	if c.VolumeHealth {
		out = append(out, controllerRPC(csipb.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH))
	}
	return out
}

// legacyCondition encodes c as the volume_condition field (number 2) that
// plugins built with the spec before v1.13 send, for a message's unknown
// fields.
func legacyCondition(c Condition) []byte {
	var inner []byte
	if c.Abnormal {
		inner = protowire.AppendTag(inner, 1, protowire.VarintType)
		inner = protowire.AppendVarint(inner, 1)
	}
	if c.Message != "" {
		inner = protowire.AppendTag(inner, 2, protowire.BytesType)
		inner = protowire.AppendString(inner, c.Message)
	}
	b := protowire.AppendTag(nil, 2, protowire.BytesType)
	return protowire.AppendBytes(b, inner)
}

func health(id string, c Condition) *csipb.VolumeHealth {
	h := &csipb.VolumeHealth{VolumeId: id}
	if c.Abnormal {
		h.HealthStatuses = []*csipb.VolumeHealth_VolumeHealthEntry{{
			Status: csipb.VolumeHealthErrorType_DEGRADED, Reason: "FakeCondition", Message: c.Message,
		}}
	}
	return h
}

// NodeGetVolumeStats answers the volume's usage (SetUsage) when it is
// published or staged at volume_path; elsewhere it is NotFound.
func (s *server) NodeGetVolumeStats(_ context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	p, id, path := s.p, req.GetVolumeId(), req.GetVolumePath()
	if err := p.lockVolume(id, required("volume_id", id, "volume_path", path)); err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	_, published := p.pubs[id][path]
	if st, ok := p.staged[id]; !published && (!ok || st.path != path) {
		return nil, status.Errorf(codes.NotFound, "volume %q is not published or staged at %q", id, path)
	}
	u, ok := p.usage[id]
	if !ok {
		total := DefaultCapacity
		if v := p.volumes[id]; v != nil && v.CapacityBytes > 0 {
			total = v.CapacityBytes
		}
		u = Usage{TotalBytes: total, AvailableBytes: total, Inodes: DefaultInodes, InodesFree: DefaultInodes}
	}
	resp := &csipb.NodeGetVolumeStatsResponse{Usage: []*csipb.VolumeUsage{
		{Unit: csipb.VolumeUsage_BYTES, Total: u.TotalBytes, Available: u.AvailableBytes, Used: u.UsedBytes},
		{Unit: csipb.VolumeUsage_INODES, Total: u.Inodes, Available: u.InodesFree, Used: u.InodesUsed},
	}}
	if p.cfg.NodeCondition {
		resp.ProtoReflect().SetUnknown(legacyCondition(p.conds[id]))
	}
	return resp, nil
}

// NodeGetVolumeHealth answers the volume's condition (SetCondition).
func (s *server) NodeGetVolumeHealth(_ context.Context, req *csipb.NodeGetVolumeHealthRequest) (*csipb.NodeGetVolumeHealthResponse, error) {
	p, id := s.p, req.GetVolumeId()
	if err := p.lockVolume(id, required("volume_id", id)); err != nil {
		return nil, err
	}
	defer p.mu.Unlock()
	return &csipb.NodeGetVolumeHealthResponse{VolumeHealth: health(id, p.conds[id])}, nil
}

// ControllerGetVolume answers the volume, the node it is controller
// published to, and (with Config.ControllerCondition) its condition. An
// unknown volume is NotFound.
func (s *server) ControllerGetVolume(_ context.Context, req *csipb.ControllerGetVolumeRequest) (*csipb.ControllerGetVolumeResponse, error) {
	p, id := s.p, req.GetVolumeId()
	if err := firstError(required("volume_id", id)); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.volumes[id]
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", id)
	}
	st := &csipb.ControllerGetVolumeResponse_VolumeStatus{}
	if c, ok := p.ctrl[id]; ok {
		st.PublishedNodeIds = []string{c.node}
	}
	if p.cfg.ControllerCondition {
		st.ProtoReflect().SetUnknown(legacyCondition(p.conds[id]))
	}
	return &csipb.ControllerGetVolumeResponse{Volume: &csipb.Volume{VolumeId: v.ID, CapacityBytes: v.CapacityBytes}, Status: st}, nil
}

// ControllerGetVolumeHealth answers the volume's condition (SetCondition).
// An unknown volume is NotFound.
func (s *server) ControllerGetVolumeHealth(_ context.Context, req *csipb.ControllerGetVolumeHealthRequest) (*csipb.ControllerGetVolumeHealthResponse, error) {
	p, id := s.p, req.GetVolumeId()
	if err := firstError(required("volume_id", id)); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.volumes[id] == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", id)
	}
	return &csipb.ControllerGetVolumeHealthResponse{VolumeHealth: health(id, p.conds[id])}, nil
}
