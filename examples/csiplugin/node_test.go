package csiplugin_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csiactor/csiactor/examples/csiplugin"
	"google.golang.org/grpc/codes"
)

// mountOptions returns the per-mount options (field 6 of mountinfo) of the
// last mount at path.
func mountOptions(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var opts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 5 && fields[4] == path {
			opts = strings.Split(fields[5], ",")
		}
	}
	return opts
}

func hasOption(opts []string, o string) bool {
	for _, x := range opts {
		if x == o {
			return true
		}
	}
	return false
}

func TestNode_PublishVolume_BindMount(t *testing.T) {
	ctx := context.Background()
	a := startAttached(t, csiplugin.MountModeBind, "bind", false)
	if !wantMounts(t, "after attach", 1, a.staging, a.target) {
		t.FailNow()
	}
	// Repeating stage and publish stacks nothing.
	a.attach(ctx, a.base, a.id, false)
	wantMounts(t, "after a repeat", 1, a.staging, a.target)

	// Writes through the target land in the volume directory, and the
	// other way round.
	if err := os.WriteFile(filepath.Join(a.target, "from-target"), []byte("hello"), 0o600); err != nil {
		t.Fatalf("write through target: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(a.volumeDir(a.id), "from-target")); err != nil || string(b) != "hello" {
		t.Errorf("volume dir has %q, %v; want hello", b, err)
	}
	if err := os.WriteFile(filepath.Join(a.volumeDir(a.id), "from-volume"), []byte("hi"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(a.target, "from-volume")); err != nil || string(b) != "hi" {
		t.Errorf("target has %q, %v; want hi", b, err)
	}

	stats, err := a.node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: a.id, VolumePath: a.target})
	mustOK(t, "NodeGetVolumeStats", err)
	if u := stats.GetUsage(); len(u) != 2 || u[0].GetUnit() != csipb.VolumeUsage_BYTES || u[0].GetTotal() <= 0 {
		t.Errorf("usage %v, want bytes and inodes with a total", u)
	}

	a.detach(ctx, a.id, a.staging, a.target)
	wantMounts(t, "after detach", 0, a.target, a.staging)
	if _, err := os.Lstat(a.target); !isNotExist(err) {
		t.Errorf("target still exists after unpublish: %v", err)
	}
	if fi, err := os.Stat(a.staging); err != nil || !fi.IsDir() {
		t.Errorf("staging directory (the CO's) was removed: %v", err)
	}
	// Repeating the teardown succeeds and the data stays in the volume.
	a.detach(ctx, a.id, a.staging, a.target)
	if _, err := os.Stat(filepath.Join(a.volumeDir(a.id), "from-target")); err != nil {
		t.Errorf("data gone after detach: %v", err)
	}
}

func TestNode_PublishVolume_ReadOnly(t *testing.T) {
	ctx := context.Background()
	a := startAttached(t, csiplugin.MountModeBind, "ro", true)

	if opts := mountOptions(t, a.target); !hasOption(opts, "ro") {
		t.Errorf("target mount options %v, want ro", opts)
	}
	err := os.WriteFile(filepath.Join(a.target, "nope"), []byte("x"), 0o600)
	if !errors.Is(err, syscall.EROFS) {
		t.Errorf("write through a readonly target: %v, want EROFS", err)
	}
	// The staging mount stays writable: readonly is per publication.
	if err := os.WriteFile(filepath.Join(a.staging, "yes"), []byte("x"), 0o600); err != nil {
		t.Errorf("write through staging: %v", err)
	}
	if _, err := os.Stat(filepath.Join(a.target, "yes")); err != nil {
		t.Errorf("readonly target does not show the volume's files: %v", err)
	}

	// Publishing the same target writable is a different publication.
	_, err = a.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
		VolumeId: a.id, StagingTargetPath: a.staging, TargetPath: a.target, VolumeCapability: mountCap(snw),
	})
	wantCode(t, "republish writable", err, codes.AlreadyExists)

	// A second target with mount flags and a reader-only access mode.
	second := filepath.Join(a.base, "targets", "second")
	_, err = a.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
		VolumeId: a.id, StagingTargetPath: a.staging, TargetPath: second,
		VolumeCapability: mountCap(csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY, "noexec,nosuid"),
	})
	mustOK(t, "publish second target", err)
	opts := mountOptions(t, second)
	for _, o := range []string{"ro", "noexec", "nosuid"} {
		if !hasOption(opts, o) {
			t.Errorf("second target options %v, want %s", opts, o)
		}
	}
	_, err = a.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: a.id, TargetPath: second})
	mustOK(t, "unpublish second target", err)
	a.detach(ctx, a.id, a.staging, a.target)
	if left := mountsUnder(t, a.base); len(left) > 0 {
		t.Errorf("mounts left: %v", left)
	}
}

