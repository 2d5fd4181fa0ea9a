package api

import (
	"context"
	"net/http"
	"net/url"

	"github.com/csiactor/csiactor/runtime"
)

// SnapshotsBackend is what a Backend that takes snapshots adds.
// *runtime.Runtime implements it. A Backend without it answers 404 on
// /v1/snapshots.
type SnapshotsBackend interface {
	// CreateSnapshot takes a snapshot of a registered volume and returns
	// it once ready (see runtime.Runtime.CreateSnapshot).
	CreateSnapshot(ctx context.Context, spec runtime.SnapshotSpec) (runtime.Snapshot, error)
	// DeleteSnapshot deletes snapshot id through its plugin and forgets
	// it; ErrConflict while a volume is being restored from it.
	DeleteSnapshot(ctx context.Context, id string) error
	// Snapshot returns one snapshot taken through the agent, or
	// ErrNotFound.
	Snapshot(ctx context.Context, id string) (runtime.Snapshot, error)
	// Snapshots lists the agent's snapshots, and the ones the plugins list
	// (see runtime.Runtime.Snapshots).
	Snapshots(ctx context.Context, f runtime.SnapshotFilter) ([]runtime.Snapshot, error)
}

var (
	_ SnapshotsBackend = (*runtime.Runtime)(nil)
	_ SnapshotsBackend = (*Client)(nil)
)

func (s *server) snapshotsBackend(w http.ResponseWriter) (SnapshotsBackend, bool) {
	sb, ok := s.b.(SnapshotsBackend)
	if !ok {
		writeError(w, http.StatusNotFound, "this agent takes no snapshots")
	}
	return sb, ok
}

// snapshots serves GET /v1/snapshots[?plugin=&volume=].
func (s *server) snapshots(w http.ResponseWriter, r *http.Request) {
	q, ok := query(w, r, "plugin", "volume")
	if !ok {
		return
	}
	f := runtime.SnapshotFilter{Plugin: q.Get("plugin"), Volume: q.Get("volume")}
	if !valid(w, f.Validate()) {
		return
	}
	sb, ok := s.snapshotsBackend(w)
	if !ok {
		return
	}
	ss, err := sb.Snapshots(r.Context(), f)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, nonNil(ss))
}

// createSnapshot serves POST /v1/snapshots.
func (s *server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	if !s.noQuery(w, r) {
		return
	}
	var spec runtime.SnapshotSpec
	if !s.decode(w, r, &spec) || !valid(w, spec.Validate()) {
		return
	}
	infoOf(r.Context()).about = runtime.Event{Snapshot: spec.ID, Volume: spec.SourceVolume}
	sb, ok := s.snapshotsBackend(w)
	if !ok {
		return
	}
	sn, err := sb.CreateSnapshot(r.Context(), spec)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	w.Header().Set("Location", "/v1/snapshots/"+url.PathEscape(sn.ID))
	writeJSON(w, http.StatusCreated, sn)
}

// snapshot serves GET /v1/snapshots/{id}.
func (s *server) snapshot(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok || !s.noQuery(w, r) {
		return
	}
	sb, ok := s.snapshotsBackend(w)
	if !ok {
		return
	}
	sn, err := sb.Snapshot(r.Context(), id)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, sn)
}

// deleteSnapshot serves DELETE /v1/snapshots/{id}.
func (s *server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok || !s.noQuery(w, r) {
		return
	}
	sb, ok := s.snapshotsBackend(w)
	if !ok {
		return
	}
	if err := sb.DeleteSnapshot(r.Context(), id); err != nil {
		writeBackendError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// CreateSnapshot takes a snapshot (POST /v1/snapshots) and returns it once
// ready. Its secrets are sent to the agent, which never shows them again.
func (c *Client) CreateSnapshot(ctx context.Context, spec runtime.SnapshotSpec) (runtime.Snapshot, error) {
	body, err := spec.RequestJSON()
	if err != nil {
		return runtime.Snapshot{}, err
	}
	var out runtime.Snapshot
	return out, c.do(ctx, http.MethodPost, "/v1/snapshots", nil, body, &out)
}

// DeleteSnapshot deletes snapshot id (DELETE /v1/snapshots/{id}).
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(id), nil, nil, nil)
}

// Snapshot returns snapshot id (GET /v1/snapshots/{id}).
func (c *Client) Snapshot(ctx context.Context, id string) (runtime.Snapshot, error) {
	var out runtime.Snapshot
	return out, c.do(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(id), nil, nil, &out)
}

// Snapshots lists snapshots (GET /v1/snapshots[?plugin=&volume=]).
func (c *Client) Snapshots(ctx context.Context, f runtime.SnapshotFilter) ([]runtime.Snapshot, error) {
	q := url.Values{}
	if f.Plugin != "" {
		q.Set("plugin", f.Plugin)
	}
	if f.Volume != "" {
		q.Set("volume", f.Volume)
	}
	var out []runtime.Snapshot
	return out, c.do(ctx, http.MethodGet, "/v1/snapshots", q, nil, &out)
}
