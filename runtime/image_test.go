package runtime_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/csiactor/csiactor/actors/plugin/container"
	"github.com/csiactor/csiactor/internal/engines"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/runtime"
)

// TestRuntime_ImagePlugin runs the hostpath driver from an image under
// each engine: registered (a missing image with pull never refused
// first), healthy with its container shown, a kill of the container
// restarts it, an agent restart adopts the same container, and
// deregistration removes it.
func TestRuntime_ImagePlugin(t *testing.T) {
	const ref = "csiactor-test/hostpath:1"
	bin := hostpath.Binary(t)
	d := engines.StartDocker(t, engines.DockerOptions{})
	d.ImportPlugin(t, ref, bin)
	p := engines.StartPodman(t, engines.PodmanOptions{})
	p.ImportPlugin(t, ref, bin)
	for _, eng := range []struct {
		name, socket string
		kill         func(id string) error
	}{
		{container.Docker, d.Socket(), func(id string) error { _, err := d.Run("kill", id); return err }},
		{container.Podman, p.Socket(), func(id string) error { _, err := p.Run("kill", id); return err }},
	} {
		t.Run(eng.name, func(t *testing.T) {
			e := &testEnv{t: t, dataDir: shortDir(t, "csiactor-rt-")}
			e.cfg = testConfig(e.dataDir)
			e.cfg.Plugins.Engines = runtime.EnginesConfig{Docker: eng.socket, Podman: eng.socket}
			e.start()
			t.Cleanup(func() { _ = unix.Unmount(filepath.Join(e.dataDir, "volumes"), unix.MNT_DETACH) })
			ctx := context.Background()
			state := filepath.Join(e.dataDir, "hostpath")
			if err := os.MkdirAll(state, 0o700); err != nil {
				t.Fatal(err)
			}
			args := hostpath.Command("", "n1", state)[1:]
			missing := runtime.AllocationSpec{Plugin: hostpath.PluginName, Type: runtime.TypeMonolith,
				Image: &container.Image{Image: "csiactor-test/missing:1", Engine: eng.name, Pull: container.PullNever, Args: args}}
			_, err := e.rt.RegisterAllocation(ctx, "missing", missing)
			var fe *runtime.FieldError
			if !errors.As(err, &fe) || fe.Field != "image.image" || !strings.Contains(err.Error(), "pull is never") {
				t.Fatalf("register a missing image = %v, want a FieldError on image.image", err)
			}
			if _, ok := e.allocation("missing"); ok {
				t.Fatal("the refused allocation is registered")
			}

			spec := runtime.AllocationSpec{Plugin: hostpath.PluginName, Type: runtime.TypeMonolith,
				Image: &container.Image{Image: ref, Engine: eng.name, Pull: container.PullNever, Args: args,
					Mounts: []container.Mount{{Source: state, Target: state}}}}
			start := time.Now()
			if _, err := e.rt.RegisterAllocation(ctx, "img", spec); err != nil {
				t.Fatal(err)
			}
			e.waitAllocHealthy("img")
			t.Logf("%s: register to healthy %s", eng.name, time.Since(start).Round(time.Millisecond))
			a := e.alloc("img")
			if a.ContainerID == "" || a.Engine != eng.name || a.Image != ref || a.ImageDigest == "" {
				t.Fatalf("allocation %+v: want container ID, engine, image and digest", a)
			}
			first := a.ContainerID

			if err := eng.kill(first); err != nil {
				t.Fatal(err)
			}
			eventually(t, "a new container after the kill", func() (bool, error) {
				a := e.alloc("img")
				return a.Healthy && a.ContainerID != "" && a.ContainerID != first, nil
			})
			second := e.alloc("img").ContainerID

			e.stop()
			e.start()
			e.waitAllocHealthy("img")
			if got := e.alloc("img").ContainerID; got != second {
				t.Fatalf("after an agent restart container %s, want %s adopted", got, second)
			}

			if err := e.rt.DeregisterAllocation(ctx, "img"); err != nil {
				t.Fatal(err)
			}
			cs, err := engines.Containers(eng.socket)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				if c.ID == second || c.ID == first {
					t.Errorf("container %s (%s) left after deregistration", c.ID, c.State)
				}
			}
		})
	}
}
