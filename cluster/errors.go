package cluster

import (
	"errors"
	"fmt"
)

var (
	// ErrUnavailable is returned when etcd cannot be reached, or this
	// host's lease was not renewed in time: a new claim cannot be
	// admitted safely. Published claims are not affected.
	ErrUnavailable = errors.New("etcd unavailable")
	// ErrConflict is returned by PutVolume when the volume ID is
	// registered in the cluster with another definition, and by
	// UpdateVolume when the definition changed since it was read.
	ErrConflict = errors.New("cluster conflict")
	// ErrInUse is returned by DeleteVolume while a host holds a claim on
	// the volume, and by UpdateVolume of a field a claim depends on.
	ErrInUse = errors.New("volume claimed in the cluster")
	// ErrInvalidConfig is returned by Open for a Config it cannot use;
	// the message names the field.
	ErrInvalidConfig = errors.New("invalid cluster config")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("cluster session closed")
)

// StaleError is returned by Admit when volume Volume's definition in etcd
// changed (updated, or removed) since this host applied the one at
// revision Applied to its record (see Session.Applied): a claim admitted
// now would be published with a definition the cluster no longer has.
// Wait with WaitApplied, then try again. It is an ErrConflict.
type StaleError struct {
	Volume  string
	Applied int64
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("%s: volume %q was updated in the cluster after the definition this host has (revision %d), which is being brought up to date; try again",
		ErrConflict, e.Volume, e.Applied)
}

// Is makes a StaleError an ErrConflict.
func (e *StaleError) Is(target error) bool { return target == ErrConflict }
