package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/dockerplugin"
	"github.com/csiactor/csiactor/internal/engines"
	"github.com/csiactor/csiactor/runtime"
)

// containerEngine is what the tests do with Docker and Podman alike.
type containerEngine interface {
	Run(args ...string) (string, error)
	MustRun(args ...string) string
	Socket() string
	Close()
}

// dockerDriverName is a driver name no other test uses: every dockerd
// on the machine reads the one plugin directory, and asks every driver
// there for volume names it does not know.
func dockerDriverName(t *testing.T) string {
	return fmt.Sprintf("csiae2e-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
}

// dockerGrace is docker.unmount_grace in the tests: short, so that a
// claim goes soon after its container.
var dockerGrace = "1s"

// dockerSection is the config's docker section for driver on d's plugin,
// reconciling with the engine at socket.
func dockerSection(driver string, d driver, socket string) string {
	return fmt.Sprintf(`docker:
  plugin_dir: %s
  drivers:
    - name: %s
      plugin: %s
      defaults:
        capacity: 1MiB
  engines: [%s]
  reconcile_interval: 100ms
  unmount_grace: %s
`, runtime.DefaultDockerPluginDir, driver, d.plugin, socket, dockerGrace)
}

// dockerClaim returns the volume's claim made by a Mount, if any, with
// the number of its claims and past claims.
func (h *host) dockerClaim(vol string) (runtime.Claim, int) {
	h.t.Helper()
	v := h.volume(vol)
	for _, c := range v.Claims {
		if strings.HasPrefix(c.Alloc, dockerplugin.AllocPrefix) {
			return c, len(v.Claims) + len(v.PastClaims)
		}
	}
	return runtime.Claim{}, len(v.Claims) + len(v.PastClaims)
}

// waitDockerPublished waits until a Mount's claim of vol is published and
// is its only claim, and returns it.
func (h *host) waitDockerPublished(vol string) runtime.Claim {
	h.t.Helper()
	var c runtime.Claim
	h.eventually(vol+" published for a container", settleDeadline, func() (bool, string) {
		var n int
		c, n = h.dockerClaim(vol)
		return c.State == runtime.ClaimPublished && n == 1, describe(h.volume(vol))
	})
	return c
}

// waitNoClaims waits until vol has no claim and no past claim.
func (h *host) waitNoClaims(vol, why string) {
	h.t.Helper()
	h.eventually(vol+" has no claims "+why, settleDeadline, func() (bool, string) {
		v := h.volume(vol)
		return len(v.Claims)+len(v.PastClaims) == 0, describe(v)
	})
}

// startDockerHost starts the agent with d and a driver of the docker
// section reconciling with the engine that start returns (started first,
// so that its socket is known; closed first, before the agent stops, so
// that its containers' Unmounts reach the agent).
func startDockerHost(t *testing.T, d driver, start func(driver string) containerEngine) (*host, *agent, containerEngine, string) {
	return startDockerHostGrace(t, d, dockerGrace, start)
}

// startDockerHostGrace is startDockerHost with docker.unmount_grace set to
// grace.
func startDockerHostGrace(t *testing.T, d driver, grace string, start func(driver string) containerEngine) (*host, *agent, containerEngine, string) {
	engines.Require(t)
	if !isRoot() {
		t.Fatal("the engines need root")
	}
	h := newHost(t)
	name := dockerDriverName(t)
	sock := filepath.Join(runtime.DefaultDockerPluginDir, name+".sock")
	// Registered first, so it runs last, after the agents are gone: a
	// killed agent leaves its socket, and every dockerd on the machine
	// waits on a dead plugin socket for each volume it does not know.
	t.Cleanup(func() { os.Remove(sock) })
	eng := start(name)
	h.configExtra = strings.Replace(dockerSection(name, d, eng.Socket()), "unmount_grace: "+dockerGrace, "unmount_grace: "+grace, 1)
	a := h.startWith(d)
	t.Cleanup(eng.Close)
	h.eventually("the driver socket", readyDeadline, func() (bool, string) {
		fi, err := os.Stat(sock)
		return err == nil && fi.Mode().Type() == os.ModeSocket, fmt.Sprint(err)
	})
	return h, a, eng, name
}

// TestDocker_Lifecycle is a user's day with Docker and a CSI driver:
// create, two containers one after the other, docker cp into a running
// one, the agent SIGKILLed under it, docker rm -f, dockerd SIGKILLed and
// started again, volume rm refused while in use and then done. After each
// step the driver's bookkeeping and the mount table agree with the claims.
func TestDocker_Lifecycle(t *testing.T) {
	forEachDriver(t, func(t *testing.T, d driver) {
		var dk *engines.Docker
		h, a, _, name := startDockerHost(t, d, func(string) containerEngine {
			dk = engines.StartDocker(t, engines.DockerOptions{})
			return dk
		})
		vol := "dk-" + d.alloc
		run := func(args ...string) string {
			return dk.MustRun(append([]string{"run", "--network", "none"}, args...)...)
		}

		dk.MustRun("volume", "create", "-d", name, "-o", "size=1MiB", vol)
		if out := dk.MustRun("volume", "inspect", "-f", "{{.Driver}} {{.Status.plugin}} {{.Status.created}}", vol); strings.TrimSpace(out) != name+" "+d.plugin+" true" {
			t.Errorf("volume inspect = %q", out)
		}
		if v := h.volume(vol); !v.Created || v.CapacityBytes < 1<<20 {
			t.Errorf("the agent's volume = %s", describe(v))
		}

		c := h.containersFlow(d, dk, vol)
		if !mounted(c.TargetPath) {
			t.Errorf("after docker cp the target %s is not mounted", c.TargetPath)
		}
		h.checkSettled(d, "after docker cp")

		a = h.killAgentUnder(a, d, dk, vol, c)

		// docker rm -f: the claim goes.
		dk.MustRun("rm", "-f", "c1")
		h.waitNoClaims(vol, "after docker rm -f")
		h.checkSettled(d, "after docker rm -f")

		// dockerd SIGKILLed and started again without live-restore: its
		// container is gone without an Unmount; the agent finds out.
		run("-d", "--name", "c2", "-v", vol+":/data", engines.Image, "sh", "-c", engines.Idle)
		c2 := h.waitDockerPublished(vol)
		dk.Kill()
		dk.Start()
		h.waitNoClaims(vol, "after dockerd's restart")
		if !hasEvent(h.events(), dockerplugin.EventMountReleased, c2.Alloc, vol) {
			t.Errorf("no %s event for %s", dockerplugin.EventMountReleased, c2.Alloc)
		}
		h.checkSettled(d, "after dockerd's restart")
		dk.MustRun("rm", "-f", "c2") // exited, it still refers to the volume

		// volume rm is refused while a container uses the volume.
		run("-d", "--name", "c3", "-v", vol+":/data", engines.Image, "sh", "-c", engines.Idle)
		h.waitDockerPublished(vol)
		if out, err := dk.Run("volume", "rm", vol); err == nil || !strings.Contains(err.Error(), "in use") {
			t.Errorf("volume rm while in use = %q, %v", out, err)
		}
		if _, err := dk.Run("volume", "rm", "-f", vol); err == nil {
			t.Error("volume rm -f while in use succeeded")
		}
		h.volume(vol) // still there
		dk.MustRun("rm", "-f", "c3")
		h.waitNoClaims(vol, "after docker rm -f c3")
		dk.MustRun("volume", "rm", vol)
		h.eventually(vol+" deleted", settleDeadline, func() (bool, string) {
			r := h.cli("volume", "status", vol)
			return r.code != 0 && strings.Contains(r.stderr, "not"), r.String()
		})
		if vols := h.checkSettled(d, "after volume rm"); len(vols) != 0 {
			t.Errorf("volumes left: %v", vols)
		}
		if st := d.state(h); len(st.Volumes) != 0 {
			t.Errorf("%s still has volumes after volume rm: %+v", d.plugin, st.Volumes)
		}
		a.checkNoRace()
	})
}

// TestDocker_CopyAndNextContainer_OnePublish: Docker copies an image's
// content into a new volume with a Mount and an Unmount of their own just
// before the container's Mount, and the next container comes with a mount
// ID of its own too; within the grace period (a minute here, so that a
// loaded machine cannot outlast it) neither costs a teardown or a second
// publish. volume rm releases the claim at once.
func TestDocker_CopyAndNextContainer_OnePublish(t *testing.T) {
	forEachDriver(t, func(t *testing.T, d driver) {
		var dk *engines.Docker
		h, _, _, name := startDockerHostGrace(t, d, "1m", func(string) containerEngine {
			dk = engines.StartDocker(t, engines.DockerOptions{})
			return dk
		})
		vol := "dk-copy-" + d.alloc
		dk.MustRun("volume", "create", "-d", name, "-o", "size=1MiB", vol)
		dk.MustRun("run", "--rm", "--network", "none", "-v", vol+":/bin", engines.Image, "/bin/sh", "-c", "echo hello > /bin/f")
		if out := dk.MustRun("run", "--rm", "--network", "none", "-v", vol+":/data", engines.Image, "sh", "-c", "cat /data/f; test -x /data/busybox && echo copied"); out != "hello\ncopied\n" {
			t.Fatalf("the second container read %q", out)
		}
		count := func(typ string) int {
			n := 0
			for _, e := range h.events() {
				if e.Volume == vol && e.Type == typ {
					n++
				}
			}
			return n
		}
		if p, r := count(runtime.EventClaimPublished), count(runtime.EventClaimReleased); p != 1 || r != 0 {
			t.Errorf("the copy and two containers cost %d publishes and %d releases, want 1 and 0", p, r)
		}
		h.checkSettled(d, "after two containers")
		dk.MustRun("volume", "rm", vol)
		if vols := h.checkSettled(d, "after volume rm"); len(vols) != 0 {
			t.Errorf("volumes left: %v", vols)
		}
	})
}

// TestDocker_LiveRestore: dockerd with live-restore SIGKILLed and started
// again keeps its running container, whose mount the agent keeps.
func TestDocker_LiveRestore(t *testing.T) {
	d := exampleDriver
	var dk *engines.Docker
	h, _, _, name := startDockerHost(t, d, func(string) containerEngine {
		dk = engines.StartDocker(t, engines.DockerOptions{LiveRestore: true})
		return dk
	})
	vol := "dk-live"
	dk.MustRun("volume", "create", "-d", name, vol)
	dk.MustRun("run", "-d", "--network", "none", "--name", "c1", "-v", vol+":/data", engines.Image, "sh", "-c", "echo kept > /data/f; "+engines.Idle)
	c := h.waitDockerPublished(vol)
	dk.Kill()
	dk.Start()
	// Two checks of the engine after its restart (the reconciler's
	// rule) would have released it; wait for the API to answer twice.
	for i := range 3 {
		h.eventually(fmt.Sprintf("engine check %d", i), settleDeadline, func() (bool, string) {
			_, err := engines.Containers(dk.Socket())
			return err == nil, fmt.Sprint(err)
		})
	}
	if out := dk.MustRun("exec", "c1", "cat", "/data/f"); strings.TrimSpace(out) != "kept" {
		t.Errorf("after dockerd's restart the container reads %q", out)
	}
	if got := h.waitDockerPublished(vol); got.Alloc != c.Alloc {
		t.Errorf("claim %s, was %s", got.Alloc, c.Alloc)
	}
	dk.MustRun("rm", "-f", "c1")
	h.waitNoClaims(vol, "after docker rm -f")
	dk.MustRun("volume", "rm", vol)
	h.checkSettled(d, "after volume rm")
}

// TestPodman_Lifecycle is TestDocker_Lifecycle's flow with Podman, whose
// Mounts all carry one ID per volume.
func TestPodman_Lifecycle(t *testing.T) {
	forEachDriver(t, func(t *testing.T, d driver) {
		var pm *engines.Podman
		h, a, _, name := startDockerHost(t, d, func(name string) containerEngine {
			pm = engines.StartPodman(t, engines.PodmanOptions{VolumePlugins: map[string]string{
				name: filepath.Join(runtime.DefaultDockerPluginDir, name+".sock"),
			}})
			return pm
		})
		vol := "pm-" + d.alloc
		pm.MustRun("volume", "create", "--driver", name, "-o", "size=1MiB", vol)
		if v := h.volume(vol); !v.Created {
			t.Errorf("the agent's volume = %s", describe(v))
		}
		c := h.containersFlow(d, pm, vol)

		a = h.killAgentUnder(a, d, pm, vol, c)

		if _, err := pm.Run("volume", "rm", vol); err == nil {
			t.Error("podman volume rm of a volume in use succeeded")
		}
		h.volume(vol)
		pm.MustRun("rm", "-f", "-t", "0", "c1")
		h.waitNoClaims(vol, "after podman rm -f")
		h.checkSettled(d, "after podman rm -f")
		pm.MustRun("volume", "rm", vol)
		if vols := h.checkSettled(d, "after volume rm"); len(vols) != 0 {
			t.Errorf("volumes left: %v", vols)
		}
		a.checkNoRace()
	})
}

// containersFlow runs on the engine, with vol: two containers one after
// the other, the first writing and the second reading (the first mounts
// the new volume on /bin, so the engine copies the image's /bin into it
// first), then a running container c1 and a cp of a file into its
// volume, after which the volume is still published for it. It returns
// c1's claim. The driver's bookkeeping and the mount table agree with the
// claims after each step.
func (h *host) containersFlow(d driver, eng containerEngine, vol string) runtime.Claim {
	h.t.Helper()
	run := func(args ...string) string {
		return eng.MustRun(append([]string{"run", "--network", "none"}, args...)...)
	}
	run("--rm", "-v", vol+":/bin", engines.Image, "/bin/sh", "-c", "echo hello > /bin/f")
	if out := run("--rm", "-v", vol+":/data", engines.Image, "sh", "-c", "cat /data/f; test -x /data/busybox && echo copied"); out != "hello\ncopied\n" {
		h.t.Fatalf("the second container read %q", out)
	}
	h.waitNoClaims(vol, "after the containers ended")
	h.checkSettled(d, "after two containers")

	run("-d", "--name", "c1", "-v", vol+":/data", engines.Image, "sh", "-c", engines.Idle)
	c := h.waitDockerPublished(vol)
	src := filepath.Join(h.base, "copied.txt")
	if err := os.WriteFile(src, []byte("copied\n"), 0o644); err != nil {
		h.t.Fatal(err)
	}
	eng.MustRun("cp", src, "c1:/data/copied.txt")
	if out := eng.MustRun("exec", "c1", "cat", "/data/copied.txt", "/data/f"); out != "copied\nhello\n" {
		h.t.Errorf("after cp the container reads %q", out)
	}
	if got := h.waitDockerPublished(vol); got.Alloc != c.Alloc {
		h.t.Errorf("cp changed the claim: %s, was %s", got.Alloc, c.Alloc)
	}
	h.checkSettled(d, "after cp")
	return c
}

// killAgentUnder SIGKILLs the agent a while container c1 of the engine
// runs with vol (its claim c, its file /data/f holding "hello"): c1 keeps
// its data and writes more, and the agent started again keeps the claim.
// It returns the new agent.
func (h *host) killAgentUnder(a *agent, d driver, eng containerEngine, vol string, c runtime.Claim) *agent {
	h.t.Helper()
	a.signal(syscall.SIGKILL)
	a.wait(readyDeadline)
	a.checkNoRace()
	if out := eng.MustRun("exec", "c1", "sh", "-c", "echo while-down >> /data/f && cat /data/f"); out != "hello\nwhile-down\n" {
		h.t.Errorf("with the agent down the container reads %q", out)
	}
	a = h.startAgent()
	h.waitPluginHealthy(d)
	if got := h.waitDockerPublished(vol); got.Alloc != c.Alloc {
		h.t.Errorf("after the agent's restart the claim is %s, was %s", got.Alloc, c.Alloc)
	}
	if out := eng.MustRun("exec", "c1", "cat", "/data/f"); out != "hello\nwhile-down\n" {
		h.t.Errorf("after the agent's restart the container reads %q", out)
	}
	h.checkSettled(d, "after the agent's restart")
	return a
}

// mounted reports whether path is a mount point in the mount table.
func mounted(path string) bool {
	for _, m := range mountsUnder(filepath.Dir(path)) {
		if m == path {
			return true
		}
	}
	return false
}
