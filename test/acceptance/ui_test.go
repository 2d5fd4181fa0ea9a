package acceptance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/runtime"
)

// Environment of the browser tests.
const (
	// browserEnv, set (as .ci/run sets it), makes a missing Chromium a
	// failure instead of a skip.
	browserEnv = "CSIACTOR_TEST_BROWSER"
	// chromiumEnv names the Chromium binary; default chromium on $PATH.
	chromiumEnv = "CSIACTOR_CHROMIUM"
	// screenshotsEnv names the directory the screenshots are written to;
	// default a new temporary directory, logged.
	screenshotsEnv = "CSIACTOR_UI_SCREENSHOTS"
)

// browser is a headless Chromium driven through chromedp, with every
// console error and uncaught exception of its pages collected.
type browser struct {
	t    *testing.T
	ctx  context.Context
	mu   sync.Mutex
	errs []string // guarded by mu
	all  []string // guarded by mu; errs and the network's errors (see watchNetwork)
	dir  string   // screenshots
}

func newBrowser(t *testing.T, h *host) *browser {
	t.Helper()
	path := os.Getenv(chromiumEnv)
	if path == "" {
		path, _ = exec.LookPath("chromium")
	}
	if path == "" {
		if os.Getenv(browserEnv) != "" {
			t.Fatalf("$%s is set but there is no chromium on $PATH (and $%s is unset)", browserEnv, chromiumEnv)
		}
		t.Skipf("no chromium on $PATH: install Debian's chromium (as .ci/run does) or set $%s to run the web UI's browser tests", chromiumEnv)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(filepath.Join(h.base, "chromium")),
		chromedp.WindowSize(1280, 800),
	)
	if isRoot() {
		opts = append(opts, chromedp.NoSandbox)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	b := &browser{t: t, ctx: ctx}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		cancel()
		cancelAlloc()
		t.Fatalf("start %s: %v", path, err)
	}
	// Errors and warnings of the pages' scripts, uncaught exceptions, and
	// the browser's own error log (a blocked script or style); failed
	// requests (the 401s before signing in) are the network's, not ours.
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.IsException() {
				s := fmt.Sprintf("%s (%s:%d)", m, m.URL, m.Line)
				b.mu.Lock()
				b.all = append(b.all, fmt.Sprintf("%s [%s]", s, m.Source))
				if m.Source != "network" {
					b.errs = append(b.errs, s)
				}
				b.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		<-done
	})
	b.dir = os.Getenv(screenshotsEnv)
	if b.dir == "" {
		dir, err := os.MkdirTemp("", "csiactor-ui-screenshots-")
		if err != nil {
			t.Fatal(err)
		}
		b.dir = dir
	} else if err := os.MkdirAll(b.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", b.dir)
	return b
}

// run runs steps, failing the test on an error or after waitDeadline
// (the waits poll for conditions; the deadline only bounds them).
func (b *browser) run(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	get(b, what, chromedp.Steps(steps...))
}

// get runs a and returns its value, failing the test as run does.
func get[T any](b *browser, what string, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, waitDeadline)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		html, _ := chromedp.Run(b.ctx, chromedp.OuterHTML(chromedp.CSS("main")))
		b.t.Fatalf("%s: %v\npage:\n%s\nconsole: %v", what, err, html, b.consoleErrors())
	}
	return v
}

func (b *browser) consoleErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errs...)
}

// screenshot writes the viewport to name in the screenshots directory.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	b.run("viewport 1280x800", chromedp.EmulateViewport(1280, 800))
	png := get(b, "screenshot "+name, chromedp.CaptureScreenshot())
	if err := os.WriteFile(filepath.Join(b.dir, name), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// html returns the page's whole markup.
func (b *browser) html() string {
	b.t.Helper()
	return get(b, "read the page", chromedp.OuterHTML(chromedp.CSS("html")))
}

// cookies returns the browser's cookies for url.
func (b *browser) cookies(url string) []*network.Cookie {
	b.t.Helper()
	r, err := chromedp.Call(b.ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{url}})
	if err != nil {
		b.t.Fatalf("read the cookies: %v", err)
	}
	return r.Cookies
}

// Shorthands of the waits and clicks, by CSS selector.
func visible(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.WaitVisible(chromedp.CSS(sel))
}
func gone(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.WaitNotPresent(chromedp.CSS(sel))
}
func click(sel string) chromedp.Action[chromedp.Void] { return chromedp.Click(chromedp.CSS(sel)) }

// text waits for sel to show some text and returns it (innerText), read
// in one script: an event can replace the part of the page that changed,
// and a node that chromedp.Text found be detached before its text is read
// ("No node with given id found").
func text(sel string) chromedp.Action[string] {
	return chromedp.Poll[string](fmt.Sprintf(`(e => e && e.innerText)(document.querySelector(%q))`, sel))
}

