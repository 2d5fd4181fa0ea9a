package runtime

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/csiactor/csiactor/actors/plugin/container"
)

// Defaults of [DefaultConfig].
const (
	DefaultDataDir           = "/var/lib/csiactor"
	DefaultHTTPAddr          = "127.0.0.1:7460"
	DefaultLogLevel          = "info"
	DefaultLogFormat         = "text"
	DefaultHeartbeatInterval = 30 * time.Second
	DefaultProbeTimeout      = 5 * time.Second
	DefaultRPCTimeout        = 2 * time.Minute
	DefaultKillTimeout       = 5 * time.Second
	DefaultHealthTimeout     = 2 * time.Minute
	DefaultMaxInFlight       = 16
	DefaultHungRPCRestart    = 3
	// HungRPCRestartOff turns plugins.hung_rpc_restart off in a Config,
	// where zero means the default; the config file says 0.
	HungRPCRestartOff = -1
	// MaxHungRPCRestart is the largest plugins.hung_rpc_restart.
	MaxHungRPCRestart = 1000
	// APISocketName is the API socket's file name in the data dir.
	APISocketName = "api.sock"
	// MaxConfigFileSize is the largest config file LoadConfigFile reads.
	MaxConfigFileSize = 4 << 20
)

// Config is the agent's configuration: what the config file holds (YAML,
// or JSON, which is YAML too), plus the tuning knobs of the runtime.
//
// Zero values mean defaults: [Config.WithDefaults] fills them in from
// [DefaultConfig]. [LoadConfigFile] starts from DefaultConfig, so keys left
// out of the file keep their defaults.
type Config struct {
	// DataDir holds the store, the API socket, the sockets of exec-managed
	// plugins (plugins/<alloc>/csi.sock) and the volumes' staging and
	// target paths. It must be an absolute path.
	DataDir string        `yaml:"data_dir"`
	API     APIConfig     `yaml:"api"`
	Log     LogConfig     `yaml:"log"`
	Plugins PluginsConfig `yaml:"plugins"`
	Volumes VolumesConfig `yaml:"volumes"`
	Store   StoreConfig   `yaml:"store"`
	// Cluster, when set, turns on cluster mode (etcd); nil keeps every
	// volume and claim in this agent's store only.
	Cluster *ClusterConfig `yaml:"cluster"`
	// Docker, when set, serves the Docker volume plugin protocol for the
	// drivers it names; nil serves none.
	Docker *DockerConfig `yaml:"docker"`
	// Secrets, when set, seals the volume and snapshot secrets the agent
	// stores (state.db, etcd); nil stores them as given, and refuses
	// literal secrets in cluster mode.
	Secrets *SecretsConfig `yaml:"secrets"`
	// Allocations are registered on every start, in addition to the
	// allocations restored from the store.
	Allocations []AllocationConfig `yaml:"allocations"`
	// Host says how the runtime looks at the host. It is not read from
	// the config file: it is for embedders and tests.
	Host HostConfig `yaml:"-"`
}

// DefaultBootIDFile holds the boot ID of a Linux host, a new one at every
// boot.
const DefaultBootIDFile = "/proc/sys/kernel/random/boot_id"

// HostConfig says how the runtime checks the host against its store: on
// every start (after a reboot, every claim is published again), and when a
// plugin's allocation becomes healthy again (a published claim whose
// target or staging path is not mounted is published again).
type HostConfig struct {
	// BootIDFile is the file that holds the host's boot ID. Empty means
	// DefaultBootIDFile. It is a seam for tests, which simulate a reboot
	// by pointing it at a file they change, and for hosts where procfs is
	// elsewhere; the agent command takes it from $CSIACTOR_BOOT_ID_FILE.
	// An unreadable file is logged and the reboot check skipped.
	BootIDFile string
	// MountTable is the mount table to read. Empty means
	// /proc/self/mountinfo.
	MountTable string
	// SkipMountCheck trusts the store over the mount table: for plugins
	// that mount nothing (test fakes). The boot ID is still checked.
	SkipMountCheck bool
	// SELinuxFile is a file that exists when the host has SELinux.
	// Empty means DefaultSELinuxFile, or a selinuxfs in the mount table.
	// It is a seam for tests; the agent command takes it from
	// $CSIACTOR_SELINUX_FILE. A claim with selinux_context on a host
	// without SELinux is refused.
	SELinuxFile string
}

// APIConfig says where the agent serves its API.
type APIConfig struct {
	// Socket is the unix socket of the full API (mode 0600). Empty means
	// <data_dir>/api.sock.
	Socket string `yaml:"socket"`
	// HTTPAddr is the TCP address of /metrics and GET /v1/health (and of
	// the full API when TokenFile is set). Empty means 127.0.0.1:7460.
	HTTPAddr string `yaml:"http_addr"`
	// TokenFile holds the bearer token that opens the full API on HTTPAddr.
	// Empty keeps the API off TCP.
	TokenFile string `yaml:"token_file"`
	// Tokens are more bearer tokens for HTTPAddr, each with a name and a
	// scope (TokenScopeRead, TokenScopeClaim or TokenScopeOperator).
	// TokenFile, when set, is one more: an operator token named
	// "default".
	Tokens []TokenConfig `yaml:"tokens,omitempty"`
	// UI serves the web UI at /ui/ on HTTPAddr. It reads the agent's state
	// through the API over TCP, so it needs TokenFile or Tokens: the UI asks
	// for a token once and keeps a session cookie.
	UI bool `yaml:"ui"`
	// TLS, when set, serves HTTPAddr over TLS (1.2 or newer) with its
	// files, read again when they change.
	TLS *APITLSConfig `yaml:"tls"`
	// InsecureTCP accepts serving the API token in clear on an HTTPAddr
	// that is not a loopback address (without it, that is a config error);
	// the agent warns at every start.
	InsecureTCP bool `yaml:"insecure_tcp"`
}

