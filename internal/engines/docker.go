package engines

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// DockerOptions configures a dockerd started by StartDocker.
type DockerOptions struct {
	// LiveRestore runs dockerd with --live-restore: its containers keep
	// running while it is down, and it takes them back when it starts.
	LiveRestore bool
}

// Docker is a private dockerd with its own containerd, data, exec root
// and API socket, all in Dir. (Where the machine's containerd runs, with
// its socket at /run/containerd/containerd.sock, dockerd uses that one
// instead of starting its own; it does so in containerd namespaces named
// after Dir, so its containers stay apart there too.) Its methods may be called from
// one goroutine at a time (Run and MustRun from several).
type Docker struct {
	// Dir holds everything of this dockerd: data/ (--data-root), exec/
	// (--exec-root, with containerd's state and socket), docker.sock,
	// docker.pid and dockerd.log.
	Dir string
	// Image is the busybox image it holds (see the package comment).
	Image string
	// StorageDriver is the storage driver it runs with: overlay2, or vfs
	// where Dir lies on overlayfs.
	StorageDriver string

	client // Run and MustRun: the docker client against this dockerd
	opts   DockerOptions

	mu     sync.Mutex
	d      *daemon // guarded by mu; nil once closed
	closed bool    // guarded by mu
}

// StartDocker starts a dockerd for tb, waits until it answers on its
// socket and imports Image into it. tb's cleanup (or Close) removes its
// containers, stops it and removes everything it left. It calls Require.
func StartDocker(tb testing.TB, opts DockerOptions) *Docker {
	tb.Helper()
	Require(tb)
	// The deepest socket: exec/containerd/containerd.sock.ttrpc.
	dir, err := engineDir("csiactor-docker-", len("/exec/containerd/containerd.sock.ttrpc"))
	if err != nil {
		tb.Fatal(err)
	}
	d := &Docker{Dir: dir, Image: Image, StorageDriver: "overlay2", opts: opts}
	d.client = client{tb: tb, command: d.Command}
	if onOverlayfs(dir) {
		d.StorageDriver = "vfs"
	}
	tb.Cleanup(d.Close)
	if err := d.start(); err != nil {
		tb.Fatal(err)
	}
	tar, err := RootfsTar()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := d.Command("import", "-", Image)
	cmd.Stdin = bytes.NewReader(tar)
	if _, err := run(cmd); err != nil {
		tb.Fatal(err)
	}
	return d
}

// Socket returns the path of dockerd's API socket.
func (d *Docker) Socket() string { return filepath.Join(d.Dir, "docker.sock") }

func (d *Docker) logFile() string { return filepath.Join(d.Dir, "dockerd.log") }

// Command returns the command `/usr/bin/docker -H unix://SOCKET args...`,
// for a test that needs its own stdin or output.
func (d *Docker) Command(args ...string) *exec.Cmd {
	return exec.Command(DockerPath, append([]string{"-H", "unix://" + d.Socket()}, args...)...)
}

// Kill SIGKILLs dockerd, as in a crash, and returns once it is gone and
// so is its containerd (which dies with it). The containers' shims and
// processes are left running; without LiveRestore the next Start kills
// them.
func (d *Docker) Kill() {
	d.tb.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.d == nil || d.d.exited() {
		d.tb.Fatal("dockerd.Kill: dockerd is not running")
	}
	ctrd := d.containerdPid()
	d.d.kill()
	if ctrd > 0 {
		if err := waitGone(ctrd); err != nil {
			d.tb.Fatalf("dockerd killed, but its containerd: %v", err)
		}
	}
	// containerd is an orphan now, which init may leave a zombie for a
	// while; dockerd takes a zombie's pid in containerd.pid for a live
	// containerd and waits for it in vain ("timeout waiting for
	// containerd to start"). Without the file it starts a new one.
	if err := os.Remove(d.containerdPidFile()); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.tb.Fatal(err)
	}
}

// Start starts dockerd again on the same directories, after Kill, and
// waits until it answers.
func (d *Docker) Start() {
	d.tb.Helper()
	if err := d.start(); err != nil {
		d.tb.Fatal(err)
	}
}

func (d *Docker) start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errors.New("dockerd.Start: the engine is closed")
	}
	if d.d != nil && !d.d.exited() {
		return errors.New("dockerd.Start: dockerd is running")
	}
	args := []string{
		"--data-root", filepath.Join(d.Dir, "data"),
		"--exec-root", filepath.Join(d.Dir, "exec"),
		"--pidfile", filepath.Join(d.Dir, "docker.pid"),
		"-H", "unix://" + d.Socket(),
		"--storage-driver", d.StorageDriver,
		"--iptables=false", "--bridge=none", "--ip-masq=false",
		// No /etc/docker/daemon.json of the machine's.
		"--config-file", filepath.Join(d.Dir, "daemon.json"),
		// dockerd uses the machine's containerd instead of starting its
		// own wherever /run/containerd/containerd.sock exists (a host
		// where the containerd package's service runs): namespaces of
		// its own keep its containers apart there too.
		"--containerd-namespace", filepath.Base(d.Dir),
		"--containerd-plugins-namespace", filepath.Base(d.Dir) + "-plugins",
	}
	if d.opts.LiveRestore {
		args = append(args, "--live-restore")
	}
	if err := os.WriteFile(filepath.Join(d.Dir, "daemon.json"), []byte("{}\n"), 0o600); err != nil {
		return err
	}
	dm, err := startDaemon(DockerdPath, args, nil, d.logFile())
	if err != nil {
		return err
	}
	d.d = dm
	return dm.waitReady(d.Socket(), d.logFile())
}

// running reports whether dockerd is up.
func (d *Docker) running() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.d != nil && !d.d.exited()
}

func (d *Docker) containerdPidFile() string {
	return filepath.Join(d.Dir, "exec", "containerd", "containerd.pid")
}

// containerdPid is the pid of dockerd's managed containerd, 0 if unknown.
func (d *Docker) containerdPid() int {
	b, err := os.ReadFile(d.containerdPidFile())
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// Close removes every container (with dockerd started again first when it
// was killed), stops dockerd and its containerd, ends any process left,
// unmounts what is mounted under Dir and removes Dir. It reports what
// failed on tb (and dockerd's log when the test failed). It is idempotent;
// tb's cleanup calls it.
func (d *Docker) Close() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	down := d.d == nil || d.d.exited()
	d.mu.Unlock()
	var errs []error
	if down {
		// Killed (or never up): start it again so that it removes its
		// containers itself; removeDir below ends what it cannot.
		if err := d.start(); err != nil {
			errs = append(errs, fmt.Errorf("restarting dockerd to remove its containers: %w", err))
		}
	}
	if d.running() {
		if ids, err := d.Run("ps", "-aq"); err != nil {
			errs = append(errs, err)
		} else if f := strings.Fields(ids); len(f) > 0 {
			if _, err := d.Run(append([]string{"rm", "-f"}, f...)...); err != nil {
				errs = append(errs, err)
			}
		}
	}
	d.mu.Lock()
	d.closed = true
	dm := d.d
	d.mu.Unlock()
	teardown(d.tb, "dockerd", d.Dir, d.logFile(), dm, errs)
}

// waitGone waits until pid is no live process (gone, or a zombie that
// init has yet to reap).
func waitGone(pid int) error {
	end := time.Now().Add(readyTimeout)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil
		}
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("process %d still alive after %s", pid, readyTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
