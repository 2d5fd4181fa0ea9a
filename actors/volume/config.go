package volume

import (
	"fmt"
	"github.com/csiactor/csiactor/internal/mountprobe"
	"io"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/actorkit"
)

// Defaults used by DefaultConfig and for zero fields of a Config.
const (
	// DefaultIdleTimeout is how long a volume actor with nothing to do
	// stays in memory before it stops; the next request starts it again
	// from the store.
	DefaultIdleTimeout = time.Minute
	// DefaultMaxClaimAttempts is the default Config.MaxClaimAttempts: 0,
	// a publish step that keeps failing with a retryable error is retried
	// (with backoff, waiting for the plugin to be healthy) until it
	// succeeds or fails finally. A caller that does not
	// want to wait releases the claim.
	DefaultMaxClaimAttempts = 0
)

// Config configures a Manager. Zero fields mean their defaults.
type Config struct {
	// DataDir is the agent's data directory: staging and target paths live
	// under <DataDir>/volumes. Required, absolute.
	DataDir string
	// Backoff paces retries of failed publish and release steps. Zero
	// fields mean csi.DefaultBackoff's.
	Backoff csi.Backoff
	// MaxClaimAttempts, when positive, bounds the attempts of one publish
	// step that keeps failing with a retryable error (unavailable, timeout,
	// aborted, resource exhausted, failed precondition); then the claim
	// fails and is torn down. The count is persisted with the claim, so it
	// carries over a restart. Zero (the default) retries until the step
	// succeeds or fails finally; Release stops a claim that keeps
	// retrying. Release steps are always retried until done.
	MaxClaimAttempts int
	// MaxInFlightPerPlugin bounds the RPCs in flight to one plugin across
	// all volumes. Zero means claim.DefaultMaxInFlightPerPlugin.
	MaxInFlightPerPlugin int
	// IdleTimeout is how long an idle volume actor stays in memory. Zero
	// means DefaultIdleTimeout; negative keeps actors forever.
	IdleTimeout time.Duration
	// Restart is the supervisor backoff of crashed volume and claim
	// actors. Zero fields mean actorkit's defaults.
	Restart actorkit.BackoffConfig
	// Restarts, when set, counts restarts (csiactor_actor_restarts_total,
	// kinds "volume" and "claim"). The caller registers it.
	Restarts *actorkit.RestartCounter
	// RetryMetrics, when set, counts every retry of a claim or release
	// step and of CreateVolume and DeleteVolume in
	// csiactor_csi_retries_total {plugin, method}. The caller registers it
	// (csi.NewMetrics).
	RetryMetrics *csi.Metrics
	// OnEvent, when set, is called after every persisted change that the
	// agent's event stream shows (see the Event* constants): volumes
	// registered, created, deregistered and deleted; claims published,
	// failed, released, freed, repaired and stalled. It is called from
	// volume actors and the manager's stall watcher and must not block.
	OnEvent func(Event)
	// Host, when set, is how the manager looks at the host's mounts:
	// Start and Reconcile send a published claim whose target or staging
	// is not mounted back through its publish steps, and a repeated claim
	// of a published claim checks its target first. Nil trusts the
	// records (tests with a plugin that mounts nothing).
	Host Host
	// MountProbe, when set beside Host, probes the mount points the mount
	// table lists before Reconcile trusts them: a published claim whose
	// target or staging is dead (a FUSE mount whose plugin died answers
	// ENOTCONN) is repaired like a missing one, with EventMountBroken and
	// EventMountHealed; and a NodeUnpublishVolume or NodeUnstageVolume that
	// fails on a dead mount gets it unmounted by the agent. Nil trusts the
	// mount table.
	MountProbe *mountprobe.Prober
	// HostRebooted says the host rebooted since the records were written
	// (its boot ID changed): Start sends every current claim back through
	// every publish step (ControllerPublishVolume too: the attachment is
	// uncertain) before it resumes anything.
	HostRebooted bool
	// Arbiter, when set, admits every new claim across the hosts of a
	// cluster too, and is told when a claim is freed (cluster mode).
	Arbiter Arbiter
	// StatsInterval is how often the usage and condition of every volume
	// with a published claim are polled (jittered by ±10 %); zero turns
	// polling off. StatsConcurrency bounds the volumes polled at once
	// (zero: DefaultStatsConcurrency); StatsTimeout bounds one volume's
	// poll (zero: DefaultStatsTimeout, or StatsInterval when shorter).
	StatsInterval    time.Duration
	StatsConcurrency int
	StatsTimeout     time.Duration
	// StallAfter is how long a claim short of published, or a past claim
	// not yet freed, may stay in one state before it is stalled: its
	// Condition is ConditionStalled, it is an EventClaimStalled and it
	// counts in csiactor_volume_claims_stalled (see stall.go). Its steps
	// retry as before. Zero means DefaultStallAfter.
	StallAfter time.Duration
	// Snapshots, when set, is where Create finds the snapshot a volume is
	// restored from (Spec.FromSnapshot); without it a restore is
	// ErrInvalid.
	Snapshots Snapshots
	// Logger receives the manager's logs; nil discards them.
	Logger *logrus.Entry
	// Registerer receives csiactor_volume_claims,
	// csiactor_volume_operations_in_flight,
	// csiactor_claim_repairs_total, csiactor_volume_stats_*,
	// csiactor_volume_condition_abnormal,
	// csiactor_claim_step_failures_total and
	// csiactor_volume_claims_stalled; nil registers nothing.
	Registerer prometheus.Registerer
}

