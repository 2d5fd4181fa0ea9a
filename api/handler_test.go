package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/runtime"
)

const (
	attachedAlloc = `{"plugin":"hostpath","type":"monolith","socket":"/run/hostpath/csi.sock"}`
	volumeBody    = `{"plugin":"hostpath","external_id":"ext-1",
		"capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"},
		                {"access_mode":"multi-node-reader-only","attachment_mode":"file-system"}],
		"mount_options":{"fs_type":"ext4","mount_flags":["password=hunter2","noatime"]},
		"parameters":{"tier":"fast"},"context":{"share":"s1"},"secrets":{"apikey":"topsecret"}}`
	createBody = `{"id":"vol-new","plugin":"hostpath","capacity_bytes":1073741824,
		"capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}]}`
	writeClaim = `{"alloc":"w1","mode":"write","access_mode":"single-node-writer","attachment_mode":"file-system"}`
)

type step struct {
	name    string
	method  string
	path    string
	body    string
	status  int
	want    []string // substrings of the body
	notWant []string
	header  map[string]string // response headers
}

// runSteps runs a script of requests in order: each depends on the state
// the ones before left.
func runSteps(t *testing.T, c *rawClient, steps []step) {
	t.Helper()
	for _, s := range steps {
		r := c.do(s.method, s.path, s.body)
		if r.status != s.status {
			t.Errorf("%s: %s %s = %d %s, want %d", s.name, s.method, s.path, r.status, r.body, s.status)
			continue
		}
		for _, w := range s.want {
			if !strings.Contains(r.body, w) {
				t.Errorf("%s: %s %s body %s lacks %s", s.name, s.method, s.path, r.body, w)
			}
		}
		for _, w := range s.notWant {
			if strings.Contains(r.body, w) {
				t.Errorf("%s: %s %s body %s shows %s", s.name, s.method, s.path, r.body, w)
			}
		}
		for k, v := range s.header {
			if got := r.header.Get(k); got != v {
				t.Errorf("%s: header %s = %q, want %q", s.name, k, got, v)
			}
		}
		if r.status >= 400 {
			var eb struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal([]byte(r.body), &eb); err != nil || eb.Error == "" {
				t.Errorf("%s: error body %q is not {\"error\": ...}", s.name, r.body)
			}
		}
		if r.status != http.StatusNoContent && !strings.HasPrefix(r.header.Get("Content-Type"), "application/") {
			t.Errorf("%s: Content-Type %q", s.name, r.header.Get("Content-Type"))
		}
	}
}

