package runtime_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/runtime"
)

// A volume with secrets_from through the API: each claim's RPCs get what
// the file holds then (replacing it rotates them); a missing or malformed
// file refuses the claim naming the path and the volume, with no RPC
// sent; secrets and secrets_from together are a 400; state.db holds the
// reference and no value.
func TestRuntime_SecretsFrom_FakePlugin(t *testing.T) {
	dir := shortDir(t, "csiactor-sf-")
	e := &testEnv{t: t, dataDir: filepath.Join(dir, "d")}
	e.cfg = testConfig(e.dataDir)
	e.start()
	p := e.attach("fake", "fake", runtime.TypeMonolith, fakeplugin.Config{ControllerPublish: true, StageUnstage: true})
	ctx := context.Background()
	c := serveAPI(t, e.rt)

	file := filepath.Join(dir, "secrets.yaml")
	write := func(content string) {
		t.Helper()
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write("password: p1-" + secretMark + "\n")

	spec := volSpec("single-node-writer")
	spec.SecretsFrom = &runtime.SecretsFrom{File: file}
	both := spec
	both.Secrets = map[string]string{"password": "x"}
	_, err := c.RegisterVolume(ctx, "vol1", both)
	wantAPIError(t, "secrets and secrets_from", err, http.StatusBadRequest, "secrets_from: cannot be combined with secrets")
	rel := spec
	rel.SecretsFrom = &runtime.SecretsFrom{File: "secrets.yaml"}
	_, err = c.RegisterVolume(ctx, "vol1", rel)
	wantAPIError(t, "relative secrets_from", err, http.StatusBadRequest, `secrets_from.file: "secrets.yaml" is not an absolute path`)

	v, err := c.RegisterVolume(ctx, "vol1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if v.SecretsFrom == nil || v.SecretsFrom.File != file {
		t.Fatalf("registered volume shows secrets_from %+v, want %s", v.SecretsFrom, file)
	}
	stageSecret := func() string {
		req, _ := p.LastRequest("NodeStageVolume").(*csipb.NodeStageVolumeRequest)
		return req.GetSecrets()["password"]
	}
	claimRelease := func(alloc, want string) {
		t.Helper()
		if _, err := c.Claim(ctx, "vol1", claimReq(alloc, "write", "single-node-writer")); err != nil {
			t.Fatal(err)
		}
		if got := stageSecret(); got != want {
			t.Fatalf("NodeStageVolume got password %q, want %q", got, want)
		}
		req, _ := p.LastRequest("ControllerPublishVolume").(*csipb.ControllerPublishVolumeRequest)
		if got := req.GetSecrets()["password"]; got != want {
			t.Fatalf("ControllerPublishVolume got password %q, want %q", got, want)
		}
		if _, err := c.Release(ctx, "vol1", alloc); err != nil {
			t.Fatal(err)
		}
		e.waitFreed("vol1", alloc)
	}
	claimRelease("a1", "p1-"+secretMark)
	write(`{"password": "p2-` + secretMark + `"}`) // JSON, rotated
	claimRelease("a2", "p2-"+secretMark)

	// A directory with one file per key; one trailing newline dropped.
	keys := filepath.Join(dir, "keys")
	if err := os.Mkdir(keys, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(keys, "password"), []byte("p3-"+secretMark+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dspec := spec
	dspec.SecretsFrom = &runtime.SecretsFrom{File: keys}
	if _, err := c.RegisterVolume(ctx, "vol1", dspec); err != nil {
		t.Fatalf("update to a directory: %v", err)
	}
	claimRelease("a3", "p3-"+secretMark)
	if _, err := c.RegisterVolume(ctx, "vol1", spec); err != nil {
		t.Fatal(err)
	}

	// Refusals: nothing reserved, no RPC sent.
	methods := []string{"ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume"}
	calls := func() []int {
		var n []int
		for _, m := range methods {
			n = append(n, p.Calls(m))
		}
		return n
	}
	for _, tt := range []struct{ name, content, want string }{
		{"malformed", "[1, 2", "not a JSON or YAML map of strings"},
		{"empty", "{}", "holds no secrets"},
		{"missing", "", "no such file or directory"},
	} {
		if tt.name == "missing" {
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
		} else {
			write(tt.content)
		}
		before := calls()
		_, err := c.Claim(ctx, "vol1", claimReq("a4", "write", "single-node-writer"))
		wantAPIError(t, tt.name+" secrets file", err, http.StatusBadRequest, `volume "vol1": secrets_from.file: secrets file unreadable: `+file+": "+tt.want)
		if after := calls(); !equalInts(before, after) {
			t.Errorf("%s: RPCs sent for the refused claim: %v -> %v", tt.name, before, after)
		}
		if v, err := c.Volume(ctx, "vol1"); err != nil || len(v.Claims)+len(v.PastClaims) != 0 {
			t.Errorf("%s: vol1 = %+v, %v; want no claim", tt.name, v, err)
		}
	}
	e.stop()
	state := assertNoSecretInFiles(t, e.dataDir)
	if !bytes.Contains(state, []byte(file)) {
		t.Errorf("state.db does not hold the reference %s", file)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The hostpath driver (which ignores secrets) with a volume created with
// secrets_from: created, claimed and released; a missing file refuses the
// next claim with the driver's state unchanged.
func TestRuntime_SecretsFrom_Hostpath(t *testing.T) {
	e, dir := hostpathEnv(t, "csiactor-sfh-", nil)
	ctx := context.Background()
	c := serveAPI(t, e.rt)
	file := filepath.Join(dir, "secrets.json")
	if err := os.WriteFile(file, []byte(`{"user": "u-`+secretMark+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := runtime.VolumeSpec{Plugin: hostpath.PluginName, SecretsFrom: &runtime.SecretsFrom{File: file},
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}
	if _, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "vol1", CapacityBytes: 1 << 20, VolumeSpec: spec}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Claim(ctx, "vol1", claimReq("a1", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "vol1", "a1"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("vol1", "a1")
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	_, err := c.Claim(ctx, "vol1", claimReq("a2", "write", "single-node-writer"))
	wantAPIError(t, "claim with the file gone", err, http.StatusBadRequest, `volume "vol1": secrets_from.file: secrets file unreadable: `+file)
	st, err := hostpath.ReadState(filepath.Join(dir, "hp"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range st.Volumes {
		if v.Attached || len(v.Staged)+len(v.Published) > 0 {
			t.Errorf("the driver has %+v after the refused claim", v)
		}
	}
	e.stop()
	assertNoSecretInFiles(t, e.dataDir)
}

// Cluster mode without secrets.key_file: a secrets_from volume is
// accepted (only the reference is shared), the other host reads the file
// at its claim, and no etcd value holds a secret taken from the file.
func TestRuntime_SecretsFrom_Cluster(t *testing.T) {
	srv := etcdtest.Start(t)
	dir := shortDir(t, "csiactor-sfc-")
	host := func(node string) *testEnv {
		e := &testEnv{t: t, dataDir: filepath.Join(dir, node)}
		e.cfg = testConfig(e.dataDir)
		e.cfg.Cluster = &runtime.ClusterConfig{NodeID: node, LeaseTTL: 2 * time.Second,
			Etcd: runtime.EtcdConfig{Endpoints: []string{srv.Endpoint()}, DialTimeout: 2 * time.Second}}
		e.start()
		return e
	}
	ctx := context.Background()
	n1, n2 := host("n1"), host("n2")
	n1.attach("fake-n1", "fake", runtime.TypeMonolith, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, NodeID: "csi-n1"})
	p2 := n2.attach("fake-n2", "fake", runtime.TypeMonolith, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, NodeID: "csi-n2"})
	file := filepath.Join(dir, "secrets.yaml")
	if err := os.WriteFile(file, []byte("password: p-"+secretMark+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := volSpec("single-node-writer")
	spec.SecretsFrom = &runtime.SecretsFrom{File: file}
	if _, err := n1.rt.RegisterVolume(ctx, "shared", spec); err != nil {
		t.Fatalf("register a secrets_from volume without a key in cluster mode: %v", err)
	}
	eventually(t, "the volume on n2", func() (bool, error) {
		v, err := n2.rt.Volume(ctx, "shared")
		return err == nil && v.SecretsFrom != nil && v.SecretsFrom.File == file, nil
	})
	if _, err := n2.rt.Claim(ctx, "shared", claimReq("a2", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	if req, _ := p2.LastRequest("NodeStageVolume").(*csipb.NodeStageVolumeRequest); req.GetSecrets()["password"] != "p-"+secretMark {
		t.Fatalf("n2's NodeStageVolume got secrets %v, want the file's", req.GetSecrets())
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, runtime.DefaultClusterPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	holdsRef := false
	for _, kv := range resp.Kvs {
		if bytes.Contains(kv.Value, []byte(secretMark)) {
			t.Errorf("etcd key %s holds a secret taken from the file", kv.Key)
		}
		holdsRef = holdsRef || bytes.Contains(kv.Value, []byte(`"secrets_from":{"file":"`+file+`"}`))
	}
	if !holdsRef {
		t.Error("no etcd value holds the reference")
	}
	if _, err := n2.rt.Release(ctx, "shared", "a2"); err != nil {
		t.Fatal(err)
	}
	n2.waitFreed("shared", "a2")
	n1.stop()
	n2.stop()
	assertNoSecretInFiles(t, n1.dataDir)
	assertNoSecretInFiles(t, n2.dataDir)
}
