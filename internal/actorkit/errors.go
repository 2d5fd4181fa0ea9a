package actorkit

import "errors"

var (
	// ErrTimeout is returned by Request when no reply arrived in time.
	ErrTimeout = errors.New("actorkit: request timed out")
	// ErrNoActor is returned by Request when the target actor does not
	// exist (it was never spawned, or it has stopped).
	ErrNoActor = errors.New("actorkit: no such actor")
	// ErrInvalidConfig is returned by Config.Validate for a bad setting.
	ErrInvalidConfig = errors.New("actorkit: invalid config")
)
