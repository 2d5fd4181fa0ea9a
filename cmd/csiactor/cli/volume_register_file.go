package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

// readVolumesFile reads the volumes of `volume register -f`: a JSON or
// YAML list of register (or create) bodies, or {volumes: [...]}. Errors
// name the file (name) and the entry, counted from 0.
func readVolumesFile(name string, r io.Reader) ([]runtime.CreateVolumeSpec, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: not JSON or YAML: %w", name, err)
	}
	list, ok := doc.([]any)
	if m, isMap := doc.(map[string]any); isMap {
		list, ok = m["volumes"].([]any)
		if ok && len(m) > 1 {
			for k := range m {
				if k != "volumes" {
					return nil, fmt.Errorf("%s: unknown top-level key %q (want a list of volumes, or volumes: [...])", name, k)
				}
			}
		}
	}
	if !ok {
		return nil, fmt.Errorf("%s: want a list of volumes, or volumes: [...]", name)
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("%s: has no volumes", name)
	}
	out := make([]runtime.CreateVolumeSpec, len(list))
	seen := map[string]int{}
	for i, v := range list {
		if _, isMap := v.(map[string]any); !isMap {
			return nil, fmt.Errorf("%s: entry %d: want a volume (a map), got %s", name, i, yamlKind(v))
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("%s: entry %d: %w", name, i, err)
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&out[i]); err != nil {
			return nil, fmt.Errorf("%s: entry %d: %s", name, i, strings.TrimPrefix(err.Error(), "json: "))
		}
		id := out[i].ID
		if id == "" {
			return nil, fmt.Errorf("%s: entry %d: id is missing", name, i)
		}
		if j, dup := seen[id]; dup {
			return nil, fmt.Errorf("%s: entry %d: id %q is given twice (also entry %d)", name, i, id, j)
		}
		seen[id] = i
	}
	return out, nil
}

// yamlKind names the kind of a decoded YAML value for an error.
func yamlKind(v any) string {
	switch v.(type) {
	case nil:
		return "nothing"
	case []any:
		return "a list"
	case string:
		return "a string"
	}
	return fmt.Sprintf("%T", v)
}

// registerFromFile registers the volumes of path ("-": stdin) through the
// batch endpoint, runtime.MaxBatchVolumes per request, and prints one line
// per entry (-json: the results). Any refused entry makes it fail after
// printing; a batch refused whole stops it (the batches before it are
// registered).
func registerFromFile(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, path string) error {
	name, r := path, e.stdin
	if path == "-" {
		name = "stdin"
	} else {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	entries, err := readVolumesFile(name, r)
	if err != nil {
		return err
	}
	var results []runtime.BatchResult
	var batchErr error
	for lo := 0; lo < len(entries); lo += runtime.MaxBatchVolumes {
		hi := min(lo+runtime.MaxBatchVolumes, len(entries))
		res, err := cl.RegisterVolumes(ctx, entries[lo:hi])
		if err != nil {
			batchErr = fmt.Errorf("%s: entries %d to %d: %w", name, lo, hi-1, err)
			break
		}
		results = append(results, res...)
	}
	if cf.json {
		if err := printJSON(e.stdout, results); err != nil {
			return err
		}
	} else if len(results) > 0 {
		t := newTable(e.stdout, "ID", "STATUS", "ERROR")
		for _, r := range results {
			t.row(r.ID, r.Status, orDash(r.Error))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if batchErr != nil {
		return batchErr
	}
	refused := 0
	for _, r := range results {
		if r.Status == runtime.BatchRefused {
			refused++
		}
	}
	if refused > 0 {
		return fmt.Errorf("%d of %d volumes of %s refused", refused, len(results), name)
	}
	return nil
}

// volumeFlag reports whether name is a flag of one volume's definition
// (volumeSpecFlags, -external-id), which -f does not take.
func volumeFlag(name string) bool {
	switch name {
	case "plugin", "capability", "fs-type", "mount-flag", "parameter", "context", "secret", "secrets-file", "secrets-from", "external-id":
		return true
	}
	return false
}
