package csiplugin_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
)

// waitLimit bounds every wait for a plugin process; a safety net against a
// hung test, never a speed assertion.
const waitLimit = 2 * time.Minute

// startPluginProcess runs the plugin as a process of its own (this test
// binary, see TestMain) with its state in stateDir, its socket in sockDir
// and the extra flags, and connects a client once it answers Probe. The
// process is SIGKILLed when the test ends, if it still runs.
func startPluginProcess(t *testing.T, stateDir, sockDir string, flags ...string) *testPlugin {
	t.Helper()
	sock := filepath.Join(sockDir, "csi.sock")
	args := append([]string{"-endpoint", sock, "-state-dir", stateDir, "-node-id", "node-1"}, flags...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), pluginProcessEnv+"=1")
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	exited, err := testbin.Start(t, cmd, nil)
	if err != nil {
		t.Fatalf("start plugin process: %v", err)
	}
	tp := &testPlugin{
		t: t, cfg: csiplugin.Config{StateDir: stateDir, NodeID: "node-1"}, endpoint: "unix://" + sock,
		logs: logs, proc: cmd, exited: exited,
	}
	t.Cleanup(func() {
		tp.stop()
		if t.Failed() {
			t.Logf("plugin process %d log:\n%s", cmd.Process.Pid, logs.String())
		}
	})
	conn, err := grpc.NewClient(tp.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	tp.connect(conn)
	testbin.Eventually(t, "the plugin process to answer Probe", waitLimit, 10*time.Millisecond, func() (bool, string) {
		if testbin.Closed(exited) {
			t.Fatalf("plugin process exited: %s\n%s", cmd.ProcessState, logs.String())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := tp.id.Probe(ctx, &csipb.ProbeRequest{})
		return err == nil, errString(err)
	})
	return tp
}

// kill SIGKILLs the plugin process and waits for it.
func (tp *testPlugin) kill() {
	if !testbin.Closed(tp.exited) {
		_ = tp.proc.Process.Signal(syscall.SIGKILL)
	}
	<-tp.exited
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// fsType returns the file system type of the top mount at path.
func fsType(t *testing.T, path string) string {
	t.Helper()
	typ, err := mountinfo.FSType(path)
	if err != nil {
		t.Fatalf("mountinfo: %v", err)
	}
	return typ
}

// shortDir returns a new directory under /tmp for a socket (107-byte
// limit), removed when t ends.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csfu-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// wantDead checks that path is still a mount point and that a stat of it
// fails with ENOTCONN, as a dead FUSE mount does.
func wantDead(t *testing.T, what, path string) {
	t.Helper()
	wantMounts(t, what, 1, path)
	if _, err := os.Stat(path); !errors.Is(err, syscall.ENOTCONN) {
		t.Errorf("%s: stat %s = %v, want ENOTCONN (transport endpoint is not connected)", what, path, err)
	}
}

// TestFUSE_StageServesTheVolumeThroughFUSE stages and publishes a volume
// in process, writes through the target and reads the file in the volume
// directory; unstaging stops the FUSE server (no goroutine outlives it).
func TestFUSE_StageServesTheVolumeThroughFUSE(t *testing.T) {
	testbin.RequireFUSE(t)
	ctx := context.Background()
	a := startAttachedWith(t, csiplugin.Config{FUSE: true}, "fuse-in-process", false)
	if got := fsType(t, a.staging); got != "fuse.csiplugin" {
		t.Errorf("staging is mounted as %q, want fuse.csiplugin", got)
	}
	if err := os.WriteFile(filepath.Join(a.target, "f"), []byte("through fuse"), 0o600); err != nil {
		t.Fatalf("write through the target: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(a.volumeDir(a.id), "f")); err != nil || string(b) != "through fuse" {
		t.Errorf("volume directory holds %q, %v; want the data written through the target", b, err)
	}
	// A repeat of stage and publish changes nothing.
	a.attach(ctx, a.base, a.id, false)
	wantMounts(t, "after repeated stage and publish", 1, a.staging, a.target)

	a.detach(ctx, a.id, a.staging, a.target)
	wantMounts(t, "after unpublish and unstage", 0, a.staging)
	if _, err := os.Stat(a.target); !isNotExist(err) {
		t.Errorf("target after unpublish: stat = %v, want not exist", err)
	}
}

// TestFUSE_ReadOnlyTarget publishes a read-only target over a FUSE
// staging: writes through it fail with EROFS.
func TestFUSE_ReadOnlyTarget(t *testing.T) {
	testbin.RequireFUSE(t)
	a := startAttachedWith(t, csiplugin.Config{FUSE: true}, "fuse-ro", true)
	if err := os.WriteFile(filepath.Join(a.target, "f"), []byte("x"), 0o600); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write to a read-only target = %v, want EROFS", err)
	}
	a.detach(context.Background(), a.id, a.staging, a.target)
}

// TestFUSE_KilledPluginLeavesDeadMountsANewProcessHeals runs the plugin as
// a process, kills it with a volume published, and checks that its mounts
// die as a FUSE driver's do and that a new process cleans them up and
// serves the volume again, with its data.
func TestFUSE_KilledPluginLeavesDeadMountsANewProcessHeals(t *testing.T) {
	testbin.RequireFUSE(t)
	checkLeaks(t)
	ctx := context.Background()
	base := newTestDir(t)
	stateDir, sockDir := filepath.Join(base, "state"), shortDir(t)

	p1 := startPluginProcess(t, stateDir, sockDir, "-fuse")
	id := p1.createVolume(ctx, "fuse-killed").GetVolumeId()
	staging, target := p1.attach(ctx, base, id, false)
	if got := fsType(t, staging); got != "fuse.csiplugin" {
		t.Fatalf("staging is mounted as %q, want fuse.csiplugin", got)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("survives"), 0o600); err != nil {
		t.Fatalf("write through the target: %v", err)
	}

	p1.kill()
	wantDead(t, "after SIGKILL", target)
	wantDead(t, "after SIGKILL", staging)

	p2 := startPluginProcess(t, stateDir, sockDir, "-fuse")
	p2.repair(ctx, base, id, staging, target)

	// Stage and publish again over dead mounts, without unpublishing or
	// unstaging first: they unmount the dead ones and mount anew.
	p2.kill()
	wantDead(t, "after the second SIGKILL", target)
	p3 := startPluginProcess(t, stateDir, sockDir, "-fuse")
	p3.stageAndPublish(ctx, id, staging, target, false)
	wantMounts(t, "after stage and publish over dead mounts", 1, staging, target)
	wantReadable(t, "after stage and publish over dead mounts", target)

	p3.detach(ctx, id, staging, target)
	if left := mountsUnder(t, base); len(left) > 0 {
		t.Errorf("mounts left after the final unpublish and unstage: %v", left)
	}
}

// repair runs the repair a CO runs on a volume whose mounts are dead:
// unpublish and unstage, which must succeed and leave nothing mounted,
// then stage and publish, after which the file the heal tests wrote is
// readable through the target.
func (tp *testPlugin) repair(ctx context.Context, base, id, staging, target string) {
	tp.t.Helper()
	_, err := tp.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	mustOK(tp.t, "NodeUnpublishVolume on a dead mount", err)
	_, err = tp.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	mustOK(tp.t, "NodeUnstageVolume on a dead mount", err)
	wantMounts(tp.t, "after unpublish and unstage of dead mounts", 0, staging, target)
	tp.attach(ctx, base, id, false)
	wantReadable(tp.t, "after the repair", target)
}

// startFUSEWithData is startAttachedWith with an in-process FUSE plugin
// (skipping t where FUSE cannot run), and the file wantReadable checks
// written through the target.
func startFUSEWithData(t *testing.T, name string) attachedVolume {
	t.Helper()
	testbin.RequireFUSE(t)
	a := startAttachedWith(t, csiplugin.Config{FUSE: true}, name, false)
	if err := os.WriteFile(filepath.Join(a.target, "data"), []byte("survives"), 0o600); err != nil {
		t.Fatalf("write through the target: %v", err)
	}
	return a
}

// wantReadable checks that the file the heal tests wrote is readable
// through target (a target, or any directory that shows the volume) with
// its data.
func wantReadable(t *testing.T, what, target string) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "survives" {
		t.Errorf("%s: read %s = %q, %v; want %q", what, target, b, err, "survives")
	}
}

// TestFUSE_StopLeavesDeadMounts stops an in-process plugin with a volume
// published: Stop ends its FUSE server (no goroutine outlives the test)
// and leaves its mounts in the mount table, dead, as a killed plugin
// process does; a new plugin on the same state repairs them.
func TestFUSE_StopLeavesDeadMounts(t *testing.T) {
	ctx := context.Background()
	a := startFUSEWithData(t, "fuse-stopped")
	a.stop()
	wantDead(t, "after Stop", a.target)
	wantDead(t, "after Stop", a.staging)

	p2 := startPlugin(t, csiplugin.Config{FUSE: true, StateDir: a.cfg.StateDir})
	p2.repair(ctx, a.base, a.id, a.staging, a.target)
	p2.detach(ctx, a.id, a.staging, a.target)
	if left := mountsUnder(t, a.base); len(left) > 0 {
		t.Errorf("mounts left after the final unpublish and unstage: %v", left)
	}
}

// TestFUSE_FailDeadUnmount checks the fault injection: with
// -fuse-fail-dead-unmount, unpublish and unstage of a dead mount fail with
// Internal and leave it; once it is unmounted by someone else they succeed.
func TestFUSE_FailDeadUnmount(t *testing.T) {
	testbin.RequireFUSE(t)
	checkLeaks(t)
	ctx := context.Background()
	base := newTestDir(t)
	stateDir, sockDir := filepath.Join(base, "state"), shortDir(t)

	p1 := startPluginProcess(t, stateDir, sockDir, "-fuse", "-fuse-fail-dead-unmount")
	id := p1.createVolume(ctx, "fuse-fail").GetVolumeId()
	staging, target := p1.attach(ctx, base, id, false)
	p1.kill()

	p2 := startPluginProcess(t, stateDir, sockDir, "-fuse", "-fuse-fail-dead-unmount")
	for _, step := range []struct {
		rpc, path string
		call      func() error
	}{
		{"NodeUnpublishVolume", target, func() error {
			_, err := p2.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			return err
		}},
		{"NodeUnstageVolume", staging, func() error {
			_, err := p2.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
			return err
		}},
	} {
		wantCode(t, step.rpc+" on a dead mount", step.call(), codes.Internal)
		wantDead(t, "after the refused "+step.rpc, step.path)
		if err := syscall.Unmount(step.path, 0); err != nil {
			t.Fatalf("unmount the dead %s: %v", step.path, err)
		}
		mustOK(t, step.rpc+" once the dead mount is unmounted", step.call())
	}
	if left := mountsUnder(t, base); len(left) > 0 {
		t.Errorf("mounts left: %v", left)
	}
}

// TestFUSE_UnstageWhileAnotherNamespaceHoldsTheMount stages a volume, then
// starts a process that unshares its mounts (as a container runtime or a
// sandboxed service may), so that it holds a private copy of the FUSE
// mount. Unpublish and unstage still succeed and leave nothing mounted
// here; the copy is still served to that process, as a FUSE driver serves
// it, and once the process is gone the server ends (checkLeaks).
func TestFUSE_UnstageWhileAnotherNamespaceHoldsTheMount(t *testing.T) {
	ctx := context.Background()
	a := startFUSEWithData(t, "fuse-held")
	holder := exec.Command("sleep", "infinity")
	// Pdeathsig: the holder must not outlive a test binary that dies.
	holder.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	exited, err := testbin.Start(t, holder, nil)
	if err != nil {
		t.Fatalf("start a process in a mount namespace of its own: %v", err)
	}
	defer func() {
		_ = holder.Process.Kill()
		<-exited
	}()
	own, _ := os.Readlink("/proc/self/ns/mnt")
	if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", holder.Process.Pid)); err != nil || ns == own {
		t.Fatalf("holder's mount namespace = %q (%v), want another than %q", ns, err, own)
	}

	a.detach(ctx, a.id, a.staging, a.target)
	wantMounts(t, "after unpublish and unstage", 0, a.staging, a.target)
	wantReadable(t, "through the other namespace's copy of the staging", filepath.Join(fmt.Sprintf("/proc/%d/root", holder.Process.Pid), a.staging))
	if !strings.Contains(a.logs.String(), "still mounted in another mount namespace") {
		t.Errorf("unstage did not log that another namespace holds the mount:\n%s", a.logs.String())
	}
}

