package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/cluster"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

// fullController is a fake plugin whose controller does every operation
// a host routes to the leader.
var fullController = fakeplugin.Config{ControllerPublish: true, CreateDelete: true, StageUnstage: true,
	ControllerExpand: true, Snapshots: true, Clone: true}

// startWithPlugin starts a runtime for node on endpoint with a fake plugin
// of cfg attached as an allocation of typ of the test plugin.
func startWithPlugin(t testing.TB, node, endpoint string, cfg fakeplugin.Config, typ string) *agent {
	t.Helper()
	return startWithPluginNamed(t, node, endpoint, testPlugin, cfg, typ)
}

// startWithPluginNamed is startWithPlugin with the plugin's name.
func startWithPluginNamed(t testing.TB, node, endpoint, plugin string, cfg fakeplugin.Config, typ string) *agent {
	t.Helper()
	a := &agent{t: t, node: node, cfg: clusterConfig(t, node, endpoint)}
	a.start()
	cfg.NodeID = "csi-" + node
	p, ep := fakeplugin.Start(t, cfg)
	a.plugin = p
	if _, err := a.rt.RegisterAllocation(context.Background(), typ+"-"+node, runtime.AllocationSpec{
		Plugin: plugin, Type: typ, Socket: ep[len("unix://"):],
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := a.rt.WaitHealthy(ctx, plugin, typ); err != nil {
		t.Fatal(err)
	}
	return a
}

// untilAvailable calls op until it fails other than as unavailable (no
// controller leader elected yet, or its capabilities not recorded yet)
// and returns its last error.
func untilAvailable(t testing.TB, what string, op func(ctx context.Context) error) error {
	t.Helper()
	var err error
	eventually(t, what+" not refused as unavailable", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		err = op(ctx)
		return !unavailable(err), nil
	})
	return err
}

func createSpec(id string) runtime.CreateVolumeSpec {
	return runtime.CreateVolumeSpec{ID: id, CapacityBytes: 1 << 20, VolumeSpec: runtime.VolumeSpec{Plugin: testPlugin,
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
		Secrets:      map[string]string{"token": "s3cr3t-route"}}}
}

// controllerRequests returns the controller requests etcd at endpoint
// holds, by key.
func controllerRequests(t testing.TB, endpoint string) map[string]cluster.ControllerRequest {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, runtime.DefaultClusterPrefix+"/controller/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]cluster.ControllerRequest{}
	for _, kv := range resp.Kvs {
		var r cluster.ControllerRequest
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			t.Fatalf("controller request %s: %v", kv.Key, err)
		}
		// Every test agent has a secrets.key_file: the secrets are
		// sealed, with a digest to compare them by.
		if strings.Contains(string(kv.Value), "s3cr3t-route") {
			t.Fatalf("controller request %s holds a secret in clear", kv.Key)
		}
		if tok, ok := r.Secrets["token"]; ok && (!strings.HasPrefix(tok, "v1:") || r.SecretsDigest == "") {
			t.Fatalf("controller request %s: secret not sealed (digest %q)", kv.Key, r.SecretsDigest)
		}
		if strings.Contains(string(r.Body), "s3cr3t-route") {
			t.Fatalf("controller request %s has a secret in its body", kv.Key)
		}
		out[string(kv.Key)] = r
	}
	return out
}

// noControllerCalls fails t when a's plugin got any controller call.
func noControllerCalls(t testing.TB, a *agent) {
	t.Helper()
	for _, m := range []string{"CreateVolume", "DeleteVolume", "ControllerExpandVolume", "CreateSnapshot", "DeleteSnapshot", "ValidateVolumeCapabilities"} {
		if n := a.plugin.Calls(m); n != 0 {
			t.Errorf("%s's plugin got %d %s calls; it has no controller", a.node, n, m)
		}
	}
}

