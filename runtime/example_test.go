package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/runtime"
)

// servePlugin serves the example CSI plugin in this process on a socket in
// dir (symlinks instead of mounts, so no privilege is needed) and returns
// the socket path and a function that stops it.
func servePlugin(dir string) (string, func()) {
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	p, err := csiplugin.New(csiplugin.Config{
		StateDir:  filepath.Join(dir, "plugin-state"),
		NodeID:    "node-1",
		MountMode: csiplugin.MountModeSymlink,
		Logger:    logrus.NewEntry(quiet),
	})
	if err != nil {
		panic(err)
	}
	sock := filepath.Join(dir, "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Serve(l)
	}()
	return sock, func() { p.Stop(); <-done }
}

// ExampleNew starts a runtime on a data directory, attaches a CSI plugin
// that runs beside it, waits for the plugin to be healthy and shuts down.
func ExampleNew() {
	dir, err := os.MkdirTemp("", "csiactor-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	sock, stopPlugin := servePlugin(dir)
	defer stopPlugin()

	ctx := context.Background()
	rt, err := runtime.New(runtime.Config{DataDir: filepath.Join(dir, "data")}, runtime.Options{})
	if err != nil {
		panic(err)
	}
	if err := rt.Start(ctx); err != nil {
		panic(err)
	}
	defer rt.Shutdown(ctx)

	// An attached allocation: something else runs the plugin; the runtime
	// dials its socket, fingerprints it and watches its health.
	if _, err := rt.RegisterAllocation(ctx, "example-1", runtime.AllocationSpec{
		Plugin: "example", Type: runtime.TypeMonolith, Socket: sock,
	}); err != nil {
		panic(err)
	}
	if err := rt.WaitHealthy(ctx, "example", runtime.TypeMonolith); err != nil {
		panic(err)
	}
	p, err := rt.Plugin(ctx, "example")
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s: provider %s, controllers %d/%d, nodes %d/%d\n",
		p.Name, p.Provider, p.ControllersHealthy, p.ControllersExpected, p.NodesHealthy, p.NodesExpected)
	a := p.Allocations[0]
	fmt.Printf("allocation %s: %s, healthy %t, singleton %t, node %s\n", a.ID, a.Type, a.Healthy, a.Singleton, a.NodeID)

	if err := rt.Shutdown(ctx); err != nil {
		panic(err)
	}
	_, err = rt.Plugins(ctx)
	fmt.Println("after shutdown:", err)
	// Output:
	// example: provider example.csi.csiactor.dev, controllers 1/1, nodes 1/1
	// allocation example-1: monolith, healthy true, singleton true, node node-1
	// after shutdown: runtime shutting down
}

// Example_claim creates a volume through the plugin's controller, claims it
// for an allocation (the runtime publishes it to the allocation's target
// path), releases it and waits for the teardown to finish.
func Example_claim() {
	dir, err := os.MkdirTemp("", "csiactor-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	sock, stopPlugin := servePlugin(dir)
	defer stopPlugin()

	ctx := context.Background()
	dataDir := filepath.Join(dir, "data")
	rt, err := runtime.New(runtime.Config{DataDir: dataDir}, runtime.Options{})
	if err != nil {
		panic(err)
	}
	if err := rt.Start(ctx); err != nil {
		panic(err)
	}
	defer rt.Shutdown(ctx)
	if _, err := rt.RegisterAllocation(ctx, "example-1", runtime.AllocationSpec{
		Plugin: "example", Type: runtime.TypeMonolith, Socket: sock,
	}); err != nil {
		panic(err)
	}
	if err := rt.WaitHealthy(ctx, "example", runtime.TypeMonolith); err != nil {
		panic(err)
	}

	v, err := rt.CreateVolume(ctx, runtime.CreateVolumeSpec{
		ID:            "data-1",
		CapacityBytes: 1 << 20,
		VolumeSpec: runtime.VolumeSpec{
			Plugin:       "example",
			Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}},
		},
	})
	if err != nil {
		panic(err)
	}
	fmt.Printf("volume %s: %d bytes\n", v.ID, v.CapacityBytes)

	events, err := rt.Subscribe(ctx)
	if err != nil {
		panic(err)
	}
	c, err := rt.Claim(ctx, "data-1", runtime.ClaimRequest{
		Alloc: "web-1", Mode: runtime.ModeWrite, AccessMode: "single-node-writer", AttachmentMode: "file-system",
	})
	if err != nil {
		panic(err)
	}
	rel, _ := filepath.Rel(dataDir, c.TargetPath)
	fmt.Printf("claim by %s: %s at <data_dir>/%s\n", c.Alloc, c.State, rel)

	// A second writer is over single-node-writer's limit.
	_, err = rt.Claim(ctx, "data-1", runtime.ClaimRequest{
		Alloc: "web-2", Mode: runtime.ModeWrite, AccessMode: "single-node-writer", AttachmentMode: "file-system",
	})
	fmt.Println("second writer refused:", errors.Is(err, runtime.ErrConflict))

	// Release returns at once; the teardown runs in the background and
	// shows up on the event stream.
	c, err = rt.Release(ctx, "data-1", "web-1")
	if err != nil {
		panic(err)
	}
	fmt.Println("released:", c.State)
	for e := range events {
		if e.Volume == "data-1" && e.Type != runtime.EventVolumeCreated {
			fmt.Println("event:", e.Type, e.Alloc)
		}
		if e.Type == runtime.EventClaimFreed {
			break
		}
	}
	if err := rt.DeleteVolume(ctx, "data-1", true); err != nil {
		panic(err)
	}
	vs, _ := rt.Volumes(ctx, runtime.VolumeFilter{})
	fmt.Println("volumes left:", len(vs))
	// Output:
	// volume data-1: 1048576 bytes
	// claim by web-1: published at <data_dir>/volumes/example/per-alloc/web-1/data-1/rw-file-system-single-node-writer
	// second writer refused: true
	// released: taken
	// event: claim-step web-1
	// event: claim-step web-1
	// event: claim-step web-1
	// event: claim-published web-1
	// event: claim-released web-1
	// event: claim-freed web-1
	// volumes left: 0
}