func TestHandler_Routes_Script(t *testing.T) {
	b := apitest.NewBackend()
	addr := apitest.Serve(t, b, api.Options{})
	c := newRawClient(t, addr)
	secrets := []string{"hunter2", "noatime", "topsecret"}
	runSteps(t, c, []step{
		{name: "health", method: "GET", path: "/v1/health", status: 200, want: []string{`{"status":"ok","cluster":false}`}},
		{name: "no plugins yet", method: "GET", path: "/v1/plugins", status: 200, want: []string{"[]"}},
		{name: "no allocations yet", method: "GET", path: "/v1/allocations", status: 200, want: []string{"[]"}},

		{name: "register alloc", method: "PUT", path: "/v1/allocations/hp1", body: attachedAlloc, status: 200,
			want: []string{`"id":"hp1"`, `"plugin":"hostpath"`, `"type":"monolith"`, `"socket":"/run/hostpath/csi.sock"`, `"healthy":true`, `"singleton":true`, `"node_id":"node-1"`}},
		{name: "register alloc again", method: "PUT", path: "/v1/allocations/hp1", body: attachedAlloc, status: 200, want: []string{`"id":"hp1"`}},
		{name: "register alloc differently", method: "PUT", path: "/v1/allocations/hp1", body: `{"plugin":"hostpath","type":"node","socket":"/s"}`, status: 409, want: []string{"different definition"}},
		{name: "register exec alloc", method: "PUT", path: "/v1/allocations/hp2",
			body: `{"plugin":"hostpath","type":"monolith","command":["/bin/hp","--endpoint={endpoint}"],"env":{"A":"1"}}`, status: 200,
			want: []string{`"command":["/bin/hp","--endpoint={endpoint}"]`, `"socket":"/var/lib/csiactor/plugins/hp2/csi.sock"`}},
		{name: "alloc bad id", method: "PUT", path: "/v1/allocations/-x", body: attachedAlloc, status: 400, want: []string{`"error":"id: \"-x\": use letters`}},
		{name: "alloc unknown field", method: "PUT", path: "/v1/allocations/x", body: `{"plugin":"p","type":"node","sockett":"/s"}`, status: 400, want: []string{`unknown field \"sockett\"`}},
		{name: "alloc bad type", method: "PUT", path: "/v1/allocations/x", body: `{"plugin":"p","type":"worker","socket":"/s"}`, status: 400, want: []string{`type: \"worker\": want controller, node or monolith`}},
		{name: "alloc wrong JSON type", method: "PUT", path: "/v1/allocations/x", body: `{"plugin":"p","type":"node","command":"/bin/x"}`, status: 400, want: []string{`command: want an array, got JSON string`}},
		{name: "alloc empty body", method: "PUT", path: "/v1/allocations/x", status: 400, want: []string{"request body is empty"}},
		{name: "alloc bad JSON", method: "PUT", path: "/v1/allocations/x", body: `{"plugin":`, status: 400, want: []string{"truncated JSON"}},
		{name: "alloc syntax error", method: "PUT", path: "/v1/allocations/x", body: `{"plugin" "p"}`, status: 400, want: []string{"invalid JSON at byte"}},
		{name: "alloc trailing data", method: "PUT", path: "/v1/allocations/x", body: attachedAlloc + `{}`, status: 400, want: []string{"trailing data"}},
		{name: "alloc neither socket nor command", method: "PUT", path: "/v1/allocations/x", body: `{"plugin":"p","type":"node"}`, status: 400, want: []string{"socket: give socket"}},

		{name: "plugins", method: "GET", path: "/v1/plugins", status: 200,
			want: []string{`"name":"hostpath"`, `"controllers_healthy":2`, `"controllers_expected":2`, `"nodes_healthy":2`, `"nodes_expected":2`, `"allocations":[{"id":"hp2"`}},
		{name: "plugin", method: "GET", path: "/v1/plugins/hostpath", status: 200, want: []string{`"provider":"fake.csi.csiactor.dev"`, `"version":"1.0.0"`, `"controller_required":false`}},
		{name: "plugin unknown", method: "GET", path: "/v1/plugins/nfs", status: 404, want: []string{`plugin \"nfs\" not found`}},
		{name: "capacity without GET_CAPACITY", method: "GET", path: "/v1/plugins/hostpath/capacity?topology=zone%3Da", status: 400, want: []string{"no GET_CAPACITY capability"}},
		{name: "capacity bad topology", method: "GET", path: "/v1/plugins/hostpath/capacity?topology=zone", status: 400, want: []string{`topology: \"zone\": want key=value pairs`}},
		{name: "capacity unknown query", method: "GET", path: "/v1/plugins/hostpath/capacity?zone=a", status: 400, want: []string{`unknown query parameter \"zone\" (known: topology)`}},
		{name: "capacity unknown plugin", method: "GET", path: "/v1/plugins/nfs/capacity", status: 404},
		{name: "external volumes", method: "GET", path: "/v1/plugins/hostpath/volumes?max_entries=10", status: 200, want: []string{`"plugin":"hostpath"`, `"volumes":[]`}},
		{name: "external volumes bad max", method: "GET", path: "/v1/plugins/hostpath/volumes?max_entries=x", status: 400, want: []string{`max_entries: \"x\": want a whole number`}},
		{name: "external volumes max too large", method: "GET", path: "/v1/plugins/hostpath/volumes?max_entries=5000", status: 400, want: []string{"max_entries: 5000: want 0 to 1000"}},
		{name: "plugin dotdot", method: "GET", path: "/v1/plugins/..", status: 400, want: []string{`path \"/v1/plugins/..\" is not canonical (cleaned, it is \"/v1\")`}},
		{name: "plugin bad name", method: "GET", path: "/v1/plugins/-p", status: 400, want: []string{`name: \"-p\"`}},
		{name: "allocations", method: "GET", path: "/v1/allocations", status: 200, want: []string{`"id":"hp2"`, `"id":"hp1"`, `"singleton":false`}},
		{name: "allocations with query", method: "GET", path: "/v1/allocations?x=1", status: 400, want: []string{`unknown query parameter \"x\"`}},

		{name: "register volume", method: "PUT", path: "/v1/volumes/vol1", body: volumeBody, status: 200,
			want:    []string{`"id":"vol1"`, `"external_id":"ext-1"`, `"mount_options":{"fs_type":"ext4","mount_flag_count":2}`, `"parameters":{"tier":"fast"}`, `"context":{"share":"s1"}`, `"claims":[]`, `"past_claims":[]`},
			notWant: append(secrets, "apikey", "secrets")},
		{name: "register volume unknown plugin", method: "PUT", path: "/v1/volumes/vol2", body: strings.Replace(volumeBody, `"plugin":"hostpath"`, `"plugin":"nfs"`, 1), status: 503, want: []string{`plugin \"nfs\" has no healthy allocation`}},
		{name: "register volume bad capability", method: "PUT", path: "/v1/volumes/vol2", body: strings.Replace(volumeBody, `"single-node-writer"`, `"single-node-writter"`, 1), status: 400,
			want: []string{`capabilities[0].access_mode`}, notWant: secrets},
		{name: "register volume slash id", method: "PUT", path: "/v1/volumes/a%2Fb", body: volumeBody, status: 400, want: []string{`id: \"a/b\"`}},
		{name: "register volume unknown field", method: "PUT", path: "/v1/volumes/vol2", body: `{"plugin":"hostpath","externalid":"x"}`, status: 400, want: []string{`unknown field \"externalid\"`}},
		{name: "register volume redacted JSON refused", method: "PUT", path: "/v1/volumes/vol2",
			body: `{"plugin":"hostpath","external_id":"x","capabilities":[],"mount_options":{"fs_type":"ext4","mount_flag_count":2}}`, status: 400, want: []string{`unknown field \"mount_flag_count\"`}},
		{name: "create volume", method: "POST", path: "/v1/volumes", body: createBody, status: 201,
			want: []string{`"id":"vol-new"`, `"external_id":"ext-vol-new"`, `"capacity_bytes":1073741824`}, header: map[string]string{"Location": "/v1/volumes/vol-new"}},
		{name: "create volume again", method: "POST", path: "/v1/volumes", body: createBody, status: 409, want: []string{`volume \"vol-new\" is already registered`}},
		{name: "create volume with external id", method: "POST", path: "/v1/volumes", body: strings.Replace(createBody, `"id":"vol-new"`, `"id":"v3","external_id":"e"`, 1), status: 400, want: []string{"external_id: is chosen by the plugin"}},
		{name: "create volume negative capacity", method: "POST", path: "/v1/volumes", body: strings.Replace(createBody, `1073741824`, `-1`, 1), status: 400, want: []string{"capacity_bytes: must not be negative"}},
		{name: "create volume fractional capacity", method: "POST", path: "/v1/volumes", body: strings.Replace(createBody, `1073741824`, `1.5`, 1), status: 400, want: []string{"capacity_bytes: 1.5 is not a whole number in range"}},
		{name: "create volume huge capacity", method: "POST", path: "/v1/volumes", body: strings.Replace(createBody, `1073741824`, `1e30`, 1), status: 400, want: []string{"capacity_bytes: 1e30 is not a whole number in range"}},
		{name: "create volume capacity as string", method: "POST", path: "/v1/volumes", body: strings.Replace(createBody, `1073741824`, `"1GiB"`, 1), status: 400, want: []string{"capacity_bytes: want a number, got JSON string"}},

		{name: "volumes", method: "GET", path: "/v1/volumes", status: 200, want: []string{`"id":"vol-new"`, `"id":"vol1"`}, notWant: secrets},
		{name: "volumes by plugin", method: "GET", path: "/v1/volumes?plugin=nfs", status: 200, want: []string{`[]`}},
		{name: "volumes by bad plugin", method: "GET", path: "/v1/volumes?plugin=a/b", status: 400, want: []string{`plugin: \"a/b\"`}},
		{name: "volumes unknown query", method: "GET", path: "/v1/volumes?plugn=x", status: 400, want: []string{`unknown query parameter \"plugn\" (known: plugin, node, all_hosts, per_page, next_token)`}},
		{name: "volumes first page", method: "GET", path: "/v1/volumes?per_page=1", status: 200, want: []string{`"id":"vol-new"`}, notWant: []string{`"id":"vol1"`}},
		{name: "volumes last page", method: "GET", path: "/v1/volumes?per_page=1&next_token=vol1", status: 200, want: []string{`"id":"vol1"`}, notWant: []string{`"id":"vol-new"`}},
		{name: "volumes per_page zero", method: "GET", path: "/v1/volumes?per_page=0", status: 400, want: []string{`per_page: 0: want 1 to 1000`}},
		{name: "volumes per_page negative", method: "GET", path: "/v1/volumes?per_page=-5", status: 400, want: []string{`per_page: -5: want 1 to 1000`}},
		{name: "volumes per_page too big", method: "GET", path: "/v1/volumes?per_page=1001", status: 400, want: []string{`per_page: 1001: want 1 to 1000`}},
		{name: "volumes per_page not a number", method: "GET", path: "/v1/volumes?per_page=ten", status: 400, want: []string{`per_page: \"ten\": want a whole number from 1 to 1000`}},
		{name: "volumes bad next_token", method: "GET", path: "/v1/volumes?per_page=10&next_token=..%2Fx", status: 400, want: []string{`next_token: \"../x\" is not a token this API gave`}},
		{name: "volumes next_token alone", method: "GET", path: "/v1/volumes?next_token=vol1", status: 400, want: []string{`next_token: give per_page with it`}},
		{name: "volumes query twice", method: "GET", path: "/v1/volumes?plugin=a&plugin=b", status: 400, want: []string{`given 2 times`}},
		{name: "volume", method: "GET", path: "/v1/volumes/vol1", status: 200, want: []string{`"id":"vol1"`}, notWant: secrets},
		{name: "volume unknown", method: "GET", path: "/v1/volumes/nope", status: 404, want: []string{`volume \"nope\" not found`}},

		{name: "claim", method: "POST", path: "/v1/volumes/vol1/claims", body: writeClaim, status: 200,
			want: []string{`"alloc":"w1"`, `"state":"published"`, `"target_path":"/var/lib/csiactor/volumes/hostpath/per-alloc/w1/vol1/rw-file-system-single-node-writer"`}},
		{name: "claim again", method: "POST", path: "/v1/volumes/vol1/claims", body: writeClaim, status: 200, want: []string{`"alloc":"w1"`}},
		{name: "claim over limit", method: "POST", path: "/v1/volumes/vol1/claims", body: strings.Replace(writeClaim, `"w1"`, `"w2"`, 1), status: 409, want: []string{"single-node-writer allows one claim in all"}},
		{name: "claim bad mode", method: "POST", path: "/v1/volumes/vol1/claims", body: strings.Replace(writeClaim, `"write"`, `"rw"`, 1), status: 400, want: []string{`mode: \"rw\": want read or write`}},
		{name: "claim unknown volume", method: "POST", path: "/v1/volumes/nope/claims", body: writeClaim, status: 404},
		{name: "claim unknown field", method: "POST", path: "/v1/volumes/vol1/claims", body: `{"alloc":"w1","readonly":true}`, status: 400, want: []string{`unknown field \"readonly\"`}},
		{name: "delete claimed volume", method: "DELETE", path: "/v1/volumes/vol1", status: 409, want: []string{"claims"}},
		{name: "volume shows claim", method: "GET", path: "/v1/volumes/vol1", status: 200, want: []string{`"claims":[{"alloc":"w1"`}},
		{name: "release", method: "DELETE", path: "/v1/volumes/vol1/claims/w1", status: 200, want: []string{`"alloc":"w1"`, `"state":"taken"`}},
		{name: "release unknown", method: "DELETE", path: "/v1/volumes/vol1/claims/w9", status: 404, want: []string{"no claim"}},
		{name: "release dotdot", method: "DELETE", path: "/v1/volumes/vol1/claims/..", status: 400, want: []string{"is not canonical"}},
		{name: "release bad alloc", method: "DELETE", path: "/v1/volumes/vol1/claims/.x", status: 400, want: []string{`alloc: \".x\"`}},
		{name: "volume shows past claim", method: "GET", path: "/v1/volumes/vol1", status: 200, want: []string{`"claims":[]`, `"past_claims":[{"alloc":"w1"`}},

		{name: "expand volume", method: "POST", path: "/v1/volumes/vol-new/expand", body: `{"capacity_bytes":2147483648}`, status: 200,
			want: []string{`"id":"vol-new"`, `"capacity_bytes":2147483648`}},
		{name: "expand volume shrink", method: "POST", path: "/v1/volumes/vol-new/expand", body: `{"capacity_bytes":1073741824}`, status: 400,
			want: []string{`capacity_bytes 1073741824 is less than volume \"vol-new\"'s 2147483648 bytes: volumes cannot shrink`}},
		{name: "expand volume zero", method: "POST", path: "/v1/volumes/vol-new/expand", body: `{"capacity_bytes":0}`, status: 400, want: []string{"capacity_bytes: must be positive"}},
		{name: "expand volume unknown field", method: "POST", path: "/v1/volumes/vol-new/expand", body: `{"size":1}`, status: 400, want: []string{`unknown field \"size\"`}},
		{name: "expand volume unknown", method: "POST", path: "/v1/volumes/nope/expand", body: `{"capacity_bytes":1}`, status: 404, want: []string{`volume \"nope\" not found`}},
		{name: "list volumes bad all_hosts", method: "GET", path: "/v1/volumes?all_hosts=maybe", status: 400, want: []string{`all_hosts: \"maybe\": want true or false`}},
		{name: "delete volume bad query", method: "DELETE", path: "/v1/volumes/vol-new?delete=maybe", status: 400, want: []string{`delete: \"maybe\": want true or false`}},
		{name: "delete volume", method: "DELETE", path: "/v1/volumes/vol-new?delete=true", status: 204},
		{name: "delete volume again", method: "DELETE", path: "/v1/volumes/vol-new", status: 404},
		{name: "deregister alloc", method: "DELETE", path: "/v1/allocations/hp2", status: 204},
		{name: "deregister alloc again", method: "DELETE", path: "/v1/allocations/hp2", status: 404},

		{name: "events", method: "GET", path: "/v1/events", status: 200,
			want: []string{`"type":"allocation-registered","plugin":"hostpath","alloc":"hp1"`, `"type":"volume-deleted"`, "}\n{"}, notWant: secrets},
		{name: "events bad follow", method: "GET", path: "/v1/events?follow=often", status: 400, want: []string{`follow: \"often\"`}},

		{name: "wrong method", method: "PATCH", path: "/v1/volumes/vol1", status: 405, want: []string{"method PATCH is not allowed on /v1/volumes/vol1"},
			header: map[string]string{"Allow": "DELETE, GET, HEAD, PUT"}},
		{name: "unknown route", method: "GET", path: "/v2/volumes", status: 404, want: []string{"no such API route: GET /v2/volumes"}},
		{name: "metrics not configured", method: "GET", path: "/metrics", status: 404},
	})
}

