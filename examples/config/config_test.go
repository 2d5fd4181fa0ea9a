package config

import (
	"bufio"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/csiactor/csiactor/runtime"
)

const (
	sampleConfig = "csiactor.yaml"
	sampleUnit   = "csiactor.service"
)

// TestSampleConfig_Load loads the sample as the agent does and checks what
// it says: the defaults it claims to show are the defaults, and its two
// allocations are an attached node and an exec-managed monolith.
func TestSampleConfig_Load(t *testing.T) {
	cfg, err := runtime.LoadConfigFile(sampleConfig)
	if err != nil {
		t.Fatalf("LoadConfigFile(%s): %v", sampleConfig, err)
	}

	// Everything but the allocations is a default, the API socket too.
	want := runtime.DefaultConfig()
	got := cfg
	got.Allocations = nil
	want.Allocations = nil
	if len(got.API.Tokens) == 0 {
		got.API.Tokens = nil // "tokens: []"
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the sample's values are not the defaults it says it shows:\n got %+v\nwant %+v", got, want)
	}
	if cfg.APISocketPath() != runtime.DefaultConfig().APISocketPath() {
		t.Errorf("api.socket = %s, want the default path %s", cfg.APISocketPath(), runtime.DefaultConfig().APISocketPath())
	}

	if len(cfg.Allocations) != 3 {
		t.Fatalf("allocations: got %d, want 3", len(cfg.Allocations))
	}
	attached, exec, image := cfg.Allocations[0], cfg.Allocations[1], cfg.Allocations[2]
	if image.Image == nil || image.Socket != "" || len(image.Command) != 0 || image.Image.Engine != "docker" {
		t.Errorf("allocations[2] = %+v, want a monolith run from its image by docker", image)
	}
	if attached.Socket == "" || len(attached.Command) != 0 || attached.Type != runtime.TypeNode {
		t.Errorf("allocations[0] = %+v, want an attached node allocation", attached)
	}
	if exec.Socket != "" || len(exec.Command) == 0 || exec.Type != runtime.TypeMonolith || len(exec.Env) == 0 {
		t.Errorf("allocations[1] = %+v, want an exec-managed monolith with env", exec)
	}
	if exec.Command[0] != "/usr/bin/csiactor" || exec.Command[1] != "example-plugin" {
		t.Errorf("allocations[1].command = %q, want the example plugin of the installed binary", exec.Command)
	}
	// Its log lines must not nest inside the agent's: JSON, which the
	// agent logs as fields of its own lines.
	if !slices.Contains(exec.Command, "-log-format=json") {
		t.Errorf("allocations[1].command = %q, want -log-format=json for the plugin", exec.Command)
	}
}

// TestSampleConfig_SocketFollowsDataDir: the sample leaves api.socket at
// its default, so a data_dir changed in a copy of it moves the socket too.
func TestSampleConfig_SocketFollowsDataDir(t *testing.T) {
	data, err := os.ReadFile(sampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	const dir = "/srv/csiactor"
	moved := strings.Replace(string(data), "\ndata_dir: /var/lib/csiactor\n", "\ndata_dir: "+dir+"\n", 1)
	if moved == string(data) {
		t.Fatal("the sample has no data_dir line to change")
	}
	p := filepath.Join(t.TempDir(), "moved.yaml")
	if err := os.WriteFile(p, []byte(moved), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := runtime.LoadConfigFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.APISocketPath(), dir+"/"+runtime.APISocketName; got != want {
		t.Errorf("with data_dir %s, the API socket is %s, want %s", dir, got, want)
	}
}

// TestSampleConfig_EveryKey checks that the sample sets every key of
// runtime.Config (found through its yaml tags), so a new key shows up here
// until the sample documents it.
func TestSampleConfig_EveryKey(t *testing.T) {
	data, err := os.ReadFile(sampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("parse %s: %v", sampleConfig, err)
	}
	have := map[string]bool{}
	collectKeys(doc.Content[0], "", have)

	var missing []string
	for _, k := range configKeys(reflect.TypeFor[runtime.Config](), "") {
		// A key of the items of a list the sample leaves empty (api.tokens:
		// a token's file must exist for the agent to start) is documented
		// by a commented-out example item.
		if list, leaf, ok := strings.Cut(k, "[]."); ok && have[list] && !strings.Contains(leaf, ".") &&
			regexp.MustCompile(`(?m)^\s*#\s+(- )?`+regexp.QuoteMeta(leaf)+`: \S`).Match(data) {
			continue
		}
		if !have[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%s does not set (and document) these keys: %s", sampleConfig, strings.Join(missing, ", "))
	}
}

// collectKeys records the dotted path of every mapping key under n; list
// items are entered with "[]".
func collectKeys(n *yaml.Node, prefix string, out map[string]bool) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			if prefix != "" {
				k = prefix + "." + k
			}
			out[k] = true
			collectKeys(n.Content[i+1], k, out)
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			collectKeys(c, prefix+"[]", out)
		}
	}
}