// TestCluster_RoutedVolumeOperations: a host with only a node allocation
// of a plugin creates, expands, snapshots, restores, clones and deletes
// volumes, all run by the plugin's controller on another host; each
// volume is on every host as it is on the creating one; the requests are
// gone from etcd once answered.
func TestCluster_RoutedVolumeOperations(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	ctrl := startWithPlugin(t, "n1", srv.Endpoint(), fullController, runtime.TypeMonolith)
	node := startWithPlugin(t, "n3", srv.Endpoint(), fakeplugin.Config{ControllerPublish: true, StageUnstage: true}, runtime.TypeNode)
	ctx := context.Background()

	var v1 runtime.Volume
	if err := untilAvailable(t, "create v1", func(ctx context.Context) (err error) {
		v1, err = node.rt.CreateVolume(ctx, createSpec("v1"))
		return err
	}); err != nil {
		t.Fatalf("create v1 on the node-only host: %v", err)
	}
	if v1.ExternalID != "vol-v1" || v1.CapacityBytes != 1<<20 {
		t.Fatalf("created v1 = %+v", v1)
	}
	if got := ctrl.plugin.LastRequest("CreateVolume").(interface{ GetSecrets() map[string]string }).GetSecrets(); got["token"] != "s3cr3t-route" {
		t.Fatalf("the leader's CreateVolume secrets = %d entries, want the volume's", len(got))
	}
	ctrl.waitVolume("v1")
	if v, err := ctrl.rt.Volume(ctx, "v1"); err != nil || v.ExternalID != "vol-v1" || v.CapacityBytes != 1<<20 {
		t.Fatalf("v1 on the controller host = %+v, %v", v, err)
	}

	if _, err := node.rt.ExpandVolume(ctx, "v1", runtime.ExpandRequest{CapacityBytes: 2 << 20}); err != nil {
		t.Fatalf("expand v1 on the node-only host: %v", err)
	}
	if got := ctrl.plugin.Volumes()["vol-v1"].CapacityBytes; got != 2<<20 {
		t.Fatalf("v1's capacity in the leader's plugin = %d, want %d", got, 2<<20)
	}
	eventually(t, "v1 expanded on the controller host", func() (bool, error) {
		v, err := ctrl.rt.Volume(ctx, "v1")
		return err == nil && v.CapacityBytes == 2<<20, err
	})

	snap, err := node.rt.CreateSnapshot(ctx, runtime.SnapshotSpec{ID: "s1", Plugin: testPlugin, SourceVolume: "v1"})
	if err != nil {
		t.Fatalf("snapshot v1 on the node-only host: %v", err)
	}
	if _, ok := ctrl.plugin.Snapshots()[snap.ExternalID]; !ok || snap.ExternalID != "snap-s1" {
		t.Fatalf("snapshot %+v: the leader's plugin has %v", snap, ctrl.plugin.Snapshots())
	}

	restored := createSpec("v2")
	restored.CapacityBytes = 2 << 20
	restored.ContentSource = &runtime.ContentSource{Snapshot: "s1"}
	if _, err := node.rt.CreateVolume(ctx, restored); err != nil {
		t.Fatalf("restore v2 from s1 on the node-only host: %v", err)
	}
	clone := createSpec("v3")
	clone.CapacityBytes = 2 << 20
	clone.ContentSource = &runtime.ContentSource{Volume: "v1"}
	if _, err := node.rt.CreateVolume(ctx, clone); err != nil {
		t.Fatalf("clone v1 as v3 on the node-only host: %v", err)
	}
	vols := ctrl.plugin.Volumes()
	if vols["vol-v2"].Source != "snap-s1" || vols["vol-v3"].Source != "vol-v1" {
		t.Fatalf("the leader's plugin volumes = %+v, want vol-v2 from snap-s1 and vol-v3 from vol-v1", vols)
	}
	for _, id := range []string{"v2", "v3"} {
		ctrl.waitVolume(id)
	}

	if err := node.rt.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatalf("delete s1 on the node-only host: %v", err)
	}
	if got := ctrl.plugin.Snapshots(); len(got) != 0 {
		t.Fatalf("the leader's plugin snapshots after the delete = %v", got)
	}
	for _, id := range []string{"v1", "v2", "v3"} {
		if err := node.rt.DeleteVolume(ctx, id, true); err != nil {
			t.Fatalf("delete %s on the node-only host: %v", id, err)
		}
	}
	if got := ctrl.plugin.Volumes(); len(got) != 0 {
		t.Fatalf("the leader's plugin volumes after the deletes = %v", got)
	}
	eventually(t, "the volumes gone from the controller host", func() (bool, error) {
		vs, err := ctrl.rt.Volumes(ctx, runtime.VolumeFilter{})
		return err == nil && len(vs) == 0, err
	})
	noControllerCalls(t, node)
	if got := controllerRequests(t, srv.Endpoint()); len(got) != 0 {
		t.Fatalf("controller requests left in etcd: %v", got)
	}
	if v := metricValue(t, ctrl, "csiactor_cluster_controller_requests_total", cluster.OpCreateVolume); v != 3 {
		t.Errorf("csiactor_cluster_controller_requests_total{op=create-volume} = %v, want 3", v)
	}
}

