package dockerplugin_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/csiactor/csiactor/runtime"
)

// BenchmarkMountUnmount measures a container's volume lifecycle through
// the protocol (Mount until published, Unmount, and the release until
// freed; no grace period) against the same claim and release sent to the
// runtime directly, in the same run: the difference is the protocol's
// HTTP round trips and mounts.json, written and synced three times.
func BenchmarkMountUnmount(b *testing.B) {
	// The store syncs, as in production, like mounts.json.
	r := newRigWith(b, func(c *runtime.Config) {
		c.Store.NoSync = false
		c.Docker.UnmountGrace = time.Nanosecond
	})
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v1"})
	v := r.volume("v1")
	ctx := context.Background()
	b.Run("runtime", func(b *testing.B) {
		for i := range b.N {
			alloc := fmt.Sprintf("direct-%d", i)
			if _, err := r.rt.Claim(ctx, "v1", runtime.ClaimRequest{Alloc: alloc, Mode: runtime.ModeWrite,
				AccessMode: v.Capabilities[0].AccessMode, AttachmentMode: v.Capabilities[0].AttachmentMode}); err != nil {
				b.Fatal(err)
			}
			if _, err := r.rt.Release(ctx, "v1", alloc); err != nil {
				b.Fatal(err)
			}
			r.waitGone("v1", alloc)
		}
	})
	b.Run("protocol", func(b *testing.B) {
		for i := range b.N {
			id := fmt.Sprintf("m%d", i)
			r.mount("v1", id)
			r.unmount("v1", id)
			r.waitGone("v1", "docker-"+id)
		}
	})
}
