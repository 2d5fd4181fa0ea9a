package acceptance

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/csiactor/csiactor/runtime"
)

// readToken is the api.tokens entry of TestUI_Browser_ReadScope.
const readToken = "monitor-read-t0ken-7731"

// TestUI_Browser_ReadScope signs in to the web UI of `agent -dev` with a
// read token of api.tokens: the header shows the session's name and
// scope, no page offers a forced release or a fence, and the same writes
// forced through fetch() from the page are refused with 403 naming the
// operator scope, leaving the claim in place.
func TestUI_Browser_ReadScope(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an agent and a browser")
	}
	h := newHost(t)
	cfg := fmt.Sprintf("api:\n  tokens:\n    - {name: monitor, file: %s, scope: read}\n", h.write("monitor-token", readToken+"\n", 0o600))
	a := h.startAgent("-dev", "-http-addr", "127.0.0.1:0", "-config", h.write("agent.yaml", cfg, 0o600))
	waitHealthy(t, a)
	a.ok("volume", "create", "-plugin", "example", "-capacity", "1MiB", "-capability", "single-node-writer", "web1")
	a.ok("volume", "claim", "-alloc", "job1", "-mode", "write", "-access-mode", "single-node-writer", "web1")
	uiURL := a.tcpAddr + "/ui/"

	b := newBrowser(t, h)
	b.run("sign in with the read token", chromedp.Navigate(uiURL),
		visible(`body[data-page="login"] input[name="token"]`),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), readToken),
		click(`form.login button[type="submit"]`),
		visible(`body[data-page="overview"] tr[data-volume="web1"] [data-claim="job1"][data-state="published"]`),
		visible(`#whoami`))
	if who := get(b, "read the header", text(`#whoami`)); who != "signed in as monitor (read)" {
		t.Errorf("the header says %q, want the session's name and scope", who)
	}
	b.run("open the volume page", click(`tr[data-volume="web1"] a`),
		visible(`body[data-page="volume"] #claims tr[data-claim="job1"][data-state="published"]`))
	b.screenshot("volume-read-scope.png")
	if n := get(b, "count the buttons", chromedp.Evaluate[int](`document.querySelectorAll('main button').length`)); n != 0 {
		t.Errorf("a read session is offered %d buttons on the volume page:\n%s", n, b.html())
	}
	page := b.html()
	for _, s := range []string{"Force release", "Fence", readToken} {
		if strings.Contains(page, s) {
			t.Errorf("the volume page of a read session shows %q", s)
		}
	}

	// The server refuses the writes anyway.
	for _, w := range []struct{ method, path, need string }{
		{"DELETE", "/v1/volumes/web1/claims/job1?force=true", "operator"},
		{"DELETE", "/v1/volumes/web1/claims/job1", "claim"},
		{"POST", "/v1/nodes/node1/fence", "operator"},
	} {
		js := fmt.Sprintf(`fetch(%q, {method: %q, headers: {'X-Csiactor-UI': '1'}, credentials: 'same-origin'}).then(async (r) => r.status + ' ' + (await r.json()).error)`, w.path, w.method)
		got := get(b, "force "+w.method+" "+w.path, chromedp.Evaluate[string](js, chromedp.EvalAwaitPromise))
		if want := "403 this request needs the " + w.need + ` scope; token "monitor" has read`; got != want {
			t.Errorf("%s %s from the page: %s, want %s", w.method, w.path, got, want)
		}
	}
	var v runtime.Volume
	a.okJSON(&v, "volume", "status", "web1")
	if len(v.Claims) != 1 || v.Claims[0].Alloc != "job1" || v.Claims[0].State != runtime.ClaimPublished {
		t.Errorf("after the refused writes the claims are %+v, want job1 published", v.Claims)
	}
	if errs := b.consoleErrors(); len(errs) != 0 {
		t.Errorf("console errors: %v", errs)
	}
}
