package csiplugin_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// TestPlugin_Restart_KeepsState stops a plugin with a volume published and
// starts a new one on the same state dir: it knows the volume, its
// controller publication, staging and target, and tears them down.
func TestPlugin_Restart_KeepsState(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	base := newTestDir(t)
	stateDir := filepath.Join(base, "state")
	first := startPlugin(t, csiplugin.Config{StateDir: stateDir})
	id := first.createVolume(ctx, "survivor").GetVolumeId()
	staging, target := first.attach(ctx, base, id, false)
	if err := os.WriteFile(filepath.Join(target, "kept"), []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	first.stop()

	second := startPlugin(t, csiplugin.Config{StateDir: stateDir})
	list, err := second.ctrl.ListVolumes(ctx, &csipb.ListVolumesRequest{})
	mustOK(t, "ListVolumes", err)
	if len(list.GetEntries()) != 1 || list.GetEntries()[0].GetVolume().GetVolumeId() != id {
		t.Fatalf("restarted plugin lists %v, want only %s", list.GetEntries(), id)
	}
	// The controller publication survived: a different readonly setting is
	// a conflict, the same one a repeat.
	_, err = second.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
		VolumeId: id, NodeId: second.cfg.NodeID, VolumeCapability: mountCap(snw), Readonly: true,
	})
	wantCode(t, "ControllerPublishVolume readonly after restart", err, codes.AlreadyExists)
	// So did the staging and the target: deleting is refused, and a repeat
	// of the whole attach stacks no mount.
	_, err = second.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, "DeleteVolume after restart", err, codes.FailedPrecondition)
	second.attach(ctx, base, id, false)
	if second.cfg.MountMode == csiplugin.MountModeBind {
		for _, p := range []string{staging, target} {
			if n := mountCount(t, p); n != 1 {
				t.Errorf("%s mounted %d times after restart and repeat, want 1", p, n)
			}
		}
	}
	second.detach(ctx, id, staging, target)
	if left := mountsUnder(t, base); len(left) > 0 {
		t.Errorf("mounts left after the restarted plugin's teardown: %v", left)
	}
	if b, err := os.ReadFile(filepath.Join(second.volumeDir(id), "kept")); err != nil || string(b) != "k" {
		t.Errorf("volume data after restart: %q, %v", b, err)
	}
	_, err = second.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
	mustOK(t, "DeleteVolume", err)
}

