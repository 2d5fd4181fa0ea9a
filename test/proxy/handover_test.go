package proxy_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
)

// During a stream of calls through the proxy, a newer allocation of the
// plugin is registered and the old one deregistered (its process stopped),
// once after the newer one is healthy and once at once (the calls then
// wait for it): no call fails. The two example plugin instances share their storage, as
// two allocations of one plugin do.
func TestProxy_HandoverLosesNoCall(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	shared := filepath.Join(e.dir, "shared")
	e.register("old", e.exampleSpec(filepath.Join(e.dir, "s-old"), shared))
	cc := dial(t, e.proxySocket("example"))
	id, ctrl, node := csipb.NewIdentityClient(cc), csipb.NewControllerClient(cc), csipb.NewNodeClient(cc)
	calls := []func(context.Context) error{
		func(ctx context.Context) error { _, err := id.Probe(ctx, &csipb.ProbeRequest{}); return err },
		func(ctx context.Context) error {
			_, err := id.GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
			return err
		},
		func(ctx context.Context) error {
			_, err := ctrl.ControllerGetCapabilities(ctx, &csipb.ControllerGetCapabilitiesRequest{})
			return err
		},
		func(ctx context.Context) error {
			_, err := ctrl.ListVolumes(ctx, &csipb.ListVolumesRequest{})
			return err
		},
		func(ctx context.Context) error {
			_, err := node.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
			return err
		},
	}

	var (
		done     = make(chan struct{})
		wg       sync.WaitGroup
		total    atomic.Int64
		mu       sync.Mutex
		failures []string
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				// Each call may wait through the handover: a generous
				// deadline, never reached on a working proxy.
				cctx, cancel := context.WithTimeout(ctx, waitLimit)
				err := calls[(w+i)%len(calls)](cctx)
				cancel()
				total.Add(1)
				if err != nil {
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
				}
			}
		}()
	}
	// At least n more calls complete.
	callsGoOn := func(what string, n int64) {
		from := total.Load()
		e.waitFor(what, func() bool { return total.Load() >= from+n })
	}
	callsGoOn("calls before the handover", 50)
	e.register("new", e.exampleSpec(filepath.Join(e.dir, "s-new"), shared))
	callsGoOn("calls with both allocations", 50)
	if err := e.rt.DeregisterAllocation(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	callsGoOn("calls after the handover", 50)
	// Again, without waiting for the newest to be healthy: the calls
	// made before it is wait for it.
	if _, err := e.rt.RegisterAllocation(ctx, "newest", e.exampleSpec(filepath.Join(e.dir, "s-newest"), shared)); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.DeregisterAllocation(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	callsGoOn("calls after the second handover", 50)
	close(done)
	wg.Wait()

	p, err := e.rt.Plugin(ctx, "example")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Allocations) != 1 || p.Allocations[0].ID != "newest" || !p.Allocations[0].Singleton {
		t.Fatalf("allocations after the handover: %s", fmt.Sprint(p.Allocations))
	}
	res, err := e.rt.CallPlugin(ctx, "example", runtimeCall("NodeGetInfo", ""))
	if err != nil || res.Alloc != "newest" {
		t.Fatalf("a call after the handover went to %q (%v), want newest", res.Alloc, err)
	}
	t.Logf("%d calls through the proxy", total.Load())
	if len(failures) > 0 {
		t.Fatalf("%d of %d calls failed; first: %s", len(failures), total.Load(), failures[0])
	}
}
