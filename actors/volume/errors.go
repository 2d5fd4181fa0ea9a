package volume

import (
	"errors"

	"github.com/csiactor/csiactor/actors/claim"
)

var (
	// ErrNotFound is returned for a volume that is not registered, and by
	// Release for an allocation that holds no claim on the volume.
	ErrNotFound = errors.New("volume: not found")
	// ErrInvalid is returned for bad input; the message names the field.
	// Nothing is changed.
	ErrInvalid = claim.ErrInvalid
	// ErrConflict is the root of every conflict with the volume's current
	// state: registering an ID again with a different definition, a claim
	// the access mode does not allow, deregistering a claimed volume.
	// errors.Is(err, ErrConflict) holds for ErrClaimLimit and ErrInUse.
	ErrConflict = claim.ErrConflict
	// ErrClaimLimit is returned by Claim when the volume's access mode
	// allows no more claims of the requested mode. It wraps ErrConflict.
	ErrClaimLimit = claim.ErrClaimLimit
	// ErrInUse is returned by Deregister and Delete while the volume has
	// claims or past claims not yet freed, and by Claim while the same
	// allocation's previous claim is still being released. It wraps
	// ErrConflict.
	ErrInUse = claim.ErrInUse
	// ErrPluginUnavailable is returned (wrapped) when the plugin has no
	// usable allocation for a call that cannot wait: a new claim, a create,
	// a delete.
	ErrPluginUnavailable = claim.ErrPluginUnavailable
	// ErrClaimFailed is returned (wrapping the plugin's error) by Claim when
	// a publish step failed for good: the plugin refused it, or it kept
	// failing for Config.MaxClaimAttempts attempts. The claim has been
	// turned into a past claim and is being torn down.
	ErrClaimFailed = errors.New("volume: claim failed")
	// ErrReleased is returned by Claim when the claim was released before
	// it was published.
	ErrReleased = errors.New("volume: claim released before it was published")
	// ErrPluginCall is returned (wrapping the plugin's error) by Create and
	// Delete when the plugin refused the call.
	ErrPluginCall = errors.New("volume: plugin call failed")
	// ErrVolumeFailed is returned when the volume's actor kept crashing
	// while handling the request. Its persisted state is intact; a later
	// call starts it again.
	ErrVolumeFailed = errors.New("volume: volume actor failed")
	// ErrShutdown is returned by every method after Shutdown has begun.
	ErrShutdown = errors.New("volume: manager shut down")
	// ErrInvalidConfig is returned by Config.Validate and NewManager; the
	// message names the field.
	ErrInvalidConfig = errors.New("volume: invalid config")
)
