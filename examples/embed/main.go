// Command embed shows how a Go program embeds csiactor through package
// runtime, with no agent process and no HTTP: it is what an orchestrator's
// node agent or a VM manager does to get supervised CSI plugins and a
// crash-safe volume lifecycle in its own process.
//
// It runs the example CSI plugin in-process on a unix socket (a real gRPC
// server; any CSI plugin started by something else works the same way),
// starts a runtime with a temporary data dir, registers the plugin as an
// attached monolith allocation, creates a volume through the plugin's
// controller, claims it for an alloc, writes a file through the target path,
// releases the claim, waits for the teardown to finish, prints the events,
// and shuts everything down.
//
//	go run ./examples/embed
//
// As root the plugin bind-mounts the volume onto the target path; otherwise
// the target path is a symlink to the volume's directory. Either way the
// file lands in the volume.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/runtime"
)

// Names used by the example.
const (
	pluginName = "example"
	allocID    = "example-1" // the plugin allocation
	volumeID   = "data1"
	claimer    = "web-1" // the alloc (workload) that claims the volume
	accessMode = "single-node-writer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "embed: %s\n", err.Error())
		os.Exit(1)
	}
}

// run does the whole walk-through, printing what happens to out. Everything
// it starts is stopped and everything it creates is removed before it
// returns, also on error.
func run(ctx context.Context, out io.Writer) (err error) {
	dir, err := os.MkdirTemp("", "csiactor-embed-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(out, "data dir %s\n", dir)

	// Only errors reach stderr; the example prints its own story to out.
	logger := logrus.New()
	logger.SetLevel(logrus.ErrorLevel)
	log := logrus.NewEntry(logger)

	// 1. A CSI plugin on a unix socket. Socket paths are limited to 107
	// bytes, so keep the directory short.
	socket := filepath.Join(dir, "plugin.sock")
	pluginCtx, stopPlugin := context.WithCancel(context.Background())
	pluginDone := make(chan error, 1)
	go func() {
		pluginDone <- csiplugin.Run(pluginCtx, csiplugin.Config{
			Endpoint: "unix://" + socket,
			StateDir: filepath.Join(dir, "plugin"),
			Logger:   log.WithField("plugin", pluginName),
		})
	}()
	defer func() {
		stopPlugin()
		if perr := <-pluginDone; perr != nil {
			err = errors.Join(err, fmt.Errorf("plugin: %w", perr))
		}
	}()

	// 2. The runtime: a data dir for its store and the volumes' staging and
	// target paths, and a Prometheus registry of our own (never the global
	// one) to serve however the program likes.
	reg := prometheus.NewRegistry()
	rt, err := runtime.New(runtime.Config{
		DataDir: filepath.Join(dir, "data"),
		Plugins: runtime.PluginsConfig{HeartbeatInterval: 5 * time.Second, ProbeTimeout: time.Second},
	}, runtime.Options{Log: log, Registerer: reg})
	if err != nil {
		return fmt.Errorf("new runtime: %w", err)
	}
	if err := rt.Start(ctx); err != nil {
		return fmt.Errorf("start runtime: %w", err)
	}
	// Deferred after the plugin's stop, so it runs first: the runtime lets
	// go of the plugin before the plugin goes away.
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if serr := rt.Shutdown(sctx); serr != nil {
			err = errors.Join(err, fmt.Errorf("shutdown: %w", serr))
		}
	}()

	// 3. Register the plugin: "attached" because we run it, not the
	// runtime (give Command instead of Socket to have the runtime start,
	// watch and restart the process). A monolith serves both the
	// controller and the node services.
	if _, err := rt.RegisterAllocation(ctx, allocID, runtime.AllocationSpec{
		Plugin: pluginName, Type: runtime.TypeMonolith, Socket: socket,
	}); err != nil {
		return fmt.Errorf("register plugin: %w", err)
	}
	p, err := waitHealthy(ctx, rt, pluginName)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "plugin %s healthy: provider %s, controller required %t\n", p.Name, p.Provider, p.ControllerRequired)

	// 4. Create a volume through the plugin's controller.
	v, err := rt.CreateVolume(ctx, runtime.CreateVolumeSpec{
		ID: volumeID,
		VolumeSpec: runtime.VolumeSpec{
			Plugin:       pluginName,
			Capabilities: []runtime.Capability{{AccessMode: accessMode, AttachmentMode: "file-system"}},
		},
		CapacityBytes: 1 << 30,
	})
	if err != nil {
		return fmt.Errorf("create volume: %w", err)
	}
	fmt.Fprintf(out, "volume %s created: %d bytes\n", v.ID, v.CapacityBytes)

	// 5. Claim it. Claim returns when the volume is published at the
	// claim's target path; the same request again returns the same claim,
	// also after a crash and restart of the runtime.
	req := runtime.ClaimRequest{Alloc: claimer, Mode: runtime.ModeWrite, AccessMode: accessMode, AttachmentMode: "file-system"}
	c, err := rt.Claim(ctx, volumeID, req)
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	fmt.Fprintf(out, "claim %s: %s at %s\n", c.Alloc, c.State, c.TargetPath)

	// A second writer is over the limit of single-node-writer.
	second := req
	second.Alloc = "web-2"
	if _, err := rt.Claim(ctx, volumeID, second); errors.Is(err, runtime.ErrConflict) {
		fmt.Fprintf(out, "claim web-2: refused, %s allows one claim (conflict)\n", accessMode)
	} else {
		return fmt.Errorf("second writer: want a conflict, got %w", err)
	}

	// 6. Use the volume the way the workload would: through the target path.
	file := filepath.Join(c.TargetPath, "hello.txt")
	if err := os.WriteFile(file, []byte("hello from "+claimer+"\n"), 0o644); err != nil {
		return fmt.Errorf("write through the target path: %w", err)
	}
	fmt.Fprintf(out, "wrote %s\n", filepath.Base(file))

	// 7. Release. Release returns once the claim is recorded as a past
	// claim; the runtime unpublishes, unstages and detaches it in the
	// background (resuming after a restart if need be). Subscribe first,
	// then wait for the claim-freed event.
	events, cancelEvents, err := subscribe(ctx, rt)
	if err != nil {
		return err
	}
	defer cancelEvents()
	past, err := rt.Release(ctx, volumeID, claimer)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	fmt.Fprintf(out, "claim %s: released (%s)\n", past.Alloc, past.State)
	if err := waitEvent(ctx, events, runtime.EventClaimFreed, claimer); err != nil {
		return err
	}
	fmt.Fprintf(out, "claim %s: freed\n", claimer)

	// 8. What happened, as the event stream tells it.
	evs, err := rt.Events(ctx)
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	fmt.Fprintln(out, "events:")
	for _, e := range evs {
		fmt.Fprintf(out, "  %-22s %-10s %-6s %s\n", e.Type, orDash(e.Alloc), orDash(e.Volume), e.Message)
	}
	return nil
}

