package csiplugin_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
)

// sanityModeEnv picks the plugin's mount mode for TestSanity, or "fuse"
// for the FUSE mode; the symlink-mode and FUSE tests set it for the child
// process they start.
const sanityModeEnv = "CSIPLUGIN_SANITY_MOUNT_MODE"

// sanityFUSE is the sanityModeEnv value of the FUSE mode.
const sanityFUSE = "fuse"

// sanityRan guards Ginkgo's RunSpecs, which may run once per process.
var sanityRan atomic.Bool

// TestSanity runs the kubernetes-csi sanity suite against the plugin on a
// real unix socket: with bind mounts as root, with symlinks otherwise.
func TestSanity(t *testing.T) {
	if sanityRan.Swap(true) {
		t.Skip("Ginkgo runs specs once per process; the suite already ran (use -count=1)")
	}
	checkLeaks(t)
	base := newTestDir(t)
	mode := csiplugin.MountMode(os.Getenv(sanityModeEnv))
	useFUSE := mode == sanityFUSE
	if useFUSE {
		mode = ""
	}
	tp := startPlugin(t, csiplugin.Config{
		StateDir:          filepath.Join(base, "state"),
		MaxVolumesPerNode: 4,
		Zone:              "zone-1",
		MountMode:         mode,
		FUSE:              useFUSE,
	})
	t.Logf("mount mode %s, fuse %t", tp.cfg.MountMode, tp.cfg.FUSE)

	cfg := sanity.NewTestConfig()
	cfg.Address = tp.endpoint
	cfg.TargetPath = filepath.Join(base, "target")
	cfg.StagingPath = filepath.Join(base, "staging")
	cfg.TestNodeVolumeAttachLimit = true
	cfg.TestVolumeMutableParameters = map[string]string{"iops": "3000"}
	sanity.Test(t, cfg)

	if left := mountsUnder(t, base); len(left) > 0 {
		t.Errorf("mounts left after the suite: %v", left)
	}
	tp.stop()
}

// TestSanity_SymlinkMode runs the suite again, as root, with the
// unprivileged symlink mode, in a child process (Ginkgo runs once per
// process).
func TestSanity_SymlinkMode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: TestSanity already runs in symlink mode")
	}
	runSanityChild(t, string(csiplugin.MountModeSymlink), "mount mode symlink")
}

// TestSanity_FUSE runs the suite with the FUSE mode, in a child process.
func TestSanity_FUSE(t *testing.T) {
	testbin.RequireFUSE(t)
	runSanityChild(t, sanityFUSE, "fuse true")
}

// runSanityChild runs TestSanity in a child process with sanityModeEnv
// set to mode, and checks that the child logged want (its mode).
func runSanityChild(t *testing.T, mode, want string) {
	t.Helper()
	if os.Getenv(sanityModeEnv) != "" {
		t.Skip("child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSanity$", "-test.count=1", "-test.v", "-ginkgo.no-color")
	cmd.Env = append(os.Environ(), sanityModeEnv+"="+mode, "GORACE=atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sanity in mode %s failed: %v\n%s", mode, err, out)
	}
	for _, m := range regexp.MustCompile(`(?m)^.*(Ran \d+ of \d+ Specs|\d+ Passed \|).*$`).FindAll(out, -1) {
		t.Logf("mode %s: %s", mode, m)
	}
	if !strings.Contains(string(out), want) {
		t.Errorf("child did not run in mode %s (no %q in its output):\n%s", mode, want, out)
	}
}
