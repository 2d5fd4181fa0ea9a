package acceptance

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/csiactor/csiactor/runtime"
)

// netLog is what a browser's pages asked over the network, in the order
// they asked it, and with the browser's console messages (network errors
// included: a fetch's 404) what a session did.
type netLog struct {
	b        *browser
	mu       sync.Mutex
	requests []string // guarded by mu; "GET /v1/plugins"
	failed   []string // guarded by mu; "404 http://…/v1/nodes"
}

// watchNetwork starts recording b's requests and failed responses until
// the test ends.
func (b *browser) watchNetwork() *netLog {
	b.t.Helper()
	l := &netLog{b: b}
	ctx, cancel := context.WithCancel(b.ctx)
	b.t.Cleanup(cancel)
	err := chromedp.Listen(ctx, func(ev any) {
		l.mu.Lock()
		defer l.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			path := ev.Request.URL
			if u, err := url.Parse(ev.Request.URL); err == nil {
				path = u.Path
			}
			l.requests = append(l.requests, ev.Request.Method+" "+path)
		case *network.EventResponseReceived:
			if ev.Response.Status >= 400 {
				l.failed = append(l.failed, fmt.Sprintf("%d %s", ev.Response.Status, ev.Response.URL))
			}
		}
	})
	if err != nil {
		b.t.Fatalf("listen to the browser's network: %v", err)
	}
	return l
}

// mark is a point in the log: what came after it is read with since.
type mark struct{ requests, failed, console int }

func (l *netLog) mark() mark {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.mu.Lock()
	defer l.b.mu.Unlock()
	return mark{len(l.requests), len(l.failed), len(l.b.all)}
}

// since returns the requests, failed responses and console messages (of
// any source) after m.
func (l *netLog) since(m mark) (requests, failed, console []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.mu.Lock()
	defer l.b.mu.Unlock()
	return append([]string(nil), l.requests[m.requests:]...), append([]string(nil), l.failed[m.failed:]...),
		append([]string(nil), l.b.all[m.console:]...)
}

func count(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}

