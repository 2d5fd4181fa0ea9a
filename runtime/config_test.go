package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/csiactor/csiactor/actors/plugin/container"
)

const fullConfigYAML = `# a full config
data_dir: /srv/csiactor
api:
  socket: /run/csiactor/api.sock
  http_addr: 0.0.0.0:9460
  token_file: /etc/csiactor/token
  insecure_tcp: true
log:
  level: debug
  format: json
plugins:
  heartbeat_interval: 30s
  probe_timeout: 2s
  rpc_timeout: 90s
  max_in_flight: 4
  kill_timeout: 10s
  restart_backoff:
    initial: 1s
    max: 1m
    multiplier: 3
    jitter: 0.5
  health_timeout: 5m
  stop_on_agent_exit: true
  hung_rpc_restart: 5
volumes:
  retry:
    initial: 250ms
  stats_interval: 15s
  stall_after: 10m
store:
  no_sync: true
allocations:
  - id: hostpath-node
    plugin: hostpath
    type: node
    socket: /var/lib/kubelet/plugins/hostpath/csi.sock
  - id: nfs
    plugin: nfs
    type: monolith
    command: [/usr/bin/nfsplugin, "--endpoint={endpoint}"]
    env:
      NFS_SERVER: 10.0.0.1
      RETRIES: 3
`