// The scopes of an API token (TokenConfig.Scope): each allows what the
// one before it does, and more.
const (
	// TokenScopeRead allows every GET, the events stream and /metrics.
	TokenScopeRead = "read"
	// TokenScopeClaim allows TokenScopeRead, claims and releases (not
	// forced ones).
	TokenScopeClaim = "claim"
	// TokenScopeOperator allows everything.
	TokenScopeOperator = "operator"
)

// DefaultTokenName is the name of the token of api.token_file.
const DefaultTokenName = "default"

// UnixTokenName is the name the requests of the API's unix socket are
// recorded under (it has no token); no token of api.tokens may take it.
const UnixTokenName = "unix"

// TokenConfig is one bearer token of the API's TCP listener: the token in
// File (mode 0600, one line), known as Name in logs and events, allowed
// what Scope allows.
type TokenConfig struct {
	Name  string `yaml:"name"`
	File  string `yaml:"file"`
	Scope string `yaml:"scope"`
}

// LogConfig is the agent's logging.
type LogConfig struct {
	// Level is trace, debug, info, warn or error.
	Level string `yaml:"level"`
	// Format is text or json.
	Format string `yaml:"format"`
}

// PluginsConfig tunes how allocations are watched and talked to.
type PluginsConfig struct {
	// HeartbeatInterval is how often each allocation is probed and
	// fingerprinted. Process exit and connection state changes are seen
	// at once, between heartbeats.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// ProbeTimeout bounds each Probe call; at most HeartbeatInterval.
	ProbeTimeout time.Duration `yaml:"probe_timeout"`
	// RPCTimeout bounds every other CSI call.
	RPCTimeout time.Duration `yaml:"rpc_timeout"`
	// MaxInFlight is the most CSI calls in flight to one plugin at once;
	// more wait their turn.
	MaxInFlight int `yaml:"max_in_flight"`
	// KillTimeout is how long an exec-managed plugin has to exit after
	// SIGTERM before it gets SIGKILL.
	KillTimeout time.Duration `yaml:"kill_timeout"`
	// RestartBackoff paces restarts of exec-managed plugins that exit.
	RestartBackoff BackoffConfig `yaml:"restart_backoff"`
	// HealthTimeout is how long an allocation may stay unhealthy after its
	// start, or after it was last healthy: then an exec-managed plugin's
	// process is killed and restarted with RestartBackoff, and an attached
	// allocation is reported (its health description and an event). At
	// least ProbeTimeout.
	HealthTimeout time.Duration `yaml:"health_timeout"`
	// StopOnAgentExit makes the agent stop its exec-managed plugins when
	// it shuts down. By default they keep running (FUSE mounts die with
	// their plugin) and the next agent adopts them; only deregistration,
	// removal from the config file and the exit of `agent -dev` stop them.
	StopOnAgentExit bool `yaml:"stop_on_agent_exit"`
	// HungRPCRestart is how many node RPCs in a row of one allocation
	// (NodeStageVolume, NodePublishVolume, NodeGetVolumeStats, ...) may end
	// in DeadlineExceeded while the plugin still answers Probe: then an
	// exec-managed plugin is restarted with RestartBackoff, and an
	// attached allocation is reported unhealthy until its next
	// fingerprint (event plugin-hung, csiactor_plugin_hung_restarts_total).
	// A node RPC the plugin answers, with success or an error, starts the
	// count over, so one slow volume restarts nothing. Zero means
	// DefaultHungRPCRestart; HungRPCRestartOff turns it off (0 in the
	// config file); at most MaxHungRPCRestart.
	HungRPCRestart int `yaml:"hung_rpc_restart"`
	// RegistrationDir, when set, is a kubelet plugin registration
	// directory (the kubelet's is /var/lib/kubelet/plugins_registry) that
	// the agent watches as the kubelet does: a CSI driver whose registrar
	// (node-driver-registrar) creates a registration socket there becomes
	// an attached node allocation of the driver's name on its CSI
	// endpoint, with source "registration", and is deregistered when the
	// socket goes. Empty, the default, watches nothing (and deregisters
	// the drivers an earlier run registered from a directory). It must be
	// an absolute path of an existing directory.
	RegistrationDir string `yaml:"registration_dir"`
	// Proxy makes the agent serve one CSI endpoint per plugin,
	// <data_dir>/csi/<plugin>.sock (mode 0600), with the Identity,
	// Controller and Node services: each call goes to the plugin's
	// allocation that operations go to now (see ProxySocket). Off by
	// default.
	Proxy bool `yaml:"proxy"`
	// Engines are the API sockets of the container engines that run the
	// plugins of image allocations.
	Engines EnginesConfig `yaml:"engines"`
}

