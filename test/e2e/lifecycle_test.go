package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/internal/leakcheck"
)

// TestAgent_Lifecycle runs a volume's life through the CLI with each
// driver: create, claim (a single-node-writer volume by one writer, a
// multi-node-multi-writer one by a writer and a reader), a SIGKILL of the
// agent and a restart, release and delete. After every step that settles,
// the driver's own bookkeeping and the mount table hold exactly what the
// claims own.
func TestAgent_Lifecycle(t *testing.T) {
	defer leakcheck.Check(t)()
	forEachDriver(t, func(t *testing.T, d driver) {
		h := newHost(t)
		h.writeConfig(d.allocation(h))
		a := h.startAgent()
		h.waitPluginHealthy(d)

		h.createVolume(d, "data1", "single-node-writer")
		h.createVolume(d, "logs", "multi-node-multi-writer")
		claims := []published{
			{alloc: "web1", vol: "data1", file: "hello.txt", data: "hello from web1\n"},
			{alloc: "web2", vol: "logs", file: "log.txt", data: "log line\n"},
			{alloc: "web3", vol: "logs", file: "log.txt", data: "log line\n"},
		}
		claimW := func(alloc, vol, access string) []string {
			return []string{"volume", "claim", "-alloc", alloc, "-mode", "write", "-access-mode", access, vol}
		}
		claims[0].target = strings.TrimSpace(h.ok(claimW("web1", "data1", "single-node-writer")...))
		claims[1].target = strings.TrimSpace(h.ok(claimW("web2", "logs", "multi-node-multi-writer")...))
		for _, c := range claims[:2] {
			if want := h.target(d, c.alloc, c.vol, "rw-file-system-"+h.volume(c.vol).Capabilities[0].AccessMode); c.target != want {
				t.Errorf("claim %s on %s printed %q, want %q", c.alloc, c.vol, c.target, want)
			}
			if err := os.WriteFile(filepath.Join(c.target, c.file), []byte(c.data), 0o644); err != nil {
				t.Fatalf("write through %s: %v", c.target, err)
			}
		}
		claims[2].target = strings.TrimSpace(h.ok("volume", "claim", "-alloc", "web3", "-mode", "read", "-access-mode", "multi-node-multi-writer", "logs"))
		if isRoot() {
			if err := os.WriteFile(filepath.Join(claims[2].target, "x"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
				t.Errorf("writing through read claim web3's target: got %v, want EROFS", err)
			}
		}
		h.fails(1, `access mode single-node-writer allows one claim and alloc "web1" holds it`, claimW("web2", "data1", "single-node-writer")...)
		h.checkSettled(d, "after the claims")
		h.checkPublished("after the claims", claims)

		a.signal(syscall.SIGKILL)
		if st := a.wait(shutdownDeadline); st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("agent ended with %s, want killed by SIGKILL", st)
		}
		a.checkNoRace()
		a = h.startAgent()
		h.waitPluginHealthy(d)
		h.checkSettled(d, "after the restart")
		h.checkPublished("after the restart", claims)

		for _, c := range claims {
			h.ok("volume", "release", "-alloc", c.alloc, c.vol)
		}
		for _, v := range h.checkSettled(d, "after every release") {
			if len(v.Claims) > 0 {
				t.Errorf("after every release: %s", describe(v))
			}
		}
		for _, vol := range []string{"data1", "logs"} {
			h.ok("volume", "delete", vol)
			h.fails(1, "not found", "volume", "status", vol)
		}
		if s := d.state(h); len(s.Volumes) > 0 {
			t.Errorf("%s still has volumes after every delete: %+v", d.plugin, s.Volumes)
		}

		a.signal(syscall.SIGTERM)
		if st := a.wait(shutdownDeadline); st.ExitCode() != 0 {
			t.Errorf("agent exit after SIGTERM: %s", st)
		}
		a.checkNoRace()
	})
}
