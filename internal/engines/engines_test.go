package engines

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRootfsTar_BusyboxAndApplets(t *testing.T) {
	if _, err := os.Stat(BusyboxPath); err != nil {
		t.Skipf("busybox-static is not installed: %v", err)
	}
	b, err := RootfsTar()
	if err != nil {
		t.Fatal(err)
	}
	links := map[string]string{}
	var busybox int64
	r := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case h.Name == "bin/busybox":
			busybox = h.Size
		case h.Typeflag == tar.TypeSymlink:
			links[h.Name] = h.Linkname
		}
	}
	if fi, _ := os.Stat(BusyboxPath); busybox != fi.Size() {
		t.Fatalf("bin/busybox: %d bytes, want %d", busybox, fi.Size())
	}
	for _, a := range []string{"sh", "cat", "echo", "ls", "sleep", "touch", "test", "mkdir"} {
		if links["bin/"+a] != "busybox" {
			t.Errorf("bin/%s links to %q, want busybox", a, links["bin/"+a])
		}
	}
}

// engine is what the shared tests use of Docker and Podman.
type engine interface {
	Run(args ...string) (string, error)
	MustRun(args ...string) string
	Socket() string
}

// writeThenRead runs a container that writes into the named local volume
// and a second one that reads it back, copies a file into a running
// container's volume, and checks that the API socket shows the mount.
func writeThenRead(t *testing.T, e engine) {
	vol := localVolume(t, e)
	e.MustRun("run", "--rm", "--network", "none", "-v", vol+":/data", Image, "sh", "-c", "echo written > /data/f")
	if got := e.MustRun("run", "--rm", "--network", "none", "-v", vol+":/data", Image, "cat", "/data/f"); got != "written\n" {
		t.Fatalf("the second container read %q, want %q", got, "written\n")
	}

	e.MustRun("run", "-d", "--name", "c1", "--network", "none", "-v", vol+":/data", Image, "sh", "-c", Idle)
	src := filepath.Join(t.TempDir(), "copied")
	if err := os.WriteFile(src, []byte("by cp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.MustRun("cp", src, "c1:/data/copied")
	if got := e.MustRun("exec", "c1", "cat", "/data/copied"); got != "by cp\n" {
		t.Fatalf("after cp the container reads %q", got)
	}
	if got := e.MustRun("exec", "c1", "cat", "/data/f"); got != "written\n" {
		t.Fatalf("after cp the volume holds %q in f", got)
	}

	cs, err := Containers(e.Socket())
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, c := range cs {
		if !slices.Contains(c.Names, "/c1") {
			continue
		}
		found = true
		if c.State != "running" {
			t.Errorf("c1: state %q, want running", c.State)
		}
		if len(c.Mounts) != 1 || c.Mounts[0].Type != "volume" || c.Mounts[0].Name != vol || c.Mounts[0].Driver != "local" || c.Mounts[0].Destination != "/data" {
			t.Errorf("c1: mounts %+v, want the volume %s of driver local at /data", c.Mounts, vol)
		}
	}
	if !found {
		t.Fatalf("GET /containers/json?all=1 has no /c1: %+v", cs)
	}
}

// localVolume creates a volume of the local driver, with a name unique to
// the test, and returns its name. A dockerd asks every plugin in the
// machine-wide /run/docker/plugins for a volume name it does not know, so
// a bare `-v data1:/data` may well get another test's plugin volume.
func localVolume(t *testing.T, e engine) string {
	t.Helper()
	name := "engines-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	e.MustRun("volume", "create", "--driver", "local", name)
	return name
}

// checkGone checks that dir and every process of it are gone.
func checkGone(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there after Close: %v", dir, err)
	}
	if pids := tree(filepath.Base(dir)); len(pids) > 0 {
		t.Errorf("processes of %s left after Close: %v", dir, pids)
	}
}

func TestDocker_VolumeWriteThenRead(t *testing.T) {
	t.Parallel()
	d := StartDocker(t, DockerOptions{})
	writeThenRead(t, d)
	d.Close()
	checkGone(t, d.Dir)
}

func TestPodman_VolumeWriteThenRead(t *testing.T) {
	t.Parallel()
	p := StartPodman(t, PodmanOptions{})
	writeThenRead(t, p)
	p.Close()
	checkGone(t, p.Dir)
}

func TestDocker_KillStart(t *testing.T) {
	t.Parallel()
	d := StartDocker(t, DockerOptions{})
	vol := localVolume(t, d)
	d.MustRun("run", "-d", "--name", "c1", "--network", "none", "-v", vol+":/data", Image, "sh", "-c", "echo kept > /data/f; "+Idle)
	waitFile(t, d, "c1", "/data/f")
	d.Kill()
	if _, err := d.Run("version"); err == nil {
		t.Fatal("docker version succeeds with dockerd killed")
	}
	d.Start()
	// Without live-restore dockerd ends the container it finds running.
	if got := strings.TrimSpace(d.MustRun("inspect", "-f", "{{.State.Running}}", "c1")); got != "false" {
		t.Fatalf("c1 running=%s after a restart without live-restore", got)
	}
	if got := d.MustRun("run", "--rm", "--network", "none", "-v", vol+":/data", Image, "cat", "/data/f"); got != "kept\n" {
		t.Fatalf("after the restart the volume holds %q", got)
	}
}

func TestDocker_LiveRestore_KeepsContainer(t *testing.T) {
	t.Parallel()
	d := StartDocker(t, DockerOptions{LiveRestore: true})
	vol := localVolume(t, d)
	d.MustRun("run", "-d", "--name", "c1", "--network", "none", "-v", vol+":/data", Image, "sh", "-c", "echo kept > /data/f; "+Idle)
	waitFile(t, d, "c1", "/data/f")
	pid := strings.TrimSpace(d.MustRun("inspect", "-f", "{{.State.Pid}}", "c1"))
	d.Kill()
	if _, err := os.Stat("/proc/" + pid); err != nil {
		t.Fatalf("c1's process %s died with dockerd: %v", pid, err)
	}
	d.Start()
	if got := strings.TrimSpace(d.MustRun("inspect", "-f", "{{.State.Running}} {{.State.Pid}}", "c1")); got != "true "+pid {
		t.Fatalf("after the restart c1 is %q, want running with pid %s", got, pid)
	}
	if got := d.MustRun("exec", "c1", "cat", "/data/f"); got != "kept\n" {
		t.Fatalf("after the restart c1 reads %q", got)
	}
	// Killed again with the container running: Close still removes all.
	d.Kill()
	d.Close()
	checkGone(t, d.Dir)
}

// waitFile waits until the container has written file.
func waitFile(t *testing.T, e engine, container, file string) {
	t.Helper()
	end := time.Now().Add(time.Minute)
	for {
		_, err := e.Run("exec", container, "test", "-e", file)
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s did not write %s within a minute: %v", container, file, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPodman_VolumePlugins checks that a plugin named in PodmanOptions is
// the one Podman asks to create a volume of its driver.
func TestPodman_VolumePlugins(t *testing.T) {
	t.Parallel()
	Require(t)
	sock := filepath.Join(t.TempDir(), "p.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var calls []string
	created := map[string]bool{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Name string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		calls = append(calls, r.URL.Path+" "+req.Name)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/vnd.docker.plugins.v1+json")
		switch r.URL.Path {
		case "/Plugin.Activate":
			_, _ = io.WriteString(w, `{"Implements":["VolumeDriver"]}`)
		case "/VolumeDriver.Create":
			mu.Lock()
			created[req.Name] = true
			mu.Unlock()
			_, _ = io.WriteString(w, `{}`)
		case "/VolumeDriver.Get":
			// Podman asks Get before Create, and takes over a volume
			// whose Get answers instead of creating it.
			mu.Lock()
			ok := created[req.Name]
			mu.Unlock()
			if !ok {
				w.WriteHeader(http.StatusNotFound)
				_, _ = io.WriteString(w, `{"Err":"no such volume"}`)
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"Volume": map[string]string{"Name": req.Name}})
		default:
			_, _ = io.WriteString(w, `{}`)
		}
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	p := StartPodman(t, PodmanOptions{VolumePlugins: map[string]string{"csiactor-engines-test": sock}})
	p.MustRun("volume", "create", "--driver", "csiactor-engines-test", "v1")
	if got := strings.TrimSpace(p.MustRun("volume", "inspect", "-f", "{{.Driver}}", "v1")); got != "csiactor-engines-test" {
		t.Fatalf("v1 has driver %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(calls, "/VolumeDriver.Create v1") {
		t.Fatalf("the plugin got %q, no Create of v1", calls)
	}
}
