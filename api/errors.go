package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/csiactor/csiactor/runtime"
)

// ErrBadAddress is returned by NewClient for an address that is neither
// unix:///path nor http(s)://host:port.
var ErrBadAddress = errors.New("bad agent address")

// ErrUnauthorized is what an [*Error] with status 401 unwraps to: the agent's
// TCP listener wants "Authorization: Bearer <token>" ([WithToken]) and got
// none or a wrong one.
var ErrUnauthorized = errors.New("unauthorized")

// Error is an error answer of the agent: its HTTP status and the message of
// its {"error": "..."} body. It unwraps to the runtime sentinel of its
// status (400 runtime.ErrInvalid, 404 ErrNotFound, 409 ErrConflict, 503
// ErrPluginUnavailable), so errors.Is works the same on a Client as on the
// runtime itself; a 401 unwraps to [ErrUnauthorized].
type Error struct {
	Status  int
	Message string
}

// Error returns the agent's message.
func (e *Error) Error() string { return e.Message }

// Unwrap returns the runtime sentinel for e's status, ErrUnauthorized for
// 401, or nil.
func (e *Error) Unwrap() error {
	switch e.Status {
	case http.StatusBadRequest:
		return runtime.ErrInvalid
	case http.StatusNotFound:
		return runtime.ErrNotFound
	case http.StatusConflict:
		return runtime.ErrConflict
	case http.StatusServiceUnavailable:
		return runtime.ErrPluginUnavailable
	case http.StatusUnauthorized:
		return ErrUnauthorized
	}
	return nil
}

// UnreachableError is returned by a Client when no agent answers at its
// address (nothing listens there, or the connection was refused).
type UnreachableError struct {
	// Address is the agent address the client was given.
	Address string
	// Err is the dial error.
	Err error
}

// Error says where the client looked and what to do about it.
func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the agent at %s: %s; is `csiactor agent` running? set -address or CSIACTOR_ADDR",
		e.Address, e.Err.Error())
}

// Unwrap returns the dial error.
func (e *UnreachableError) Unwrap() error { return e.Err }
