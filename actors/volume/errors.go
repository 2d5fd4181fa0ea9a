package volume

import (
	"errors"
	"fmt"

	"github.com/csiactor/csiactor/actors/claim"
)

var (
	// ErrNotFound is returned for a volume that is not registered, by
	// Release for an allocation that holds no claim on the volume, and by
	// Register when the plugin says it has no volume with the external ID.
	ErrNotFound = errors.New("not found")
	// ErrInvalid is returned for bad input; the message names the field.
	// Nothing is changed. Register also returns it when the plugin does
	// not confirm the volume's capabilities (ValidateVolumeCapabilities).
	ErrInvalid = claim.ErrInvalid
	// ErrConflict is the root of every conflict with the current state:
	// registering an ID again with a different definition, registering (or
	// creating) a volume of a plugin that is already registered under
	// another ID, a claim the access mode does not allow, deregistering a
	// claimed volume. errors.Is(err, ErrConflict) holds for ErrClaimLimit
	// and ErrInUse.
	ErrConflict = claim.ErrConflict
	// ErrClaimLimit is returned by Claim when the volume's access mode
	// allows no more claims of the requested mode. It matches ErrConflict.
	ErrClaimLimit = claim.ErrClaimLimit
	// ErrInUse is returned by Deregister and Delete while the volume has
	// claims or past claims not yet freed, and by Claim while the same
	// allocation's previous claim is still being released. It matches
	// ErrConflict.
	ErrInUse = claim.ErrInUse
	// ErrOutsideTopology is returned by Claim when the volume is not
	// reachable from this host's node topology. It matches ErrConflict.
	ErrOutsideTopology = fmt.Errorf("%w: outside the volume's topology", ErrConflict)
	// ErrNodeVolumeLimit is returned by Claim when the node plugin's
	// max_volumes_per_node is reached by other volumes. It matches
	// ErrConflict.
	ErrNodeVolumeLimit = fmt.Errorf("%w: node volume limit reached", ErrConflict)
	// ErrPluginUnavailable is returned (wrapped) when the plugin has no
	// usable allocation for a call that cannot wait: a new claim, a create,
	// a delete.
	ErrPluginUnavailable = claim.ErrPluginUnavailable
	// ErrClaimFailed is returned (wrapping the plugin's error) by Claim when
	// a publish step failed for good: the plugin refused it, or (with a
	// positive Config.MaxClaimAttempts) it kept failing that many times.
	// The claim has been turned into a past claim and is being torn down.
	ErrClaimFailed = errors.New("claim failed")
	// ErrReleased is returned by Claim when the claim was released before
	// it was published.
	ErrReleased = errors.New("claim released before it was published")
	// ErrPluginCall is returned (wrapping the plugin's error) by Create and
	// Delete when the plugin refused the call, and by Register when
	// ValidateVolumeCapabilities failed finally for a reason other than
	// NotFound, InvalidArgument or Unimplemented.
	ErrPluginCall = errors.New("plugin call failed")
	// ErrVolumeFailed is returned when the volume's actor kept crashing
	// while handling the request. Its persisted state is intact; a later
	// call starts it again.
	ErrVolumeFailed = errors.New("volume actor failed")
	// ErrShutdown is returned by every method after Shutdown has begun.
	ErrShutdown = errors.New("volume manager shut down")
	// ErrInvalidConfig is returned by Config.Validate and NewManager; the
	// message names the field.
	ErrInvalidConfig = errors.New("invalid volume config")
)