func TestNew_StateDirLocked(t *testing.T) {
	checkLeaks(t)
	tp := startPlugin(t, csiplugin.Config{MountMode: csiplugin.MountModeSymlink})
	_, err := csiplugin.New(csiplugin.Config{StateDir: tp.cfg.StateDir, Logger: quietLogger()})
	if !errors.Is(err, csiplugin.ErrStateDirLocked) {
		t.Fatalf("second New on a held state dir: %v, want ErrStateDirLocked", err)
	}
	tp.stop()
	p, err := csiplugin.New(csiplugin.Config{StateDir: tp.cfg.StateDir, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("New after Stop: %v", err)
	}
	p.Stop()
}

func TestNew_CorruptState(t *testing.T) {
	tests := []struct {
		name, content string
	}{
		{"not json", "{"},
		{"future schema", `{"version": 99, "volumes": {}}`},
		{"id mismatch", `{"version": 1, "volumes": {"vol-00000000000000000000000000000000": {"id": "../x"}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "state.json")
			if err := os.WriteFile(file, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := csiplugin.New(csiplugin.Config{StateDir: dir, Logger: quietLogger()})
			if !errors.Is(err, csiplugin.ErrCorruptState) {
				t.Fatalf("New: %v, want ErrCorruptState", err)
			}
			if !strings.Contains(err.Error(), file) {
				t.Errorf("error %q does not name %s", err, file)
			}
			if b, _ := os.ReadFile(file); string(b) != tt.content {
				t.Error("New changed a state file it could not read")
			}
		})
	}
}

func TestNew_BadConfig(t *testing.T) {
	_, err := csiplugin.New(csiplugin.Config{})
	if !errors.Is(err, csiplugin.ErrInvalidConfig) || !strings.Contains(err.Error(), "state_dir") {
		t.Errorf("New without state dir: %v, want ErrInvalidConfig naming state_dir", err)
	}
	err = csiplugin.Run(context.Background(), csiplugin.Config{StateDir: t.TempDir()})
	if !errors.Is(err, csiplugin.ErrInvalidConfig) || !strings.Contains(err.Error(), "endpoint") {
		t.Errorf("Run without endpoint: %v, want ErrInvalidConfig naming endpoint", err)
	}
}

// runPlugin starts Run in a goroutine and returns a client connected to it
// and a function that cancels Run and returns its error.
func runPlugin(t *testing.T, cfg csiplugin.Config) (csipb.IdentityClient, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- csiplugin.Run(ctx, cfg) }()
	path, err := csiplugin.ParseEndpoint(cfg.Endpoint)
	if err != nil {
		cancel()
		<-done
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()),
		// The socket appears after the dial starts: retry quickly.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}}))
	if err != nil {
		cancel()
		<-done
		t.Fatal(err)
	}
	var once bool
	var runErr error
	stop := func() error {
		if !once {
			once = true
			conn.Close()
			cancel()
			runErr = <-done
		}
		return runErr
	}
	t.Cleanup(func() { stop() })
	return csipb.NewIdentityClient(conn), stop
}

// probe waits (bounded, not timed) for the plugin to answer Probe.
func probe(t *testing.T, id csipb.IdentityClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := id.Probe(ctx, &csipb.ProbeRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	if !resp.GetReady().GetValue() {
		t.Error("Probe: not ready")
	}
}

func TestRun_ServesAndRemovesSocket(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "csi.sock")
	cfg := csiplugin.Config{Endpoint: "unix://" + sock, StateDir: filepath.Join(dir, "state"), Logger: quietLogger()}
	id, stop := runPlugin(t, cfg)
	probe(t, id)
	info, err := id.GetPluginInfo(context.Background(), &csipb.GetPluginInfoRequest{})
	mustOK(t, "GetPluginInfo", err)
	if info.GetName() != csiplugin.DefaultName || info.GetVendorVersion() != csiplugin.DefaultVersion {
		t.Errorf("plugin info %q %q, want the defaults", info.GetName(), info.GetVendorVersion())
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %v, %v; want mode 0600", fi, err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run returned %v after cancel, want nil", err)
	}
	if _, err := os.Lstat(sock); !isNotExist(err) {
		t.Errorf("socket left after Run returned: %v", err)
	}
	// The state dir lock is released too.
	p, err := csiplugin.New(csiplugin.Config{StateDir: cfg.StateDir, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("New after Run: %v", err)
	}
	p.Stop()
}

func TestRun_ReplacesStaleSocket(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	// A socket file nobody listens on, as a killed plugin leaves it.
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	id, stop := runPlugin(t, csiplugin.Config{Endpoint: sock, StateDir: filepath.Join(dir, "state"), Logger: quietLogger()})
	probe(t, id)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestRun_EndpointTaken(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, endpoint string
		want           error
	}{
		{"live socket", "unix://" + live, csiplugin.ErrEndpointInUse},
		{"regular file", "unix://" + file, csiplugin.ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := csiplugin.Run(context.Background(), csiplugin.Config{
				Endpoint: tt.endpoint, StateDir: filepath.Join(t.TempDir(), "state"), Logger: quietLogger(),
			})
			if !errors.Is(err, tt.want) {
				t.Fatalf("Run: %v, want %v", err, tt.want)
			}
		})
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("Run removed another process's socket: %v", err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "not a socket" {
		t.Errorf("Run touched a regular file at the endpoint: %q, %v", b, err)
	}
}

func quietLogger() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}
