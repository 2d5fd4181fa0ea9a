package container_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/csiactor/csiactor/actors/plugin/container"
	"github.com/csiactor/csiactor/actors/plugin/proc"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/engines"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/leakcheck"
)

const ref = "csiactor-test/hostpath:1"

// engine is one real engine with the hostpath driver's image imported.
type engine struct {
	name, socket string
}

func startEngines(t *testing.T) []engine {
	bin := hostpath.Binary(t)
	d := engines.StartDocker(t, engines.DockerOptions{})
	d.ImportPlugin(t, ref, bin)
	p := engines.StartPodman(t, engines.PodmanOptions{})
	p.ImportPlugin(t, ref, bin)
	return []engine{{container.Docker, d.Socket()}, {container.Podman, p.Socket()}}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func probe(t *testing.T, socket string) {
	t.Helper()
	waitFor(t, "the plugin to answer Probe on "+socket, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := csi.Dial(ctx, "unix://"+socket)
		if err != nil {
			return false
		}
		defer func() { _ = c.Close() }()
		_, err = c.Probe(ctx)
		return err == nil
	})
}

// eachLauncher runs test in a subtest per engine (startEngines), with a
// launcher of it whose data dir is a temporary directory, and the socket
// directory of allocation a1 in it; with volumes, a volumes directory too
// (unmounted at the end: the launcher binds it on itself). The launcher
// is closed, and goroutines checked for leaks, after test.
func eachLauncher(t *testing.T, volumes bool, test func(t *testing.T, l *container.Launcher, engine string, cfg container.Config, dir string)) {
	for _, e := range startEngines(t) {
		t.Run(e.name, func(t *testing.T) {
			defer leakcheck.Check(t)()
			base := t.TempDir()
			dir := filepath.Join(base, "plugins", "a1")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			cfg := container.Config{DataDir: base, DockerSocket: e.socket, PodmanSocket: e.socket}
			if volumes {
				cfg.VolumesDir = filepath.Join(base, "volumes")
				if err := os.MkdirAll(cfg.VolumesDir, 0o700); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = unix.Unmount(cfg.VolumesDir, unix.MNT_DETACH) })
			}
			l, err := container.NewLauncher(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			test(t, l, e.name, cfg, dir)
		})
	}
}

// TestLauncher_Lifecycle runs the hostpath driver's image under each
// engine: started with its socket in the agent's directory, its output
// kept, killed (the exit seen), started again (the dead one removed),
// detached and adopted (same container), then stopped and removed.
func TestLauncher_Lifecycle(t *testing.T) {
	eachLauncher(t, true, func(t *testing.T, l *container.Launcher, engine string, cfg container.Config, sockDir string) {
		base := cfg.DataDir
		ctx := context.Background()
		lg := logrus.New()
		lg.SetLevel(logrus.DebugLevel)
		log := logrus.NewEntry(lg)
		sock := filepath.Join(sockDir, "csi.sock")
		spec := container.RunSpec{Alloc: "a1", Type: "node",
			Image:     container.Image{Image: ref, Engine: engine, Pull: container.PullNever},
			Args:      hostpath.Command("", "n1", filepath.Join(base, "state"))[1:],
			Env:       []string{"CSI_ENDPOINT=unix://" + sock},
			SocketDir: sockDir, OutputDir: sockDir}
		spec.Args[0] = "-endpoint=unix://" + sock
		spec.Image.Mounts = []container.Mount{{Source: base, Target: base}}

		c, err := l.Start(ctx, spec, log)
		if err != nil {
			t.Fatal(err)
		}
		probe(t, sock)
		if c.ImageID() == "" || c.ID() == "" {
			t.Errorf("container %q image %q: want both", c.ID(), c.ImageID())
		}
		waitFor(t, "the driver's output in the output file", func() bool {
			lines, _ := proc.ReadOutput(sockDir, -1)
			return len(lines) > 0
		})
		found, err := l.Find(ctx, engine, "a1")
		if err != nil || len(found) != 1 || found[0].ID != c.ID() || !found[0].Running {
			t.Fatalf("Find = %+v, %v; want the one running container %s", found, err, c.ID())
		}

		if err := c.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.Exited():
		case <-time.After(2 * time.Minute):
			t.Fatal("the killed container's exit was not seen")
		}
		if !strings.Contains(c.Status(), "137") {
			t.Errorf("status %q, want the SIGKILL's exit status 137", c.Status())
		}
		c.Detach()

		c2, err := l.Start(ctx, spec, log)
		if err != nil {
			t.Fatal(err)
		}
		probe(t, sock)
		found, _ = l.Find(ctx, engine, "a1")
		if len(found) != 1 || found[0].ID != c2.ID() {
			t.Fatalf("after a restart Find = %+v, want only %s (the dead one removed)", found, c2.ID())
		}
		before, _ := proc.ReadOutput(sockDir, -1)
		c2.Detach()
		c3, err := l.Adopt(ctx, engine, c2.ID(), sockDir, log)
		if err != nil {
			t.Fatal(err)
		}
		if c3.ID() != c2.ID() || !c3.Adopted() {
			t.Fatalf("adopted %s, want %s", c3.ID(), c2.ID())
		}
		probe(t, sock)
		// Lines are kept once across the detach and adoption.
		after, _ := proc.ReadOutput(sockDir, -1)
		seen := map[string]bool{}
		for _, ln := range after {
			k := ln.Time.String() + ln.Text
			if seen[k] {
				t.Errorf("line kept twice: %s", ln.Text)
			}
			seen[k] = true
		}
		if len(after) < len(before) {
			t.Errorf("%d lines after adoption, fewer than the %d before", len(after), len(before))
		}
		if err := c3.Stop(ctx, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		found, err = l.Find(ctx, engine, "a1")
		if err != nil || len(found) != 0 {
			t.Fatalf("after Stop Find = %+v, %v; want none", found, err)
		}
	})
}

