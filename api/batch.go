package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/csiactor/csiactor/runtime"
)

// BatchBackend is what a Backend that registers volumes in bulk adds.
// *runtime.Runtime and *Client implement it. For a Backend without it,
// POST /v1/volumes/batch registers or creates the entries one by one
// through RegisterVolume and CreateVolume.
type BatchBackend interface {
	// RegisterVolumes registers or creates up to runtime.MaxBatchVolumes
	// volumes (see runtime.Runtime.RegisterVolumes): one result per
	// entry, in order; an error only when the batch as a whole is refused.
	RegisterVolumes(ctx context.Context, entries []runtime.CreateVolumeSpec) ([]runtime.BatchResult, error)
}

var (
	_ BatchBackend = (*runtime.Runtime)(nil)
	_ BatchBackend = (*Client)(nil)
)

// batchBodyFactor is how many times Options.MaxBodyBytes a batch body may
// be: it holds up to runtime.MaxBatchVolumes volume bodies.
const batchBodyFactor = 16

// batchRequest is the body of POST /v1/volumes/batch.
type batchRequest struct {
	Volumes []json.RawMessage `json:"volumes"`
}

// batchResponse is the answer of POST /v1/volumes/batch.
type batchResponse struct {
	Results []runtime.BatchResult `json:"results"`
}

// registerVolumes serves POST /v1/volumes/batch: a malformed body, an
// empty list, too many entries or an ID given twice is a 400 and changes
// nothing; otherwise 200 with one result per entry, an entry that does not
// decode or validate being refused alone.
func (s *server) registerVolumes(w http.ResponseWriter, r *http.Request) {
	if !s.noQuery(w, r) {
		return
	}
	var req batchRequest
	if !s.decodeLimit(w, r, &req, s.maxBody*batchBodyFactor) {
		return
	}
	if req.Volumes == nil {
		writeError(w, http.StatusBadRequest, `volumes: missing; want {"volumes": [...]}`)
		return
	}
	res := make([]runtime.BatchResult, len(req.Volumes))
	ids := make([]string, len(req.Volumes))
	var entries []runtime.CreateVolumeSpec
	var at []int // index in req.Volumes of each of entries
	for i, raw := range req.Volumes {
		e, err := decodeEntry(raw)
		ids[i], res[i].ID = e.ID, e.ID
		if err != nil {
			res[i].Status, res[i].Error = runtime.BatchRefused, fmt.Sprintf("volumes[%d]: %s", i, err.Error())
			continue
		}
		entries, at = append(entries, e), append(at, i)
	}
	if !valid(w, runtime.CheckBatch(ids)) {
		return
	}
	if len(entries) > 0 {
		var out []runtime.BatchResult
		var err error
		if bb, ok := s.b.(BatchBackend); ok {
			out, err = bb.RegisterVolumes(r.Context(), entries)
		} else {
			out = oneByOne(r.Context(), s.b, entries)
		}
		if err != nil {
			writeBackendError(w, err)
			return
		}
		for k, i := range at {
			res[i] = out[k]
		}
	}
	writeJSON(w, http.StatusOK, batchResponse{Results: res})
}

// decodeEntry decodes one entry of a batch as a strict JSON body; on
// failure it still returns the entry's id when that much decodes.
func decodeEntry(raw json.RawMessage) (runtime.CreateVolumeSpec, error) {
	var e runtime.CreateVolumeSpec
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(&e)
	if err == nil && bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		err = errors.New("is null; want a volume object")
	}
	if err != nil {
		var id struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(raw, &id)
		if err.Error() != "is null; want a volume object" {
			_, msg := bodyError(err)
			err = errors.New(msg)
		}
		return runtime.CreateVolumeSpec{ID: id.ID}, err
	}
	return e, nil
}

// oneByOne registers or creates entries one at a time through b, for a
// Backend without BatchBackend.
func oneByOne(ctx context.Context, b Backend, entries []runtime.CreateVolumeSpec) []runtime.BatchResult {
	out := make([]runtime.BatchResult, len(entries))
	for i, e := range entries {
		out[i].ID = e.ID
		var err error
		if e.ExternalID == "" {
			if err = e.Validate(); err == nil {
				_, err = b.CreateVolume(ctx, e)
			}
			out[i].Status = runtime.BatchCreated
		} else {
			if err = e.VolumeSpec.Validate(); err == nil {
				_, err = b.RegisterVolume(ctx, e.ID, e.VolumeSpec)
			}
			out[i].Status = runtime.BatchRegistered
		}
		if err != nil {
			out[i].Status, out[i].Error, out[i].Err = runtime.BatchRefused, err.Error(), err
		}
	}
	return out
}

// RegisterVolumes registers or creates up to runtime.MaxBatchVolumes
// volumes in one request (POST /v1/volumes/batch): an entry with
// ExternalID is a register, one without a create. The results are the
// agent's, in entries' order; a refused entry's Err is an error with its
// message (the kind of error is not sent per entry). The error is the
// batch's refusal as a whole (*Error, 400) or a transport failure.
func (c *Client) RegisterVolumes(ctx context.Context, entries []runtime.CreateVolumeSpec) ([]runtime.BatchResult, error) {
	var buf bytes.Buffer
	buf.WriteString(`{"volumes":[`)
	for i, e := range entries {
		body, err := e.RequestJSON()
		if err != nil {
			return nil, fmt.Errorf("volumes[%d]: %w", i, err)
		}
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(body)
	}
	buf.WriteString(`]}`)
	var out batchResponse
	if err := c.do(ctx, http.MethodPost, "/v1/volumes/batch", nil, buf.Bytes(), &out); err != nil {
		return nil, err
	}
	if len(out.Results) != len(entries) {
		return nil, fmt.Errorf("POST /v1/volumes/batch: %d results for %d entries", len(out.Results), len(entries))
	}
	for i := range out.Results {
		if out.Results[i].Error != "" {
			out.Results[i].Err = errors.New(out.Results[i].Error)
		}
	}
	return out.Results, nil
}