// TestNode_PublishVolume_RepairsLostMount covers a reboot (or a crash
// between record and mount): the plugin knows the target, the mount is
// gone, and a repeated NodeStage/NodePublish brings it back.
func TestNode_PublishVolume_RepairsLostMount(t *testing.T) {
	ctx := context.Background()
	a := startAttached(t, csiplugin.MountModeBind, "lost", false)
	for _, p := range []string{a.target, a.staging} {
		if err := syscall.Unmount(p, 0); err != nil {
			t.Fatalf("unmount %s: %v", p, err)
		}
	}
	a.attach(ctx, a.base, a.id, false)
	wantMounts(t, "after the repeat", 1, a.staging, a.target)
	a.detach(ctx, a.id, a.staging, a.target)
}

func TestNode_PublishVolume_Symlink(t *testing.T) {
	ctx := context.Background()
	a := startAttached(t, csiplugin.MountModeSymlink, "link", false)
	if dest, err := os.Readlink(a.target); err != nil || dest != a.volumeDir(a.id) {
		t.Fatalf("target links to %q, %v; want %q", dest, err, a.volumeDir(a.id))
	}
	if err := os.WriteFile(filepath.Join(a.target, "f"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(a.volumeDir(a.id), "f")); err != nil || string(b) != "data" {
		t.Errorf("volume dir has %q, %v; want data", b, err)
	}
	if n := len(mountsUnder(t, a.base)); n != 0 {
		t.Errorf("symlink mode made %d mounts", n)
	}
	a.attach(ctx, a.base, a.id, false) // repeat
	a.detach(ctx, a.id, a.staging, a.target)
	if _, err := os.Lstat(a.target); !isNotExist(err) {
		t.Errorf("target still exists after unpublish: %v", err)
	}
	if _, err := os.Stat(filepath.Join(a.volumeDir(a.id), "f")); err != nil {
		t.Errorf("data gone after unpublish: %v", err)
	}
}

func TestNode_Errors(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	base := newTestDir(t)
	tp := startPlugin(t, csiplugin.Config{MountMode: csiplugin.MountModeSymlink})
	node := tp.cfg.NodeID
	pubd := tp.createVolume(ctx, "published").GetVolumeId()
	staging, target := tp.attach(ctx, base, pubd, false)
	bare := tp.createVolume(ctx, "bare").GetVolumeId()
	single := tp.createVolume(ctx, "single").GetVolumeId()
	_, err := tp.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
		VolumeId: single, NodeId: node, VolumeCapability: mountCap(csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER),
	})
	mustOK(t, "ControllerPublishVolume single", err)
	singleStaging := filepath.Join(base, "staging", "single")
	sw := mountCap(csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)
	_, err = tp.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: single, StagingTargetPath: singleStaging, VolumeCapability: sw})
	mustOK(t, "NodeStageVolume single", err)
	_, err = tp.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
		VolumeId: single, StagingTargetPath: singleStaging, TargetPath: filepath.Join(base, "targets", "single-1"), VolumeCapability: sw,
	})
	mustOK(t, "NodePublishVolume single", err)

	unknown := "vol-" + strings.Repeat("a", 32)
	inState := filepath.Join(tp.cfg.StateDir, "volumes")
	other := filepath.Join(base, "targets", "other")
	vc := mountCap(snw)
	block := &csipb.VolumeCapability{
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: snw},
		AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
	}
	stage := func(r *csipb.NodeStageVolumeRequest) func() error {
		return func() error { _, err := tp.node.NodeStageVolume(ctx, r); return err }
	}
	publish := func(r *csipb.NodePublishVolumeRequest) func() error {
		return func() error { _, err := tp.node.NodePublishVolume(ctx, r); return err }
	}
	unpublish := func(r *csipb.NodeUnpublishVolumeRequest) func() error {
		return func() error { _, err := tp.node.NodeUnpublishVolume(ctx, r); return err }
	}
	unstage := func(r *csipb.NodeUnstageVolumeRequest) func() error {
		return func() error { _, err := tp.node.NodeUnstageVolume(ctx, r); return err }
	}
	stats := func(r *csipb.NodeGetVolumeStatsRequest) func() error {
		return func() error { _, err := tp.node.NodeGetVolumeStats(ctx, r); return err }
	}
	tests := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"stage: no volume id", stage(&csipb.NodeStageVolumeRequest{StagingTargetPath: staging, VolumeCapability: vc}), codes.InvalidArgument},
		{"stage: no staging path", stage(&csipb.NodeStageVolumeRequest{VolumeId: pubd, VolumeCapability: vc}), codes.InvalidArgument},
		{"stage: relative staging path", stage(&csipb.NodeStageVolumeRequest{VolumeId: pubd, StagingTargetPath: "rel/dir", VolumeCapability: vc}), codes.InvalidArgument},
		{"stage: staging path in state dir", stage(&csipb.NodeStageVolumeRequest{VolumeId: pubd, StagingTargetPath: inState, VolumeCapability: vc}), codes.InvalidArgument},
		{"stage: no capability", stage(&csipb.NodeStageVolumeRequest{VolumeId: pubd, StagingTargetPath: staging}), codes.InvalidArgument},
		{"stage: block", stage(&csipb.NodeStageVolumeRequest{VolumeId: pubd, StagingTargetPath: staging, VolumeCapability: block}), codes.InvalidArgument},
		{"stage: unknown volume", stage(&csipb.NodeStageVolumeRequest{VolumeId: unknown, StagingTargetPath: staging, VolumeCapability: vc}), codes.NotFound},
		{"stage: not controller-published", stage(&csipb.NodeStageVolumeRequest{VolumeId: bare, StagingTargetPath: filepath.Join(base, "s2"), VolumeCapability: vc}), codes.FailedPrecondition},
		{"stage: same path, other mode", stage(&csipb.NodeStageVolumeRequest{VolumeId: pubd, StagingTargetPath: staging,
			VolumeCapability: mountCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}), codes.AlreadyExists},
		{"stage: repeat", stage(&csipb.NodeStageVolumeRequest{VolumeId: pubd, StagingTargetPath: staging, VolumeCapability: vc}), codes.OK},

		{"publish: no volume id", publish(&csipb.NodePublishVolumeRequest{TargetPath: target, StagingTargetPath: staging, VolumeCapability: vc}), codes.InvalidArgument},
		{"publish: no target", publish(&csipb.NodePublishVolumeRequest{VolumeId: pubd, StagingTargetPath: staging, VolumeCapability: vc}), codes.InvalidArgument},
		{"publish: no capability", publish(&csipb.NodePublishVolumeRequest{VolumeId: pubd, TargetPath: other, StagingTargetPath: staging}), codes.InvalidArgument},
		{"publish: no staging path", publish(&csipb.NodePublishVolumeRequest{VolumeId: pubd, TargetPath: other, VolumeCapability: vc}), codes.InvalidArgument},
		{"publish: unknown volume", publish(&csipb.NodePublishVolumeRequest{VolumeId: unknown, TargetPath: other, StagingTargetPath: staging, VolumeCapability: vc}), codes.NotFound},
		{"publish: not staged there", publish(&csipb.NodePublishVolumeRequest{VolumeId: pubd, TargetPath: other, StagingTargetPath: filepath.Join(base, "nowhere"), VolumeCapability: vc}), codes.FailedPrecondition},
		{"publish: target taken by another volume", publish(&csipb.NodePublishVolumeRequest{VolumeId: single, TargetPath: target, StagingTargetPath: singleStaging, VolumeCapability: sw}), codes.FailedPrecondition},
		{"publish: single writer, second target", publish(&csipb.NodePublishVolumeRequest{VolumeId: single, TargetPath: filepath.Join(base, "targets", "single-2"), StagingTargetPath: singleStaging, VolumeCapability: sw}), codes.FailedPrecondition},
		{"publish: repeat", publish(&csipb.NodePublishVolumeRequest{VolumeId: pubd, TargetPath: target, StagingTargetPath: staging, VolumeCapability: vc}), codes.OK},

		{"unpublish: no volume id", unpublish(&csipb.NodeUnpublishVolumeRequest{TargetPath: target}), codes.InvalidArgument},
		{"unpublish: no target", unpublish(&csipb.NodeUnpublishVolumeRequest{VolumeId: pubd}), codes.InvalidArgument},
		{"unpublish: unknown volume", unpublish(&csipb.NodeUnpublishVolumeRequest{VolumeId: unknown, TargetPath: target}), codes.NotFound},
		{"unpublish: target it never published", unpublish(&csipb.NodeUnpublishVolumeRequest{VolumeId: bare, TargetPath: target}), codes.OK},

		{"unstage: no volume id", unstage(&csipb.NodeUnstageVolumeRequest{StagingTargetPath: staging}), codes.InvalidArgument},
		{"unstage: no staging path", unstage(&csipb.NodeUnstageVolumeRequest{VolumeId: pubd}), codes.InvalidArgument},
		{"unstage: not staged", unstage(&csipb.NodeUnstageVolumeRequest{VolumeId: bare, StagingTargetPath: staging}), codes.OK},

		{"stats: no volume id", stats(&csipb.NodeGetVolumeStatsRequest{VolumePath: target}), codes.InvalidArgument},
		{"stats: no path", stats(&csipb.NodeGetVolumeStatsRequest{VolumeId: pubd}), codes.InvalidArgument},
		{"stats: unknown volume", stats(&csipb.NodeGetVolumeStatsRequest{VolumeId: unknown, VolumePath: target}), codes.NotFound},
		{"stats: path not the volume's", stats(&csipb.NodeGetVolumeStatsRequest{VolumeId: pubd, VolumePath: base}), codes.NotFound},
		{"stats: target", stats(&csipb.NodeGetVolumeStatsRequest{VolumeId: pubd, VolumePath: target}), codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantCode(t, tt.name, tt.call(), tt.code)
		})
	}
	// The probes changed nothing: the bare volume is neither staged nor
	// published, and the published one still is.
	if _, err := os.Lstat(target); err != nil {
		t.Errorf("target of the published volume: %v", err)
	}
	_, err = tp.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: bare})
	mustOK(t, "DeleteVolume bare", err)
	_, err = tp.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: pubd})
	wantCode(t, "DeleteVolume while staged and published", err, codes.FailedPrecondition)
}

