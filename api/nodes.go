package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/csiactor/csiactor/runtime"
)

// NodesBackend is what a Backend in cluster mode adds: the hosts of the
// cluster. *runtime.Runtime implements it (outside cluster mode its
// methods fail with runtime.ErrNotFound). A Backend without it answers
// 404 on /v1/nodes.
type NodesBackend interface {
	// InCluster reports whether the agent runs in cluster mode (GET
	// /v1/health says so: the web UI asks for the hosts only then).
	InCluster() bool
	// Nodes lists the hosts of the cluster, by ID.
	Nodes(ctx context.Context) ([]runtime.Node, error)
	// Node returns one host, or ErrNotFound.
	Node(ctx context.Context, id string) (runtime.Node, error)
	// FenceNode takes the claims of the down host id away from it (see
	// runtime.Runtime.FenceNode).
	FenceNode(ctx context.Context, id string) (runtime.FenceResult, error)
}

var _ NodesBackend = (*runtime.Runtime)(nil)

func (s *server) nodesBackend(w http.ResponseWriter) (NodesBackend, bool) {
	nb, ok := s.b.(NodesBackend)
	if !ok {
		writeError(w, http.StatusNotFound, "not in cluster mode: this agent has no nodes")
	}
	return nb, ok
}

func (s *server) nodes(w http.ResponseWriter, r *http.Request) {
	if !s.noQuery(w, r) {
		return
	}
	nb, ok := s.nodesBackend(w)
	if !ok {
		return
	}
	ns, err := nb.Nodes(r.Context())
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, nonNil(ns))
}

func (s *server) node(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok || !s.noQuery(w, r) {
		return
	}
	nb, ok := s.nodesBackend(w)
	if !ok {
		return
	}
	n, err := nb.Node(r.Context(), id)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, n)
}

// Nodes lists the hosts of the agent's cluster (GET /v1/nodes); an agent
// not in cluster mode answers ErrNotFound.
func (c *Client) Nodes(ctx context.Context) ([]runtime.Node, error) {
	var out []runtime.Node
	return out, c.do(ctx, http.MethodGet, "/v1/nodes", nil, nil, &out)
}

// Node returns one host of the agent's cluster.
func (c *Client) Node(ctx context.Context, id string) (runtime.Node, error) {
	if id == "" {
		return runtime.Node{}, fmt.Errorf("%w: node id is empty", runtime.ErrInvalid)
	}
	var out runtime.Node
	return out, c.do(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(id), nil, nil, &out)
}

func (s *server) fenceNode(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id")
	if !ok || !s.noQuery(w, r) {
		return
	}
	nb, ok := s.nodesBackend(w)
	if !ok {
		return
	}
	res, err := nb.FenceNode(r.Context(), id)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// FenceNode fences the down host id (POST /v1/nodes/{id}/fence): its
// claims are unpublished from it through the controller and taken away.
func (c *Client) FenceNode(ctx context.Context, id string) (runtime.FenceResult, error) {
	if id == "" {
		return runtime.FenceResult{}, fmt.Errorf("%w: node id is empty", runtime.ErrInvalid)
	}
	var out runtime.FenceResult
	return out, c.do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(id)+"/fence", nil, nil, &out)
}
