package csiplugin_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// syncBuffer collects log output from the plugin's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testPlugin is a plugin served on a real unix socket in a temp dir, with
// a gRPC client connected to it.
type testPlugin struct {
	t        *testing.T
	plugin   *csiplugin.Plugin
	cfg      csiplugin.Config
	endpoint string
	logs     *syncBuffer
	conn     *grpc.ClientConn
	id       csipb.IdentityClient
	ctrl     csipb.ControllerClient
	node     csipb.NodeClient

	stopOnce sync.Once
	served   chan error
	// proc is the plugin's process, when it runs in one (plugin is then
	// nil); exited is closed once it has been waited for.
	proc   *exec.Cmd
	exited <-chan struct{}
}

// checkLeaks fails t if goroutines started during the test outlive it.
// Call it first: cleanups run last-in first-out, so the check runs after
// the plugins and mounts the test set up are gone.
func checkLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(leakcheck.Check(t))
}

// newTestDir returns a fresh temp dir and makes sure no mount is left
// under it when the test ends, even when the test fails half-way.
func newTestDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() {
		for _, mp := range mountsUnder(t, dir) {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil {
				t.Errorf("cleanup: unmount %s: %v", mp, err)
			}
		}
	})
	return dir
}

// startPlugin serves a plugin with cfg (StateDir defaults to a new temp
// dir) and connects a client. The plugin stops when the test ends.
func startPlugin(t *testing.T, cfg csiplugin.Config) *testPlugin {
	t.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(newTestDir(t), "state")
	}
	if cfg.NodeID == "" {
		cfg.NodeID = "node-1"
	}
	logs := &syncBuffer{}
	if cfg.Logger == nil {
		l := logrus.New()
		l.SetOutput(logs)
		l.SetLevel(logrus.DebugLevel)
		cfg.Logger = logrus.NewEntry(l)
	}
	p, err := csiplugin.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	sock := filepath.Join(t.TempDir(), "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		p.Stop()
		t.Fatalf("listen: %v", err)
	}
	tp := &testPlugin{t: t, plugin: p, cfg: p.Config(), endpoint: "unix://" + sock, logs: logs, served: make(chan error, 1)}
	go func() { tp.served <- p.Serve(l) }()
	conn, err := grpc.NewClient(tp.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tp.stop()
		t.Fatalf("dial: %v", err)
	}
	tp.connect(conn)
	t.Cleanup(func() {
		tp.stop()
		if t.Failed() {
			t.Logf("plugin log:\n%s", logs.String())
		}
	})
	return tp
}

// connect makes conn the client's connection.
func (tp *testPlugin) connect(conn *grpc.ClientConn) {
	tp.conn = conn
	tp.id = csipb.NewIdentityClient(conn)
	tp.ctrl = csipb.NewControllerClient(conn)
	tp.node = csipb.NewNodeClient(conn)
}

// stop closes the client, stops the plugin and checks that Serve returned
// nil. It is idempotent.
func (tp *testPlugin) stop() {
	tp.stopOnce.Do(func() {
		if tp.conn != nil {
			tp.conn.Close()
		}
		if tp.proc != nil {
			tp.kill()
			return
		}
		tp.plugin.Stop()
		if err := <-tp.served; err != nil {
			tp.t.Errorf("Serve returned %v after Stop, want nil", err)
		}
	})
}

// mountsUnder returns the mount points at or below dir, deepest first.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatalf("mountinfo: %v", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := strings.ReplaceAll(fields[4], `\040`, " ")
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(out)))
	return out
}

// mountCount returns how many times path is a mount point.
func mountCount(t *testing.T, path string) int {
	t.Helper()
	n := 0
	for _, mp := range mountsUnder(t, path) {
		if mp == path {
			n++
		}
	}
	return n
}

// wantCode fails the test unless err carries code.
func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Fatalf("%s: code %s (%v), want %s", what, got, err, code)
	}
}

// mustOK fails the test on err.
func mustOK(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func mountCap(mode csipb.VolumeCapability_AccessMode_Mode, flags ...string) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{MountFlags: flags}},
	}
}

var snw = csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER

