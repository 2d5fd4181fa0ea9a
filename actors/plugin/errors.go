package plugin

import "errors"

var (
	// ErrInvalidSpec is returned by Spec.Validate; the message names the
	// field.
	ErrInvalidSpec = errors.New("invalid allocation spec")
	// ErrInvalidConfig is returned by Config.Validate; the message names
	// the field.
	ErrInvalidConfig = errors.New("invalid plugin config")
	// ErrNotReady is the fingerprint error of a plugin whose Probe answers
	// ready=false: it is still starting.
	ErrNotReady = errors.New("plugin is not ready")
)