func TestParseConfig_Full(t *testing.T) {
	got, err := ParseConfig([]byte(fullConfigYAML))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	want := DefaultConfig()
	want.DataDir = "/srv/csiactor"
	want.API = APIConfig{Socket: "/run/csiactor/api.sock", HTTPAddr: "0.0.0.0:9460", TokenFile: "/etc/csiactor/token", InsecureTCP: true}
	want.Log = LogConfig{Level: "debug", Format: "json"}
	want.Plugins = PluginsConfig{
		HeartbeatInterval: 30 * time.Second, ProbeTimeout: 2 * time.Second, RPCTimeout: 90 * time.Second,
		MaxInFlight: 4, KillTimeout: 10 * time.Second,
		RestartBackoff: BackoffConfig{Initial: time.Second, Max: time.Minute, Multiplier: 3, Jitter: 0.5},
		HealthTimeout:  5 * time.Minute, StopOnAgentExit: true, HungRPCRestart: 5,
		Engines: EnginesConfig{Docker: container.DefaultDockerSocket, Podman: container.DefaultPodmanSocket},
	}
	// Keys left out of a nested block keep their defaults.
	want.Volumes.Retry.Initial = 250 * time.Millisecond
	want.Volumes.StatsInterval = 15 * time.Second
	want.Volumes.StallAfter = 10 * time.Minute
	want.Store.NoSync = true
	want.Allocations = []AllocationConfig{
		{ID: "hostpath-node", AllocationSpec: AllocationSpec{Plugin: "hostpath", Type: TypeNode, Socket: "/var/lib/kubelet/plugins/hostpath/csi.sock"}},
		{ID: "nfs", AllocationSpec: AllocationSpec{Plugin: "nfs", Type: TypeMonolith,
			Command: []string{"/usr/bin/nfsplugin", "--endpoint={endpoint}"},
			Env:     map[string]string{"NFS_SERVER": "10.0.0.1", "RETRIES": "3"}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseConfig:\n got %+v\nwant %+v", got, want)
	}
}

func TestParseConfig_JSON(t *testing.T) {
	got, err := ParseConfig([]byte(`{"data_dir": "/d", "plugins": {"rpc_timeout": "1m"},
		"allocations": [{"id": "a", "plugin": "p", "type": "controller", "socket": "/s.sock"}]}`))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	if got.DataDir != "/d" || got.Plugins.RPCTimeout != time.Minute || len(got.Allocations) != 1 || got.Allocations[0].Socket != "/s.sock" {
		t.Errorf("ParseConfig(JSON) = %+v", got)
	}
	if got.Plugins.HeartbeatInterval != DefaultHeartbeatInterval {
		t.Errorf("heartbeat_interval = %s, want the default", got.Plugins.HeartbeatInterval)
	}
}

func TestParseConfig_Empty(t *testing.T) {
	for _, in := range []string{"", "\n# nothing\n", "---\n", "{}"} {
		got, err := ParseConfig([]byte(in))
		if err != nil {
			t.Fatalf("ParseConfig(%q): %v", in, err)
		}
		if !reflect.DeepEqual(got, DefaultConfig()) {
			t.Errorf("ParseConfig(%q) = %+v, want the defaults", in, got)
		}
	}
}

func TestParseConfig_Errors(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want string // the whole message
	}{
		{"unknown top key", "data_dir: /d\nsocket: /x\n", `line 2: socket: unknown key (known here: allocations, api, cluster, data_dir, docker, log, plugins, secrets, store, volumes)`},
		{"unknown nested key", "api:\n  socket: /x\n  sockett: /y\n", `line 3: api.sockett: unknown key (known here: http_addr, insecure_tcp, socket, tls, token_file, tokens, ui)`},
		{"unknown allocation key", "allocations:\n  - id: a\n    plugin: p\n    typ: node\n", `line 4: allocations[0].typ: unknown key (known here: command, env, id, image, plugin, socket, type)`},
		{"duration as int", "plugins:\n  rpc_timeout: 30\n", `line 2: plugins.rpc_timeout: want a duration like "30s" or "500ms"`},
		{"duration without unit", "plugins:\n  rpc_timeout: \"30\"\n", `line 2: plugins.rpc_timeout: "30": want a duration like "30s" or "500ms"`},
		{"int as string", "plugins:\n  max_in_flight: many\n", `line 2: plugins.max_in_flight: want an integer`},
		{"bool", "store:\n  no_sync: maybe\n", `line 2: store.no_sync: want true or false`},
		{"mapping wanted", "api: /x\n", `line 1: api: want a mapping`},
		{"list wanted", "allocations: {}\n", `line 1: allocations: want a list`},
		{"strings wanted", "allocations:\n  - command: {a: b}\n", `line 2: allocations[0].command: want a list of strings`},
		{"env mapping", "allocations:\n  - env: [A]\n", `line 2: allocations[0].env: want a mapping of strings`},
		{"env value not scalar", "allocations:\n  - env:\n      TOKEN: [s3cret]\n", `line 3: allocations[0].env.TOKEN: want a string`},
		{"duplicate key", "log:\n  level: info\n  level: debug\n", `line 3: log.level: given twice`},
		{"root not mapping", "- a\n", `line 1: the config must be a mapping of keys (data_dir, api, log, plugins, allocations, ...)`},
		{"two documents", "data_dir: /a\n---\ndata_dir: /b\n", `line 2: more than one YAML document`},
		{"merge key", "base: &b {level: info}\nlog:\n  <<: *b\n", `line 1: base: unknown key`},
		{"invalid value has line", "log:\n  format: xml\n", `line 2: log.format: "xml": want text or json`},
		{"invalid alloc has line", "allocations:\n  - id: a\n    plugin: p\n    type: worker\n    socket: /s\n", `line 4: allocations[0].type: "worker": want controller, node or monolith`},
		{"missing alloc field has parent line", "allocations:\n  - id: a\n    type: node\n    socket: /s\n", `line 2: allocations[0].plugin: must not be empty`},
		{"duplicate alloc id", "allocations:\n  - {id: a, plugin: p, type: node, socket: /s}\n  - {id: a, plugin: p, type: node, socket: /t}\n", `line 3: allocations[1].id: "a" is also the ID of allocations[0]`},
		{"probe longer than heartbeat", "plugins:\n  heartbeat_interval: 1s\n  probe_timeout: 2s\n", `line 3: plugins.probe_timeout: 2s is longer than plugins.heartbeat_interval (1s)`},
		{"negative duration", "plugins:\n  kill_timeout: -1s\n", `line 2: plugins.kill_timeout: -1s is negative`},
		{"negative health timeout", "plugins:\n  health_timeout: -1m\n", `line 2: plugins.health_timeout: -1m0s is negative`},
		{"health timeout under probe timeout", "plugins:\n  probe_timeout: 5s\n  health_timeout: 1s\n", `line 3: plugins.health_timeout: 1s is shorter than plugins.probe_timeout (5s)`},
		{"health timeout not a duration", "plugins:\n  health_timeout: 120\n", `line 2: plugins.health_timeout: want a duration`},
		{"hung rpc restart negative", "plugins:\n  hung_rpc_restart: -1\n", `line 2: plugins.hung_rpc_restart: -1 is negative; 0 turns the restart off`},
		{"hung rpc restart absurd", "plugins:\n  hung_rpc_restart: 1001\n", `line 2: plugins.hung_rpc_restart: 1001 is more than 1000; 0 turns the restart off`},
		{"hung rpc restart not an int", "plugins:\n  hung_rpc_restart: 3s\n", `line 2: plugins.hung_rpc_restart: want an integer`},
		{"stop_on_agent_exit not a bool", "plugins:\n  stop_on_agent_exit: sometimes\n", `line 2: plugins.stop_on_agent_exit: want true or false`},
		{"stats interval zero", "volumes:\n  stats_interval: 0s\n", `line 2: volumes.stats_interval: 0s: want a positive duration like "1m" (leave the key out for the default)`},
		{"stats interval negative", "volumes:\n  stats_interval: -5s\n", `line 2: volumes.stats_interval: -5s is negative; want a positive duration like "1m"`},
		{"stats interval not a duration", "volumes:\n  stats_interval: often\n", `line 2: volumes.stats_interval: "often": want a duration like "30s" or "500ms"`},
		{"stall after zero", "volumes:\n  stall_after: 0s\n", `line 2: volumes.stall_after: 0s: want a positive duration like "5m" (leave the key out for the default)`},
		{"stall after negative", "volumes:\n  stall_after: -1m\n", `line 2: volumes.stall_after: -1m0s is negative; want a positive duration like "5m"`},
		{"plugin wait negative", "volumes:\n  plugin_wait: -1s\n", `line 2: volumes.plugin_wait: -1s is negative: want a duration from 0s (do not wait) to 1h0m0s, like "30s"`},
		{"plugin wait absurd", "volumes:\n  plugin_wait: 2h\n", `line 2: volumes.plugin_wait: 2h0m0s: want a duration from 0s (do not wait) to 1h0m0s, like "30s"`},
		{"mount check interval negative", "volumes:\n  mount_check_interval: -30s\n", `line 2: volumes.mount_check_interval: -30s is negative; want a duration like "30s", or 0s to turn the periodic check off`},
		{"mount check interval too short", "volumes:\n  mount_check_interval: 100ms\n", `line 2: volumes.mount_check_interval: 100ms is out of range; want a duration from 1s to 24h0m0s like "30s", or 0s to turn the periodic check off`},
		{"mount check interval absurd", "volumes:\n  mount_check_interval: 48h\n", `line 2: volumes.mount_check_interval: 48h0m0s is out of range; want a duration from 1s to 24h0m0s like "30s", or 0s to turn the periodic check off`},
		{"stall after not a duration", "volumes:\n  stall_after: soon\n", `line 2: volumes.stall_after: "soon": want a duration like "30s" or "500ms"`},
		{"backoff max", "volumes:\n  retry:\n    initial: 1m\n    max: 1s\n", `line 4: volumes.retry.max: 1s is shorter than initial (1m0s)`},
		{"backoff jitter", "plugins:\n  restart_backoff:\n    jitter: 2\n", `line 3: plugins.restart_backoff.jitter: 2: want a fraction from 0 to 1`},
		{"image unknown engine", "allocations:\n  - id: a\n    plugin: p\n    type: node\n    image:\n      image: csi/x:1\n      engine: rkt\n", `line 7: allocations[0].image.engine: "rkt" is not an engine: want docker or podman`},
		{"image bad pull", "allocations:\n  - id: a\n    plugin: p\n    type: node\n    image:\n      image: csi/x:1\n      pull: sometimes\n", `line 7: allocations[0].image.pull: "sometimes" is not a pull policy: want missing, always or never`},
		{"image relative mount", "allocations:\n  - id: a\n    plugin: p\n    type: node\n    image:\n      image: csi/x:1\n      mounts: [{source: data, target: /data}]\n", `allocations[0].image.mounts[0].source: "data" is a relative path; give an absolute path`},
		{"image and command", "allocations:\n  - id: a\n    plugin: p\n    type: node\n    command: [/bin/p]\n    image: {image: csi/x:1}\n", `line 6: allocations[0].image: give one of socket (an attached plugin), command (an exec-managed plugin) or image (a plugin the agent runs in a container), not command and image`},
		{"image and socket", "allocations:\n  - id: a\n    plugin: p\n    type: node\n    socket: /s\n    image: {image: csi/x:1}\n", `allocations[0].image: give one of socket`},
		{"relative engine socket", "plugins:\n  engines:\n    docker: run/docker.sock\n", `line 3: plugins.engines.docker: "run/docker.sock" is a relative path; give the absolute path of the engine's API socket`},
		{"unknown engine key", "plugins:\n  engines:\n    rkt: /run/rkt.sock\n", `line 3: plugins.engines.rkt: unknown key (known here: docker, podman)`},
		{"relative data dir", "data_dir: var/lib\n", `line 1: data_dir: "var/lib" is not an absolute path`},
		{"bad http addr", "api:\n  http_addr: localhost\n", `line 2: api.http_addr: "localhost" is not host:port`},
		{"bad port", "api:\n  http_addr: localhost:http\n", `line 2: api.http_addr: "localhost:http": port must be a number from 0 to 65535`},
		{"ui without token", "api:\n  ui: true\n", `line 2: api.ui: needs api.token_file or api.tokens: the web UI reads the API over TCP, which is served only with a token`},
		{"token without name", "api:\n  tokens:\n    - {file: /t, scope: read}\n", `api.tokens[0].name: must not be empty`},
		{"token bad name", "api:\n  tokens:\n    - {name: a/b, file: /t, scope: read}\n", `api.tokens[0].name:`},
		{"token without file", "api:\n  tokens:\n    - {name: a, scope: read}\n", `api.tokens[0].file: must be set`},
		{"token relative file", "api:\n  tokens:\n    - {name: a, file: t, scope: read}\n", `api.tokens[0].file: "t" is not an absolute path`},
		{"token unknown scope", "api:\n  tokens:\n    - {name: a, file: /a, scope: read}\n    - {name: b, file: /b, scope: admin}\n", `api.tokens[1].scope: "admin": want read, claim or operator`},
		{"token without scope", "api:\n  tokens:\n    - {name: a, file: /a}\n", `api.tokens[0].scope: "": want read, claim or operator`},
		{"token duplicate name", "api:\n  tokens:\n    - {name: a, file: /a, scope: read}\n    - {name: a, file: /b, scope: claim}\n", `api.tokens[1].name: "a" is also the name of api.tokens[0]`},
		{"token named like the unix socket", "api:\n  tokens:\n    - {name: unix, file: /a, scope: read}\n", `api.tokens[0].name: "unix" is the name the unix socket's requests are recorded under`},
		{"token named like token_file", "api:\n  token_file: /t\n  tokens:\n    - {name: default, file: /a, scope: read}\n", `api.tokens[0].name: "default" is the name of the token of api.token_file`},
		{"token unknown key", "api:\n  tokens:\n    - {name: a, file: /a, scope: read, value: x}\n", `api.tokens[0].value: unknown key`},
		{"long exec socket", "data_dir: /" + strings.Repeat("d", 80) + "\nallocations:\n  - {id: " + strings.Repeat("a", 30) + ", plugin: p, type: node, command: [x]}\n",
			"over the 107-byte unix socket limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.in))
			if err == nil {
				t.Fatalf("ParseConfig = nil error, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseConfig error\n got %q\nwant %q", err, tc.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %q does not unwrap to ErrInvalid", err)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error %q repeats a value", err)
			}
		})
	}
}

