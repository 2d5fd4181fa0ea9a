package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/persistence"
)

// The killed-process test re-executes the test binary as a child that runs
// a manager against a real (synced) store and the parent's fake plugin, and
// SIGKILLs itself at one crash point.
const (
	childEnv         = "CSIACTOR_VOLUME_TEST_CHILD"
	childDirEnv      = childEnv + "_DIR"
	childEndpointEnv = childEnv + "_ENDPOINT"
	childPointEnv    = childEnv + "_POINT"
	childNotReached  = 3
)

// runChild is the child's main: register, claim, release, wait for the
// release to finish. It returns only when the crash point was not reached.
func runChild() int {
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "child: %s: %s\n", what, err)
		return 2
	}
	dir, endpoint, point := os.Getenv(childDirEnv), os.Getenv(childEndpointEnv), os.Getenv(childPointEnv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := persistence.Open(filepath.Join(dir, "state.db"), persistence.Config{})
	if err != nil {
		return fail("open store", err)
	}
	client, err := csi.Dial(ctx, endpoint)
	if err != nil {
		return fail("dial", err)
	}
	plugins := newTestPlugins(client, claim.Facts{NodeID: fakeplugin.DefaultNodeID, ControllerRequired: true, StageUnstage: true})
	system := actorkit.NewSystem(quietLogger())
	cfg := testConfig(dir)
	cfg.Logger = quietLogger()
	m, err := NewManager(system.Root, cfg, store, plugins)
	if err != nil {
		return fail("new manager", err)
	}
	m.hook = func(p, _ string) {
		if p == point {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			time.Sleep(time.Hour)
		}
	}
	if err := m.Start(ctx); err != nil {
		return fail("start", err)
	}
	if _, err := m.Register(ctx, spec("vol1")); err != nil {
		return fail("register", err)
	}
	if _, err := m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		return fail("claim", err)
	}
	if _, err := m.Release(ctx, "vol1", "a"); err != nil {
		return fail("release", err)
	}
	for {
		v, err := m.Get(ctx, "vol1")
		if err != nil {
			return fail("get", err)
		}
		if len(v.PastClaims) == 0 {
			return childNotReached
		}
		time.Sleep(time.Millisecond)
	}
}

func TestManager_Kill_AtEveryStepResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary once per crash point")
	}
	for _, point := range crashPoints {
		t.Run(point, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "csivol-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			plugin, endpoint := fakeplugin.Start(t, fullPlugin)

			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=1", childDirEnv+"="+dir,
				childEndpointEnv+"="+endpoint, childPointEnv+"="+point)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("child ended with %v, want killed at %s; output:\n%s", err, point, out)
			}
			if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("child ended with %v, want SIGKILL at %s; output:\n%s", err, point, out)
			}

			// Start again on what the killed child left.
			e := newEnvWith(t, dir, plugin, endpoint)
			ctx := ctxT(t)
			e.checkAgree()
			rec, err := e.store.Volume(ctx, "vol1")
			if err != nil {
				t.Fatalf("volume after the kill: %s", err)
			}
			if i := claim.FindClaim(rec.Claims, "a"); i >= 0 {
				want := rec.Claims[i].TargetPath
				c, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
				if err != nil || c.TargetPath != want || c.State != claim.StatePublished {
					t.Fatalf("claim retried after the kill = %+v, %v; want published at %s", c, err, want)
				}
				e.checkAgree()
				if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
					t.Fatalf("release: %s", err)
				}
			}
			e.waitFreed("vol1")
			e.checkClean()
			e.checkAgree()
		})
	}
}