// waitHealthy polls until the plugin has a healthy controller and node.
// The registry dials and fingerprints a new allocation in the background.
func waitHealthy(ctx context.Context, rt *runtime.Runtime, name string) (runtime.Plugin, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		p, err := rt.Plugin(ctx, name)
		if err == nil && p.ControllersHealthy > 0 && p.NodesHealthy > 0 {
			return p, nil
		}
		select {
		case <-ctx.Done():
			return runtime.Plugin{}, fmt.Errorf("plugin %s never became healthy: %w", name, ctx.Err())
		case <-tick.C:
		}
	}
}

// subscribe returns the runtime's event stream (recent events first, then
// live ones) and a function that ends it.
func subscribe(ctx context.Context, rt *runtime.Runtime) (<-chan runtime.Event, func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	ch, err := rt.Subscribe(ctx)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("subscribe: %w", err)
	}
	return ch, func() {
		cancel()
		for range ch { // drain until the runtime closes it
		}
	}, nil
}

// waitEvent reads events until one of type typ for alloc arrives.
func waitEvent(ctx context.Context, events <-chan runtime.Event, typ, alloc string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		select {
		case e, ok := <-events:
			if !ok {
				return fmt.Errorf("event stream ended before %s of %s", typ, alloc)
			}
			if e.Type == typ && e.Alloc == alloc {
				return nil
			}
			if e.Type == runtime.EventClaimFailed && e.Alloc == alloc {
				return fmt.Errorf("claim of %s failed: %s", alloc, e.Message)
			}
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s of %s: %w", typ, alloc, ctx.Err())
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