// TestParseConfig_HungRPCRestart: the key's default, a count, and 0,
// which turns the restart off (HungRPCRestartOff, since zero means the
// default in a Config).
func TestParseConfig_HungRPCRestart(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", DefaultHungRPCRestart},
		{"plugins:\n  hung_rpc_restart: 5\n", 5},
		{"plugins:\n  hung_rpc_restart: 1000\n", 1000},
		{"plugins:\n  hung_rpc_restart: 0\n", HungRPCRestartOff},
	} {
		cfg, err := ParseConfig([]byte(tc.in))
		if err != nil {
			t.Fatalf("ParseConfig(%q): %v", tc.in, err)
		}
		if got := cfg.WithDefaults().Plugins.HungRPCRestart; got != tc.want {
			t.Errorf("ParseConfig(%q): hung_rpc_restart %d, want %d", tc.in, got, tc.want)
		}
	}
	c := DefaultConfig()
	c.Plugins.HungRPCRestart = -2
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "plugins.hung_rpc_restart: -2 is negative") {
		t.Errorf("Validate with hung_rpc_restart -2 = %v, want an error naming the key", err)
	}
}

func TestParseConfig_MountCheckInterval(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", DefaultMountCheckInterval},
		{"volumes:\n  mount_check_interval: 1s\n", time.Second},
		{"volumes:\n  mount_check_interval: 24h\n", 24 * time.Hour},
		{"volumes:\n  mount_check_interval: 0s\n", MountCheckOff},
	} {
		cfg, err := ParseConfig([]byte(tc.in))
		if err != nil {
			t.Fatalf("ParseConfig(%q): %v", tc.in, err)
		}
		if got := cfg.WithDefaults().Volumes.MountCheckInterval; got != tc.want {
			t.Errorf("ParseConfig(%q): mount_check_interval %s, want %s", tc.in, got, tc.want)
		}
	}
	c := DefaultConfig()
	c.Volumes.MountCheckInterval = -2 * time.Second
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "volumes.mount_check_interval: -2s is out of range") {
		t.Errorf("Validate with mount_check_interval -2s = %v, want an error naming the key", err)
	}
}