// TestCluster_RoutedErrorStatus: the leader's plugin refusing a routed
// CreateVolume (InvalidArgument, AlreadyExists) is, through the
// requesting host's HTTP API, the status the same answer of a local
// controller gives (400, 409), with the plugin's message; with no
// controller anywhere the create is a 503 naming the plugin.
func TestCluster_RoutedErrorStatus(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	node := startWithPlugin(t, "n3", srv.Endpoint(), fakeplugin.Config{ControllerPublish: true, StageUnstage: true}, runtime.TypeNode)
	cl, err := api.NewClient(serveAPI(t, node.rt))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	_, err = cl.CreateVolume(ctx, createSpec("e0"))
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || !strings.Contains(ae.Message, `plugin "fake"`) ||
		!strings.Contains(ae.Message, "no host of the cluster has a healthy controller") {
		t.Fatalf("create with no controller anywhere = %v, want a 503 naming the plugin", err)
	}

	ctrl := startWithPlugin(t, "n1", srv.Endpoint(), fullController, runtime.TypeMonolith)
	for _, tc := range []struct {
		code   codes.Code
		status int
	}{{codes.InvalidArgument, http.StatusBadRequest}, {codes.AlreadyExists, http.StatusConflict}, {codes.NotFound, http.StatusNotFound}} {
		ctrl.plugin.ClearFaults()
		ctrl.plugin.SetFault("CreateVolume", fakeplugin.Fault{Code: tc.code, Message: "refused: " + tc.code.String()})
		err := untilAvailable(t, "create e1", func(ctx context.Context) error {
			_, err := cl.CreateVolume(ctx, createSpec("e1"))
			if errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable {
				return runtime.ErrPluginUnavailable // not elected yet
			}
			return err
		})
		if !errors.As(err, &ae) || ae.Status != tc.status || !strings.Contains(ae.Message, "refused: "+tc.code.String()) ||
			!strings.Contains(ae.Message, "n1") {
			t.Fatalf("create with the leader's plugin answering %s = %v, want %d with its message and host", tc.code, err, tc.status)
		}
	}
	ctrl.plugin.ClearFaults()
	if _, err := cl.CreateVolume(ctx, createSpec("e1")); err != nil {
		t.Fatalf("create once the plugin accepts: %v", err)
	}
	if got := controllerRequests(t, srv.Endpoint()); len(got) != 0 {
		t.Fatalf("controller requests left in etcd: %v", got)
	}
}

