package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/csiactor/csiactor/internal/mountinfo"
)

// removeDevDir removes the -dev data dir. Claims still published when the
// agent stops keep their bind mounts (a real agent keeps them for the next
// start); in -dev there is no next start, so every mount under dir is
// detached first, deepest first. Removing the tree through a live bind
// mount would instead delete the volume's files through it and leave the
// mount behind.
func removeDevDir(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	mounts, err := mountinfo.Under(real)
	if err != nil {
		return err
	}
	var errs []string
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL && err != syscall.ENOENT {
			errs = append(errs, fmt.Sprintf("unmount %s: %s", m, err))
		}
	}
	if len(errs) > 0 {
		// Leave the tree: removing it now would reach through the mounts.
		return fmt.Errorf("dev data dir %s left in place: %s", dir, strings.Join(errs, "; "))
	}
	return os.RemoveAll(dir)
}
