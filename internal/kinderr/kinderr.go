// Package kinderr builds errors that read as one sentence for an operator
// and still match a sentinel.
//
// # Basics
//
// fmt.Errorf("%w: volume %q", ErrNotFound, id) reads "not found: volume
// "v1"", and each layer that wraps it that way adds another prefix
// ("registry: plugin not found: ..."). [Errorf] keeps the sentinel out of
// the text:
//
//	kinderr.Errorf(ErrNotFound, "volume %q is not registered", id)
//
// reads `volume "v1" is not registered`, and errors.Is(err, ErrNotFound)
// holds. A %w in format is kept in the chain as with fmt.Errorf, so
// errors.Is and errors.As see through it too.
package kinderr

import "fmt"

// Errorf returns an error whose message is the formatted text only and
// which matches kind (and any error format wraps with %w) with errors.Is
// and errors.As.
func Errorf(kind error, format string, a ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, a...)}
}

// New returns a sentinel that reads msg and matches kind: a more precise
// sentinel than kind (ErrClaimLimit, a kind of ErrConflict), without
// kind's text in its own.
func New(kind error, msg string) error {
	return &kindError{kind: kind, err: plain(msg)}
}

type plain string

func (p plain) Error() string { return string(p) }

type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string { return e.err.Error() }

// Unwrap returns the kind and the formatted error (which unwraps to what
// format wrapped with %w).
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }
