package acceptance

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/internal/testpki"
	"github.com/csiactor/csiactor/runtime"
)

// tlsClusterConfig is one agent of TestCluster_TLSListeners: cluster mode
// on the test's etcd, its TCP listener with mutual TLS, and the example
// plugin on storage both hosts share, as allocation type %[8]s.
const tlsClusterConfig = `data_dir: %[1]s/data
log: {format: json, level: debug}
api:
  http_addr: 127.0.0.1:0
  token_file: %[2]s
  tls: {cert_file: %[3]s, key_file: %[4]s, client_ca_file: %[5]s}
plugins: {heartbeat_interval: 1s, probe_timeout: 1s}
volumes: {retry: {initial: 50ms, max: 500ms}}
cluster:
  node_id: %[6]s
  lease_ttl: 2s
  etcd: {endpoints: [%[7]q]}
allocations:
  - id: example
    plugin: example
    type: %[8]s
    command: [%[9]q, example-plugin, -state-dir, %[1]s/plugin, -shared-dir, %[10]q, -node-id, %[6]s]
`

// TestCluster_TLSListeners runs two agents of one cluster, each serving
// its TCP API with mutual TLS, and drives them only through the CLI over
// https://: node2 has no controller of its own, so its create and claim go
// to node1's controller through etcd, and each host sees the other's claim
// (-all-hosts). Nothing of the cluster goes through the TLS listeners, so
// the certificates change nothing for it; the CLI needs the CA and a
// client certificate, and no token or PEM content reaches a log or output.
func TestCluster_TLSListeners(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and two agents")
	}
	h := newHost(t)
	etcd := etcdtest.Start(t)
	const token = "tls-cluster-T0ken-77d1"
	tokenFile := h.write("token", token+"\n", 0o600)
	ca := testpki.NewCA(t, "cluster-ca")
	operator := ca.Client("operator")
	storage := filepath.Join(h.base, "storage")
	agents := map[string]*agent{}
	pairs := []*testpki.Pair{operator}
	for node, typ := range map[string]string{"node1": "monolith", "node2": "node"} {
		dir := filepath.Join(h.base, node)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		srv := ca.Server(node)
		pairs = append(pairs, srv)
		cfg := fmt.Sprintf(tlsClusterConfig, dir, tokenFile, srv.CertFile, srv.KeyFile, ca.File, node, etcd.Endpoint(), typ, h.bin, storage)
		agents[node] = h.startAgent("-config", h.write(node+".yaml", cfg, 0o600))
	}
	n1, n2 := agents["node1"], agents["node2"]
	https := func(a *agent, args ...string) result {
		t.Helper()
		if !strings.HasPrefix(a.tcpAddr, "https://") {
			t.Fatalf("agent TCP address %s, want https://", a.tcpAddr)
		}
		return h.cli([]string{"CSIACTOR_ADDR=" + a.tcpAddr, "CSIACTOR_TOKEN=" + token, "CSIACTOR_CACERT=" + ca.File,
			"CSIACTOR_CLIENT_CERT=" + operator.CertFile, "CSIACTOR_CLIENT_KEY=" + operator.KeyFile}, args...)
	}
	ok := func(a *agent, args ...string) string {
		t.Helper()
		r := https(a, args...)
		if r.code != 0 {
			t.Fatalf("csiactor %s over https: %s", strings.Join(args, " "), r)
		}
		testpki.NotShown(t, pairs, []string{token}, r.stdout, r.stderr)
		return r.stdout
	}
	h.eventually("both hosts up, node1's controller healthy", waitDeadline, func() (bool, string) {
		r := https(n2, "node", "list")
		p := https(n1, "plugin", "status", "example", "-json")
		var pl runtime.Plugin
		_ = json.Unmarshal([]byte(p.stdout), &pl)
		return r.code == 0 && strings.Count(r.stdout, " up ") == 2 && pl.ControllersHealthy == 1, r.String() + p.String()
	})

	// node2 creates and claims through node1's controller (etcd), driven
	// over its https:// listener.
	ok(n2, "volume", "create", "-plugin", "example", "-capacity", "1MiB", "-capability", "single-node-writer", "vol-tls")
	h.eventually("node2's node plugin healthy", waitDeadline, func() (bool, string) {
		r := https(n2, "plugin", "status", "example", "-json")
		var pl runtime.Plugin
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &pl) == nil && pl.NodesHealthy == 1, r.String()
	})
	ok(n2, "volume", "claim", "-alloc", "app2", "-mode", "write", "-access-mode", "single-node-writer", "vol-tls")

	var vols []runtime.Volume
	if err := json.Unmarshal([]byte(ok(n1, "volume", "list", "-all-hosts", "-json")), &vols); err != nil {
		t.Fatal(err)
	}
	if len(vols) != 1 || len(vols[0].Claims) != 1 || vols[0].Claims[0].Host != "node2" || vols[0].Claims[0].State != runtime.ClaimRemote {
		t.Errorf("node1's -all-hosts list over https: %+v, want node2's claim of vol-tls", vols)
	}
	ok(n2, "volume", "release", "-alloc", "app2", "vol-tls")

	// Without the client certificate, either host refuses the CLI.
	for _, a := range []*agent{n1, n2} {
		r := h.cli([]string{"CSIACTOR_ADDR=" + a.tcpAddr, "CSIACTOR_TOKEN=" + token, "CSIACTOR_CACERT=" + ca.File}, "status")
		if r.code != 1 || !strings.Contains(r.stderr, "the agent may want a client certificate") {
			t.Errorf("status without a client certificate: %s", r)
		}
	}

	for _, a := range []*agent{n2, n1} {
		a.signal(syscall.SIGINT)
		if code := a.wait(); code != 0 {
			t.Errorf("agent exit code %d\n%s", code, testbin.Tail(a.logs(), 10))
		}
		testpki.NotShown(t, pairs, []string{token}, a.logs(), readFile(a.stdout))
	}
}
