package e2e

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

// TestAgent_ClaimOptions claims one multi-node-multi-writer volume with
// per-claim options through the CLI and the HTTP API, with each driver:
// a write claim with its own mount flag and a mount group (the example
// plugin applies it itself, VOLUME_MOUNT_GROUP; for the hostpath driver,
// which lacks it, the agent does), a read-only write claim, and each
// refusal (other options for the same alloc, another group, an SELinux
// context on a host without SELinux), which changes nothing. After a
// SIGKILL and the loss of a target's mount, the restarted agent publishes
// it again with the same options. Throughout, the driver's bookkeeping and
// the mount table agree with the claims.
func TestAgent_ClaimOptions(t *testing.T) {
	defer leakcheck.Check(t)()
	if !isRoot() {
		t.Skip("needs root: the options are checked on real bind mounts")
	}
	forEachDriver(t, func(t *testing.T, d driver) {
		h := newHost(t)
		a := h.startWith(d)
		h.createVolume(d, "logs", "multi-node-multi-writer")
		// The hostpath driver bind-mounts file-system volumes without
		// their mount flags (read-only it does apply): a claim's flags
		// reach it, but show in the mount table only with the example
		// plugin.
		flagged := func(flag string, rest ...string) []string {
			if d.alloc == hostpathDriver.alloc {
				return rest
			}
			return append(rest, flag)
		}
		claim := func(alloc string, opts ...string) []string {
			return append(append([]string{"volume", "claim", "-alloc", alloc, "-mode", "write", "-access-mode", "multi-node-multi-writer"}, opts...), "logs")
		}

		// CLI: a write claim with a mount flag and a group.
		web1 := strings.TrimSpace(h.ok(claim("web1", "-mount-flag", "noexec", "-mount-group", "4321")...))
		checkMount(t, web1, flagged("noexec", "rw"), nil)
		checkGroup(t, web1, 4321)
		if err := os.WriteFile(filepath.Join(web1, "f"), []byte("x"), 0o644); err != nil {
			t.Fatalf("write through web1's target: %v", err)
		}
		// Idempotent with the same options; a conflict with others.
		if again := strings.TrimSpace(h.ok(claim("web1", "-mount-flag", "noexec", "-mount-group", "4321")...)); again != web1 {
			t.Errorf("claiming again printed %q, want %q", again, web1)
		}
		h.fails(1, `alloc "web1" already holds a write claim on volume "logs" with other options: read_only false, not true`,
			claim("web1", "-read-only", "-mount-flag", "noexec", "-mount-group", "4321")...)
		h.fails(1, "other mount_flags", claim("web1", "-mount-group", "4321")...)

		// CLI: a read-only claim of a write mode, same group.
		web2 := strings.TrimSpace(h.ok(claim("web2", "-read-only", "-mount-group", "4321")...))
		checkMount(t, web2, []string{"ro"}, nil)
		if err := os.WriteFile(filepath.Join(web2, "g"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
			t.Errorf("writing through read-only claim web2's target: got %v, want EROFS", err)
		}

		// Refusals, each changing nothing.
		h.fails(1, `with mount_group 4321 (alloc "web1"); the claim asks for mount_group 999`,
			claim("web3", "-mount-group", "999")...)
		h.fails(1, "this host has no SELinux",
			claim("web3", "-selinux-context", "system_u:object_r:container_file_t:s0:c1,c2")...)
		h.fails(2, "-mount-flag", claim("web3", "-mount-flag", "")...)
		h.fails(2, "-mount-group", claim("web3", "-mount-group", "-5")...)
		if _, ok := claimOf(h.volume("logs"), "web3"); ok {
			t.Errorf("a refused claim of web3 is on the volume: %s", describe(h.volume("logs")))
		}

		// The HTTP API: the same options, the same refusals.
		cl, err := api.NewClient(h.address())
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		req := func(alloc string) runtime.ClaimRequest {
			return runtime.ClaimRequest{Alloc: alloc, Mode: "write", AccessMode: "multi-node-multi-writer", AttachmentMode: "file-system"}
		}
		r4 := req("web4")
		r4.ReadOnly, r4.MountFlags = true, []string{"nodev"}
		c4, err := cl.Claim(ctx, "logs", r4)
		if err != nil {
			t.Fatalf("POST claims web4: %v", err)
		}
		if !c4.ReadOnly || c4.MountFlagCount != 1 || c4.MountGroup != nil {
			t.Errorf("web4's claim = %+v, want read_only, 1 mount flag, no group", c4)
		}
		checkMount(t, c4.TargetPath, flagged("nodev", "ro"), nil)
		g := int64(7)
		r5 := req("web5")
		r5.MountGroup = &g
		var ae *api.Error
		if _, err := cl.Claim(ctx, "logs", r5); !errors.As(err, &ae) || ae.Status != http.StatusConflict || !strings.Contains(ae.Message, "mount_group 4321") || !strings.Contains(ae.Message, "mount_group 7") {
			t.Errorf("POST claims web5 with group 7: got %v, want a 409 naming 4321 and 7", err)
		}
		r5.MountGroup, r5.SELinuxContext = nil, "system_u:object_r:container_file_t:s0"
		if _, err := cl.Claim(ctx, "logs", r5); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, "this host has no SELinux") {
			t.Errorf("POST claims web5 with an SELinux context: got %v, want a 400 saying the host has no SELinux", err)
		}
		r4.ReadOnly = false
		if _, err := cl.Claim(ctx, "logs", r4); !errors.As(err, &ae) || ae.Status != http.StatusConflict || !strings.Contains(ae.Message, "read_only true, not false") {
			t.Errorf("POST claims web4 again without read_only: got %v, want a 409", err)
		}
		v := h.volume("logs")
		if _, ok := claimOf(v, "web5"); ok || len(v.Claims) != 3 {
			t.Errorf("after the refusals: %s; want web1, web2 and web4 only", describe(v))
		}
		c1, _ := claimOf(v, "web1")
		if c1.MountFlagCount != 1 || c1.MountGroup == nil || *c1.MountGroup != 4321 || c1.ReadOnly {
			t.Errorf("web1's claim = %+v, want 1 mount flag, group 4321", c1)
		}
		if out := h.ok("volume", "status", "-json", "logs"); strings.Contains(out, "noexec") || strings.Contains(out, "nodev") {
			t.Errorf("volume status shows a claim's mount flag:\n%s", out)
		}
		h.checkSettled(d, "after the claims")

		// A SIGKILL, web2's target lost: the restart publishes it again,
		// read-only as before.
		a.signal(syscall.SIGKILL)
		a.wait(shutdownDeadline)
		a.checkNoRace()
		if err := syscall.Unmount(web2, 0); err != nil {
			t.Fatalf("unmount web2's target: %v", err)
		}
		a = h.startAgent()
		h.waitPluginHealthy(d)
		h.checkSettled(d, "after the restart")
		checkMount(t, web1, flagged("noexec", "rw"), nil)
		checkMount(t, web2, []string{"ro"}, nil)
		checkMount(t, c4.TargetPath, flagged("nodev", "ro"), nil)
		checkGroup(t, web1, 4321)

		for _, alloc := range []string{"web1", "web2", "web4"} {
			h.ok("volume", "release", "-alloc", alloc, "logs")
		}
		h.checkSettled(d, "after the releases")
		if m := mountsUnder(h.dataDir); len(m) > 0 {
			t.Errorf("mounts left under the data dir after every release: %v", m)
		}
		a.stop()
	})
}

