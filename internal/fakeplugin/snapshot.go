package fakeplugin

import (
	"context"
	"maps"
	"slices"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Snapshot is a snapshot the plugin keeps, made by CreateSnapshot.
type Snapshot struct {
	ID           string
	Name         string
	SourceVolume string
	SizeBytes    int64
	CreatedAt    time.Time
	Parameters   map[string]string
}

// Snapshots returns a copy of the snapshots the plugin has, by ID.
func (p *Plugin) Snapshots() map[string]Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]Snapshot, len(p.snaps))
	for id, s := range p.snaps {
		c := *s
		c.Parameters = maps.Clone(s.Parameters)
		out[id] = c
	}
	return out
}

func (s *Snapshot) csi() *csipb.Snapshot {
	return &csipb.Snapshot{
		SnapshotId: s.ID, SourceVolumeId: s.SourceVolume, SizeBytes: s.SizeBytes,
		CreationTime: timestamppb.New(s.CreatedAt), ReadyToUse: true,
	}
}

// checkContentSourceLocked refuses a CreateVolume from a snapshot or
// volume the plugin does not have (NotFound, as the spec says), and a
// clone without Clone.
func (p *Plugin) checkContentSourceLocked(src *csipb.VolumeContentSource) error {
	if id := src.GetSnapshot().GetSnapshotId(); src.GetSnapshot() != nil {
		if _, ok := p.snaps[id]; !ok {
			return status.Errorf(codes.NotFound, "snapshot %q does not exist", id)
		}
	}
	if v := src.GetVolume(); v != nil {
		if !p.cfg.Clone {
			return status.Error(codes.InvalidArgument, "this plugin cannot clone volumes (no CLONE_VOLUME)")
		}
		if _, ok := p.volumes[v.GetVolumeId()]; !ok {
			return status.Errorf(codes.NotFound, "volume %q does not exist", v.GetVolumeId())
		}
	}
	return nil
}

// CreateSnapshot cuts a snapshot of source_volume_id named name; the same
// name again returns it, and AlreadyExists when its source differs. With
// StrictVolumes an unknown source volume is NotFound.
func (s *server) CreateSnapshot(_ context.Context, req *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error) {
	if err := firstError(required("name", req.GetName()), required("source_volume_id", req.GetSourceVolumeId())); err != nil {
		return nil, err
	}
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	id := "snap-" + req.GetName()
	if sn, ok := p.snaps[id]; ok {
		if sn.SourceVolume != req.GetSourceVolumeId() {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists of volume %q", req.GetName(), sn.SourceVolume)
		}
		return &csipb.CreateSnapshotResponse{Snapshot: sn.csi()}, nil
	}
	var size int64
	if v, ok := p.volumes[req.GetSourceVolumeId()]; ok {
		size = v.CapacityBytes
	} else if p.cfg.StrictVolumes {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetSourceVolumeId())
	}
	sn := &Snapshot{ID: id, Name: req.GetName(), SourceVolume: req.GetSourceVolumeId(), SizeBytes: size,
		CreatedAt: time.Now(), Parameters: maps.Clone(req.GetParameters())}
	p.snaps[id] = sn
	return &csipb.CreateSnapshotResponse{Snapshot: sn.csi()}, nil
}

// DeleteSnapshot forgets snapshot_id; an unknown one succeeds.
func (s *server) DeleteSnapshot(_ context.Context, req *csipb.DeleteSnapshotRequest) (*csipb.DeleteSnapshotResponse, error) {
	if err := required("snapshot_id", req.GetSnapshotId()); err != nil {
		return nil, err
	}
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.snaps, req.GetSnapshotId())
	return &csipb.DeleteSnapshotResponse{}, nil
}

// ListSnapshots pages through the snapshots in ID order, filtered by
// snapshot_id and source_volume_id; the token is the ID to start at (an
// unknown one is Aborted).
func (s *server) ListSnapshots(_ context.Context, req *csipb.ListSnapshotsRequest) (*csipb.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for _, id := range slices.Sorted(maps.Keys(p.snaps)) {
		sn := p.snaps[id]
		if (req.GetSnapshotId() == "" || req.GetSnapshotId() == id) &&
			(req.GetSourceVolumeId() == "" || req.GetSourceVolumeId() == sn.SourceVolume) {
			ids = append(ids, id)
		}
	}
	start := 0
	if tok := req.GetStartingToken(); tok != "" {
		i, found := slices.BinarySearch(ids, tok)
		if !found {
			return nil, status.Errorf(codes.Aborted, "starting_token %q is not a snapshot", tok)
		}
		start = i
	}
	end := len(ids)
	if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
		end = start + m
	}
	resp := &csipb.ListSnapshotsResponse{}
	for _, id := range ids[start:end] {
		resp.Entries = append(resp.Entries, &csipb.ListSnapshotsResponse_Entry{Snapshot: p.snaps[id].csi()})
	}
	if end < len(ids) {
		resp.NextToken = ids[end]
	}
	return resp, nil
}