// EnginesConfig locates the container engines' API sockets. Podman is
// reached through the Docker-compatible API of `podman system service`.
type EnginesConfig struct {
	// Docker is dockerd's API socket; default /var/run/docker.sock.
	Docker string `yaml:"docker"`
	// Podman is Podman's API socket; default /run/podman/podman.sock.
	Podman string `yaml:"podman"`
}

// Socket returns the API socket of engine ("docker" or "podman").
func (e EnginesConfig) Socket(engine string) string {
	if engine == container.Podman {
		return e.Podman
	}
	return e.Docker
}

// VolumesConfig tunes the claim and release steps.
type VolumesConfig struct {
	// Retry paces retries of failed claim and release steps.
	Retry BackoffConfig `yaml:"retry"`
	// MaxClaimAttempts bounds the attempts of one publish step that keeps
	// failing with a retryable error (unavailable, timeout, aborted,
	// resource exhausted); then the claim fails and is torn down. Zero, the
	// default, retries until the step succeeds or fails finally; the
	// caller can release a claim that keeps retrying. Release steps are
	// always retried until done.
	MaxClaimAttempts int `yaml:"max_claim_attempts"`
	// StatsInterval is how often the usage and condition of every volume
	// with a published claim are polled from its plugin
	// (NodeGetVolumeStats when the node plugin has GET_VOLUME_STATS, and
	// the condition RPCs it and its controller have), jittered by ±10 %,
	// a few volumes at a time. Zero means DefaultStatsInterval; in the
	// config file it must be positive.
	StatsInterval time.Duration `yaml:"stats_interval"`
	// StallAfter is how long a claim short of published, or a released
	// claim not yet freed, may stay in one state before it is stalled:
	// its condition shows "stalled" beside its last error, an event
	// claim-stalled is sent, and it counts in
	// csiactor_volume_claims_stalled. Its steps go on retrying. Zero
	// means DefaultStallAfter; in the config file it must be positive.
	StallAfter time.Duration `yaml:"stall_after"`
	// MountCheckInterval is how often every published target and mounted
	// staging is probed (a stat that cannot hang the agent): a mount in
	// the mount table that answers ENOTCONN, EIO or ESTALE, or does not
	// answer, is dead (a FUSE mount whose plugin died), and its claim is
	// published again. The same probe runs whenever a node allocation
	// becomes healthy again. Zero means DefaultMountCheckInterval;
	// MountCheckOff (in the config file, 0s) turns the periodic probe off.
	MountCheckInterval time.Duration `yaml:"mount_check_interval"`
	// PluginWait is how long a claim, release, create, expansion or
	// modification that finds no healthy allocation of its plugin (one
	// restarting, say) waits for one before it fails with
	// ErrPluginUnavailable; the caller's deadline ends the wait sooner.
	// Zero means DefaultPluginWait; NoPluginWait (0s in the config file)
	// fails at once. At most MaxPluginWait.
	PluginWait time.Duration `yaml:"plugin_wait"`
}

// DefaultMountCheckInterval is the default of volumes.mount_check_interval.
const DefaultMountCheckInterval = 30 * time.Second

// MountCheckOff as VolumesConfig.MountCheckInterval turns the periodic
// probe of mounts off (the probe when a plugin comes back stays).
const MountCheckOff time.Duration = -1

// Bounds of volumes.mount_check_interval other than 0s (off).
const (
	minMountCheckInterval = time.Second
	maxMountCheckInterval = 24 * time.Hour
)

// DefaultPluginWait is the default of volumes.plugin_wait.
const DefaultPluginWait = 30 * time.Second

// MaxPluginWait is the longest volumes.plugin_wait.
const MaxPluginWait = time.Hour

// NoPluginWait as VolumesConfig.PluginWait (volumes.plugin_wait: 0s in the
// config file) makes a request that finds its plugin unhealthy fail at
// once.
const NoPluginWait time.Duration = -1

// StoreConfig tunes the bbolt store.
type StoreConfig struct {
	// NoSync skips fsync on commit: faster, and a machine crash may lose
	// the last commits. For tests and benchmarks only.
	NoSync bool `yaml:"no_sync"`
}

// BackoffConfig is an exponential backoff with jitter: the first wait is
// Initial, each next one Multiplier times longer, never more than Max, each
// varied randomly by up to ±Jitter of itself.
type BackoffConfig struct {
	Initial    time.Duration `yaml:"initial"`
	Max        time.Duration `yaml:"max"`
	Multiplier float64       `yaml:"multiplier"`
	// Jitter is a fraction in [0, 1]; 0 means none (but an all-zero
	// BackoffConfig means DefaultBackoff).
	Jitter float64 `yaml:"jitter"`
}

// DefaultBackoff is the backoff of claim and release steps: 500 ms, doubling, ±20 %
// jitter, capped at 2 minutes.
func DefaultBackoff() BackoffConfig {
	return BackoffConfig{Initial: 500 * time.Millisecond, Max: 2 * time.Minute, Multiplier: 2, Jitter: 0.2}
}

