package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/cmd/csiactor/cli"
	"github.com/csiactor/csiactor/runtime"
)

// volume register -f: a JSON and a YAML file, and stdin, through the batch
// endpoint; per-entry results, exit 1 when one is refused; bad files name
// the file and the entry and send nothing.
func TestVolumeRegister_File(t *testing.T) {
	b, env := populated(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caps := `"capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}]`
	jsonFile := write("v.json", `[{"id":"j1","plugin":"hostpath","external_id":"ej1",`+caps+`,"secrets":{"k":"s3cr3t"}},
		{"id":"j2","plugin":"hostpath",`+caps+`,"capacity_bytes":1048576}]`)
	runCLI(t, env, "volume", "register", "-f", jsonFile).want(t, 0,
		"ID  STATUS      ERROR\n"+
			"j1  registered  -\n"+
			"j2  created     -\n")
	ctx := context.Background()
	if v, err := b.Volume(ctx, "j1"); err != nil || v.ExternalID != "ej1" {
		t.Errorf("j1 after register -f: %+v, %v", v, err)
	}

	yamlFile := write("v.yaml", `volumes:
  - id: y1
    plugin: hostpath
    external_id: ey1
    capabilities:
      - {access_mode: single-node-writer, attachment_mode: file-system}
  - id: y2
    plugin: hostpath
    external_id: ey2
    capabilities:
      - {access_mode: bogus, attachment_mode: file-system}
`)
	r := runCLI(t, env, "volume", "register", "-f", yamlFile)
	r.want(t, 1, "")
	r.contains(t, "stdout", "y1  registered  -", "y2  refused     capabilities[0].access_mode")
	r.contains(t, "stderr", "1 of 2 volumes of "+yamlFile+" refused")

	// stdin, -json.
	var out, errOut strings.Builder
	code := cli.Run(ctx, []string{"volume", "register", "-json", "-f", "-"}, &out, &errOut,
		cli.WithGetenv(func(k string) string { return env[k] }),
		cli.WithStdin(strings.NewReader("- {id: s1, plugin: hostpath, external_id: es1, capabilities: [{access_mode: single-node-writer, attachment_mode: file-system}]}\n")))
	var res []runtime.BatchResult
	if code != 0 || json.Unmarshal([]byte(out.String()), &res) != nil || len(res) != 1 || res[0].Status != "registered" {
		t.Errorf("register -f - -json: exit %d, %q, %q", code, out.String(), errOut.String())
	}

	// Bad files: nothing is sent.
	before, err := b.Volumes(ctx, runtime.VolumeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"unknown.yaml", "- {id: u1, plugin: hostpath, external_id: e, sise: 1}\n", `unknown.yaml: entry 0: unknown field "sise"`},
		{"twice.json", `[{"id":"t1","plugin":"hostpath","external_id":"a",` + caps + `},{"id":"t1","plugin":"hostpath","external_id":"b",` + caps + `}]`,
			`twice.json: entry 1: id "t1" is given twice (also entry 0)`},
		{"noid.yaml", "- {plugin: hostpath, external_id: e}\n", "noid.yaml: entry 0: id is missing"},
		{"scalar.yaml", "- 3\n", "scalar.yaml: entry 0: want a volume (a map)"},
		{"map.yaml", "id: x\n", "map.yaml: want a list of volumes"},
		{"empty.yaml", "[]\n", "empty.yaml: has no volumes"},
		{"broken.json", `[{"id": `, "broken.json: not JSON or YAML"},
		{"type.json", `[{"id":"x","plugin":"hostpath","capacity_bytes":"big"}]`, "type.json: entry 0: cannot unmarshal"},
	} {
		r := runCLI(t, env, "volume", "register", "-f", write(tc.name, tc.body))
		r.want(t, 1, "")
		r.contains(t, "stderr", tc.want)
	}
	r = runCLI(t, env, "volume", "register", "-f", filepath.Join(dir, "missing.yaml"))
	r.want(t, 1, "")
	r.contains(t, "stderr", "missing.yaml")
	r = runCLI(t, env, "volume", "register", "-f", jsonFile, "-plugin", "hostpath", "x")
	r.want(t, 2, "")
	r.contains(t, "stderr", "-f takes the volumes from the file: give no ID and no volume flags (got -plugin x)")
	after, err := b.Volumes(ctx, runtime.VolumeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("bad files registered volumes: %d before, %d after", len(before), len(after))
	}
}

// More than 1000 volumes go in batches of 1000.
func TestVolumeRegister_File_Chunks(t *testing.T) {
	b, env := populated(t)
	var sb strings.Builder
	for i := range 2500 {
		fmt.Fprintf(&sb, "- {id: c%04d, plugin: hostpath, external_id: ec%04d, capabilities: [{access_mode: single-node-writer, attachment_mode: file-system}]}\n", i, i)
	}
	p := filepath.Join(t.TempDir(), "many.yaml")
	if err := os.WriteFile(p, []byte(sb.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, env, "volume", "register", "-f", p)
	r.want(t, 0, "")
	if n := strings.Count(r.stdout, " registered "); n != 2500 {
		t.Errorf("%d registered lines, want 2500", n)
	}
	vs, err := b.Volumes(context.Background(), runtime.VolumeFilter{})
	if err != nil || len(vs) != 2502 {
		t.Errorf("%d volumes (%v), want 2502", len(vs), err)
	}
}
