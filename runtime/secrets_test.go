package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/seal"
	"github.com/csiactor/csiactor/runtime"
)

// secretMark is in every secret value of these tests: no file and no
// etcd value may ever hold it.
const secretMark = "pl41n-s3cr3t"

// writeKey writes a key file of 32 bytes b in dir, mode 0600, and returns
// its path.
func writeKey(t testing.TB, dir, name string, b byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, bytes.Repeat([]byte{b}, seal.KeySize), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func keyID(b byte) string { return seal.KeyID(bytes.Repeat([]byte{b}, seal.KeySize)) }

// assertNoSecretInFiles fails if any regular file under dir holds
// secretMark. It returns the bytes of dir/state.db.
func assertNoSecretInFiles(t *testing.T, dir string) []byte {
	t.Helper()
	var state []byte
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		n++
		if bytes.Contains(data, []byte(secretMark)) {
			t.Errorf("%s holds a secret in clear", p)
		}
		if filepath.Base(p) == runtime.StoreFileName {
			state = data
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if state == nil {
		t.Fatalf("no %s under %s (%d files)", runtime.StoreFileName, dir, n)
	}
	return state
}

func TestSecretsConfig_Validate_Cases(t *testing.T) {
	dir := t.TempDir()
	good := writeKey(t, dir, "good.key", 1)
	old := writeKey(t, dir, "old.key", 2)
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, make([]byte, 16), 0o600); err != nil {
		t.Fatal(err)
	}
	world := writeKey(t, dir, "world.key", 3)
	if err := os.Chmod(world, 0o644); err != nil {
		t.Fatal(err)
	}
	cluster := &runtime.ClusterConfig{NodeID: "n1", Etcd: runtime.EtcdConfig{Endpoints: []string{"http://127.0.0.1:2379"}}}
	docker := &runtime.DockerConfig{Drivers: []runtime.DockerDriver{{Name: "csi", Plugin: "p",
		Defaults: runtime.DockerDefaults{Secrets: map[string]string{"token": secretMark}}}}}
	for _, tt := range []struct {
		name    string
		secrets *runtime.SecretsConfig
		cluster *runtime.ClusterConfig
		docker  *runtime.DockerConfig
		field   string
		want    string
	}{
		{name: "none"},
		{name: "key", secrets: &runtime.SecretsConfig{KeyFile: good, PreviousKeyFiles: []string{old}}},
		{name: "no key file", secrets: &runtime.SecretsConfig{}, field: "secrets.key_file", want: "required"},
		{name: "relative", secrets: &runtime.SecretsConfig{KeyFile: "k.key"}, field: "secrets.key_file", want: "not an absolute path"},
		{name: "missing", secrets: &runtime.SecretsConfig{KeyFile: filepath.Join(dir, "nope.key")}, field: "secrets.key_file",
			want: "nope.key does not exist; make one with `head -c 32 /dev/urandom"},
		{name: "wrong size", secrets: &runtime.SecretsConfig{KeyFile: short}, field: "secrets.key_file", want: "holds 16 bytes, want exactly 32"},
		{name: "world-readable", secrets: &runtime.SecretsConfig{KeyFile: world}, field: "secrets.key_file", want: "mode 0644: others may read it; chmod 600 it"},
		{name: "a directory", secrets: &runtime.SecretsConfig{KeyFile: dir}, field: "secrets.key_file", want: "not a regular file"},
		{name: "bad previous", secrets: &runtime.SecretsConfig{KeyFile: good, PreviousKeyFiles: []string{old, short}},
			field: "secrets.previous_key_files[1]", want: "holds 16 bytes"},
		{name: "docker secrets outside cluster mode", docker: docker},
		{name: "docker secrets in cluster mode with a key", docker: docker, cluster: cluster, secrets: &runtime.SecretsConfig{KeyFile: good}},
		{name: "docker secrets in cluster mode without a key", docker: docker, cluster: cluster,
			field: "docker.drivers[0].defaults.secrets", want: "set secrets.key_file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := runtime.Config{DataDir: "/var/lib/csiactor", Secrets: tt.secrets, Cluster: tt.cluster, Docker: tt.docker}
			err := cfg.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var fe *runtime.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, runtime.ErrInvalid) {
				t.Fatalf("Validate = %v, want a FieldError on %s saying %q", err, tt.field, tt.want)
			}
			if strings.Contains(err.Error(), secretMark) {
				t.Errorf("the error holds a secret: %v", err)
			}
		})
	}

	// In the config file, with the line.
	yml := "secrets:\n  key_file: " + good + "\n  previous_key_files: [" + short + "]\n"
	if _, err := runtime.ParseConfig([]byte(yml)); err == nil || !strings.Contains(err.Error(), "line 3: secrets.previous_key_files[0]: ") {
		t.Errorf("ParseConfig = %v", err)
	}
	cfg, err := runtime.ParseConfig([]byte("secrets:\n  key_file: " + good + "\n  previous_key_files: [" + old + "]\n"))
	if err != nil || cfg.Secrets == nil || cfg.Secrets.KeyFile != good || len(cfg.Secrets.PreviousKeyFiles) != 1 {
		t.Errorf("ParseConfig = %+v, %v", cfg.Secrets, err)
	}
}

