package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/runtime"
)

// specWait bounds every wait for the runtime to get somewhere in the
// background: a safety net against a hung test, not a speed assertion.
const specWait = 60 * time.Second

// specStep is one request of a spec test and the status it must get.
type specStep struct {
	name   string
	method string
	path   string
	body   string
	status int
	header []string // request headers, name then value
	want   string   // a substring of the answer's body, if set
}

func runSpecSteps(t *testing.T, sc *specChecker, rc *rawClient, steps []specStep) {
	t.Helper()
	for _, s := range steps {
		status, body := sc.do(rc.hc, rc.base, s.method, s.path, s.body, s.header...)
		if status != s.status || !strings.Contains(body, s.want) {
			t.Errorf("%s: %s %s = %d %s, want %d %s", s.name, s.method, s.path, status, body, s.status, s.want)
		}
	}
}

// realEnv is a started runtime with the example plugin, exec-managed (the
// test binary run as the plugin, see testbin.RunExamplePlugin), served by
// api.NewHandler on a real unix socket.
type realEnv struct {
	rt    *runtime.Runtime
	reg   *prometheus.Registry
	rc    *rawClient
	spec  runtime.AllocationSpec
	state string
}

func newRealEnv(t *testing.T) *realEnv {
	t.Helper()
	// Short: the plugin's socket goes in it (107-byte limit).
	dir, err := os.MkdirTemp("", "csa-api-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	backoff := runtime.BackoffConfig{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2}
	reg := prometheus.NewRegistry()
	rt, err := runtime.New(runtime.Config{
		DataDir: filepath.Join(dir, "d"),
		Plugins: runtime.PluginsConfig{
			HeartbeatInterval: 500 * time.Millisecond,
			ProbeTimeout:      500 * time.Millisecond,
			RPCTimeout:        10 * time.Second,
			KillTimeout:       5 * time.Second,
			RestartBackoff:    backoff,
			StopOnAgentExit:   true,
		},
		Volumes: runtime.VolumesConfig{Retry: backoff},
		Store:   runtime.StoreConfig{NoSync: true},
	}, runtime.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e := &realEnv{rt: rt, reg: reg, state: filepath.Join(dir, "plugin")}
	e.spec = runtime.AllocationSpec{
		Plugin: "example", Type: runtime.TypeMonolith,
		// Symlinks: nothing is left mounted on the host if the test
		// fails half-way.
		Command: []string{exe, "-endpoint", "{endpoint}", "-state-dir", e.state, "-node-id", "host-1",
			"-mount-mode", "symlink", "-capacity", "107374182400"},
		Env: map[string]string{examplePluginEnv: "1"},
	}
	ctx := context.Background()
	if _, err := rt.RegisterAllocation(ctx, "example", e.spec); err != nil {
		t.Fatal(err)
	}
	e.waitFor(t, "the example plugin healthy", func() bool {
		p, err := rt.Plugin(ctx, "example")
		return err == nil && p.ControllersHealthy == 1 && p.NodesHealthy == 1
	})
	e.waitFor(t, "the agent ready", func() bool {
		r, err := rt.Ready(ctx)
		return err == nil && r.Status == runtime.ReadyOK
	})
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	e.rc = newRawClient(t, apitest.Serve(t, rt, api.Options{Metrics: metrics}))
	return e
}

func (e *realEnv) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(specWait); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The handlers' real answers match openapi.yaml: every exchange of the
// subtests is checked against it, and every operation must have been
// seen answering at least one success and one error.
func TestOpenAPI_Answers(t *testing.T) {
	sc := newSpecChecker(t)
	t.Run("real backend", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts a runtime and the example plugin")
		}
		answersRealBackend(t, sc.on(t))
	})
	t.Run("cluster mode", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts etcd and two runtimes")
		}
		answersCluster(t, sc.on(t))
	})
	t.Run("fake backend", func(t *testing.T) { answersFakeBackend(t, sc.on(t)) })
	if !testing.Short() {
		sc.requireCoverage()
	}
}

