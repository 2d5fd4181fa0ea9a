package api_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/runtime"
)

// BenchmarkClient_Volume measures one GET /v1/volumes/{id} through the
// typed client over the unix socket; the Baseline sub-benchmark sends the
// same request with a bare http.Client on the same socket, so the
// difference is the client's own cost (decoding included).
func BenchmarkClient_Volume(b *testing.B) {
	ctx := context.Background()
	be := apitest.NewBackend()
	if _, err := be.RegisterAllocation(ctx, "hp1", runtime.AllocationSpec{Plugin: "hostpath", Type: runtime.TypeMonolith, Socket: "/s"}); err != nil {
		b.Fatal(err)
	}
	if _, err := be.RegisterVolume(ctx, "vol1", runtime.VolumeSpec{Plugin: "hostpath", ExternalID: "e",
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}); err != nil {
		b.Fatal(err)
	}
	addr := apitest.Serve(b, be, api.Options{})

	b.Run("Baseline", func(b *testing.B) {
		raw := newRawClient(b, addr)
		b.ReportAllocs()
		for b.Loop() {
			resp, err := raw.hc.Get(raw.base + "/v1/volumes/vol1")
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatal(resp.Status)
			}
		}
	})
	b.Run("Client", func(b *testing.B) {
		c, err := api.NewClient(addr)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Volume(ctx, "vol1"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
