package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/runtime"
)

// DefaultMaxBodyBytes is the largest request body the handlers read when
// Options.MaxBodyBytes is zero.
const DefaultMaxBodyBytes = 1 << 20

// Options configures the handlers.
type Options struct {
	// Log receives one line per request (method, path, status, duration).
	// Nil discards them.
	Log *logrus.Entry
	// MaxBodyBytes limits request bodies; larger ones get 413. Zero means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Metrics, when set, is served at GET /metrics.
	Metrics http.Handler
	// UI serves the web UI at /ui/ (NewTCPHandler only): pages that read
	// the API from the browser with a session cookie, which POST
	// /ui/login gives for the token.
	UI bool
	// Tokens, when set, are the bearer tokens of NewTCPHandler (which
	// then ignores its token argument).
	Tokens *Tokens
}

// NewHandler returns the full API over b, as served on the agent's unix
// socket: every /v1 route, and /metrics when opts.Metrics is set. Its
// requests have ScopeOperator and are recorded under UnixTokenName: the
// socket's file permissions decide who may connect.
func NewHandler(b Backend, opts Options) http.Handler {
	s := newServer(b, opts)
	return s.logged(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		infoOf(r.Context()).id = Identity{Name: UnixTokenName, Scope: ScopeOperator}
		s.ServeHTTP(w, r)
	}))
}