// AllocationConfig is one allocation of the config file: its ID and its
// [AllocationSpec].
type AllocationConfig struct {
	ID             string `yaml:"id"`
	AllocationSpec `yaml:",inline"`
}

// Validate checks a; the error is a *FieldError naming the bad field.
func (a AllocationConfig) Validate() error {
	if err := ValidateID("id", a.ID); err != nil {
		return err
	}
	return a.AllocationSpec.Validate()
}

// DefaultConfig returns the configuration of an agent started with no
// config file and no flags.
func DefaultConfig() Config {
	return Config{
		DataDir: DefaultDataDir,
		API:     APIConfig{HTTPAddr: DefaultHTTPAddr},
		Log:     LogConfig{Level: DefaultLogLevel, Format: DefaultLogFormat},
		Plugins: PluginsConfig{
			HeartbeatInterval: DefaultHeartbeatInterval,
			ProbeTimeout:      DefaultProbeTimeout,
			RPCTimeout:        DefaultRPCTimeout,
			MaxInFlight:       DefaultMaxInFlight,
			KillTimeout:       DefaultKillTimeout,
			RestartBackoff:    DefaultBackoff(),
			HealthTimeout:     DefaultHealthTimeout,
			HungRPCRestart:    DefaultHungRPCRestart,
			Engines:           EnginesConfig{Docker: container.DefaultDockerSocket, Podman: container.DefaultPodmanSocket},
		},
		Volumes: VolumesConfig{Retry: DefaultBackoff(), StatsInterval: DefaultStatsInterval, StallAfter: DefaultStallAfter,
			MountCheckInterval: DefaultMountCheckInterval, PluginWait: DefaultPluginWait},
	}
}

// WithDefaults returns c with every zero value replaced by its default.
// Allocations are copied, not shared.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	setDefault(&c.DataDir, d.DataDir)
	setDefault(&c.API.HTTPAddr, d.API.HTTPAddr)
	setDefault(&c.Log.Level, d.Log.Level)
	setDefault(&c.Log.Format, d.Log.Format)
	setDefault(&c.Plugins.HeartbeatInterval, d.Plugins.HeartbeatInterval)
	setDefault(&c.Plugins.ProbeTimeout, d.Plugins.ProbeTimeout)
	setDefault(&c.Plugins.RPCTimeout, d.Plugins.RPCTimeout)
	setDefault(&c.Plugins.MaxInFlight, d.Plugins.MaxInFlight)
	setDefault(&c.Plugins.KillTimeout, d.Plugins.KillTimeout)
	setDefault(&c.Plugins.HealthTimeout, d.Plugins.HealthTimeout)
	setDefault(&c.Plugins.HungRPCRestart, d.Plugins.HungRPCRestart)
	setDefault(&c.Plugins.Engines.Docker, d.Plugins.Engines.Docker)
	setDefault(&c.Plugins.Engines.Podman, d.Plugins.Engines.Podman)
	c.Plugins.RestartBackoff = c.Plugins.RestartBackoff.WithDefaults()
	c.Volumes.Retry = c.Volumes.Retry.WithDefaults()
	setDefault(&c.Volumes.StatsInterval, d.Volumes.StatsInterval)
	setDefault(&c.Volumes.StallAfter, d.Volumes.StallAfter)
	setDefault(&c.Volumes.MountCheckInterval, d.Volumes.MountCheckInterval)
	setDefault(&c.Volumes.PluginWait, d.Volumes.PluginWait)
	c.Allocations = append([]AllocationConfig(nil), c.Allocations...)
	c.Cluster = c.Cluster.withDefaults()
	c.Docker = c.Docker.withDefaults()
	c.Secrets = c.Secrets.withDefaults()
	if c.API.TLS != nil {
		t := *c.API.TLS
		c.API.TLS = &t
	}
	return c
}

// WithDefaults returns DefaultBackoff for a zero b, and otherwise b with a
// zero Initial, Max or Multiplier replaced by DefaultBackoff's. A zero
// Jitter beside other settings means no jitter.
func (b BackoffConfig) WithDefaults() BackoffConfig {
	d := DefaultBackoff()
	if b == (BackoffConfig{}) {
		return d
	}
	setDefault(&b.Initial, d.Initial)
	setDefault(&b.Max, d.Max)
	setDefault(&b.Multiplier, d.Multiplier)
	return b
}

func setDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// APISocketPath returns the path of the API socket: API.Socket, or
// <data_dir>/api.sock.
func (c Config) APISocketPath() string {
	if c.API.Socket != "" {
		return c.API.Socket
	}
	return filepath.Join(c.DataDir, APISocketName)
}

// PluginSocketPath returns the socket path the agent gives an exec-managed
// allocation: <data_dir>/plugins/<alloc>/csi.sock.
func (c Config) PluginSocketPath(allocID string) string {
	return filepath.Join(c.DataDir, "plugins", allocID, "csi.sock")
}

