package api_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/runtime"
)

// A program drives an agent through its unix socket: register a plugin
// allocation and a volume, claim the volume, release it. Here the agent is
// the API handler over the apitest fake (exampleAgent); against a real
// agent, only the address changes.
func ExampleClient() {
	c, stop := exampleAgent()
	defer stop()
	ctx := context.Background()

	if _, err := c.RegisterAllocation(ctx, "hp1", runtime.AllocationSpec{
		Plugin: "hostpath", Type: runtime.TypeMonolith, Socket: "/run/hostpath/csi.sock",
	}); err != nil {
		panic(err)
	}
	if _, err := c.RegisterVolume(ctx, "data1", runtime.VolumeSpec{
		Plugin:       "hostpath",
		ExternalID:   "vol-7f3a",
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
		Secrets:      map[string]string{"token": "s3cret"}, // sent once, never shown again
	}); err != nil {
		panic(err)
	}
	claim, err := c.Claim(ctx, "data1", runtime.ClaimRequest{
		Alloc: "web-1", Mode: runtime.ModeWrite, AccessMode: "single-node-writer", AttachmentMode: "file-system",
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("published at", claim.TargetPath)

	_, err = c.Claim(ctx, "data1", runtime.ClaimRequest{
		Alloc: "web-2", Mode: runtime.ModeWrite, AccessMode: "single-node-writer", AttachmentMode: "file-system",
	})
	fmt.Println("second writer:", err)

	past, err := c.Release(ctx, "data1", "web-1")
	if err != nil {
		panic(err)
	}
	fmt.Println("released:", past.State)
	// Output:
	// published at /var/lib/csiactor/volumes/hostpath/per-alloc/web-1/data1/rw-file-system-single-node-writer
	// second writer: volume "data1": single-node-writer allows one claim in all
	// released: taken
}

// A program registers many volumes in one request: one result per entry,
// in order; a refused entry names its cause and stops nothing.
func ExampleClient_RegisterVolumes() {
	c, stop := exampleAgent()
	defer stop()
	ctx := context.Background()
	spec := runtime.AllocationSpec{Plugin: "hostpath", Type: runtime.TypeMonolith, Socket: "/run/hostpath/csi.sock"}
	if _, err := c.RegisterAllocation(ctx, "hp1", spec); err != nil {
		panic(err)
	}
	caps := []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}
	results, err := c.RegisterVolumes(ctx, []runtime.CreateVolumeSpec{
		{ID: "data1", VolumeSpec: runtime.VolumeSpec{Plugin: "hostpath", ExternalID: "vol-1", Capabilities: caps}},
		{ID: "data2", VolumeSpec: runtime.VolumeSpec{Plugin: "hostpath", ExternalID: "vol-2"}},
		{ID: "scratch", CapacityBytes: 1 << 30, VolumeSpec: runtime.VolumeSpec{Plugin: "hostpath", Capabilities: caps}},
	})
	if err != nil {
		panic(err) // the batch refused whole: empty, too long, an ID twice
	}
	for _, r := range results {
		if r.Status == runtime.BatchRefused {
			fmt.Println(r.ID, r.Status+":", r.Error)
			continue
		}
		fmt.Println(r.ID, r.Status)
	}
	// Output:
	// data1 registered
	// data2 refused: capabilities: give at least one {access_mode, attachment_mode}
	// scratch created
}

// exampleAgent serves the API over the apitest fake on a unix socket, as
// an agent would; it returns a client of it and a function that stops
// both.
func exampleAgent() (c *api.Client, stop func()) {
	dir, err := os.MkdirTemp("", "csiactor-example-")
	if err != nil {
		panic(err)
	}
	socket := filepath.Join(dir, "api.sock")
	l, err := api.ListenUnix(socket)
	if err != nil {
		panic(err)
	}
	srv := &http.Server{Handler: api.NewHandler(apitest.NewBackend(), api.Options{})}
	go srv.Serve(l)
	c, err = api.NewClient("unix://" + socket)
	if err != nil {
		panic(err)
	}
	return c, func() {
		c.Close()
		srv.Close()
		os.RemoveAll(dir)
	}
}
