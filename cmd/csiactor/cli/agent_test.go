package cli_test

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/cmd/csiactor/cli"
	"github.com/csiactor/csiactor/runtime"
)

// fakeRuntime is the agent's runtime for these tests: the fake backend
// plus Start and Shutdown that count their calls.
type fakeRuntime struct {
	*apitest.Backend
	startErr error

	mu        sync.Mutex // guards the fields below
	starts    int
	shutdowns int
}

func (f *fakeRuntime) Start(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts++
	return f.startErr
}

func (f *fakeRuntime) Shutdown(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shutdowns++
	return nil
}

func (f *fakeRuntime) counts() (starts, shutdowns int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts, f.shutdowns
}

// agentHarness records what the agent command handed to NewAgent.
type agentHarness struct {
	rt      *fakeRuntime
	newErr  error
	mu      sync.Mutex
	cfg     runtime.Config
	deps    cli.AgentDeps
	created int
}

func newHarness() *agentHarness {
	return &agentHarness{rt: &fakeRuntime{Backend: apitest.NewBackend()}}
}

func (h *agentHarness) option() cli.Option {
	return cli.WithAgent(func(cfg runtime.Config, deps cli.AgentDeps) (cli.Agent, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.cfg, h.deps = cfg, deps
		h.created++
		if h.newErr != nil {
			return nil, h.newErr
		}
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "csiactor_test_up", Help: "Test gauge."})
		g.Set(1)
		if err := deps.Registerer.Register(g); err != nil {
			return nil, err
		}
		deps.Log.Info("runtime built")
		return h.rt, nil
	})
}

func (h *agentHarness) config() runtime.Config {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cfg
}

var tcpAddrRE = regexp.MustCompile(`on (https?://(?:[0-9.]+|\[[0-9a-f:]*\]):\d+)`)

// startAgent runs `csiactor agent args...` until the returned stop is
// called; it waits until the agent serves and returns its TCP address.
func startAgent(t *testing.T, h *agentHarness, args ...string) (tcpAddr string, stdout, stderr *syncBuffer, stop func() int) {
	t.Helper()
	return startAgentWith(t, []cli.Option{h.option()}, args...)
}

// startAgentWith is startAgent with the given options (none: the real
// runtime).
func startAgentWith(t *testing.T, opts []cli.Option, args ...string) (tcpAddr string, stdout, stderr *syncBuffer, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr, done := startCLI(ctx, t, nil, opts, append([]string{"agent"}, args...)...)
	exited := false
	code := -1
	stop = func() int {
		if !exited {
			cancel()
			code = exitCode(t, done)
			exited = true
		}
		return code
	}
	t.Cleanup(func() { stop() })
	waitFor(t, "the agent to serve", func() bool {
		select {
		case c := <-done:
			t.Fatalf("agent exited early with %d\nstdout:\n%s\nstderr:\n%s", c, stdout.String(), stderr.String())
		default:
		}
		return tcpAddrRE.MatchString(stdout.String())
	})
	return tcpAddrRE.FindStringSubmatch(stdout.String())[1], stdout, stderr, stop
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestAgent_Serves_UntilInterrupted(t *testing.T) {
	h := newHarness()
	dataDir := t.TempDir()
	tcp, stdout, stderr, stop := startAgent(t, h, "-data-dir", dataDir, "-http-addr", "127.0.0.1:0", "-log-format", "json")
	socket := filepath.Join(dataDir, "api.sock")

	if !strings.Contains(stdout.String(), "csiactor agent: API on unix://"+socket+"\n") {
		t.Errorf("stdout does not announce the API socket:\n%s", stdout.String())
	}
	fi, err := os.Lstat(socket)
	if err != nil || fi.Mode()&fs.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("API socket: %v, %v; want a 0600 socket", fi.Mode(), err)
	}
	// The full API on the socket, through the CLI.
	env := map[string]string{cli.AddressEnv: "unix://" + socket}
	runCLI(t, env, "alloc", "register", "-plugin", "hostpath", "-type", "node", "-socket", "/run/hp.sock", "hp1").want(t, 0, "")
	runCLI(t, env, "plugin", "list").contains(t, "stdout", "hostpath")

	// Health and metrics on TCP; the API is not there without a token.
	if code, body := httpGet(t, tcp+"/v1/health"); code != 200 || !strings.Contains(body, `"ok"`) {
		t.Errorf("TCP health: %d %s", code, body)
	}
	code, body := httpGet(t, tcp+"/metrics")
	buildInfo := `csiactor_build_info{goversion="` + goruntime.Version() + `",revision="`
	for _, m := range []string{"csiactor_test_up 1", "go_goroutines", "process_open_fds", buildInfo} {
		if code != 200 || !strings.Contains(body, m) {
			t.Errorf("TCP /metrics (%d) lacks %s", code, m)
		}
	}
	if code, _ := httpGet(t, tcp+"/v1/plugins"); code != 404 {
		t.Errorf("TCP /v1/plugins without a token configured: %d, want 404", code)
	}

	cfg := h.config()
	if cfg.DataDir != dataDir || cfg.Log.Format != "json" || cfg.Plugins.RPCTimeout != runtime.DefaultRPCTimeout {
		t.Errorf("NewAgent got config %+v", cfg)
	}
	if starts, _ := h.rt.counts(); starts != 1 {
		t.Errorf("Start called %d times", starts)
	}

	if code := stop(); code != 0 {
		t.Errorf("exit code %d\nstderr:\n%s", code, stderr.String())
	}
	if _, shutdowns := h.rt.counts(); shutdowns != 1 {
		t.Errorf("Shutdown called %d times, want 1", shutdowns)
	}
	if _, err := os.Lstat(socket); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("API socket left behind: %v", err)
	}
	for _, want := range []string{`"msg":"runtime built"`, `"msg":"agent running"`, `"msg":"agent stopped"`, `"path":"/v1/allocations/hp1"`} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("JSON log lacks %s:\n%s", want, stderr.String())
		}
	}
}

