package cli

import (
	"strings"
	"testing"
)

// FuzzReadVolumesFile: whatever the file holds, readVolumesFile never
// panics, and what it accepts has an id per entry, none twice; its errors
// name the file.
func FuzzReadVolumesFile(f *testing.F) {
	for _, s := range []string{
		"- {id: a, plugin: p, external_id: e, capabilities: [{access_mode: single-node-writer, attachment_mode: file-system}]}\n",
		`{"volumes": [{"id": "a", "plugin": "p"}, {"id": "b", "capacity_bytes": 5}]}`,
		"volumes:\n  - id: a\n  - id: a\n", "[]", "- 3", "id: x", "{", "- {id: a, x: 1}", "- {id: a, capacity_bytes: big}", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		entries, err := readVolumesFile("vols.yaml", strings.NewReader(body))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "vols.yaml: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		seen := map[string]bool{}
		for i, e := range entries {
			if e.ID == "" || seen[e.ID] {
				t.Fatalf("entry %d accepted with id %q (seen: %v)", i, e.ID, seen[e.ID])
			}
			seen[e.ID] = true
		}
	})
}