// heldCreate starts two controller hosts and a node-only host n3 on srv,
// and has n3 create volume vol while the leader's plugin holds the
// CreateVolume (until the leader stops). It returns once the leader's
// plugin got the call, with the leader, the other controller host, n3,
// and the create's outcome to come.
func heldCreate(t *testing.T, srv *etcdtest.Server, vol string) (leader, next, node *agent, done <-chan error) {
	t.Helper()
	c1 := startWithPlugin(t, "n1", srv.Endpoint(), fullController, runtime.TypeMonolith)
	c2 := startWithPlugin(t, "n2", srv.Endpoint(), fullController, runtime.TypeMonolith)
	node = startWithPlugin(t, "n3", srv.Endpoint(), fakeplugin.Config{ControllerPublish: true, StageUnstage: true}, runtime.TypeNode)
	leader, next = leaderOf(t, c1, c2), c1
	if leader == c1 {
		next = c2
	}
	leader.plugin.SetFault("CreateVolume", fakeplugin.Fault{Hang: true})
	ch := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		for {
			_, err := node.rt.CreateVolume(ctx, createSpec(vol))
			if !unavailable(err) || ctx.Err() != nil {
				ch <- err
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	eventually(t, "the leader's plugin running CreateVolume", func() (bool, error) {
		return leader.plugin.Calls("CreateVolume") > 0, nil
	})
	return leader, next, node, ch
}

// TestCluster_RoutedLeaderLost: the controller leader stops while its
// plugin runs a routed CreateVolume; the next leader runs it, and the
// create completes on the requesting host.
func TestCluster_RoutedLeaderLost(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	leader, next, _, done := heldCreate(t, srv, "lv")
	leader.stop()
	if err := <-done; err != nil {
		t.Fatalf("create after the leader stopped: %v", err)
	}
	if _, ok := next.plugin.Volumes()["vol-lv"]; !ok {
		t.Fatalf("the next leader's plugin volumes = %v", next.plugin.Volumes())
	}
	next.waitVolume("lv")
	if got := controllerRequests(t, srv.Endpoint()); len(got) != 0 {
		t.Fatalf("controller requests left in etcd: %v", got)
	}
}

// TestCluster_RoutedRequesterRestart: the requesting host stops while
// its routed CreateVolume is held on the leader; the leader stops too,
// and the next one runs it while the requester is down. The requester,
// started again and asked for the same volume, takes the answer from
// etcd (the plugin is not called again), and the request is gone.
func TestCluster_RoutedRequesterRestart(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	leader, next, node, done := heldCreate(t, srv, "rv")
	node.stop()
	if err := <-done; err == nil {
		t.Fatal("create succeeded though its host stopped before the answer")
	}
	leader.stop()
	eventually(t, "the next leader's answer in etcd", func() (bool, error) {
		for _, r := range controllerRequests(t, srv.Endpoint()) {
			if r.Op == cluster.OpCreateVolume && r.Answer != nil {
				if r.Answer.Code != 0 || r.Answer.By != next.node {
					return false, errors.New("answer " + r.Answer.Message + " by " + r.Answer.By)
				}
				return true, nil
			}
		}
		return false, nil
	})
	if n := next.plugin.Calls("CreateVolume"); n != 1 {
		t.Fatalf("the next leader's CreateVolume calls = %d, want 1", n)
	}
	node.start()
	v, err := node.rt.CreateVolume(context.Background(), createSpec("rv"))
	if err != nil || v.ExternalID != "vol-rv" {
		t.Fatalf("create again after the restart = %+v, %v", v, err)
	}
	if n := next.plugin.Calls("CreateVolume"); n != 1 {
		t.Fatalf("the next leader's CreateVolume calls after the requester's restart = %d, want 1 (answered from etcd)", n)
	}
	next.waitVolume("rv")
	if got := controllerRequests(t, srv.Endpoint()); len(got) != 0 {
		t.Fatalf("controller requests left in etcd: %v", got)
	}
}

// TestCluster_RoutedHostpath: host na runs the hostpath driver as a
// monolith; host nb has only a fake node plugin of the same name. nb
// creates a volume, snapshots it, restores and clones it, and deletes the
// snapshot and the source, all through na's driver, whose state ends with
// exactly the restored and cloned volumes. (This driver does not record a
// volume's source in its state; the fake plugin's test checks that the
// content source reaches the leader's plugin.)
func TestCluster_RoutedHostpath(t *testing.T) {
	bin := hostpath.Binary(t)
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	a := startHostpathAgent(t, "na", srv.Endpoint(), bin)
	b := startWithPluginNamed(t, "nb", srv.Endpoint(), hostpath.PluginName,
		fakeplugin.Config{ControllerPublish: true, StageUnstage: true}, runtime.TypeNode)
	ctx := context.Background()
	spec := func(id string) runtime.CreateVolumeSpec {
		s := createSpec(id)
		s.Plugin, s.Secrets = hostpath.PluginName, nil
		return s
	}
	var src runtime.Volume
	if err := untilAvailable(t, "create src", func(ctx context.Context) (err error) {
		src, err = b.rt.CreateVolume(ctx, spec("src"))
		return err
	}); err != nil {
		t.Fatalf("create src on nb: %v", err)
	}
	snap, err := b.rt.CreateSnapshot(ctx, runtime.SnapshotSpec{ID: "snap", Plugin: hostpath.PluginName, SourceVolume: "src"})
	if err != nil {
		t.Fatalf("snapshot src on nb: %v", err)
	}
	restored := spec("restored")
	restored.ContentSource = &runtime.ContentSource{Snapshot: "snap"}
	rv, err := b.rt.CreateVolume(ctx, restored)
	if err != nil {
		t.Fatalf("restore on nb: %v", err)
	}
	clone := spec("clone")
	clone.ContentSource = &runtime.ContentSource{Volume: "src"}
	cv, err := b.rt.CreateVolume(ctx, clone)
	if err != nil {
		t.Fatalf("clone on nb: %v", err)
	}
	st, err := hostpath.ReadState(a.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Snapshots) != 1 || st.Snapshots[0].ID != snap.ExternalID || st.Snapshots[0].VolID != src.ExternalID {
		t.Fatalf("na's driver snapshots = %+v, want %s of %s", st.Snapshots, snap.ExternalID, src.ExternalID)
	}
	if err := b.rt.DeleteSnapshot(ctx, "snap"); err != nil {
		t.Fatalf("delete the snapshot on nb: %v", err)
	}
	if err := b.rt.DeleteVolume(ctx, "src", true); err != nil {
		t.Fatalf("delete src on nb: %v", err)
	}
	st, err = hostpath.ReadState(a.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, v := range st.Volumes {
		got[v.VolID] = v.VolName
	}
	want := map[string]string{rv.ExternalID: "restored", cv.ExternalID: "clone"}
	if !maps.Equal(got, want) || len(st.Snapshots) != 0 {
		t.Fatalf("na's driver at the end: volumes %v, snapshots %+v; want volumes %v and no snapshot", got, st.Snapshots, want)
	}
	for _, id := range []string{"restored", "clone"} {
		a.waitVolume(id)
	}
	if _, err := a.rt.Volume(ctx, "src"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("src on na after its delete: %v", err)
	}
	noControllerCalls(t, b)
	if got := controllerRequests(t, srv.Endpoint()); len(got) != 0 {
		t.Fatalf("controller requests left in etcd: %v", got)
	}
}

// TestCluster_RoutedSecretsFrom: the controller operations a host without
// a controller routes to the leader (create, expand, validate, delete) of
// a volume whose secrets are read from a file send the file's path, not
// its values: the leader reads the file on its own host and its plugin
// gets the secrets, and no value ever written under the cluster's prefix
// holds one.
func TestCluster_RoutedSecretsFrom(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	const secret = "s3cr3t-from-file"
	file := filepath.Join(shortDir(t, "csiactor-sf-"), "secrets.json")
	if err := os.WriteFile(file, []byte(`{"token": "`+secret+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cli := directClient(t, srv.Endpoint())
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	wch := cli.Watch(wctx, runtime.DefaultClusterPrefix+"/", clientv3.WithPrefix())
	ctrl := startWithPlugin(t, "n1", srv.Endpoint(), fullController, runtime.TypeMonolith)
	node := startWithPlugin(t, "n3", srv.Endpoint(), fakeplugin.Config{ControllerPublish: true, StageUnstage: true}, runtime.TypeNode)
	ctx := context.Background()

	spec := createSpec("v1")
	spec.Secrets, spec.SecretsFrom = nil, &runtime.SecretsFrom{File: file}
	if err := untilAvailable(t, "create v1", func(ctx context.Context) error {
		_, err := node.rt.CreateVolume(ctx, spec)
		return err
	}); err != nil {
		t.Fatalf("create v1 on the node-only host: %v", err)
	}
	if _, err := node.rt.ExpandVolume(ctx, "v1", runtime.ExpandRequest{CapacityBytes: 2 << 20}); err != nil {
		t.Fatalf("expand v1 on the node-only host: %v", err)
	}
	// v1 deregistered (the plugin keeps it) and registered again on the
	// node-only host: validated by the leader.
	if err := node.rt.DeleteVolume(ctx, "v1", false); err != nil {
		t.Fatalf("deregister v1: %v", err)
	}
	reg := runtime.VolumeSpec{Plugin: testPlugin, ExternalID: "vol-v1",
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
		SecretsFrom:  &runtime.SecretsFrom{File: file}}
	if _, err := node.rt.RegisterVolume(ctx, "v1-again", reg); err != nil {
		t.Fatalf("register v1-again on the node-only host: %v", err)
	}
	if err := node.rt.DeleteVolume(ctx, "v1-again", true); err != nil {
		t.Fatalf("delete v1-again on the node-only host: %v", err)
	}
	for _, m := range []string{"CreateVolume", "ControllerExpandVolume", "ValidateVolumeCapabilities", "DeleteVolume"} {
		req, ok := ctrl.plugin.LastRequest(m).(interface{ GetSecrets() map[string]string })
		if !ok {
			t.Fatalf("the leader's plugin got no %s", m)
		}
		if got := req.GetSecrets()["token"]; got != secret {
			t.Errorf("the leader's %s secret token = %d bytes, want the file's", m, len(got))
		}
	}
	noControllerCalls(t, node)

	// Every value written under the prefix meanwhile: the watch has
	// them all, in order, up to a marker written last.
	marker := runtime.DefaultClusterPrefix + "/zz-test-marker"
	if _, err := cli.Put(ctx, marker, "end"); err != nil {
		t.Fatal(err)
	}
	for done := false; !done; {
		wr, ok := <-wch
		if !ok || wr.Err() != nil {
			t.Fatalf("watch of the prefix ended: %v", wr.Err())
		}
		for _, e := range wr.Events {
			var r cluster.ControllerRequest
			if strings.Contains(string(e.Kv.Value), secret) ||
				(json.Unmarshal(e.Kv.Value, &r) == nil && strings.Contains(string(r.Body), secret)) {
				t.Errorf("%s was written with a secret from the file in it", e.Kv.Key)
			}
			done = done || string(e.Kv.Key) == marker
		}
	}
}

// TestCluster_RoutedWaitsOutControllerRestart: a host with only a node
// allocation creates a volume while the one controller of the cluster is
// not ready (restarting), so no host leads it: the create waits for a
// leader (event plugin-wait) instead of failing, and completes once the
// controller is ready again.
func TestCluster_RoutedWaitsOutControllerRestart(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	ctrl := startWithPlugin(t, "n1", srv.Endpoint(), fullController, runtime.TypeMonolith)
	node := startWithPlugin(t, "n3", srv.Endpoint(), fakeplugin.Config{ControllerPublish: true, StageUnstage: true}, runtime.TypeNode)
	leaderOf(t, ctrl)
	if err := untilAvailable(t, "create r1", func(ctx context.Context) error {
		_, err := node.rt.CreateVolume(ctx, createSpec("r1"))
		return err
	}); err != nil {
		t.Fatalf("create r1 with a controller leader: %v", err)
	}

	ctrl.plugin.SetReady(false)
	// Gone from etcd, not only from n1's gauge: a request sent while n1
	// still resigns waits in etcd for the next leader instead.
	eventually(t, "no host leads the controller", func() (bool, error) {
		return etcdKeys(t, srv.Endpoint(), runtime.DefaultClusterPrefix+"/leaders/"+testPlugin+"/") == 0, nil
	})
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*waitLimit)
		defer cancel()
		_, err := node.rt.CreateVolume(ctx, createSpec("r2"))
		done <- err
	}()
	eventually(t, "n3's create waiting for the controller", func() (bool, error) {
		select {
		case err := <-done:
			t.Fatalf("create r2 while no host leads the controller ended without a wait: %v", err)
		default:
		}
		evs, err := node.rt.Events(context.Background())
		for _, e := range evs {
			if e.Type == runtime.EventPluginWait && e.Volume == "r2" && e.Plugin == testPlugin {
				return true, nil
			}
		}
		return false, err
	})
	ctrl.plugin.SetReady(true)
	if err := <-done; err != nil {
		t.Fatalf("create r2 once the controller is ready again: %v", err)
	}
	if _, ok := ctrl.plugin.Volumes()["vol-r2"]; !ok {
		t.Fatalf("the controller's volumes = %v, want vol-r2", ctrl.plugin.Volumes())
	}
	if got := controllerRequests(t, srv.Endpoint()); len(got) != 0 {
		t.Fatalf("controller requests left in etcd: %v", got)
	}
}
