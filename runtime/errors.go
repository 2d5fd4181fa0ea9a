package runtime

import (
	"errors"
	"strings"
)

// Sentinel errors of the runtime. The HTTP API maps each to a status code;
// check for them with errors.Is.
var (
	// ErrInvalid is returned for bad input: a malformed ID, an unknown
	// access mode, a missing field. The HTTP API answers 400. Validation
	// errors are [*FieldError]s that unwrap to it.
	ErrInvalid = errors.New("invalid argument")
	// ErrNotFound is returned for an unknown plugin, allocation, volume or
	// claim. The HTTP API answers 404.
	ErrNotFound = errors.New("not found")
	// ErrConflict is returned when a request clashes with the current
	// state: a claim over the access mode's limit, deregistering a volume
	// that is still claimed, registering an ID again with a different
	// definition. The HTTP API answers 409.
	ErrConflict = errors.New("conflict")
	// ErrPluginUnavailable is returned when no healthy allocation of the
	// plugin (of the needed type) can serve the request. The HTTP API
	// answers 503.
	ErrPluginUnavailable = errors.New("plugin unavailable")
	// ErrShutdown is returned by calls made while or after the runtime shuts
	// down. The HTTP API answers 503.
	ErrShutdown = errors.New("runtime shutting down")
	// ErrDataDirInUse is returned by Start when another runtime (in this
	// process or another) holds the store in the data directory. The error
	// also wraps persistence.ErrInUse.
	ErrDataDirInUse = errors.New("data dir in use by another csiactor agent")
	// ErrStoreLost is returned by Start when the store file is missing or
	// empty but the data dir holds what an earlier agent left (plugin or
	// volume directories): a new store would forget every allocation and
	// claim and orphan their mounts, so nothing is created or overwritten.
	ErrStoreLost = errors.New("store lost")
	// ErrClusterUnavailable is returned in cluster mode when etcd cannot
	// be reached or this host's lease was not renewed in time: a new
	// claim cannot be admitted safely. Published claims keep working.
	// The HTTP API answers 503.
	ErrClusterUnavailable = errors.New("cluster unavailable")
)

// FieldError is a validation error that names the bad field, as a dotted
// path with list indexes ("capabilities[1].access_mode",
// "plugins.heartbeat_interval"). It unwraps to [ErrInvalid] and, when the
// check came from a parser, to that parser's error too.
//
// Messages never contain secret values or mount flags.
type FieldError struct {
	// Field is the path of the bad field.
	Field string
	// Msg says what is wrong with it.
	Msg string
	// Err is the parser error behind Msg, if any.
	Err error
}

// Error returns "field: msg".
func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// Unwrap returns ErrInvalid and the underlying parser error, if any.
func (e *FieldError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrInvalid, e.Err}
	}
	return []error{ErrInvalid}
}

// fieldErr builds a *FieldError.
func fieldErr(field, msg string) *FieldError { return &FieldError{Field: field, Msg: msg} }

// prefixed returns err with prefix joined in front of its field path, when
// err is a *FieldError; other errors come back unchanged.
func prefixed(prefix string, err error) error {
	var fe *FieldError
	if err == nil || !errors.As(err, &fe) {
		return err
	}
	f := fe.Field
	switch {
	case f == "":
		f = prefix
	case strings.HasPrefix(f, "["):
		f = prefix + f
	default:
		f = prefix + "." + f
	}
	return &FieldError{Field: f, Msg: fe.Msg, Err: fe.Err}
}
