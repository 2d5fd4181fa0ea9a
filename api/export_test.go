package api

import "slices"

// ServedRoutes returns the patterns ("GET /v1/volumes/{id}") of every route
// NewHandler serves with opts, as registered on its mux.
func ServedRoutes(opts Options) []string {
	return slices.Clone(newServer(nil, opts).routes)
}