// TestNode_Logs_NoSecretsOrFlags sends secrets and mount flags through
// every node RPC, including failing ones, and checks the log.
func TestNode_Logs_NoSecretsOrFlags(t *testing.T) {
	checkLeaks(t)
	ctx := context.Background()
	base := newTestDir(t)
	tp := startPlugin(t, csiplugin.Config{MountMode: csiplugin.MountModeSymlink})
	id := tp.createVolume(ctx, "quiet").GetVolumeId()
	secrets := map[string]string{"password": "hunter2-secret"}
	capFlags := mountCap(snw, "nodiratime")
	_, err := tp.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
		VolumeId: id, NodeId: tp.cfg.NodeID, VolumeCapability: capFlags, Secrets: secrets,
	})
	mustOK(t, "ControllerPublishVolume", err)
	staging := filepath.Join(base, "staging")
	target := filepath.Join(base, "target")
	_, err = tp.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeCapability: capFlags, Secrets: secrets,
	})
	mustOK(t, "NodeStageVolume", err)
	_, err = tp.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capFlags, Secrets: secrets,
	})
	mustOK(t, "NodePublishVolume", err)
	_, err = tp.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, TargetPath: target + "2", VolumeCapability: mountCap(snw, "nodiratime", "uid=hunter2-flag"), Secrets: secrets,
	})
	wantCode(t, "NodePublishVolume with a bad flag", err, codes.InvalidArgument)
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %q quotes a mount flag", err)
	}
	tp.stop()
	logs := tp.logs.String()
	if !strings.Contains(logs, "NodePublishVolume") {
		t.Fatalf("log has no NodePublishVolume line:\n%s", logs)
	}
	for _, leak := range []string{"hunter2", "nodiratime", "password"} {
		if strings.Contains(logs, leak) {
			t.Errorf("log contains %q:\n%s", leak, logs)
		}
	}
}