// TestUI_Browser_SingleHostSession runs `csiactor agent -dev` (one host, no
// cluster) with the example plugin twice over, once with -no-volume-stats,
// and looks at its web UI in headless Chromium as an operator would:
//   - the sign-in page says nothing of the agent being offline;
//   - a session spanning several refreshes asks nothing that fails, never
//     asks for /v1/nodes (a single host has none) and logs no console
//     message, network errors included;
//   - a volume's claim chips read as separate items, in a list;
//   - a fresh publish shows its usage and condition pending, and a plugin
//     that reports neither shows them not supported, as the API says;
//   - the Version column shows the plugin's version and nothing else.
func TestUI_Browser_SingleHostSession(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an agent and a browser")
	}
	h := newHost(t)
	// stats_interval far away: the first poll (at a random point of the
	// first interval) does not come during the test, so a published
	// volume's usage stays pending.
	cfg := "plugins: {heartbeat_interval: 1s, probe_timeout: 1s}\nvolumes: {stats_interval: 10000h}\n" +
		h.exampleAllocation("nostats", "-no-volume-stats")
	a := h.startAgent("-dev", "-http-addr", "127.0.0.1:0", "-config", h.write("agent.yaml", cfg, 0o600))
	waitHealthy(t, a)
	h.eventually("the plugin without stats healthy", waitDeadline, func() (bool, string) {
		var p runtime.Plugin
		out := a.at("plugin", "status", "nostats", "-json").stdout
		return json.Unmarshal([]byte(out), &p) == nil && p.NodesHealthy == 1, out
	})
	var health struct {
		Status  string `json:"status"`
		Cluster *bool  `json:"cluster"`
	}
	if code, body := a.unixGet("/v1/health"); code != 200 || json.Unmarshal([]byte(body), &health) != nil || health.Cluster == nil || *health.Cluster {
		t.Errorf("GET /v1/health: %d %s; want cluster false", code, body)
	}

	// Two claims on one volume, and one on the plugin without stats.
	a.ok("volume", "create", "-plugin", "example", "-capacity", "1MiB", "-capability", "single-node-multi-writer", "multi")
	for _, alloc := range []string{"job1", "job2"} {
		a.ok("volume", "claim", "-alloc", alloc, "-mode", "write", "-access-mode", "single-node-multi-writer", "multi")
	}
	a.ok("volume", "create", "-plugin", "nostats", "-capacity", "1MiB", "-capability", "single-node-writer", "plain")
	a.ok("volume", "claim", "-alloc", "job3", "-mode", "write", "-access-mode", "single-node-writer", "plain")
	for vol, want := range map[string]string{"multi": runtime.StatsPending, "plain": runtime.StatsUnsupported} {
		var v runtime.Volume
		a.okJSON(&v, "volume", "status", vol)
		if v.UsageStatus != want || v.ConditionStatus != want || v.Usage != nil || v.Condition != nil {
			t.Errorf("volume %s: usage %+v (%q), condition %+v (%q); want neither, both %q",
				vol, v.Usage, v.UsageStatus, v.Condition, v.ConditionStatus, want)
		}
	}

	token := strings.TrimSpace(readFile(filepath.Join(a.dataDir(), "ui-token")))
	uiURL := a.tcpAddr + "/ui/"
	b := newBrowser(t, h)
	nl := b.watchNetwork()

	// --- the sign-in page: not "offline" ------------------------------------
	b.run("open the UI", chromedp.Navigate(uiURL), visible(`body[data-page="login"] input[name="token"]`))
	if get(b, "the live indicator on the sign-in page", chromedp.Evaluate[bool](`(e => !e.hidden && getComputedStyle(e).display !== 'none')(document.getElementById('live'))`)) {
		t.Error("the sign-in page shows the event stream's indicator")
	}
	if txt := get(b, "the sign-in page's text", chromedp.Evaluate[string](`document.body.innerText`)); strings.Contains(strings.ToLower(txt), "offline") {
		t.Errorf("the sign-in page says offline:\n%s", txt)
	}

	// --- a session over several refreshes: nothing fails -----------------
	b.signIn(uiURL, token)
	session := nl.mark()
	b.run("the event stream live", visible(`#live[data-live="true"]`))
	// Each refresh reads the plugins once: wait for the periodic ones.
	const refreshes = 4
	h.eventually(fmt.Sprintf("%d refreshes", refreshes), waitDeadline, func() (bool, string) {
		reqs, _, _ := nl.since(session)
		return count(reqs, "GET /v1/plugins") >= refreshes, strings.Join(reqs, "\n")
	})
	reqs, failed, console := nl.since(session)
	if n := count(reqs, "GET /v1/nodes"); n != 0 {
		t.Errorf("a single-host session asked GET /v1/nodes %d times:\n%s", n, strings.Join(reqs, "\n"))
	}
	if n := count(reqs, "GET /v1/health"); n > 1 {
		t.Errorf("the session asked GET /v1/health %d times, want once at most (whether the agent is in cluster mode does not change)", n)
	}
	if len(failed) > 0 {
		t.Errorf("failed requests during the session:\n%s", strings.Join(failed, "\n"))
	}
	if len(console) > 0 {
		t.Errorf("console messages during the session:\n%s", strings.Join(console, "\n"))
	}

	// --- claim chips: separate items, in a list --------------------------
	b.run("both claims shown", visible(`tr[data-volume="multi"] ul[role="list"] > li[data-claim="job1"][data-state="published"]`),
		visible(`tr[data-volume="multi"] ul[role="list"] > li[data-claim="job2"][data-state="published"]`))
	cell := get(b, "the claims cell's text", chromedp.Evaluate[string](`document.querySelector('tr[data-volume="multi"] li[data-claim="job1"]').closest('td').textContent`))
	if cell != "job1 · published job2 · published" {
		t.Errorf("the claims cell's textContent is %q, want %q", cell, "job1 · published job2 · published")
	}

	// --- usage and condition: pending, or not supported ------------------
	for _, c := range []struct{ vol, status, text string }{
		{"multi", "pending", "pending"},
		{"plain", "unsupported", "not supported"},
	} {
		for _, kind := range []string{"usage", "condition"} {
			sel := fmt.Sprintf(`tr[data-volume=%q] [data-%s=%q]`, c.vol, kind, c.status)
			b.run(fmt.Sprintf("%s's %s %s", c.vol, kind, c.status), visible(sel))
			if got := get(b, "read "+sel, text(sel)); got != c.text {
				t.Errorf("%s's %s reads %q, want %q", c.vol, kind, got, c.text)
			}
		}
	}
	b.screenshot("overview-session.png")
	b.run("the volume page", chromedp.Navigate(uiURL+"#/volume/multi"),
		visible(`body[data-page="volume"] dd [data-usage="pending"]`), visible(`dd [data-condition="pending"]`))
	b.run("back to the overview", chromedp.Navigate(uiURL+"#/"), visible(`body[data-page="overview"] tr[data-plugin="example"]`))

	// --- the Version column: the version alone ---------------------------
	var p runtime.Plugin
	a.okJSON(&p, "plugin", "status", "example")
	if p.Version == "" || p.Provider == "" {
		t.Fatalf("plugin example: provider %q, version %q; want both", p.Provider, p.Version)
	}
	if got := get(b, "the Version column", text(`tr[data-plugin="example"] td.version`)); got != p.Version {
		t.Errorf("the Version column reads %q, want the version %q alone", got, p.Version)
	}
	if got := get(b, "the Provider column", text(`tr[data-plugin="example"] td.provider`)); got != p.Provider {
		t.Errorf("the Provider column reads %q, want %q", got, p.Provider)
	}
	heads := get(b, "the plugins table's heads", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#plugins th')].map(th => th.textContent)`))
	if i := indexOf(heads, "Version"); i < 0 || indexOf(heads, "Provider") < 0 ||
		get(b, "the Version column's index", chromedp.Evaluate[int](`document.querySelector('tr[data-plugin="example"] td.version').cellIndex`)) != i {
		t.Errorf("the plugins table's heads %q do not head the version with Version", heads)
	}

	_, _, console = nl.since(session)
	if len(console) > 0 {
		t.Errorf("console messages during the session:\n%s", strings.Join(console, "\n"))
	}
	if errs := b.consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %v", errs)
	}
}

func indexOf(xs []string, x string) int {
	for i, y := range xs {
		if y == x {
			return i
		}
	}
	return -1
}
