package api_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/runtime"
)

// scopeTokens are the tokens of the scope tests, one per scope.
var scopeTokens = []struct {
	name, value string
	scope       api.Scope
}{
	{"monitor", "read-t0ken-1", api.ScopeRead},
	{"scheduler", "claim-t0ken-2", api.ScopeClaim},
	{"admin", "operator-t0ken-3", api.ScopeOperator},
}

// writeToken writes value to a 0600 token file in dir.
func writeToken(t *testing.T, dir, name, value string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// scopeSpecs writes the files of scopeTokens and returns their specs.
func scopeSpecs(t *testing.T) []api.TokenSpec {
	t.Helper()
	dir := t.TempDir()
	var specs []api.TokenSpec
	for i, tk := range scopeTokens {
		specs = append(specs, api.TokenSpec{Key: "api.tokens[" + string(rune('0'+i)) + "]", Name: tk.name,
			File: writeToken(t, dir, tk.name, tk.value), Scope: tk.scope})
	}
	return specs
}

// serveTokens serves NewTCPHandler over b with tokens on a real TCP
// listener.
func serveTokens(t *testing.T, b api.Backend, tokens *api.Tokens, opts api.Options) *rawClient {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts.Tokens = tokens
	apitest.ServeListener(t, l, api.NewTCPHandler(b, "", opts))
	return newRawClient(t, "http://"+l.Addr().String())
}

// Every operation of openapi.yaml states the scope it needs
// (x-csiactor-scope), and it is the scope the router gives its route: a
// route without a scope, or a scope the file does not state, fails.
func TestOpenAPI_Scopes_MatchRouter(t *testing.T) {
	doc := loadSpec(t)
	scopes := api.RouteScopes(api.Options{Metrics: http.NotFoundHandler()})
	stated := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			route := method + " " + path
			v, ok := op.Extensions["x-csiactor-scope"].(string)
			if !ok {
				t.Errorf("%s: no x-csiactor-scope in %s", route, specPath)
				continue
			}
			stated[route] = true
			if got, ok := scopes[route]; !ok {
				t.Errorf("%s: %s states scope %q, the router has no such route", route, specPath, v)
			} else if string(got) != v {
				t.Errorf("%s: %s states scope %q, the router needs %q", route, specPath, v, got)
			}
			if need := api.Scope(v); need != api.ScopePublic && need != api.ScopeRead {
				if _, ok := op.Responses.Map()["403"]; !ok {
					t.Errorf("%s: needs %s but describes no 403", route, v)
				}
			}
		}
	}
	for route, s := range scopes {
		if !stated[route] {
			t.Errorf("route %s (scope %s) is not in %s", route, s, specPath)
		}
		if s == "" {
			t.Errorf("route %s has no scope", route)
		}
	}
}

// scopeRequest is one request of the scope table: an operation with its
// path parameters filled in, and the scope it needs.
type scopeRequest struct {
	method, path string
	need         api.Scope
}

// scopeRequests returns a request for every operation of the spec (with
// the scope it states) and the forced variants, which need operator.
func scopeRequests(t *testing.T) []scopeRequest {
	doc := loadSpec(t)
	var reqs []scopeRequest
	for _, op := range specOperations(doc) {
		method, path, _ := strings.Cut(op, " ")
		o := doc.Paths.Find(path).GetOperation(method)
		need := api.Scope(o.Extensions["x-csiactor-scope"].(string))
		for _, p := range []string{"{name}", "{id}", "{alloc}"} {
			path = strings.ReplaceAll(path, p, "x1")
		}
		reqs = append(reqs, scopeRequest{method, path, need})
	}
	return append(reqs,
		scopeRequest{"DELETE", "/v1/volumes/x1/claims/x1?force=true", api.ScopeOperator},
		scopeRequest{"DELETE", "/v1/volumes/x1/claims/x1?force=1", api.ScopeOperator},
		scopeRequest{"DELETE", "/v1/volumes/x1/claims/x1?force=maybe", api.ScopeOperator},
		scopeRequest{"DELETE", "/v1/volumes/x1/claims/x1?force=false", api.ScopeClaim},
		scopeRequest{"DELETE", "/v1/allocations/x1?force=true", api.ScopeOperator},
		scopeRequest{"DELETE", "/v1/volumes/x1?force=true", api.ScopeOperator},
	)
}

