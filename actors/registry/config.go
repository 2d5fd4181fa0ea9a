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
	// ConfigAllocations are the allocations listed in the agent's config
	// file. The config file is authoritative for them, and Start applies it
	// to the store before anything is restored, so no process is ever
	// started for a spec the config no longer has:
	//
	//   - one not stored yet is registered, with a new Seq;
	//   - one stored with a different spec (command, env, type, plugin or
	//     socket) is replaced: the new spec keeps the ID's Seq (it is the
	//     same configured slot, so it never jumps ahead of a newer
	//     allocation of its plugin registered through the API), and a
	//     process left by a killed agent for the old spec is killed first;
	//   - one registered through the API under the same ID becomes the
	//     config's (replaced as above when its spec differs);
	//   - a stored config allocation the list no longer has is deregistered
	//     (a leftover process killed, its socket directory removed);
	//   - an API allocation whose socket a listed one uses is deregistered
	//     (the config wins; logged as a warning).
	//
	// API allocations are otherwise left alone. Each spec must pass
	// plugin.Spec.Validate; IDs and sockets must be unique in the list.
	ConfigAllocations []plugin.Spec
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
	if err := c.validateConfigAllocations(); err != nil {
		return err
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

// validateConfigAllocations checks ConfigAllocations; DataDir is valid.
func (c Config) validateConfigAllocations() error {
	ids := map[string]bool{}
	sockets := map[string]string{}
	for i, s := range c.ConfigAllocations {
		name := fmt.Sprintf("config allocation %q", s.ID)
		if s.ID == "" {
			name = fmt.Sprintf("config allocation #%d", i+1)
		}
		ws, err := s.WithSocket(c.DataDir)
		if err == nil {
			err = ws.Validate() // the PATH lookup WithSocket leaves out
		}
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalidConfig, name, err)
		}
		if ids[s.ID] {
			return fmt.Errorf("%w: %s is listed twice", ErrInvalidConfig, name)
		}
		ids[s.ID] = true
		if other, dup := sockets[ws.Socket]; dup {
			return fmt.Errorf("%w: %s: socket %q is also the socket of config allocation %q", ErrInvalidConfig, name, ws.Socket, other)
		}
		sockets[ws.Socket] = s.ID
	}
	return nil
}