// Validate checks c, with zero values standing for their defaults. The error
// is a *FieldError naming the bad key, like "plugins.rpc_timeout" or
// "allocations[2].type".
func (c Config) Validate() error {
	c = c.WithDefaults()
	if !filepath.IsAbs(c.DataDir) {
		return fieldErr("data_dir", fmt.Sprintf("%q is not an absolute path", c.DataDir))
	}
	if strings.ContainsRune(c.DataDir, 0) {
		return fieldErr("data_dir", "must not contain a NUL byte")
	}
	if err := ValidateSocketPath("api.socket", c.APISocketPath()); err != nil {
		if c.API.Socket == "" {
			return fieldErr("data_dir", fmt.Sprintf("too long for the API socket %s in it (%d-byte limit); set api.socket", APISocketName, MaxSocketPathLength))
		}
		return err
	}
	if _, port, err := net.SplitHostPort(c.API.HTTPAddr); err != nil {
		return &FieldError{Field: "api.http_addr", Msg: fmt.Sprintf("%q is not host:port", c.API.HTTPAddr), Err: err}
	} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fieldErr("api.http_addr", fmt.Sprintf("%q: port must be a number from 0 to 65535", c.API.HTTPAddr))
	}
	if c.API.TokenFile != "" && !filepath.IsAbs(c.API.TokenFile) {
		return fieldErr("api.token_file", fmt.Sprintf("%q is not an absolute path", c.API.TokenFile))
	}
	if err := validateTokens(c.API); err != nil {
		return err
	}
	if c.API.UI && c.API.TokenFile == "" && len(c.API.Tokens) == 0 {
		return fieldErr("api.ui", "needs api.token_file or api.tokens: the web UI reads the API over TCP, which is served only with a token")
	}
	if err := c.API.validateTLS(); err != nil {
		return err
	}
	switch c.Log.Level {
	case "trace", "debug", "info", "warn", "error":
	default:
		return fieldErr("log.level", fmt.Sprintf("%q: want trace, debug, info, warn or error", c.Log.Level))
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		return fieldErr("log.format", fmt.Sprintf("%q: want text or json", c.Log.Format))
	}
	p := c.Plugins
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"plugins.heartbeat_interval", p.HeartbeatInterval},
		{"plugins.probe_timeout", p.ProbeTimeout},
		{"plugins.rpc_timeout", p.RPCTimeout},
		{"plugins.kill_timeout", p.KillTimeout},
		{"plugins.health_timeout", p.HealthTimeout},
	} {
		if d.v < 0 {
			return fieldErr(d.key, fmt.Sprintf("%s is negative", d.v))
		}
	}
	if p.ProbeTimeout > p.HeartbeatInterval {
		return fieldErr("plugins.probe_timeout", fmt.Sprintf("%s is longer than plugins.heartbeat_interval (%s)", p.ProbeTimeout, p.HeartbeatInterval))
	}
	if p.HealthTimeout < p.ProbeTimeout {
		return fieldErr("plugins.health_timeout", fmt.Sprintf("%s is shorter than plugins.probe_timeout (%s)", p.HealthTimeout, p.ProbeTimeout))
	}
	if err := validateRegistrationDir(p.RegistrationDir); err != nil {
		return err
	}
	if p.MaxInFlight < 0 {
		return fieldErr("plugins.max_in_flight", "must not be negative")
	}
	for _, e := range []struct{ key, path string }{{"plugins.engines.docker", p.Engines.Docker}, {"plugins.engines.podman", p.Engines.Podman}} {
		if e.path != "" && !filepath.IsAbs(e.path) {
			return fieldErr(e.key, fmt.Sprintf("%q is a relative path; give the absolute path of the engine's API socket", e.path))
		}
	}
	switch n := p.HungRPCRestart; {
	case n < 0 && n != HungRPCRestartOff:
		return fieldErr("plugins.hung_rpc_restart", fmt.Sprintf("%d is negative; 0 turns the restart off", n))
	case n > MaxHungRPCRestart:
		return fieldErr("plugins.hung_rpc_restart", fmt.Sprintf("%d is more than %d; 0 turns the restart off", n, MaxHungRPCRestart))
	}
	if err := p.RestartBackoff.Validate(); err != nil {
		return prefixed("plugins.restart_backoff", err)
	}
	if c.Volumes.MaxClaimAttempts < 0 {
		return fieldErr("volumes.max_claim_attempts", fmt.Sprintf("%d is negative; 0 retries until done", c.Volumes.MaxClaimAttempts))
	}
	if err := c.Volumes.Retry.Validate(); err != nil {
		return prefixed("volumes.retry", err)
	}
	if c.Volumes.StatsInterval < 0 {
		return fieldErr("volumes.stats_interval", fmt.Sprintf("%s is negative; want a positive duration like \"1m\"", c.Volumes.StatsInterval))
	}
	if c.Volumes.StallAfter < 0 {
		return fieldErr("volumes.stall_after", fmt.Sprintf("%s is negative; want a positive duration like \"5m\"", c.Volumes.StallAfter))
	}
	if i := c.Volumes.MountCheckInterval; i != 0 && i != MountCheckOff && (i < minMountCheckInterval || i > maxMountCheckInterval) {
		return fieldErr("volumes.mount_check_interval", fmt.Sprintf("%s is out of range; want a duration from %s to %s like \"30s\", or 0s to turn the periodic check off",
			i, minMountCheckInterval, maxMountCheckInterval))
	}
	if w := c.Volumes.PluginWait; (w < 0 && w != NoPluginWait) || w > MaxPluginWait {
		return fieldErr("volumes.plugin_wait", fmt.Sprintf("%s: want a duration from 0s (do not wait) to %s, like \"30s\"", w, MaxPluginWait))
	}
	if err := c.Cluster.Validate(); err != nil {
		return err
	}
	if err := c.Docker.Validate(); err != nil {
		return err
	}
	if err := c.Secrets.Validate(); err != nil {
		return err
	}
	if err := c.validateSealing(); err != nil {
		return err
	}
	seen := make(map[string]int, len(c.Allocations))
	for i, a := range c.Allocations {
		key := fmt.Sprintf("allocations[%d]", i)
		if err := a.Validate(); err != nil {
			return prefixed(key, err)
		}
		if j, ok := seen[a.ID]; ok {
			return fieldErr(key+".id", fmt.Sprintf("%q is also the ID of allocations[%d]", a.ID, j))
		}
		seen[a.ID] = i
		if a.Socket == "" {
			if s := c.PluginSocketPath(a.ID); len(s) > MaxSocketPathLength {
				return fieldErr(key+".id", fmt.Sprintf("the plugin socket %s would be %d bytes, over the %d-byte unix socket limit; use a shorter ID or data_dir", s, len(s), MaxSocketPathLength))
			}
		}
	}
	return nil
}

