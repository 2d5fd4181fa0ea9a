package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/cmd/csiactor/cli"
	"github.com/csiactor/csiactor/runtime"
)

// serveAPI serves b's API on a unix socket until t ends and returns its
// address.
func serveAPI(t testing.TB, b api.Backend) string {
	t.Helper()
	path := filepath.Join(shortDir(t, "csiactor-api-"), "api.sock")
	l, err := api.ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: api.NewHandler(b, api.Options{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return "unix://" + path
}

func runCLI(t *testing.T, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := cli.Run(context.Background(), args, &out, &errOut); code != 0 {
		t.Fatalf("csiactor %s: exit %d: %s", strings.Join(args, " "), code, errOut.String())
	}
	return out.String()
}

// TestCluster_API: GET /v1/nodes and /v1/nodes/{id}, a volume's claims
// with their hosts (another host's as remote), 409 for a claim another
// host's claim blocks, and the node and volume commands of the CLI.
func TestCluster_API(t *testing.T) {
	_, as := threeAgents(t)
	ctx := context.Background()
	addr := serveAPI(t, as[0].rt)
	cl, err := api.NewClient(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const vol, am = "api-disk", "single-node-writer"
	if _, err := cl.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
		t.Fatal(err)
	}
	as[1].waitVolume(vol)
	if _, err := as[1].rt.Claim(ctx, vol, claimReq("app", "write", am)); err != nil {
		t.Fatal(err)
	}
	_, err = cl.Claim(ctx, vol, claimReq("other", "write", am))
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict {
		t.Fatalf("claim over n2's = %v, want a 409", err)
	}
	t.Log(err)
	v, err := cl.Volume(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Claims) != 1 || v.Claims[0].Host != "n2" || v.Claims[0].State != runtime.ClaimRemote {
		t.Fatalf("claims seen from n1: %+v", v.Claims)
	}
	// A list has n1's claims only, unless it asks for every host's.
	for _, all := range []bool{false, true} {
		vs, err := cl.Volumes(ctx, runtime.VolumeFilter{AllHosts: all})
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(vs, func(v runtime.Volume) bool { return v.ID == vol })
		if i < 0 {
			t.Fatalf("%s missing from the list (all hosts %v): %+v", vol, all, vs)
		}
		switch cs := vs[i].Claims; {
		case !all && len(cs) != 0:
			t.Errorf("list without all_hosts shows claims %+v, want none of n1's", cs)
		case all && (len(cs) != 1 || cs[0].Host != "n2" || cs[0].Alloc != "app" || cs[0].State != runtime.ClaimRemote):
			t.Errorf("list with all_hosts shows claims %+v, want n2's app, remote", cs)
		}
	}
	ns, err := cl.Nodes(ctx)
	if err != nil || len(ns) != 3 || ns[1].ID != "n2" || ns[1].Claims != 1 || ns[1].Status != runtime.NodeUp {
		t.Fatalf("Nodes = %+v, %v", ns, err)
	}
	n, err := cl.Node(ctx, "n3")
	if err != nil || n.ID != "n3" || n.Claims != 0 || n.LastSeen.IsZero() {
		t.Fatalf("Node(n3) = %+v, %v", n, err)
	}
	if _, err := cl.Node(ctx, "n9"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("Node(n9) = %v", err)
	}
	out := runCLI(t, "node", "list", "-address", addr)
	for _, want := range []string{"NODE", "STATUS", "LAST SEEN", "CLAIMS", "n1 (this agent)", "n2 ", "up"} {
		if !strings.Contains(out, want) {
			t.Errorf("node list lacks %q:\n%s", want, out)
		}
	}
	out = runCLI(t, "node", "status", "-address", addr, "n2")
	if !strings.Contains(out, "Claims") || !strings.Contains(out, "n2") {
		t.Errorf("node status:\n%s", out)
	}
	out = runCLI(t, "volume", "list", "-all-hosts", "-address", addr)
	// CLAIMS is the last column but one.
	if i := slices.IndexFunc(strings.Split(out, "\n"), func(l string) bool { return strings.HasPrefix(l, vol+" ") }); i < 0 {
		t.Errorf("volume list -all-hosts lacks %s:\n%s", vol, out)
	} else if f := strings.Fields(strings.Split(out, "\n")[i]); f[len(f)-2] != "1" {
		t.Errorf("volume list -all-hosts does not count n2's claim:\n%s", out)
	}
	out = runCLI(t, "volume", "status", "-address", addr, vol)
	if !strings.Contains(out, "HOST") || !strings.Contains(out, "n2") || !strings.Contains(out, "remote") {
		t.Errorf("volume status lacks the claim's host:\n%s", out)
	}
	t.Logf("csiactor node list:\n%s", runCLI(t, "node", "list", "-address", addr))
}

// TestNodes_LocalMode: an agent without a cluster section answers 404 on
// /v1/nodes, saying so.
func TestNodes_LocalMode(t *testing.T) {
	cfg := clusterConfig(t, "solo", "http://127.0.0.1:1")
	cfg.Cluster = nil
	rt, err := runtime.New(cfg, runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rt.Shutdown(context.Background()) }()
	cl, err := api.NewClient(serveAPI(t, rt))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_, err = cl.Nodes(context.Background())
	if !errors.Is(err, runtime.ErrNotFound) || !strings.Contains(err.Error(), "not in cluster mode") {
		t.Fatalf("Nodes in local mode = %v", err)
	}
}
