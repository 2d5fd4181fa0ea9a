package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/metrictest"
	"github.com/csiactor/csiactor/runtime"
)

// kept is how many volume definitions agent a keeps
// (csiactor_cluster_volumes_kept).
func (a *agent) kept() int {
	v, _ := metrictest.Value(a.t, a.reg, "csiactor_cluster_volumes_kept", nil)
	return int(v)
}

// TestCluster_VolumeCache: a host keeps the definitions it reads up to
// cluster.volume_cache and forgets the least recently used beyond it,
// never one it has a claim on; a forgotten one is read from etcd again
// when asked for (a read, a claim); a change of a definition reaches a
// host that keeps it at once (its event), and one that forgot it reads
// the new definition.
func TestCluster_VolumeCache(t *testing.T) {
	t.Cleanup(leakcheck.Check(t)) // last: after the agents and the server stopped
	srv := etcdtest.Start(t)
	ctx := context.Background()
	const cacheSize, n, am = 4, 12, "single-node-writer"
	cfg := clusterConfig(t, "a", srv.Endpoint())
	cfg.Cluster.VolumeCache = cacheSize
	a := startAgentWith(t, "a", cfg)
	b := startAgent(t, "b", srv.Endpoint())
	for i := range n {
		id := fmt.Sprintf("c%02d", i)
		if _, err := b.rt.RegisterVolume(ctx, id, volSpec(id, am)); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.kept(); got != 0 {
		t.Fatalf("a keeps %d definitions before it is asked for any, want 0", got)
	}

	// Claimed on a: kept whatever a reads afterwards.
	if _, err := a.rt.Claim(ctx, "c00", claimReq("a1", "write", am)); err != nil {
		t.Fatalf("claim on a volume a never saw: %v", err)
	}
	for i := range n {
		id := fmt.Sprintf("c%02d", i)
		v, err := a.rt.Volume(ctx, id)
		if err != nil {
			t.Fatalf("read %s on a: %v", id, err)
		}
		if v.ExternalID != "ext-"+id {
			t.Fatalf("%s on a has external ID %q, want ext-%s", id, v.ExternalID, id)
		}
	}
	eventually(t, "a down to its cache and its claimed volume", func() (bool, error) {
		return a.kept() == cacheSize, nil
	})
	v, err := a.rt.Volume(ctx, "c00")
	if err != nil || len(v.Claims) != 1 || v.Claims[0].State != runtime.ClaimPublished {
		t.Fatalf("c00 on a after the evictions = %+v, %v; want its published claim", v.Claims, err)
	}

	// A held (cached) volume's update reaches a at once: its event.
	events, err := a.rt.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := fmt.Sprintf("c%02d", n-1) // read last: kept
	spec := volSpec(held, am)
	spec.Parameters = map[string]string{"tier": "gold"}
	if _, err := b.rt.RegisterVolume(ctx, held, spec); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, runtime.EventVolumeUpdated, held)
	if v, err := a.rt.Volume(ctx, held); err != nil || v.Parameters["tier"] != "gold" {
		t.Fatalf("%s on a after b's update = %v, %v; want tier gold", held, v.Parameters, err)
	}

	// An evicted volume: a reads the new definition when asked.
	gone := "c01"
	spec = volSpec(gone, am)
	spec.Parameters = map[string]string{"tier": "silver"}
	if _, err := b.rt.RegisterVolume(ctx, gone, spec); err != nil {
		t.Fatal(err)
	}
	if v, err := a.rt.Volume(ctx, gone); err != nil || v.Parameters["tier"] != "silver" {
		t.Fatalf("%s on a after b's update = %v, %v; want tier silver", gone, v.Parameters, err)
	}
	// Claimed after its eviction.
	if _, err := a.rt.Claim(ctx, "c02", claimReq("a2", "write", am)); err != nil {
		t.Fatalf("claim on an evicted volume: %v", err)
	}
	// Deregistered by b: gone on a, kept or not. a forgets the one it
	// keeps when its watch brings the deletion (b answers once etcd and
	// b have it, not a); the one it does not keep it reads from etcd.
	for _, id := range []string{held, "c03"} {
		if err := b.rt.DeleteVolume(ctx, id, false); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, held+" gone on a, which kept it", func() (bool, error) {
		_, err := a.rt.Volume(ctx, held)
		return errors.Is(err, runtime.ErrNotFound), nil
	})
	if _, err := a.rt.Volume(ctx, "c03"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("c03 on a after b deregistered it: %v, want ErrNotFound", err)
	}
	for _, c := range [][2]string{{"c00", "a1"}, {"c02", "a2"}} {
		if _, err := a.rt.Release(ctx, c[0], c[1]); err != nil {
			t.Fatal(err)
		}
		a.waitFreed(c[0], c[1])
	}
}