// validateRegistrationDir checks plugins.registration_dir: empty, or an
// absolute, clean path of an existing directory.
func validateRegistrationDir(dir string) error {
	const key = "plugins.registration_dir"
	switch {
	case dir == "":
		return nil
	case strings.ContainsRune(dir, 0):
		return fieldErr(key, "must not contain a NUL byte")
	case !filepath.IsAbs(dir):
		return fieldErr(key, fmt.Sprintf("%q is not an absolute path", dir))
	case filepath.Clean(dir) != dir:
		return fieldErr(key, fmt.Sprintf("%q is not a clean path; write %q", dir, filepath.Clean(dir)))
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fieldErr(key, fmt.Sprintf("%s does not exist; create it, or point at the kubelet's registration directory", dir))
	case err != nil:
		why := err.Error()
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			why = pe.Err.Error() // the path is in the message already
		}
		return &FieldError{Field: key, Msg: fmt.Sprintf("%s cannot be read: %s", dir, why), Err: err}
	case !fi.IsDir():
		return fieldErr(key, fmt.Sprintf("%s is not a directory", dir))
	}
	return nil
}

// Validate checks b, with zero values standing for their defaults; the error
// is a *FieldError naming the bad key.
func (b BackoffConfig) Validate() error {
	b = b.WithDefaults()
	switch {
	case b.Initial < 0:
		return fieldErr("initial", fmt.Sprintf("%s is negative", b.Initial))
	case b.Max < b.Initial:
		return fieldErr("max", fmt.Sprintf("%s is shorter than initial (%s)", b.Max, b.Initial))
	case !(b.Multiplier >= 1 && b.Multiplier <= 100):
		return fieldErr("multiplier", fmt.Sprintf("%g: want a number from 1 to 100", b.Multiplier))
	case !(b.Jitter >= 0 && b.Jitter <= 1):
		return fieldErr("jitter", fmt.Sprintf("%g: want a fraction from 0 to 1", b.Jitter))
	}
	return nil
}