func TestAgent_ConfigFile_TokenOpensTCP(t *testing.T) {
	h := newHarness()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("tok-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(dir, "data")
	cfgFile := filepath.Join(dir, "csiactor.yaml")
	cfgText := "data_dir: " + dataDir + "\napi:\n  http_addr: 127.0.0.1:9\n  token_file: " + tokenFile +
		"\nlog:\n  level: debug\nplugins:\n  rpc_timeout: 45s\n" +
		"allocations:\n  - {id: hp1, plugin: hostpath, type: monolith, socket: /run/hp.sock}\n"
	if err := os.WriteFile(cfgFile, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	// -http-addr overrides the file's api.http_addr.
	tcp, stdout, _, stop := startAgent(t, h, "-config", cfgFile, "-http-addr", "127.0.0.1:0")
	if !strings.Contains(stdout.String(), "metrics, health and the API (with the bearer token) on "+tcp) {
		t.Errorf("stdout:\n%s", stdout.String())
	}
	cfg := h.config()
	if cfg.DataDir != dataDir || cfg.Log.Level != "debug" || cfg.Plugins.RPCTimeout.String() != "45s" ||
		len(cfg.Allocations) != 1 || cfg.Allocations[0].ID != "hp1" || cfg.API.HTTPAddr != "127.0.0.1:0" {
		t.Errorf("NewAgent got config %+v", cfg)
	}
	r := runCLI(t, nil, "plugin", "list", "-address", tcp, "-token-file", tokenFile)
	r.want(t, 0, "NAME  PROVIDER  VERSION  CONTROLLERS  NODES  CONTROLLER REQUIRED\n")
	r = runCLI(t, map[string]string{cli.TokenEnv: "tok-123"}, "plugin", "list", "-address", tcp)
	r.want(t, 0, "")
	r = runCLI(t, nil, "plugin", "list", "-address", tcp)
	r.want(t, 1, "")
	r.contains(t, "stderr", "csiactor: missing or wrong bearer token: give the agent's API token with -token-file FILE or $CSIACTOR_TOKEN\n")
	r = runCLI(t, map[string]string{cli.TokenEnv: "tok-1234"}, "plugin", "list", "-address", tcp)
	r.want(t, 1, "")
	r.contains(t, "stderr", "csiactor: missing or wrong bearer token: the agent refused the token from $CSIACTOR_TOKEN\n")
	if strings.Contains(r.stderr, "tok-1234") {
		t.Errorf("stderr shows the token: %s", r.stderr)
	}
	if code := stop(); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

// A live agent with api.tokens: each token within its scope, a 403
// naming the scope beyond it, and a token file rotated, then removed,
// without a restart.
func TestAgent_ConfigFile_ScopedTokens(t *testing.T) {
	h := newHarness()
	dir := t.TempDir()
	write := func(name, value string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	monitor := write("monitor", "mon-111")
	cfgFile := filepath.Join(dir, "csiactor.yaml")
	cfgText := "data_dir: " + filepath.Join(dir, "data") + "\napi:\n  tokens:\n" +
		"    - {name: monitor, file: " + monitor + ", scope: read}\n" +
		"    - {name: scheduler, file: " + write("scheduler", "sched-222") + ", scope: claim}\n"
	if err := os.WriteFile(cfgFile, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	tcp, stdout, _, stop := startAgent(t, h, "-config", cfgFile, "-http-addr", "127.0.0.1:0")
	if !strings.Contains(stdout.String(), "metrics, health and the API (with the bearer token) on "+tcp) {
		t.Errorf("stdout:\n%s", stdout.String())
	}
	as := func(token string, args ...string) result {
		return runCLI(t, map[string]string{cli.TokenEnv: token}, append(args, "-address", tcp)...)
	}
	as("mon-111", "plugin", "list").want(t, 0, "NAME  PROVIDER  VERSION  CONTROLLERS  NODES  CONTROLLER REQUIRED\n")
	r := as("sched-222", "alloc", "deregister", "hp1")
	r.want(t, 1, "")
	r.contains(t, "stderr", `csiactor: this request needs the operator scope; token "scheduler" has claim`)

	// Rotation: the new value works, the old one is refused.
	tmp := write(".monitor.new", "mon-333")
	if err := os.Rename(tmp, monitor); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rotated token to work", func() bool { return as("mon-333", "plugin", "list").code == 0 })
	as("mon-111", "plugin", "list").want(t, 1, "")
	// Removed: revoked; the other token works on.
	if err := os.Remove(monitor); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the removed token refused", func() bool { return as("mon-333", "plugin", "list").code == 1 })
	as("sched-222", "plugin", "list").want(t, 0, "NAME  PROVIDER  VERSION  CONTROLLERS  NODES  CONTROLLER REQUIRED\n")
	if code := stop(); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

func TestAgent_Dev_TempDirAndExamplePlugin(t *testing.T) {
	h := newHarness()
	_, stdout, _, stop := startAgent(t, h, "-dev", "-http-addr", "127.0.0.1:0")
	cfg := h.config()
	if !strings.HasPrefix(filepath.Base(cfg.DataDir), "csiactor-dev-") {
		t.Errorf("dev data dir %q", cfg.DataDir)
	}
	if fi, err := os.Stat(cfg.DataDir); err != nil || !fi.IsDir() {
		t.Errorf("dev data dir: %v", err)
	}
	if len(cfg.Allocations) != 1 {
		t.Fatalf("dev allocations %+v", cfg.Allocations)
	}
	a := cfg.Allocations[0]
	exe, _ := os.Executable()
	wantCmd := []string{exe, "example-plugin", "-state-dir", filepath.Join(cfg.DataDir, "example-plugin"), "-log-format", "json"}
	if a.ID != cli.DevAllocationID || a.Plugin != cli.DevAllocationID || a.Type != runtime.TypeMonolith || strings.Join(a.Command, " ") != strings.Join(wantCmd, " ") {
		t.Errorf("dev allocation %+v, want command %q", a, wantCmd)
	}
	if want := "export CSIACTOR_ADDR=unix://" + filepath.Join(cfg.DataDir, "api.sock"); !strings.Contains(stdout.String(), want) {
		t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
	}
	if code := stop(); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if _, err := os.Stat(cfg.DataDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dev data dir not removed: %v", err)
	}
}

func TestAgent_Errors(t *testing.T) {
	dir := t.TempDir()
	badCfg := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badCfg, []byte("log:\n  levle: info\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	exampleCfg := filepath.Join(dir, "example.yaml")
	if err := os.WriteFile(exampleCfg, []byte("allocations:\n  - {id: example, plugin: p, type: node, socket: /run/p.sock}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	openToken := filepath.Join(dir, "open-token")
	if err := os.WriteFile(openToken, []byte("0pen-t0ken\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(openToken, 0o644); err != nil {
		t.Fatal(err)
	}
	openTokenCfg := filepath.Join(dir, "open-token.yaml")
	if err := os.WriteFile(openTokenCfg, []byte("data_dir: "+filepath.Join(dir, "d4")+"\napi:\n  tokens:\n    - {name: m, file: "+openToken+", scope: read}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badScopeCfg := filepath.Join(dir, "bad-scope.yaml")
	if err := os.WriteFile(badScopeCfg, []byte("api:\n  tokens:\n    - {name: m, file: "+openToken+", scope: admin}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		args  []string
		setup func(h *agentHarness)
		code  int
		want  string
	}{
		{"bad config file", []string{"-config", badCfg}, nil, 1, badCfg + ": line 2: log.levle: unknown key"},
		{"missing config file", []string{"-config", filepath.Join(dir, "none.yaml")}, nil, 1, "no such file or directory"},
		{"bad log format", []string{"-log-format", "xml"}, nil, 2, `-log-format "xml": want text or json`},
		{"bad log level", []string{"-log-level", "loud"}, nil, 2, `-log-level "loud"`},
		{"unknown flag", []string{"-verbose"}, nil, 2, "flag provided but not defined: -verbose"},
		{"extra argument", []string{"now"}, nil, 2, `unexpected argument "now"`},
		{"empty http addr", []string{"-data-dir", filepath.Join(dir, "d1"), "-http-addr", ""}, nil, 2, "-http-addr must not be empty"},
		{"dev allocation ID taken", []string{"-dev", "-config", exampleCfg, "-http-addr", "127.0.0.1:0"}, nil, 1,
			`csiactor: -dev: allocations[0] of the config file has the ID "example", which -dev gives the example plugin`},
		{"token file open to others", []string{"-config", openTokenCfg, "-http-addr", "127.0.0.1:0"}, nil, 1,
			"csiactor: config: api.tokens[0].file: token file " + openToken + ": mode 0644 lets group or others read it; chmod 600 it"},
		{"unknown token scope", []string{"-config", badScopeCfg}, nil, 1, `api.tokens[0].scope: "admin": want read, claim or operator`},
		{"bad http addr", []string{"-data-dir", filepath.Join(dir, "d1"), "-http-addr", "nowhere"}, nil, 1, `config: api.http_addr: "nowhere" is not host:port`},
		{"new agent fails", []string{"-data-dir", filepath.Join(dir, "d2"), "-http-addr", "127.0.0.1:0"},
			func(h *agentHarness) { h.newErr = errors.New("store: locked") }, 1, "csiactor: agent: store: locked"},
		{"start fails", []string{"-data-dir", filepath.Join(dir, "d3"), "-http-addr", "127.0.0.1:0"},
			func(h *agentHarness) { h.rt.startErr = errors.New("restore: corrupt") }, 1, "csiactor: agent start: restore: corrupt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness()
			if tc.setup != nil {
				tc.setup(h)
			}
			r := runCLIContext(context.Background(), t, nil, []cli.Option{h.option()}, append([]string{"agent"}, tc.args...)...)
			r.want(t, tc.code, "")
			r.contains(t, "stderr", tc.want)
			if starts, shutdowns := h.rt.counts(); h.created > 0 && h.newErr == nil && shutdowns != 1 {
				t.Errorf("runtime built, started %d times, shut down %d times; want one shutdown", starts, shutdowns)
			}
		})
	}
	t.Run("start fails leaves no socket", func(t *testing.T) {
		if _, err := os.Lstat(filepath.Join(dir, "d3", "api.sock")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("socket left: %v", err)
		}
	})
}

func TestAgent_NoRuntime_Exit1(t *testing.T) {
	r := runCLIContext(context.Background(), t, nil, []cli.Option{cli.WithAgent(nil)}, "agent", "-dev")
	r.want(t, 1, "")
	r.contains(t, "stderr", "this csiactor binary has no agent runtime")
}

// A second agent on the same data dir fails before starting its runtime,
// and the first keeps serving.
func TestAgent_SecondOnSameDataDir_Fails(t *testing.T) {
	first := newHarness()
	dataDir := t.TempDir()
	_, _, _, stop := startAgent(t, first, "-data-dir", dataDir, "-http-addr", "127.0.0.1:0")
	second := newHarness()
	r := runCLIContext(context.Background(), t, nil, []cli.Option{second.option()}, "agent", "-data-dir", dataDir, "-http-addr", "127.0.0.1:0")
	r.want(t, 1, "")
	r.contains(t, "stderr", "socket in use: another process answers on "+filepath.Join(dataDir, "api.sock"))
	if starts, shutdowns := second.rt.counts(); starts != 0 || shutdowns != 1 {
		t.Errorf("second runtime: %d starts, %d shutdowns; want 0 and 1", starts, shutdowns)
	}
	runCLI(t, map[string]string{cli.AddressEnv: "unix://" + filepath.Join(dataDir, "api.sock")}, "status").want(t, 0, "")
	if code := stop(); code != 0 {
		t.Errorf("first agent exit code %d", code)
	}
}

// $CSIACTOR_BOOT_ID_FILE points the runtime's boot ID check at another
// file (the tests' reboot seam); without it the runtime's default stays.
func TestAgent_BootIDFileEnv(t *testing.T) {
	for _, tc := range []struct{ env, want string }{{"/run/test/boot_id", "/run/test/boot_id"}, {"", ""}} {
		h := newHarness()
		ctx, cancel := context.WithCancel(context.Background())
		stdout, stderr, done := startCLI(ctx, t, map[string]string{cli.BootIDFileEnv: tc.env}, []cli.Option{h.option()},
			"agent", "-dev", "-http-addr", "127.0.0.1:0")
		waitFor(t, "the agent to serve", func() bool {
			select {
			case c := <-done:
				t.Fatalf("agent exited early with %d\n%s\n%s", c, stdout.String(), stderr.String())
			default:
			}
			return tcpAddrRE.MatchString(stdout.String())
		})
		if got := h.config().Host.BootIDFile; got != tc.want {
			t.Errorf("$%s=%q: Host.BootIDFile = %q, want %q", cli.BootIDFileEnv, tc.env, got, tc.want)
		}
		cancel()
		if code := exitCode(t, done); code != 0 {
			t.Errorf("exit code %d", code)
		}
	}
}
