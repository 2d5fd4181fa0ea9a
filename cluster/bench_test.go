package cluster_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/runtime"
)

// BenchmarkLifecycle is one claim → publish → release → freed through the
// runtime, in local mode and in cluster mode (the claim admitted through
// an embedded etcd on loopback) on the same fake plugin setup, in the same
// run: compare the two ns/op. In cluster mode the freed claim's removal
// from etcd runs after the freed event, in the background, and is not
// counted.
func BenchmarkLifecycle(b *testing.B) {
	srv := etcdtest.Start(b)
	for _, mode := range []string{"local", "cluster"} {
		b.Run(mode, func(b *testing.B) {
			cfg := clusterConfig(b, "bench-"+mode, srv.Endpoint())
			if mode == "local" {
				cfg.Cluster = nil
			}
			a := startAgentWith(b, "bench-"+mode, cfg)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			const vol, am = "bench", "single-node-writer"
			if _, err := a.rt.RegisterVolume(ctx, vol, volSpec(vol, am)); err != nil {
				b.Fatal(err)
			}
			events, err := a.rt.Subscribe(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				alloc := fmt.Sprintf("a-%d", i)
				if _, err := a.rt.Claim(ctx, vol, claimReq(alloc, "write", am)); err != nil {
					b.Fatal(err)
				}
				if _, err := a.rt.Release(ctx, vol, alloc); err != nil {
					b.Fatal(err)
				}
				for e := range events {
					if e.Type == runtime.EventClaimFreed && e.Alloc == alloc {
						break
					}
				}
			}
			b.StopTimer()
			cancel()
			a.stop()
		})
	}
}
