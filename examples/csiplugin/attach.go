package csiplugin

import (
	"os"
	"path/filepath"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// pathRole is what differs between staging a volume at a path and
// publishing it at one. The node handlers share the rest: argument
// checks, idempotent repeats, the in-use check, record-then-mount with its
// rollback, and unmount-then-forget.
type pathRole struct {
	field              string // request field that names the path
	attach, detach     string // mounter operations, named in errors
	attached, detached string // named in messages and logs
	conflict           string // what a repeated request may not change
	// records selects the volume's attachments in this role.
	records func(v *volume) *map[string]attachment
	// admit checks a new attachment (not a repeat) before it is recorded.
	admit   func(v *volume, path string, att attachment) error
	mount   func(m mounter, volDir, path string, att attachment) error
	unmount func(m mounter, path string) error
}

// stagingRole is NodeStageVolume and NodeUnstageVolume.
var stagingRole = pathRole{
	field:    "staging_target_path",
	attach:   "stage",
	detach:   "unstage",
	attached: "staged",
	detached: "unstaged",
	conflict: "another capability",
	records:  func(v *volume) *map[string]attachment { return &v.Staged },
	admit: func(_ *volume, staging string, _ attachment) error {
		// A dead FUSE mount fails the stat with ENOTCONN; the mounter
		// unmounts it.
		if err := os.MkdirAll(staging, 0o750); err != nil && !isCorruptedMount(err) {
			return status.Errorf(codes.Internal, "create staging_target_path: %s", err.Error())
		}
		return nil
	},
	mount: func(m mounter, volDir, staging string, att attachment) error {
		return m.stage(volDir, staging, att.MountFlags)
	},
	unmount: mounter.unstage,
}

// targetRole is NodePublishVolume and NodeUnpublishVolume.
var targetRole = pathRole{
	field:    "target_path",
	attach:   "publish",
	detach:   "unpublish",
	attached: "published",
	detached: "unpublished",
	conflict: "another capability or readonly setting",
	records:  func(v *volume) *map[string]attachment { return &v.Targets },
	admit:    checkSingleWriter,
	mount: func(m mounter, volDir, target string, att attachment) error {
		return m.publish(volDir, att.StagingPath, target, att.MountFlags)
	},
	unmount: mounter.unpublish,
}

// checkSingleWriter keeps a single-node-single-writer volume to one target:
// it may not gain a second one, nor join one published that way.
func checkSingleWriter(v *volume, _ string, att attachment) error {
	if len(v.Targets) == 0 {
		return nil
	}
	if att.AccessMode == csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		return status.Errorf(codes.FailedPrecondition, "volume %s is single-node-single-writer and already published at another target", v.ID)
	}
	for _, t := range v.Targets {
		if t.AccessMode == csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
			return status.Errorf(codes.FailedPrecondition, "volume %s is published single-node-single-writer at another target", v.ID)
		}
	}
	return nil
}

// checkAttach validates a stage or publish request's volume id, path (in
// r.field) and capability, in that order. It returns the clean path and
// the MS_* bits of the capability's mount flags.
func (p *Plugin) checkAttach(r pathRole, volumeID, path string, vc *csipb.VolumeCapability) (string, uintptr, error) {
	if err := requireVolumeID(volumeID); err != nil {
		return "", 0, err
	}
	if err := p.checkHostPath(r.field, path); err != nil {
		return "", 0, err
	}
	flags, err := checkCapability("volume_capability", vc)
	if err != nil {
		return "", 0, err
	}
	return filepath.Clean(path), flags, nil
}

// attachLocked records att for v at path in role r and mounts it. A
// repeat of the same request mounts again, since the mount is gone after a
// reboot, or after a crash between record and mount.
func (p *Plugin) attachLocked(r pathRole, v *volume, path string, att attachment) error {
	recs := r.records(v)
	if old, ok := (*recs)[path]; ok {
		if old != att {
			return status.Errorf(codes.AlreadyExists, "volume %s is already %s at %s with %s", v.ID, r.attached, path, r.conflict)
		}
		if err := r.mount(p.mnt, p.volDir(v.ID), path, att); err != nil {
			return mountStatus(r.attach, err)
		}
		return nil
	}
	if other := p.userLocked(r, path); other != "" {
		return status.Errorf(codes.FailedPrecondition, "%s %s is in use by volume %s", r.field, path, other)
	}
	if err := r.admit(v, path, att); err != nil {
		return err
	}

	// Record first, then mount: after a crash in between, a retried attach
	// or a detach finds the record and finishes the job.
	if *recs == nil {
		*recs = map[string]attachment{}
	}
	(*recs)[path] = att
	if err := p.saveLocked(); err != nil {
		delete(*recs, path)
		return err
	}
	if err := r.mount(p.mnt, p.volDir(v.ID), path, att); err != nil {
		if uerr := r.unmount(p.mnt, path); uerr == nil {
			delete(*recs, path)
			_ = p.saveLocked() // if this fails too, the record makes the detach clean up
		}
		return mountStatus(r.attach, err)
	}
	p.log.WithField("volume", v.ID).Info("volume " + r.attached)
	return nil
}

// detach is NodeUnstageVolume and NodeUnpublishVolume: it unmounts the
// volume from path, in role r, and forgets it there. A volume not attached
// there succeeds.
func (p *Plugin) detach(r pathRole, volumeID, path string) error {
	if err := requireVolumeID(volumeID); err != nil {
		return err
	}
	if err := p.checkHostPath(r.field, path); err != nil {
		return err
	}
	path = filepath.Clean(path)

	v, err := p.lockVolume(volumeID)
	if err != nil {
		return err
	}
	defer p.unlockState()
	recs := r.records(v)
	att, ok := (*recs)[path]
	if !ok {
		return nil
	}
	if err := r.unmount(p.mnt, path); err != nil {
		return mountStatus(r.detach, err)
	}
	delete(*recs, path)
	if err := p.saveLocked(); err != nil {
		(*recs)[path] = att
		return err
	}
	p.log.WithField("volume", v.ID).Info("volume " + r.detached)
	return nil
}
