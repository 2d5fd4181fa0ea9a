package snapshot

import (
	"errors"

	"github.com/csiactor/csiactor/actors/claim"
)

var (
	// ErrNotFound is returned for a snapshot that is not recorded here,
	// and (wrapped, naming the field) for a source volume that is not
	// registered.
	ErrNotFound = errors.New("not found")
	// ErrInvalid is returned for bad input; the message names the field.
	// Nothing is changed.
	ErrInvalid = claim.ErrInvalid
	// ErrConflict is returned for a request the snapshot's state does not
	// allow: the same ID with another definition, deleting a snapshot
	// that is being created or restored from, restoring one that is not
	// ready.
	ErrConflict = claim.ErrConflict
	// ErrPluginUnavailable is returned (wrapped) when the plugin has no
	// usable controller.
	ErrPluginUnavailable = claim.ErrPluginUnavailable
	// ErrPluginCall is returned (wrapping the plugin's error) when the
	// plugin refused CreateSnapshot or DeleteSnapshot for good.
	ErrPluginCall = errors.New("plugin call failed")
	// ErrShutdown is returned once Shutdown has been called, and to the
	// callers of a request the actor lost when it restarted.
	ErrShutdown = errors.New("snapshot manager shut down")
)
