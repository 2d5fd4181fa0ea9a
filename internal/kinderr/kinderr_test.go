package kinderr_test

import (
	"errors"
	"io/fs"
	"testing"

	"github.com/csiactor/csiactor/internal/kinderr"
)

var errNotFound = errors.New("not found")

func TestErrorf_ReadsAsMessageAndMatchesKind(t *testing.T) {
	cause := &fs.PathError{Op: "open", Path: "/x", Err: fs.ErrNotExist}
	err := kinderr.Errorf(errNotFound, "volume %q is gone: %w", "v1", cause)
	if got, want := err.Error(), `volume "v1" is gone: open /x: file does not exist`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(err, errNotFound) {
		t.Error("errors.Is(err, kind) is false")
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Error("errors.Is does not see the %w cause")
	}
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe != cause {
		t.Error("errors.As does not find the %w cause")
	}
}

func TestNew_SubSentinel(t *testing.T) {
	errLimit := kinderr.New(errNotFound, "limit reached")
	err := kinderr.Errorf(errLimit, "alloc %q holds it", "a")
	if err.Error() != `alloc "a" holds it` {
		t.Errorf("Error() = %q", err.Error())
	}
	if !errors.Is(err, errLimit) || !errors.Is(err, errNotFound) {
		t.Error("the error does not match both sentinels")
	}
	if errLimit.Error() != "limit reached" {
		t.Errorf("sentinel reads %q", errLimit.Error())
	}
}