// For every operation of openapi.yaml and every scope, a real request
// with a token of that scope is refused with 403 exactly when the scope
// is not enough, and the 403 names the scope needed; the answers match
// the spec.
func TestTCPHandler_Scopes_Refused(t *testing.T) {
	sc := newSpecChecker(t)
	tokens, err := api.NewTokens(scopeSpecs(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	})
	rc := serveTokens(t, apitest.NewBackend(), tokens, api.Options{Metrics: metrics})
	for _, req := range scopeRequests(t) {
		for _, tk := range scopeTokens {
			status, body := sc.do(rc.hc, rc.base, req.method, req.path, "", "Authorization", "Bearer "+tk.value)
			refused := !tk.scope.Allows(req.need)
			if (status == http.StatusForbidden) != refused {
				t.Errorf("%s %s with the %s token: %d %s; want 403: %v", req.method, req.path, tk.scope, status, body, refused)
			}
			if refused && !strings.Contains(body, `this request needs the `+string(req.need)+` scope; token \"`+tk.name+`\" has `+string(tk.scope)) {
				t.Errorf("%s %s with the %s token: 403 body %s does not name the scope needed", req.method, req.path, tk.scope, body)
			}
		}
	}
	// GET /v1/whoami tells each token its name and scope.
	for _, tk := range scopeTokens {
		r := rc.do("GET", "/v1/whoami", "", "Authorization", "Bearer "+tk.value)
		if want := `{"name":"` + tk.name + `","scope":"` + string(tk.scope) + `"}`; r.status != 200 || strings.TrimSpace(r.body) != want {
			t.Errorf("whoami as %s: %d %s, want %s", tk.name, r.status, r.body, want)
		}
	}
}