// createVolume creates a single-node-writer volume named name.
func (tp *testPlugin) createVolume(ctx context.Context, name string) *csipb.Volume {
	tp.t.Helper()
	resp, err := tp.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{
		Name:               name,
		VolumeCapabilities: []*csipb.VolumeCapability{mountCap(snw)},
		CapacityRange:      &csipb.CapacityRange{RequiredBytes: 1 << 20},
	})
	mustOK(tp.t, "CreateVolume", err)
	return resp.GetVolume()
}

// volumeDir is where the plugin keeps a volume's data.
func (tp *testPlugin) volumeDir(id string) string {
	if tp.cfg.SharedDir != "" {
		return filepath.Join(tp.cfg.SharedDir, "volumes", id)
	}
	return filepath.Join(tp.cfg.StateDir, "volumes", id)
}

// attach controller-publishes, stages and publishes a volume; it returns
// the staging and target paths, both under base.
func (tp *testPlugin) attach(ctx context.Context, base, id string, readonly bool) (staging, target string) {
	tp.t.Helper()
	staging = filepath.Join(base, "staging", id)
	target = filepath.Join(base, "targets", id)
	if err := os.MkdirAll(staging, 0o750); err != nil {
		tp.t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		tp.t.Fatal(err)
	}
	tp.stageAndPublish(ctx, id, staging, target, readonly)
	return staging, target
}

// stageAndPublish controller-publishes, stages and publishes a volume at
// existing paths, as attach does, but leaves the paths to the plugin.
func (tp *testPlugin) stageAndPublish(ctx context.Context, id, staging, target string, readonly bool) {
	tp.t.Helper()
	pub, err := tp.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
		VolumeId: id, NodeId: tp.cfg.NodeID, VolumeCapability: mountCap(snw),
	})
	mustOK(tp.t, "ControllerPublishVolume", err)
	_, err = tp.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap(snw), PublishContext: pub.GetPublishContext(),
	})
	mustOK(tp.t, "NodeStageVolume", err)
	_, err = tp.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap(snw),
		PublishContext: pub.GetPublishContext(), Readonly: readonly,
	})
	mustOK(tp.t, "NodePublishVolume", err)
}

// detach undoes attach.
func (tp *testPlugin) detach(ctx context.Context, id, staging, target string) {
	tp.t.Helper()
	_, err := tp.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	mustOK(tp.t, "NodeUnpublishVolume", err)
	_, err = tp.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	mustOK(tp.t, "NodeUnstageVolume", err)
	_, err = tp.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: tp.cfg.NodeID})
	mustOK(tp.t, "ControllerUnpublishVolume", err)
}

// attachedVolume is a volume that startAttached created and attached.
type attachedVolume struct {
	*testPlugin
	base, id, staging, target string
}

// startAttached serves a plugin in mode, then creates the volume name and
// attaches it (see attach) under a fresh test dir. Bind mode skips the test
// unless it runs as root. It checks for leaks, so call it first.
func startAttached(t *testing.T, mode csiplugin.MountMode, name string, readonly bool) attachedVolume {
	t.Helper()
	if mode == csiplugin.MountModeBind {
		requireRoot(t)
	}
	return startAttachedWith(t, csiplugin.Config{MountMode: mode}, name, readonly)
}

// startAttachedWith is startAttached with a plugin of cfg.
func startAttachedWith(t *testing.T, cfg csiplugin.Config, name string, readonly bool) attachedVolume {
	t.Helper()
	checkLeaks(t)
	ctx := context.Background()
	a := attachedVolume{base: newTestDir(t)}
	a.testPlugin = startPlugin(t, cfg)
	a.id = a.createVolume(ctx, name).GetVolumeId()
	a.staging, a.target = a.attach(ctx, a.base, a.id, readonly)
	return a
}

// wantMounts reports each path that is not a mount point exactly n times,
// what being the moment checked, and returns whether all were.
func wantMounts(t *testing.T, what string, n int, paths ...string) bool {
	t.Helper()
	ok := true
	for _, p := range paths {
		if got := mountCount(t, p); got != n {
			t.Errorf("%s: %s is mounted %d times, want %d", what, p, got, n)
			ok = false
		}
	}
	return ok
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for bind mounts")
	}
}

func isNotExist(err error) bool { return errors.Is(err, os.ErrNotExist) }
