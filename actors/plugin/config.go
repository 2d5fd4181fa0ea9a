package plugin

import (
	"fmt"
	"os"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/actors/plugin/container"
	"github.com/csiactor/csiactor/actors/plugin/proc"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/actorkit"
)

// Config is shared by every allocation actor of an agent. Zero values mean
// the defaults of DefaultConfig.
type Config struct {
	// Log is the parent logger; each actor adds the alloc and plugin
	// fields. Required.
	Log *logrus.Entry
	// HeartbeatInterval is the time between fingerprints of a healthy
	// allocation. Default 30 s.
	HeartbeatInterval time.Duration
	// UnhealthyRetry is the first delay before fingerprinting an unhealthy
	// allocation again; it doubles on each failure up to
	// HeartbeatInterval, so a plugin that comes back is seen quickly and a
	// dead one is not hammered. Default 100 ms.
	UnhealthyRetry time.Duration
	// ProbeTimeout bounds each Probe. Default 5 s.
	ProbeTimeout time.Duration
	// RPCTimeout bounds each other RPC made through the allocation's
	// client (the volume actors use the same client). Default 1 minute.
	RPCTimeout time.Duration
	// FingerprintTimeout bounds a whole fingerprint. Default 10 s.
	FingerprintTimeout time.Duration
	// DialTimeout bounds each attempt to connect to the socket; attempts
	// repeat until the allocation stops. Default 5 s.
	DialTimeout time.Duration
	// SocketWarnAfter is how long the socket may not answer (it does not
	// exist yet, or nothing listens) before a warning is logged; the
	// warning repeats after doubling intervals up to SocketWarnMax while
	// it still does not answer. Defaults 5 s and 5 minutes.
	SocketWarnAfter time.Duration
	SocketWarnMax   time.Duration

	// Launcher starts exec-managed plugin processes. Required for
	// exec-managed allocations.
	Launcher *proc.Launcher
	// Containers runs the containers of image allocations. Required for
	// them.
	Containers *container.Launcher
	// RestartBackoff spaces the restarts of an exec-managed process that
	// exits. MaxFailures is not used: the agent never gives up on a
	// plugin it was told to run. Window is how long a process must run
	// before its exit counts as a fresh failure (the backoff starts over).
	// Defaults: Initial 200 ms, Max 1 minute, Multiplier 2, Jitter 0.2,
	// Window 5 minutes.
	RestartBackoff actorkit.BackoffConfig
	// CrashLoopExits is how many exits within RestartBackoff.Window make
	// the health description say "crash-looping". Default 3.
	CrashLoopExits int
	// StopGrace is how long a process has between SIGTERM and SIGKILL.
	// Default 10 s.
	StopGrace time.Duration
	// StopOnShutdown makes an actor stopped with ReasonShutdown stop its
	// plugin process too. By default the process and its log shim are
	// left running, for the next agent to adopt; only deregistration (and
	// a restart of the actor after a failure) stops them.
	StopOnShutdown bool
	// HealthTimeout is how long an allocation may stay unhealthy, from its
	// start or from its last healthy moment: then an exec-managed
	// allocation's process is killed and restarted with the backoff, and
	// an attached allocation's health description says so. Default 2
	// minutes.
	HealthTimeout time.Duration
	// HungRPCRestart is how many node RPCs in a row (NodeStageVolume,
	// NodePublishVolume, NodeGetVolumeStats, ...; not NodeGetInfo or
	// NodeGetCapabilities, which the fingerprint sends) may end in
	// DeadlineExceeded while the plugin still answers its fingerprint:
	// then an exec-managed allocation's process is killed and restarted
	// with the backoff, and an attached allocation is reported unhealthy
	// until its next fingerprint. A node RPC that the plugin answers
	// (success or its own error) starts the count over; one that ends
	// without an answer otherwise (Canceled, Unavailable) does not count.
	// Default DefaultHungRPCRestart; negative turns the count off; at most
	// MaxHungRPCRestart.
	HungRPCRestart int
	// BaseEnv is the environment every exec-managed process starts from,
	// before the allocation's Env and CSI_ENDPOINT. Default: PATH from the
	// agent's environment (or a standard PATH), nothing else.
	BaseEnv []string

	// Metrics, when set, is passed to csi.Dial for
	// csiactor_csi_operations_seconds.
	Metrics *csi.Metrics
}