func TestHandler_BackendErrors_StatusCodes(t *testing.T) {
	b := apitest.NewBackend()
	c := newRawClient(t, apitest.Serve(t, b, api.Options{}))
	for _, tc := range []struct {
		err    error
		status int
	}{
		{fmt.Errorf("%w: x", runtime.ErrInvalid), 400},
		{fmt.Errorf("%w: x", runtime.ErrNotFound), 404},
		{fmt.Errorf("%w: x", runtime.ErrConflict), 409},
		{fmt.Errorf("%w: x", runtime.ErrPluginUnavailable), 503},
		{fmt.Errorf("stopping: %w", runtime.ErrShutdown), 503},
		{fmt.Errorf("claim: wait for plugin: %w", context.DeadlineExceeded), 503},
		{fmt.Errorf("claim: %w", context.Canceled), 503},
		{errors.New("store: disk full"), 500},
	} {
		b.FailWith("Plugins", tc.err)
		r := c.do("GET", "/v1/plugins", "")
		if r.status != tc.status || !strings.Contains(r.body, tc.err.Error()) {
			t.Errorf("backend error %q: got %d %s, want %d with the message", tc.err, r.status, r.body, tc.status)
		}
		if got := api.StatusCode(tc.err); got != tc.status {
			t.Errorf("StatusCode(%q) = %d, want %d", tc.err, got, tc.status)
		}
	}
}