// answersRealBackend sends requests through a runtime that drives the
// example plugin: every route's successes and its errors.
func answersRealBackend(t *testing.T, sc *specChecker) {
	e := newRealEnv(t)
	specJSON, err := json.Marshal(e.spec)
	if err != nil {
		t.Fatal(err)
	}
	create := `{"id":"data1","plugin":"example","capacity_bytes":1073741824,
		"capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}],
		"mount_options":{"fs_type":"ext4","mount_flags":["noatime"]},"parameters":{"tier":"fast"},"secrets":{"k":"v"}}`
	claim := `{"alloc":"w1","mode":"write","access_mode":"single-node-writer","attachment_mode":"file-system"}`
	runSpecSteps(t, sc, e.rc, []specStep{
		{name: "health", method: "GET", path: "/v1/health", status: 200},
		{name: "health with query", method: "GET", path: "/v1/health?x=1", status: 400},
		{name: "ready", method: "GET", path: "/v1/ready", status: 200},
		{name: "ready with query", method: "GET", path: "/v1/ready?x=1", status: 400},
		{name: "metrics", method: "GET", path: "/metrics", status: 200},

		{name: "plugins", method: "GET", path: "/v1/plugins", status: 200},
		{name: "plugins with query", method: "GET", path: "/v1/plugins?x=1", status: 400},
		{name: "plugin", method: "GET", path: "/v1/plugins/example", status: 200},
		{name: "plugin unknown", method: "GET", path: "/v1/plugins/nfs", status: 404},
		{name: "plugin bad name", method: "GET", path: "/v1/plugins/-x", status: 400},
		{name: "capacity", method: "GET", path: "/v1/plugins/example/capacity", status: 200},
		{name: "capacity bad topology", method: "GET", path: "/v1/plugins/example/capacity?topology=zone", status: 400},
		{name: "capacity unknown plugin", method: "GET", path: "/v1/plugins/nfs/capacity", status: 404},
		{name: "call", method: "POST", path: "/v1/plugins/example/call", body: `{"method":"NodeGetInfo"}`, status: 200},
		{name: "call plugin error", method: "POST", path: "/v1/plugins/example/call",
			body: `{"method":"DeleteVolume","request":{}}`, status: 200},
		{name: "call unknown method", method: "POST", path: "/v1/plugins/example/call", body: `{"method":"Mount"}`, status: 400},
		{name: "call unknown plugin", method: "POST", path: "/v1/plugins/nfs/call", body: `{"method":"Probe"}`, status: 404},

		{name: "allocations", method: "GET", path: "/v1/allocations", status: 200},
		{name: "allocations with query", method: "GET", path: "/v1/allocations?x=1", status: 400},
		{name: "register alloc again", method: "PUT", path: "/v1/allocations/example", body: string(specJSON), status: 200},
		{name: "register alloc differently", method: "PUT", path: "/v1/allocations/example", body: `{"plugin":"example","type":"node","socket":"/run/x.sock"}`, status: 409},
		{name: "register alloc unknown field", method: "PUT", path: "/v1/allocations/a2", body: `{"plugin":"example","type":"node","sockett":"/s"}`, status: 400},
		{name: "deregister alloc unknown", method: "DELETE", path: "/v1/allocations/nope", status: 404},
		{name: "logs", method: "GET", path: "/v1/allocations/example/logs", status: 200},
		{name: "logs tail", method: "GET", path: "/v1/allocations/example/logs?tail=2", status: 200},
		{name: "logs unknown", method: "GET", path: "/v1/allocations/nope/logs", status: 404},
		{name: "logs bad tail", method: "GET", path: "/v1/allocations/example/logs?tail=x", status: 400},

		{name: "create volume", method: "POST", path: "/v1/volumes", body: create, status: 201},
		{name: "create volume again", method: "POST", path: "/v1/volumes", body: create, status: 201},
		{name: "create volume differently", method: "POST", path: "/v1/volumes", body: strings.Replace(create, "1073741824", "2147483648", 1), status: 409},
		{name: "create volume to deregister", method: "POST", path: "/v1/volumes", body: strings.Replace(create, `"id":"data1"`, `"id":"data2"`, 1), status: 201},
		{name: "create volume bad capacity", method: "POST", path: "/v1/volumes", body: strings.Replace(create, "1073741824", "-1", 1), status: 400},
		{name: "batch", method: "POST", path: "/v1/volumes/batch", status: 200, want: `"status":"created"`,
			body: `{"volumes":[` + strings.Replace(create, `"id":"data1"`, `"id":"batch1"`, 1) + `,{"id":"batch2","plugin":"example","external_id":"x","capacity_bytes":1}]}`},
		{name: "batch over the limit", method: "POST", path: "/v1/volumes/batch", status: 400, want: "more than 1000",
			body: `{"volumes":[` + strings.TrimSuffix(strings.Repeat(`{"id":"x"},`, 1001), ",") + `]}`},
		{name: "clone of unknown volume", method: "POST", path: "/v1/volumes",
			body: strings.Replace(create, `"id":"data1"`, `"id":"data2","content_source":{"volume":"nope"}`, 1), status: 404},
		{name: "volumes", method: "GET", path: "/v1/volumes", status: 200},
		{name: "volumes of plugin", method: "GET", path: "/v1/volumes?plugin=example", status: 200},
		{name: "volumes bad plugin", method: "GET", path: "/v1/volumes?plugin=a/b", status: 400},
		{name: "volume", method: "GET", path: "/v1/volumes/data1", status: 200},
		{name: "volume unknown", method: "GET", path: "/v1/volumes/nope", status: 404},
		{name: "plugin volumes", method: "GET", path: "/v1/plugins/example/volumes?max_entries=10", status: 200},
		{name: "plugin volumes bad max", method: "GET", path: "/v1/plugins/example/volumes?max_entries=x", status: 400},

		{name: "create snapshot", method: "POST", path: "/v1/snapshots", body: `{"id":"snap1","plugin":"example","source_volume":"data1","secrets":{"k":"v"}}`, status: 201},
		{name: "create snapshot again", method: "POST", path: "/v1/snapshots", body: `{"id":"snap1","plugin":"example","source_volume":"data1","secrets":{"k":"v"}}`, status: 201},
		{name: "create snapshot differently", method: "POST", path: "/v1/snapshots", body: `{"id":"snap1","plugin":"example","source_volume":"data1"}`, status: 409},
		{name: "create snapshot unknown volume", method: "POST", path: "/v1/snapshots", body: `{"id":"snap2","plugin":"example","source_volume":"nope"}`, status: 404},
		{name: "create snapshot bad id", method: "POST", path: "/v1/snapshots", body: `{"id":"-x","plugin":"example","source_volume":"data1"}`, status: 400},
		{name: "snapshots", method: "GET", path: "/v1/snapshots", status: 200},
		{name: "snapshots of volume", method: "GET", path: "/v1/snapshots?volume=data1&plugin=example", status: 200},
		{name: "snapshots unknown volume", method: "GET", path: "/v1/snapshots?volume=nope", status: 404},
		{name: "snapshots bad plugin", method: "GET", path: "/v1/snapshots?plugin=a/b", status: 400},
		{name: "snapshot", method: "GET", path: "/v1/snapshots/snap1", status: 200},
		{name: "snapshot unknown", method: "GET", path: "/v1/snapshots/nope", status: 404},
		{name: "restore unknown snapshot", method: "POST", path: "/v1/volumes",
			body: strings.Replace(create, `"id":"data1"`, `"id":"data3","content_source":{"snapshot":"nope"}`, 1), status: 404},
		{name: "delete snapshot", method: "DELETE", path: "/v1/snapshots/snap1", status: 204},
		{name: "delete snapshot again", method: "DELETE", path: "/v1/snapshots/snap1", status: 404},
	})

	sc.stream(e.rc.hc, e.rc.base, "/v1/allocations/example/logs?follow=true&tail=2", 2, specWait)

	// Deregister data2, which stays with the plugin, and register it
	// again under another ID.
	ctx := context.Background()
	v1, err := e.rt.Volume(ctx, "data1")
	if err != nil {
		t.Fatal(err)
	}
	v2, err := e.rt.Volume(ctx, "data2")
	if err != nil {
		t.Fatal(err)
	}
	register := fmt.Sprintf(`{"plugin":"example","external_id":%q,
		"capabilities":[{"access_mode":"multi-node-reader-only","attachment_mode":"file-system"}],"context":{"a":"b"}}`, v2.ExternalID)
	runSpecSteps(t, sc, e.rc, []specStep{
		{name: "deregister volume", method: "DELETE", path: "/v1/volumes/data2", status: 204},
		{name: "register volume", method: "PUT", path: "/v1/volumes/alias1", body: register, status: 200},
		{name: "register volume again", method: "PUT", path: "/v1/volumes/alias1", body: register, status: 200},
		{name: "update volume", method: "PUT", path: "/v1/volumes/alias1", body: strings.Replace(register, `"b"`, `"c"`, 1), status: 200},
		{name: "update volume's external id", method: "PUT", path: "/v1/volumes/alias1", body: strings.Replace(register, v2.ExternalID, "other", 1), status: 400, want: "external_id"},
		{name: "register volume registered", method: "PUT", path: "/v1/volumes/alias2", body: strings.Replace(register, v2.ExternalID, v1.ExternalID, 1), status: 409},
		{name: "register volume no capabilities", method: "PUT", path: "/v1/volumes/alias2", body: `{"plugin":"example","external_id":"x","capabilities":[]}`, status: 400},

		{name: "claim", method: "POST", path: "/v1/volumes/data1/claims", body: claim, status: 200},
		{name: "claim again", method: "POST", path: "/v1/volumes/data1/claims", body: claim, status: 200},
		{name: "claim over limit", method: "POST", path: "/v1/volumes/data1/claims", body: strings.Replace(claim, `"w1"`, `"w2"`, 1), status: 409},
		{name: "claim again, waiting", method: "POST", path: "/v1/volumes/data1/claims?wait=1s", body: claim, status: 200},
		{name: "claim over limit after a wait", method: "POST", path: "/v1/volumes/data1/claims?wait=50ms", body: strings.Replace(claim, `"w1"`, `"w2"`, 1), status: 409, want: "(waited 50ms for it to be freed)"},
		{name: "claim bad wait", method: "POST", path: "/v1/volumes/data1/claims?wait=forever", body: claim, status: 400, want: "wait"},
		{name: "update claimed volume", method: "PUT", path: "/v1/volumes/data1",
			body: fmt.Sprintf(`{"plugin":"example","external_id":%q,"capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}]}`, v1.ExternalID), status: 409, want: "while it has claims"},
		{name: "deregister alloc claims need", method: "DELETE", path: "/v1/allocations/example", status: 409, want: `alloc \"w1\" (published)`},
		{name: "claim bad mode", method: "POST", path: "/v1/volumes/data1/claims", body: strings.Replace(claim, `"write"`, `"rw"`, 1), status: 400},
		{name: "claim unknown volume", method: "POST", path: "/v1/volumes/nope/claims", body: claim, status: 404},
	})
	// The claimed volume's usage and condition, polled now, are in its
	// answer below.
	if err := e.rt.PollVolumeStats(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := e.rt.Volume(ctx, "data1"); err != nil || v.Usage == nil || v.Condition == nil {
		t.Fatalf("claimed volume after a poll: usage %+v, condition %+v, %v", v.Usage, v.Condition, err)
	}
	runSpecSteps(t, sc, e.rc, []specStep{
		{name: "volume claimed", method: "GET", path: "/v1/volumes/data1", status: 200},
		{name: "expand", method: "POST", path: "/v1/volumes/data1/expand", body: `{"capacity_bytes":2147483648}`, status: 200},
		{name: "expand shrink", method: "POST", path: "/v1/volumes/data1/expand", body: `{"capacity_bytes":1}`, status: 400},
		{name: "expand unknown", method: "POST", path: "/v1/volumes/nope/expand", body: `{"capacity_bytes":1}`, status: 404},
		{name: "modify", method: "POST", path: "/v1/volumes/data1/modify", body: `{"mutable_parameters":{"iops":"3000"}}`, status: 200},
		{name: "modify refused parameter", method: "POST", path: "/v1/volumes/data1/modify", body: `{"mutable_parameters":{"color":"blue"}}`, status: 400},
		{name: "modify empty", method: "POST", path: "/v1/volumes/data1/modify", body: `{"mutable_parameters":{}}`, status: 400},
		{name: "modify unknown", method: "POST", path: "/v1/volumes/nope/modify", body: `{"mutable_parameters":{"iops":"1"}}`, status: 404},
		{name: "delete claimed volume", method: "DELETE", path: "/v1/volumes/data1", status: 409},
		{name: "release", method: "DELETE", path: "/v1/volumes/data1/claims/w1", status: 200},
		{name: "release unknown", method: "DELETE", path: "/v1/volumes/data1/claims/w9", status: 404},
		{name: "release bad alloc", method: "DELETE", path: "/v1/volumes/data1/claims/.x", status: 400},
		{name: "volume with past claim", method: "GET", path: "/v1/volumes/data1", status: 200},
	})

	e.waitFor(t, "the past claim freed", func() bool {
		v, err := e.rt.Volume(context.Background(), "data1")
		return err == nil && len(v.PastClaims) == 0
	})
	runSpecSteps(t, sc, e.rc, []specStep{
		{name: "claim alias", method: "POST", path: "/v1/volumes/alias1/claims", body: `{"alloc":"r1","mode":"read","access_mode":"multi-node-reader-only","attachment_mode":"file-system"}`, status: 200},
		{name: "force release", method: "DELETE", path: "/v1/volumes/alias1/claims/r1?force=true", status: 200, want: `"left":[]`},
		{name: "force release again", method: "DELETE", path: "/v1/volumes/alias1/claims/r1?force=true", status: 404},
		{name: "force release bad force", method: "DELETE", path: "/v1/volumes/alias1/claims/r1?force=2", status: 400},
		{name: "force with delete", method: "DELETE", path: "/v1/volumes/alias1?delete=true&force=true", status: 400},
		{name: "deregister alloc unknown by force", method: "DELETE", path: "/v1/allocations/nope?force=true", status: 404},
		{name: "delete alias", method: "DELETE", path: "/v1/volumes/alias1?delete=true", status: 204},
		{name: "delete volume bad query", method: "DELETE", path: "/v1/volumes/data1?delete=maybe", status: 400},
		{name: "delete volume", method: "DELETE", path: "/v1/volumes/data1?delete=true", status: 204},
		{name: "delete volume again", method: "DELETE", path: "/v1/volumes/data1", status: 404},

		{name: "events", method: "GET", path: "/v1/events", status: 200},
		{name: "events bad follow", method: "GET", path: "/v1/events?follow=often", status: 400},

		{name: "nodes outside cluster mode", method: "GET", path: "/v1/nodes", status: 404},
		{name: "node outside cluster mode", method: "GET", path: "/v1/nodes/h1", status: 404},
		{name: "fence outside cluster mode", method: "POST", path: "/v1/nodes/h1/fence", status: 404},
		{name: "reseal without a key", method: "POST", path: "/v1/secrets/reseal", status: 409, want: "secrets.key_file"},
		{name: "reseal with query", method: "POST", path: "/v1/secrets/reseal?x=1", status: 400},

		{name: "wrong method", method: "PATCH", path: "/v1/volumes/data1", status: 405},
		{name: "unknown route", method: "GET", path: "/v2/volumes", status: 404},
		{name: "not canonical", method: "GET", path: "/v1/plugins/..", status: 400},

		{name: "deregister alloc", method: "DELETE", path: "/v1/allocations/example", status: 204},
	})
	// The streams, followed: the first lines, then the client hangs up.
	sc.stream(e.rc.hc, e.rc.base, "/v1/events?follow=true", 3, specWait)
	checkREADMEMetrics(t, e.reg)
}

// checkREADMEMetrics checks that the README lists every csiactor_* metric
// family reg has after a whole volume lifecycle.
func checkREADMEMetrics(t *testing.T, reg *prometheus.Registry) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "csiactor_") {
			continue
		}
		n++
		if !strings.Contains(string(readme), "`"+f.GetName()+"`") {
			t.Errorf("/metrics has %s, which the README does not list", f.GetName())
		}
	}
	if n < 10 {
		t.Errorf("only %d csiactor_* families gathered", n)
	}
}