// DefaultHungRPCRestart and MaxHungRPCRestart are the default and the
// largest Config.HungRPCRestart.
const (
	DefaultHungRPCRestart = 3
	MaxHungRPCRestart     = 1000
)

// DefaultConfig returns the defaults, without a logger or launcher.
func DefaultConfig() Config {
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	return Config{
		HeartbeatInterval:  30 * time.Second,
		UnhealthyRetry:     100 * time.Millisecond,
		ProbeTimeout:       5 * time.Second,
		RPCTimeout:         time.Minute,
		FingerprintTimeout: 10 * time.Second,
		DialTimeout:        5 * time.Second,
		SocketWarnAfter:    5 * time.Second,
		SocketWarnMax:      5 * time.Minute,
		RestartBackoff: actorkit.BackoffConfig{
			Initial:    200 * time.Millisecond,
			Max:        time.Minute,
			Multiplier: 2,
			Jitter:     0.2,
			Window:     5 * time.Minute,
		},
		CrashLoopExits: 3,
		StopGrace:      10 * time.Second,
		HealthTimeout:  2 * time.Minute,
		HungRPCRestart: DefaultHungRPCRestart,
		BaseEnv:        []string{"PATH=" + path},
	}
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	set := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&c.HeartbeatInterval, d.HeartbeatInterval)
	set(&c.UnhealthyRetry, d.UnhealthyRetry)
	set(&c.ProbeTimeout, d.ProbeTimeout)
	set(&c.RPCTimeout, d.RPCTimeout)
	set(&c.FingerprintTimeout, d.FingerprintTimeout)
	set(&c.DialTimeout, d.DialTimeout)
	set(&c.SocketWarnAfter, d.SocketWarnAfter)
	set(&c.SocketWarnMax, d.SocketWarnMax)
	set(&c.StopGrace, d.StopGrace)
	set(&c.HealthTimeout, d.HealthTimeout)
	rb := c.RestartBackoff
	set(&rb.Initial, d.RestartBackoff.Initial)
	set(&rb.Max, d.RestartBackoff.Max)
	set(&rb.Window, d.RestartBackoff.Window)
	if rb.Multiplier == 0 {
		rb.Multiplier = d.RestartBackoff.Multiplier
	}
	if rb.Jitter == 0 {
		rb.Jitter = d.RestartBackoff.Jitter
	}
	c.RestartBackoff = rb.WithDefaults()
	if c.CrashLoopExits == 0 {
		c.CrashLoopExits = d.CrashLoopExits
	}
	if c.HungRPCRestart == 0 {
		c.HungRPCRestart = d.HungRPCRestart
	}
	if c.BaseEnv == nil {
		c.BaseEnv = d.BaseEnv
	}
	return c
}

// Validate reports the first bad field, by name.
func (c Config) Validate() error {
	if c.Log == nil {
		return fmt.Errorf("%w: log is required", ErrInvalidConfig)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"heartbeat_interval", c.HeartbeatInterval},
		{"unhealthy_retry", c.UnhealthyRetry},
		{"probe_timeout", c.ProbeTimeout},
		{"rpc_timeout", c.RPCTimeout},
		{"fingerprint_timeout", c.FingerprintTimeout},
		{"dial_timeout", c.DialTimeout},
		{"socket_warn_after", c.SocketWarnAfter},
		{"socket_warn_max", c.SocketWarnMax},
		{"stop_grace", c.StopGrace},
		{"health_timeout", c.HealthTimeout},
	} {
		if d.v < 0 {
			return fmt.Errorf("%w: %s must not be negative", ErrInvalidConfig, d.name)
		}
	}
	if c.CrashLoopExits < 0 {
		return fmt.Errorf("%w: crash_loop_exits must not be negative", ErrInvalidConfig)
	}
	if c.HungRPCRestart > MaxHungRPCRestart {
		return fmt.Errorf("%w: hung_rpc_restart %d is more than %d", ErrInvalidConfig, c.HungRPCRestart, MaxHungRPCRestart)
	}
	if err := c.RestartBackoff.Validate(); err != nil {
		return fmt.Errorf("%w: restart_backoff: %w", ErrInvalidConfig, err)
	}
	return nil
}
