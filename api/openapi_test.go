package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	legacyrouter "github.com/getkin/kin-openapi/routers/legacy"

	"github.com/csiactor/csiactor/api"
)

// specPath is the API's description, beside this file.
const specPath = "openapi.yaml"

// loadSpec reads and validates openapi.yaml.
func loadSpec(t testing.TB) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(specPath)
	if err != nil {
		t.Fatalf("load %s: %v", specPath, err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("%s is not a valid OpenAPI document: %v", specPath, err)
	}
	return doc
}

// specOperations returns "METHOD /path" for every operation of doc, in
// the form of the mux's patterns.
func specOperations(doc *openapi3.T) []string {
	var ops []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			ops = append(ops, method+" "+path)
		}
	}
	sort.Strings(ops)
	return ops
}

// Every route the server's mux serves is described in openapi.yaml, and
// every operation there is served.
func TestOpenAPI_Routes_MatchServed(t *testing.T) {
	doc := loadSpec(t)
	metrics := http.NotFoundHandler()
	served := api.ServedRoutes(api.Options{Metrics: metrics})
	if len(served) == 0 {
		t.Fatal("ServedRoutes is empty")
	}
	sort.Strings(served)
	described := specOperations(doc)
	for _, r := range served {
		if !slices.Contains(described, r) {
			t.Errorf("route %q is served but not described in %s: add it, with its parameters, bodies and responses", r, specPath)
		}
	}
	for _, op := range described {
		if !slices.Contains(served, op) {
			t.Errorf("operation %q is described in %s but not served", op, specPath)
		}
	}
	// Without Options.Metrics there is no /metrics, and nothing else
	// changes.
	if got := api.ServedRoutes(api.Options{}); slices.Contains(got, "GET /metrics") || len(got) != len(served)-1 {
		t.Errorf("routes without metrics = %v", got)
	}
}

// ndjsonOnce registers, once per test binary, the decoder of
// newline-delimited JSON bodies: the spec describes such a stream as an
// array of its lines.
var ndjsonOnce sync.Once

func registerNDJSON() {
	ndjsonOnce.Do(func() {
		openapi3filter.RegisterBodyDecoder("application/x-ndjson",
			func(r io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
				items := []any{}
				sc := bufio.NewScanner(r)
				sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
				for sc.Scan() {
					var v any
					if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
						return nil, fmt.Errorf("line %d: %w", len(items)+1, err)
					}
					items = append(items, v)
				}
				return items, sc.Err()
			})
	})
}

// specChecker validates real requests and answers against openapi.yaml:
// every answer (status, headers, body) must be one the spec describes for
// its operation, and every request the server accepted must be one the
// spec allows. It records which statuses each operation answered.
type specChecker struct {
	t      testing.TB
	doc    *openapi3.T
	router routers.Router
	errors *openapi3.SchemaRef
	seen   *coverage
}

// coverage records the statuses each operation answered, across the
// tests that share a checker.
type coverage struct {
	mu   sync.Mutex
	seen map[string]map[int]bool // guarded by mu; operation → statuses
}

// on returns c reporting to t, sharing c's coverage.
func (c *specChecker) on(t testing.TB) *specChecker {
	cc := *c
	cc.t = t
	return &cc
}

func newSpecChecker(t testing.TB) *specChecker {
	t.Helper()
	registerNDJSON()
	doc := loadSpec(t)
	// Route by path alone: the servers' host names do not matter here.
	doc.Servers = nil
	router, err := legacyrouter.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &specChecker{t: t, doc: doc, router: router, errors: doc.Components.Schemas["Error"],
		seen: &coverage{seen: map[string]map[int]bool{}}}
}

