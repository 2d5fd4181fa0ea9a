package claim

import (
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/kinderr"
	"github.com/csiactor/csiactor/persistence"
)

// Request is a claim as asked for by an allocation.
type Request struct {
	Alloc string
	Mode  Mode
	// Capability is the access and attachment mode asked for; mount
	// options come from the volume.
	Capability csi.VolumeCapability
	// Options are the claim's own publish options.
	Options Options
}

// Validate checks the request's own fields, naming the bad one.
func (r Request) Validate() error {
	if err := CheckName("alloc", r.Alloc); err != nil {
		return err
	}
	if _, err := ParseMode(string(r.Mode)); err != nil {
		return err
	}
	if !r.Capability.AccessMode.Valid() {
		return kinderr.Errorf(ErrInvalid, "unknown access_mode %s", r.Capability.AccessMode)
	}
	if !r.Capability.AttachmentMode.Valid() {
		return kinderr.Errorf(ErrInvalid, "unknown attachment_mode %s", r.Capability.AttachmentMode)
	}
	if r.Mode == ModeWrite && r.Capability.AccessMode.ReadOnly() {
		return kinderr.Errorf(ErrInvalid, "mode write is not allowed with access_mode %s", r.Capability.AccessMode)
	}
	return r.Options.validate(r.Capability.AttachmentMode)
}

// same reports whether c is the claim r asks for.
func (r Request) same(v *persistence.Volume, c *persistence.Claim) bool {
	return c.Mode == string(r.Mode) &&
		c.AccessMode == r.Capability.AccessMode.String() &&
		c.AttachmentMode == r.Capability.AttachmentMode.String() &&
		r.Options.differ(optionsOf(v, c)) == ""
}

// Admit decides whether r may be reserved on v, by the access-mode table (one
// host: "node" is this host):
//
//	access mode                                     readers  writers
//	single-node-reader-only                         one      none
//	single-node-writer, single-node-single-writer   one claim in all
//	single-node-multi-writer                        any      any
//	multi-node-reader-only                          any      none
//	multi-node-single-writer                        any      one
//	multi-node-multi-writer                         any      any
//
// Claims that hold a place are the current claims and the past claims still
// published on the host (state taken). All of them must use the same access
// and attachment mode.
//
// When the allocation already holds the same claim (same mode and
// capability), Admit returns its index in v.Claims and no error: the caller
// reports that claim (the request is idempotent). Otherwise it returns -1 and
// either nil (reserve it) or an error wrapping ErrInvalid, ErrConflict,
// ErrInUse or ErrClaimLimit.
func Admit(v *persistence.Volume, r Request) (int, error) {
	if err := r.Validate(); err != nil {
		return -1, err
	}
	if !hasCapability(v, r.Capability) {
		return -1, kinderr.Errorf(ErrInvalid, "volume %q has no capability %s/%s",
			v.ID, r.Capability.AccessMode, r.Capability.AttachmentMode)
	}
	if i := FindClaim(v.Claims, r.Alloc); i >= 0 {
		c := &v.Claims[i]
		if r.same(v, c) {
			return i, nil
		}
		if d := r.Options.differ(optionsOf(v, c)); d != "" && c.Mode == string(r.Mode) &&
			c.AccessMode == r.Capability.AccessMode.String() && c.AttachmentMode == r.Capability.AttachmentMode.String() {
			return -1, kinderr.Errorf(ErrConflict,
				"alloc %q already holds a %s claim on volume %q with other options: %s", r.Alloc, c.Mode, v.ID, d)
		}
		return -1, kinderr.Errorf(ErrConflict,
			"alloc %q already holds a %s claim with %s/%s on volume %q", r.Alloc, c.Mode, c.AccessMode, c.AttachmentMode, v.ID)
	}
	if i := FindClaim(v.PastClaims, r.Alloc); i >= 0 {
		return -1, kinderr.Errorf(ErrInUse,
			"the previous claim of alloc %q on volume %q is still being released (state %s)", r.Alloc, v.ID, v.PastClaims[i].State)
	}

	var readers, writers int
	var holder, writer string // an alloc holding a place; the writer's
	count := func(c *persistence.Claim) error {
		if c.AccessMode != r.Capability.AccessMode.String() || c.AttachmentMode != r.Capability.AttachmentMode.String() {
			return kinderr.Errorf(ErrConflict,
				"volume %q is claimed with %s/%s by alloc %q", v.ID, c.AccessMode, c.AttachmentMode, c.Alloc)
		}
		if err := admitOptions(v, r, c); err != nil {
			return err
		}
		if c.Mode == string(ModeWrite) {
			writers++
			writer = c.Alloc
		} else {
			readers++
		}
		holder = c.Alloc
		return nil
	}
	for i := range v.Claims {
		if err := count(&v.Claims[i]); err != nil {
			return -1, err
		}
	}
	for i := range v.PastClaims {
		if v.PastClaims[i].State == StateTaken {
			if err := count(&v.PastClaims[i]); err != nil {
				return -1, err
			}
		}
	}

	am := r.Capability.AccessMode
	switch am {
	case csi.AccessModeSingleNodeReaderOnly:
		if readers > 0 {
			return -1, kinderr.Errorf(ErrClaimLimit, "access mode %s allows one reader and alloc %q holds it", am, holder)
		}
	case csi.AccessModeSingleNodeWriter, csi.AccessModeSingleNodeSingleWriter:
		if readers+writers > 0 {
			return -1, kinderr.Errorf(ErrClaimLimit, "access mode %s allows one claim and alloc %q holds it", am, holder)
		}
	case csi.AccessModeMultiNodeSingleWriter:
		if r.Mode == ModeWrite && writers > 0 {
			return -1, kinderr.Errorf(ErrClaimLimit, "access mode %s allows one writer and alloc %q holds it", am, writer)
		}
	}
	return -1, nil
}

func hasCapability(v *persistence.Volume, c csi.VolumeCapability) bool {
	for _, vc := range v.Capabilities {
		if vc.AccessMode == c.AccessMode.String() && vc.AttachmentMode == c.AttachmentMode.String() {
			return true
		}
	}
	return false
}

// FindClaim returns the index of alloc's claim in claims, or -1.
func FindClaim(claims []persistence.Claim, alloc string) int {
	for i := range claims {
		if claims[i].Alloc == alloc {
			return i
		}
	}
	return -1
}

// FindStaging returns the index of the staging at path in v, or -1.
func FindStaging(v *persistence.Volume, path string) int {
	for i := range v.Stagings {
		if v.Stagings[i].Path == path {
			return i
		}
	}
	return -1
}
