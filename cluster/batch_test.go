package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/cluster"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/persistence"
	"github.com/csiactor/csiactor/runtime"
)

// TestRegisterVolumes_Hostpath: through POST /v1/volumes/batch, on a local
// agent and on a cluster agent, each with the hostpath driver: 100
// volumes created in one batch, deregistered, then registered again under
// new IDs in one batch beside refused entries (a bad field, a volume the
// driver does not have, one plugin volume under two IDs), each refusal
// named in its result and nothing written for it; one event for the
// batch; claims on some of the registered volumes, after which the
// driver's state.json and the mount table hold exactly what the claims
// own. Batches refused whole (an ID twice, too many, empty) write nothing.
func TestRegisterVolumes_Hostpath(t *testing.T) {
	bin := hostpath.Binary(t)
	for _, mode := range []string{"local", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			t.Cleanup(leakcheck.Check(t))
			var endpoint string
			var cfg runtime.Config
			if mode == "cluster" {
				srv := etcdtest.Start(t)
				endpoint = srv.Endpoint()
				cfg = clusterConfig(t, "n1", endpoint)
			} else {
				cfg = clusterConfig(t, "n1", "http://unused")
				cfg.Cluster = nil
			}
			cfg.Host.SkipMountCheck = false
			a := startHostpathAgentWith(t, "n1", cfg, bin)
			c, err := api.NewClient(serveAPI(t, a.rt))
			if err != nil {
				t.Fatal(err)
			}
			checkRegisterVolumes(t, a, c, endpoint)
		})
	}
}

