package proxy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/csiactor/csiactor/internal/hostpath"
)

// sanityDriverEnv picks the plugin TestSanity runs the suite through the
// proxy of: unset for the example plugin, "hostpath" for the hostpath
// driver (TestSanity_Hostpath sets it for the child process it starts).
const sanityDriverEnv = "CSIACTOR_PROXY_SANITY_DRIVER"

// sanityRan guards Ginkgo's RunSpecs, which may run once per process.
var sanityRan atomic.Bool

// TestSanity runs the kubernetes-csi sanity suite through the CSI proxy of
// the example plugin (or of the hostpath driver, see sanityDriverEnv).
func TestSanity(t *testing.T) {
	if sanityRan.Swap(true) {
		t.Skip("Ginkgo runs specs once per process; the suite already ran (use -count=1)")
	}
	e := newEnv(t)
	cfg := sanity.NewTestConfig()
	name := "example"
	if os.Getenv(sanityDriverEnv) == "hostpath" {
		name = "hostpath"
		e.register("hp", e.hostpathSpec())
	} else {
		e.register("ex", e.exampleSpec(filepath.Join(e.dir, "s"), ""))
		cfg.TestNodeVolumeAttachLimit = true
		cfg.TestVolumeMutableParameters = map[string]string{"iops": "3000"}
	}
	t.Logf("sanity through the proxy of %s", name)
	cfg.Address = e.proxySocket(name)
	cfg.TargetPath = filepath.Join(e.dir, "target")
	cfg.StagingPath = filepath.Join(e.dir, "staging")
	sanity.Test(t, cfg)
}

// TestSanity_Hostpath runs the suite through the proxy of the hostpath
// driver, in a child process (Ginkgo runs once per process).
func TestSanity_Hostpath(t *testing.T) {
	if os.Getenv(sanityDriverEnv) != "" {
		t.Skip("child process")
	}
	hostpath.Binary(t) // skips where it is not available
	cmd := exec.Command(os.Args[0], "-test.run=^TestSanity$", "-test.count=1", "-test.v", "-ginkgo.no-color")
	cmd.Env = append(os.Environ(), sanityDriverEnv+"=hostpath", "GORACE=atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sanity through the hostpath driver's proxy failed: %v\n%s", err, out)
	}
	for _, m := range regexp.MustCompile(`(?m)^.*(Ran \d+ of \d+ Specs|\d+ Passed \|).*$`).FindAll(out, -1) {
		t.Logf("hostpath: %s", m)
	}
	if !regexp.MustCompile(`sanity through the proxy of hostpath`).Match(out) {
		t.Errorf("child did not run the suite through the hostpath driver:\n%s", out)
	}
}
