package csiplugin

import (
	"path/filepath"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// checkCapability validates one volume capability and returns the MS_*
// bits of its mount flags. field names the request field in errors, which
// never quote a mount flag. Volumes are directories: only the mount access
// type is supported, and fs_type is ignored.
func checkCapability(field string, vc *csipb.VolumeCapability) (uintptr, error) {
	if vc == nil {
		return 0, status.Errorf(codes.InvalidArgument, "%s is required", field)
	}
	switch vc.GetAccessMode().GetMode() {
	case csipb.VolumeCapability_AccessMode_UNKNOWN:
		return 0, status.Errorf(codes.InvalidArgument, "%s.access_mode is required", field)
	case csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
		csipb.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
		csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
	default:
		return 0, status.Errorf(codes.InvalidArgument, "%s.access_mode %d is unknown", field, vc.GetAccessMode().GetMode())
	}
	switch vc.GetAccessType().(type) {
	case *csipb.VolumeCapability_Mount:
	case *csipb.VolumeCapability_Block:
		return 0, status.Errorf(codes.InvalidArgument, "%s: block access is not supported, volumes are directories", field)
	default:
		return 0, status.Errorf(codes.InvalidArgument, "%s.access_type is required (mount)", field)
	}
	bits, err := parseMountFlags(vc.GetMount().GetMountFlags())
	if err != nil {
		return 0, status.Errorf(codes.InvalidArgument, "%s.mount.%s", field, err.Error())
	}
	return bits, nil
}

// readOnlyMode reports whether an access mode allows reading only.
func readOnlyMode(m csipb.VolumeCapability_AccessMode_Mode) bool {
	return m == csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY ||
		m == csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

// checkHostPath validates a staging or target path: absolute, and outside
// the state dir and the shared dir (deleting a volume removes its
// directory tree, which must never hold a mount point).
func (p *Plugin) checkHostPath(field, path string) error {
	if path == "" {
		return status.Errorf(codes.InvalidArgument, "%s is required", field)
	}
	if !filepath.IsAbs(path) {
		return status.Errorf(codes.InvalidArgument, "%s %q is not absolute", field, path)
	}
	clean := filepath.Clean(path)
	for _, dir := range []struct{ path, name string }{{p.cfg.StateDir, "state dir"}, {p.cfg.SharedDir, "shared dir"}} {
		if dir.path != "" && (clean == dir.path || strings.HasPrefix(clean, dir.path+string(filepath.Separator))) {
			return status.Errorf(codes.InvalidArgument, "%s %q is inside the plugin's %s", field, path, dir.name)
		}
	}
	return nil
}

// requireVolumeID checks that id is set.
func requireVolumeID(id string) error {
	if id == "" {
		return status.Error(codes.InvalidArgument, "volume_id is required")
	}
	return nil
}

// volumeLocked returns the volume with id, or a NotFound error. Ids this
// plugin never hands out are unknown without looking further.
func (p *Plugin) volumeLocked(id string) (*volume, error) {
	if volumeIDRE.MatchString(id) {
		if v, ok := p.st.Volumes[id]; ok {
			return v, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "volume %q not found", id)
}

// lockVolume takes the state lock (lockState) and returns the volume with
// id, as volumeLocked. On success the caller holds the lock and must
// unlockState; on error it is released again.
func (p *Plugin) lockVolume(id string) (*volume, error) {
	p.lockState()
	v, err := p.volumeLocked(id)
	if err != nil {
		p.unlockState()
		return nil, err
	}
	return v, nil
}

// volDir is where the volume's data lives.
func (p *Plugin) volDir(id string) string {
	return filepath.Join(p.dataDir, volumesDir, id)
}

// saveLocked writes the state file; on failure the caller returns the
// error (as Internal) and has not yet made the change visible elsewhere.
func (p *Plugin) saveLocked() error {
	if p.stale != nil {
		// The shared state could not be read: writing what this process
		// holds would undo the other instances' changes.
		return status.Errorf(codes.Unavailable, "shared state: %s", p.stale.Error())
	}
	if err := p.st.save(p.dataDir); err != nil {
		p.log.WithField("error", err.Error()).Error("cannot save state")
		return status.Errorf(codes.Internal, "%s", err.Error())
	}
	return nil
}
