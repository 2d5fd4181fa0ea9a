package csiplugin

import "errors"

var (
	// ErrInvalidConfig is returned by Config.Validate, New and Run for a
	// configuration that cannot work; the message names the field.
	ErrInvalidConfig = errors.New("csiplugin: invalid config")
	// ErrEndpointInUse is returned by Run when another process already
	// answers on the endpoint's socket.
	ErrEndpointInUse = errors.New("csiplugin: endpoint in use")
	// ErrStateDirLocked is returned by New when another plugin instance
	// holds the state directory.
	ErrStateDirLocked = errors.New("csiplugin: state dir locked by another instance")
	// ErrCorruptState is returned by New when the state file exists but
	// cannot be decoded.
	ErrCorruptState = errors.New("csiplugin: corrupt state file")
	// ErrStopped is returned by Serve after Stop.
	ErrStopped = errors.New("csiplugin: plugin stopped")
)
