package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// EphemeralSpec is the ephemeral part of a claim ([ClaimRequest.Ephemeral]):
// the volume the claim creates for itself when its volume ID is not
// registered. The volume is created through Plugin's controller
// (CreateVolume named by the volume ID), marked ephemeral, and deleted
// through the controller once its last claim is freed.
type EphemeralSpec struct {
	// Plugin is the plugin whose controller creates the volume.
	Plugin string `json:"plugin"`
	// CapacityBytes is the size asked for; 0 lets the plugin choose.
	CapacityBytes int64 `json:"capacity_bytes,omitempty"`
	// Parameters go to CreateVolume.
	Parameters map[string]string `json:"parameters,omitempty"`
	// Capability is the volume's one capability. Its access and attachment
	// modes may be left empty (they are the claim's); given, they must be
	// the claim's.
	Capability EphemeralCapability `json:"capability"`
}

// EphemeralCapability is an ephemeral volume's capability: an access and an
// attachment mode, and for a file-system volume its mount options (as a
// volume's mount_options). Mount flags are input only: String and GoString
// show how many there are.
type EphemeralCapability struct {
	AccessMode     string   `json:"access_mode,omitempty"`
	AttachmentMode string   `json:"attachment_mode,omitempty"`
	FSType         string   `json:"fs_type,omitempty"`
	MountFlags     []string `json:"mount_flags,omitempty"`
}

// String prints c without its mount flags.
func (c EphemeralCapability) String() string {
	return fmt.Sprintf("{access_mode=%q attachment_mode=%q fs_type=%q mount_flags=[%d redacted]}",
		c.AccessMode, c.AttachmentMode, c.FSType, len(c.MountFlags))
}

// GoString is String, so that %#v redacts too.
func (c EphemeralCapability) GoString() string { return "runtime.EphemeralCapability" + c.String() }

// volumeSpec returns s as the register part of a create request for a claim
// of req, checking it; the error is a *FieldError naming the bad field
// (without the "ephemeral." prefix).
func (s *EphemeralSpec) volumeSpec(req ClaimRequest) (VolumeSpec, error) {
	c := Capability{AccessMode: s.Capability.AccessMode, AttachmentMode: s.Capability.AttachmentMode}
	switch {
	case c.AccessMode != "" && c.AccessMode != req.AccessMode:
		return VolumeSpec{}, fieldErr("capability.access_mode", fmt.Sprintf("%q differs from the claim's access_mode %q", c.AccessMode, req.AccessMode))
	case c.AttachmentMode != "" && c.AttachmentMode != req.AttachmentMode:
		return VolumeSpec{}, fieldErr("capability.attachment_mode", fmt.Sprintf("%q differs from the claim's attachment_mode %q", c.AttachmentMode, req.AttachmentMode))
	case s.CapacityBytes < 0:
		return VolumeSpec{}, fieldErr("capacity_bytes", fmt.Sprintf("%d is negative", s.CapacityBytes))
	}
	vs := VolumeSpec{
		Plugin:       s.Plugin,
		Capabilities: []Capability{{AccessMode: req.AccessMode, AttachmentMode: req.AttachmentMode}},
		Parameters:   s.Parameters,
	}
	if s.Capability.FSType != "" || len(s.Capability.MountFlags) > 0 {
		vs.MountOptions = &MountOptions{FSType: s.Capability.FSType, MountFlags: s.Capability.MountFlags}
	}
	if err := vs.validate(); err != nil {
		// mount_options is capability here.
		var fe *FieldError
		if errors.As(err, &fe) && strings.HasPrefix(fe.Field, "mount_options") {
			return VolumeSpec{}, &FieldError{Field: "capability" + strings.TrimPrefix(fe.Field, "mount_options"), Msg: fe.Msg, Err: fe.Err}
		}
		return VolumeSpec{}, err
	}
	return vs, nil
}

// claimEphemeral is Claim with req.Ephemeral set: see ClaimRequest.
func (r *Runtime) claimEphemeral(ctx context.Context, volumeID string, req ClaimRequest) (Claim, error) {
	if r.cluster != nil {
		return Claim{}, fieldErr("ephemeral", "ephemeral volumes are not available in cluster mode: create the volume (POST /v1/volumes) and claim it")
	}
	vr, err := r.claimRequest(volumeID, req)
	if err != nil {
		return Claim{}, err
	}
	vs, _ := req.Ephemeral.volumeSpec(req) // checked by claimRequest
	spec, err := volumeSpec(volumeID, vs)
	if err != nil {
		return Claim{}, prefixed("ephemeral", err)
	}
	spec.CapacityBytes = req.Ephemeral.CapacityBytes
	c, err := r.volumes.ClaimEphemeral(ctx, vr, spec)
	if err != nil {
		return Claim{}, mapErr(err)
	}
	return claimFromManager(c), nil
}