func checkRegisterVolumes(t *testing.T, a *hostpathAgent, c *api.Client, endpoint string) {
	ctx := context.Background()
	const n = 100
	caps := []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}
	spec := runtime.VolumeSpec{Plugin: hostpath.PluginName, Capabilities: caps}

	// Creates.
	var creates []runtime.CreateVolumeSpec
	for i := range n {
		creates = append(creates, runtime.CreateVolumeSpec{ID: fmt.Sprintf("c%03d", i), CapacityBytes: 1 << 20, VolumeSpec: spec})
	}
	bad := spec
	bad.Capabilities = []runtime.Capability{{AccessMode: "bogus", AttachmentMode: "file-system"}}
	creates = append(creates, runtime.CreateVolumeSpec{ID: "cbad", VolumeSpec: bad})
	res, err := c.RegisterVolumes(ctx, creates)
	if err != nil {
		t.Fatal(err)
	}
	ext := make([]string, n)
	for i, r := range res[:n] {
		if r.Status != runtime.BatchCreated || r.ID != creates[i].ID {
			t.Fatalf("create result %d = %+v", i, r)
		}
		v, err := a.rt.Volume(ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		ext[i] = v.ExternalID
	}
	if r := res[n]; r.Status != runtime.BatchRefused || !strings.Contains(r.Error, "capabilities[0].access_mode") {
		t.Fatalf("bad create's result = %+v, want refused naming capabilities[0].access_mode", r)
	}
	for i := range n {
		if err := c.DeleteVolume(ctx, creates[i].ID, false); err != nil {
			t.Fatal(err)
		}
	}

	// Registrations, with refused entries among them.
	var regs []runtime.CreateVolumeSpec
	for i := range n {
		s := spec
		s.ExternalID = ext[i]
		regs = append(regs, runtime.CreateVolumeSpec{ID: fmt.Sprintf("r%03d", i), VolumeSpec: s})
	}
	unknown, sized, twice := spec, spec, spec
	unknown.ExternalID, sized.ExternalID, twice.ExternalID = "no-such-volume", ext[1], ext[0]
	refused := []struct {
		entry runtime.CreateVolumeSpec
		want  string
	}{
		{runtime.CreateVolumeSpec{ID: "unknown", VolumeSpec: unknown}, `says volume "no-such-volume" (external_id) does not exist`},
		{runtime.CreateVolumeSpec{ID: "sized", VolumeSpec: sized, CapacityBytes: 1}, "capacity_bytes: is for a create"},
		{runtime.CreateVolumeSpec{ID: "twice", VolumeSpec: twice}, `is already registered as volume "r000"`},
	}
	for _, r := range refused {
		regs = append(regs, r.entry)
	}
	// The agent keeps its 256 latest events: the batch's are told from
	// the creates' by time, not by position.
	start := time.Now()
	res, err = c.RegisterVolumes(ctx, regs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res[:n] {
		if r.Status != runtime.BatchRegistered || r.ID != regs[i].ID || r.Error != "" {
			t.Fatalf("register result %d = %+v", i, r)
		}
	}
	for k, want := range refused {
		r := res[n+k]
		if r.Status != runtime.BatchRefused || r.ID != want.entry.ID || !strings.Contains(r.Error, want.want) {
			t.Errorf("result of %s = %+v, want refused with %q", want.entry.ID, r, want.want)
		}
		if _, err := a.rt.Volume(ctx, want.entry.ID); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("refused entry %s: Volume = %v, want not found", want.entry.ID, err)
		}
	}
	after, err := a.rt.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var batchEvents []runtime.Event
	for _, ev := range after {
		if !ev.Time.Before(start) && (ev.Type == runtime.EventVolumesRegistered || ev.Type == runtime.EventVolumeRegistered) {
			batchEvents = append(batchEvents, ev)
		}
	}
	if len(batchEvents) != 1 || batchEvents[0].Type != runtime.EventVolumesRegistered ||
		!strings.HasPrefix(batchEvents[0].Message, "100 volumes registered: r000, r001") {
		t.Errorf("registration events = %+v, want one volumes-registered for 100", batchEvents)
	}
	vols, err := a.rt.Volumes(ctx, runtime.VolumeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != n {
		t.Errorf("%d volumes registered, want %d", len(vols), n)
	}
	if endpoint != "" {
		if got := etcdKeys(t, endpoint, runtime.DefaultClusterPrefix+"/volumes/"); got != n {
			t.Errorf("etcd holds %d volume definitions, want %d", got, n)
		}
	}

	// Claims on some, some of them released: the driver and the mount
	// table agree with what the claims own.
	capability := csi.VolumeCapability{AccessMode: csi.AccessModeSingleNodeWriter, AttachmentMode: csi.AttachmentModeFileSystem}
	var want hostpath.Want
	for i := range 10 {
		vol, alloc := fmt.Sprintf("r%03d", i), fmt.Sprintf("app%d", i)
		cl, err := c.Claim(ctx, vol, claimReq(alloc, "write", "single-node-writer"))
		if err != nil {
			t.Fatalf("claim %s: %v", vol, err)
		}
		if i >= 5 {
			if _, err := c.Release(ctx, vol, alloc); err != nil {
				t.Fatal(err)
			}
			a.waitFreed(vol, alloc)
			continue
		}
		want.Add(ext[i], []persistence.Claim{{State: cl.State, TargetPath: cl.TargetPath, ControllerRequired: true,
			StagingPath: claim.StagingPath(a.cfg.DataDir, hostpath.PluginName, vol, claim.Usage(claim.ModeWrite, capability))}})
	}
	a.settled("after claims on batch-registered volumes", want)

	// Batches refused whole write nothing.
	fresh := runtime.CreateVolumeSpec{ID: "fresh", VolumeSpec: regs[0].VolumeSpec}
	fresh.ExternalID = "ignored"
	for _, tc := range []struct {
		name    string
		entries []runtime.CreateVolumeSpec
		want    string
	}{
		{"twice", []runtime.CreateVolumeSpec{fresh, fresh}, `volumes[1].id: "fresh" is given twice`},
		{"empty", nil, "volumes: is empty"},
		{"too many", make([]runtime.CreateVolumeSpec, runtime.MaxBatchVolumes+1), "more than 1000"},
	} {
		_, err := c.RegisterVolumes(ctx, tc.entries)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, tc.want) {
			t.Errorf("batch %s: %v, want 400 naming %q", tc.name, err, tc.want)
		}
	}
	if _, err := a.rt.Volume(ctx, "fresh"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("after refused batches: Volume(fresh) = %v, want not found", err)
	}
	if vols, err := a.rt.Volumes(ctx, runtime.VolumeFilter{}); err != nil || len(vols) != n {
		t.Errorf("after refused batches: %d volumes (%v), want %d", len(vols), err, n)
	}
	if endpoint != "" {
		if got := etcdKeys(t, endpoint, runtime.DefaultClusterPrefix+"/volumes/"); got != n {
			t.Errorf("after refused batches etcd holds %d volume definitions, want %d", got, n)
		}
	}
	for i := range 5 {
		vol, alloc := fmt.Sprintf("r%03d", i), fmt.Sprintf("app%d", i)
		if _, err := c.Release(ctx, vol, alloc); err != nil {
			t.Fatal(err)
		}
		a.waitFreed(vol, alloc)
	}
	a.settled("after every claim is released", hostpath.Want{})
}

