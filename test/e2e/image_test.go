package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/actors/plugin/container"
	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/engines"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/runtime"
)

// hostpathImage is the image of the hostpath driver that the engines
// started here hold: imported from a rootfs with the driver (static) as
// its entrypoint and busybox's applets (mount, umount) beside it. Nothing
// can be pulled, so every allocation of it says pull: never.
const hostpathImage = "csiactor-e2e/hostpath:1"

// imageEngine is a real container engine started for one test, holding
// hostpathImage.
type imageEngine struct {
	name   string // container.Docker or container.Podman
	socket string // its API socket, as plugins.engines names it
	// client runs the engine's own command-line client against it (docker
	// kill, podman ps), as an operator would.
	client func(args ...string) (string, error)
}

// startImageEngine starts the engine name (docker or podman) for t and
// imports the hostpath driver's image into it. It skips t where the
// engines or the hostpath driver are not available.
func startImageEngine(t *testing.T, name string) imageEngine {
	t.Helper()
	bin := hostpath.Binary(t)
	engines.Require(t)
	switch name {
	case container.Docker:
		d := engines.StartDocker(t, engines.DockerOptions{})
		d.ImportPlugin(t, hostpathImage, bin)
		return imageEngine{name: name, socket: d.Socket(), client: d.Run}
	case container.Podman:
		p := engines.StartPodman(t, engines.PodmanOptions{})
		p.ImportPlugin(t, hostpathImage, bin)
		return imageEngine{name: name, socket: p.Socket(), client: p.Run}
	}
	t.Fatalf("no engine %q", name)
	return imageEngine{}
}

// forEachEngine runs test in a subtest per engine (docker, podman), each
// with its own engine started.
func forEachEngine(t *testing.T, test func(t *testing.T, e imageEngine)) {
	for _, name := range []string{container.Docker, container.Podman} {
		t.Run(name, func(t *testing.T) { test(t, startImageEngine(t, name)) })
	}
}

// imageHost is newHost with its agents pointed at e's API socket
// (plugins.engines.<name>).
func imageHost(t *testing.T, e imageEngine) *host {
	h := newHost(t)
	h.pluginsExtra += fmt.Sprintf("  engines:\n    %s: %s\n", e.name, e.socket)
	return h
}

// waitNoContainers waits until no container labelled with h's data dir
// is left on e.
func (h *host) waitNoContainers(e imageEngine, why string) {
	h.t.Helper()
	h.eventually("no plugin container left "+why, readyDeadline, func() (bool, string) {
		got := h.pluginContainers(e)
		return len(got) == 0, fmt.Sprint(got)
	})
}

// apiClient is a client of h's agent API, closed at the test's end.
func (h *host) apiClient() *api.Client {
	h.t.Helper()
	c, err := api.NewClient(h.address())
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(c.Close)
	return c
}

// imageDriver is the hostpath driver run from hostpathImage with e: the
// same plugin, allocation ID and bookkeeping as hostpathDriver, its
// allocation an image one. h must be an imageHost of e.
func imageDriver(e imageEngine) driver {
	d := hostpathDriver
	d.allocation = func(h *host) string { return h.hostpathImageAllocation(e, "hostpath") }
	return d
}

// hostpathImageAllocation is the config entry of an image allocation id of
// the hostpath driver under e (hostpathImageSpec; its image object in JSON,
// which is YAML too).
func (h *host) hostpathImageAllocation(e imageEngine, id string) string {
	h.t.Helper()
	spec := h.hostpathImageSpec(e)
	b, err := json.Marshal(spec.Image)
	if err != nil {
		h.t.Fatal(err)
	}
	return fmt.Sprintf("  - id: %s\n    plugin: %s\n    type: %s\n    image: %s\n", id, spec.Plugin, spec.Type, b)
}

// hostpathImageSpec is the registration of the hostpath driver from
// hostpathImage under e, as a monolith with its state dir (which must
// exist before Podman binds it) bound into the container at the same
// path.
func (h *host) hostpathImageSpec(e imageEngine) runtime.AllocationSpec {
	h.t.Helper()
	dir := h.hostpathDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		h.t.Fatal(err)
	}
	return runtime.AllocationSpec{Plugin: hostpath.PluginName, Type: "monolith", Image: &container.Image{
		Image: hostpathImage, Engine: e.name, Pull: container.PullNever,
		Args:   hostpath.Command("", "e2e-node", dir)[1:],
		Mounts: []container.Mount{{Source: dir, Target: dir}},
	}}
}