// LoadConfigFile reads a YAML (or JSON) config file on top of
// [DefaultConfig] and validates the result. Unknown keys are an error, and
// every error names the file, the line and the key, like
//
//	/etc/csiactor.yaml: line 7: plugins.rpc_timeout: want a duration like "30s"
func LoadConfigFile(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("config file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigFileSize+1))
	if err != nil {
		return Config{}, fmt.Errorf("config file %s: %w", path, err)
	}
	if len(data) > MaxConfigFileSize {
		return Config{}, fmt.Errorf("config file %s: larger than %d bytes", path, MaxConfigFileSize)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig is LoadConfigFile on the file's contents. Errors start with
// "line N: " and the key.
func ParseConfig(data []byte) (Config, error) {
	cfg := DefaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, &FieldError{Msg: err.Error(), Err: err} // "yaml: line N: ..."
	}
	var more yaml.Node
	if err := dec.Decode(&more); err == nil {
		return Config{}, fmt.Errorf("line %d: %w", more.Line, fieldErr("", "more than one YAML document"))
	} else if !errors.Is(err, io.EOF) {
		return Config{}, &FieldError{Msg: err.Error(), Err: err}
	}
	lines := map[string]int{}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		d := &configDecoder{lines: lines, budget: 1 << 16}
		if err := d.decode(doc.Content[0], reflect.ValueOf(&cfg).Elem(), ""); err != nil {
			return Config{}, err
		}
	}
	// In the file, 0 turns the hung-RPC restart off and a negative count is
	// a mistake (HungRPCRestartOff is the Config's way to say off).
	if n, ok := lines["plugins.hung_rpc_restart"]; ok {
		switch {
		case cfg.Plugins.HungRPCRestart < 0:
			return Config{}, fmt.Errorf("line %d: %w", n, fieldErr("plugins.hung_rpc_restart",
				fmt.Sprintf("%d is negative; 0 turns the restart off", cfg.Plugins.HungRPCRestart)))
		case cfg.Plugins.HungRPCRestart == 0:
			cfg.Plugins.HungRPCRestart = HungRPCRestartOff
		}
	}
	// Zero means the default in a Config, but a zero written in the file
	// is a mistake.
	for _, k := range []struct {
		key, like string
		zero      bool
	}{
		{"volumes.stats_interval", "1m", cfg.Volumes.StatsInterval == 0},
		{"volumes.stall_after", "5m", cfg.Volumes.StallAfter == 0},
	} {
		if n, ok := lines[k.key]; ok && k.zero {
			return Config{}, fmt.Errorf("line %d: %w", n, fieldErr(k.key, "0s: want a positive duration like \""+k.like+"\" (leave the key out for the default)"))
		}
	}
	// volumes.mount_check_interval: 0s in the file turns the periodic
	// probe off; a negative duration is a mistake.
	if n, ok := lines["volumes.mount_check_interval"]; ok {
		switch i := cfg.Volumes.MountCheckInterval; {
		case i < 0:
			return Config{}, fmt.Errorf("line %d: %w", n, fieldErr("volumes.mount_check_interval",
				fmt.Sprintf("%s is negative; want a duration like \"30s\", or 0s to turn the periodic check off", i)))
		case i == 0:
			cfg.Volumes.MountCheckInterval = MountCheckOff
		}
	}
	// In the file, 0s means "do not wait"; NoPluginWait says so in a
	// Config, where zero means the default.
	if n, ok := lines["volumes.plugin_wait"]; ok {
		switch w := cfg.Volumes.PluginWait; {
		case w < 0:
			return Config{}, fmt.Errorf("line %d: %w", n, fieldErr("volumes.plugin_wait", fmt.Sprintf("%s is negative: want a duration from 0s (do not wait) to %s, like \"30s\"", w, MaxPluginWait)))
		case w == 0:
			cfg.Volumes.PluginWait = NoPluginWait
		}
	}
	if err := cfg.Validate(); err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			if n := lineOf(lines, fe.Field); n > 0 {
				return Config{}, fmt.Errorf("line %d: %w", n, err)
			}
		}
		return Config{}, err
	}
	return cfg, nil
}

// lineOf returns the line of key, or of its closest parent that has one.
func lineOf(lines map[string]int, key string) int {
	for key != "" {
		if n, ok := lines[key]; ok {
			return n
		}
		i := strings.LastIndexAny(key, ".[")
		if i < 0 {
			break
		}
		key = key[:i]
	}
	return 0
}

// configDecoder decodes a YAML node tree into a Config by reflection over
// its yaml tags, rejecting unknown keys, and remembers the line of every
// key for error messages. Messages never repeat a value: env values and
// mount flags can be secrets.
type configDecoder struct {
	lines  map[string]int
	budget int // nodes left to visit; bounds alias expansion (65536)
}

var durationType = reflect.TypeFor[time.Duration]()

func (d *configDecoder) errAt(n *yaml.Node, key, msg string) error {
	return fmt.Errorf("line %d: %w", n.Line, fieldErr(key, msg))
}

func (d *configDecoder) decode(n *yaml.Node, v reflect.Value, key string) error {
	if d.budget--; d.budget < 0 {
		return d.errAt(n, key, "the document is too large (too many nodes or aliases)")
	}
	if n.Kind == yaml.AliasNode {
		return d.decode(n.Alias, v, key)
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // "key:" with no value keeps the default
	}
	switch {
	case v.Type() == durationType:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
			return d.errAt(n, key, `want a duration like "30s" or "500ms"`)
		}
		dur, err := time.ParseDuration(n.Value)
		if err != nil {
			return d.errAt(n, key, fmt.Sprintf("%q: want a duration like \"30s\" or \"500ms\"", n.Value))
		}
		v.SetInt(int64(dur))
		return nil
	case v.Kind() == reflect.Struct:
		return d.decodeStruct(n, v, key)
	case v.Kind() == reflect.Pointer && v.Type().Elem().Kind() == reflect.Struct:
		// An optional section: present in the file means set.
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		return d.decodeStruct(n, v.Elem(), key)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
		if n.Kind != yaml.SequenceNode {
			return d.errAt(n, key, "want a list of strings")
		}
		out := make([]string, 0, len(n.Content))
		for i, e := range n.Content {
			var s string
			if err := d.scalar(e, &s, fmt.Sprintf("%s[%d]", key, i), "a string"); err != nil {
				return err
			}
			out = append(out, s)
		}
		v.Set(reflect.ValueOf(out))
		return nil
	case v.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return d.errAt(n, key, "want a list")
		}
		out := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, e := range n.Content {
			k := fmt.Sprintf("%s[%d]", key, i)
			d.lines[k] = e.Line
			if err := d.decode(e, out.Index(i), k); err != nil {
				return err
			}
		}
		v.Set(out)
		return nil
	case v.Kind() == reflect.Map && v.Type().Key().Kind() == reflect.String && v.Type().Elem().Kind() == reflect.String:
		n = d.deref(n)
		if n.Kind != yaml.MappingNode {
			return d.errAt(n, key, "want a mapping of strings")
		}
		out := make(map[string]string, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			var k, s string
			if err := d.scalar(n.Content[i], &k, key, "string keys"); err != nil {
				return err
			}
			if _, dup := out[k]; dup {
				return d.errAt(n.Content[i], key+"."+k, "given twice")
			}
			d.lines[key+"."+k] = n.Content[i].Line
			if err := d.scalar(n.Content[i+1], &s, key+"."+k, "a string"); err != nil {
				return err
			}
			out[k] = s
		}
		v.Set(reflect.ValueOf(out))
		return nil
	case v.Kind() == reflect.String:
		var s string
		if err := d.scalar(n, &s, key, "a string"); err != nil {
			return err
		}
		v.SetString(s)
		return nil
	case v.Kind() == reflect.Int:
		var i int
		if err := d.scalar(n, &i, key, "an integer"); err != nil {
			return err
		}
		v.SetInt(int64(i))
		return nil
	case v.Kind() == reflect.Float64:
		var f float64
		if err := d.scalar(n, &f, key, "a number"); err != nil {
			return err
		}
		v.SetFloat(f)
		return nil
	case v.Kind() == reflect.Bool:
		var b bool
		if err := d.scalar(n, &b, key, "true or false"); err != nil {
			return err
		}
		v.SetBool(b)
		return nil
	}
	// Only reachable if Config grows a field of a kind handled nowhere above.
	return d.errAt(n, key, fmt.Sprintf("cannot decode into %s", v.Type()))
}

