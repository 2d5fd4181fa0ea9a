package api

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/csiactor/csiactor/runtime"
)

// RecoveryBackend is what a Backend adds for the ways out of stuck states:
// a claim that waits for a conflicting claim to go, and the forced
// release and deregistrations. *runtime.Runtime and *Client implement it;
// a Backend without it answers 400 to wait= and force=true.
type RecoveryBackend interface {
	// ClaimWait is Claim, waiting up to wait (at most
	// runtime.MaxClaimWait) for conflicting claims to go (see
	// runtime.Runtime.ClaimWait).
	ClaimWait(ctx context.Context, volumeID string, req runtime.ClaimRequest, wait time.Duration) (runtime.Claim, error)
	// ForceRelease forgets alloc's claim on volumeID after one last
	// best-effort teardown (see runtime.Runtime.ForceRelease).
	ForceRelease(ctx context.Context, volumeID, alloc string) (runtime.ForcedRelease, error)
	// ForceDeregisterVolume forgets the volume id with its past claims
	// that are not freed (see runtime.Runtime.ForceDeregisterVolume).
	ForceDeregisterVolume(ctx context.Context, id string) error
	// ForceDeregisterAllocation deregisters the allocation id even while
	// claims depend on it (see runtime.Runtime.ForceDeregisterAllocation).
	ForceDeregisterAllocation(ctx context.Context, id string) error
}

var (
	_ RecoveryBackend = (*runtime.Runtime)(nil)
	_ RecoveryBackend = (*Client)(nil)
)

func (s *server) recovery(w http.ResponseWriter, what string) (RecoveryBackend, bool) {
	rb, ok := s.b.(RecoveryBackend)
	if !ok {
		writeError(w, http.StatusBadRequest, what+" is not supported by this agent's backend")
	}
	return rb, ok
}

// forceParam parses the only query parameter of a deregistration or a
// release, force.
func forceParam(w http.ResponseWriter, r *http.Request) (bool, bool) {
	q, ok := query(w, r, "force")
	if !ok {
		return false, false
	}
	return boolParam(w, q, "force")
}

// waitParam parses the only query parameter of a claim, wait (0 when
// absent).
func waitParam(w http.ResponseWriter, r *http.Request) (time.Duration, bool) {
	q, ok := query(w, r, "wait")
	if !ok {
		return 0, false
	}
	v := q.Get("wait")
	if v == "" {
		return 0, true
	}
	d, err := runtime.ParseClaimWait(v)
	return d, valid(w, err)
}

func (s *server) claimWait(w http.ResponseWriter, r *http.Request, id string, req runtime.ClaimRequest, wait time.Duration) {
	rb, ok := s.recovery(w, "wait")
	if !ok {
		return
	}
	c, err := rb.ClaimWait(r.Context(), id, req, wait)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (s *server) forceRelease(w http.ResponseWriter, r *http.Request, id, alloc string) {
	rb, ok := s.recovery(w, "force")
	if !ok {
		return
	}
	fr, err := rb.ForceRelease(r.Context(), id, alloc)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	if fr.Left == nil {
		fr.Left = []string{}
	}
	writeJSON(w, http.StatusOK, fr)
}

func (s *server) forceDeregisterVolume(w http.ResponseWriter, r *http.Request, id string, deleteToo bool) {
	if deleteToo {
		writeError(w, http.StatusBadRequest, "force and delete cannot be combined: force only forgets a volume; to delete it through the controller, let its past claims be freed (or force-release them) first")
		return
	}
	rb, ok := s.recovery(w, "force")
	if !ok {
		return
	}
	if err := rb.ForceDeregisterVolume(r.Context(), id); err != nil {
		writeBackendError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) forceDeregisterAllocation(w http.ResponseWriter, r *http.Request, id string) {
	rb, ok := s.recovery(w, "force")
	if !ok {
		return
	}
	if err := rb.ForceDeregisterAllocation(r.Context(), id); err != nil {
		writeBackendError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// ClaimWait claims the volume volumeID as Claim does, waiting up to wait
// for conflicting claims to go (POST /v1/volumes/{id}/claims?wait=).
func (c *Client) ClaimWait(ctx context.Context, volumeID string, req runtime.ClaimRequest, wait time.Duration) (runtime.Claim, error) {
	body, err := req.RequestJSON()
	if err != nil {
		return runtime.Claim{}, err
	}
	var out runtime.Claim
	return out, c.do(ctx, http.MethodPost, "/v1/volumes/"+url.PathEscape(volumeID)+"/claims",
		url.Values{"wait": {wait.String()}}, body, &out)
}

// ForceRelease forgets alloc's claim on volumeID after one last
// best-effort teardown (DELETE /v1/volumes/{id}/claims/{alloc}?force=true).
func (c *Client) ForceRelease(ctx context.Context, volumeID, alloc string) (runtime.ForcedRelease, error) {
	var out runtime.ForcedRelease
	return out, c.do(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(volumeID)+"/claims/"+url.PathEscape(alloc),
		url.Values{"force": {"true"}}, nil, &out)
}

// ForceDeregisterVolume forgets the volume id with its past claims that
// are not freed (DELETE /v1/volumes/{id}?force=true).
func (c *Client) ForceDeregisterVolume(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(id), url.Values{"force": {"true"}}, nil, nil)
}

// ForceDeregisterAllocation deregisters the allocation id even while
// claims depend on it (DELETE /v1/allocations/{id}?force=true).
func (c *Client) ForceDeregisterAllocation(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/allocations/"+url.PathEscape(id), url.Values{"force": {"true"}}, nil, nil)
}
