package csiplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
	} {
		caps = append(caps, &csipb.NodeServiceCapability{
			Type: &csipb.NodeServiceCapability_Rpc{Rpc: &csipb.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (s *nodeServer) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{
		NodeId:            s.p.cfg.NodeID,
		MaxVolumesPerNode: s.p.cfg.MaxVolumesPerNode,
	}, nil
}

// NodeStageVolume makes the volume directory available at the staging
// path: a bind mount (read-only when the controller publication is), or
// bookkeeping only in symlink mode. The volume must be controller-published
// to this node first (FailedPrecondition otherwise).
func (s *nodeServer) NodeStageVolume(_ context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	p := s.p
	if err := p.checkHostPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	flags, err := checkCapability("volume_capability", req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	staging := filepath.Clean(req.GetStagingTargetPath())

	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.volumeLocked(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
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
	if old, ok := v.Staged[staging]; ok {
		if old != att {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is already staged at %s with another capability", v.ID, staging)
		}
		// Same request again: make sure the mount is still there (it is
		// gone after a reboot, or after a crash between record and mount).
		if err := p.mnt.stage(p.volDir(v.ID), staging, flags); err != nil {
			return nil, mountStatus("stage", err)
		}
		return &csipb.NodeStageVolumeResponse{}, nil
	}
	if other := p.userLocked(staging, true); other != "" {
		return nil, status.Errorf(codes.FailedPrecondition, "staging_target_path %s is in use by volume %s", staging, other)
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "create staging_target_path: %s", err.Error())
	}

	// Record first, then mount: after a crash in between, a retried stage
	// or unstage finds the record and finishes the job.
	if v.Staged == nil {
		v.Staged = map[string]attachment{}
	}
	v.Staged[staging] = att
	if err := p.saveLocked(); err != nil {
		delete(v.Staged, staging)
		return nil, err
	}
	if err := p.mnt.stage(p.volDir(v.ID), staging, flags); err != nil {
		if uerr := p.mnt.unstage(staging); uerr == nil {
			delete(v.Staged, staging)
			_ = p.saveLocked() // if this fails too, the record makes unstage clean up
		}
		return nil, mountStatus("stage", err)
	}
	p.log.WithField("volume", v.ID).Info("volume staged")
	return &csipb.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume undoes NodeStageVolume. It leaves the staging
// directory, which belongs to the CO. A volume not staged there succeeds.
func (s *nodeServer) NodeUnstageVolume(_ context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	p := s.p
	if err := p.checkHostPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	staging := filepath.Clean(req.GetStagingTargetPath())

	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.volumeLocked(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	att, ok := v.Staged[staging]
	if !ok {
		return &csipb.NodeUnstageVolumeResponse{}, nil
	}
	if err := p.mnt.unstage(staging); err != nil {
		return nil, mountStatus("unstage", err)
	}
	delete(v.Staged, staging)
	if err := p.saveLocked(); err != nil {
		v.Staged[staging] = att
		return nil, err
	}
	p.log.WithField("volume", v.ID).Info("volume unstaged")
	return &csipb.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume makes the staged volume available at the target path,
// which it creates: a bind mount of the staging path (read-only when asked
// by the request, the access mode or the controller publication), or a
// symlink to the volume directory in symlink mode.
func (s *nodeServer) NodePublishVolume(_ context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	p := s.p
	if err := p.checkHostPath("target_path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	flags, err := checkCapability("volume_capability", req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	if err := p.checkHostPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	target := filepath.Clean(req.GetTargetPath())
	staging := filepath.Clean(req.GetStagingTargetPath())
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()

	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.volumeLocked(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	stg, ok := v.Staged[staging]
	if !ok {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", v.ID, staging)
	}
	ro := req.GetReadonly() || readOnlyMode(mode) || stg.Readonly || req.GetPublishContext()[PublishContextReadonly] == "true"
	if ro {
		flags |= syscall.MS_RDONLY
	}
	att := attachment{AccessMode: mode, MountFlags: flags, Readonly: ro, StagingPath: staging}
	if old, ok := v.Targets[target]; ok {
		if old != att {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is already published at %s with another capability or readonly setting", v.ID, target)
		}
		if err := p.mnt.publish(p.volDir(v.ID), staging, target, flags); err != nil {
			return nil, mountStatus("publish", err)
		}
		return &csipb.NodePublishVolumeResponse{}, nil
	}
	if other := p.userLocked(target, false); other != "" {
		return nil, status.Errorf(codes.FailedPrecondition, "target_path %s is in use by volume %s", target, other)
	}
	if len(v.Targets) > 0 {
		if mode == csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is single-node-single-writer and already published at another target", v.ID)
		}
		for _, t := range v.Targets {
			if t.AccessMode == csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
				return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published single-node-single-writer at another target", v.ID)
			}
		}
	}

	if v.Targets == nil {
		v.Targets = map[string]attachment{}
	}
	v.Targets[target] = att
	if err := p.saveLocked(); err != nil {
		delete(v.Targets, target)
		return nil, err
	}
	if err := p.mnt.publish(p.volDir(v.ID), staging, target, flags); err != nil {
		if uerr := p.mnt.unpublish(target); uerr == nil {
			delete(v.Targets, target)
			_ = p.saveLocked() // if this fails too, the record makes unpublish clean up
		}
		return nil, mountStatus("publish", err)
	}
	p.log.WithField("volume", v.ID).Info("volume published")
	return &csipb.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unmounts and removes the target path. A target this
// plugin did not publish for the volume is left alone and succeeds.
func (s *nodeServer) NodeUnpublishVolume(_ context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	p := s.p
	if err := p.checkHostPath("target_path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	target := filepath.Clean(req.GetTargetPath())

	p.mu.Lock()
	defer p.mu.Unlock()
	v, err := p.volumeLocked(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	att, ok := v.Targets[target]
	if !ok {
		return &csipb.NodeUnpublishVolumeResponse{}, nil
	}
	if err := p.mnt.unpublish(target); err != nil {
		return nil, mountStatus("unpublish", err)
	}
	delete(v.Targets, target)
	if err := p.saveLocked(); err != nil {
		v.Targets[target] = att
		return nil, err
	}
	p.log.WithField("volume", v.ID).Info("volume unpublished")
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetVolumeStats reports the usage of the file system that holds the
// volume (volumes are directories; there is no per-volume quota). The path
// must be one where the volume is staged or published.
func (s *nodeServer) NodeGetVolumeStats(_ context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetVolumePath() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_path is required")
	}
	p := s.p
	path := filepath.Clean(req.GetVolumePath())
	p.mu.Lock()
	v, err := p.volumeLocked(req.GetVolumeId())
	if err == nil {
		_, staged := v.Staged[path]
		_, published := v.Targets[path]
		if !staged && !published {
			err = status.Errorf(codes.NotFound, "volume %s is not staged or published at %s", v.ID, path)
		}
	}
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(path, &fs); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, status.Errorf(codes.NotFound, "volume_path %s: %s", path, err.Error())
		}
		return nil, status.Errorf(codes.Internal, "statfs %s: %s", path, err.Error())
	}
	bsize := fs.Bsize
	return &csipb.NodeGetVolumeStatsResponse{Usage: []*csipb.VolumeUsage{
		{
			Unit:      csipb.VolumeUsage_BYTES,
			Total:     int64(fs.Blocks) * bsize,
			Available: int64(fs.Bavail) * bsize,
			Used:      int64(fs.Blocks-fs.Bfree) * bsize,
		},
		{
			Unit:      csipb.VolumeUsage_INODES,
			Total:     int64(fs.Files),
			Available: int64(fs.Ffree),
			Used:      int64(fs.Files - fs.Ffree),
		},
	}}, nil
}

// userLocked returns the id of a volume staged (staging) or published at
// path, or "".
func (p *Plugin) userLocked(path string, staging bool) string {
	for id, v := range p.st.Volumes {
		m := v.Targets
		if staging {
			m = v.Staged
		}
		if _, ok := m[path]; ok {
			return id
		}
	}
	return ""
}

// mountStatus turns a mount error into a gRPC status. A busy mount point
// is Unavailable, so that callers retry; the rest is Internal. The message
// holds the operation, path and errno, never mount flags.
func mountStatus(op string, err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, syscall.EBUSY):
		code = codes.Unavailable
	case errors.Is(err, syscall.EPERM), errors.Is(err, fs.ErrPermission):
		err = fmt.Errorf("%w (bind mounts need root; use mount mode symlink)", err)
	}
	return status.Errorf(code, "%s: %s", op, err.Error())
}
