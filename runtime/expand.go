package runtime

import (
	"context"
	"fmt"

	"github.com/csiactor/csiactor/actors/volume"
)

// Event types of an expansion.
const (
	EventVolumeExpanding    = volume.EventVolumeExpanding
	EventVolumeExpanded     = volume.EventVolumeExpanded
	EventVolumeExpandFailed = volume.EventVolumeExpandFailed
)

// ExpandRequest is the body of an expand request.
type ExpandRequest struct {
	// CapacityBytes is the capacity the volume must have at least.
	CapacityBytes int64 `json:"capacity_bytes"`
}

// Validate checks r; the error is a *FieldError naming the bad field.
func (r ExpandRequest) Validate() error {
	if r.CapacityBytes <= 0 {
		return fieldErr("capacity_bytes", "must be positive")
	}
	return nil
}

// Expansion is a volume's expansion in progress: CapacityBytes, the
// capacity asked for, and Step, the RPC that runs (or is retried):
// ControllerExpandVolume or NodeExpandVolume.
type Expansion = volume.Expansion

// ExpandVolume grows the volume id to req.CapacityBytes through its plugin:
// ControllerExpandVolume when the controller has EXPAND_VOLUME, then, when
// the controller says so (or the plugin expands on the node only),
// NodeExpandVolume on the target path of every published claim. It
// returns when the expansion is done, with the new capacity. The
// expansion is persisted before its first RPC and resumed after a crash;
// a caller that gives up (ctx) leaves it running.
//
// It fails with ErrInvalid when the capacity is below the volume's
// (volumes do not shrink) or the plugin has no EXPAND_VOLUME capability,
// with ErrConflict while the volume is claimed and its plugin expands only
// offline, or while it is being expanded to another capacity, with
// ErrNotFound for an unknown volume, and with the plugin's refusal,
// classified like every plugin error.
func (r *Runtime) ExpandVolume(ctx context.Context, id string, req ExpandRequest) (Volume, error) {
	if err := ValidateID("id", id); err != nil {
		return Volume{}, err
	}
	if err := req.Validate(); err != nil {
		return Volume{}, err
	}
	if err := r.ready(); err != nil {
		return Volume{}, err
	}
	release, err := r.hold(ctx, id)
	if err != nil {
		return Volume{}, err
	}
	defer release()
	v, err := waitOut(ctx, pluginWaiter{r: r, op: "expansion", vol: id}, func() (volume.Volume, error) {
		return r.volumes.Expand(ctx, id, req.CapacityBytes)
	})
	if err != nil {
		return Volume{}, mapErr(err)
	}
	if err := r.shareCapacity(ctx, id, v.CapacityBytes); err != nil {
		return Volume{}, fmt.Errorf("volume %q is expanded to %d bytes, but the cluster's definition does not say so yet (expand it again): %w", id, v.CapacityBytes, err)
	}
	return volumeFromManager(v), nil
}
