package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/runtime"
)

// FuzzHandler_Bodies sends arbitrary bodies to every route that decodes
// one: the handler never panics, answers only the documented codes, always
// with a JSON body, and never echoes a secret or mount flag.
func FuzzHandler_Bodies(f *testing.F) {
	batchBody := `{"volumes":[` + strings.Replace(volumeBody, "{", `{"id":"b1",`, 1) + `,` + createBody + `,{"id":"b2"},null,3]}`
	for _, s := range []string{volumeBody, createBody, writeClaim, attachedAlloc, batchBody, `{"volumes":[]}`, `null`, `{}`, `[]`, `{"plugin":1}`, `{"a":`, ""} {
		f.Add(s)
	}
	b := apitest.NewBackend()
	if _, err := b.RegisterAllocation(f.Context(), "hp1", runtime.AllocationSpec{Plugin: "hostpath", Type: runtime.TypeMonolith, Socket: "/s"}); err != nil {
		f.Fatal(err)
	}
	h := api.NewHandler(b, api.Options{MaxBodyBytes: 4096})
	routes := []struct{ method, path string }{
		{"PUT", "/v1/allocations/a1"},
		{"PUT", "/v1/volumes/v1"},
		{"POST", "/v1/volumes"},
		{"POST", "/v1/volumes/v1/claims"},
		{"POST", "/v1/volumes/batch"},
	}
	allowed := map[int]bool{200: true, 201: true, 400: true, 404: true, 409: true, 413: true, 503: true}
	f.Fuzz(func(t *testing.T, body string) {
		for _, rt := range routes {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(rt.method, rt.path, strings.NewReader(body)))
			if !allowed[rec.Code] {
				t.Fatalf("%s %s with %q: status %d %s", rt.method, rt.path, body, rec.Code, rec.Body)
			}
			if !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("%s %s: answer is not JSON: %q", rt.method, rt.path, rec.Body)
			}
			if rec.Code >= 400 {
				var eb struct{ Error string }
				if json.Unmarshal(rec.Body.Bytes(), &eb) != nil || eb.Error == "" {
					t.Fatalf("%s %s: error answer %q", rt.method, rt.path, rec.Body)
				}
			}
			for _, s := range secretValues(body) {
				if strings.Contains(rec.Body.String(), s) {
					t.Fatalf("%s %s: answer shows the secret %q: %s", rt.method, rt.path, s, rec.Body)
				}
			}
			if rec.Code == http.StatusOK && rt.path == "/v1/volumes/v1" {
				// Start each input from an unregistered volume.
				_ = b.DeleteVolume(t.Context(), "v1", false)
			}
		}
	})
}

// secretValues returns the secret values and mount flags of a JSON body
// that appear nowhere else in it (so that an echo of another field is not
// mistaken for a leak).
func secretValues(body string) []string {
	var v struct {
		Secrets      map[string]any `json:"secrets"`
		MountOptions struct {
			MountFlags []any `json:"mount_flags"`
		} `json:"mount_options"`
	}
	if json.Unmarshal([]byte(body), &v) != nil {
		return nil
	}
	var cands []any
	for _, s := range v.Secrets {
		cands = append(cands, s)
	}
	cands = append(cands, v.MountOptions.MountFlags...)
	var out []string
	for _, c := range cands {
		s, ok := c.(string)
		if ok && len(s) >= 8 && strings.Count(body, s) == 1 {
			out = append(out, s)
		}
	}
	return out
}
