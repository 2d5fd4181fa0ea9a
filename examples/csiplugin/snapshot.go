package csiplugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// A snapshot is a full copy of its volume's directory, taken at
// CreateSnapshot, in StateDir/snapshots/<id>. A volume created from it (or
// cloned from another volume) starts as a copy of that directory.

const (
	snapshotsDir  = "snapshots"
	snapshotIDPf  = "snap-"
	contentVolume = "volume"
	contentSnap   = "snapshot"
)

// snapshotIDRE matches the snapshot ids this plugin hands out.
var snapshotIDRE = regexp.MustCompile(`^snap-[0-9a-f]{32}$`)

// snapshot is one snapshot, as saved in state.json.
type snapshot struct {
	ID             string `json:"id"`
	Name           string `json:"name"`
	SourceVolumeID string `json:"source_volume_id"`
	SizeBytes      int64  `json:"size_bytes"`
	CreatedAtNanos int64  `json:"created_at_nanos"`
}

// contentSource is where a volume's first content came from.
type contentSource struct {
	// Kind is contentSnap or contentVolume.
	Kind string `json:"kind"`
	ID   string `json:"id"`
}

func snapshotIDFor(name string) string {
	sum := sha256.Sum256([]byte(name))
	return snapshotIDPf + hex.EncodeToString(sum[:16])
}

func (s *snapshot) csi() *csipb.Snapshot {
	return &csipb.Snapshot{
		SnapshotId: s.ID, SourceVolumeId: s.SourceVolumeID, SizeBytes: s.SizeBytes,
		CreationTime: timestamppb.New(time.Unix(0, s.CreatedAtNanos)), ReadyToUse: true,
	}
}

func (p *Plugin) snapDir(id string) string { return filepath.Join(p.dataDir, snapshotsDir, id) }

// CreateSnapshot copies the source volume's directory. The same name and
// source again answer the same snapshot; the same name of another source
// is AlreadyExists.
func (s *controllerServer) CreateSnapshot(_ context.Context, req *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if req.GetSourceVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "source_volume_id is required")
	}
	p := s.p
	p.lockState()
	defer p.unlockState()
	id := snapshotIDFor(req.GetName())
	if sn, ok := p.st.Snapshots[id]; ok {
		if sn.SourceVolumeID != req.GetSourceVolumeId() {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists of another volume", req.GetName())
		}
		return &csipb.CreateSnapshotResponse{Snapshot: sn.csi()}, nil
	}
	v, err := p.volumeLocked(req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	if err := copyFresh(p.volDir(v.ID), p.snapDir(id)); err != nil {
		return nil, status.Errorf(codes.Internal, "copy volume %s: %s", v.ID, err.Error())
	}
	sn := &snapshot{ID: id, Name: req.GetName(), SourceVolumeID: v.ID, SizeBytes: v.CapacityBytes, CreatedAtNanos: time.Now().UnixNano()}
	p.st.Snapshots[id] = sn
	if err := p.saveLocked(); err != nil {
		delete(p.st.Snapshots, id)
		os.RemoveAll(p.snapDir(id))
		return nil, err
	}
	p.log.WithField("snapshot", id).WithField("volume", v.ID).Info("snapshot created")
	return &csipb.CreateSnapshotResponse{Snapshot: sn.csi()}, nil
}

// DeleteSnapshot removes the snapshot's copy; an unknown id succeeds.
func (s *controllerServer) DeleteSnapshot(_ context.Context, req *csipb.DeleteSnapshotRequest) (*csipb.DeleteSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id is required")
	}
	p := s.p
	p.lockState()
	defer p.unlockState()
	sn, ok := p.st.Snapshots[req.GetSnapshotId()]
	if !ok {
		return &csipb.DeleteSnapshotResponse{}, nil
	}
	if err := os.RemoveAll(p.snapDir(sn.ID)); err != nil {
		return nil, status.Errorf(codes.Internal, "remove snapshot directory: %s", err.Error())
	}
	delete(p.st.Snapshots, sn.ID)
	if err := p.saveLocked(); err != nil {
		p.st.Snapshots[sn.ID] = sn
		return nil, err
	}
	p.log.WithField("snapshot", sn.ID).Info("snapshot deleted")
	return &csipb.DeleteSnapshotResponse{}, nil
}

// ListSnapshots pages through the snapshots in id order, optionally only
// one (snapshot_id) or those of one volume (source_volume_id). The token is
// the id to start at; one that is not a snapshot id is Aborted.
func (s *controllerServer) ListSnapshots(_ context.Context, req *csipb.ListSnapshotsRequest) (*csipb.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	token := req.GetStartingToken()
	if token != "" && !snapshotIDRE.MatchString(token) {
		return nil, status.Errorf(codes.Aborted, "starting_token %q is not a token from this plugin", token)
	}
	p := s.p
	p.lockState()
	defer p.unlockState()
	var ids []string
	for id, sn := range p.st.Snapshots {
		if (req.GetSnapshotId() == "" || id == req.GetSnapshotId()) &&
			(req.GetSourceVolumeId() == "" || sn.SourceVolumeID == req.GetSourceVolumeId()) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	start := sort.SearchStrings(ids, token)
	end := len(ids)
	if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
		end = start + m
	}
	resp := &csipb.ListSnapshotsResponse{}
	for _, id := range ids[start:end] {
		resp.Entries = append(resp.Entries, &csipb.ListSnapshotsResponse_Entry{Snapshot: p.st.Snapshots[id].csi()})
	}
	if end < len(ids) {
		resp.NextToken = ids[end]
	}
	return resp, nil
}

// contentOf resolves a CreateVolume content source: the directory to copy
// and its size; NotFound when the source does not exist. The state lock is held.
func (p *Plugin) contentOfLocked(src *csipb.VolumeContentSource) (*contentSource, string, int64, error) {
	switch {
	case src == nil:
		return nil, "", 0, nil
	case src.GetSnapshot() != nil:
		id := src.GetSnapshot().GetSnapshotId()
		sn, ok := p.st.Snapshots[id]
		if !ok {
			return nil, "", 0, status.Errorf(codes.NotFound, "snapshot %q not found", id)
		}
		return &contentSource{Kind: contentSnap, ID: id}, p.snapDir(id), sn.SizeBytes, nil
	case src.GetVolume() != nil:
		v, err := p.volumeLocked(src.GetVolume().GetVolumeId())
		if err != nil {
			return nil, "", 0, err
		}
		return &contentSource{Kind: contentVolume, ID: v.ID}, p.volDir(v.ID), v.CapacityBytes, nil
	}
	return nil, "", 0, status.Error(codes.InvalidArgument, "volume_content_source: want a snapshot or a volume")
}

func (c *contentSource) csi() *csipb.VolumeContentSource {
	if c == nil {
		return nil
	}
	if c.Kind == contentSnap {
		return &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: c.ID}}}
	}
	return &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: c.ID}}}
}

// copyFresh makes dst (which must not be left half-made) a copy of the
// tree src: into a temporary sibling, then renamed into place.
func copyFresh(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o750); err != nil {
		return err
	}
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := copyTree(src, tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return os.Rename(tmp, dst)
}

// copyTree copies directories, regular files and symlinks of src to dst,
// keeping their modes.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(to, info.Mode().Perm()); err != nil {
				return err
			}
			return os.Chmod(to, info.Mode().Perm()) // not narrowed by the umask
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.Type().IsRegular():
			return copyFile(path, to, info.Mode().Perm())
		}
		return fmt.Errorf("%s: cannot copy a %s", path, d.Type())
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