// checkMount checks that path is a mount point whose top mount has every
// option of want and none of not (per-mount options, mountinfo field 6).
func checkMount(t *testing.T, path string, want, not []string) {
	t.Helper()
	opts, ok := mountOptions(t, path)
	if !ok {
		t.Errorf("%s is not a mount point", path)
		return
	}
	for _, o := range want {
		if !slices.Contains(opts, o) {
			t.Errorf("%s is mounted with %v, want %s among them", path, opts, o)
		}
	}
	for _, o := range not {
		if slices.Contains(opts, o) {
			t.Errorf("%s is mounted with %v, want no %s", path, opts, o)
		}
	}
}

// mountOptions returns the per-mount options of the last (top) mount at
// path in /proc/self/mountinfo.
func mountOptions(t *testing.T, path string) ([]string, bool) {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		real = path
	}
	var opts []string
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 5 && (fields[4] == path || fields[4] == real) {
			opts, found = strings.Split(fields[5], ","), true
		}
	}
	return opts, found
}

// checkGroup checks that path has group gid and the setgid bit.
func checkGroup(t *testing.T, path string, gid int) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Errorf("stat %s: %v", path, err)
		return
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Gid) != gid || fi.Mode()&os.ModeSetgid == 0 || fi.Mode()&0o070 != 0o070 {
		t.Errorf("%s has group %d and mode %s, want group %d, g+rwx and setgid", path, st.Gid, fi.Mode(), gid)
	}
}