// TestSession_PutVolumes: 300 definitions in pages of cluster.MaxTxnOps/2,
// each with its plugin volume; two of them exist already (one the same,
// one another definition), and one's plugin volume is registered as
// another volume: the page holding them is written again without them,
// the same one is a no-op, the other two ErrConflict, and etcd holds every
// other one as given, with the record of its plugin volume. VolumeDefs
// reads them back in order, nil for an absent one.
func TestSession_PutVolumes(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	s := open(t, "a", srv.Endpoint())
	ctx := context.Background()
	if err := s.PutVolume(ctx, "v0130", []byte("def-v0130")); err != nil {
		t.Fatal(err)
	}
	if err := s.PutVolume(ctx, "v0131", []byte("theirs")); err != nil {
		t.Fatal(err)
	}
	if err := s.PutVolumeOf(ctx, "other", "p", "x0200", []byte("def-other")); err != nil {
		t.Fatal(err)
	}
	var ids []string
	var vols []cluster.NewVolume
	for i := range 300 {
		id := fmt.Sprintf("v%04d", i)
		ids = append(ids, id)
		vols = append(vols, cluster.NewVolume{ID: id, Plugin: "p", ExternalID: fmt.Sprintf("x%04d", i), Def: []byte("def-" + id)})
	}
	errs := s.PutVolumes(ctx, vols)
	for i, err := range errs {
		switch {
		case i == 131:
			if !errors.Is(err, cluster.ErrConflict) || !strings.Contains(err.Error(), `volume "v0131" is registered in the cluster with a different definition`) {
				t.Errorf("v0131: %v, want ErrConflict", err)
			}
		case i == 200:
			if !errors.Is(err, cluster.ErrConflict) || !strings.Contains(err.Error(), `plugin p's volume "x0200" is registered in the cluster as volume "other"`) {
				t.Errorf("v0200: %v, want ErrConflict naming volume other", err)
			}
		case err != nil:
			t.Errorf("%s: %v", ids[i], err)
		}
	}
	got, err := s.VolumeDefs(ctx, append(ids, "absent"))
	if err != nil {
		t.Fatal(err)
	}
	for i, def := range got[:300] {
		want := "def-" + ids[i]
		switch i {
		case 131:
			want = "theirs"
		case 200:
			want = ""
		}
		if string(def) != want {
			t.Errorf("%s holds %q, want %q", ids[i], def, want)
		}
	}
	if got[300] != nil {
		t.Errorf("absent volume: %q, want nil", got[300])
	}
	if n := etcdKeys(t, srv.Endpoint(), cluster.DefaultPrefix+"/volumes/"); n != 300 {
		t.Errorf("etcd holds %d definitions, want 300 (299 and other)", n)
	}
	// Written: all but v0130 (there before, without a record), v0131 and
	// v0200; and other's.
	if n := etcdKeys(t, srv.Endpoint(), cluster.DefaultPrefix+"/external/"); n != 298 {
		t.Errorf("etcd holds %d plugin volume records, want 298", n)
	}
	for _, x := range []struct{ ext, want string }{{"x0007", "v0007"}, {"x0200", "other"}, {"x0131", ""}} {
		if owner, _, err := s.ExternalOwner(ctx, "p", x.ext); err != nil || owner != x.want {
			t.Errorf("the owner of plugin volume %s: %q, %v; want %q", x.ext, owner, err, x.want)
		}
	}
}

// TestRegisterVolumes_TwoHosts: a batch on one host, then on the other a
// batch with the same volumes, one of them changed: the same ones are
// no-ops, the changed one an update that reaches the first host, and a
// new one is shared with the first host.
func TestRegisterVolumes_TwoHosts(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	a, b := startAgent(t, "a", srv.Endpoint()), startAgent(t, "b", srv.Endpoint())
	ctx := context.Background()
	entries := registerAll(t, a, "v%d", 5)
	for _, e := range entries {
		b.waitVolume(e.ID)
	}
	entries[2].Parameters = map[string]string{"tier": "gold"}
	entries = append(entries, runtime.CreateVolumeSpec{ID: "v5", VolumeSpec: volSpec("v5", "single-node-writer")})
	res, err := b.rt.RegisterVolumes(ctx, entries)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Status != runtime.BatchRegistered {
			t.Errorf("on b: %+v", r)
		}
	}
	eventually(t, "the update and the new volume on a", func() (bool, error) {
		v, err := a.rt.Volume(ctx, "v2")
		if err != nil {
			return false, err
		}
		_, err = a.rt.Volume(ctx, "v5")
		return v.Parameters["tier"] == "gold" && err == nil, nil
	})
	if n := etcdKeys(t, srv.Endpoint(), runtime.DefaultClusterPrefix+"/volumes/"); n != 6 {
		t.Errorf("etcd holds %d definitions, want 6", n)
	}
}

