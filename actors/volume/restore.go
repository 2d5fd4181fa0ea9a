package volume

import (
	"context"
	"fmt"
)

// Snapshots gives Create the snapshots it restores volumes from; the
// runtime implements it with the snapshot manager.
type Snapshots interface {
	// Hold takes snapshot id for a restore into a volume of plugin and
	// returns the plugin's ID of the snapshot. Until release is called,
	// the snapshot cannot be deleted. It fails (naming
	// content_source.snapshot) for a snapshot that is unknown, of another
	// plugin, not ready, or of a plugin without CREATE_DELETE_SNAPSHOT.
	Hold(ctx context.Context, id, plugin string) (externalID string, release func(), err error)
}

// resolveSnapshot holds spec.FromSnapshot, the snapshot Create restores,
// and fills in its external ID. The caller calls release once the create
// has ended.
func (m *Manager) resolveSnapshot(ctx context.Context, spec Spec) (Spec, func(), error) {
	if spec.FromSnapshot == "" {
		return spec, func() {}, nil
	}
	if spec.CloneOf != "" {
		return spec, nil, fmt.Errorf("%w: content_source: give snapshot or volume, not both", ErrInvalid)
	}
	if m.cfg.Snapshots == nil {
		return spec, nil, fmt.Errorf("%w: content_source.snapshot: this agent restores no snapshots", ErrInvalid)
	}
	ext, release, err := m.cfg.Snapshots.Hold(ctx, spec.FromSnapshot, spec.Plugin)
	if err != nil {
		return spec, nil, err
	}
	spec.snapshotSource = ext
	return spec, release, nil
}
