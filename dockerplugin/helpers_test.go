package dockerplugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/dockerplugin"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// waitLimit bounds every wait for something that happens in the
// background; a safety net against a hung test, not a speed assertion.
const waitLimit = 30 * time.Second

const (
	testPlugin = "fake"
	testDriver = "csi"
)

// fullPlugin has every step of a claim, and create/delete.
var fullPlugin = fakeplugin.Config{ControllerPublish: true, StageUnstage: true, CreateDelete: true}

// shortDir is a new directory removed when t ends, short enough for
// socket paths.
func shortDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// rig is a runtime with a fake plugin and the Docker driver "csi" on it.
type rig struct {
	t      testing.TB
	cfg    runtime.Config
	plugin *fakeplugin.Plugin
	sock   string // the plugin's socket
	rt     *runtime.Runtime
	srv    *dockerplugin.Server
	log    *logrus.Logger
}

func newRig(t testing.TB, mod func(*runtime.DockerConfig)) *rig {
	t.Helper()
	return newRigWith(t, func(c *runtime.Config) {
		if mod != nil {
			mod(c.Docker)
		}
	})
}

// newRigWith is newRig with mod applied to the whole runtime config.
func newRigWith(t testing.TB, mod func(*runtime.Config)) *rig {
	t.Helper()
	dir := shortDir(t, "csiactor-dp-")
	dc := &runtime.DockerConfig{
		PluginDir: filepath.Join(dir, "plugins"),
		Drivers:   []runtime.DockerDriver{{Name: testDriver, Plugin: testPlugin}},
		// An engine that never answers: nothing is released by the
		// reconciler unless a test sets engines of its own (the
		// defaults would ask this machine's engines).
		Engines:      []string{filepath.Join(dir, "no-engine.sock")},
		UnmountGrace: time.Nanosecond,
	}
	r := &rig{t: t, log: logrus.New()}
	r.log.SetOutput(io.Discard)
	r.cfg = runtime.Config{
		DataDir: filepath.Join(dir, "data"),
		Plugins: runtime.PluginsConfig{
			HeartbeatInterval: 500 * time.Millisecond,
			ProbeTimeout:      500 * time.Millisecond,
			RestartBackoff:    runtime.BackoffConfig{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2},
		},
		Volumes: runtime.VolumesConfig{Retry: runtime.BackoffConfig{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2}},
		Store:   runtime.StoreConfig{NoSync: true},
		Host:    runtime.HostConfig{SkipMountCheck: true},
		Docker:  dc,
	}
	mod(&r.cfg)
	var endpoint string
	pc := fullPlugin
	if r.cfg.Cluster != nil {
		pc.NodeID = "csi-" + r.cfg.Cluster.NodeID
	}
	r.plugin, endpoint = fakeplugin.Start(t, pc)
	r.sock = endpoint[len("unix://"):]
	r.start()
	if _, err := r.rt.RegisterAllocation(context.Background(), "fake-1", runtime.AllocationSpec{
		Plugin: testPlugin, Type: runtime.TypeMonolith, Socket: r.sock,
	}); err != nil {
		t.Fatal(err)
	}
	r.waitHealthy()
	return r
}

func (r *rig) waitHealthy() {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := r.rt.WaitHealthy(ctx, testPlugin, runtime.TypeMonolith); err != nil {
		r.t.Fatal(err)
	}
}

// start starts a runtime and the Docker server on r's config.
func (r *rig) start() {
	r.t.Helper()
	rt, err := runtime.New(r.cfg, runtime.Options{Log: logrus.NewEntry(r.log)})
	if err != nil {
		r.t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = rt.Shutdown(context.Background()) })
	srv, err := dockerplugin.Start(context.Background(), rt, logrus.NewEntry(r.log))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	r.rt, r.srv = rt, srv
}

