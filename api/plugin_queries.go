package api

import (
	"net/http"
	"strconv"

	"github.com/csiactor/csiactor/runtime"
)

// pluginCapacity serves GET /v1/plugins/{name}/capacity[?topology=k=v,...].
func (s *server) pluginCapacity(w http.ResponseWriter, r *http.Request) {
	name, ok := pathID(w, r, "name")
	if !ok {
		return
	}
	q, ok := query(w, r, "topology")
	if !ok {
		return
	}
	topo, err := runtime.ParseTopology(q.Get("topology"))
	if !valid(w, err) {
		return
	}
	c, err := s.b.PluginCapacity(r.Context(), name, runtime.CapacityQuery{Topology: topo})
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// externalVolumes serves GET /v1/plugins/{name}/volumes[?max_entries=N&starting_token=T].
func (s *server) externalVolumes(w http.ResponseWriter, r *http.Request) {
	name, ok := pathID(w, r, "name")
	if !ok {
		return
	}
	q, ok := query(w, r, "max_entries", "starting_token")
	if !ok {
		return
	}
	eq := runtime.ExternalVolumesQuery{StartingToken: q.Get("starting_token")}
	if v := q.Get("max_entries"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "max_entries: "+strconv.Quote(v)+": want a whole number")
			return
		}
		eq.MaxEntries = n
	}
	if !valid(w, eq.Validate()) {
		return
	}
	vs, err := s.b.ListExternalVolumes(r.Context(), name, eq)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, vs)
}

// callPlugin serves POST /v1/plugins/{name}/call.
func (s *server) callPlugin(w http.ResponseWriter, r *http.Request) {
	name, ok := pathID(w, r, "name")
	if !ok || !s.noQuery(w, r) {
		return
	}
	var c runtime.PluginCall
	if !s.decode(w, r, &c) || !valid(w, c.Validate()) {
		return
	}
	res, err := s.b.CallPlugin(r.Context(), name, c)
	if err != nil {
		writeBackendError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