// With LoseMountsOnStart, a restarted plugin has undone every staging and
// publication but kept their records, and publishes again on a repeated
// NodeStageVolume and NodePublishVolume.
func TestPlugin_LoseMountsOnStart(t *testing.T) {
	for _, mode := range []csiplugin.MountMode{csiplugin.MountModeSymlink, csiplugin.MountModeBind} {
		t.Run(string(mode), func(t *testing.T) {
			a := startAttached(t, mode, "lose", false)
			ctx := context.Background()
			if err := os.WriteFile(filepath.Join(a.target, "f"), []byte("data"), 0o600); err != nil {
				t.Fatal(err)
			}
			a.stop()
			b := startPlugin(t, csiplugin.Config{MountMode: mode, StateDir: a.cfg.StateDir, LoseMountsOnStart: true})
			if _, err := os.Lstat(a.target); !isNotExist(err) {
				t.Errorf("target after a start that loses mounts: lstat %v, want gone", err)
			}
			if mode == csiplugin.MountModeBind {
				wantMounts(t, "after the restart", 0, a.staging)
			}
			_, err := b.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
				VolumeId: a.id, StagingTargetPath: a.staging, VolumeCapability: mountCap(snw), PublishContext: map[string]string{},
			})
			mustOK(t, "NodeStageVolume again", err)
			_, err = b.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
				VolumeId: a.id, StagingTargetPath: a.staging, TargetPath: a.target, VolumeCapability: mountCap(snw),
			})
			mustOK(t, "NodePublishVolume again", err)
			if got, err := os.ReadFile(filepath.Join(a.target, "f")); err != nil || string(got) != "data" {
				t.Errorf("data through the target published again: %q, %v", got, err)
			}
			b.detach(ctx, a.id, a.staging, a.target)
		})
	}
}
