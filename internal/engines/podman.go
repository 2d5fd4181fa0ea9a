package engines

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// PodmanOptions configures a Podman started by StartPodman.
type PodmanOptions struct {
	// VolumePlugins maps a volume driver name (what `-d`/`--driver`
	// names) to the socket of the plugin serving it; they go into the
	// [engine.volume_plugins] table of its containers.conf. The sockets
	// need not exist yet: Podman dials a plugin when a volume uses it.
	VolumePlugins map[string]string
}

// Podman is a private Podman: its own storage, run and temp directories,
// configuration and API service (`podman system service`), all in Dir.
// Its methods may be called from one goroutine at a time (Run and MustRun
// from several).
type Podman struct {
	// Dir holds everything of this Podman: root/ (graphroot, with the
	// volumes), run/ (runroot), tmp/ (tmp_dir, with its locks and events),
	// containers.conf, storage.conf, podman.sock and service.log.
	Dir string
	// Image is the busybox image it holds (see the package comment).
	Image string
	// StorageDriver is the storage driver it runs with: overlay, or vfs
	// where Dir lies on overlayfs.
	StorageDriver string

	client // Run and MustRun: podman on this Podman

	mu      sync.Mutex
	service *daemon // guarded by mu
	closed  bool    // guarded by mu
}

// StartPodman configures a Podman for tb, imports Image into it and
// starts its API service, waiting until that answers on Socket. tb's
// cleanup (or Close) removes its containers, stops the service and
// removes everything it left. It calls Require.
func StartPodman(tb testing.TB, opts PodmanOptions) *Podman {
	tb.Helper()
	Require(tb)
	dir, err := engineDir("csiactor-podman-", len("/podman.sock"))
	if err != nil {
		tb.Fatal(err)
	}
	p := &Podman{Dir: dir, Image: Image, StorageDriver: "overlay"}
	p.client = client{tb: tb, command: p.Command}
	if onOverlayfs(dir) {
		p.StorageDriver = "vfs"
	}
	tb.Cleanup(p.Close)
	if err := p.writeConfig(opts); err != nil {
		tb.Fatal(err)
	}
	tar, err := RootfsTar()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := p.Command("import", "-", Image)
	cmd.Stdin = bytes.NewReader(tar)
	if _, err := run(cmd); err != nil {
		tb.Fatal(err)
	}
	svc, err := startDaemon(PodmanPath, []string{"system", "service", "--time=0", "unix://" + p.Socket()}, p.env(), p.logFile())
	if err != nil {
		tb.Fatal(err)
	}
	p.mu.Lock()
	p.service = svc
	p.mu.Unlock()
	if err := svc.waitReady(p.Socket(), p.logFile()); err != nil {
		tb.Fatal(err)
	}
	return p
}

// writeConfig writes containers.conf and storage.conf into Dir.
//
//   - default_ulimits = []: the packaged default raises nproc, which fails
//     in a container-like machine.
//   - runtime runc and cgroup_manager cgroupfs: there is no systemd, and
//     crun is not installed.
//   - events_logger file: no journald.
//   - lock_type file: the default shm locks live in /dev/shm/libpod_lock,
//     which every Podman on the machine would share.
//   - network_config_dir: a network created by a test stays in Dir.
func (p *Podman) writeConfig(opts PodmanOptions) error {
	for _, d := range []string{"root", "run", "tmp", "networks"} {
		if err := os.Mkdir(filepath.Join(p.Dir, d), 0o700); err != nil {
			return err
		}
	}
	var c strings.Builder
	fmt.Fprintf(&c, "[containers]\ndefault_ulimits = []\n\n")
	fmt.Fprintf(&c, "[network]\nnetwork_config_dir = %s\n\n", strconv.Quote(filepath.Join(p.Dir, "networks")))
	fmt.Fprintf(&c, "[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\nlock_type = \"file\"\n")
	fmt.Fprintf(&c, "tmp_dir = %s\n", strconv.Quote(filepath.Join(p.Dir, "tmp")))
	fmt.Fprintf(&c, "image_copy_tmp_dir = %s\n\n", strconv.Quote(filepath.Join(p.Dir, "tmp")))
	fmt.Fprintf(&c, "[engine.volume_plugins]\n")
	names := make([]string, 0, len(opts.VolumePlugins))
	for n := range opts.VolumePlugins {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(&c, "%s = %s\n", strconv.Quote(n), strconv.Quote(opts.VolumePlugins[n]))
	}
	s := fmt.Sprintf("[storage]\ndriver = %s\ngraphroot = %s\nrunroot = %s\n",
		strconv.Quote(p.StorageDriver), strconv.Quote(filepath.Join(p.Dir, "root")), strconv.Quote(filepath.Join(p.Dir, "run")))
	if err := os.WriteFile(filepath.Join(p.Dir, "containers.conf"), []byte(c.String()), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(p.Dir, "storage.conf"), []byte(s), 0o600)
}

// env is what points podman at this Podman's configuration.
func (p *Podman) env() []string {
	return []string{
		"CONTAINERS_CONF=" + filepath.Join(p.Dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF=" + filepath.Join(p.Dir, "storage.conf"),
	}
}

// Socket returns the path of the API service's socket, which answers the
// Docker-compatible API (and Podman's own under /v4.x/libpod).
func (p *Podman) Socket() string { return filepath.Join(p.Dir, "podman.sock") }

func (p *Podman) logFile() string { return filepath.Join(p.Dir, "service.log") }

// Command returns the command `/usr/bin/podman args...` with this
// Podman's configuration in its environment, for a test that needs its
// own stdin or output.
func (p *Podman) Command(args ...string) *exec.Cmd {
	cmd := exec.Command(PodmanPath, args...)
	cmd.Env = append(os.Environ(), p.env()...)
	return cmd
}

// Close removes every container (`rm -f -t 0`: no grace period), stops
// the API service, ends any process left (conmon and the containers'),
// unmounts what is mounted under Dir and removes Dir. It reports what
// failed on tb (and the service's log when the test failed). It is
// idempotent; tb's cleanup calls it.
func (p *Podman) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	svc := p.service
	p.mu.Unlock()
	var errs []error
	if _, err := os.Stat(filepath.Join(p.Dir, "containers.conf")); err == nil {
		if _, err := p.Run("rm", "-a", "-f", "-t", "0"); err != nil {
			errs = append(errs, err)
		}
	}
	teardown(p.tb, "podman service", p.Dir, p.logFile(), svc, errs)
}
