package registry

import (
	"errors"

	"github.com/csiactor/csiactor/actors/plugin"
)

var (
	// ErrPluginNotFound is returned when no allocation of the plugin (or of
	// the plugin in the asked role) is registered.
	ErrPluginNotFound = errors.New("plugin not found")
	// ErrNoHealthyPlugin is returned by Client when the plugin has
	// allocations in the role but none is healthy.
	ErrNoHealthyPlugin = errors.New("no healthy plugin allocation")
	// ErrAllocationNotFound is returned for an unknown allocation ID.
	ErrAllocationNotFound = errors.New("allocation not found")
	// ErrConflict is returned by Register for an ID already registered
	// with a different spec, or a socket already used by another
	// allocation.
	ErrConflict = errors.New("conflicting allocation")
	// ErrBusy is returned by Register for an ID that is being
	// deregistered.
	ErrBusy = errors.New("allocation is being deregistered")
	// ErrStopped is returned after Shutdown.
	ErrStopped = errors.New("plugin registry stopped")
	// ErrInvalidConfig is returned by Config.Validate; the message names
	// the field.
	ErrInvalidConfig = errors.New("invalid registry config")
	// ErrStore wraps a failure of the store.
	ErrStore = errors.New("store failed")
)

// UnhealthyError is the error Client returns when Plugin has allocations
// in Role but none is healthy (a restarting plugin, for one). It matches
// ErrNoHealthyPlugin with errors.Is; callers that wait for the plugin find
// which one with errors.As.
type UnhealthyError struct {
	Plugin string
	Role   plugin.Role
	// Msg says which allocation is the newest and why it is unhealthy.
	Msg string
}

func (e *UnhealthyError) Error() string { return e.Msg }

// Is reports whether target is ErrNoHealthyPlugin.
func (e *UnhealthyError) Is(target error) bool { return target == ErrNoHealthyPlugin }
