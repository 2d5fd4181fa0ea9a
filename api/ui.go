package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/runtime"
)

// The web UI (Options.UI on the TCP handler): static pages under /ui/ that
// read the agent's state from the API in the browser. They hold nothing
// of the agent's state themselves, so they are served to anyone; the API
// they call needs the token, which the UI trades once for a session
// cookie at POST /ui/login.

//go:embed ui
var uiFiles embed.FS

// UICookie is the name of the web UI's session cookie: HttpOnly,
// SameSite=Strict, "<token name>.<HMAC keyed by the token>" (never the
// token itself).
const UICookie = "csiactor-ui"

// UIHeader must be set (to any value) on the requests the web UI's
// session makes that change something: a request a page of another site
// could send gets no such header without a CORS preflight, which the
// agent never answers.
const UIHeader = "X-Csiactor-UI"

// uiCSP keeps the pages to their own assets and the agent's API.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// uiSession is the cookie value of a session opened with the token named
// name: the name and an HMAC keyed by the token, so the cookie is
// worthless once the token changes or is revoked, and the token is never
// in the browser's cookie jar.
func uiSession(name, token string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("csiactor web UI session\x00" + name))
	return name + "." + hex.EncodeToString(m.Sum(nil))
}

// uiServer serves /ui/ and the API requests of its sessions.
type uiServer struct {
	s       *server
	tokens  *Tokens
	assets  http.Handler
	actions *http.ServeMux // what a session may do on /v1
}

func newUIServer(s *server, tokens *Tokens) *uiServer {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	u := &uiServer{
		s:       s,
		tokens:  tokens,
		assets:  http.StripPrefix("/ui/", http.FileServerFS(sub)),
		actions: http.NewServeMux(),
	}
	u.actions.Handle("GET /v1/", s)
	u.actions.HandleFunc("DELETE /v1/volumes/{id}/claims/{alloc}", u.forceRelease)
	u.actions.HandleFunc("POST /v1/nodes/{id}/fence", u.fence)
	return u
}

// isUIPath reports whether r is for the UI's own routes.
func isUIPath(p string) bool { return p == "/ui" || strings.HasPrefix(p, "/ui/") }

// serveUI serves the pages, /ui/login and /ui/logout.
func (u *uiServer) serveUI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", uiCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	switch {
	case r.URL.Path == "/ui":
		http.Redirect(w, r, "/ui/", http.StatusMovedPermanently)
	case r.URL.Path == "/ui/login":
		u.login(w, r)
	case r.URL.Path == "/ui/logout":
		u.logout(w, r)
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s (allowed: GET, HEAD)", r.Method, r.URL.Path))
	case cleanPath(r.URL.Path) != r.URL.Path:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path %q is not canonical", r.URL.Path))
	default:
		u.assets.ServeHTTP(w, r)
	}
}

// login checks the token of a JSON body {"token": "..."} and opens a
// session: 204 with the cookie, 401 for a wrong token, 404 when the agent
// has no token (the API is not served over TCP).
func (u *uiServer) login(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeError(w, http.StatusMethodNotAllowed, "POST the token as JSON {\"token\": \"...\"} to sign in")
		return
	}
	if !u.tokens.Configured() {
		writeError(w, http.StatusNotFound, "the API is served on the agent's unix socket only; set api.token_file or api.tokens to use the web UI")
		return
	}
	// A JSON content type cannot be sent across sites without a CORS
	// preflight, which is never answered.
	if ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";"); strings.TrimSpace(ct) != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "send the token as application/json {\"token\": \"...\"}")
		return
	}
	var body struct {
		Token string `json:"token"`
	}
	r.Body = http.MaxBytesReader(w, r.Body, 8192)
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "request body: want JSON {\"token\": \"...\"}")
		return
	}
	tok := strings.TrimSpace(body.Token)
	id, ok := u.tokens.Lookup(tok)
	if !ok {
		writeError(w, http.StatusUnauthorized, "wrong token")
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name:     UICookie,
		Value:    uiSession(id.Name, tok),
		Path:     "/",
		HttpOnly: true,
		SameSite: http.SameSiteStrictMode,
		Secure:   r.TLS != nil,
	})
	w.WriteHeader(http.StatusNoContent)
}

