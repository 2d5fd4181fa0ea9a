// Package engines runs the real container engines in tests: a private
// dockerd (Debian's docker.io 20.10) and a private Podman (Debian's podman
// 4.3), each in its own directory with its own state, sockets and
// busybox image, so that tests can drive `docker run -v name:/data` and
// read the engine's API the way an operator's host would.
//
// # Basics
//
// Tests call Require first: it skips where $CSIACTOR_TEST_ENGINES is
// unset (a developer's `make test` without the engines passes), and fails
// where it is set but the machine cannot run them (not root, a binary
// missing), so a broken CI set-up never passes as a skip. .ci/run
// installs the packages and sets the variable.
//
// StartDocker and StartPodman start an engine that tb's cleanup (or
// Close) stops again: every container removed, the daemons and the
// processes they left (containerd, shims, conmon, the containers'
// processes) ended, everything mounted under the engine's directory
// unmounted and the directory removed. Both engines hold the image Image,
// imported from a rootfs of busybox-static (nothing is pulled), whose
// applets include sh, cat, echo, ls, sleep, touch, test and mkdir.
//
// # Caveats
//
//   - No image can be pulled and there is no container network: run
//     containers with `--network none` (dockerd runs with --bridge=none
//     and --iptables=false, so the default bridge network does not exist).
//   - The engine binaries are the Debian ones at fixed paths
//     (DockerdPath, DockerPath, PodmanPath); /usr/local/bin/docker, where
//     there is one, is another client and never used.
//   - Docker finds volume plugins only by their socket in the fixed,
//     machine-wide /run/docker/plugins (or a spec file in
//     /etc/docker/plugins), shared by every dockerd: a test that serves a
//     plugin there must give its driver a name no other test uses, and
//     remove the socket at its end. Podman is told its plugins' sockets
//     through PodmanOptions.VolumePlugins instead.
//   - A dockerd asked for a volume by a name it does not know (`docker run
//     -v NAME:/data` without `volume create`, `volume inspect NAME`) asks
//     every plugin in /run/docker/plugins for it (VolumeDriver.Get) and
//     takes the first that has it, so any dockerd on the machine, the
//     tests' own included, can reach another test's plugin: create local
//     volumes explicitly (`volume create --driver local NAME`) and give
//     plugin volumes names unique to the test. A socket left there with
//     nothing serving it makes each such lookup on every dockerd wait 30 s
//     (measured; Docker retries a plugin that long), and a dockerd that
//     found it was still slow (15 s) on the next lookup after the socket
//     was removed.
//   - Cleanups run last-registered-first: a test whose containers use a
//     volume plugin it serves should call Close on the engine before it
//     stops the plugin (or start the plugin first), so that removing the
//     containers can still unmount their volumes.
//   - Podman's default volume_plugin_timeout is 5 s; a plugin that answers
//     Mount later fails the container's start.
package engines

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
)

// Env names the environment variable that enables the tests that run the
// real engines (any non-empty value).
const Env = "CSIACTOR_TEST_ENGINES"

// The engines' binaries, from Debian's docker.io, podman and busybox-static
// packages.
const (
	DockerdPath = "/usr/sbin/dockerd"
	DockerPath  = "/usr/bin/docker"
	PodmanPath  = "/usr/bin/podman"
	BusyboxPath = "/usr/bin/busybox"
)

// Image is the busybox image every engine started here holds.
const Image = "csiactor-busybox:test"

// readyTimeout bounds the waits for an engine to answer on its socket and
// for its processes to end: generous, it asserts no speed.
const readyTimeout = 2 * time.Minute

// Require skips tb where $CSIACTOR_TEST_ENGINES is unset, and fails it
// where the variable is set but the engines cannot run here: not root, or
// one of the binaries missing.
func Require(tb testing.TB) {
	tb.Helper()
	if os.Getenv(Env) == "" {
		tb.Skipf("runs the real Docker and Podman engines: set $%s=1 (as root, with Debian's docker.io, podman and busybox-static installed, as .ci/run does)", Env)
	}
	if os.Geteuid() != 0 {
		tb.Fatalf("$%s is set, but the engines need root (euid %d)", Env, os.Geteuid())
	}
	for _, p := range []string{DockerdPath, DockerPath, PodmanPath, BusyboxPath} {
		fi, err := os.Stat(p)
		if err != nil {
			tb.Fatalf("$%s is set, but %s is missing (install docker.io, podman and busybox-static): %v", Env, p, err)
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			tb.Fatalf("$%s is set, but %s is not an executable file", Env, p)
		}
	}
}

