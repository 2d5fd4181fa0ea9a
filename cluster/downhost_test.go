package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// TestCluster_DownHostFencedAndCleanedUp, with real processes and real
// bind mounts: three agents, each running the example plugin on one shared
// storage dir (so every host's plugin knows every volume). A host holding
// a write claim is SIGKILLed: its claim stays and blocks the others with a
// 409 that names it; `csiactor node list` shows it down after the lease
// TTL; `csiactor node fence` through another agent (which has a
// controller) unpublishes the volume from the dead host's node ID and
// frees the claim, so a third host claims the volume; the dead host,
// started again, finds its claim fenced, releases it locally (its plugin
// survived the kill and still had the volume staged and published) and
// its target and staging mounts are gone from /proc/self/mountinfo, while
// the new holder's stay.
func TestCluster_DownHostFencedAndCleanedUp(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the example plugin bind-mounts the volumes")
	}
	t.Cleanup(leakcheck.Check(t))
	srv := etcdtest.Start(t)
	c := newProcCluster(t, srv.Endpoint())
	shared := filepath.Join(c.base, "storage")
	var agents []*procAgent
	for i := 1; i <= 3; i++ {
		node := fmt.Sprintf("n%d", i)
		a := c.addAgent(node, fmt.Sprintf(`  - id: example
    plugin: example
    type: monolith
    command: [%q, example-plugin, -state-dir, %q, -shared-dir, %q, -node-id, csi-%s, -mount-mode, bind]
`, c.bin, filepath.Join(c.base, node, "plugin"), shared, node))
		a.start()
		t.Cleanup(a.checkLogs)
		agents = append(agents, a)
	}
	n1, n2, n3 := agents[0], agents[1], agents[2]
	ctx := context.Background()
	for _, a := range agents {
		waitPluginHealthy(t, a, "example")
	}

	const vol, am = "disk", "single-node-writer"
	spec := runtime.CreateVolumeSpec{ID: vol, VolumeSpec: runtime.VolumeSpec{
		Plugin:       "example",
		Capabilities: []runtime.Capability{{AccessMode: am, AttachmentMode: "file-system"}},
	}, CapacityBytes: 1 << 20}
	if _, err := n1.mustClient().CreateVolume(ctx, spec); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		eventually(t, "volume on "+a.node, func() (bool, error) {
			_, err := a.mustClient().Volume(ctx, vol)
			if errors.Is(err, runtime.ErrNotFound) {
				return false, nil
			}
			return err == nil, err
		})
	}
	claim, err := n2.mustClient().Claim(ctx, vol, claimReq("app", "write", am))
	if err != nil {
		t.Fatal(err)
	}
	n2Mounts := mountsUnder(n2.dataDir)
	if len(n2Mounts) < 2 || !slices.Contains(n2Mounts, claim.TargetPath) {
		t.Fatalf("n2's mounts %v: want the staging and the target %s", n2Mounts, claim.TargetPath)
	}
	// Written on n2's host, through its target.
	if err := os.WriteFile(filepath.Join(claim.TargetPath, "owner"), []byte("n2"), 0o644); err != nil {
		t.Fatal(err)
	}

	n2.kill()
	// Its claim stays and blocks: 409, naming the host.
	_, err = n3.mustClient().Claim(ctx, vol, claimReq("new", "write", am))
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Status != 409 || !strings.Contains(apiErr.Message, `host "n2"`) {
		t.Fatalf("claim on n3 while n2 (killed) holds the volume = %v, want a 409 naming host \"n2\"", err)
	}
	// After the TTL, the CLI lists n2 down, with its claim.
	downRE := regexp.MustCompile(`(?m)^n2\s+down\s+.*\s1\s*$`)
	testbin.Eventually(t, "node list to show n2 down", procDeadline, 100*time.Millisecond, func() (bool, string) {
		out, err := runBinCLI(c.bin, n1.addr, "node", "list")
		return err == nil && downRE.MatchString(out), out + fmt.Sprint(err)
	})
	// Down is not enough: the claim still blocks until n2 is fenced.
	if _, err := n3.mustClient().Claim(ctx, vol, claimReq("new", "write", am)); !errors.Is(err, runtime.ErrConflict) {
		t.Fatalf("claim on n3 while n2 is down and not fenced = %v, want ErrConflict", err)
	}
	out, err := runBinCLI(c.bin, n1.addr, "node", "fence", "-json", "n2")
	if err != nil {
		t.Fatalf("node fence n2 through n1: %v\n%s", err, out)
	}
	if !strings.Contains(out, `"controller_unpublished": true`) && !strings.Contains(out, `"controller_unpublished":true`) {
		t.Fatalf("node fence n2: %s, want the claim controller-unpublished", out)
	}
	claim3, err := n3.mustClient().Claim(ctx, vol, claimReq("new", "write", am))
	if err != nil {
		t.Fatalf("claim on n3 after the fence: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(claim3.TargetPath, "owner")); err != nil || string(b) != "n2" {
		t.Fatalf("n3 reads %q, %v from the volume; want what n2 wrote (shared storage)", b, err)
	}
	// The killed host's plugin still has the volume staged and published.
	for _, m := range n2Mounts {
		if !mountinfo.IsMountPoint(m) {
			t.Fatalf("%s no longer mounted before n2 came back", m)
		}
	}

	// n2 comes back: it releases its fenced claim locally.
	n2.start()
	testbin.Eventually(t, "n2's mounts gone", procDeadline, 50*time.Millisecond, func() (bool, string) {
		left := mountsUnder(n2.dataDir)
		return len(left) == 0, fmt.Sprint(left)
	})
	eventually(t, "n2 without its claim", func() (bool, error) {
		v, err := n2.mustClient().Volume(ctx, vol)
		if err != nil {
			return false, err
		}
		return !slices.ContainsFunc(slices.Concat(v.Claims, v.PastClaims), func(c runtime.Claim) bool { return c.Alloc == "app" }), nil
	})
	v, err := n1.mustClient().Volume(ctx, vol)
	if err != nil || len(v.Claims) != 1 || v.Claims[0].Host != "n3" || v.Claims[0].Alloc != "new" {
		t.Fatalf("claims after n2 came back: %+v, %v; want only n3's", v.Claims, err)
	}
	if !mountinfo.IsMountPoint(claim3.TargetPath) {
		t.Fatalf("n3's target %s is no longer mounted", claim3.TargetPath)
	}

	// n3 releases; everything unmounts; the agents stop cleanly.
	if _, err := n3.mustClient().Release(ctx, vol, "new"); err != nil {
		t.Fatal(err)
	}
	testbin.Eventually(t, "no mounts left", procDeadline, 50*time.Millisecond, func() (bool, string) {
		left := mountsUnder(c.base)
		return len(left) == 0, fmt.Sprint(left)
	})
	for _, a := range agents {
		a.stop()
	}
}

// waitPluginHealthy waits until a's plugin name has a healthy node.
func waitPluginHealthy(t *testing.T, a *procAgent, name string) {
	t.Helper()
	testbin.Eventually(t, name+" healthy on "+a.node, procDeadline, 50*time.Millisecond, func() (bool, string) {
		p, err := a.mustClient().Plugin(context.Background(), name)
		return err == nil && p.NodesHealthy > 0 && p.ControllersHealthy > 0, fmt.Sprintf("%+v %v", p, err)
	})
}

// runBinCLI runs the csiactor CLI (the binary) against addr.
func runBinCLI(bin, addr string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), procDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "CSIACTOR_ADDR="+addr)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