// restart stops the Docker server and the runtime and starts new ones on
// the same data dir, as an agent restart does.
func (r *rig) restart() {
	r.t.Helper()
	if err := r.srv.Shutdown(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	if err := r.rt.Shutdown(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	r.start()
	r.waitHealthy()
}

// socket is the driver's socket path.
func (r *rig) socket(driver string) string {
	return filepath.Join(r.cfg.Docker.PluginDir, driver+".sock")
}

// call posts body to the driver's method and decodes the answer.
func (r *rig) call(driver, method string, body any) (int, map[string]any) {
	r.t.Helper()
	status, raw := r.callRaw(driver, method, body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		r.t.Fatalf("%s: answer %q is not JSON: %s", method, raw, err)
	}
	return status, out
}

func (r *rig) callRaw(driver, method string, body any) (int, []byte) {
	r.t.Helper()
	var data []byte
	switch b := body.(type) {
	case []byte:
		data = b
	default:
		var err error
		if data, err = json.Marshal(body); err != nil {
			r.t.Fatal(err)
		}
	}
	c := unixClient(r.socket(driver))
	resp, err := c.Post("http://plugin/"+method, dockerplugin.ContentType, bytes.NewReader(data))
	if err != nil {
		r.t.Fatalf("%s: %s", method, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != dockerplugin.ContentType {
		r.t.Errorf("%s: Content-Type %q", method, ct)
	}
	return resp.StatusCode, raw
}

// ok calls method and fails the test unless it answers 200 without Err.
func (r *rig) ok(method string, body any) map[string]any {
	r.t.Helper()
	status, out := r.call(testDriver, method, body)
	if status != http.StatusOK || out["Err"] != nil {
		r.t.Fatalf("%s(%v) = %d %v", method, body, status, out)
	}
	return out
}

// mount mounts volume for mount ID id and returns the mount point.
func (r *rig) mount(volume, id string) string {
	r.t.Helper()
	out := r.ok("VolumeDriver.Mount", map[string]string{"Name": volume, "ID": id})
	mp, _ := out["Mountpoint"].(string)
	if mp == "" {
		r.t.Fatalf("Mount(%s, %s) answered no Mountpoint: %v", volume, id, out)
	}
	return mp
}

func (r *rig) unmount(volume, id string) {
	r.t.Helper()
	r.ok("VolumeDriver.Unmount", map[string]string{"Name": volume, "ID": id})
}

func (r *rig) volume(id string) runtime.Volume {
	r.t.Helper()
	v, err := r.rt.Volume(context.Background(), id)
	if err != nil {
		r.t.Fatal(err)
	}
	return v
}

// claimed reports whether the volume has a claim (current or past) of
// alloc.
func (r *rig) claimed(volume, alloc string) bool {
	r.t.Helper()
	v := r.volume(volume)
	for _, c := range append(v.Claims, v.PastClaims...) {
		if c.Alloc == alloc {
			return true
		}
	}
	return false
}

// waitGone waits until the volume has no claim of alloc left.
func (r *rig) waitGone(volume, alloc string) {
	r.t.Helper()
	eventually(r.t, fmt.Sprintf("claim of %s on %s gone", alloc, volume), func() bool { return !r.claimed(volume, alloc) })
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func unixClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		DisableKeepAlives: true,
	}}
}

// fakeEngine answers GET /containers/json on a unix socket, as Docker's
// API does, with the containers set by setHolders.
type fakeEngine struct {
	socket string

	mu       sync.Mutex
	holders  []string // guarded by mu: "STATE:VOLUME" of containers with a volume
	failing  bool     // guarded by mu: answer 500
	requests int      // guarded by mu
}

func startFakeEngine(t testing.TB, driver string) *fakeEngine {
	t.Helper()
	return startFakeEngineAt(t, driver, filepath.Join(shortDir(t, "csiactor-eng-"), "engine.sock"))
}

// startFakeEngineAt is startFakeEngine on the socket path.
func startFakeEngineAt(t testing.TB, driver, path string) *fakeEngine {
	t.Helper()
	e := &fakeEngine{socket: path}
	l, err := net.Listen("unix", e.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.requests++
		if r.URL.Path != "/containers/json" || r.URL.Query().Get("all") != "1" {
			http.Error(w, "unexpected request "+r.URL.String(), http.StatusNotFound)
			return
		}
		if e.failing {
			http.Error(w, `{"message":"engine trouble"}`, http.StatusInternalServerError)
			return
		}
		type mount struct{ Type, Name, Driver string }
		// An exited container and a dead one hold nothing, whatever
		// their mounts.
		cs := []map[string]any{
			{"Id": "stopped", "State": "exited", "Mounts": []mount{{Type: "volume", Name: "v2", Driver: driver}}},
			{"Id": "dead", "State": "dead", "Mounts": []mount{{Type: "volume", Name: "v2", Driver: driver}}},
		}
		for i, h := range e.holders {
			state, v, _ := strings.Cut(h, ":")
			cs = append(cs, map[string]any{"Id": fmt.Sprintf("c%d", i), "State": state,
				"Mounts": []mount{{Type: "volume", Name: v, Driver: driver}, {Type: "bind"}}})
		}
		json.NewEncoder(w).Encode(cs)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return e
}

func (e *fakeEngine) set(failing bool, holders ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failing, e.holders = failing, holders
}

func (e *fakeEngine) requestCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.requests
}

func (r *rig) srv2Log() *logrus.Entry { return logrus.NewEntry(r.log) }