// Idle is a shell command (for `sh -c`) that keeps a container running
// until it is stopped, and exits at once on SIGTERM. A bare `sleep` as the
// container's pid 1 ignores SIGTERM, so every stop (`docker stop`, `podman
// rm -f` without -t 0, dockerd ending the containers it finds after a
// restart without live-restore) would wait 10 s for the SIGKILL.
const Idle = "trap 'exit 0' TERM; sleep 1000000 & wait"

// Applets are the busybox applets the image's /bin links to busybox.
var Applets = []string{
	"sh", "cat", "echo", "ls", "sleep", "touch", "test", "[", "mkdir", "rm", "cp", "mv",
	"stat", "df", "mount", "umount", "grep", "head", "tail", "wc", "true", "false", "sync", "dd",
	"id", "env", "printf", "ps", "kill", "sed", "find", "chmod", "ln",
}

var rootfs struct {
	once sync.Once
	tar  []byte
	err  error
}

// RootfsTar returns the image's root file system as a tar archive: /bin
// with busybox-static and a link per applet in Applets, and empty /tmp,
// /etc, /proc, /sys, /dev and /data. It is built once per process, in
// memory.
func RootfsTar() ([]byte, error) {
	rootfs.once.Do(func() { rootfs.tar, rootfs.err = buildRootfs() })
	return rootfs.tar, rootfs.err
}

func buildRootfs() ([]byte, error) {
	bb, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return nil, fmt.Errorf("busybox for the image: %w", err)
	}
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	mod := time.Unix(0, 0)
	for _, d := range []string{"bin", "data", "dev", "etc", "proc", "sys", "tmp"} {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: mod}); err != nil {
			return nil, err
		}
	}
	if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bb)), ModTime: mod}); err != nil {
		return nil, err
	}
	if _, err := w.Write(bb); err != nil {
		return nil, err
	}
	for _, a := range Applets {
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: mod}); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Container is one container in the engines' Docker-compatible API
// (GET /containers/json), with the fields the tests read.
type Container struct {
	ID     string   `json:"Id"`
	Names  []string `json:"Names"`
	State  string   `json:"State"`
	Mounts []Mount  `json:"Mounts"`
}

// Mount is one mount of a Container; a named volume's has Type "volume",
// its Name and its Driver.
type Mount struct {
	Type        string `json:"Type"`
	Name        string `json:"Name"`
	Driver      string `json:"Driver"`
	Source      string `json:"Source"`
	Destination string `json:"Destination"`
	RW          bool   `json:"RW"`
}

// Containers lists every container, running or not, through the Docker
// API socket (GET /containers/json?all=1, which Podman's service answers
// too).
func Containers(socket string) ([]Container, error) {
	b, err := Get(socket, "/containers/json?all=1")
	if err != nil {
		return nil, err
	}
	var cs []Container
	if err := json.Unmarshal(b, &cs); err != nil {
		return nil, fmt.Errorf("containers from %s: %w", socket, err)
	}
	return cs, nil
}

// Get sends GET path (with its query) to the engine API on the unix
// socket and returns the body of a 200 answer; any other status is an
// error with the body.
func Get(socket, path string) ([]byte, error) {
	c := &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", socket)
			},
			DisableKeepAlives: true,
		},
	}
	resp, err := c.Get("http://engine" + path)
	if err != nil {
		return nil, fmt.Errorf("GET %s on %s: %w", path, socket, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s on %s: %w", path, socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s on %s: %s: %s", path, socket, resp.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

// maxSocketPath is the longest path a unix socket address holds
// (sun_path is 108 bytes with the terminating NUL).
const maxSocketPath = 107

// engineDir makes the engine's directory, short enough for the sockets
// inside it (longest extra is the deepest socket path below it, given by
// the caller): under $TMPDIR, or /tmp where that is too long.
func engineDir(prefix string, longest int) (string, error) {
	base := os.TempDir()
	if len(base)+1+len(prefix)+12+longest > maxSocketPath {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, prefix)
	if err != nil {
		return "", err
	}
	if len(dir)+longest > maxSocketPath {
		os.RemoveAll(dir)
		return "", fmt.Errorf("engine directory %s: its sockets would be longer than %d bytes", dir, maxSocketPath)
	}
	// The mount table shows real paths.
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	return dir, nil
}

// overlayfsMagic is the statfs type of overlayfs, on which neither
// engine's overlay driver works.
const overlayfsMagic = 0x794c7630

// onOverlayfs reports whether dir lies on overlayfs (a container-built
// CI machine), where the engines must store images with vfs.
func onOverlayfs(dir string) bool {
	var st syscall.Statfs_t
	return syscall.Statfs(dir, &st) == nil && st.Type == overlayfsMagic
}

// run runs cmd and returns its stdout; a failure's error has the command
// and its stderr.
func run(cmd *exec.Cmd) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.String(), nil
}

// client runs an engine's command-line client; Docker and Podman embed
// it.
type client struct {
	tb      testing.TB
	command func(args ...string) *exec.Cmd
}

// Run runs the engine's client (/usr/bin/docker against this dockerd, or
// /usr/bin/podman on this Podman) with args and returns its stdout; a
// failure's error holds the command and its stderr.
func (c client) Run(args ...string) (string, error) {
	return run(c.command(args...))
}

// MustRun is Run that fails the test on error.
func (c client) MustRun(args ...string) string {
	c.tb.Helper()
	out, err := c.Run(args...)
	if err != nil {
		c.tb.Fatal(err)
	}
	return out
}

// teardown ends an engine once its containers are removed (errs holds what
// failed so far): it shows the daemon's log when tb failed, stops the
// daemon (when there is one), removes dir with removeDir, and reports
// every failure on tb.
func teardown(tb testing.TB, what, dir, logFile string, d *daemon, errs []error) {
	if tb.Failed() {
		tb.Logf("%s %s: its log ends:\n%s", what, dir, logTail(logFile, 60))
	}
	if d != nil {
		if err := d.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeDir(dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		tb.Errorf("cleaning up %s %s: %v", what, dir, err)
	}
}

// daemon is a long-running engine process (dockerd, or Podman's API
// service) started by this package.
type daemon struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has been waited for
}

// startDaemon starts bin with args and env (added to this process's),
// appending its output to logFile.
func startDaemon(bin string, args, env []string, logFile string) (*daemon, error) {
	log, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child has its own copy
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a ^C to the test does not reach it before
	// the cleanup stops it in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &daemon{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(d.done)
	}()
	return d, nil
}

