package api_test

import (
	"context"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/runtime"
)

const uiToken = "ui-t0ken-5521"

// uiBackend is the fake backend with what the web UI's actions need: a
// forced release and an event recorder.
type uiBackend struct {
	*apitest.Backend
	mu       sync.Mutex
	recorded []runtime.Event // guarded by mu
	released []string        // guarded by mu; "volume/alloc"
}

func (b *uiBackend) RecordEvent(e runtime.Event) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.recorded = append(b.recorded, e)
	return nil
}

func (b *uiBackend) ForceRelease(_ context.Context, volumeID, alloc string) (runtime.ForcedRelease, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.released = append(b.released, volumeID+"/"+alloc)
	return runtime.ForcedRelease{Claim: runtime.Claim{Alloc: alloc, State: runtime.ClaimFreed}}, nil
}

func (b *uiBackend) ClaimWait(context.Context, string, runtime.ClaimRequest, time.Duration) (runtime.Claim, error) {
	return runtime.Claim{}, runtime.ErrInvalid
}
func (b *uiBackend) ForceDeregisterVolume(context.Context, string) error { return runtime.ErrInvalid }
func (b *uiBackend) ForceDeregisterAllocation(context.Context, string) error {
	return runtime.ErrInvalid
}

func (b *uiBackend) events() ([]runtime.Event, []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]runtime.Event(nil), b.recorded...), append([]string(nil), b.released...)
}

func newUIServer(t *testing.T, token string, ui bool) (*httptest.Server, *uiBackend) {
	t.Helper()
	b := &uiBackend{Backend: apitest.NewBackend()}
	srv := httptest.NewServer(api.NewTCPHandler(b, token, api.Options{UI: ui}))
	t.Cleanup(srv.Close)
	return srv, b
}

func uiDo(t *testing.T, method, url, body string, header map[string]string, cookies ...*http.Cookie) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	return resp
}

func readBody(resp *http.Response) string {
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// login signs in with token and returns the session cookie.
func uiLogin(t *testing.T, srv *httptest.Server, token string) *http.Cookie {
	t.Helper()
	resp := uiDo(t, "POST", srv.URL+"/ui/login", `{"token":"`+token+`"}`, map[string]string{"Content-Type": "application/json"})
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("login: %d %s", resp.StatusCode, readBody(resp))
	}
	for _, c := range resp.Cookies() {
		if c.Name == api.UICookie {
			return c
		}
	}
	t.Fatalf("login set no %s cookie: %v", api.UICookie, resp.Header)
	return nil
}

