package csiplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// nodeServer is the CSI Node service. It shares the controller's state:
// the example plugin always runs as a monolith (controller and node in one
// process), so the node knows every volume and where it is published.
type nodeServer struct {
	csipb.UnimplementedNodeServer
	p *Plugin
}

func (s *nodeServer) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	var caps []*csipb.NodeServiceCapability
	for _, t := range []csipb.NodeServiceCapability_RPC_Type{
		csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csipb.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csipb.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csipb.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP,
	} {
		if s.p.cfg.NoVolumeStats && (t == csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS || t == csipb.NodeServiceCapability_RPC_GET_VOLUME_HEALTH) {
			continue
		}
		caps = append(caps, &csipb.NodeServiceCapability{
			Type: &csipb.NodeServiceCapability_Rpc{Rpc: &csipb.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (s *nodeServer) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	resp := &csipb.NodeGetInfoResponse{
		NodeId:            s.p.cfg.NodeID,
		MaxVolumesPerNode: s.p.cfg.MaxVolumesPerNode,
	}
	if z := s.p.cfg.Zone; z != "" {
		resp.AccessibleTopology = &csipb.Topology{Segments: map[string]string{TopologyKeyZone: z}}
	}
	return resp, nil
}

// NodeStageVolume makes the volume directory available at the staging
// path: a bind mount (read-only when the controller publication is), or
// bookkeeping only in symlink mode. The volume must be controller-published
// to this node first (FailedPrecondition otherwise).
func (s *nodeServer) NodeStageVolume(_ context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	p := s.p
	staging, flags, err := p.checkAttach(stagingRole, req.GetVolumeId(), req.GetStagingTargetPath(), req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}

	v, err := p.lockVolume(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer p.unlockState()
	pub, ok := v.Published[p.cfg.NodeID]
	if !ok {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not controller-published to node %q", v.ID, p.cfg.NodeID)
	}
	if pub.Readonly {
		flags |= syscall.MS_RDONLY
	}
	att := attachment{
		AccessMode: req.GetVolumeCapability().GetAccessMode().GetMode(),
		MountFlags: flags,
		Readonly:   pub.Readonly,
	}
	if err := p.attachLocked(stagingRole, v, staging, att); err != nil {
		return nil, err
	}
	return reply(&csipb.NodeStageVolumeResponse{}, applyMountGroup(p.volDir(v.ID), req.GetVolumeCapability()))
}

// NodeUnstageVolume undoes NodeStageVolume. It leaves the staging
// directory, which belongs to the CO. A volume not staged there succeeds.
func (s *nodeServer) NodeUnstageVolume(_ context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	return reply(&csipb.NodeUnstageVolumeResponse{}, s.p.detach(stagingRole, req.GetVolumeId(), req.GetStagingTargetPath()))
}

// NodePublishVolume makes the staged volume available at the target path,
// which it creates: a bind mount of the staging path (read-only when asked
// by the request, the access mode or the controller publication), or a
// symlink to the volume directory in symlink mode.
func (s *nodeServer) NodePublishVolume(_ context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	p := s.p
	target, flags, err := p.checkAttach(targetRole, req.GetVolumeId(), req.GetTargetPath(), req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	if err := p.checkHostPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	staging := filepath.Clean(req.GetStagingTargetPath())
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()

	v, err := p.lockVolume(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer p.unlockState()
	stg, ok := v.Staged[staging]
	if !ok {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", v.ID, staging)
	}
	ro := req.GetReadonly() || readOnlyMode(mode) || stg.Readonly || req.GetPublishContext()[PublishContextReadonly] == "true"
	if ro {
		flags |= syscall.MS_RDONLY
	}
	att := attachment{AccessMode: mode, MountFlags: flags, Readonly: ro, StagingPath: staging}
	if err := p.attachLocked(targetRole, v, target, att); err != nil {
		return nil, err
	}
	return reply(&csipb.NodePublishVolumeResponse{}, applyMountGroup(p.volDir(v.ID), req.GetVolumeCapability()))
}

// NodeUnpublishVolume unmounts and removes the target path. A target this
// plugin did not publish for the volume is left alone and succeeds.
func (s *nodeServer) NodeUnpublishVolume(_ context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	return reply(&csipb.NodeUnpublishVolumeResponse{}, s.p.detach(targetRole, req.GetVolumeId(), req.GetTargetPath()))
}

// NodeExpandVolume grows the volume where it is staged or published at
// volume_path. A directory has no file system of its own to grow, so it
// checks the path and answers the volume's capacity (at least the one asked
// for).
func (s *nodeServer) NodeExpandVolume(_ context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetVolumePath() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_path is required")
	}
	if vc := req.GetVolumeCapability(); vc != nil {
		if _, err := checkCapability("volume_capability", vc); err != nil {
			return nil, err
		}
	}
	p := s.p
	path := filepath.Clean(req.GetVolumePath())
	p.lockState()
	defer p.unlockState()
	v, err := p.volumeLocked(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	_, staged := v.Staged[path]
	_, published := v.Targets[path]
	if !staged && !published {
		return nil, status.Errorf(codes.NotFound, "volume %s is not staged or published at %s", v.ID, path)
	}
	return &csipb.NodeExpandVolumeResponse{CapacityBytes: max(v.CapacityBytes, req.GetCapacityRange().GetRequiredBytes())}, nil
}

// userLocked returns the id of a volume attached at path in role r, or "".
func (p *Plugin) userLocked(r pathRole, path string) string {
	for id, v := range p.st.Volumes {
		if _, ok := (*r.records(v))[path]; ok {
			return id
		}
	}
	return ""
}

// applyMountGroup gives the volume directory dir (what the staging and
// target paths show) the capability's volume_mount_group, if any, with
// group read-write-execute and the setgid bit (VOLUME_MOUNT_GROUP). Only
// the directory itself: files made in it inherit the group.
func applyMountGroup(dir string, vc *csipb.VolumeCapability) error {
	g := vc.GetMount().GetVolumeMountGroup()
	if g == "" {
		return nil
	}
	gid, err := strconv.ParseUint(g, 10, 32)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "volume_capability.mount.volume_mount_group %q is not a gid", g)
	}
	if err := os.Chown(dir, -1, int(gid)); err != nil {
		return status.Errorf(codes.Internal, "volume_mount_group: %s", err.Error())
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return status.Errorf(codes.Internal, "volume_mount_group: %s", err.Error())
	}
	if err := os.Chmod(dir, fi.Mode()&(fs.ModePerm|fs.ModeSticky)|0o070|fs.ModeSetgid); err != nil {
		return status.Errorf(codes.Internal, "volume_mount_group: %s", err.Error())
	}
	return nil
}

// reply is resp, or nil and err when err is set: gRPC handlers return no
// response with an error.
func reply[R any](resp *R, err error) (*R, error) {
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// mountStatus turns a mount error into a gRPC status. A busy mount point
// is Unavailable, so that callers retry; the rest is Internal. The message
// holds the operation, path and errno, never mount flags.
func mountStatus(op string, err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, syscall.EBUSY), errors.Is(err, ErrStopped):
		code = codes.Unavailable
	case errors.Is(err, syscall.EPERM), errors.Is(err, fs.ErrPermission):
		err = fmt.Errorf("%w (bind mounts need root; use mount mode symlink)", err)
	}
	return status.Errorf(code, "%s: %s", op, err.Error())
}
