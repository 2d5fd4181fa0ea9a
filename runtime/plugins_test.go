package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// startForAdapter starts a runtime on a short temporary data dir with
// two node allocations of plugin "fake", "old" registered before "new",
// and returns it with both fake plugins.
func startForAdapter(t *testing.T) (*Runtime, *fakeplugin.Plugin, *fakeplugin.Plugin) {
	t.Helper()
	dir, err := os.MkdirTemp("", "csiactor-ad-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	r, err := New(Config{DataDir: dir, Store: StoreConfig{NoSync: true},
		Plugins: PluginsConfig{HeartbeatInterval: time.Hour, ProbeTimeout: time.Second}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	var plugins []*fakeplugin.Plugin
	for _, id := range []string{"old", "new"} {
		p, endpoint := fakeplugin.Start(t, fakeplugin.Config{})
		if _, err := r.RegisterAllocation(ctx, id, AllocationSpec{Plugin: "fake", Type: TypeNode, Socket: endpoint[len("unix://"):]}); err != nil {
			t.Fatal(err)
		}
		plugins = append(plugins, p)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := r.Plugin(ctx, "fake")
		if err == nil && p.NodesHealthy == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("allocations not healthy: %+v, %v", p, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return r, plugins[0], plugins[1]
}

func unpublish(ctx context.Context, c csi.Client, target string) error {
	return c.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target})
}

// TestPluginsAdapter_Client_CachedUntilChange checks that the adapter
// answers from its cache while nothing changes, asks the registry again
// after a deregistration, and that a client taken before the change still
// works: its call fails with ErrClosed on the old allocation and is sent
// again to the allocation that serves now. With none left, the call fails
// as Unavailable (retried by the steps), not as final.
func TestPluginsAdapter_Client_CachedUntilChange(t *testing.T) {
	ctx := context.Background()
	r, older, newer := startForAdapter(t)
	target := filepath.Join(t.TempDir(), "target")

	// The registry's events of the start-up may still be on their way
	// when the allocations show healthy, and each one drops the cache: the
	// second Client must come from the cache when no event came between
	// the two (the adapter's generation did not move).
	var c csi.Client
	for deadline := time.Now().Add(10 * time.Second); ; {
		gen := r.plugins.generation()
		first, facts, err := r.plugins.Client(ctx, "fake", claim.NodePlugin)
		if err != nil {
			t.Fatal(err)
		}
		if facts.NodeID != fakeplugin.DefaultNodeID {
			t.Errorf("facts = %+v", facts)
		}
		again, _, err := r.plugins.Client(ctx, "fake", claim.NodePlugin)
		if err != nil {
			t.Fatal(err)
		}
		if r.plugins.generation() == gen {
			if again != first {
				t.Fatalf("second Client did not come from the cache")
			}
			c = first
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("registry events kept dropping the cache for 10s after start-up")
		}
	}
	if err := unpublish(ctx, c, target); err != nil {
		t.Fatal(err)
	}
	if newer.Calls("NodeUnpublishVolume") != 1 || older.Calls("NodeUnpublishVolume") != 0 {
		t.Fatalf("calls went to the older allocation")
	}

	if err := r.DeregisterAllocation(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	now, _, err := r.plugins.Client(ctx, "fake", claim.NodePlugin)
	if err != nil {
		t.Fatal(err)
	}
	if now == c {
		t.Fatalf("Client after deregistering the singleton answered from the cache")
	}
	// The stale client, taken before the deregistration.
	if err := unpublish(ctx, c, target); err != nil {
		t.Fatalf("call on a client of a deregistered allocation: %v, want it sent to the other one", err)
	}
	if older.Calls("NodeUnpublishVolume") != 1 {
		t.Errorf("older allocation got %d calls, want 1", older.Calls("NodeUnpublishVolume"))
	}

	if err := r.DeregisterAllocation(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	err = unpublish(ctx, c, target)
	if err == nil || csi.Classify(csi.UnpublishKind, err) != csi.Retry || csi.Classify(csi.PublishKind, err) == csi.Final {
		t.Errorf("call with no allocation left = %v (%s), want a retryable Unavailable", err, csi.Classify(csi.UnpublishKind, err))
	}
	if _, _, err := r.plugins.Client(ctx, "fake", claim.NodePlugin); err == nil {
		t.Errorf("Client with no allocation left succeeded")
	}
}

// TestPluginsAdapter_Client_FailoverOnHealth checks that the cache follows
// a failover the registry makes by itself: when the singleton dies, the
// health event drops the cache and calls go to the older healthy
// allocation.
func TestPluginsAdapter_Client_FailoverOnHealth(t *testing.T) {
	ctx := context.Background()
	r, older, newer := startForAdapter(t)
	target := filepath.Join(t.TempDir(), "target")
	c, _, err := r.plugins.Client(ctx, "fake", claim.NodePlugin)
	if err != nil {
		t.Fatal(err)
	}
	if err := unpublish(ctx, c, target); err != nil {
		t.Fatal(err)
	}
	newer.Kill()
	deadline := time.Now().Add(30 * time.Second)
	for older.Calls("NodeUnpublishVolume") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("calls never went to the older allocation after the singleton died")
		}
		c, _, err := r.plugins.Client(ctx, "fake", claim.NodePlugin)
		if err == nil {
			err = unpublish(ctx, c, target)
		}
		if err != nil && !errors.Is(err, csi.ErrClosed) && csi.Classify(csi.UnpublishKind, err) != csi.Retry {
			t.Fatalf("call during failover: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// generation is how many times the adapter's cache was dropped.
func (p *pluginsAdapter) generation() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gen
}