// check validates one exchange: req (whose body was reqBody) and its
// answer status, header and body.
func (c *specChecker) check(req *http.Request, reqBody []byte, status int, header http.Header, body []byte) {
	c.t.Helper()
	ctx := context.Background()
	name := req.Method + " " + req.URL.RequestURI()
	// Route on a copy whose URL has the spec's form (no host).
	rr := req.Clone(ctx)
	rr.URL = &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	rr.Body = io.NopCloser(bytes.NewReader(reqBody))
	route, params, err := c.router.FindRoute(rr)
	if err != nil {
		// No operation: only the mux's own 404 and 405 (and the 400 for
		// a path that is not canonical) answer such requests, with the
		// error body.
		if status != http.StatusNotFound && status != http.StatusMethodNotAllowed && status != http.StatusBadRequest {
			c.t.Errorf("%s: no operation in %s (%v), yet the server answered %d", name, specPath, err, status)
			return
		}
		c.checkErrorBody(name, status, body)
		return
	}
	op := req.Method + " " + route.Path
	c.seen.mu.Lock()
	if c.seen.seen[op] == nil {
		c.seen.seen[op] = map[int]bool{}
	}
	c.seen.seen[op][status] = true
	c.seen.mu.Unlock()

	in := &openapi3filter.RequestValidationInput{
		Request:    rr,
		PathParams: params,
		Route:      route,
		Options: &openapi3filter.Options{
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
			MultiError:         true,
		},
	}
	if status < 300 {
		// The server accepted the request: the spec must allow it too.
		if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
			c.t.Errorf("%s answered %d, but %s refuses the request: %v", name, status, specPath, err)
		}
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 status,
		Header:                 header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{
			IncludeResponseStatus: true,
			MultiError:            true,
		},
	}
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		c.t.Errorf("%s: answer %d does not match %s: %v\nbody: %s", name, status, specPath, err, body)
	}
}

// checkErrorBody validates body as the Error schema.
func (c *specChecker) checkErrorBody(name string, status int, body []byte) {
	c.t.Helper()
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		c.t.Errorf("%s: %d answer is not JSON: %q", name, status, body)
		return
	}
	if err := c.errors.Value.VisitJSON(v); err != nil {
		c.t.Errorf("%s: %d answer is not an Error: %v\nbody: %s", name, status, err, body)
	}
}

// do sends one request through hc to base+path, checks the exchange and
// returns the status and body.
func (c *specChecker) do(hc *http.Client, base, method, path, body string, header ...string) (int, string) {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	c.check(req, []byte(body), resp.StatusCode, resp.Header, b)
	return resp.StatusCode, string(b)
}

// stream sends GET base+path through hc, reads the first n lines of the
// newline-delimited answer, hangs up, and checks those lines as the
// answer. It fails when fewer than n lines come.
func (c *specChecker) stream(hc *http.Client, base, path string, n int, limit time.Duration) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		c.t.Fatalf("GET %s: %v", path, err)
	}
	var body bytes.Buffer
	sc := bufio.NewScanner(resp.Body)
	got := 0
	for got < n && sc.Scan() {
		body.Write(sc.Bytes())
		body.WriteByte('\n')
		got++
	}
	cancel()
	resp.Body.Close()
	if got < n {
		c.t.Errorf("GET %s: %d lines, want %d (%v)", path, got, n, sc.Err())
	}
	c.check(req, nil, resp.StatusCode, resp.Header, body.Bytes())
}

// statuses returns the statuses op answered, sorted.
func (c *specChecker) statuses(op string) []int {
	c.seen.mu.Lock()
	defer c.seen.mu.Unlock()
	var s []int
	for code := range c.seen.seen[op] {
		s = append(s, code)
	}
	sort.Ints(s)
	return s
}

// requireCoverage fails for an operation of the spec that was not seen
// answering both a success and an error.
func (c *specChecker) requireCoverage() {
	c.t.Helper()
	for _, op := range specOperations(c.doc) {
		ss := c.statuses(op)
		ok, bad := false, op == "GET /metrics" // /metrics has no error answer
		for _, s := range ss {
			ok = ok || s < 300
			bad = bad || s >= 400
		}
		if !ok || !bad {
			c.t.Errorf("%s: answers seen %v; the spec tests want at least one success and one error", op, ss)
		}
	}
}