// NewTCPHandler returns the handler of the agent's TCP listener: /metrics
// (when opts.Metrics is set), GET /v1/health and GET /v1/ready for anyone;
// the rest of the API only when a token is configured, and then only for
// requests with "Authorization: Bearer <token>" (401 otherwise) whose
// token's scope allows them (403 otherwise, naming the scope needed).
// Without a token the rest of the API answers 404 with a hint.
//
// The tokens are opts.Tokens when set; otherwise token, when not empty,
// is the one token, named DefaultTokenName, with ScopeOperator.
//
// With opts.UI it also serves the web UI at /ui/ to anyone (the pages
// hold no state), POST /ui/login, which trades a token for a session
// cookie, and, for requests with that cookie, what the token's scope
// allows of the API's reads, a forced release and a fence (403 for the
// rest), each action recorded as an EventUIAction when b is an
// EventRecorder.
func NewTCPHandler(b Backend, token string, opts Options) http.Handler {
	s := newServer(b, opts)
	tokens := opts.Tokens
	if tokens == nil {
		tokens = staticTokens(token)
	}
	var ui *uiServer
	if opts.UI {
		ui = newUIServer(s, tokens)
	}
	return s.logged(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/health" || r.URL.Path == "/v1/ready" || r.URL.Path == "/metrics" {
			s.ServeHTTP(w, r)
			return
		}
		if ui != nil && isUIPath(r.URL.Path) {
			ui.serveUI(w, r)
			return
		}
		if !tokens.Configured() {
			writeError(w, http.StatusNotFound, "the API is served on the agent's unix socket only; set api.token_file or api.tokens to serve it over TCP")
			return
		}
		if ui != nil && r.Header.Get("Authorization") == "" {
			if id, ok := ui.session(r); ok {
				infoOf(r.Context()).id = id
				ui.serveSession(w, r, id)
				return
			}
		}
		got, ok := bearerToken(r.Header.Get("Authorization"))
		var id Identity
		if ok {
			id, ok = tokens.Lookup(got)
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="csiactor"`)
			writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		infoOf(r.Context()).id = id
		if need := s.scopeOf(r); !id.Scope.Allows(need) {
			writeError(w, http.StatusForbidden, forbiddenMessage(need, id))
			return
		}
		s.ServeHTTP(w, r)
	}))
}

// whoami answers who the request's token is: its name and scope.
func (s *server) whoami(w http.ResponseWriter, r *http.Request) {
	if !s.noQuery(w, r) {
		return
	}
	writeJSON(w, http.StatusOK, identityOf(r.Context()))
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header value. The scheme is case-insensitive (RFC 9110 §11.1) and may be
// followed by more than one space; the token itself is taken as it is.
func bearerToken(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimLeft(tok, " ")
	return tok, tok != ""
}

// TimeoutHeader is the request header in which a Client sends how long it
// waits for the answer (a Go duration, like "30s"): a claim, release,
// create, expansion or modification waiting for a restarting plugin ends
// its wait in time to answer 503 before then (a tenth of it, at most a
// second, early).
const TimeoutHeader = "Csiactor-Timeout"

type server struct {
	b       Backend
	log     *logrus.Entry
	maxBody int64
	mux     *http.ServeMux
	routes  []string         // every pattern registered on mux, in order
	scopes  map[string]Scope // the scope each pattern needs on TCP
}

// routeMux registers handlers on a server's mux and records their
// patterns in server.routes and the scope each needs on the TCP listener
// in server.scopes: the tables the tests check against openapi.yaml (and
// its x-csiactor-scope) in both directions.
type routeMux struct{ s *server }

func (m routeMux) HandleFunc(scope Scope, pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(scope, pattern, http.HandlerFunc(h))
}

func (m routeMux) Handle(scope Scope, pattern string, h http.Handler) {
	m.s.routes = append(m.s.routes, pattern)
	m.s.scopes[pattern] = scope
	m.s.mux.Handle(pattern, h)
}

// scopeOf returns the scope r needs: its route's, or ScopeOperator for a
// forced release or deregistration (a force query parameter that is not
// false), or ScopeRead for a request no route serves (it gets a 404 or
// 405).
func (s *server) scopeOf(r *http.Request) Scope {
	_, pattern := s.mux.Handler(r)
	need, ok := s.scopes[pattern]
	if !ok {
		return ScopeRead
	}
	if need.rank() < ScopeOperator.rank() {
		if q, err := url.ParseQuery(r.URL.RawQuery); err != nil || forced(q) {
			return ScopeOperator
		}
	}
	return need
}

// forced reports whether q asks for force: a force parameter that is not
// a false value (an invalid one counts as asking).
func forced(q url.Values) bool {
	for _, v := range q["force"] {
		if b, err := strconv.ParseBool(v); err != nil || b {
			return true
		}
	}
	return false
}

func newServer(b Backend, opts Options) *server {
	s := &server{b: b, log: opts.Log, maxBody: opts.MaxBodyBytes, mux: http.NewServeMux(), scopes: map[string]Scope{}}
	if s.log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		s.log = logrus.NewEntry(l)
	}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	m := routeMux{s}
	m.HandleFunc(ScopePublic, "GET /v1/health", s.health)
	m.HandleFunc(ScopePublic, "GET /v1/ready", s.ready)
	m.HandleFunc(ScopeRead, "GET /v1/plugins", s.plugins)
	m.HandleFunc(ScopeRead, "GET /v1/plugins/{name}", s.plugin)
	m.HandleFunc(ScopeRead, "GET /v1/plugins/{name}/capacity", s.pluginCapacity)
	m.HandleFunc(ScopeRead, "GET /v1/plugins/{name}/volumes", s.externalVolumes)
	m.HandleFunc(ScopeOperator, "POST /v1/plugins/{name}/call", s.callPlugin)
	m.HandleFunc(ScopeRead, "GET /v1/allocations", s.allocations)
	m.HandleFunc(ScopeOperator, "PUT /v1/allocations/{id}", s.registerAllocation)
	m.HandleFunc(ScopeOperator, "DELETE /v1/allocations/{id}", s.deregisterAllocation)
	m.HandleFunc(ScopeRead, "GET /v1/allocations/{id}/logs", s.allocationLogs)
	m.HandleFunc(ScopeRead, "GET /v1/volumes", s.volumes)
	m.HandleFunc(ScopeOperator, "POST /v1/volumes", s.createVolume)
	m.HandleFunc(ScopeOperator, "POST /v1/volumes/batch", s.registerVolumes)
	m.HandleFunc(ScopeRead, "GET /v1/volumes/{id}", s.volume)
	m.HandleFunc(ScopeOperator, "PUT /v1/volumes/{id}", s.registerVolume)
	m.HandleFunc(ScopeOperator, "DELETE /v1/volumes/{id}", s.deleteVolume)
	m.HandleFunc(ScopeOperator, "POST /v1/volumes/{id}/expand", s.expandVolume)
	m.HandleFunc(ScopeOperator, "POST /v1/volumes/{id}/modify", s.modifyVolume)
	m.HandleFunc(ScopeClaim, "POST /v1/volumes/{id}/claims", s.claim)
	m.HandleFunc(ScopeClaim, "DELETE /v1/volumes/{id}/claims/{alloc}", s.release)
	m.HandleFunc(ScopeRead, "GET /v1/snapshots", s.snapshots)
	m.HandleFunc(ScopeOperator, "POST /v1/snapshots", s.createSnapshot)
	m.HandleFunc(ScopeRead, "GET /v1/snapshots/{id}", s.snapshot)
	m.HandleFunc(ScopeOperator, "DELETE /v1/snapshots/{id}", s.deleteSnapshot)
	m.HandleFunc(ScopeRead, "GET /v1/events", s.events)
	m.HandleFunc(ScopeRead, "GET /v1/whoami", s.whoami)
	m.HandleFunc(ScopeRead, "GET /v1/nodes", s.nodes)
	m.HandleFunc(ScopeRead, "GET /v1/nodes/{id}", s.node)
	m.HandleFunc(ScopeOperator, "POST /v1/nodes/{id}/fence", s.fenceNode)
	m.HandleFunc(ScopeOperator, "POST /v1/secrets/reseal", s.resealSecrets)
	if opts.Metrics != nil {
		m.Handle(ScopePublic, "GET /metrics", opts.Metrics)
	}
	return s
}

// ServeHTTP routes r, turning the mux's own plain-text 404 and 405 answers
// into JSON ones, and its redirects of non-canonical paths into 400s.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The mux redirects paths that are not canonical ("/v1//x", "/a/../b")
	// to their cleaned form. Never redirect: a client that follows would
	// send a DELETE meant for one object to another. Refuse instead.
	if c := cleanPath(r.URL.Path); c != r.URL.Path {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("path %q is not canonical (cleaned, it is %q)", r.URL.Path, c))
		return
	}
	if h := r.Header.Get(TimeoutHeader); h != "" {
		d, err := time.ParseDuration(h)
		if err != nil || d <= 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("header %s: %q: want a positive duration like \"30s\"", TimeoutHeader, h))
			return
		}
		r = r.WithContext(runtime.WithAnswerBy(r.Context(), time.Now().Add(d-min(d/10, time.Second))))
	}
	if _, pattern := s.mux.Handler(r); pattern != "" {
		s.mux.ServeHTTP(w, r)
		return
	}
	rec := &headerRecorder{header: http.Header{}}
	s.mux.ServeHTTP(rec, r)
	switch {
	case rec.status == http.StatusMethodNotAllowed:
		w.Header().Set("Allow", rec.header.Get("Allow"))
		writeError(w, rec.status, fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, rec.header.Get("Allow")))
	case rec.status >= 300 && rec.status < 400:
		// Any other redirect (there is none with these patterns).
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such API route: %s %s (try %s)", r.Method, r.URL.Path, rec.header.Get("Location")))
	default:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such API route: %s %s", r.Method, r.URL.Path))
	}
}

// cleanPath is the canonical form of an URL path, as the mux computes it:
// path.Clean, keeping a trailing slash.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// headerRecorder keeps the status and headers of the mux's built-in
// answers and drops their plain-text bodies.
type headerRecorder struct {
	header http.Header
	status int
}

func (h *headerRecorder) Header() http.Header         { return h.header }
func (h *headerRecorder) Write(p []byte) (int, error) { return len(p), nil }
func (h *headerRecorder) WriteHeader(status int)      { h.status = status }

// health answers 200 {"status":"ok","cluster":...}: cluster is true when
// b is a NodesBackend in cluster mode.
func (s *server) health(w http.ResponseWriter, r *http.Request) {
	if !s.noQuery(w, r) {
		return
	}
	nb, ok := s.b.(NodesBackend)
	writeJSON(w, http.StatusOK, Health{Status: "ok", Cluster: ok && nb.InCluster()})
}

// Health is the answer of GET /v1/health.
type Health struct {
	// Status is "ok" whenever the agent answers.
	Status string `json:"status"`
	// Cluster is true in cluster mode: /v1/nodes lists the hosts (it
	// answers 404 otherwise).
	Cluster bool `json:"cluster"`
}

// ready answers 200 {"status":"ok"} once the agent has finished starting,
// and 503 {"status":"starting","pending":[...]} until then.
func (s *server) ready(w http.ResponseWriter, r *http.Request) {
	if !s.noQuery(w, r) {
		return
	}
	rd, err := s.b.Ready(r.Context())
	if err != nil {
		writeBackendError(w, err)
		return
	}
	code := http.StatusOK
	if rd.Status != runtime.ReadyOK {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, rd)
}

func (s *server) plugins(w http.ResponseWriter, r *http.Request) {
	if !s.noQuery(w, r) {
		return
	}
	ps, err := s.b.Plugins(r.Context())
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, nonNil(ps))
}

func (s *server) plugin(w http.ResponseWriter, r *http.Request) {
	name, ok := pathID(w, r, "name")
	if !ok || !s.noQuery(w, r) {
		return
	}
	p, err := s.b.Plugin(r.Context(), name)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func (s *server) allocations(w http.ResponseWriter, r *http.Request) {
	if !s.noQuery(w, r) {
		return
	}
	as, err := s.b.Allocations(r.Context())
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, nonNil(as))
}

func (s *server) registerAllocation(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok || !s.noQuery(w, r) {
		return
	}
	var spec runtime.AllocationSpec
	if !s.decode(w, r, &spec) || !valid(w, spec.Validate()) {
		return
	}
	a, err := s.b.RegisterAllocation(r.Context(), id, spec)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}

func (s *server) deregisterAllocation(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok {
		return
	}
	force, ok := forceParam(w, r)
	if !ok {
		return
	}
	if force {
		s.forceDeregisterAllocation(w, r, id)
		return
	}
	if err := s.b.DeregisterAllocation(r.Context(), id); err != nil {
		writeBackendError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// allocationLogs streams an exec-managed allocation's output as
// newline-delimited JSON LogLines: the last tail lines (every kept line
// without tail), then, with follow=true, every new line until the client
// goes or the allocation is deregistered.
func (s *server) allocationLogs(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok {
		return
	}
	q, ok := query(w, r, "follow", "tail")
	if !ok {
		return
	}
	follow, ok := boolParam(w, q, "follow")
	if !ok {
		return
	}
	lq := runtime.LogsQuery{Tail: -1, Follow: follow}
	if v := q.Get("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("tail: %q: want a whole number of lines, 0 or more", v))
			return
		}
		lq.Tail = n
	}
	rc := http.NewResponseController(w)
	started := false
	begin := func() error {
		if started {
			return nil
		}
		started = true
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		if follow {
			return rc.Flush()
		}
		return nil
	}
	if follow {
		// Unknown and attached allocations are refused before the stream
		// starts; the stream's headers go out at once, lines or not.
		if err := s.b.AllocationLogs(r.Context(), id, runtime.LogsQuery{Tail: 0}, func(runtime.LogLine) error { return nil }); err != nil {
			writeBackendError(w, err)
			return
		}
		if begin() != nil {
			return
		}
	}
	enc := json.NewEncoder(w)
	err := s.b.AllocationLogs(r.Context(), id, lq, func(l runtime.LogLine) error {
		if err := begin(); err != nil {
			return err
		}
		if err := enc.Encode(l); err != nil {
			return err
		}
		if follow {
			return rc.Flush()
		}
		return nil
	})
	if err != nil && !started {
		writeBackendError(w, err)
		return
	}
	if !started {
		_ = begin() // no lines
	}
}

func (s *server) volumes(w http.ResponseWriter, r *http.Request) {
	q, ok := query(w, r, "plugin", "node", "all_hosts", "per_page", "next_token")
	if !ok {
		return
	}
	allHosts, ok := boolParam(w, q, "all_hosts")
	if !ok {
		return
	}
	f := runtime.VolumeFilter{Plugin: q.Get("plugin"), Node: q.Get("node"), AllHosts: allHosts}
	if !valid(w, f.Validate()) {
		return
	}
	if !q.Has("per_page") {
		if q.Has("next_token") {
			writeError(w, http.StatusBadRequest, "next_token: give per_page with it")
			return
		}
		vs, err := s.b.Volumes(r.Context(), f)
		if err != nil {
			writeBackendError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, nonNil(vs))
		return
	}
	perPage, err := strconv.Atoi(q.Get("per_page"))
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("per_page: %q: want a whole number from 1 to %d", q.Get("per_page"), runtime.MaxVolumesPerPage))
		return
	}
	if !valid(w, runtime.ValidatePage(perPage, q.Get("next_token"))) {
		return
	}
	vs, next, err := s.b.VolumesPage(r.Context(), f, perPage, q.Get("next_token"))
	if err != nil {
		writeBackendError(w, err)
		return
	}
	if next != "" {
		w.Header().Set(NextTokenHeader, next)
	}
	writeJSON(w, http.StatusOK, nonNil(vs))
}

func (s *server) volume(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok || !s.noQuery(w, r) {
		return
	}
	v, err := s.b.Volume(r.Context(), id)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *server) registerVolume(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok || !s.noQuery(w, r) {
		return
	}
	var spec runtime.VolumeSpec
	if !s.decode(w, r, &spec) || !valid(w, spec.Validate()) {
		return
	}
	v, err := s.b.RegisterVolume(r.Context(), id, spec)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *server) createVolume(w http.ResponseWriter, r *http.Request) {
	if !s.noQuery(w, r) {
		return
	}
	var spec runtime.CreateVolumeSpec
	if !s.decode(w, r, &spec) || !valid(w, spec.Validate()) {
		return
	}
	infoOf(r.Context()).about = runtime.Event{Volume: spec.ID, Plugin: spec.Plugin}
	v, err := s.b.CreateVolume(r.Context(), spec)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	w.Header().Set("Location", "/v1/volumes/"+url.PathEscape(v.ID))
	writeJSON(w, http.StatusCreated, v)
}

func (s *server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok {
		return
	}
	q, ok := query(w, r, "delete", "force")
	if !ok {
		return
	}
	deleteToo, ok := boolParam(w, q, "delete")
	if !ok {
		return
	}
	force, ok := boolParam(w, q, "force")
	if !ok {
		return
	}
	if force {
		s.forceDeregisterVolume(w, r, id, deleteToo)
		return
	}
	if err := s.b.DeleteVolume(r.Context(), id, deleteToo); err != nil {
		writeBackendError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) expandVolume(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok || !s.noQuery(w, r) {
		return
	}
	var req runtime.ExpandRequest
	if !s.decode(w, r, &req) || !valid(w, req.Validate()) {
		return
	}
	v, err := s.b.ExpandVolume(r.Context(), id, req)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *server) modifyVolume(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok || !s.noQuery(w, r) {
		return
	}
	var req runtime.ModifyRequest
	if !s.decode(w, r, &req) || !valid(w, req.Validate()) {
		return
	}
	v, err := s.b.ModifyVolume(r.Context(), id, req)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *server) claim(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok {
		return
	}
	wait, ok := waitParam(w, r)
	if !ok {
		return
	}
	var req runtime.ClaimRequest
	if !s.decode(w, r, &req) || !valid(w, req.Validate()) {
		return
	}
	infoOf(r.Context()).about.Alloc = req.Alloc
	if wait > 0 {
		s.claimWait(w, r, id, req, wait)
		return
	}
	c, err := s.b.Claim(r.Context(), id, req)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (s *server) release(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok {
		return
	}
	alloc, ok := pathID(w, r, "alloc")
	if !ok {
		return
	}
	force, ok := forceParam(w, r)
	if !ok {
		return
	}
	if force {
		s.forceRelease(w, r, id, alloc)
		return
	}
	c, err := s.b.Release(r.Context(), id, alloc)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (s *server) events(w http.ResponseWriter, r *http.Request) {
	q, ok := query(w, r, "follow")
	if !ok {
		return
	}
	follow, ok := boolParam(w, q, "follow")
	if !ok {
		return
	}
	if !follow {
		evs, err := s.b.Events(r.Context())
		if err != nil {
			writeBackendError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		enc := json.NewEncoder(w)
		for _, ev := range evs {
			if enc.Encode(ev) != nil {
				return
			}
		}
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ch, err := s.b.Subscribe(ctx)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	enc := json.NewEncoder(w)
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-ch:
			if !ok {
				return
			}
			if enc.Encode(ev) != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// decode reads the JSON body of r into v, answering 413 or 400 (naming the
// field or the position) when it cannot.
func (s *server) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return s.decodeLimit(w, r, v, s.maxBody)
}

// decodeLimit is decode for a body of up to limit bytes.
func (s *server) decodeLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) bool {
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// Exactly one JSON value: anything after it but white space is
		// an error.
		if _, terr := dec.Token(); terr != io.EOF {
			if terr == nil {
				err = errors.New("trailing data after the JSON object")
			} else {
				err = terr
			}
		}
	}
	if err == nil {
		return true
	}
	status, msg := bodyError(err)
	writeError(w, status, msg)
	return false
}

// bodyError is the status and message of a JSON body that did not decode
// (err from a json.Decoder): 413 or 400, naming the field or the position.
func bodyError(err error) (int, string) {
	var (
		maxErr    *http.MaxBytesError
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &maxErr):
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", maxErr.Limit)
	case errors.Is(err, io.EOF):
		return http.StatusBadRequest, "request body is empty; want a JSON object"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return http.StatusBadRequest, "request body is truncated JSON"
	case errors.As(err, &syntaxErr):
		return http.StatusBadRequest, fmt.Sprintf("invalid JSON at byte %d: %s", syntaxErr.Offset, syntaxErr.Error())
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			field = "body"
		}
		want := jsonKind(typeErr.Type.String())
		if num, ok := strings.CutPrefix(typeErr.Value, "number "); ok && want == "a number" {
			return http.StatusBadRequest, fmt.Sprintf("%s: %s is not a whole number in range", field, num)
		}
		return http.StatusBadRequest, fmt.Sprintf("%s: want %s, got JSON %s", field, want, typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return http.StatusBadRequest, "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	}
	return http.StatusBadRequest, "invalid request body: " + err.Error()
}

// jsonKind describes a Go type in JSON terms.
func jsonKind(goType string) string {
	switch {
	case goType == "string":
		return "a string"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"), strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "bool":
		return "true or false"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.HasPrefix(goType, "map["):
		return "an object"
	}
	return "an object"
}

// pathID returns the path value name, validated as an ID (400 otherwise).
func pathID(w http.ResponseWriter, r *http.Request, name string) (string, bool) {
	id := r.PathValue(name)
	return id, valid(w, runtime.ValidateID(name, id))
}

// query returns r's query parameters, answering 400 for one that is not
// in known or that is given twice.
func query(w http.ResponseWriter, r *http.Request, known ...string) (url.Values, bool) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid query string")
		return nil, false
	}
	for k, vs := range q {
		found := false
		for _, kk := range known {
			found = found || k == kk
		}
		if !found {
			msg := fmt.Sprintf("unknown query parameter %q", k)
			if len(known) > 0 {
				msg += " (known: " + strings.Join(known, ", ") + ")"
			}
			writeError(w, http.StatusBadRequest, msg)
			return nil, false
		}
		if len(vs) > 1 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("query parameter %q given %d times", k, len(vs)))
			return nil, false
		}
	}
	return q, true
}

func (s *server) noQuery(w http.ResponseWriter, r *http.Request) bool {
	_, ok := query(w, r)
	return ok
}

// boolParam parses the query parameter name; absent means false.
func boolParam(w http.ResponseWriter, q url.Values, name string) (bool, bool) {
	v := q.Get(name)
	if v == "" {
		return false, true
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s: %q: want true or false", name, v))
		return false, false
	}
	return b, true
}

// valid answers 400 with err's message when err is not nil.
func valid(w http.ResponseWriter, err error) bool {
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return false
	}
	return true
}

// StatusCode returns the HTTP status the API answers for a Backend error:
// 400 for runtime.ErrInvalid, 404 ErrNotFound, 409 ErrConflict, 503
// ErrPluginUnavailable, ErrShutdown and an ended context (the request was
// canceled or timed out), 500 for anything else.
func StatusCode(err error) int {
	switch {
	case errors.Is(err, runtime.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, runtime.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, runtime.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, runtime.ErrPluginUnavailable), errors.Is(err, runtime.ErrShutdown), errors.Is(err, runtime.ErrClusterUnavailable),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func writeBackendError(w http.ResponseWriter, err error) {
	writeError(w, StatusCode(err), err.Error())
}

// errorBody is the JSON body of every error answer.
type errorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Error: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(errorBody{Error: "encode response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// logged wraps h with one log line per request: method, path, status,
// duration and the name of the request's token once known. GETs log at
// debug, other methods at info, server errors at warn unless the request
// was canceled (client gone, or shutdown). A request that is not a GET or
// HEAD and was not refused with a 4xx is also recorded as an
// EventAPIWrite naming its token, when b is an EventRecorder and no other
// event (a web UI action's) records it.
func (s *server) logged(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		ri := &reqInfo{}
		r = r.WithContext(context.WithValue(r.Context(), reqInfoKey{}, ri))
		h.ServeHTTP(sw, r)
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		fields := logrus.Fields{
			"method":   r.Method,
			"path":     r.URL.Path,
			"status":   sw.status,
			"duration": time.Since(start).Round(time.Microsecond).String(),
		}
		if ri.id.Name != "" {
			fields["token"] = ri.id.Name
		}
		e := s.log.WithFields(fields)
		write := r.Method != http.MethodGet && r.Method != http.MethodHead
		switch {
		case sw.status >= 500 && r.Context().Err() != nil:
			// The client went away (Ctrl-C on a claim) or the agent is
			// shutting down: not a failure to warn about.
			e.Info("request canceled")
		case sw.status >= 500:
			e.Warn("request failed")
		case !write:
			e.Debug("request")
		default:
			e.Info("request")
		}
		// A 4xx changed nothing (bad input, unknown object, conflict, or
		// refused by authentication or scope): its log line is enough.
		if write && ri.id.Name != "" && !ri.recorded && (sw.status < 400 || sw.status >= 500) {
			s.recordWrite(r, sw.status, ri)
		}
	})
}

// recordWrite records the write r, answered status, as an EventAPIWrite
// naming its token and the objects its path and ri.about name.
func (s *server) recordWrite(r *http.Request, status int, ri *reqInfo) {
	rec, ok := s.b.(EventRecorder)
	if !ok {
		return
	}
	id := ri.id
	ev := runtime.Event{Type: runtime.EventAPIWrite, Token: id.Name,
		Message: fmt.Sprintf("%s %s by token %q: %d %s", r.Method, r.URL.Path, id.Name, status, http.StatusText(status))}
	// The objects the path names, for filters on the events.
	segs := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/"), "/")
	if len(segs) > 1 {
		switch segs[0] {
		case "volumes":
			ev.Volume = segs[1]
			if len(segs) > 3 && segs[2] == "claims" {
				ev.Alloc = segs[3]
			}
		case "allocations":
			ev.Alloc = segs[1]
		case "plugins":
			ev.Plugin = segs[1]
		case "snapshots":
			ev.Snapshot = segs[1]
		}
	}
	for _, f := range []struct {
		dst *string
		v   string
	}{{&ev.Volume, ri.about.Volume}, {&ev.Alloc, ri.about.Alloc}, {&ev.Plugin, ri.about.Plugin}, {&ev.Snapshot, ri.about.Snapshot}} {
		if f.v != "" {
			*f.dst = f.v
		}
	}
	if err := rec.RecordEvent(ev); err != nil && !errors.Is(err, runtime.ErrShutdown) {
		s.log.WithError(err).WithField("token", id.Name).Warn("API write not recorded as an event")
	}
}

// statusWriter records the status written through it. Unwrap lets
// http.ResponseController reach the underlying writer's Flush.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
