package cli

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/internal/mountinfo"
)

// A -dev data dir with a live bind mount in it is removed without reaching
// through the mount: the mount is detached, the volume's files survive.
func TestRemoveDevDir_DetachesMountsFirst(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for bind mounts")
	}
	volume := t.TempDir() // stands for the plugin's volume, outside the dev dir
	if err := os.WriteFile(filepath.Join(volume, "data.txt"), []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	dev, err := os.MkdirTemp("", "csiactor-devclean-")
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dev, "volumes", "p", "per-alloc", "a", "v", "rw")
	if err := os.MkdirAll(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(volume, target, "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(target, syscall.MNT_DETACH); _ = os.RemoveAll(dev) })

	mounts, err := mountinfo.Under(dev)
	if err != nil || !slices.Contains(mounts, target) {
		t.Fatalf("mountsUnder(%s) = %v, %v; want it to list %s", dev, mounts, err, target)
	}
	if err := removeDevDir(dev); err != nil {
		t.Fatalf("removeDevDir: %v", err)
	}
	if _, err := os.Stat(dev); !os.IsNotExist(err) {
		t.Errorf("dev dir still there: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(volume, "data.txt")); err != nil || string(got) != "keep me" {
		t.Errorf("volume file after removeDevDir = %q, %v; want it untouched", got, err)
	}
	if mountinfo.IsMountPoint(target) {
		t.Errorf("mount %s still there", target)
	}
}