func TestUI_Assets_SelfContained(t *testing.T) {
	srv, _ := newUIServer(t, uiToken, true)
	for _, p := range []string{"/ui/", "/ui/app.js", "/ui/style.css"} {
		resp := uiDo(t, "GET", srv.URL+p, "", nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", p, resp.StatusCode)
		}
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", p, csp)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: no nosniff", p)
		}
	}
	if resp := uiDo(t, "GET", srv.URL+"/ui", "", nil); resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d to %q, want a redirect to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp := uiDo(t, "POST", srv.URL+"/ui/app.js", "", nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui/app.js: %d, want 405", resp.StatusCode)
	}
	// No asset reaches out of the agent: no URL with a host, no inline
	// script or style that the policy would block.
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|<script>|style="`)
	err := filepath.WalkDir("ui", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range external.FindAllString(string(b), -1) {
			t.Errorf("%s: %q reaches outside the agent or needs an inline exception", p, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestUI_Login_Cookie(t *testing.T) {
	srv, _ := newUIServer(t, uiToken, true)
	json := map[string]string{"Content-Type": "application/json"}
	for _, tc := range []struct {
		name, body string
		header     map[string]string
		want       int
	}{
		{"wrong token", `{"token":"nope"}`, json, http.StatusUnauthorized},
		{"token prefix", `{"token":"` + uiToken[:5] + `"}`, json, http.StatusUnauthorized},
		{"empty", `{"token":""}`, json, http.StatusUnauthorized},
		{"form body", "token=" + uiToken, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, http.StatusUnsupportedMediaType},
		{"not JSON", "{", json, http.StatusBadRequest},
	} {
		resp := uiDo(t, "POST", srv.URL+"/ui/login", tc.body, tc.header)
		if resp.StatusCode != tc.want || len(resp.Cookies()) != 0 {
			t.Errorf("%s: %d with cookies %v, want %d and none", tc.name, resp.StatusCode, resp.Cookies(), tc.want)
		}
		if strings.Contains(readBody(resp), uiToken) {
			t.Errorf("%s: the answer shows the token", tc.name)
		}
	}
	c := uiLogin(t, srv, uiToken)
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" {
		t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, Path=/", c)
	}
	if strings.Contains(c.Value, uiToken) || c.Value == "" {
		t.Errorf("cookie value %q holds the token or nothing", c.Value)
	}
	resp := uiDo(t, "POST", srv.URL+"/ui/logout", "", nil)
	if resp.StatusCode != http.StatusNoContent || len(resp.Cookies()) != 1 || resp.Cookies()[0].MaxAge >= 0 {
		t.Errorf("logout: %d %v, want 204 and the cookie removed", resp.StatusCode, resp.Cookies())
	}
}

func TestUI_Session_ReadsAndAuditedActionsOnly(t *testing.T) {
	srv, b := newUIServer(t, uiToken, true)
	c := uiLogin(t, srv, uiToken)
	ui := map[string]string{api.UIHeader: "1"}

	// No state without the session; a forged cookie is no session.
	for _, cookies := range [][]*http.Cookie{nil, {{Name: api.UICookie, Value: uiToken}}, {{Name: api.UICookie, Value: c.Value[:10]}}} {
		if resp := uiDo(t, "GET", srv.URL+"/v1/volumes", "", nil, cookies...); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET /v1/volumes with cookies %v: %d, want 401", cookies, resp.StatusCode)
		}
	}
	for _, p := range []string{"/v1/volumes", "/v1/plugins", "/v1/events"} {
		if resp := uiDo(t, "GET", srv.URL+p, "", nil, c); resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s with the session: %d %s", p, resp.StatusCode, readBody(resp))
		}
	}
	for _, tc := range []struct{ method, path string }{
		{"PUT", "/v1/volumes/v1"},
		{"POST", "/v1/volumes/v1/claims"},
		{"DELETE", "/v1/volumes/v1/claims/a1"}, // not forced
		{"DELETE", "/v1/volumes/v1/claims/a1?force=true&x=1"},
		{"DELETE", "/v1/volumes/v1"},
		{"POST", "/v1/secrets/reseal"},
	} {
		if resp := uiDo(t, tc.method, srv.URL+tc.path, "{}", ui, c); resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s %s with the session: %d %s, want 403", tc.method, tc.path, resp.StatusCode, readBody(resp))
		}
	}
	// The action without the UI's header (as a form of another site
	// would send it) is refused.
	if resp := uiDo(t, "DELETE", srv.URL+"/v1/volumes/v1/claims/a1?force=true", "", nil, c); resp.StatusCode != http.StatusForbidden {
		t.Errorf("force release without %s: %d, want 403", api.UIHeader, resp.StatusCode)
	}
	if evs, rel := b.events(); len(evs) != 0 || len(rel) != 0 {
		t.Fatalf("refused requests recorded %v, released %v", evs, rel)
	}

	resp := uiDo(t, "DELETE", srv.URL+"/v1/volumes/v1/claims/a1?force=true", "", ui, c)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("force release: %d %s", resp.StatusCode, readBody(resp))
	}
	evs, rel := b.events()
	if len(rel) != 1 || rel[0] != "v1/a1" {
		t.Errorf("released %v, want v1/a1", rel)
	}
	if len(evs) != 1 || evs[0].Type != runtime.EventUIAction || evs[0].Volume != "v1" || evs[0].Alloc != "a1" ||
		!strings.Contains(evs[0].Message, "web UI: forced release of the claim of a1 on volume v1: done") {
		t.Errorf("recorded %+v, want one ui-action naming the forced release", evs)
	}
	// A fence the backend refuses (not in cluster mode) is recorded with
	// how it ended.
	if resp := uiDo(t, "POST", srv.URL+"/v1/nodes/n2/fence", "", ui, c); resp.StatusCode != http.StatusNotFound {
		t.Errorf("fence: %d, want 404 from a backend without nodes", resp.StatusCode)
	}
	if evs, _ := b.events(); len(evs) != 2 || evs[1].Message != "web UI: fence of host n2: refused: 404 Not Found" {
		t.Errorf("recorded %+v, want the refused fence", evs)
	}
	// The bearer token still opens everything.
	if resp := uiDo(t, "DELETE", srv.URL+"/v1/volumes/v1", "", map[string]string{"Authorization": "Bearer " + uiToken}); resp.StatusCode == http.StatusForbidden {
		t.Errorf("bearer DELETE: 403")
	}
}

func TestUI_Off_NotServed(t *testing.T) {
	srv, _ := newUIServer(t, uiToken, false)
	if resp := uiDo(t, "GET", srv.URL+"/ui/", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /ui/ with api.ui off: %d, want 401 like any path but health", resp.StatusCode)
	}
	if resp := uiDo(t, "POST", srv.URL+"/ui/login", `{"token":"`+uiToken+`"}`, map[string]string{"Content-Type": "application/json"}); len(resp.Cookies()) != 0 {
		t.Errorf("login with api.ui off set a cookie")
	}
	// Without a token the pages are served but the login is refused.
	srv, _ = newUIServer(t, "", true)
	if resp := uiDo(t, "GET", srv.URL+"/ui/", "", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /ui/ without a token: %d", resp.StatusCode)
	}
	if resp := uiDo(t, "POST", srv.URL+"/ui/login", `{"token":""}`, map[string]string{"Content-Type": "application/json"}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("login without a token: %d, want 404", resp.StatusCode)
	}
}
