package registry

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/internal/actorkit"
)

// Config configures the registry. Zero values mean defaults.
type Config struct {
	// Log is the parent logger. Required.
	Log *logrus.Entry
	// Store persists the allocations. Required.
	Store Store
	// DataDir is the agent's data directory; exec-managed allocations get
	// their sockets under DataDir/plugins. Required, absolute.
	DataDir string
	// Plugin configures every allocation actor. Its Log defaults to Log;
	// its Launcher defaults to one the registry starts and stops.
	Plugin plugin.Config
	// Supervisor is the restart policy of allocation actors that panic.
	// Defaults: actorkit.DefaultBackoffConfig().
	Supervisor actorkit.BackoffConfig
	// Registerer receives the registry's metrics. Nil registers nothing.
	Registerer prometheus.Registerer
	// Restarts counts actor restarts (csiactor_actor_restarts_total). When
	// nil the registry makes one and registers it on Registerer; share one
	// across the agent's supervisors by passing it (registered by the
	// caller).
	Restarts *actorkit.RestartCounter
	// EventBuffer is the default queue size of a subscription. Default 256.
	EventBuffer int
	// RequestTimeout bounds a Handle call whose ctx has no deadline.
	// Default 30 s.
	RequestTimeout time.Duration
	// Name is the registry actor's name in the actor system. Default
	// "registry".
	Name string
	// ChildMiddleware is added to every allocation actor (tracing, tests).
	ChildMiddleware []actor.ReceiverMiddleware
}

// DefaultConfig returns the defaults; Log, Store and DataDir have none.
func DefaultConfig() Config {
	return Config{
		Plugin:         plugin.DefaultConfig(),
		Supervisor:     actorkit.DefaultBackoffConfig(),
		EventBuffer:    256,
		RequestTimeout: 30 * time.Second,
		Name:           "registry",
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.EventBuffer == 0 {
		c.EventBuffer = d.EventBuffer
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = d.RequestTimeout
	}
	if c.Name == "" {
		c.Name = d.Name
	}
	if c.Plugin.Log == nil {
		c.Plugin.Log = c.Log
	}
	c.Supervisor = c.Supervisor.WithDefaults()
	return c
}

// Validate reports the first bad field, by name.
func (c Config) Validate() error {
	switch {
	case c.Log == nil:
		return fmt.Errorf("%w: log is required", ErrInvalidConfig)
	case c.Store == nil:
		return fmt.Errorf("%w: store is required", ErrInvalidConfig)
	case c.DataDir == "":
		return fmt.Errorf("%w: data_dir is required", ErrInvalidConfig)
	case !filepath.IsAbs(c.DataDir):
		return fmt.Errorf("%w: data_dir %q is not absolute", ErrInvalidConfig, c.DataDir)
	case c.EventBuffer < 0:
		return fmt.Errorf("%w: event_buffer must not be negative", ErrInvalidConfig)
	case c.RequestTimeout < 0:
		return fmt.Errorf("%w: request_timeout must not be negative", ErrInvalidConfig)
	}
	p := c.Plugin
	if p.Log == nil {
		p.Log = c.Log
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("%w: plugin: %w", ErrInvalidConfig, err)
	}
	if err := c.Supervisor.Validate(); err != nil {
		return fmt.Errorf("%w: supervisor: %w", ErrInvalidConfig, err)
	}
	return nil
}