func (d *configDecoder) deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil && d.budget > 0 {
		d.budget--
		n = n.Alias
	}
	return n
}

// scalar decodes a scalar node into out; want describes the expected value
// for the error, which never repeats the value itself.
func (d *configDecoder) scalar(n *yaml.Node, out any, key, want string) error {
	if d.budget--; d.budget < 0 {
		return d.errAt(n, key, "the document is too large (too many nodes or aliases)")
	}
	n = d.deref(n)
	if n.Kind != yaml.ScalarNode {
		return d.errAt(n, key, "want "+want)
	}
	if err := n.Decode(out); err != nil {
		return d.errAt(n, key, "want "+want)
	}
	return nil
}

// structFields returns the yaml-keyed fields of t, following inline
// embedded structs, as index paths.
func structFields(t reflect.Type) map[string][]int {
	out := map[string][]int{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if opts == "inline" && f.Anonymous && f.Type.Kind() == reflect.Struct {
			for k, idx := range structFields(f.Type) {
				out[k] = append([]int{i}, idx...)
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = []int{i}
	}
	return out
}

func (d *configDecoder) decodeStruct(n *yaml.Node, v reflect.Value, key string) error {
	n = d.deref(n)
	if n.Kind != yaml.MappingNode {
		if key == "" {
			return d.errAt(n, key, "the config must be a mapping of keys (data_dir, api, log, plugins, allocations, ...)")
		}
		return d.errAt(n, key, "want a mapping")
	}
	fields := structFields(v.Type())
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := d.deref(n.Content[i]), n.Content[i+1]
		var name string
		if kn.Kind != yaml.ScalarNode || kn.Decode(&name) != nil {
			return d.errAt(kn, key, "keys must be strings")
		}
		full := name
		if key != "" {
			full = key + "." + name
		}
		idx, ok := fields[name]
		if !ok {
			if name == "<<" {
				return d.errAt(kn, key, "YAML merge keys (<<) are not supported")
			}
			return d.errAt(kn, full, fmt.Sprintf("unknown key (known here: %s)", strings.Join(sortedFieldNames(fields), ", ")))
		}
		if seen[name] {
			return d.errAt(kn, full, "given twice")
		}
		seen[name] = true
		d.lines[full] = kn.Line
		if err := d.decode(vn, v.FieldByIndex(idx), full); err != nil {
			return err
		}
	}
	return nil
}

func sortedFieldNames(fields map[string][]int) []string {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// validateTokens checks api.tokens: a name (an ID) given once, an absolute
// file and a known scope each. The files are read when the agent starts.
func validateTokens(c APIConfig) error {
	names := map[string]string{}
	if c.TokenFile != "" {
		names[DefaultTokenName] = "api.token_file"
	}
	for i, t := range c.Tokens {
		key := fmt.Sprintf("api.tokens[%d]", i)
		if err := ValidateID(key+".name", t.Name); err != nil {
			return err
		}
		if t.Name == UnixTokenName {
			return fieldErr(key+".name", fmt.Sprintf("%q is the name the unix socket's requests are recorded under; choose another", t.Name))
		}
		if prev, ok := names[t.Name]; ok {
			msg := fmt.Sprintf("%q is also the name of %s", t.Name, prev)
			if prev == "api.token_file" {
				msg = fmt.Sprintf("%q is the name of the token of api.token_file", t.Name)
			}
			return fieldErr(key+".name", msg)
		}
		names[t.Name] = key
		if t.File == "" {
			return fieldErr(key+".file", "must be set")
		}
		if !filepath.IsAbs(t.File) {
			return fieldErr(key+".file", fmt.Sprintf("%q is not an absolute path", t.File))
		}
		switch t.Scope {
		case TokenScopeRead, TokenScopeClaim, TokenScopeOperator:
		default:
			return fieldErr(key+".scope", fmt.Sprintf("%q: want read, claim or operator", t.Scope))
		}
	}
	return nil
}
