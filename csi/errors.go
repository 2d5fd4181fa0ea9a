package csi

import "errors"

var (
	// ErrInvalidEndpoint is returned by Dial for an endpoint that is not a
	// usable unix:// address (bad scheme, empty or relative path, or a path
	// longer than the 107-byte unix socket limit).
	ErrInvalidEndpoint = errors.New("invalid plugin endpoint")
	// ErrInvalidCapability is returned when an access mode, attachment mode
	// or volume capability is unknown or inconsistent.
	ErrInvalidCapability = errors.New("invalid volume capability")
	// ErrClosed is returned by a Client's methods after Close.
	ErrClosed = errors.New("plugin connection closed")
	// ErrInvalidResponse is returned when a plugin's answer breaks the CSI
	// spec (a missing required field, for example).
	ErrInvalidResponse = errors.New("invalid response from the plugin")
	// ErrInvalidOption is returned by Dial and Backoff.Validate for an
	// option or setting out of range (a negative timeout, for example); the
	// message names the option.
	ErrInvalidOption = errors.New("invalid option")
)
