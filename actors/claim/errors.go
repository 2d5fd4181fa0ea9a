package claim

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalid is returned for a request that can never succeed as
	// given: a bad name, an unknown mode, a capability the volume does not
	// have. The message names the field.
	ErrInvalid = errors.New("invalid claim")
	// ErrConflict is the root of every error that says the request
	// conflicts with the volume's current claims; errors.Is(err,
	// ErrConflict) is true for ErrClaimLimit and ErrInUse too.
	ErrConflict = errors.New("claim conflict")
	// ErrClaimLimit is returned when the volume's access mode allows no
	// more claims of the requested mode. It wraps ErrConflict.
	ErrClaimLimit = fmt.Errorf("%w: claim limit reached", ErrConflict)
	// ErrInUse is returned when an allocation's earlier claim on the volume
	// is still being released, so a new claim would reuse its paths. It
	// wraps ErrConflict.
	ErrInUse = fmt.Errorf("%w: in use", ErrConflict)
	// ErrPluginUnavailable is returned (wrapped) when no client could be had
	// for the plugin: it is not registered, or has no healthy allocation.
	ErrPluginUnavailable = errors.New("plugin unavailable")
)