// TestRegisterVolumes_KeptBounded: a batch registered on a host with
// cluster.volume_cache 4 writes the new volumes to etcd only: the host
// keeps none of them until it is asked about one (read from etcd then,
// and kept), never more than its cache, and records each plugin volume's
// ID, so that another host registering one of them under another ID is
// refused naming the batch's volume.
func TestRegisterVolumes_KeptBounded(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	ctx := context.Background()
	cfg := clusterConfig(t, "a", srv.Endpoint())
	cfg.Cluster.VolumeCache = 4
	a := startAgentWith(t, "a", cfg)
	b := startAgent(t, "b", srv.Endpoint())
	registerAll(t, a, "k%02d", 20)
	if got := a.kept(); got != 0 {
		t.Errorf("a keeps %d definitions after its batch, want none", got)
	}
	if vs, err := a.rt.Volumes(ctx, runtime.VolumeFilter{}); err != nil || len(vs) != 20 {
		t.Fatalf("volumes listed on a after its batch: %d, %v; want 20", len(vs), err)
	}
	for i := range 6 {
		id := fmt.Sprintf("k%02d", i)
		if v, err := a.rt.Volume(ctx, id); err != nil || v.ExternalID != "ext-"+id {
			t.Fatalf("%s read on a: %+v, %v", id, v, err)
		}
	}
	eventually(t, "a down to its cache of 4", func() (bool, error) { return a.kept() == 4, nil })
	if v, err := a.rt.Volume(ctx, "k00"); err != nil || v.ExternalID != "ext-k00" {
		t.Fatalf("k00 on a after its eviction: %+v, %v", v, err)
	}
	_, err := b.rt.RegisterVolume(ctx, "dup", volSpec("k07", "single-node-writer"))
	if !errors.Is(err, runtime.ErrConflict) || !strings.Contains(err.Error(), `registered in the cluster as volume "k07"`) {
		t.Fatalf("b registers plugin volume ext-k07 as dup: %v; want ErrConflict naming k07", err)
	}
	// The same in a batch: etcd refuses the entry, and b keeps no record.
	res, err := b.rt.RegisterVolumes(ctx, []runtime.CreateVolumeSpec{
		{ID: "dup2", VolumeSpec: volSpec("k08", "single-node-writer")},
		{ID: "new", VolumeSpec: volSpec("new", "single-node-writer")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != runtime.BatchRefused || !strings.Contains(res[0].Error, `"k08"`) || res[1].Status != runtime.BatchRegistered {
		t.Fatalf("b's batch with plugin volume ext-k08 as dup2 = %+v; want dup2 refused naming k08, new registered", res)
	}
	if _, err := b.rt.Volume(ctx, "dup2"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("dup2 on b after its refusal: %v, want ErrNotFound", err)
	}
	if v, err := a.rt.Volume(ctx, "new"); err != nil || v.ExternalID != "ext-new" {
		t.Errorf("b's new volume read on a: %+v, %v", v, err)
	}
}

// registerAll registers n volumes named by format and their index through
// one batch on a, and fails the test unless each is registered; it
// returns the batch's entries.
func registerAll(t *testing.T, a *agent, format string, n int) []runtime.CreateVolumeSpec {
	t.Helper()
	var entries []runtime.CreateVolumeSpec
	for i := range n {
		id := fmt.Sprintf(format, i)
		entries = append(entries, runtime.CreateVolumeSpec{ID: id, VolumeSpec: volSpec(id, "single-node-writer")})
	}
	res, err := a.rt.RegisterVolumes(context.Background(), entries)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Status != runtime.BatchRegistered {
			t.Fatalf("on %s: %+v, want registered", a.node, r)
		}
	}
	return entries
}
