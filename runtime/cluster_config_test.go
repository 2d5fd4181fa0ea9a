package runtime

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseConfig_Cluster(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
data_dir: /var/lib/csiactor
cluster:
  node_id: host-1
  etcd:
    endpoints: ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]
    tls: {ca: /etc/etcd/ca.pem, cert: /etc/etcd/c.pem, key: /etc/etcd/k.pem}
    username: csiactor
    password_file: /etc/csiactor/etcd-password
    dial_timeout: 3s
  lease_ttl: 15s
  prefix: /csi/prod
  fence_after: 2m
`))
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Cluster
	if c == nil || c.NodeID != "host-1" || len(c.Etcd.Endpoints) != 2 || c.Etcd.TLS.Key != "/etc/etcd/k.pem" ||
		c.Etcd.Username != "csiactor" || c.Etcd.DialTimeout != 3*time.Second || c.LeaseTTL != 15*time.Second || c.Prefix != "/csi/prod" ||
		c.FenceAfter != 2*time.Minute {
		t.Fatalf("cluster = %+v", c)
	}
}

func TestParseConfig_ClusterDefaults(t *testing.T) {
	cfg, err := ParseConfig([]byte("cluster:\n  etcd:\n    endpoints: [http://127.0.0.1:2379]\n"))
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	c := cfg.WithDefaults().Cluster
	if c.NodeID != host || c.LeaseTTL != DefaultLeaseTTL || c.Prefix != DefaultClusterPrefix || c.Etcd.DialTimeout != DefaultEtcdDialTimeout || c.VolumeCache != DefaultVolumeCache {
		t.Fatalf("defaults = %+v", c)
	}
	// No cluster section: local mode.
	cfg, err = ParseConfig([]byte("data_dir: /d\n"))
	if err != nil || cfg.Cluster != nil {
		t.Fatalf("no section: %+v, %v", cfg.Cluster, err)
	}
}

func TestParseConfig_ClusterErrors(t *testing.T) {
	ep := "cluster:\n  etcd:\n    endpoints: [http://127.0.0.1:2379]\n"
	for _, tc := range []struct{ name, in, want string }{
		{"unknown key", "cluster:\n  node: a\n", `line 2: cluster.node: unknown key (known here: etcd, fence_after, lease_ttl, node_id, prefix, volume_cache)`},
		{"unknown etcd key", "cluster:\n  etcd:\n    endpoint: x\n", `line 3: cluster.etcd.endpoint: unknown key (known here: dial_timeout, endpoints, password_file, tls, username)`},
		{"unknown tls key", "cluster:\n  etcd:\n    tls: {cacert: /x}\n", `line 3: cluster.etcd.tls.cacert: unknown key (known here: ca, cert, key)`},
		{"no endpoints", "cluster:\n  node_id: a\n", `line 1: cluster.etcd.endpoints: give at least one etcd client URL`},
		{"bad endpoint", "cluster:\n  etcd:\n    endpoints: [\"10.0.0.1\"]\n", `line 3: cluster.etcd.endpoints[0]: "10.0.0.1": want a URL like "https://10.0.0.1:2379"`},
		{"endpoint without port", "cluster:\n  etcd:\n    endpoints: [\"https://etcd\"]\n", `cluster.etcd.endpoints[0]: "https://etcd": want a URL`},
		{"bad node id", ep + "  node_id: a/b\n", `line 4: cluster.node_id: "a/b": use letters, digits`},
		{"short ttl", ep + "  lease_ttl: 1s\n", `line 4: cluster.lease_ttl: 1s: want whole seconds, at least 2s`},
		{"fractional ttl", ep + "  lease_ttl: 2500ms\n", `cluster.lease_ttl: 2.5s: want whole seconds`},
		{"ttl not a duration", ep + "  lease_ttl: 10\n", `line 4: cluster.lease_ttl: want a duration`},
		{"bad prefix", ep + "  prefix: csiactor\n", `line 4: cluster.prefix: "csiactor": want a key prefix`},
		{"trailing slash prefix", ep + "  prefix: /csiactor/\n", `cluster.prefix: "/csiactor/": want a key prefix`},
		{"relative ca", ep + "    tls: {ca: ca.pem}\n", `cluster.etcd.tls.ca: "ca.pem" is not an absolute path`},
		{"cert without key", ep + "    tls: {cert: /c.pem}\n", `cluster.etcd.tls.cert: give both cert and key, or neither`},
		{"user without password", ep + "    username: u\n", `cluster.etcd.username: give both username and password_file, or neither`},
		{"negative dial timeout", ep + "    dial_timeout: -1s\n", `cluster.etcd.dial_timeout: -1s is negative`},
		{"negative volume_cache", ep + "  volume_cache: -1\n", `line 4: cluster.volume_cache: -1 is negative; want a number of volume definitions, or 0 for the default (2000)`},
		{"volume_cache not a number", ep + "  volume_cache: many\n", `line 4: cluster.volume_cache:`},
		{"negative fence_after", ep + "  fence_after: -1s\n", `line 4: cluster.fence_after: -1s is negative`},
		{"fence_after within the ttl", ep + "  fence_after: 12s\n", `line 4: cluster.fence_after: 12s: want longer than lease_ttl (10s) plus the self-fence margin (2.5s), or 0 (off)`},
		{"fence_after equal to ttl plus margin", ep + "  lease_ttl: 4s\n  fence_after: 5s\n", `cluster.fence_after: 5s: want longer than lease_ttl (4s) plus the self-fence margin (1s)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseConfig error\n got %v\nwant %q", err, tc.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %q does not unwrap to ErrInvalid", err)
			}
		})
	}
}

// TestStart_ClusterUnreachable: etcd that does not answer fails Start with
// an error naming it, before any plugin starts; the runtime is spent and
// the data dir free again.
func TestStart_ClusterUnreachable(t *testing.T) {
	dir, err := os.MkdirTemp("", "csiactor-cu-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := Config{DataDir: dir, Store: StoreConfig{NoSync: true}, Cluster: &ClusterConfig{
		NodeID: "a", Etcd: EtcdConfig{Endpoints: []string{"http://127.0.0.1:1"}, DialTimeout: 300 * time.Millisecond},
	}}
	rt, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = rt.Start(context.Background())
	if !errors.Is(err, ErrClusterUnavailable) || !strings.Contains(err.Error(), "http://127.0.0.1:1") {
		t.Fatalf("Start = %v, want ErrClusterUnavailable naming the endpoint", err)
	}
	t.Log(err)
	// The store was closed again: a new runtime can take the data dir.
	cfg.Cluster = nil
	rt2, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := rt2.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}
