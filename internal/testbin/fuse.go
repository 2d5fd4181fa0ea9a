package testbin

import (
	"os"
	"testing"
)

// RequireFUSE skips t unless the example plugin's FUSE mode can run here:
// as root (it mounts with mount(2), without fusermount) and with /dev/fuse.
func RequireFUSE(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the example plugin's FUSE mode mounts with mount(2)")
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("needs /dev/fuse for the example plugin's FUSE mode: %v", err)
	}
	f.Close()
}