// exited reports whether the daemon has exited.
func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits for the daemon to exit, then SIGKILL if it
// has not within readyTimeout. It returns an error when SIGKILL was needed.
func (d *daemon) stop() error {
	if d.exited() {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return nil
	case <-time.After(readyTimeout):
	}
	_ = d.cmd.Process.Kill()
	<-d.done
	return fmt.Errorf("%s did not stop within %s of SIGTERM; killed", filepath.Base(d.cmd.Path), readyTimeout)
}

// kill SIGKILLs the daemon and waits until it has been reaped.
func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	<-d.done
}

// waitReady waits until socket answers GET /_ping, failing early when
// the daemon exits; logFile's tail is in the error.
func (d *daemon) waitReady(socket, logFile string) error {
	end := time.Now().Add(readyTimeout)
	for {
		_, err := Get(socket, "/_ping")
		if err == nil {
			return nil
		}
		if d.exited() {
			return fmt.Errorf("%s exited (%s) before it answered on %s; its log ends:\n%s", filepath.Base(d.cmd.Path), d.cmd.ProcessState, socket, logTail(logFile, 40))
		}
		if time.Now().After(end) {
			return fmt.Errorf("%s did not answer on %s within %s: %w; its log ends:\n%s", filepath.Base(d.cmd.Path), socket, readyTimeout, err, logTail(logFile, 40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logTail returns the last n lines of the file.
func logTail(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	return testbin.Tail(string(b), n)
}

// removeDir ends every process left that belongs to dir (its command line
// names dir's base name, which is unique and also the containerd namespace
// of a dockerd; and their descendants, which are the containers'
// processes), unmounts everything under dir, and removes it. It returns
// what failed.
func removeDir(dir string) error {
	var errs []error
	if err := killTree(filepath.Base(dir)); err != nil {
		errs = append(errs, err)
	}
	mps, err := mountinfo.Under(dir)
	if err != nil {
		errs = append(errs, err)
	}
	for _, mp := range mps {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// killTree SIGKILLs every live process whose command line contains marker,
// and all their descendants, and waits until they are gone (or zombies:
// orphans are reaped by init, not by us).
func killTree(marker string) error {
	end := time.Now().Add(readyTimeout)
	for {
		pids := tree(marker)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("processes of %s still alive after SIGKILL: %v", marker, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tree returns the live processes whose command line contains marker,
// other than this one, and their live descendants.
func tree(marker string) []int {
	type proc struct {
		ppid  int
		match bool
	}
	procs := map[int]proc{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The state and the parent follow the ")" that ends the command name.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		procs[pid] = proc{ppid: ppid, match: bytes.Contains(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), []byte(marker))}
	}
	var out []int
	for pid := range procs {
		for p, seen := pid, 0; p > 1 && seen < 64; seen++ {
			if procs[p].match {
				out = append(out, pid)
				break
			}
			q, ok := procs[p]
			if !ok {
				break
			}
			p = q.ppid
		}
	}
	slices.Sort(out)
	return out
}
