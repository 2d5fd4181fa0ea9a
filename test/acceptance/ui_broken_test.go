package acceptance

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/runtime"
)

// signIn opens the UI at uiURL and signs in with token, waiting for the
// overview.
func (b *browser) signIn(uiURL, token string) {
	b.t.Helper()
	b.run("open the UI and sign in", chromedp.Navigate(uiURL),
		visible(`body[data-page="login"] input[name="token"]`),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		click(`form.login button[type="submit"]`),
		visible(`body[data-page="overview"]`))
}

// TestUI_Browser_BrokenMount runs `csiactor agent -dev` with the example
// plugin in its FUSE mode as a second plugin, and stops that plugin
// (SIGSTOP) with a claim published: the periodic mount probe finds the
// mount hung, and the web UI shows the claim as it shows a stalled one
// (flagged row and chip, condition broken, the repair's cause on the
// volume page) without a reload. Killed, the plugin is started again and
// the claim heals: the UI shows it published, unflagged.
func TestUI_Browser_BrokenMount(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an agent and a browser")
	}
	testbin.RequireFUSE(t)
	h := newHost(t)
	// health_timeout far away: the stopped plugin stays stopped, and its
	// claim broken, until the test kills it.
	cfg := "plugins: {heartbeat_interval: 1s, probe_timeout: 1s, health_timeout: 1h}\nvolumes: {mount_check_interval: 1s}\n" +
		h.exampleAllocation("fuse", "-fuse")
	a := h.startAgent("-dev", "-http-addr", "127.0.0.1:0", "-config", h.write("agent.yaml", cfg, 0o600))
	waitHealthy(t, a)
	pluginPID := func() int {
		var p runtime.Plugin
		if err := json.Unmarshal([]byte(a.ok("plugin", "status", "fuse", "-json")), &p); err != nil || len(p.Allocations) != 1 || !p.Allocations[0].Healthy {
			return 0
		}
		return p.Allocations[0].PID
	}
	var pid int
	h.eventually("the FUSE plugin healthy", waitDeadline, func() (bool, string) { pid = pluginPID(); return pid != 0, "not yet" })
	a.ok("volume", "create", "-plugin", "fuse", "-capacity", "1MiB", "-capability", "single-node-writer", "fv")
	target := strings.TrimSpace(a.ok("volume", "claim", "-alloc", "fusejob", "-mode", "write", "-access-mode", "single-node-writer", "fv"))
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("kept"), 0o644); err != nil {
		t.Fatalf("write through the FUSE mount: %v", err)
	}
	token, err := os.ReadFile(filepath.Join(a.dataDir(), "ui-token"))
	if err != nil {
		t.Fatal(err)
	}
	uiURL := a.tcpAddr + "/ui/"
	b := newBrowser(t, h)
	b.signIn(uiURL, strings.TrimSpace(string(token)))
	b.run("the claim published", visible(`tr[data-volume="fv"] [data-claim="fusejob"][data-state="published"]`),
		gone(`tr[data-volume="fv"].stalled`))

	// --- the plugin hangs: its mount is found dead ------------------------
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	b.run("the volume and the claim flagged broken",
		visible(`tr[data-volume="fv"].stalled`),
		visible(`tr[data-volume="fv"] [data-claim="fusejob"].stalled`))
	if got := get(b, "the volume's flag", text(`tr[data-volume="fv"] .badge`)); got != "broken" {
		t.Errorf("the volume's flag reads %q, want broken", got)
	}
	if got := get(b, "the claim's chip", text(`tr[data-volume="fv"] [data-claim="fusejob"]`)); got != "fusejob · broken" {
		t.Errorf("the claim's chip reads %q, want %q", got, "fusejob · broken")
	}
	b.screenshot("overview-broken.png")
	b.run("the volume page", chromedp.Navigate(uiURL+"#/volume/fv"),
		visible(`body[data-page="volume"] #claims tr[data-claim="fusejob"].stalled`))
	if row := get(b, "the claim's row", text(`#claims tr[data-claim="fusejob"]`)); !strings.Contains(row, "broken") {
		t.Errorf("the claim's row on the volume page reads %q, want its condition broken", row)
	}
	// The repair names what was found dead and why: the stopped plugin's
	// mounts do not answer the probe.
	if repair := get(b, "the claim's repair", text(`#claims tr[data-claim="fusejob"] [data-repair]`)); !strings.HasSuffix(repair, "broken (timeout)") {
		t.Errorf("the claim's repair reads %q, want what was found dead, broken (timeout)", repair)
	}
	b.screenshot("volume-broken.png")

	// --- killed, restarted, healed -----------------------------------------
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	b.run("back to the overview", chromedp.Navigate(uiURL+"#/"), visible(`body[data-page="overview"]`))
	b.run("the claim healed, unflagged",
		visible(`tr[data-volume="fv"] [data-claim="fusejob"][data-state="published"]`),
		gone(`tr[data-volume="fv"].stalled`))
	if b, err := os.ReadFile(filepath.Join(target, "f")); err != nil || string(b) != "kept" {
		t.Errorf("through the healed mount: %q, %v; want kept", b, err)
	}
	a.ok("volume", "release", "-alloc", "fusejob", "fv")
	h.eventually("the claim freed", waitDeadline, func() (bool, string) {
		var v runtime.Volume
		out := a.ok("volume", "status", "fv", "-json")
		return json.Unmarshal([]byte(out), &v) == nil && len(v.Claims) == 0 && len(v.PastClaims) == 0, out
	})
	if m := mountsUnder(h.base); len(m) > 0 {
		t.Errorf("mounts left after the release: %v", m)
	}
	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %v", errs)
	}
}