// configKeys lists the dotted yaml paths of t's fields, down to leaves.
// Maps (env), lists of scalars (command) and durations are leaves; lists of
// structs are entered with "[]", so a key that only one kind of allocation
// has (socket, or command and env) is found if any allocation sets it.
func configKeys(t reflect.Type, prefix string) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if opts == "inline" {
			keys = append(keys, configKeys(f.Type, prefix)...)
			continue
		}
		k := name
		if prefix != "" {
			k = prefix + "." + name
		}
		keys = append(keys, k)
		switch {
		case f.Type.Kind() == reflect.Struct:
			keys = append(keys, configKeys(f.Type, k)...)
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
			keys = append(keys, configKeys(f.Type.Elem(), k+"[]")...)
		}
	}
	sort.Strings(keys)
	return keys
}

// TestSampleUnit_Settings checks the systemd unit: it runs the installed
// binary on the sample config's install path, lets the agent stop its own
// plugins, restarts on failure, and uses no option that gives the service
// a private mount namespace (mounts made in one never reach the host, so
// workloads would not see their volumes).
func TestSampleUnit_Settings(t *testing.T) {
	f, err := os.Open(sampleUnit)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	settings := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Errorf("%s: %q is not a KEY=VALUE line", sampleUnit, line)
				continue
			}
			settings[section+"."+k] = append(settings[section+"."+k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	for key, want := range map[string]string{
		"Service.Type":               "simple",
		"Service.ExecStart":          "/usr/bin/csiactor agent -config /etc/csiactor/csiactor.yaml",
		"Service.KillMode":           "process", // plugins outlive the agent
		"Service.Restart":            "on-failure",
		"Service.StateDirectory":     "csiactor",
		"Install.WantedBy":           "multi-user.target",
		"Service.TimeoutStopSec":     "3min",
		"Service.NoNewPrivileges":    "yes",
		"Service.KillSignal":         "SIGTERM",
		"Service.StateDirectoryMode": "0700",
	} {
		if got := settings[key]; len(got) != 1 || got[0] != want {
			t.Errorf("%s: %s = %q, want %q", sampleUnit, key, got, want)
		}
	}

	// The state directory systemd creates is the sample's data_dir.
	cfg, err := runtime.LoadConfigFile(sampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "/var/lib/"+settings["Service.StateDirectory"][0] {
		t.Errorf("data_dir %s is not the unit's StateDirectory /var/lib/%s", cfg.DataDir, settings["Service.StateDirectory"][0])
	}

	for _, opt := range []string{
		"PrivateMounts", "PrivateTmp", "PrivateDevices", "PrivateUsers", "PrivateNetwork",
		"ProtectSystem", "ProtectHome", "ProtectKernelTunables", "ProtectKernelModules",
		"ProtectKernelLogs", "ProtectControlGroups", "ProtectProc", "ProtectHostname", "ProtectClock",
		"ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths", "BindPaths", "BindReadOnlyPaths",
		"TemporaryFileSystem", "MountFlags", "RootDirectory", "RootImage", "DevicePolicy",
	} {
		if v, ok := settings["Service."+opt]; ok {
			t.Errorf("%s sets %s=%s, which gives the agent its own mount namespace or hides devices from plugins", sampleUnit, opt, v[0])
		}
	}
}