// allocation returns the allocation id as `csiactor alloc list -json`
// shows it.
func (h *host) allocation(id string) (runtime.Allocation, bool) {
	h.t.Helper()
	var as []runtime.Allocation
	out := h.ok("alloc", "list", "-json")
	if err := json.Unmarshal([]byte(out), &as); err != nil {
		h.t.Fatalf("alloc list -json: %v\n%s", err, out)
	}
	for _, a := range as {
		if a.ID == id {
			return a, true
		}
	}
	return runtime.Allocation{}, false
}

// waitContainer waits until allocation id is healthy in a running
// container other than old, and returns it.
func (h *host) waitContainer(id, old string) runtime.Allocation {
	h.t.Helper()
	var a runtime.Allocation
	h.eventually("allocation "+id+" healthy in a container other than "+short(old), readyDeadline, func() (bool, string) {
		var ok bool
		a, ok = h.allocation(id)
		return ok && a.Healthy && a.ContainerID != "" && a.ContainerID != old, fmt.Sprintf("%+v", a)
	})
	return a
}

// pluginContainers returns the IDs of the containers the agents of h
// labelled as theirs on e, running or not.
func (h *host) pluginContainers(e imageEngine) []string {
	h.t.Helper()
	out, err := e.client("ps", "-a", "-q", "--no-trunc", "--filter", "label="+container.LabelDataDir+"="+h.dataDir)
	if err != nil {
		h.t.Fatalf("%s ps: %v", e.name, err)
	}
	ids := strings.Fields(out)
	sort.Strings(ids)
	return ids
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// checkLogsOnce checks that `csiactor alloc logs` of id holds lines and
// none twice (the engine stamps each with its time in nanoseconds, so two
// equal lines are one line kept twice).
func (h *host) checkLogsOnce(id, when string) {
	h.t.Helper()
	out := h.ok("alloc", "logs", "-json", id)
	seen := map[string]bool{}
	n := 0
	for line := range strings.Lines(out) {
		var l runtime.LogLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			h.t.Fatalf("alloc logs -json: line %q: %v", line, err)
		}
		k := l.Time.String() + " " + l.Stream + " " + l.Line
		if seen[k] {
			h.t.Errorf("%s: alloc logs has this line twice: %s", when, k)
		}
		seen[k] = true
		n++
	}
	if n == 0 {
		h.t.Errorf("%s: alloc logs of %s has no lines", when, id)
	}
}