func TestHandler_BodyLimit_413(t *testing.T) {
	b := apitest.NewBackend()
	c := newRawClient(t, apitest.Serve(t, b, api.Options{MaxBodyBytes: 256}))
	big := `{"plugin":"hostpath","type":"node","socket":"/` + strings.Repeat("s", 300) + `"}`
	r := c.do("PUT", "/v1/allocations/a", big)
	if r.status != http.StatusRequestEntityTooLarge || !strings.Contains(r.body, "request body larger than 256 bytes") {
		t.Errorf("oversized body: %d %s, want 413", r.status, r.body)
	}
	// The default limit is 1 MiB.
	c2 := newRawClient(t, apitest.Serve(t, b, api.Options{}))
	huge := `{"plugin":"hostpath","type":"node","socket":"/s","env":{"A":"` + strings.Repeat("x", api.DefaultMaxBodyBytes) + `"}}`
	if r := c2.do("PUT", "/v1/allocations/a", huge); r.status != http.StatusRequestEntityTooLarge {
		t.Errorf("1 MiB+ body: %d %s, want 413", r.status, r.body)
	}
}

func TestHandler_Metrics_Served(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintln(w, "csiactor_up 1")
	})
	c := newRawClient(t, apitest.Serve(t, apitest.NewBackend(), api.Options{Metrics: metrics}))
	if r := c.do("GET", "/metrics", ""); r.status != 200 || r.body != "csiactor_up 1\n" {
		t.Errorf("GET /metrics = %d %q", r.status, r.body)
	}
}

