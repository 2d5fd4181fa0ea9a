package claim

import "errors"

var (
	// ErrInvalid is returned for a request that can never succeed as
	// given: a bad name, an unknown mode, a capability the volume does not
	// have. The message names the field.
	ErrInvalid = errors.New("invalid argument")
	// ErrConflict is the root of every error that says the request
	// conflicts with the current state (of a volume's claims, or of the
	// volumes registered); errors.Is(err, ErrConflict) is true for
	// ErrClaimLimit and ErrInUse too.
	ErrConflict = errors.New("conflict")
	// ErrClaimLimit is returned when the volume's access mode allows no
	// more claims of the requested mode. It matches ErrConflict.
	ErrClaimLimit error = &subError{msg: "claim limit reached", parent: ErrConflict}
	// ErrInUse is returned when an allocation's earlier claim on the volume
	// is still being released, so a new claim would reuse its paths. It
	// matches ErrConflict.
	ErrInUse error = &subError{msg: "in use", parent: ErrConflict}
	// ErrPluginUnavailable is returned (wrapped) when no client could be had
	// for the plugin: it is not registered, or has no healthy allocation.
	ErrPluginUnavailable = errors.New("plugin unavailable")
)

// subError is a sentinel that matches a more general one (errors.Is)
// without repeating its text: ErrClaimLimit reads "claim limit reached",
// not "conflict: claim limit reached".
type subError struct {
	msg    string
	parent error
}

func (e *subError) Error() string { return e.msg }
func (e *subError) Unwrap() error { return e.parent }
