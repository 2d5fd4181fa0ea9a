package acceptance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/runtime"
)

// clusterUIConfig is the config of one agent of TestUI_BrowserCluster:
// cluster mode on the test's etcd, the web UI with the shared token, a
// short stall_after, and the example plugin on storage shared by both
// hosts (as `make run-cluster` runs it) that lets one volume at a time be
// controller-published to a host, so that a second claim on the same
// host is retried (ResourceExhausted) until the first is released.
const clusterUIConfig = `data_dir: %[1]s/data
api:
  http_addr: 127.0.0.1:0
  token_file: %[2]s
  ui: true
plugins: {heartbeat_interval: 1s, probe_timeout: 1s}
volumes:
  stats_interval: 1s
  stall_after: 1s
  retry: {initial: 50ms, max: 500ms}
secrets: {key_file: %[3]s}
cluster:
  node_id: %[4]s
  lease_ttl: 2s
  etcd: {endpoints: [%[5]q]}
allocations:
  - id: example
    plugin: example
    type: monolith
    command: [%[6]q, example-plugin, -state-dir, %[1]s/plugin, -shared-dir, %[7]q, -node-id, %[4]s, -max-attached, "1"]
`

// TestUI_BrowserCluster runs two agents in cluster mode on an embedded
// etcd and looks at the first one's web UI in headless Chromium: the
// hosts table with both hosts and their claims, the other host shown
// down once its agent is SIGKILLed and its lease expires, its fence
// behind a confirmation (canceled, then confirmed: one ui-action event,
// its claims gone), a claim stalled on its ControllerPublishVolume
// highlighted and then published once the host has room again; all
// without a reload, without a console error and with no secret, mount
// flag or token on any page.
func TestUI_BrowserCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, two agents and a browser")
	}
	h := newHost(t)
	etcd := etcdtest.Start(t)
	tok := make([]byte, 16)
	key := make([]byte, 32)
	if _, err := rand.Read(tok); err != nil {
		t.Fatal(err)
	}
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	token := hex.EncodeToString(tok)
	tokenFile := h.write("token", token+"\n", 0o600)
	keyFile := h.write("secrets.key", string(key), 0o600)
	storage := filepath.Join(h.base, "storage")
	agents := map[string]*agent{}
	for _, node := range []string{"node1", "node2"} {
		dir := filepath.Join(h.base, node)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		cfg := fmt.Sprintf(clusterUIConfig, dir, tokenFile, keyFile, node, etcd.Endpoint(), h.bin, storage)
		agents[node] = h.startAgent("-config", h.write(node+".yaml", cfg, 0o600))
	}
	n1, n2 := agents["node1"], agents["node2"]
	waitHealthy(t, n1)
	waitHealthy(t, n2)

	// A volume with a secret and mount flags claimed on node1, one
	// claimed on node2, and one for the stalled claim on node1.
	n1.ok("volume", "create", "-plugin", "example", "-capacity", "1MiB", "-capability", "single-node-writer",
		"-fs-type", "ext4", "-mount-flag", mountFlagOne, "-mount-flag", mountFlagTwo, "-secret", "pw="+secretValue, "data1")
	n1.ok("volume", "create", "-plugin", "example", "-capacity", "1MiB", "-capability", "single-node-writer", "shared1")
	n1.ok("volume", "create", "-plugin", "example", "-capacity", "1MiB", "-capability", "single-node-writer", "stall1")
	claim := func(alloc, vol string) []string {
		return []string{"volume", "claim", "-alloc", alloc, "-mode", "write", "-access-mode", "single-node-writer", vol}
	}
	n1.ok(claim("app1", "data1")...)
	n2.ok(claim("app2", "shared1")...)

	b := newBrowser(t, n1.h)
	uiURL := n1.tcpAddr + "/ui/"
	var pages []string

	// --- the hosts table -------------------------------------------------
	b.run("sign in",
		chromedp.Navigate(uiURL),
		visible(`input[name="token"]`),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		click(`form.login button[type="submit"]`),
		visible(`body[data-page="overview"] #live[data-live="true"]`))
	b.run("both hosts up with their claims",
		visible(`#hosts tr[data-node="node1"][data-status="up"][data-claims="1"]`),
		visible(`#hosts tr[data-node="node2"][data-status="up"][data-claims="1"]`),
		visible(`tr[data-volume="data1"] [data-claim="app1"][data-state="published"]`),
		visible(`tr[data-volume="shared1"] [data-claim="app2"][data-state="remote"]`))
	if chip := get(b, "read node2's claim", text(`tr[data-volume="shared1"] [data-claim="app2"]`)); chip != "app2 · on node2" {
		t.Errorf("node2's claim on shared1 shows %q, want its host", chip)
	}
	if n := get(b, "fence buttons", chromedp.Evaluate[int](`document.querySelectorAll('#hosts button').length`)); n != 0 {
		t.Errorf("%d fence buttons while both hosts are up", n)
	}
	pages = append(pages, b.html())
	get(b, "mark the document", chromedp.Evaluate[bool](`window.sameDocument = true`))

	// --- a stalled claim ---------------------------------------------------
	// node1 already has data1 controller-published, its limit: stall1's
	// ControllerPublishVolume is retried and the claim stays reserved.
	stalled := n1.background("claim-stall1", append(claim("app3", "stall1"), "-timeout", "10m")...)
	b.run("the stalled claim is highlighted",
		visible(`tr[data-volume="stall1"].stalled [data-claim="app3"].stalled`),
		visible(`#hosts tr[data-node="node1"][data-claims="2"]`))
	var v runtime.Volume
	n1.okJSON(&v, "volume", "status", "stall1")
	if len(v.Claims) != 1 || v.Claims[0].Condition != runtime.ClaimStalled || !strings.Contains(v.Claims[0].LastError, "ResourceExhausted") {
		t.Errorf("stall1's claims %+v: want app3 stalled on ResourceExhausted", v.Claims)
	}
	b.run("the stalled claim's page", chromedp.Navigate(uiURL+"#/volume/stall1"),
		visible(`body[data-page="volume"] #claims tr[data-claim="app3"].stalled`),
		visible(`#claims tr[data-claim="app3"] td.error:not(:empty)`))
	if msg := get(b, "read the last error", text(`#claims tr[data-claim="app3"] td.error`)); !strings.Contains(msg, "ResourceExhausted") {
		t.Errorf("the stalled claim's last error shows %q, want the ResourceExhausted of ControllerPublishVolume", msg)
	}
	// Each retry adds an event and rebuilds the page; the claim's row and
	// its button stay the same nodes, so an operator's click on them is
	// not lost.
	get(b, "mark the button", chromedp.Evaluate[bool](`window.releaseButton = document.querySelector('#claims tr[data-claim="app3"] button'),
		window.rendersBefore = Number(document.body.dataset.renders), true`))
	get(b, "two more renders", chromedp.Poll[bool](`Number(document.body.dataset.renders) >= window.rendersBefore + 2`))
	if !get(b, "check the button", chromedp.Evaluate[bool](`window.releaseButton.isConnected`)) {
		t.Error("the stalled claim's Force release button was replaced while only the events changed")
	}
	b.screenshot("stalled-claim.png")
	pages = append(pages, b.html())
	b.run("back to the overview", chromedp.Navigate(uiURL+"#/"), visible(`body[data-page="overview"] #hosts tr[data-node="node2"]`))

	// --- a host goes down ------------------------------------------------
	n2.signal(syscall.SIGKILL)
	n2.wait()
	b.run("node2 shows down", visible(`#hosts tr[data-node="node2"][data-status="down"][data-claims="1"] button`),
		visible(`tr[data-volume="shared1"] [data-claim="app2"][data-state="remote"]`),
		visible(`#hosts tr[data-node="node1"][data-status="up"]`))
	if !get(b, "check the document", chromedp.Evaluate[bool](`window.sameDocument === true`)) {
		t.Error("the page was reloaded to show the stalled claim or the down host")
	}
	b.screenshot("cluster-overview.png")
	pages = append(pages, b.html())

	// --- fence it, behind a confirmation ---------------------------------
	uiActions := func() []runtime.Event {
		var out []runtime.Event
		for _, ev := range parseEvents(t, n1.ok("events", "-json")) {
			if ev.Type == runtime.EventUIAction {
				out = append(out, ev)
			}
		}
		return out
	}
	b.run("cancel the fence with Escape", clickNow(`#hosts tr[data-node="node2"] button`),
		visible(`dialog#confirm[open]`),
		chromedp.KeyEvent(kb.Escape),
		gone(`dialog#confirm[open]`))
	if evs := uiActions(); len(evs) != 0 {
		t.Errorf("ui-action events after a canceled fence: %+v", evs)
	}
	n1.okJSON(&v, "volume", "status", "shared1")
	if len(v.Claims) != 1 || v.Claims[0].Alloc != "app2" {
		t.Errorf("shared1's claims after a canceled fence: %+v, want app2's", v.Claims)
	}
	b.run("fence node2", clickNow(`#hosts tr[data-node="node2"] button`),
		visible(`dialog#confirm[open]`),
		click(`#confirm-ok`),
		gone(`dialog#confirm[open]`),
		visible(`#hosts tr[data-node="node2"][data-claims="0"]`),
		visible(`tr[data-volume="shared1"]`),
		gone(`tr[data-volume="shared1"] [data-claim]`))
	if evs := uiActions(); len(evs) != 1 || evs[0].Message != "web UI: fence of host node2: done" {
		t.Errorf("ui-action events %+v, want one for the fence of node2", evs)
	}
	n1.okJSON(&v, "volume", "status", "shared1")
	if len(v.Claims) != 0 || len(v.PastClaims) != 0 {
		t.Errorf("shared1 after the fence: claims %+v, past claims %+v; want none", v.Claims, v.PastClaims)
	}
	pages = append(pages, b.html())

	// --- the stalled claim moves on once node1 has room ------------------
	n1.ok("volume", "release", "-alloc", "app1", "data1")
	b.run("the stalled claim is published",
		visible(`tr[data-volume="stall1"]:not(.stalled) [data-claim="app3"][data-state="published"]:not(.stalled)`))
	select {
	case <-stalled.done:
		if code := stalled.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("the claim of stall1 exited %d: %s", code, stalled.stderr)
		}
	case <-time.After(waitDeadline):
		t.Errorf("the claim of stall1 still waits %s after it was published", waitDeadline)
	}
	pages = append(pages, b.html())

	// --- nothing secret on any page; no console errors -------------------
	b.checkClean(pages, token)
}

// clickNow waits for sel and clicks it from the page's own script: an
// event (a retrying claim sends several a second) can replace the rows of
// a table that changed, which would detach the node chromedp.Click found
// before its mouse events reach it.
func clickNow(sel string) chromedp.Action[chromedp.Void] {
	js := chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector(%q).click(), true`, sel))
	return chromedp.Steps(visible(sel), func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := js(ctx, t)
		return chromedp.Void{}, err
	})
}

// checkClean fails the test if one of pages shows the test's secret, a
// mount flag or token, or if the browser logged a console error.
func (b *browser) checkClean(pages []string, token string) {
	b.t.Helper()
	for i, page := range pages {
		for _, s := range []string{secretValue, mountFlagOne, mountFlagTwo, token} {
			if strings.Contains(page, s) {
				b.t.Errorf("page %d shows %q", i, s)
			}
		}
	}
	if errs := b.consoleErrors(); len(errs) > 0 {
		b.t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}