// The hostpath driver (which ignores secrets) through the runtime: a
// created volume with secrets, claimed, and a snapshot with secrets; after
// the agent stopped, no file of its data dir holds a secret, and state.db
// holds sealed values. A restarted agent reads them.
func TestRuntime_Secrets_SealedAtRest_Hostpath(t *testing.T) {
	e, _ := hostpathEnv(t, "csiactor-seal-", func(dir string, c *runtime.Config) {
		c.Secrets = &runtime.SecretsConfig{KeyFile: writeKey(t, dir, "secrets.key", 9)}
	})
	ctx := context.Background()
	spec := runtime.VolumeSpec{Plugin: hostpath.PluginName,
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
		Secrets:      map[string]string{"user": "u-" + secretMark, "password": "p-" + secretMark}}
	if _, err := e.rt.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "vol1", CapacityBytes: 1 << 20, VolumeSpec: spec}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.Claim(ctx, "vol1", claimReq("a1", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.CreateSnapshot(ctx, runtime.SnapshotSpec{ID: "snap1", Plugin: hostpath.PluginName, SourceVolume: "vol1",
		Secrets: map[string]string{"token": "t-" + secretMark}}); err != nil {
		t.Fatal(err)
	}
	// A second volume updated with new secrets, sealed again.
	if _, err := e.rt.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "vol2", CapacityBytes: 1 << 20, VolumeSpec: spec}); err != nil {
		t.Fatal(err)
	}
	v2, err := e.rt.Volume(ctx, "vol2")
	if err != nil {
		t.Fatal(err)
	}
	upd := spec
	upd.ExternalID, upd.Context = v2.ExternalID, v2.Context
	upd.Secrets = map[string]string{"user": "u2-" + secretMark}
	if _, err := e.rt.RegisterVolume(ctx, "vol2", upd); err != nil {
		t.Fatal(err)
	}
	e.stop()

	state := assertNoSecretInFiles(t, e.dataDir)
	if n := bytes.Count(state, []byte("v1:"+keyID(9)+":")); n < 4 {
		t.Errorf("state.db holds %d values sealed with key %s, want at least 4", n, keyID(9))
	}

	// Restarted with the key: the claim is still published, the volume
	// can be claimed again, and everything is sealed with the current key.
	e.start()
	e.waitHealthy(hostpath.PluginName, runtime.TypeMonolith)
	if _, err := e.rt.Claim(ctx, "vol2", claimReq("a2", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	res, err := e.rt.ResealSecrets(ctx)
	if err != nil || res != (runtime.ResealResult{KeyID: keyID(9)}) {
		t.Errorf("ResealSecrets = %+v, %v; want nothing to do", res, err)
	}
	for _, c := range []struct{ vol, alloc string }{{"vol1", "a1"}, {"vol2", "a2"}} {
		if _, err := e.rt.Release(ctx, c.vol, c.alloc); err != nil {
			t.Fatal(err)
		}
		e.waitFreed(c.vol, c.alloc)
	}
	e.stop()
	assertNoSecretInFiles(t, e.dataDir)
}

// Rotation through the runtime: a key, then a new one with the old one as
// previous, ResealSecrets, then the new one alone; the plugin gets the
// secrets in clear throughout. A key that opens nothing fails Start with
// the key ID named.
func TestRuntime_Secrets_Rotation(t *testing.T) {
	dir := shortDir(t, "csiactor-rot-")
	e := &testEnv{t: t, dataDir: filepath.Join(dir, "d")}
	e.cfg = testConfig(e.dataDir)
	k1, k2, k3 := writeKey(t, dir, "k1", 1), writeKey(t, dir, "k2", 2), writeKey(t, dir, "k3", 3)
	e.cfg.Secrets = &runtime.SecretsConfig{KeyFile: k1}
	e.start()
	p := e.attach("fake", "fake", runtime.TypeMonolith, fakeplugin.Config{ControllerPublish: true, StageUnstage: true})
	ctx := context.Background()
	spec := volSpec("single-node-writer")
	spec.Secrets = map[string]string{"password": "p-" + secretMark}
	if _, err := e.rt.RegisterVolume(ctx, "vol1", spec); err != nil {
		t.Fatal(err)
	}
	claimWithSecret := func(alloc string) {
		t.Helper()
		if _, err := e.rt.Claim(ctx, "vol1", claimReq(alloc, "write", "single-node-writer")); err != nil {
			t.Fatal(err)
		}
		req, _ := p.LastRequest("NodeStageVolume").(*csipb.NodeStageVolumeRequest)
		if req == nil || req.GetSecrets()["password"] != "p-"+secretMark {
			t.Fatalf("NodeStageVolume got secrets %v, want the secret in clear", req.GetSecrets())
		}
		if _, err := e.rt.Release(ctx, "vol1", alloc); err != nil {
			t.Fatal(err)
		}
		e.waitFreed("vol1", alloc)
	}
	claimWithSecret("a1")
	e.stop()
	assertNoSecretInFiles(t, e.dataDir)

	e.cfg.Secrets = &runtime.SecretsConfig{KeyFile: k2, PreviousKeyFiles: []string{k1}}
	e.start()
	e.waitAllocHealthy("fake")
	res, err := e.rt.ResealSecrets(ctx)
	if err != nil || res != (runtime.ResealResult{KeyID: keyID(2), Store: 1}) {
		t.Fatalf("ResealSecrets = %+v, %v; want the one secret sealed with %s", res, err, keyID(2))
	}
	claimWithSecret("a2")
	if res, err := e.rt.ResealSecrets(ctx); err != nil || res.Store != 0 {
		t.Errorf("second ResealSecrets = %+v, %v; want 0", res, err)
	}
	// A claim held across the next restarts: its volume is loaded at Start.
	if _, err := e.rt.Claim(ctx, "vol1", claimReq("held", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	e.stop()
	state := assertNoSecretInFiles(t, e.dataDir)
	if bytes.Contains(state, []byte("v1:"+keyID(1)+":")) && !bytes.Contains(state, []byte("v1:"+keyID(2)+":")) {
		t.Errorf("state.db has no value sealed with the new key %s", keyID(2))
	}

	// The old key file can go.
	if err := os.Remove(k1); err != nil {
		t.Fatal(err)
	}
	e.cfg.Secrets = &runtime.SecretsConfig{KeyFile: k2}
	e.start()
	e.waitAllocHealthy("fake")
	if _, err := e.rt.Release(ctx, "vol1", "held"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("vol1", "held")
	claimWithSecret("a3")
	if _, err := e.rt.Claim(ctx, "vol1", claimReq("held", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	e.stop()

	// A key that sealed nothing here: Start names the key the values need.
	e.cfg.Secrets = &runtime.SecretsConfig{KeyFile: k3}
	rt, err := runtime.New(e.cfg, runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = rt.Start(ctx)
	if !errors.Is(err, seal.ErrUnknownKey) || !strings.Contains(err.Error(), keyID(2)) || strings.Contains(err.Error(), secretMark) {
		t.Fatalf("Start with an unknown key = %v, want seal.ErrUnknownKey naming key %s", err, keyID(2))
	}
	_ = rt.Shutdown(ctx)

	// Nor does an agent without a key start on it.
	e.cfg.Secrets = nil
	if rt, err = runtime.New(e.cfg, runtime.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(ctx); !errors.Is(err, seal.ErrUnknownKey) || !strings.Contains(err.Error(), "no secrets.key_file is set") {
		t.Fatalf("Start without a key = %v", err)
	}
	_ = rt.Shutdown(ctx)

	// Without a key, reseal has nothing to seal with.
	if _, err := newEnv(t).rt.ResealSecrets(ctx); !errors.Is(err, runtime.ErrConflict) || !strings.Contains(err.Error(), "secrets.key_file") {
		t.Errorf("ResealSecrets without a key = %v", err)
	}
}

// Cluster mode: definitions in etcd hold sealed secrets only; the other
// host opens them; rotation reseals etcd; literal secrets are refused
// without a key.
func TestRuntime_Secrets_Cluster(t *testing.T) {
	srv := etcdtest.Start(t)
	dir := shortDir(t, "csiactor-sc-")
	k1, k2 := writeKey(t, dir, "k1", 1), writeKey(t, dir, "k2", 2)
	host := func(node string, secrets *runtime.SecretsConfig) *testEnv {
		e := &testEnv{t: t, dataDir: filepath.Join(dir, node)}
		e.cfg = testConfig(e.dataDir)
		e.cfg.Secrets = secrets
		e.cfg.Cluster = &runtime.ClusterConfig{NodeID: node, LeaseTTL: 2 * time.Second,
			Etcd: runtime.EtcdConfig{Endpoints: []string{srv.Endpoint()}, DialTimeout: 2 * time.Second}}
		e.start()
		return e
	}
	ctx := context.Background()
	n1 := host("n1", &runtime.SecretsConfig{KeyFile: k1})
	n2 := host("n2", &runtime.SecretsConfig{KeyFile: k1})
	n1.attach("fake-n1", "fake", runtime.TypeMonolith, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, NodeID: "csi-n1"})
	p2 := n2.attach("fake-n2", "fake", runtime.TypeMonolith, fakeplugin.Config{ControllerPublish: true, StageUnstage: true, NodeID: "csi-n2"})
	spec := volSpec("single-node-writer")
	spec.Secrets = map[string]string{"password": "p-" + secretMark}
	if _, err := n1.rt.RegisterVolume(ctx, "shared", spec); err != nil {
		t.Fatal(err)
	}
	// The same definition again is a no-op, though sealed anew.
	if _, err := n1.rt.RegisterVolume(ctx, "shared", spec); err != nil {
		t.Fatalf("register the same definition again: %v", err)
	}

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	etcdValues := func() []byte {
		t.Helper()
		resp, err := cli.Get(ctx, runtime.DefaultClusterPrefix, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		var all []byte
		for _, kv := range resp.Kvs {
			if bytes.Contains(kv.Value, []byte(secretMark)) {
				t.Errorf("etcd key %s holds a secret in clear", kv.Key)
			}
			all = append(append(all, kv.Value...), '\n')
		}
		return all
	}
	if all := etcdValues(); !bytes.Contains(all, []byte(`"sealed_secrets":{"password":"v1:`+keyID(1)+`:`)) {
		t.Errorf("etcd holds no secret sealed with key %s:\n%s", keyID(1), all)
	}

	// n2 mirrors the definition and sends the secret to its plugin.
	eventually(t, "the volume on n2", func() (bool, error) {
		_, err := n2.rt.Volume(ctx, "shared")
		return err == nil, nil
	})
	if _, err := n2.rt.Claim(ctx, "shared", claimReq("a2", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	if req, _ := p2.LastRequest("ControllerPublishVolume").(*csipb.ControllerPublishVolumeRequest); req.GetSecrets()["password"] != "p-"+secretMark {
		t.Fatalf("n2's ControllerPublishVolume got secrets %v, want the secret in clear", req.GetSecrets())
	}
	if _, err := n2.rt.Release(ctx, "shared", "a2"); err != nil {
		t.Fatal(err)
	}
	n2.waitFreed("shared", "a2")

	// Literal secrets without a key are refused in cluster mode.
	n3 := host("n3", nil)
	lit := volSpec("single-node-writer")
	lit.Secrets = map[string]string{"password": "p-" + secretMark}
	for what, err := range map[string]error{
		"register": func() error { _, err := n3.rt.RegisterVolume(ctx, "lit", lit); return err }(),
		"create": func() error {
			create := lit
			create.ExternalID = ""
			_, err := n3.rt.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "lit2", VolumeSpec: create})
			return err
		}(),
		"snapshot": func() error {
			_, err := n3.rt.CreateSnapshot(ctx, runtime.SnapshotSpec{ID: "s", Plugin: "fake", SourceVolume: "shared",
				Secrets: map[string]string{"token": secretMark}})
			return err
		}(),
	} {
		var fe *runtime.FieldError
		if !errors.As(err, &fe) || !errors.Is(err, runtime.ErrInvalid) || !strings.Contains(err.Error(), "secrets.key_file") || strings.Contains(err.Error(), secretMark) {
			t.Errorf("%s with literal secrets in cluster mode without a key = %v, want ErrInvalid naming secrets.key_file", what, err)
		}
	}
	n3.stop()

	// Rotation: the new key with the old one, then reseal etcd and each
	// host's store.
	n1.stop()
	n2.stop()
	rotated := &runtime.SecretsConfig{KeyFile: k2, PreviousKeyFiles: []string{k1}}
	n1.cfg.Secrets, n2.cfg.Secrets = rotated, rotated
	n1.start()
	n2.start()
	n1.waitAllocHealthy("fake-n1")
	n2.waitAllocHealthy("fake-n2")
	res, err := n1.rt.ResealSecrets(ctx)
	if err != nil || res.KeyID != keyID(2) || res.Cluster != 1 || res.Store != 1 {
		t.Fatalf("n1 ResealSecrets = %+v, %v; want 1 value in etcd and 1 in state.db", res, err)
	}
	res, err = n2.rt.ResealSecrets(ctx)
	if err != nil || res.Cluster != 0 || res.Store != 1 {
		t.Fatalf("n2 ResealSecrets = %+v, %v; want etcd done, 1 value in state.db", res, err)
	}
	if all := etcdValues(); bytes.Contains(all, []byte(keyID(1))) || !bytes.Contains(all, []byte("v1:"+keyID(2)+":")) {
		t.Errorf("etcd after reseal still names key %s, or not %s:\n%s", keyID(1), keyID(2), all)
	}
	n1.stop()
	n2.stop()
	for _, e := range []*testEnv{n1, n2} {
		assertNoSecretInFiles(t, e.dataDir)
	}
	if err := os.Remove(k1); err != nil {
		t.Fatal(err)
	}
	n2.cfg.Secrets = &runtime.SecretsConfig{KeyFile: k2}
	n2.start()
	n2.waitAllocHealthy("fake-n2")
	if _, err := n2.rt.Claim(ctx, "shared", claimReq("a3", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	if req, _ := p2.LastRequest("ControllerPublishVolume").(*csipb.ControllerPublishVolumeRequest); req.GetSecrets()["password"] != "p-"+secretMark {
		t.Fatalf("after the old key went, ControllerPublishVolume got %v", req.GetSecrets())
	}
}