// waitEvent waits for an event of type typ on volume vol.
func waitEvent(t *testing.T, events <-chan runtime.Event, typ, vol string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range events {
			if e.Type == typ && e.Volume == vol {
				return
			}
		}
	}()
	eventually(t, fmt.Sprintf("event %s of %s", typ, vol), func() (bool, error) {
		select {
		case <-done:
			return true, nil
		default:
			return false, nil
		}
	})
}

// TestCluster_VolumesPaging: GET /v1/volumes?per_page=N pages through
// etcd in ID order, the next token in X-Csiactor-Next-Token (none on the
// last page): every volume registered before the listing is seen exactly
// once while others are registered meanwhile, on a host that keeps none
// of them; all_hosts pages show another host's claims; a bad per_page or
// next_token is a 400 naming it.
func TestCluster_VolumesPaging(t *testing.T) {
	_, as := threeAgents(t)
	ctx := context.Background()
	const n, am = 157, "multi-node-multi-writer"
	want := map[string]bool{}
	for i := range n {
		id := fmt.Sprintf("p%03d", i)
		if _, err := as[1].rt.RegisterVolume(ctx, id, volSpec(id, am)); err != nil {
			t.Fatal(err)
		}
		want[id] = true
	}
	if _, err := as[1].rt.Claim(ctx, "p100", claimReq("b1", "write", am)); err != nil {
		t.Fatal(err)
	}
	cl, err := api.NewClient(serveAPI(t, as[0].rt))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	// Registered while the pages are read: before, between and after
	// the listed IDs.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	added := 0
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for _, id := range []string{fmt.Sprintf("a%03d", i), fmt.Sprintf("p%03d-x", i), fmt.Sprintf("z%03d", i)} {
				if _, err := as[2].rt.RegisterVolume(ctx, id, volSpec(id, am)); err != nil {
					t.Error(err)
					return
				}
			}
			added++
		}
	}()
	seen := map[string]int{}
	pages := 0
	var remote []runtime.Claim
	for token := ""; ; pages++ {
		vs, next, err := cl.VolumesPage(ctx, runtime.VolumeFilter{AllHosts: true}, 10, token)
		if err != nil {
			t.Fatal(err)
		}
		if len(vs) > 10 {
			t.Fatalf("page %d has %d volumes, want at most 10", pages, len(vs))
		}
		if !slices.IsSortedFunc(vs, func(x, y runtime.Volume) int { return strings.Compare(x.ID, y.ID) }) {
			t.Fatalf("page %d not in ID order", pages)
		}
		for _, v := range vs {
			seen[v.ID]++
			if v.ID == "p100" {
				remote = v.Claims
			}
		}
		if next == "" {
			break
		}
		if next <= vs[len(vs)-1].ID {
			t.Fatalf("next token %q does not follow the page's last ID %q", next, vs[len(vs)-1].ID)
		}
		token = next
	}
	close(stop)
	wg.Wait()
	for id := range want {
		if seen[id] != 1 {
			t.Errorf("%s seen %d times across the pages, want once", id, seen[id])
		}
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("%s seen %d times across the pages", id, k)
		}
	}
	t.Logf("%d pages, %d volumes seen, %d rounds of 3 registered meanwhile", pages, len(seen), added)
	if len(remote) != 1 || remote[0].Host != "n2" || remote[0].State != runtime.ClaimRemote {
		t.Errorf("p100's claims with all_hosts = %+v, want b1 remote on n2", remote)
	}
	if got := as[0].kept(); got != 0 {
		t.Errorf("n1 keeps %d definitions after listing, want 0 (a listing reads etcd)", got)
	}
	// Without per_page: every volume, as before.
	all, err := cl.Volumes(ctx, runtime.VolumeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, v := range all {
		ids[v.ID] = true
	}
	for _, id := range slices.Sorted(maps.Keys(want)) {
		if !ids[id] {
			t.Fatalf("GET /v1/volumes without per_page lacks %s", id)
		}
	}
	for _, bad := range []struct {
		per   int
		token string
		want  string
	}{
		{0, "", "per_page: 0: want 1 to 1000"},
		{-1, "", "per_page: -1: want 1 to 1000"},
		{1001, "", "per_page: 1001: want 1 to 1000"},
		{10, "../etc", `next_token: "../etc" is not a token this API gave`},
	} {
		_, _, err := cl.VolumesPage(ctx, runtime.VolumeFilter{}, bad.per, bad.token)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("per_page=%d next_token=%q: %v, want a 400 saying %q", bad.per, bad.token, err, bad.want)
		}
	}
	if _, err := as[1].rt.Release(ctx, "p100", "b1"); err != nil {
		t.Fatal(err)
	}
	as[1].waitFreed("p100", "b1")
}