// Request logs carry method, path, status and duration, and never a body.
func TestHandler_Logging_NoSecrets(t *testing.T) {
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	b := apitest.NewBackend()
	c := newRawClient(t, apitest.Serve(t, b, api.Options{Log: logrus.NewEntry(logger)}))
	c.do("PUT", "/v1/allocations/hp1", attachedAlloc)
	c.do("PUT", "/v1/volumes/vol1", volumeBody)
	c.do("PUT", "/v1/volumes/vol2", strings.Replace(volumeBody, `"ext4"`, `"ext4,"`, 1)) // 400
	c.do("GET", "/v1/volumes/vol1", "")
	b.FailWith("Volumes", errors.New("boom"))
	c.do("GET", "/v1/volumes", "")

	entries := hook.AllEntries()
	if len(entries) != 5 {
		t.Fatalf("got %d log entries, want 5", len(entries))
	}
	want := []struct {
		method, path string
		status       int
		level        logrus.Level
	}{
		{"PUT", "/v1/allocations/hp1", 200, logrus.InfoLevel},
		{"PUT", "/v1/volumes/vol1", 200, logrus.InfoLevel},
		{"PUT", "/v1/volumes/vol2", 400, logrus.InfoLevel},
		{"GET", "/v1/volumes/vol1", 200, logrus.DebugLevel},
		{"GET", "/v1/volumes", 500, logrus.WarnLevel},
	}
	for i, e := range entries {
		w := want[i]
		if e.Data["method"] != w.method || e.Data["path"] != w.path || e.Data["status"] != w.status || e.Level != w.level {
			t.Errorf("entry %d = %s %v, want %+v", i, e.Level, e.Data, w)
		}
		if _, ok := e.Data["duration"]; !ok {
			t.Errorf("entry %d has no duration", i)
		}
		line, err := e.String()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"hunter2", "noatime", "topsecret"} {
			if strings.Contains(line, s) {
				t.Errorf("log line %q shows %q", line, s)
			}
		}
	}
}

