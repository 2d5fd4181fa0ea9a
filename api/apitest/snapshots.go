package apitest

import (
	"context"
	"github.com/csiactor/csiactor/internal/kinderr"
	"maps"
	"slices"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

var _ api.SnapshotsBackend = (*Backend)(nil)

// CreateSnapshot implements api.SnapshotsBackend: the snapshot is ready at
// once, with external ID "snap-" + its ID and the source's capacity.
func (b *Backend) CreateSnapshot(_ context.Context, spec runtime.SnapshotSpec) (runtime.Snapshot, error) {
	if err := spec.Validate(); err != nil {
		return runtime.Snapshot{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("CreateSnapshot"); err != nil {
		return runtime.Snapshot{}, err
	}
	v, ok := b.volumes[spec.SourceVolume]
	switch {
	case !ok:
		return runtime.Snapshot{}, kinderr.Errorf(runtime.ErrNotFound, "source_volume: volume %q not found", spec.SourceVolume)
	case v.v.Plugin != spec.Plugin:
		return runtime.Snapshot{}, kinderr.Errorf(runtime.ErrInvalid, "source_volume: volume %q is of plugin %q, not %q", spec.SourceVolume, v.v.Plugin, spec.Plugin)
	}
	if s, ok := b.snaps[spec.ID]; ok {
		if s.SourceVolume != spec.SourceVolume || s.Plugin != spec.Plugin || !maps.Equal(s.Parameters, spec.Parameters) {
			return runtime.Snapshot{}, kinderr.Errorf(runtime.ErrConflict, "snapshot %q is already recorded with a different definition", spec.ID)
		}
		return s, nil
	}
	now := b.now().UTC()
	s := runtime.Snapshot{
		ID: spec.ID, Plugin: spec.Plugin, SourceVolume: spec.SourceVolume, SourceExternalID: v.v.ExternalID,
		Parameters: maps.Clone(spec.Parameters), ExternalID: "snap-" + spec.ID, SizeBytes: v.v.CapacityBytes,
		CreationTime: now, ReadyToUse: true, State: "ready", Registered: true, CreatedAt: now, UpdatedAt: now,
	}
	if b.snaps == nil {
		b.snaps = map[string]runtime.Snapshot{}
	}
	b.snaps[spec.ID] = s
	b.publishLocked(runtime.Event{Type: runtime.EventSnapshotCreated, Plugin: s.Plugin, Volume: s.SourceVolume, Snapshot: s.ID, Message: "snapshot taken"})
	return s, nil
}

// DeleteSnapshot implements api.SnapshotsBackend.
func (b *Backend) DeleteSnapshot(_ context.Context, id string) error {
	if err := runtime.ValidateID("id", id); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("DeleteSnapshot"); err != nil {
		return err
	}
	s, ok := b.snaps[id]
	if !ok {
		return kinderr.Errorf(runtime.ErrNotFound, "snapshot %q not found", id)
	}
	delete(b.snaps, id)
	b.publishLocked(runtime.Event{Type: runtime.EventSnapshotDeleted, Plugin: s.Plugin, Volume: s.SourceVolume, Snapshot: id, Message: "snapshot deleted"})
	return nil
}

// Snapshot implements api.SnapshotsBackend.
func (b *Backend) Snapshot(_ context.Context, id string) (runtime.Snapshot, error) {
	if err := runtime.ValidateID("id", id); err != nil {
		return runtime.Snapshot{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("Snapshot"); err != nil {
		return runtime.Snapshot{}, err
	}
	s, ok := b.snaps[id]
	if !ok {
		return runtime.Snapshot{}, kinderr.Errorf(runtime.ErrNotFound, "snapshot %q not found", id)
	}
	return s, nil
}

// Snapshots implements api.SnapshotsBackend: the recorded snapshots f
// matches, by ID (the fake's plugins list none of their own).
func (b *Backend) Snapshots(_ context.Context, f runtime.SnapshotFilter) ([]runtime.Snapshot, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.failLocked("Snapshots"); err != nil {
		return nil, err
	}
	out := []runtime.Snapshot{}
	for _, id := range slices.Sorted(maps.Keys(b.snaps)) {
		s := b.snaps[id]
		if (f.Plugin == "" || f.Plugin == s.Plugin) && (f.Volume == "" || f.Volume == s.SourceVolume) {
			out = append(out, s)
		}
	}
	return out, nil
}