// TestCluster_PluginVolumeOneID: a plugin volume registered as one ID is
// refused under another on a host that does not keep the first (409
// naming it, nothing registered), and free again once the first is
// deregistered.
func TestCluster_PluginVolumeOneID(t *testing.T) {
	t.Cleanup(leakcheck.Check(t)) // last: after the agents and the server stopped
	srv := etcdtest.Start(t)
	ctx := context.Background()
	a, b := startAgent(t, "a", srv.Endpoint()), startAgent(t, "b", srv.Endpoint())
	const am = "single-node-writer"
	spec := volSpec("first", am) // external ID ext-first
	if _, err := b.rt.RegisterVolume(ctx, "first", spec); err != nil {
		t.Fatal(err)
	}
	_, err := a.rt.RegisterVolume(ctx, "second", spec)
	if !errors.Is(err, runtime.ErrConflict) || !strings.Contains(err.Error(), `registered in the cluster as volume "first"`) {
		t.Fatalf("the same plugin volume as another ID on a host that does not keep it = %v, want ErrConflict naming first", err)
	}
	if _, err := a.rt.Volume(ctx, "second"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("second after the refusal: %v, want ErrNotFound", err)
	}
	if got := a.kept(); got != 0 {
		t.Errorf("a keeps %d definitions after the refusal, want 0", got)
	}
	if err := b.rt.DeleteVolume(ctx, "first", false); err != nil {
		t.Fatal(err)
	}
	if _, err := a.rt.RegisterVolume(ctx, "second", spec); err != nil {
		t.Fatalf("the plugin volume as another ID once the first is deregistered: %v", err)
	}
	if _, err := b.rt.RegisterVolume(ctx, "first", spec); !errors.Is(err, runtime.ErrConflict) {
		t.Fatalf("first again, now that the plugin volume is second: %v, want ErrConflict", err)
	}
}

// TestCluster_ExternalVolumesRegisteredAs: a plugin's own volumes, listed
// on a host that does not keep the ones another host registered, name
// the cluster volume each is registered as (one etcd read for the page),
// and none once it is deregistered.
func TestCluster_ExternalVolumesRegisteredAs(t *testing.T) {
	t.Cleanup(leakcheck.Check(t)) // last: after the agents and the server stopped
	srv := etcdtest.Start(t)
	ctx := context.Background()
	a, b := startAgent(t, "a", srv.Endpoint()), startAgent(t, "b", srv.Endpoint())
	const plugin = "lister"
	for _, x := range []*agent{a, b} {
		p, ep := fakeplugin.Start(t, fakeplugin.Config{ListVolumes: true, NodeID: "csi-" + x.node})
		for _, id := range []string{"ext-1", "ext-2", "ext-3"} {
			p.AddVolume(fakeplugin.Volume{ID: id, CapacityBytes: 1 << 20})
		}
		if _, err := x.rt.RegisterAllocation(ctx, plugin+"-"+x.node, runtime.AllocationSpec{
			Plugin: plugin, Type: runtime.TypeMonolith, Socket: ep[len("unix://"):],
		}); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, waitLimit)
		err := x.rt.WaitHealthy(wctx, plugin, runtime.TypeMonolith)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	spec := func(ext string) runtime.VolumeSpec {
		return runtime.VolumeSpec{Plugin: plugin, ExternalID: ext,
			Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}
	}
	if _, err := b.rt.RegisterVolume(ctx, "on-b", spec("ext-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.rt.RegisterVolume(ctx, "on-a", spec("ext-3")); err != nil {
		t.Fatal(err)
	}
	registeredAs := func(x *agent) map[string]string {
		t.Helper()
		got, err := x.rt.ListExternalVolumes(ctx, plugin, runtime.ExternalVolumesQuery{})
		if err != nil {
			t.Fatalf("external volumes of %s on %s: %v", plugin, x.node, err)
		}
		m := map[string]string{}
		for _, v := range got.Volumes {
			m[v.ExternalID] = v.RegisteredAs
		}
		return m
	}
	want := map[string]string{"ext-1": "on-b", "ext-2": "", "ext-3": "on-a"}
	for _, x := range []*agent{a, b} {
		if got := registeredAs(x); !maps.Equal(got, want) {
			t.Errorf("registered_as on %s = %v, want %v", x.node, got, want)
		}
	}
	if got := a.kept(); got != 1 {
		t.Errorf("a keeps %d definitions after listing, want 1 (its own)", got)
	}
	if err := b.rt.DeleteVolume(ctx, "on-b", false); err != nil {
		t.Fatal(err)
	}
	want["ext-1"] = ""
	if got := registeredAs(a); !maps.Equal(got, want) {
		t.Errorf("registered_as on a once on-b is deregistered = %v, want %v", got, want)
	}
}