// TestUI_Browser runs `csiactor agent -dev` (the example plugin, and the
// hostpath driver where $CSIACTOR_HOSTPATH_PLUGIN is set) and looks at
// its web UI in headless Chromium as an operator would: nothing without
// the token, a wrong token refused, the session cookie's flags, the
// overview, volume and plugin pages showing the agent's real state, a
// claim made through the API and a plugin going unhealthy appearing
// without a reload, a confirmed forced release recorded as a ui-action
// event, no secret, mount flag or token on any page, a phone-sized
// screen, the dark scheme, and no console error throughout.
func TestUI_Browser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an agent and a browser")
	}
	h := newHost(t)
	hp := os.Getenv(hostpath.Env) != ""
	cfg := "plugins: {heartbeat_interval: 1s, probe_timeout: 1s}\nvolumes: {stats_interval: 1s}\n"
	if hp {
		command, _ := json.Marshal(hostpath.Command(hostpath.Binary(t), "node1", filepath.Join(h.base, "hostpath-state")))
		cfg += fmt.Sprintf("allocations:\n  - {id: hostpath, plugin: %s, type: monolith, command: %s}\n", hostpath.PluginName, command)
	}
	a := h.startAgent("-dev", "-http-addr", "127.0.0.1:0", "-config", h.write("agent.yaml", cfg, 0o600))
	waitHealthy(t, a)
	tokenBytes, err := os.ReadFile(filepath.Join(a.dataDir(), "ui-token"))
	if err != nil {
		t.Fatalf("-dev made no token for the UI: %v\nstdout:\n%s", err, readFile(a.stdout))
	}
	token := strings.TrimSpace(string(tokenBytes))
	uiURL := a.tcpAddr + "/ui/"
	if out := readFile(a.stdout); !strings.Contains(out, "web UI on "+uiURL) {
		t.Errorf("-dev does not print the UI's address %s:\n%s", uiURL, out)
	}

	// State to look at: a volume with a secret and mount flags.
	a.ok("volume", "create", "-plugin", "example", "-capacity", "1MiB", "-capability", "single-node-writer",
		"-fs-type", "ext4", "-mount-flag", mountFlagOne, "-mount-flag", mountFlagTwo, "-secret", "pw="+secretValue, "web1")
	if hp {
		a.ok("volume", "create", "-plugin", hostpath.PluginName, "-capacity", "1MiB", "-capability", "single-node-writer", "hp1")
		a.ok("volume", "claim", "-alloc", "hpjob", "-mode", "write", "-access-mode", "single-node-writer", "hp1")
	}

	b := newBrowser(t, h)
	var pages []string // every page's markup, checked for secrets at the end

	// --- no state without the token; a wrong token is refused ----------
	b.run("open the UI", chromedp.Navigate(uiURL), visible(`body[data-page="login"] input[name="token"]`))
	b.screenshot("login.png")
	page := b.html()
	for _, s := range []string{"web1", "example-plugin", "data-plugin", "data-volume"} {
		if strings.Contains(page, s) {
			t.Errorf("the page before signing in shows %q", s)
		}
	}
	pages = append(pages, page)
	b.run("sign in with a wrong token",
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), "wrong-"+token),
		click(`form.login button[type="submit"]`),
		visible(`#login-error:not(:empty)`))
	loginErr := get(b, "read the error", text(`#login-error`))
	if loginErr != "Wrong token." {
		t.Errorf("after a wrong token the UI says %q", loginErr)
	}
	if cookies := b.cookies(uiURL); len(cookies) != 0 {
		t.Errorf("cookies after a wrong token: %+v", cookies)
	}

	// --- sign in: the overview shows the real state ----------------------
	b.run("sign in",
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		click(`form.login button[type="submit"]`),
		visible(`body[data-page="overview"] tr[data-plugin="example"][data-health="healthy"]`),
		visible(`tr[data-volume="web1"]`),
		visible(`#live[data-live="true"]`))
	cookies := b.cookies(uiURL)
	if len(cookies) != 1 || cookies[0].Name != "csiactor-ui" || !cookies[0].HTTPOnly || cookies[0].SameSite != network.CookieSameSiteStrict || cookies[0].Value == token {
		t.Errorf("session cookies %+v, want one csiactor-ui, HttpOnly, SameSite=Strict, not the token", cookies)
	}
	if jsCookies := get(b, "read document.cookie", chromedp.Evaluate[string](`document.cookie`)); jsCookies != "" {
		t.Errorf("scripts see the cookies %q", jsCookies)
	}
	if hp {
		b.run("the hostpath driver and its claim", visible(fmt.Sprintf(`tr[data-plugin=%q][data-health="healthy"]`, hostpath.PluginName)),
			visible(`tr[data-volume="hp1"] [data-claim="hpjob"][data-state="published"]`))
	}

	// --- a claim through the API appears without a reload --------------
	get(b, "mark the document", chromedp.Evaluate[bool](`window.sameDocument = true`))
	a.ok("volume", "claim", "-alloc", "job1", "-mode", "write", "-access-mode", "single-node-writer", "web1")
	b.run("the claim appears", visible(`tr[data-volume="web1"] [data-claim="job1"][data-state="published"]`))
	b.run("usage polled", visible(`tr[data-volume="web1"] meter`))
	if !get(b, "check the document", chromedp.Evaluate[bool](`window.sameDocument === true`)) {
		t.Error("the page was reloaded to show the claim")
	}
	b.screenshot("overview.png")
	pages = append(pages, b.html())

	// --- the volume page --------------------------------------------------
	b.run("open the volume page", click(`tr[data-volume="web1"] a`),
		visible(`body[data-page="volume"] #claims tr[data-claim="job1"][data-state="published"]`),
		visible(`#events tr[data-event="claim-published"]`))
	b.screenshot("volume.png")
	pages = append(pages, b.html())

	// --- a confirmed forced release, audited -----------------------------
	b.run("cancel a forced release", click(`#claims tr[data-claim="job1"] button`),
		visible(`dialog#confirm[open]`),
		click(`#confirm-cancel`),
		gone(`dialog#confirm[open]`))
	b.run("force the release", click(`#claims tr[data-claim="job1"] button`),
		visible(`dialog#confirm[open]`),
		click(`#confirm-ok`),
		gone(`#claims tr[data-claim="job1"]`),
		visible(`#events tr[data-event="ui-action"]`))
	var uiActions []runtime.Event
	for _, ev := range parseEvents(t, a.ok("events", "-json")) {
		if ev.Type == runtime.EventUIAction {
			uiActions = append(uiActions, ev)
		}
	}
	if len(uiActions) != 1 || uiActions[0].Volume != "web1" || uiActions[0].Alloc != "job1" ||
		uiActions[0].Message != "web UI: forced release of the claim of job1 on volume web1: done" {
		t.Errorf("ui-action events %+v, want one for the forced release (and none for the canceled one)", uiActions)
	}

	// --- the plugin page --------------------------------------------------
	b.run("open the plugin page", chromedp.Navigate(uiURL+"#/plugin/example"),
		visible(`body[data-page="plugin"] #allocations tr[data-alloc="example"][data-healthy="true"]`),
		visible(`#capabilities dl`),
		visible(`pre[data-logs="example"]:not(:empty)`))
	b.screenshot("plugin.png")
	pages = append(pages, b.html())
	if hp {
		b.run("open the hostpath plugin's page", chromedp.Navigate(uiURL+"#/plugin/"+hostpath.PluginName),
			visible(`#allocations tr[data-alloc="hostpath"][data-healthy="true"]`),
			visible(`pre[data-logs="hostpath"]:not(:empty)`))
		b.screenshot("plugin-hostpath.png")
		pages = append(pages, b.html())
	}

	// --- a plugin going unhealthy shows without a reload -----------------
	b.run("back to the overview", chromedp.Navigate(uiURL+"#/"), visible(`tr[data-plugin="example"][data-health="healthy"]`))
	var p runtime.Plugin
	if code, body := a.unixGet("/v1/plugins/example"); code != 200 || json.Unmarshal([]byte(body), &p) != nil || len(p.Allocations) != 1 || p.Allocations[0].PID == 0 {
		t.Fatalf("plugin example: %d %s", code, body)
	}
	pid := p.Allocations[0].PID
	// Stopped, the plugin misses its probes and stays unhealthy until it
	// is continued.
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	b.run("the plugin shows unhealthy", visible(`tr[data-plugin="example"][data-health="unhealthy"]`))
	seen := time.Now()
	var last runtime.Event
	for _, ev := range parseEvents(t, a.ok("events", "-json")) {
		if ev.Type == runtime.EventHealthChanged && ev.Plugin == "example" {
			last = ev
		}
	}
	// Logged, not asserted: a loaded machine may take longer.
	t.Logf("the UI showed the plugin unhealthy at most %s after its health-changed event (%s)", seen.Sub(last.Time).Round(time.Millisecond), last.Message)
	b.screenshot("overview-unhealthy.png")
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	b.run("the plugin shows healthy again", visible(`tr[data-plugin="example"][data-health="healthy"]`))

	// --- dark scheme, and a phone-sized screen ---------------------------
	bg := chromedp.Evaluate[string](`getComputedStyle(document.body).backgroundColor`)
	light := get(b, "light background", bg)
	if _, err := chromedp.Call(b.ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
		Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}}); err != nil {
		t.Fatal(err)
	}
	dark := get(b, "dark background", bg)
	if light == dark {
		t.Errorf("the background is %s in both the light and the dark scheme", light)
	}
	b.screenshot("overview-dark.png")
	b.run("a phone-sized screen", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	if get(b, "measure the page", chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`)) {
		t.Error("on a 390 px wide screen the page scrolls sideways")
	}
	png := get(b, "phone screenshot", chromedp.CaptureScreenshot())
	if err := os.WriteFile(filepath.Join(b.dir, "overview-phone.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}

	// --- nothing secret on any page; no console errors -------------------
	b.checkClean(pages, token)
}