// The TCP handler over a real loopback listener: health and metrics are
// open; the API needs the token when there is one and is off without.
func TestTCPHandler_Auth_Cases(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "m 1\n") })
	serveTCP := func(token string) *rawClient {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		apitest.ServeListener(t, l, api.NewTCPHandler(apitest.NewBackend(), token, api.Options{Metrics: metrics}))
		return newRawClient(t, "http://"+l.Addr().String())
	}

	t.Run("no token", func(t *testing.T) {
		c := serveTCP("")
		if r := c.do("GET", "/v1/health", ""); r.status != 200 || !strings.Contains(r.body, `"ok"`) {
			t.Errorf("health: %d %s", r.status, r.body)
		}
		if r := c.do("GET", "/metrics", ""); r.status != 200 || r.body != "m 1\n" {
			t.Errorf("metrics: %d %s", r.status, r.body)
		}
		for _, p := range []string{"/v1/plugins", "/v1/volumes/v1", "/v1/events"} {
			r := c.do("GET", p, "", "Authorization", "Bearer anything")
			if r.status != 404 || !strings.Contains(r.body, "unix socket only; set api.token_file") {
				t.Errorf("GET %s without a token configured: %d %s, want 404 with a hint", p, r.status, r.body)
			}
		}
		if r := c.do("POST", "/v1/health", ""); r.status != 405 {
			t.Errorf("POST /v1/health: %d, want 405", r.status)
		}
	})

	t.Run("token", func(t *testing.T) {
		const token = "s3cr3t-token"
		c := serveTCP(token)
		if r := c.do("GET", "/v1/health", ""); r.status != 200 {
			t.Errorf("health without token: %d", r.status)
		}
		if r := c.do("GET", "/metrics", ""); r.status != 200 {
			t.Errorf("metrics without token: %d", r.status)
		}
		for _, h := range [][]string{
			nil,
			{"Authorization", "Bearer wrong"},
			{"Authorization", "Bearer " + token + "x"},
			{"Authorization", "Basic " + token},
			{"Authorization", token},
			{"Authorization", "Bearer "},
			{"Authorization", "Bearer"},
			{"Authorization", "Bearer" + token},
		} {
			r := c.do("GET", "/v1/plugins", "", h...)
			if r.status != 401 || !strings.Contains(r.body, "missing or wrong bearer token") || r.header.Get("WWW-Authenticate") == "" {
				t.Errorf("GET /v1/plugins with %q: %d %s, want 401", h, r.status, r.body)
			}
			if strings.Contains(r.body, token) {
				t.Errorf("401 body shows the token")
			}
		}
		// The scheme is case-insensitive (RFC 9110 §11.1); the token is not.
		for _, h := range []string{"Bearer " + token, "bearer " + token, "BEARER  " + token} {
			if r := c.do("GET", "/v1/plugins", "", "Authorization", h); r.status != 200 || r.body != "[]\n" {
				t.Errorf("GET /v1/plugins with %q: %d %s", h, r.status, r.body)
			}
		}
		if r := c.do("GET", "/v1/plugins", "", "Authorization", "Bearer "+strings.ToUpper(token)); r.status != 401 {
			t.Errorf("GET /v1/plugins with the token in upper case: %d, want 401", r.status)
		}
		if r := c.do("PUT", "/v1/allocations/a", attachedAlloc, "Authorization", "Bearer "+token); r.status != 200 {
			t.Errorf("PUT with the token: %d %s", r.status, r.body)
		}
	})
}

