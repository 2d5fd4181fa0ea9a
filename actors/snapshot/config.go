package snapshot

import (
	"github.com/csiactor/csiactor/internal/kinderr"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/actorkit"
)

// Config configures a Manager. Zero fields mean their defaults.
type Config struct {
	// Backoff paces retries of CreateSnapshot and DeleteSnapshot, and the
	// polls of a snapshot the plugin has cut but not made ready yet. Zero
	// fields mean csi.DefaultBackoff's.
	Backoff csi.Backoff
	// Restart is the supervisor backoff of the snapshot actor when it
	// crashes (a store failure). Zero fields mean actorkit's defaults.
	Restart actorkit.BackoffConfig
	// Restarts, when set, counts restarts (csiactor_actor_restarts_total,
	// kind "snapshot"). The caller registers it.
	Restarts *actorkit.RestartCounter
	// RetryMetrics, when set, counts every retry of CreateSnapshot and
	// DeleteSnapshot in csiactor_csi_retries_total.
	RetryMetrics *csi.Metrics
	// MaxInFlightPerPlugin bounds the snapshot RPCs in flight to one
	// plugin. Zero means claim.DefaultMaxInFlightPerPlugin.
	MaxInFlightPerPlugin int
	// OnEvent, when set, is called after every persisted change the
	// agent's event stream shows (see the Event* constants). It is called
	// from the snapshot actor and must not block.
	OnEvent func(Event)
	// Logger receives the manager's logs; nil discards them.
	Logger *logrus.Entry
}

// Validate reports the first field that cannot be used, naming it.
func (c Config) Validate() error {
	if err := c.Backoff.Validate(); err != nil {
		return kinderr.Errorf(ErrInvalid, "backoff: %w", err)
	}
	if err := c.Restart.Validate(); err != nil {
		return kinderr.Errorf(ErrInvalid, "restart: %w", err)
	}
	if c.MaxInFlightPerPlugin < 0 {
		return kinderr.Errorf(ErrInvalid, "max_in_flight_per_plugin %d is negative", c.MaxInFlightPerPlugin)
	}
	return nil
}