// TestImage_Lifecycle runs the kubernetes-csi hostpath driver from an
// image, under dockerd and under Podman, as a monolith image allocation:
// registered from the config file and healthy, its container labelled and
// listed with image, digest and engine; a claim's mount made inside the
// container is seen on the host; `docker kill` of the container → a new
// container, healthy, the claim unharmed; the agent SIGKILLed → the next
// one adopts the same container; the claim released and the allocation
// deregistered → the container gone, nothing mounted, the driver's
// bookkeeping empty (hostpath.Diff).
func TestImage_Lifecycle(t *testing.T) {
	// Registered first, so it runs after the engines' cleanups.
	t.Cleanup(leakcheck.Check(t))
	forEachEngine(t, func(t *testing.T, e imageEngine) {
		h := imageHost(t, e)
		d := imageDriver(e)
		a := h.startWith(d)

		al, _ := h.allocation(d.alloc)
		if al.Image != hostpathImage || al.Engine != e.name || al.ContainerID == "" || !strings.HasPrefix(al.ImageDigest, "sha256:") || al.PID != 0 {
			t.Fatalf("alloc list: %+v; want the image, engine %s, a container ID, its image's sha256 digest, no PID", al, e.name)
		}
		if got := h.pluginContainers(e); !slices.Equal(got, []string{al.ContainerID}) {
			t.Errorf("containers labelled with the data dir: %v, want %s alone", got, al.ContainerID)
		}
		list := h.ok("alloc", "list")
		status := h.ok("alloc", "status", d.alloc)
		for _, want := range []string{hostpathImage, e.name, short(al.ContainerID), al.ImageDigest[:len("sha256:")+12]} {
			if !strings.Contains(list, want) {
				t.Errorf("alloc list does not show %q:\n%s", want, list)
			}
		}
		for _, want := range []string{hostpathImage, e.name, al.ContainerID, al.ImageDigest} {
			if !strings.Contains(status, want) {
				t.Errorf("alloc status does not show %q:\n%s", want, status)
			}
		}

		// A claim: mounted by the driver inside the container, seen here.
		h.createVolume(d, "vol1", "single-node-writer")
		target := strings.TrimSpace(h.ok("volume", "claim", "-alloc", "web1", "-mode", "write", "-access-mode", "single-node-writer", "vol1"))
		if !mountinfo.IsMountPoint(target) {
			t.Fatalf("%s is not a mount point on the host", target)
		}
		if err := os.WriteFile(filepath.Join(target, "hello.txt"), []byte("hello\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		intact := func(when string) {
			t.Helper()
			h.checkSettled(d, when)
			if b, err := os.ReadFile(filepath.Join(target, "hello.txt")); err != nil || string(b) != "hello\n" {
				t.Errorf("%s: hello.txt = %q, %v", when, b, err)
			}
		}
		intact("after the claim")

		// The container killed behind the agent's back: a new one.
		if _, err := e.client("kill", al.ContainerID); err != nil {
			t.Fatal(err)
		}
		al2 := h.waitContainer(d.alloc, al.ContainerID)
		intact("after " + e.name + " kill")
		if got := h.pluginContainers(e); !slices.Equal(got, []string{al2.ContainerID}) {
			t.Errorf("after %s kill: containers %v, want the new %s alone (the dead one removed)", e.name, got, al2.ContainerID)
		}

		// The agent SIGKILLed: the next one adopts the same container.
		a.signal(syscall.SIGKILL)
		a.wait(shutdownDeadline)
		a.checkNoRace()
		if got := h.pluginContainers(e); !slices.Equal(got, []string{al2.ContainerID}) {
			t.Errorf("after the agent's SIGKILL: containers %v, want %s still running alone", got, al2.ContainerID)
		}
		a = h.startAgent()
		h.waitPluginHealthy(d)
		if al3, _ := h.allocation(d.alloc); al3.ContainerID != al2.ContainerID {
			t.Errorf("after an agent restart the allocation runs in %s, want %s adopted", short(al3.ContainerID), short(al2.ContainerID))
		}
		if got := h.pluginContainers(e); !slices.Equal(got, []string{al2.ContainerID}) {
			t.Errorf("after the adoption: containers %v, want %s alone", got, al2.ContainerID)
		}
		intact("after the agent's SIGKILL")
		h.checkLogsOnce(d.alloc, "after the agent's SIGKILL")

		// The container dies while no agent runs: the next agent finds the
		// dead one by its labels, removes it and starts another.
		a.signal(syscall.SIGKILL)
		a.wait(shutdownDeadline)
		a.checkNoRace()
		if _, err := e.client("kill", al2.ContainerID); err != nil {
			t.Fatal(err)
		}
		a = h.startAgent()
		al4 := h.waitContainer(d.alloc, al2.ContainerID)
		h.waitPluginHealthy(d)
		if got := h.pluginContainers(e); !slices.Equal(got, []string{al4.ContainerID}) {
			t.Errorf("after a container died with no agent: containers %v, want the new %s alone", got, al4.ContainerID)
		}
		intact("after the container died with no agent running")

		// Released and deregistered: nothing left.
		h.ok("volume", "release", "-alloc", "web1", "vol1")
		h.settle(d, "after the release")
		h.ok("alloc", "deregister", d.alloc)
		h.waitNoContainers(e, "after deregistration")
		if diff := hostpath.Diff(h.hostpathDir(), filepath.Join(h.dataDir, "volumes", d.plugin), hostpath.Want{}); len(diff) > 0 {
			t.Errorf("after deregistration:\n  %s", strings.Join(diff, "\n  "))
		}
		a.stop()
	})
}

// TestImage_BadInput: an image allocation with an unknown engine, a
// relative mount path, image together with command or socket, a missing
// image with pull: never, each refused through the API with a clear error
// naming the field, and nothing registered or started. The same in the
// config file stops the agent before it starts anything.
func TestImage_BadInput(t *testing.T) {
	// Registered first, so it runs after the engines' cleanups.
	t.Cleanup(leakcheck.Check(t))
	e := startImageEngine(t, container.Docker)
	h := imageHost(t, e)
	h.writeConfig("")
	a := h.startAgent()
	c := h.apiClient()

	good := func() *container.Image {
		return &container.Image{Image: hostpathImage, Engine: e.name, Pull: container.PullNever, Args: []string{"-endpoint={endpoint}"}}
	}
	for _, tc := range []struct {
		name  string
		spec  func(*runtime.AllocationSpec)
		field string
		want  string
	}{
		{"unknown engine", func(s *runtime.AllocationSpec) { s.Image.Engine = "rkt" }, "image.engine", `"rkt"`},
		{"relative mount source", func(s *runtime.AllocationSpec) {
			s.Image.Mounts = []container.Mount{{Source: "state", Target: "/state"}}
		}, "image.mounts[0].source", `"state"`},
		{"relative mount target", func(s *runtime.AllocationSpec) {
			s.Image.Mounts = []container.Mount{{Source: "/state", Target: "state"}}
		}, "image.mounts[0].target", `"state"`},
		{"image and command", func(s *runtime.AllocationSpec) { s.Command = []string{"/bin/true"} }, "image", "command"},
		{"image and socket", func(s *runtime.AllocationSpec) { s.Socket = "/run/csi.sock" }, "image", "socket"},
		{"no image", func(s *runtime.AllocationSpec) { s.Image.Image = "" }, "image.image", "required"},
		{"missing image, pull never", func(s *runtime.AllocationSpec) { s.Image.Image = "csiactor-e2e/missing:1" }, "image", `"csiactor-e2e/missing:1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := runtime.AllocationSpec{Plugin: hostpath.PluginName, Type: "monolith", Image: good()}
			tc.spec(&spec)
			ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
			defer cancel()
			_, err := c.RegisterAllocation(ctx, "bad", spec)
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.Contains(ae.Error(), tc.field) || !strings.Contains(ae.Error(), tc.want) {
				t.Errorf("register: %v; want 400 naming %s and %s", err, tc.field, tc.want)
			}
			if _, ok := h.allocation("bad"); ok {
				t.Errorf("the allocation was registered")
			}
			if got := h.pluginContainers(e); len(got) != 0 {
				t.Errorf("containers %v started, want none", got)
			}
		})
	}
	// The CLI names its flags.
	h.fails(2, "-image: give one of socket", "alloc", "register", "-plugin", hostpath.PluginName, "-type", "monolith", "-image", hostpathImage, "-socket", "/run/csi.sock", "bad")
	h.fails(2, `-engine: "rkt" is not an engine`, "alloc", "register", "-plugin", hostpath.PluginName, "-type", "monolith", "-image", hostpathImage, "-engine", "rkt", "bad")
	h.fails(1, `"csiactor-e2e/missing:1"`, "alloc", "register", "-plugin", hostpath.PluginName, "-type", "monolith", "-image", "csiactor-e2e/missing:1", "-pull", "never", "bad")
	if _, ok := h.allocation("bad"); ok {
		t.Errorf("a bad alloc register registered the allocation")
	}
	if got := h.pluginContainers(e); len(got) != 0 {
		t.Errorf("containers %v started, want none", got)
	}
	a.stop()
	a.checkNoRace()

	// The config file: the agent refuses to start, naming the key.
	h.writeConfig(strings.Replace(h.hostpathImageAllocation(e, "bad"), `"engine":"docker"`, `"engine":"rkt"`, 1))
	cmd := exec.Command(h.bin, "agent", "-config", h.config)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "allocations[0].image.engine") || !strings.Contains(string(out), `"rkt"`) {
		t.Errorf("agent with engine rkt in its config: %v\n%s\nwant a failure naming allocations[0].image.engine", err, out)
	}
	if got := h.pluginContainers(e); len(got) != 0 {
		t.Errorf("containers %v started, want none", got)
	}
}

// TestImage_RegisterToHealthy registers the hostpath driver through the
// API, alternately exec-managed and from its image, under dockerd and
// under Podman, and logs how long each took from the register call to
// healthy (the median of several). It asserts no speed: it measures the
// cost of running a plugin in a container beside running it as a process.
func TestImage_RegisterToHealthy(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	forEachEngine(t, func(t *testing.T, e imageEngine) {
		h := imageHost(t, e)
		h.writeConfig("")
		a := h.startAgent()
		c := h.apiClient()
		specs := map[string]runtime.AllocationSpec{
			"exec":  {Plugin: hostpath.PluginName, Type: "monolith", Command: hostpath.Command(hostpath.Binary(t), "e2e-node", h.hostpathDir())},
			"image": h.hostpathImageSpec(e),
		}
		const rounds = 5
		took := map[string][]time.Duration{}
		for i := range rounds {
			for _, kind := range []string{"exec", "image"} {
				id := fmt.Sprintf("%s-%d", kind, i)
				took[kind] = append(took[kind], registerToHealthy(t, c, id, specs[kind]))
			}
		}
		median := func(ds []time.Duration) time.Duration {
			ds = slices.Clone(ds)
			slices.Sort(ds)
			return ds[len(ds)/2].Round(time.Millisecond)
		}
		t.Logf("register to healthy, median of %d, hostpath driver: exec-managed %s, image under %s %s (all: exec %v, image %v)",
			rounds, median(took["exec"]), e.name, median(took["image"]), took["exec"], took["image"])
		h.waitNoContainers(e, "after every deregistration")
		a.stop()
		a.checkNoRace()
	})
}

// registerToHealthy registers the allocation id, returns how long it took
// from the call to the allocation listed healthy, and deregisters it.
func registerToHealthy(t *testing.T, c *api.Client, id string, spec runtime.AllocationSpec) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyDeadline)
	defer cancel()
	began := time.Now()
	if _, err := c.RegisterAllocation(ctx, id, spec); err != nil {
		t.Fatalf("register %s: %v", id, err)
	}
	for {
		as, err := c.Allocations(ctx)
		if err != nil {
			t.Fatalf("%s not healthy within %s: %v", id, readyDeadline, err)
		}
		if i := slices.IndexFunc(as, func(a runtime.Allocation) bool { return a.ID == id }); i >= 0 && as[i].Healthy {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(began)
	if err := c.DeregisterAllocation(ctx, id); err != nil {
		t.Fatalf("deregister %s: %v", id, err)
	}
	return took
}

// randomImageKills is how many kills TestImage_RandomKills makes.
const randomImageKills = 20

// TestImage_RandomKills is TestAgent_RandomKills with the hostpath driver
// run from its image under dockerd, and two kinds of kill mixed at random:
// the agent SIGKILLed (the next one adopts the container), or the plugin's
// container killed through the engine (`docker kill`; the agent starts a
// new one). After the last kill every claim must settle, the driver's
// bookkeeping and the mount table holding exactly what the claims own.
func TestImage_RandomKills(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	seed := randomSeed(t)
	e := startImageEngine(t, container.Docker)
	h := imageHost(t, e)
	d := imageDriver(e)
	ds := []driver{d}
	var agents, containers int
	randomKillsRun(t, h, ds, seed, randomImageKills, func(_ int, rng *rand.Rand, a *agent) *agent {
		if rng.IntN(2) == 0 {
			agents++
			return h.killAgent(a, ds)
		}
		containers++
		al, _ := h.allocation(d.alloc)
		h.killWholeState(e, al.ContainerID)
		h.waitContainer(d.alloc, al.ContainerID)
		h.waitPluginHealthy(d)
		return a
	})
	t.Logf("kills: %d of the agent, %d of the plugin's container", agents, containers)
	if got := h.pluginContainers(e); len(got) != 1 {
		t.Errorf("containers at the end: %v, want one", got)
	}
}

// killWholeState kills the hostpath driver's container id through the
// engine, at a moment its state.json is whole. The driver rewrites that
// file in place (truncate, then write), so a kill between the two leaves
// it empty and the driver never starts again ("error encoding volumes and
// snapshots from state file ...: unexpected end of JSON input"): a defect
// of the driver, which no supervisor can mend. So the container is frozen
// first (pause), and killed frozen once the file parses; else it is
// thawed, and frozen again a moment later. The kill still cuts off
// whatever RPC the agent has in flight.
func (h *host) killWholeState(e imageEngine, id string) {
	h.t.Helper()
	h.eventually("the driver frozen with its state.json whole", readyDeadline, func() (bool, string) {
		if _, err := e.client("pause", id); err != nil {
			h.t.Fatalf("pause the plugin's container %s: %v", short(id), err)
		}
		if _, err := hostpath.ReadState(h.hostpathDir()); err != nil {
			if _, err := e.client("unpause", id); err != nil {
				h.t.Fatalf("unpause the plugin's container %s: %v", short(id), err)
			}
			return false, err.Error()
		}
		return true, ""
	})
	if _, err := e.client("kill", id); err != nil {
		h.t.Fatalf("kill the plugin's container %s: %v", short(id), err)
	}
}

// TestImage_EngineDown: dockerd down when an image allocation is
// registered → the allocation is unhealthy, its health_description naming
// the engine and its socket, and it comes up once dockerd does; dockerd
// killed under a running plugin with a published claim → still healthy
// (the plugin answers), the description naming the engine and its socket;
// dockerd started again (which ends the containers it left, as it runs
// without live-restore) → the agent starts a new container, and the claim
// is unharmed.
func TestImage_EngineDown(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	hostpath.Binary(t)
	dk := engines.StartDocker(t, engines.DockerOptions{})
	dk.ImportPlugin(t, hostpathImage, hostpath.Binary(t))
	e := imageEngine{name: container.Docker, socket: dk.Socket(), client: dk.Run}
	h := imageHost(t, e)
	d := imageDriver(e)
	h.writeConfig("")
	a := h.startAgent()

	// Down at registration.
	dk.Kill()
	c := h.apiClient()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	if _, err := c.RegisterAllocation(ctx, d.alloc, h.hostpathImageSpec(e)); err != nil {
		t.Fatalf("register with dockerd down: %v", err)
	}
	h.eventually("the allocation unhealthy, naming the engine and its socket", readyDeadline, func() (bool, string) {
		al, ok := h.allocation(d.alloc)
		return ok && !al.Healthy && strings.Contains(al.HealthDescription, "docker") && strings.Contains(al.HealthDescription, dk.Socket()),
			fmt.Sprintf("%+v", al)
	})
	dk.Start()
	al := h.waitContainer(d.alloc, "")
	h.waitPluginHealthy(d)

	// Down under a running plugin with a claim.
	h.createVolume(d, "vol1", "single-node-writer")
	target := strings.TrimSpace(h.ok("volume", "claim", "-alloc", "web1", "-mode", "write", "-access-mode", "single-node-writer", "vol1"))
	if err := os.WriteFile(filepath.Join(target, "hello.txt"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dk.Kill()
	// The plugin still answers: healthy, its engine's absence told.
	h.eventually("the allocation healthy, naming the engine gone and its socket", readyDeadline, func() (bool, string) {
		al, ok := h.allocation(d.alloc)
		return ok && al.Healthy && strings.Contains(al.HealthDescription, "not watched") && strings.Contains(al.HealthDescription, dk.Socket()),
			fmt.Sprintf("%+v", al)
	})
	dk.Start()
	h.waitContainer(d.alloc, al.ContainerID)
	h.waitPluginHealthy(d)
	h.checkSettled(d, "after dockerd came back")
	if b, err := os.ReadFile(filepath.Join(target, "hello.txt")); err != nil || string(b) != "hello\n" {
		t.Errorf("after dockerd came back: hello.txt = %q, %v", b, err)
	}
	h.ok("volume", "release", "-alloc", "web1", "vol1")
	h.settle(d, "after the release")
	h.ok("alloc", "deregister", d.alloc)
	h.waitNoContainers(e, "after deregistration")
	a.stop()
	a.checkNoRace()
}

// TestImage_StopOnAgentExit: with plugins.stop_on_agent_exit, an agent's
// orderly stop stops and removes its plugin's container; the next agent
// starts a new one.
func TestImage_StopOnAgentExit(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	e := startImageEngine(t, container.Docker)
	h := imageHost(t, e)
	h.pluginsExtra += "  stop_on_agent_exit: true\n"
	d := imageDriver(e)
	a := h.startWith(d)
	al, _ := h.allocation(d.alloc)
	a.stop()
	a.checkNoRace()
	if got := h.pluginContainers(e); len(got) != 0 {
		t.Errorf("after the agent stopped: containers %v, want none", got)
	}
	a = h.startAgent()
	h.waitContainer(d.alloc, al.ContainerID)
	a.stop()
	a.checkNoRace()
}

// TestImage_HealthTimeout: a plugin container that stops answering (frozen
// with pause: it runs, but answers nothing) is killed after
// plugins.health_timeout and replaced by a new container, healthy, with a
// published claim unharmed.
func TestImage_HealthTimeout(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	e := startImageEngine(t, container.Docker)
	h := imageHost(t, e)
	h.pluginsExtra += "  health_timeout: 3s\n"
	d := imageDriver(e)
	a := h.startWith(d)
	h.createVolume(d, "vol1", "single-node-writer")
	h.ok("volume", "claim", "-alloc", "web1", "-mode", "write", "-access-mode", "single-node-writer", "vol1")
	al, _ := h.allocation(d.alloc)
	if _, err := e.client("pause", al.ContainerID); err != nil {
		t.Fatal(err)
	}
	h.waitContainer(d.alloc, al.ContainerID)
	h.waitPluginHealthy(d)
	h.checkSettled(d, "after the frozen container was replaced")
	if got := h.pluginContainers(e); len(got) != 1 {
		t.Errorf("containers %v, want the new one alone", got)
	}
	h.ok("volume", "release", "-alloc", "web1", "vol1")
	h.settle(d, "after the release")
	a.stop()
	a.checkNoRace()
}

// TestImage_ConfigChangedWhileDown: an image allocation changed in the
// config file while no agent ran gets a new container made from the new
// spec (the running one of the old spec is not adopted, and never runs
// beside it), and one removed from the config file has its container
// removed by the next agent, not left running for ever.
func TestImage_ConfigChangedWhileDown(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	e := startImageEngine(t, container.Docker)
	h := imageHost(t, e)
	d := imageDriver(e)
	a := h.startWith(d)
	old, _ := h.allocation(d.alloc)
	a.stop()
	a.checkNoRace()
	if got := h.pluginContainers(e); !slices.Equal(got, []string{old.ContainerID}) {
		t.Fatalf("after an orderly stop: containers %v, want %s left running", got, short(old.ContainerID))
	}

	// The same allocation with one more variable in its environment.
	spec := h.hostpathImageSpec(e)
	spec.Image.Env = map[string]string{"CHANGED": "yes"}
	b, err := json.Marshal(spec.Image)
	if err != nil {
		t.Fatal(err)
	}
	h.writeConfig(fmt.Sprintf("  - id: %s\n    plugin: %s\n    type: %s\n    image: %s\n", d.alloc, spec.Plugin, spec.Type, b))
	a = h.startAgent()
	al := h.waitContainer(d.alloc, old.ContainerID)
	if got := h.pluginContainers(e); !slices.Equal(got, []string{al.ContainerID}) {
		t.Errorf("after the spec changed: containers %v, want the new %s alone", got, short(al.ContainerID))
	}
	env, err := e.client("inspect", "-f", "{{json .Config.Env}}", al.ContainerID)
	if err != nil || !strings.Contains(env, `"CHANGED=yes"`) {
		t.Errorf("the new container's environment %s (%v) lacks CHANGED=yes", env, err)
	}
	a.stop()
	a.checkNoRace()

	// Removed from the config file.
	h.writeConfig("")
	a = h.startAgent()
	h.waitNoContainers(e, "after the allocation was removed from the config file")
	if _, err := os.Stat(filepath.Join(h.dataDir, "plugins", d.alloc)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the removed allocation's directory: %v, want it gone", err)
	}
	a.stop()
	a.checkNoRace()
}