func TestHandler_Events_NDJSON(t *testing.T) {
	b := apitest.NewBackend()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b.Publish(runtime.Event{Time: t0, Type: runtime.EventHealthChanged, Plugin: "p", Alloc: "a", Message: "unhealthy: probe failed"})
	b.Publish(runtime.Event{Time: t0.Add(time.Second), Type: runtime.EventSingletonChanged, Plugin: "p", Alloc: "b", Message: "b is the singleton"})
	c := newRawClient(t, apitest.Serve(t, b, api.Options{}))
	r := c.do("GET", "/v1/events", "")
	want := `{"time":"2026-01-02T03:04:05Z","type":"health-changed","plugin":"p","alloc":"a","message":"unhealthy: probe failed"}` + "\n" +
		`{"time":"2026-01-02T03:04:06Z","type":"singleton-changed","plugin":"p","alloc":"b","message":"b is the singleton"}` + "\n"
	if r.status != 200 || r.body != want || r.header.Get("Content-Type") != "application/x-ndjson" {
		t.Errorf("GET /v1/events = %d %q %q\nwant %q", r.status, r.header.Get("Content-Type"), r.body, want)
	}
	for _, line := range bytes.Split([]byte(strings.TrimSpace(r.body)), []byte("\n")) {
		var ev runtime.Event
		if err := json.Unmarshal(line, &ev); err != nil || ev.Validate() != nil {
			t.Errorf("line %s: %v %v", line, err, ev.Validate())
		}
	}
}