// DefaultConfig returns a Config with every default filled in except DataDir.
func DefaultConfig() Config {
	return Config{
		Backoff:              csi.DefaultBackoff(),
		MaxClaimAttempts:     DefaultMaxClaimAttempts,
		MaxInFlightPerPlugin: claim.DefaultMaxInFlightPerPlugin,
		IdleTimeout:          DefaultIdleTimeout,
		StallAfter:           DefaultStallAfter,
		Restart:              actorkit.DefaultBackoffConfig(),
	}
}

// Validate reports the first field that cannot be used, naming it and
// wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	switch {
	case c.DataDir == "":
		return fmt.Errorf("%w: data_dir is empty", ErrInvalidConfig)
	case !filepath.IsAbs(c.DataDir):
		return fmt.Errorf("%w: data_dir %q is not absolute", ErrInvalidConfig, c.DataDir)
	case c.MaxClaimAttempts < 0:
		return fmt.Errorf("%w: max_claim_attempts %d is negative", ErrInvalidConfig, c.MaxClaimAttempts)
	case c.MaxInFlightPerPlugin < 0:
		return fmt.Errorf("%w: max_in_flight_per_plugin %d is negative", ErrInvalidConfig, c.MaxInFlightPerPlugin)
	case c.StatsInterval < 0:
		return fmt.Errorf("%w: stats_interval %s is negative", ErrInvalidConfig, c.StatsInterval)
	case c.StatsConcurrency < 0:
		return fmt.Errorf("%w: stats_concurrency %d is negative", ErrInvalidConfig, c.StatsConcurrency)
	case c.StatsTimeout < 0:
		return fmt.Errorf("%w: stats_timeout %s is negative", ErrInvalidConfig, c.StatsTimeout)
	case c.StallAfter < 0:
		return fmt.Errorf("%w: stall_after %s is negative; want a positive duration like \"5m\"", ErrInvalidConfig, c.StallAfter)
	}
	if err := c.Backoff.Validate(); err != nil {
		return fmt.Errorf("%w: backoff: %w", ErrInvalidConfig, err)
	}
	if err := c.Restart.Validate(); err != nil {
		return fmt.Errorf("%w: restart: %w", ErrInvalidConfig, err)
	}
	return nil
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.MaxInFlightPerPlugin == 0 {
		c.MaxInFlightPerPlugin = d.MaxInFlightPerPlugin
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = d.IdleTimeout
	}
	if c.StallAfter == 0 {
		c.StallAfter = d.StallAfter
	}
	if c.StatsConcurrency == 0 {
		c.StatsConcurrency = DefaultStatsConcurrency
	}
	if c.StatsTimeout == 0 {
		c.StatsTimeout = DefaultStatsTimeout
		if c.StatsInterval > 0 && c.StatsInterval < c.StatsTimeout {
			c.StatsTimeout = c.StatsInterval
		}
	}
	if c.Logger == nil {
		l := logrus.New()
		l.Out = io.Discard
		c.Logger = logrus.NewEntry(l)
	}
	return c
}
