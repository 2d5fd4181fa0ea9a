package csiplugin

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ConditionsDir is the directory of StateDir (New creates it) where an
// operator (or a test) flips a volume's condition: while the file ConditionsDir/<volume id>
// exists, NodeGetVolumeHealth reports the volume as abnormal (DEGRADED,
// reason OperatorFlagged), with the file's first line as the message.
// Removing the file makes the volume normal again. A volume whose
// directory is missing is reported INACCESSIBLE (reason
// VolumeDirectoryMissing) whatever the file says.
const ConditionsDir = "conditions"

// maxConditionMessage bounds the message read from a condition file.
const maxConditionMessage = 1024

// NodeGetVolumeStats reports the usage of the volume's directory: used
// bytes are the blocks of everything in it (as du counts them), used
// inodes the number of files and directories in it; the capacity is the
// volume's recorded capacity (or, for a volume without one, the size of
// the file system that holds it), and what is available is the capacity
// less what is used, at most what the file system has free. The inode
// total and free count are the file system's. The path must be one where
// the volume is staged or published.
func (s *nodeServer) NodeGetVolumeStats(_ context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	if s.p.cfg.NoVolumeStats {
		return nil, status.Error(codes.Unimplemented, "GET_VOLUME_STATS is off (-no-volume-stats)")
	}
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetVolumePath() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_path is required")
	}
	p := s.p
	path := filepath.Clean(req.GetVolumePath())
	p.lockState()
	v, err := p.volumeLocked(req.GetVolumeId())
	var capacity int64
	if err == nil {
		_, staged := v.Staged[path]
		_, published := v.Targets[path]
		if !staged && !published {
			err = status.Errorf(codes.NotFound, "volume %s is not staged or published at %s", v.ID, path)
		}
		capacity = v.CapacityBytes
	}
	p.unlockState()
	if err != nil {
		return nil, err
	}
	dir := p.volDir(req.GetVolumeId())
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(dir, &sfs); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, status.Errorf(codes.NotFound, "volume %s: its directory is missing", req.GetVolumeId())
		}
		return nil, status.Errorf(codes.Internal, "statfs of volume %s: %s", req.GetVolumeId(), err.Error())
	}
	used, files, err := du(dir)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "usage of volume %s: %s", req.GetVolumeId(), err.Error())
	}
	bsize := sfs.Bsize
	if capacity <= 0 {
		capacity = int64(sfs.Blocks) * bsize
	}
	avail := min(max(capacity-used, 0), int64(sfs.Bavail)*bsize)
	return &csipb.NodeGetVolumeStatsResponse{Usage: []*csipb.VolumeUsage{
		{Unit: csipb.VolumeUsage_BYTES, Total: capacity, Available: avail, Used: used},
		{Unit: csipb.VolumeUsage_INODES, Total: int64(sfs.Files), Available: int64(sfs.Ffree), Used: files},
	}}, nil
}

// du returns the bytes of the blocks allocated to everything under dir
// (dir included) and how many files and directories there are, without
// following symlinks or crossing into other file systems.
func du(dir string) (bytes, files int64, err error) {
	root, err := os.Lstat(dir)
	if err != nil {
		return 0, 0, err
	}
	dev := root.Sys().(*syscall.Stat_t).Dev
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while we walked
			}
			return err
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Dev != dev {
			return fs.SkipDir // a mount inside the volume: not its usage
		}
		files++
		bytes += st.Blocks * 512
		return nil
	})
	return bytes, files, err
}

// NodeGetVolumeHealth reports the volume's condition: INACCESSIBLE when
// its directory is missing, DEGRADED while an operator's condition file
// (see ConditionsDir) exists, healthy otherwise.
func (s *nodeServer) NodeGetVolumeHealth(_ context.Context, req *csipb.NodeGetVolumeHealthRequest) (*csipb.NodeGetVolumeHealthResponse, error) {
	if s.p.cfg.NoVolumeStats {
		return nil, status.Error(codes.Unimplemented, "GET_VOLUME_HEALTH is off (-no-volume-stats)")
	}
	id := req.GetVolumeId()
	if err := requireVolumeID(id); err != nil {
		return nil, err
	}
	p := s.p
	p.lockState()
	_, err := p.volumeLocked(id)
	p.unlockState()
	if err != nil {
		return nil, err
	}
	h := &csipb.VolumeHealth{VolumeId: id}
	if _, err := os.Stat(p.volDir(id)); errors.Is(err, fs.ErrNotExist) {
		h.HealthStatuses = append(h.HealthStatuses, &csipb.VolumeHealth_VolumeHealthEntry{
			Status: csipb.VolumeHealthErrorType_INACCESSIBLE, Reason: "VolumeDirectoryMissing",
			Message: "the volume's directory is gone",
		})
	}
	msg, flagged, err := readCondition(filepath.Join(p.cfg.StateDir, ConditionsDir, id))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "condition of volume %s: %s", id, err.Error())
	}
	if flagged {
		h.HealthStatuses = append(h.HealthStatuses, &csipb.VolumeHealth_VolumeHealthEntry{
			Status: csipb.VolumeHealthErrorType_DEGRADED, Reason: "OperatorFlagged", Message: msg,
		})
	}
	return &csipb.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// readCondition returns the first line of the condition file at path
// (at most maxConditionMessage bytes), and whether the file exists.
func readCondition(path string) (string, bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConditionMessage))
	if err != nil {
		return "", false, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line), true, nil
}
