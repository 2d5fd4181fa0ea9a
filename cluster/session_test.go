package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/cluster"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/persistence"
)

// open opens a session for node on endpoints (see openWith).
func open(t *testing.T, node string, endpoints ...string) *cluster.Session {
	t.Helper()
	return openWith(t, cluster.Config{NodeID: node, Endpoints: endpoints})
}

// openWith opens a session with cfg, closed when t ends. A zero LeaseTTL
// or DialTimeout is the agents' in the tests (clusterConfig: 5 s and 2 s),
// not the session's defaults: with a 1 s bound on every request, a loaded
// machine failed a test that expects no etcd outage with "context
// deadline exceeded" (TestSession_WatchVolumesPages, on one of its 1,234
// writes). Tests of a lease's expiry set a shorter one.
func openWith(t *testing.T, cfg cluster.Config) *cluster.Session {
	t.Helper()
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 5 * time.Second
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	s, err := cluster.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func directClient(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// writer is a single-node-writer write claim request of alloc.
func writer(alloc string, am csi.AccessMode) (persistence.Claim, claim.Request) {
	r := claim.Request{Alloc: alloc, Mode: claim.ModeWrite,
		Capability: csi.VolumeCapability{AccessMode: am, AttachmentMode: csi.AttachmentModeFileSystem}}
	return persistence.Claim{Alloc: alloc, Mode: "write", AccessMode: am.String(), AttachmentMode: "file-system"}, r
}

func admit(s *cluster.Session, vol string, am csi.AccessMode, alloc string) error {
	c, r := writer(alloc, am)
	return s.Admit(context.Background(), vol, c, func(held []persistence.Claim) error {
		return claim.AdmitHosts(s.NodeID(), r, held)
	})
}

// TestOpen_Unreachable: no etcd at the endpoint is a clear error, and
// nothing is left running.
func TestOpen_Unreachable(t *testing.T) {
	defer leakcheck.Check(t)()
	_, err := cluster.Open(context.Background(), cluster.Config{
		NodeID: "a", Endpoints: []string{"http://127.0.0.1:1"}, DialTimeout: 300 * time.Millisecond,
	})
	if !errors.Is(err, cluster.ErrUnavailable) {
		t.Fatalf("Open = %v, want ErrUnavailable", err)
	}
	t.Log(err)
}

// TestSession_AdmitFree: the table across hosts, an idempotent admit, a
// free that empties the key, a freed claim that lets the other host in,
// and Prune.
func TestSession_AdmitFree(t *testing.T) {
	t.Cleanup(leakcheck.Check(t)) // last: after the sessions and the server stopped
	srv := etcdtest.Start(t)
	a, b := open(t, "a", srv.Endpoint()), open(t, "b", srv.Endpoint())
	snw := csi.AccessModeSingleNodeWriter
	if err := admit(a, "v1", snw, "x"); err != nil {
		t.Fatal(err)
	}
	if err := admit(a, "v1", snw, "x"); err != nil {
		t.Fatalf("admit again: %v", err)
	}
	err := admit(b, "v1", snw, "y")
	if !errors.Is(err, claim.ErrClaimLimit) {
		t.Fatalf("admit on b = %v, want ErrClaimLimit", err)
	}
	t.Log(err)
	cs, err := b.Claims(context.Background(), "v1")
	if err != nil || len(cs) != 1 || cs[0].Host != "a" || cs[0].Alloc != "x" {
		t.Fatalf("Claims = %+v, %v", cs, err)
	}
	a.Free("v1", "x")
	eventually(t, "claim freed", func() (bool, error) {
		cs, err := b.Claims(context.Background(), "v1")
		return len(cs) == 0, err
	})
	cli := directClient(t, srv.Endpoint())
	if resp, err := cli.Get(context.Background(), cluster.DefaultPrefix+"/claims/v1"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("claims key left: %v %v", resp, err)
	}
	if err := admit(b, "v1", snw, "y"); err != nil {
		t.Fatalf("admit on b after the free: %v", err)
	}
	// Prune frees what this host no longer has, and keeps the rest.
	if err := admit(b, "v2", snw, "z"); err != nil {
		t.Fatal(err)
	}
	n, err := b.Prune(context.Background(), func(vol, alloc string) bool { return vol == "v1" })
	if err != nil || n != 1 {
		t.Fatalf("Prune = %d, %v; want 1", n, err)
	}
	if cs, _ := a.Claims(context.Background(), "v2"); len(cs) != 0 {
		t.Fatalf("v2 claims after prune: %+v", cs)
	}
	if cs, _ := a.Claims(context.Background(), "v1"); len(cs) != 1 || cs[0].Host != "b" {
		t.Fatalf("v1 claims after prune: %+v", cs)
	}
	hs, err := a.Hosts(context.Background())
	if err != nil || len(hs) != 2 || hs[0].Status != cluster.StatusUp || hs[1].Claims != 1 {
		t.Fatalf("Hosts = %+v, %v", hs, err)
	}
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	hs, _ = a.Hosts(context.Background())
	if hs[1].ID != "b" || hs[1].Status != cluster.StatusDown || hs[1].Claims != 1 {
		t.Fatalf("b after Close: %+v (want down, its claim kept)", hs[1])
	}
	if err := admit(b, "v3", snw, "q"); !errors.Is(err, cluster.ErrClosed) {
		t.Fatalf("admit after Close = %v", err)
	}
}

// TestSession_FreeThenAdmitAgain: a free still under way for an alloc's
// earlier claim never removes its next one.
func TestSession_FreeThenAdmitAgain(t *testing.T) {
	t.Cleanup(leakcheck.Check(t)) // last: after the sessions and the server stopped
	srv := etcdtest.Start(t)
	a := open(t, "a", srv.Endpoint())
	for i := range 50 {
		if err := admit(a, "v", csi.AccessModeSingleNodeWriter, "x"); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		a.Free("v", "x")
	}
	if err := admit(a, "v", csi.AccessModeSingleNodeWriter, "x"); err != nil {
		t.Fatal(err)
	}
	// Another alloc right after a free is admitted: the freed claim holds
	// no place even before the free reaches etcd.
	for i := range 50 {
		other := fmt.Sprintf("y-%d", i)
		a.Free("v", "x")
		if err := admit(a, "v", csi.AccessModeSingleNodeWriter, other); err != nil {
			t.Fatalf("round %d: admit %s right after the free of x: %v", i, other, err)
		}
		a.Free("v", other)
		if err := admit(a, "v", csi.AccessModeSingleNodeWriter, "x"); err != nil {
			t.Fatalf("round %d: admit x again: %v", i, err)
		}
	}
	// Give a stale free every chance to run, then check the claim.
	b := open(t, "b", srv.Endpoint())
	eventually(t, "stale frees done", func() (bool, error) {
		err := admit(b, "v", csi.AccessModeSingleNodeWriter, "y")
		if err == nil {
			t.Fatal("b admitted while a holds the claim")
		}
		cs, cerr := b.Claims(context.Background(), "v")
		return len(cs) == 1 && cs[0].Host == "a", cerr
	})
	cs, _ := b.Claims(context.Background(), "v")
	if len(cs) != 1 || cs[0].Host != "a" || cs[0].Alloc != "x" {
		t.Fatalf("claims = %+v", cs)
	}
}

// TestSession_Partition: an agent cut off from etcd stops admitting on its
// own timer before its lease expires on the server (measured against the
// deletion of its liveness key, seen by a client that is not cut off), and
// admits again once etcd is back.
func TestSession_Partition(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	p := startProxy(t, srv.Endpoint()[len("http://"):])
	s := openWith(t, cluster.Config{NodeID: "cut", Endpoints: []string{p.Endpoint()}, LeaseTTL: 2 * time.Second, DialTimeout: time.Second})
	cli := directClient(t, srv.Endpoint())
	if err := admit(s, "v", csi.AccessModeMultiNodeMultiWriter, "before"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	expired := make(chan time.Time, 1)
	wch := cli.Watch(wctx, cluster.DefaultPrefix+"/alive/cut")
	go func() {
		for wr := range wch {
			for _, e := range wr.Events {
				if e.Type == clientv3.EventTypeDelete {
					expired <- time.Now()
					return
				}
			}
		}
	}()
	blocked := time.Now()
	p.block()
	var expiry time.Time
	select {
	case expiry = <-expired:
	case <-time.After(waitLimit):
		t.Fatal("the lease never expired on the server")
	}
	deadline := s.AdmitDeadline()
	if !deadline.Before(expiry) {
		t.Fatalf("admission deadline %s is not before the server-side expiry %s", deadline, expiry)
	}
	t.Logf("partition at 0; agent stopped admitting at %s; server expired the lease at %s; margin %s (ttl %s)",
		deadline.Sub(blocked).Round(time.Millisecond), expiry.Sub(blocked).Round(time.Millisecond),
		expiry.Sub(deadline).Round(time.Millisecond), s.TTL())
	start := time.Now()
	err := admit(s, "v", csi.AccessModeMultiNodeMultiWriter, "during")
	if !errors.Is(err, cluster.ErrUnavailable) {
		t.Fatalf("admit during the partition = %v, want ErrUnavailable", err)
	}
	t.Logf("refused in %s without asking etcd: %v", time.Since(start).Round(time.Microsecond), err)
	p.unblock()
	eventually(t, "admitting again", func() (bool, error) {
		err := admit(s, "v", csi.AccessModeMultiNodeMultiWriter, "after")
		return err == nil, nil
	})
	cs, err := s.Claims(context.Background(), "v")
	if err != nil || len(cs) != 2 {
		t.Fatalf("claims after the partition = %+v, %v (want before and after)", cs, err)
	}
	cancel()
}

// TestSession_UpdateVolume: an update by compare-and-swap: a stale
// revision (another host updated the definition meanwhile, or removed it)
// is ErrConflict; a host admits no claim on the volume until it applied
// the update (a StaleError, until WaitApplied returns); with unclaimed, a
// claim on any host is ErrInUse naming it; watchers see each change with
// a higher revision.
func TestSession_UpdateVolume(t *testing.T) {
	t.Cleanup(leakcheck.Check(t)) // last: after the sessions and the server stopped
	srv := etcdtest.Start(t)
	a, b := open(t, "a", srv.Endpoint()), open(t, "b", srv.Endpoint())
	ctx := context.Background()
	if err := a.PutVolume(ctx, "v1", []byte("def1")); err != nil {
		t.Fatal(err)
	}
	def, rev, err := b.VolumeDefRev(ctx, "v1")
	if err != nil || string(def) != "def1" || rev == 0 {
		t.Fatalf("VolumeDefRev = %q, %d, %v", def, rev, err)
	}
	rev2, err := b.UpdateVolume(ctx, "v1", rev, []byte("def2"), true)
	if err != nil || rev2 <= rev {
		t.Fatalf("UpdateVolume = %d, %v; want a revision after %d", rev2, err, rev)
	}
	if _, err := a.UpdateVolume(ctx, "v1", rev, []byte("def3"), false); !errors.Is(err, cluster.ErrConflict) {
		t.Fatalf("UpdateVolume at a stale revision = %v, want ErrConflict", err)
	}
	// a admits no claim until it applied b's update (its watch would).
	var stale *cluster.StaleError
	if err := admit(a, "v1", csi.AccessModeSingleNodeWriter, "x"); !errors.As(err, &stale) || stale.Applied != rev || !errors.Is(err, cluster.ErrConflict) {
		t.Fatalf("claim on a before it applied b's update = %v, want a StaleError at revision %d", err, rev)
	}
	waited := make(chan error, 1)
	go func() { waited <- a.WaitApplied(ctx, "v1", rev) }()
	a.Applied("v1", rev2)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if err := admit(a, "v1", csi.AccessModeSingleNodeWriter, "x"); err != nil {
		t.Fatal(err)
	}
	_, err = b.UpdateVolume(ctx, "v1", rev2, []byte("def3"), true)
	if !errors.Is(err, cluster.ErrInUse) || !strings.Contains(err.Error(), `alloc "x" on host "a"`) {
		t.Fatalf("UpdateVolume unclaimed while a holds a claim = %v, want ErrInUse naming it", err)
	}
	rev3, err := b.UpdateVolume(ctx, "v1", rev2, []byte("def3"), false)
	if err != nil {
		t.Fatalf("UpdateVolume of what no claim depends on: %v", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan cluster.VolumeEvent, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.WatchVolumes(wctx, func() []string { return []string{"v1"} }, func(e cluster.VolumeEvent) {
			select {
			case got <- e:
			default:
			}
		}, nil)
	}()
	select {
	case e := <-got:
		if string(e.Def) != "def3" || e.Rev != rev3 {
			t.Errorf("watched %q at %d, want def3 at %d", e.Def, e.Rev, rev3)
		}
	case <-time.After(waitLimit):
		t.Fatal("the watch listed nothing")
	}
	cancel()
	<-done
}

// TestSession_DeleteVolumeAfterFree: this host's claim freed just before
// (its removal from etcd may still be under way) does not hold a
// deregistration back; another host's claim does, named.
// TestSession_WatchVolumesPages: reading more held definitions than one
// transaction reads every one once, and says it is complete only after
// the last; a definition written after it comes from the watch.
func TestSession_WatchVolumesPages(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	a := open(t, "a", srv.Endpoint())
	ctx := context.Background()
	const n = 1234 // many transactions and a part
	held := make([]string, 0, n)
	for i := range n {
		id := fmt.Sprintf("v%04d", i)
		if err := a.PutVolume(ctx, id, []byte("def")); err != nil {
			t.Fatal(err)
		}
		held = append(held, id)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	seen := map[string]int{}
	listedAt := -1 // definitions seen when listed was first called
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.WatchVolumes(wctx, func() []string { return held }, func(e cluster.VolumeEvent) {
			mu.Lock()
			defer mu.Unlock()
			seen[e.ID]++
		}, func() {
			mu.Lock()
			defer mu.Unlock()
			if listedAt < 0 {
				listedAt = len(seen)
			}
		})
	}()
	eventually(t, "the listing to complete", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return listedAt >= 0, nil
	})
	if err := a.PutVolume(ctx, "zz-after", []byte("def")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch to bring a definition written after the listing", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return seen["zz-after"] == 1, nil
	})
	cancel()
	<-done
	if listedAt != n {
		t.Errorf("listed called after %d definitions, want %d", listedAt, n)
	}
	for id, k := range seen {
		if k != 1 {
			t.Errorf("%s seen %d times, want once", id, k)
		}
	}
	if len(seen) != n+1 {
		t.Errorf("seen %d definitions, want %d", len(seen), n+1)
	}
}

func TestSession_DeleteVolumeAfterFree(t *testing.T) {
	t.Cleanup(leakcheck.Check(t)) // last: after the sessions and the server stopped
	srv := etcdtest.Start(t)
	a, b := open(t, "a", srv.Endpoint()), open(t, "b", srv.Endpoint())
	ctx := context.Background()
	for _, v := range []string{"v1", "v2"} {
		if err := a.PutVolume(ctx, v, []byte("def")); err != nil {
			t.Fatal(err)
		}
	}
	if err := admit(a, "v1", csi.AccessModeSingleNodeWriter, "x"); err != nil {
		t.Fatal(err)
	}
	a.Free("v1", "x")
	if err := a.DeleteVolume(ctx, "v1"); err != nil {
		t.Fatalf("DeleteVolume right after this host's free: %v", err)
	}
	if def, err := b.VolumeDef(ctx, "v1"); err != nil || def != nil {
		t.Fatalf("v1 after DeleteVolume = %q, %v", def, err)
	}
	if err := admit(b, "v2", csi.AccessModeSingleNodeWriter, "y"); err != nil {
		t.Fatal(err)
	}
	err := a.DeleteVolume(ctx, "v2")
	if !errors.Is(err, cluster.ErrInUse) || !strings.Contains(err.Error(), `alloc "y" on host "b"`) {
		t.Fatalf("DeleteVolume while b holds a claim = %v, want ErrInUse naming it", err)
	}
}
