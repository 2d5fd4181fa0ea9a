package runtime

import (
	"context"
	"fmt"

	"github.com/csiactor/csiactor/actors/volume"
)

// Event types of a modification.
const (
	EventVolumeModifying    = volume.EventVolumeModifying
	EventVolumeModified     = volume.EventVolumeModified
	EventVolumeModifyFailed = volume.EventVolumeModifyFailed
)

// ModifyRequest is the body of a modify request.
type ModifyRequest struct {
	// MutableParameters are the mutable parameters to change; those not
	// named keep their values.
	MutableParameters map[string]string `json:"mutable_parameters"`
}

// Validate checks r; the error is a *FieldError naming the bad field.
func (r ModifyRequest) Validate() error {
	if len(r.MutableParameters) == 0 {
		return fieldErr("mutable_parameters", "must name at least one parameter")
	}
	if _, ok := r.MutableParameters[""]; ok {
		return fieldErr("mutable_parameters", "a parameter name is empty")
	}
	return nil
}

// ModifyVolume changes the mutable parameters of volume id through its
// plugin's controller (ControllerModifyVolume, MODIFY_VOLUME). It returns
// when the plugin applied them, with the volume, whose
// MutableParameters merge them into those applied before. The
// modification is persisted before its first RPC and resumed after a
// crash; a caller that gives up (ctx) leaves it running. In a cluster, a
// host without a controller of the plugin sends the call to the plugin's
// controller leader, and every host's record gets the parameters.
//
// It fails with ErrInvalid for no parameters, for a plugin without the
// MODIFY_VOLUME capability (the message names it) and for a parameter the
// plugin refuses (InvalidArgument; the plugin's message names it), with
// ErrConflict while another modification of the volume is in progress,
// and with ErrNotFound for an unknown volume.
func (r *Runtime) ModifyVolume(ctx context.Context, id string, req ModifyRequest) (Volume, error) {
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
	v, err := waitOut(ctx, pluginWaiter{r: r, op: "modification", vol: id}, func() (volume.Volume, error) {
		return r.volumes.Modify(ctx, id, req.MutableParameters)
	})
	if err != nil {
		return Volume{}, mapErr(err)
	}
	if err := r.shareMutableParameters(ctx, id, v.MutableParameters); err != nil {
		return Volume{}, fmt.Errorf("volume %q is modified, but the cluster's definition does not say so yet (modify it again): %w", id, err)
	}
	return volumeFromManager(v), nil
}