// TestLauncher_Errors: a missing image with pull never, and an engine
// that is not there, each a clear error naming the engine and its socket.
func TestLauncher_Errors(t *testing.T) {
	engs := startEngines(t)
	base := t.TempDir()
	for _, e := range engs {
		l, err := container.NewLauncher(container.Config{DataDir: base, DockerSocket: e.socket, PodmanSocket: e.socket})
		if err != nil {
			t.Fatal(err)
		}
		im := container.Image{Image: "csiactor-test/missing:1", Engine: e.name, Pull: container.PullNever}
		err = l.HasImage(context.Background(), im)
		if !errors.Is(err, container.ErrImageMissing) || !strings.Contains(err.Error(), e.socket) || !strings.Contains(err.Error(), `"csiactor-test/missing:1"`) {
			t.Errorf("%s: HasImage(missing) = %v, want ErrImageMissing naming the socket and image", e.name, err)
		}
		_, err = l.Start(context.Background(), container.RunSpec{Alloc: "a", Type: "node", Image: im, SocketDir: base, OutputDir: base}, logrus.NewEntry(logrus.New()))
		if !errors.Is(err, container.ErrImageMissing) {
			t.Errorf("%s: Start(missing) = %v, want ErrImageMissing", e.name, err)
		}
		if found, _ := l.Find(context.Background(), e.name, "a"); len(found) != 0 {
			t.Errorf("%s: %d containers after a failed start, want none", e.name, len(found))
		}
		l.Close()
	}
	gone := filepath.Join(base, "no-engine.sock")
	l, err := container.NewLauncher(container.Config{DataDir: base, DockerSocket: gone})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = l.Start(context.Background(), container.RunSpec{Alloc: "a", Type: "node", Image: container.Image{Image: ref}, SocketDir: base, OutputDir: base}, logrus.NewEntry(logrus.New()))
	if !errors.Is(err, container.ErrEngineDown) || !strings.Contains(err.Error(), "docker engine at "+gone) {
		t.Errorf("Start with no engine = %v, want ErrEngineDown naming docker and %s", err, gone)
	}
}

// TestLauncher_OutputOnce: a burst of lines written within one second is
// kept whole, in order, and once across a detach and an adoption (with
// the lines written after it), under each engine. Podman's
// Docker-compatible API stamps lines to the second, so their times do not
// tell them apart.
func TestLauncher_OutputOnce(t *testing.T) {
	eachLauncher(t, false, func(t *testing.T, l *container.Launcher, engine string, cfg container.Config, dir string) {
		ctx := context.Background()
		log := logrus.NewEntry(logrus.New())
		const n = 100
		script := `i=0; while [ $i -lt 100 ]; do echo "line $i"; i=$((i+1)); done
while [ ! -e ` + dir + `/go ]; do sleep 1; done; echo after; exec sleep 100000`
		spec := container.RunSpec{Alloc: "a1", Type: "controller",
			Image: container.Image{Image: engines.Image, Engine: engine, Pull: container.PullNever},
			Args:  []string{"sh", "-c", script}, SocketDir: dir, OutputDir: dir}
		c, err := l.Start(ctx, spec, log)
		if err != nil {
			t.Fatal(err)
		}
		// check waits for the burst and "after" of each of runs
		// containers (the last one's "after" when withAfter) and
		// checks that they are kept in order, each once.
		check := func(runs int, withAfter bool) {
			t.Helper()
			var want []string
			for r := range runs {
				for i := range n {
					want = append(want, fmt.Sprintf("line %d", i))
				}
				if r < runs-1 || withAfter {
					want = append(want, "after")
				}
			}
			var texts []string
			waitFor(t, "the container's lines in the output file", func() bool {
				lines, _ := proc.ReadOutput(dir, -1)
				texts = texts[:0]
				for _, ln := range lines {
					texts = append(texts, ln.Text)
				}
				return len(texts) >= len(want)
			})
			if !slices.Equal(texts, want) {
				t.Fatalf("kept lines %q, want %q", texts, want)
			}
		}
		check(1, false)
		c.Detach()
		c2, err := l.Adopt(ctx, engine, c.ID(), dir, log)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		check(1, true)
		// Killed and started anew (the go file there: the burst and
		// "after" at once), maybe within the second of the last line
		// kept: the new container's lines are its own, all kept.
		if err := c2.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		<-c2.Exited()
		c2.Detach()
		c3, err := l.Start(ctx, spec, log)
		if err != nil {
			t.Fatal(err)
		}
		check(2, true)
		if err := c3.Stop(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
	})
}