// blockingClaims is a backend whose Claim waits for the caller to go away.
type blockingClaims struct {
	*apitest.Backend
	started chan struct{}
}

func (b *blockingClaims) Claim(ctx context.Context, _ string, _ runtime.ClaimRequest) (runtime.Claim, error) {
	close(b.started)
	<-ctx.Done()
	return runtime.Claim{}, fmt.Errorf("claim: %w", ctx.Err())
}

// A request the client gives up on (Ctrl-C during a claim) is logged at
// info as canceled, not warned about as a failure of the agent.
func TestHandler_Logging_ClientCanceled_Info(t *testing.T) {
	logger, hook := logtest.NewNullLogger()
	b := &blockingClaims{Backend: apitest.NewBackend(), started: make(chan struct{})}
	c, err := api.NewClient(apitest.Serve(t, b, api.Options{Log: logrus.NewEntry(logger)}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-b.started
		cancel()
	}()
	_, err = c.Claim(ctx, "v1", runtime.ClaimRequest{Alloc: "a", Mode: "read", AccessMode: "multi-node-reader-only", AttachmentMode: "file-system"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim = %v, want context.Canceled", err)
	}
	// The handler notices the cancel on its own time; wait for its line.
	var e *logrus.Entry
	for deadline := time.Now().Add(10 * time.Second); e == nil; {
		if entries := hook.AllEntries(); len(entries) > 0 {
			e = entries[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no log line for the canceled request")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e.Level != logrus.InfoLevel || e.Message != "request canceled" || e.Data["path"] != "/v1/volumes/v1/claims" {
		t.Errorf("log line %s %q %v, want info \"request canceled\"", e.Level, e.Message, e.Data)
	}
}

// A Csiactor-Timeout header that is not a positive duration is a 400
// naming the header, and the request does nothing; a good one is served.
func TestHandler_TimeoutHeader_Cases(t *testing.T) {
	b := apitest.NewBackend()
	c := newRawClient(t, apitest.Serve(t, b, api.Options{}))
	runSteps(t, c, []step{
		{name: "register alloc", method: "PUT", path: "/v1/allocations/hp1", body: attachedAlloc, status: 200},
		{name: "register volume", method: "PUT", path: "/v1/volumes/vol1", body: volumeBody, status: 200},
	})
	for _, h := range []string{"soon", "0s", "-5s", "30"} {
		r := c.do("POST", "/v1/volumes/vol1/claims", writeClaim, api.TimeoutHeader, h)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, api.TimeoutHeader) || !strings.Contains(r.body, `\"`+h+`\"`) {
			t.Errorf("claim with %s: %q = %d %s, want 400 naming the header and its value", api.TimeoutHeader, h, r.status, r.body)
		}
	}
	if r := c.do("GET", "/v1/volumes/vol1", ""); r.status != 200 || strings.Contains(r.body, `"alloc":"w1"`) {
		t.Errorf("after the refused claims: %d %s, want the volume without a claim", r.status, r.body)
	}
	if r := c.do("POST", "/v1/volumes/vol1/claims", writeClaim, api.TimeoutHeader, "30s"); r.status != 200 || !strings.Contains(r.body, `"alloc":"w1"`) {
		t.Errorf("claim with %s: 30s = %d %s, want 200 with the claim", api.TimeoutHeader, r.status, r.body)
	}
}