// Each write records the name of its token, never its value, in an
// api-write event and in its log line; the unix socket records "unix".
func TestTCPHandler_Writes_RecordTokenName(t *testing.T) {
	l, hook := logtest.NewNullLogger()
	log := logrus.NewEntry(l)
	tokens, err := api.NewTokens(scopeSpecs(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &uiBackend{Backend: apitest.NewBackend()}
	rc := serveTokens(t, b, tokens, api.Options{Log: log})
	spec := `{"plugin":"p","type":"node","socket":"/run/p.sock"}`
	if r := rc.do("PUT", "/v1/allocations/a1", spec, "Authorization", "Bearer "+scopeTokens[2].value); r.status != 200 {
		t.Fatalf("PUT as admin: %d %s", r.status, r.body)
	}
	// A refused write (403) records nothing but its log line.
	if r := rc.do("PUT", "/v1/allocations/a2", spec, "Authorization", "Bearer "+scopeTokens[1].value); r.status != 403 {
		t.Fatalf("PUT as scheduler: %d %s", r.status, r.body)
	}
	unix := newRawClient(t, apitest.Serve(t, b, api.Options{Log: log}))
	if r := unix.do("DELETE", "/v1/allocations/a1", ""); r.status != 204 {
		t.Fatalf("DELETE on the unix socket: %d %s", r.status, r.body)
	}
	evs, _ := b.events()
	if len(evs) != 2 || evs[0].Type != runtime.EventAPIWrite || evs[0].Token != "admin" || evs[0].Alloc != "a1" ||
		evs[1].Type != runtime.EventAPIWrite || evs[1].Token != api.UnixTokenName || evs[1].Alloc != "a1" {
		t.Errorf("events %+v, want api-write by admin then by unix", evs)
	}
	type line struct {
		method, path string
		status       int
		token        string
	}
	var lines []line
	var logs strings.Builder
	for _, e := range hook.AllEntries() {
		s, _ := e.String()
		logs.WriteString(s)
		if e.Message != "request" {
			continue
		}
		st, _ := e.Data["status"].(int)
		tok, _ := e.Data["token"].(string)
		lines = append(lines, line{e.Data["method"].(string), e.Data["path"].(string), st, tok})
	}
	for _, want := range []line{{"PUT", "/v1/allocations/a1", 200, "admin"}, {"PUT", "/v1/allocations/a2", 403, "scheduler"},
		{"DELETE", "/v1/allocations/a1", 204, "unix"}} {
		if !slices.Contains(lines, want) {
			t.Errorf("no log line %+v in %+v", want, lines)
		}
	}
	for _, tk := range scopeTokens {
		if strings.Contains(logs.String(), tk.value) {
			t.Errorf("the log shows the value of token %s", tk.name)
		}
	}
}

// The api-write event of a write whose body, not its path, names its
// object names it too: the volume a create makes (and its plugin), the
// alloc of a claim; so `events -volume` and `-alloc` find who did it.
func TestTCPHandler_Writes_NameBodyObjects(t *testing.T) {
	tokens, err := api.NewTokens(scopeSpecs(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &uiBackend{Backend: apitest.NewBackend()}
	rc := serveTokens(t, b, tokens, api.Options{})
	admin, scheduler := "Bearer "+scopeTokens[2].value, "Bearer "+scopeTokens[1].value
	for _, w := range []struct{ method, path, body, auth string }{
		{"PUT", "/v1/allocations/a1", `{"plugin":"p","type":"monolith","socket":"/run/p.sock"}`, admin},
		{"POST", "/v1/volumes", `{"id":"v1","plugin":"p","capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}]}`, admin},
		{"POST", "/v1/volumes/v1/claims", `{"alloc":"a1","mode":"write","access_mode":"single-node-writer","attachment_mode":"file-system"}`, scheduler},
	} {
		if r := rc.do(w.method, w.path, w.body, "Authorization", w.auth, "Content-Type", "application/json"); r.status >= 300 {
			t.Fatalf("%s %s: %d %s", w.method, w.path, r.status, r.body)
		}
	}
	evs, _ := b.events()
	type about struct{ token, plugin, volume, alloc string }
	var got []about
	for _, e := range evs {
		got = append(got, about{e.Token, e.Plugin, e.Volume, e.Alloc})
	}
	want := []about{{"admin", "", "", "a1"}, {"admin", "p", "v1", ""}, {"scheduler", "", "v1", "a1"}}
	if !slices.Equal(got, want) {
		t.Errorf("api-write events name %+v, want %+v", got, want)
	}
}

// waitStatus sends GET /v1/whoami with token until it answers want.
func waitStatus(t *testing.T, rc *rawClient, token string, want int) rawResponse {
	t.Helper()
	var r rawResponse
	waitFor(t, fmt.Sprintf("GET /v1/whoami to answer %d", want), func() bool {
		r = rc.do("GET", "/v1/whoami", "", "Authorization", "Bearer "+token)
		return r.status == want
	})
	return r
}

// A token file changed on a live listener: the new value works, and the
// old one is refused, from the very next request; a removed file revokes
// its token at once, with an error naming its key and not the value; a
// file made invalid (readable by others) keeps it revoked; a valid file
// again brings it back. The other tokens work throughout. No request
// waits: the files are looked at on every request.
func TestTokens_FileRotation(t *testing.T) {
	l, hook := logtest.NewNullLogger()
	specs := scopeSpecs(t)
	tokens, err := api.NewTokens(specs, logrus.NewEntry(l))
	if err != nil {
		t.Fatal(err)
	}
	rc := serveTokens(t, apitest.NewBackend(), tokens, api.Options{})
	monitor, old := specs[0].File, scopeTokens[0].value
	waitStatus(t, rc, old, 200)

	// Replace the file (a new inode, as editors and secret managers do).
	const rotated = "read-t0ken-rotated"
	tmp := writeToken(t, filepath.Dir(monitor), ".monitor.new", rotated)
	if err := os.Rename(tmp, monitor); err != nil {
		t.Fatal(err)
	}
	if r := statusNow(t, rc, rotated, 200); !strings.Contains(r.body, `"name":"monitor"`) {
		t.Errorf("rotated token is %s, want monitor", r.body)
	}
	if r := rc.do("GET", "/v1/whoami", "", "Authorization", "Bearer "+old); r.status != 401 {
		t.Errorf("old value after the rotation: %d %s, want 401", r.status, r.body)
	}
	// Rewrite in place, same length.
	const inPlace = "read-t0ken-inplace"
	if err := os.WriteFile(monitor, []byte(inPlace+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	statusNow(t, rc, inPlace, 200)
	if r := rc.do("GET", "/v1/whoami", "", "Authorization", "Bearer "+rotated); r.status != 401 {
		t.Errorf("value before the rewrite: %d, want 401", r.status)
	}

	// Removed: revoked.
	if err := os.Remove(monitor); err != nil {
		t.Fatal(err)
	}
	statusNow(t, rc, inPlace, 401)
	statusNow(t, rc, scopeTokens[1].value, 200)
	// Back, but readable by others: still revoked.
	if err := os.WriteFile(monitor, []byte(inPlace+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(monitor, 0o644); err != nil {
		t.Fatal(err)
	}
	statusNow(t, rc, inPlace, 401)
	if !logged(hook, "token file invalid: token revoked") {
		t.Errorf("no error logged for the 0644 token file")
	}
	// Fixed: back in use.
	if err := os.Chmod(monitor, 0o600); err != nil {
		t.Fatal(err)
	}
	statusNow(t, rc, inPlace, 200)

	var gone bool
	for _, e := range hook.AllEntries() {
		s, _ := e.String()
		for _, v := range []string{old, rotated, inPlace} {
			if strings.Contains(s, v) {
				t.Errorf("log line shows a token value: %s", s)
			}
		}
		if e.Message == "token file gone: token revoked" {
			gone = e.Level == logrus.ErrorLevel && e.Data["key"] == "api.tokens[0].file" && e.Data["token"] == "monitor"
		}
	}
	if !gone {
		t.Errorf("no error naming api.tokens[0].file when the file was removed")
	}
}

// statusNow asks GET /v1/whoami once with token and fails t unless the
// answer is want.
func statusNow(t *testing.T, rc *rawClient, token string, want int) rawResponse {
	t.Helper()
	r := rc.do("GET", "/v1/whoami", "", "Authorization", "Bearer "+token)
	if r.status != want {
		t.Errorf("GET /v1/whoami with the token: %d %s, want %d", r.status, r.body, want)
	}
	return r
}

// logged reports whether hook has an entry with message msg.
func logged(hook *logtest.Hook, msg string) bool {
	for _, e := range hook.AllEntries() {
		if e.Message == msg {
			return true
		}
	}
	return false
}

// NewTokens refuses bad token files and configs with an error naming the
// key, never the value, and a value two tokens share.
func TestNewTokens_Errors(t *testing.T) {
	dir := t.TempDir()
	good := writeToken(t, dir, "good", "g00d-value")
	same := writeToken(t, dir, "same", "g00d-value")
	open := writeToken(t, dir, "open", "0pen-value")
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	empty := writeToken(t, dir, "empty", "")
	spec := func(i int, name, file string, scope api.Scope) api.TokenSpec {
		return api.TokenSpec{Key: "api.tokens[" + string(rune('0'+i)) + "]", Name: name, File: file, Scope: scope}
	}
	for _, tc := range []struct {
		name  string
		specs []api.TokenSpec
		want  string
	}{
		{"missing file", []api.TokenSpec{spec(0, "a", filepath.Join(dir, "nope"), api.ScopeRead)}, "api.tokens[0].file: token file: stat "},
		{"group readable", []api.TokenSpec{spec(0, "a", open, api.ScopeRead)}, "api.tokens[0].file: token file " + open + ": mode 0644"},
		{"empty", []api.TokenSpec{spec(0, "a", empty, api.ScopeRead)}, "api.tokens[0].file: token file " + empty + " is empty"},
		{"unknown scope", []api.TokenSpec{spec(0, "a", good, api.ScopeRead), spec(1, "b", good, "admin")}, `api.tokens[1].scope: "admin": want read, claim or operator`},
		{"public scope", []api.TokenSpec{spec(0, "a", good, api.ScopePublic)}, `api.tokens[0].scope: "public"`},
		{"the unix socket's name", []api.TokenSpec{spec(0, "unix", good, api.ScopeRead)}, `api.tokens[0].name: "unix" is the name the unix socket's requests are recorded under`},
		{"empty name", []api.TokenSpec{spec(0, "", good, api.ScopeRead)}, "api.tokens[0].name: must not be empty"},
		{"same name", []api.TokenSpec{spec(0, "a", good, api.ScopeRead), spec(1, "a", open, api.ScopeRead)}, `api.tokens[1].name: "a" is also the name of api.tokens[0]`},
		{"same value", []api.TokenSpec{{Key: "api.token_file", Name: "default", File: good, Scope: api.ScopeOperator}, spec(0, "a", same, api.ScopeRead)},
			"api.tokens[0].file: the same token as api.token_file"},
	} {
		_, err := api.NewTokens(tc.specs, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewTokens = %v, want %q", tc.name, err, tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), "g00d-value") || strings.Contains(err.Error(), "0pen-value")) {
			t.Errorf("%s: the error shows a token value: %v", tc.name, err)
		}
	}
}
