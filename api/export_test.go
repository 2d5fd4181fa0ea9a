package api

import (
	"maps"
	"slices"
)

// ServedRoutes returns the patterns ("GET /v1/volumes/{id}") of every route
// NewHandler serves with opts, as registered on its mux.
func ServedRoutes(opts Options) []string {
	return slices.Clone(newServer(nil, opts).routes)
}

// RouteScopes returns the scope each route of ServedRoutes needs on the
// TCP listener, as registered on the mux.
func RouteScopes(opts Options) map[string]Scope {
	return maps.Clone(newServer(nil, opts).scopes)
}