// logout ends the browser's session.
func (u *uiServer) logout(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeError(w, http.StatusMethodNotAllowed, "POST to sign out")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: UICookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	w.WriteHeader(http.StatusNoContent)
}

// session returns the identity of the session whose cookie r carries:
// the cookie must be the one of the named token's current value.
func (u *uiServer) session(r *http.Request) (Identity, bool) {
	c, err := r.Cookie(UICookie)
	if err != nil {
		return Identity{}, false
	}
	name, _, ok := strings.Cut(c.Value, ".")
	if !ok {
		return Identity{}, false
	}
	tok, id, ok := u.tokens.byName(name)
	if !ok {
		return Identity{}, false
	}
	want := sha256.Sum256([]byte(uiSession(name, tok)))
	got := sha256.Sum256([]byte(c.Value))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return Identity{}, false
	}
	return id, true
}

// serveSession serves an API request of a UI session of id: reads, a
// forced release and a fence, as far as id's scope allows; anything else
// is 403.
func (u *uiServer) serveSession(w http.ResponseWriter, r *http.Request, id Identity) {
	if _, pattern := u.actions.Handler(r); pattern == "" {
		writeError(w, http.StatusForbidden, "the web UI may only read, force a release and fence a host; use the CLI or a bearer token for the rest")
		return
	}
	if need := u.s.scopeOf(r); !id.Scope.Allows(need) {
		writeError(w, http.StatusForbidden, forbiddenMessage(need, id))
		return
	}
	u.actions.ServeHTTP(w, r)
}

// action checks that r is a UI action (UIHeader set, query as want), then
// serves it and records an EventUIAction naming what and how it ended.
func (u *uiServer) action(w http.ResponseWriter, r *http.Request, what string, ev runtime.Event, wantQuery string) {
	if r.Header.Get(UIHeader) == "" {
		writeError(w, http.StatusForbidden, "a web UI action needs the "+UIHeader+" header")
		return
	}
	if r.URL.RawQuery != wantQuery {
		writeError(w, http.StatusForbidden, fmt.Sprintf("the web UI may only %s (query %q)", what, wantQuery))
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	u.s.ServeHTTP(sw, r)
	outcome := "done"
	if sw.status >= 300 {
		outcome = fmt.Sprintf("refused: %d %s", sw.status, http.StatusText(sw.status))
	}
	id := identityOf(r.Context())
	infoOf(r.Context()).recorded = true
	ev.Type = runtime.EventUIAction
	ev.Token = id.Name
	ev.Message = fmt.Sprintf("web UI: %s: %s", what, outcome)
	if rec, ok := u.s.b.(EventRecorder); ok {
		if err := rec.RecordEvent(ev); err != nil {
			u.s.log.WithError(err).WithField("action", what).Warn("web UI action not recorded as an event")
		}
	}
	u.s.log.WithFields(logrus.Fields{"action": what, "outcome": outcome, "token": id.Name}).Info("web UI action")
}

func (u *uiServer) forceRelease(w http.ResponseWriter, r *http.Request) {
	vol, ok := pathID(w, r, "id")
	if !ok {
		return
	}
	alloc, ok := pathID(w, r, "alloc")
	if !ok {
		return
	}
	u.action(w, r, fmt.Sprintf("forced release of the claim of %s on volume %s", alloc, vol),
		runtime.Event{Volume: vol, Alloc: alloc}, "force=true")
}

func (u *uiServer) fence(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok {
		return
	}
	u.action(w, r, "fence of host "+id, runtime.Event{}, "")
}

// EventRecorder is what a Backend adds to have the API's own events (the
// web UI's actions) in its event stream. *runtime.Runtime implements it.
type EventRecorder interface {
	// RecordEvent adds e to the events (see runtime.Runtime.RecordEvent).
	RecordEvent(e runtime.Event) error
}

var _ EventRecorder = (*runtime.Runtime)(nil)