func TestParseConfig_SyntaxError(t *testing.T) {
	_, err := ParseConfig([]byte("api:\n  socket: [\n"))
	if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "line") {
		t.Fatalf("ParseConfig(bad YAML) = %v, want an ErrInvalid naming a line", err)
	}
}

func TestParseConfig_Aliases(t *testing.T) {
	// Anchors and aliases work for values...
	cfg, err := ParseConfig([]byte("allocations:\n  - {id: a, plugin: p, type: node, command: &c [/bin/p, -v]}\n  - {id: b, plugin: p, type: node, command: *c}\n"))
	if err != nil {
		t.Fatalf("ParseConfig with an alias: %v", err)
	}
	if got := cfg.Allocations[1].Command; !reflect.DeepEqual(got, []string{"/bin/p", "-v"}) {
		t.Errorf("aliased command = %q", got)
	}
	// ...but a document that expands to too many nodes is refused.
	var b strings.Builder
	b.WriteString("allocations:\n  - &a {id: a, plugin: p, type: node, command: [x, y, z]}\n")
	for range 10000 {
		b.WriteString("  - *a\n")
	}
	if _, err := ParseConfig([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("ParseConfig(alias flood) = %v, want a too-large error", err)
	}
}

func TestLoadConfigFile_Cases(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("data_dir: /d\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfigFile(good)
	if err != nil || cfg.DataDir != "/d" {
		t.Fatalf("LoadConfigFile = %+v, %v", cfg, err)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("log:\n  levle: info\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadConfigFile(bad)
	if want := bad + ": line 2: log.levle: unknown key"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("LoadConfigFile(bad) = %v, want prefix %q", err, want)
	}

	_, err = LoadConfigFile(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadConfigFile(missing) = %v, want os.ErrNotExist", err)
	}

	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxConfigFileSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfigFile(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("LoadConfigFile(big) = %v, want a size error", err)
	}
}

func TestConfig_WithDefaults_FillsZeros(t *testing.T) {
	got := Config{DataDir: "/x", Plugins: PluginsConfig{RPCTimeout: time.Second}}.WithDefaults()
	want := DefaultConfig()
	want.DataDir = "/x"
	want.Plugins.RPCTimeout = time.Second
	if !reflect.DeepEqual(got, want) {
		t.Errorf("WithDefaults:\n got %+v\nwant %+v", got, want)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero Config.Validate() = %v, want nil (zero means default)", err)
	}
}

func TestConfig_Paths(t *testing.T) {
	c := Config{DataDir: "/var/lib/csiactor"}
	if got := c.APISocketPath(); got != "/var/lib/csiactor/api.sock" {
		t.Errorf("APISocketPath = %q", got)
	}
	c.API.Socket = "/run/a.sock"
	if got := c.APISocketPath(); got != "/run/a.sock" {
		t.Errorf("APISocketPath with api.socket = %q", got)
	}
	if got := c.PluginSocketPath("n1"); got != "/var/lib/csiactor/plugins/n1/csi.sock" {
		t.Errorf("PluginSocketPath = %q", got)
	}
}

func TestConfig_Validate_LongDataDir(t *testing.T) {
	c := Config{DataDir: "/" + strings.Repeat("d", 100)}
	wantFieldErr(t, c.Validate(), "data_dir", "set api.socket")
	c.API.Socket = "/run/a.sock"
	if err := c.Validate(); err != nil {
		t.Errorf("with api.socket: %v", err)
	}
}

// FuzzParseConfig checks that the loader never panics, that whatever it
// accepts is valid, and that a valid config survives a YAML round trip.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(fullConfigYAML))
	f.Add([]byte(`{"data_dir": "/d", "allocations": [{"id": "a", "plugin": "p", "type": "node", "socket": "/s"}]}`))
	f.Add([]byte("a: &a [x]\nb: *a\n"))
	f.Add([]byte("plugins:\n  rpc_timeout: 1h\n  restart_backoff: {jitter: 0.1}\n"))
	f.Add([]byte("allocations:\n  - env: {A: 1, B: ~}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %q does not unwrap to ErrInvalid", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted config fails Validate: %v", err)
		}
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		again, err := ParseConfig(out)
		if err != nil {
			t.Fatalf("re-parse of\n%s\nfailed: %v", out, err)
		}
		if !reflect.DeepEqual(normalize(cfg), normalize(again)) {
			t.Fatalf("round trip differs:\n got %+v\nwant %+v", again, cfg)
		}
	})
}

// normalize makes empty and nil slices and maps compare equal.
func normalize(c Config) Config {
	if len(c.Allocations) == 0 {
		c.Allocations = nil
	}
	for i := range c.Allocations {
		a := &c.Allocations[i]
		if len(a.Command) == 0 {
			a.Command = nil
		}
		if len(a.Env) == 0 {
			a.Env = nil
		}
	}
	return c
}

// TestParseConfig_Image: an image allocation and the engines' sockets as
// the file gives them; capabilities left out are nil (the default by
// type), an empty list is none.
func TestParseConfig_Image(t *testing.T) {
	cfg, err := ParseConfig([]byte(`plugins:
  engines:
    podman: /run/user/podman.sock
allocations:
  - id: a
    plugin: p
    type: node
    image:
      image: csi/x:1
      engine: podman
      args: ["--endpoint={endpoint}"]
      capabilities: []
      mounts:
        - {source: /srv, target: /data, read_only: true}
      pull: never
  - id: b
    plugin: p
    type: controller
    image: {image: csi/x:1}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.WithDefaults()
	if got, want := cfg.Plugins.Engines, (EnginesConfig{Docker: "/var/run/docker.sock", Podman: "/run/user/podman.sock"}); got != want {
		t.Errorf("engines %+v, want %+v", got, want)
	}
	a, b := cfg.Allocations[0].Image, cfg.Allocations[1].Image
	if a == nil || b == nil {
		t.Fatalf("images %v %v, want both set", a, b)
	}
	if a.Engine != "podman" || a.Pull != "never" || a.Capabilities == nil || len(a.Capabilities) != 0 ||
		len(a.Mounts) != 1 || a.Mounts[0] != (container.Mount{Source: "/srv", Target: "/data", ReadOnly: true}) || a.Args[0] != "--endpoint={endpoint}" {
		t.Errorf("image a = %+v", *a)
	}
	if b.Capabilities != nil || b.EngineName() != "docker" || b.PullPolicy() != "missing" {
		t.Errorf("image b = %+v: want default capabilities (nil), engine docker, pull missing", *b)
	}
}
