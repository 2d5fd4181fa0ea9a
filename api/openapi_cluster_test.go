package api_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// clusterAgent starts a runtime in cluster mode as node on etcd endpoint,
// with a fake plugin "fake" attached as a monolith; it is shut down when t
// ends.
func clusterAgent(t *testing.T, node, endpoint string) *runtime.Runtime {
	t.Helper()
	dir, err := os.MkdirTemp("", "csa-api-"+node+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Every host has the same key, which seals the secrets in etcd.
	keyFile := filepath.Join(dir, "secrets.key")
	if err := os.WriteFile(keyFile, bytes.Repeat([]byte{7}, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	backoff := runtime.BackoffConfig{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2}
	rt, err := runtime.New(runtime.Config{
		DataDir: filepath.Join(dir, "d"),
		Plugins: runtime.PluginsConfig{
			HeartbeatInterval: 500 * time.Millisecond,
			ProbeTimeout:      500 * time.Millisecond,
			RPCTimeout:        10 * time.Second,
			RestartBackoff:    backoff,
		},
		Volumes: runtime.VolumesConfig{Retry: backoff},
		Store:   runtime.StoreConfig{NoSync: true},
		// The fake plugin mounts nothing.
		Host:    runtime.HostConfig{SkipMountCheck: true},
		Secrets: &runtime.SecretsConfig{KeyFile: keyFile},
		Cluster: &runtime.ClusterConfig{
			NodeID:   node,
			Etcd:     runtime.EtcdConfig{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second},
			LeaseTTL: 2 * time.Second,
		},
	}, runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Shutdown(context.Background()) })
	_, ep := fakeplugin.Start(t, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, NodeID: "csi-" + node})
	ctx := context.Background()
	if _, err := rt.RegisterAllocation(ctx, "fake-"+node, runtime.AllocationSpec{
		Plugin: "fake", Type: runtime.TypeMonolith, Socket: ep[len("unix://"):],
	}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, specWait)
	defer cancel()
	if err := rt.WaitHealthy(wctx, "fake", runtime.TypeMonolith); err != nil {
		t.Fatal(err)
	}
	return rt
}

// answersCluster sends the cluster routes to a runtime in cluster mode: two
// agents on one etcd; the second claims a volume and stops, and the first
// lists the hosts, shows the other host's claim, and fences it.
func answersCluster(t *testing.T, sc *specChecker) {
	srv := etcdtest.Start(t)
	n1 := clusterAgent(t, "n1", srv.Endpoint())
	n2 := clusterAgent(t, "n2", srv.Endpoint())
	ctx := context.Background()
	if _, err := n1.RegisterVolume(ctx, "shared", runtime.VolumeSpec{
		Plugin: "fake", ExternalID: "ext-shared",
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
		Secrets:      map[string]string{"token": "t0k3n"},
	}); err != nil {
		t.Fatal(err)
	}
	e := &realEnv{}
	e.waitFor(t, "the volume on n2", func() bool {
		_, err := n2.Volume(ctx, "shared")
		return err == nil
	})
	if _, err := n2.Claim(ctx, "shared", runtime.ClaimRequest{Alloc: "a2", Mode: runtime.ModeWrite,
		AccessMode: "single-node-writer", AttachmentMode: "file-system"}); err != nil {
		t.Fatal(err)
	}
	rc := newRawClient(t, apitest.Serve(t, n1, api.Options{}))
	rc2 := newRawClient(t, apitest.Serve(t, n2, api.Options{}))
	// Updates (PUT of a registered volume) on either host: the secrets
	// while n2 holds a claim, another field only once no host does, and
	// every host has the update.
	const def = `"plugin":"fake","external_id":"ext-shared","capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}]`
	for _, c := range []*rawClient{rc, rc2} {
		runSpecSteps(t, sc, c, []specStep{
			{name: "update the secrets of a volume another host claims", method: "PUT", path: "/v1/volumes/shared",
				body: `{` + def + `,"secrets":{"token":"rotated"}}`, status: 200, want: `"external_id":"ext-shared"`},
			{name: "update another field of a volume a host claims", method: "PUT", path: "/v1/volumes/shared",
				body: `{` + def + `,"parameters":{"tier":"fast"},"secrets":{"token":"rotated"}}`, status: 409,
				want: `volume \"shared\" is claimed by alloc \"a2\" on host \"n2\": parameters cannot change while it has claims (only secrets can)`},
		})
	}
	if _, err := n1.RegisterVolume(ctx, "free", runtime.VolumeSpec{Plugin: "fake", ExternalID: "ext-free",
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(t, "volume free on n2", func() bool {
		_, err := n2.Volume(ctx, "free")
		return err == nil
	})
	runSpecSteps(t, sc, rc2, []specStep{
		{name: "update an unclaimed volume on another host", method: "PUT", path: "/v1/volumes/free",
			body:   `{"plugin":"fake","external_id":"ext-free","capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}],"parameters":{"tier":"fast"}}`,
			status: 200, want: `"parameters":{"tier":"fast"}`},
	})
	e.waitFor(t, "the update of volume free on n1", func() bool {
		status, body := sc.do(rc.hc, rc.base, "GET", "/v1/volumes/free", "")
		return status == 200 && strings.Contains(body, `"parameters":{"tier":"fast"}`)
	})
	runSpecSteps(t, sc, rc, []specStep{
		{name: "other host's claim", method: "GET", path: "/v1/volumes/shared", status: 200, want: `"host":"n2"`},
		{name: "health in cluster mode", method: "GET", path: "/v1/health", status: 200, want: `{"status":"ok","cluster":true}`},
		{name: "nodes", method: "GET", path: "/v1/nodes", status: 200},
		{name: "fence an up host", method: "POST", path: "/v1/nodes/n2/fence", status: 409},
	})
	if err := n2.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitFor(t, "n2 down", func() bool {
		n, err := n1.Node(ctx, "n2")
		return err == nil && n.Status == runtime.NodeDown
	})
	runSpecSteps(t, sc, rc, []specStep{
		{name: "node", method: "GET", path: "/v1/nodes/n1", status: 200},
		{name: "down node", method: "GET", path: "/v1/nodes/n2", status: 200},
		{name: "unknown node", method: "GET", path: "/v1/nodes/n9", status: 404},
		{name: "fence own host", method: "POST", path: "/v1/nodes/n1/fence", status: 409},
		{name: "fence unknown host", method: "POST", path: "/v1/nodes/n9/fence", status: 404},
		{name: "fence", method: "POST", path: "/v1/nodes/n2/fence", status: 200,
			want: `"claims":[{"volume":"shared","alloc":"a2","mode":"write","controller_unpublished":true}]`},
		// Sealed with the current key already: nothing to do.
		{name: "reseal", method: "POST", path: "/v1/secrets/reseal", status: 200, want: `"store":0,"cluster":0`},
	})
}