// TestFUSE_RefusedWithoutRoot runs the plugin with -fuse as an
// unprivileged user: it exits at once saying that FUSE needs root, and
// creates neither its state dir nor its socket.
func TestFUSE_RefusedWithoutRoot(t *testing.T) {
	requireRoot(t) // to run the plugin as another user
	dir := shortDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The test binary's own directory is private to root: run a copy.
	bin := filepath.Join(dir, "plugin.test")
	copyFile(t, os.Args[0], bin, 0o755)
	sock, stateDir := filepath.Join(dir, "csi.sock"), filepath.Join(dir, "state")
	cmd := exec.Command(bin, "-endpoint", sock, "-state-dir", stateDir, "-node-id", "node-1", "-fuse")
	cmd.Env = append(os.Environ(), pluginProcessEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("plugin with -fuse as uid 65534: %v, want exit status 1\n%s", err, out)
	}
	if want := "fuse needs root"; !strings.Contains(string(out), want) || !strings.Contains(string(out), "uid 65534") {
		t.Errorf("output does not say %q and name uid 65534:\n%s", want, out)
	}
	for _, p := range []string{sock, stateDir} {
		if _, err := os.Lstat(p); !isNotExist(err) {
			t.Errorf("%s after the refusal: %v, want not exist", p, err)
		}
	}
}

// copyFile copies src to dst with mode perm.
func copyFile(t *testing.T, src, dst string, perm os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