// answersFakeBackend sends requests in the states the example plugin
// does not reach: starting, failing, bodies over the limit, the TCP
// listener's token.
func answersFakeBackend(t *testing.T, sc *specChecker) {
	b := apitest.NewBackend()
	rc := newRawClient(t, apitest.Serve(t, b, api.Options{MaxBodyBytes: 512}))
	runSpecSteps(t, sc, rc, []specStep{
		{name: "body over the limit", method: "PUT", path: "/v1/allocations/a1",
			body: `{"plugin":"p","type":"node","socket":"/` + strings.Repeat("s", 600) + `"}`, status: 413},
	})

	// Bulk registration: per-entry results, and the batch refused whole.
	entry := `{"id":"b1","plugin":"p","external_id":"eb1","capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}]}`
	runSpecSteps(t, sc, rc, []specStep{
		{name: "batch", method: "POST", path: "/v1/volumes/batch", body: `{"volumes":[` + entry + `,{"id":"b2","plugin":"p"}]}`,
			status: 200, want: `"status":"refused"`},
		{name: "batch empty", method: "POST", path: "/v1/volumes/batch", body: `{"volumes":[]}`, status: 400, want: "volumes: is empty"},
		{name: "batch twice", method: "POST", path: "/v1/volumes/batch", body: `{"volumes":[` + entry + `,` + entry + `]}`, status: 400,
			want: `volumes[1].id: \"b1\" is given twice`},
		{name: "batch malformed", method: "POST", path: "/v1/volumes/batch", body: `{"volumes":[`, status: 400},
		{name: "batch with query", method: "POST", path: "/v1/volumes/batch?x=1", body: `{"volumes":[` + entry + `]}`, status: 400},
	})

	// A past claim whose release has stalled.
	runSpecSteps(t, sc, rc, []specStep{
		{name: "node to stall on", method: "PUT", path: "/v1/allocations/n1", body: `{"plugin":"p","type":"monolith","socket":"/run/p.sock"}`, status: 200},
		{name: "register volume to stall", method: "PUT", path: "/v1/volumes/s1",
			body: `{"plugin":"p","external_id":"e1","capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}]}`, status: 200},
		{name: "claim to stall", method: "POST", path: "/v1/volumes/s1/claims",
			body: `{"alloc":"w1","mode":"write","access_mode":"single-node-writer","attachment_mode":"file-system"}`, status: 200},
		{name: "release to stall", method: "DELETE", path: "/v1/volumes/s1/claims/w1", status: 200},
	})
	b.SetClaimCondition("s1", "w1", runtime.ClaimStalled, "NodeUnstageVolume: rpc error: code = Internal desc = busy")
	runSpecSteps(t, sc, rc, []specStep{
		{name: "volume with a stalled past claim", method: "GET", path: "/v1/volumes/s1", status: 200, want: `"condition":"stalled"`},
		{name: "deregister stalled alloc", method: "DELETE", path: "/v1/allocations/n1", status: 204},
	})

	b.SetPending("allocation a1: not fingerprinted yet")
	runSpecSteps(t, sc, rc, []specStep{{name: "ready starting", method: "GET", path: "/v1/ready", status: 503}})
	b.SetPending()
	for _, f := range []struct {
		method string
		err    error
		status int
		path   string
	}{
		{"Ready", fmt.Errorf("ready: %w", runtime.ErrShutdown), 503, "/v1/ready"},
		{"Ready", errors.New("store: disk full"), 500, "/v1/ready"},
		{"Plugins", errors.New("store: disk full"), 500, "/v1/plugins"},
		{"Plugins", fmt.Errorf("plugins: %w", runtime.ErrShutdown), 503, "/v1/plugins"},
		{"Events", errors.New("boom"), 500, "/v1/events"},
	} {
		b.FailWith(f.method, f.err)
		runSpecSteps(t, sc, rc, []specStep{{name: f.method + " failing", method: "GET", path: f.path, status: f.status}})
		b.FailWith(f.method, nil)
	}

	// The TCP listener: open routes, a token, and no token.
	serveTCP := func(token string) *rawClient {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			fmt.Fprintln(w, "csiactor_up 1")
		})
		apitest.ServeListener(t, l, api.NewTCPHandler(b, token, api.Options{Metrics: metrics}))
		return newRawClient(t, "http://"+l.Addr().String())
	}
	const token = "t0ken"
	withToken := serveTCP(token)
	runSpecSteps(t, sc, withToken, []specStep{
		{name: "tcp health", method: "GET", path: "/v1/health", status: 200},
		{name: "tcp metrics", method: "GET", path: "/metrics", status: 200},
		{name: "tcp without token", method: "GET", path: "/v1/volumes", status: 401},
		{name: "tcp with token", method: "GET", path: "/v1/volumes", status: 200, header: []string{"Authorization", "Bearer " + token}},
		{name: "tcp whoami", method: "GET", path: "/v1/whoami", status: 200, header: []string{"Authorization", "Bearer " + token}},
		{name: "tcp whoami with query", method: "GET", path: "/v1/whoami?x=1", status: 400, header: []string{"Authorization", "Bearer " + token}},
	})

	// Without a token the TCP listener serves exactly the operations the
	// spec marks open (security: []); every other one is a 404 with a
	// hint.
	noToken := serveTCP("")
	for _, op := range specOperations(sc.doc) {
		method, path, _ := strings.Cut(op, " ")
		for _, p := range []string{"{name}", "{id}", "{alloc}"} {
			path = strings.ReplaceAll(path, p, "x1")
		}
		var open bool
		if o := sc.doc.Paths.Find(strings.SplitN(op, " ", 2)[1]).GetOperation(method); o.Security != nil && len(*o.Security) == 0 {
			open = true
		}
		status, body := sc.do(noToken.hc, noToken.base, method, path, "")
		hint := status == 404 && strings.Contains(body, "unix socket only")
		if open == hint {
			t.Errorf("TCP listener without a token: %s answered %d %s; the spec marks it open: %v", op, status, body, open)
		}
	}
}
